//! Spark Connect fixture: one local server per machine, started once per test process.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// The URL of the local Spark Connect server, starting it if needed.
///
/// Runs `deploy/local/spark-connect.sh start` once per process; the script is
/// idempotent, serialises concurrent starts with `flock`, and returns only when a
/// real query answers, so no test waits or sleeps on its own. Honours
/// `KINDLING_SPARK_PORT` (default 15002).
///
/// ```no_run
/// let url = kindling_tests::spark::spark_remote();
/// assert!(url.starts_with("sc://127.0.0.1:"));
/// ```
pub fn spark_remote() -> String {
    static REMOTE: OnceLock<String> = OnceLock::new();
    REMOTE
        .get_or_init(|| {
            let port = std::env::var("KINDLING_SPARK_PORT").unwrap_or_else(|_| "15002".into());
            // A server that already accepts connections is reused without the script:
            // the script's lock file descriptor is inherited by the server JVM it
            // starts, so a second `start` would wait on that lock forever.
            if listening(&port) {
                return format!("sc://127.0.0.1:{port}");
            }
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/spark-connect.sh");
            let status = Command::new("bash")
                .arg(&script)
                .arg("start")
                .env("KINDLING_SPARK_PORT", &port)
                .status()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(status.success(), "{} start failed: {status}", script.display());
            format!("sc://127.0.0.1:{port}")
        })
        .clone()
}

/// Where the block manager of the driver of the server started by
/// `spark-connect.sh` on `spark_port` listens (host, port), from the line
/// Spark logs when it binds it (`NettyBlockTransferService: Server created
/// on HOST:PORT`): logged before the server answers, so present once `start`
/// returned.
pub fn block_manager(spark_port: u16) -> (String, u16) {
    let home = std::env::var("KINDLING_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME is set")).join(".cache/kindling")
        });
    let log = home.join(format!("spark-{spark_port}/server.log"));
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let at = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("NettyBlockTransferService: Server created on "))
        .map(|(_, at)| at.trim().to_owned())
        .unwrap_or_else(|| panic!("{}: no block manager logged", log.display()));
    let (host, port) = at
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("block manager at {at}"));
    (
        host.to_owned(),
        port.parse()
            .unwrap_or_else(|e| panic!("block manager port {port}: {e}")),
    )
}

fn listening(port: &str) -> bool {
    port.parse::<u16>().is_ok_and(|port| {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
    })
}

/// A Spark Connect server of the caller's own, on a free port with its own
/// master (e.g. `local[2,2]`, where a failed task runs again), started with
/// `deploy/local/spark-connect.sh` and stopped when dropped. Takes a while to
/// start; use it only where the shared server cannot show the behaviour.
///
/// ```no_run
/// let spark = kindling_tests::spark::PrivateSpark::start("local[2,2]");
/// assert!(spark.remote().starts_with("sc://127.0.0.1:"));
/// ```
#[derive(Debug)]
pub struct PrivateSpark {
    port: u16,
    // Dropped after the server is stopped.
    _slot: Slot,
}

/// One private Spark server at a time in a test process: each is a JVM (a
/// standalone one a master, workers and executor JVMs too) that takes the
/// machine's cores while it starts, and the tests that start one share one
/// test binary. Taken when a server starts, given back once it has stopped.
#[derive(Debug)]
struct Slot;

static SLOT_TAKEN: Mutex<bool> = Mutex::new(false);
static SLOT_FREED: Condvar = Condvar::new();

impl Slot {
    fn take() -> Slot {
        let mut taken = SLOT_TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        while *taken {
            taken = SLOT_FREED.wait(taken).unwrap_or_else(PoisonError::into_inner);
        }
        *taken = true;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *SLOT_TAKEN.lock().unwrap_or_else(PoisonError::into_inner) = false;
        SLOT_FREED.notify_one();
    }
}

impl PrivateSpark {
    /// Starts the server and returns once a real query answers.
    pub fn start(master: &str) -> PrivateSpark {
        PrivateSpark::start_with(master, &[])
    }

    /// Like [`start`](Self::start), with more of `spark-connect.sh`'s
    /// settings (e.g. `("KINDLING_SPARK_MAX_RESULT_SIZE", "2m")`).
    pub fn start_with(master: &str, env: &[(&str, &str)]) -> PrivateSpark {
        let slot = Slot::take();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let spark = PrivateSpark { port, _slot: slot };
        let status = spark
            .script("start")
            .env("KINDLING_SPARK_MASTER", master)
            .env("KINDLING_SPARK_DRIVER_MEMORY", "1g")
            .envs(env.iter().copied())
            .status()
            .expect("run spark-connect.sh");
        assert!(
            status.success(),
            "spark-connect.sh start ({master}) failed: {status}"
        );
        spark
    }

    /// `sc://127.0.0.1:<port>`.
    pub fn remote(&self) -> String {
        format!("sc://127.0.0.1:{}", self.port)
    }

    /// Where its driver's block manager listens: see [`block_manager`].
    pub fn block_manager(&self) -> (String, u16) {
        block_manager(self.port)
    }

    fn script(&self, verb: &str) -> Command {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/spark-connect.sh");
        let mut cmd = Command::new("bash");
        cmd.arg(script)
            .arg(verb)
            .env("KINDLING_SPARK_PORT", self.port.to_string());
        cmd
    }
}

impl Drop for PrivateSpark {
    fn drop(&mut self) {
        let _ = self.script("stop").status();
    }
}

/// What Spark itself says it ran, from its REST API (a [`PrivateSpark`]
/// started with `KINDLING_SPARK_UI_PORT`): the jobs it ran and its tasks'
/// CPU time (`executorCpuTime` summed over every stage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparkWork {
    pub jobs: usize,
    pub cpu_ns: u64,
}

impl std::ops::Sub for SparkWork {
    type Output = SparkWork;
    fn sub(self, before: SparkWork) -> SparkWork {
        SparkWork {
            jobs: self.jobs - before.jobs,
            cpu_ns: self.cpu_ns - before.cpu_ns,
        }
    }
}

/// `GET path` of Spark's REST API on `127.0.0.1:port` as JSON (HTTP/1.0:
/// one body, not chunked).
fn spark_rest(port: u16, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("Spark's UI");
    write!(s, "GET {path} HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n").expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    let (_, body) = out.split_once("\r\n\r\n").expect("a body");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Spark's jobs and CPU time so far, once no job is running (its listener
/// has recorded every job that ended).
pub async fn spark_work(ui_port: u16) -> SparkWork {
    let apps = spark_rest(ui_port, "/api/v1/applications");
    let app = apps[0]["id"].as_str().expect("an application").to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let jobs = spark_rest(ui_port, &format!("/api/v1/applications/{app}/jobs"));
        let jobs = jobs.as_array().expect("jobs");
        let running = jobs.iter().any(|j| j["status"] == "RUNNING");
        let stages = spark_rest(ui_port, &format!("/api/v1/applications/{app}/stages"));
        let stages = stages.as_array().expect("stages");
        let active = stages.iter().any(|s| s["status"] == "ACTIVE");
        if !running && !active {
            let cpu_ns = stages
                .iter()
                .map(|s| s["executorCpuTime"].as_u64().unwrap_or(0))
                .sum();
            return SparkWork {
                jobs: jobs.len(),
                cpu_ns,
            };
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Spark's jobs still run after 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A real standalone Spark cluster of the caller's own: a master and one
/// worker per entry of `node_agents`, each worker launching its own executor
/// JVM (1 core, 1 GiB), with a Spark Connect server attached, on free ports;
/// started with `deploy/local/spark-connect.sh` (`KINDLING_SPARK_MASTER=standalone`)
/// and stopped, executors included, when dropped.
///
/// Worker `i` (1-based) and its executors see `KINDLING_NODE_NAME=node-<i>`
/// and, where `node_agents[i - 1]` is `Some(address)`, `KINDLING_AGENT_ADDRESS=address`
/// (`None`: a node without an agent, the variable unset). Starting takes a
/// while (five JVMs); `start` returns once tasks ran on every worker's executor.
///
/// ```no_run
/// let spark = kindling_tests::spark::StandaloneSpark::start(
///     &[Some("grpc://127.0.0.1:7001".to_owned()), None],
///     &[("KINDLING_SPARK_TASK_MAX_FAILURES", "2")],
/// );
/// assert!(spark.remote().starts_with("sc://127.0.0.1:"));
/// let nodes: Vec<String> = spark.executors().into_iter().map(|(_, node)| node).collect();
/// assert_eq!(nodes, ["node-1", "node-2"]);
/// ```
#[derive(Debug)]
pub struct StandaloneSpark {
    spark: PrivateSpark,
}

impl StandaloneSpark {
    /// Starts the master, `node_agents.len()` workers and the server; `env`
    /// adds more of `spark-connect.sh`'s settings (e.g.
    /// `("KINDLING_SPARK_DYNAMIC", "1")`, `("KINDLING_SPARK_EXECUTOR_MEMORY", "2g")`).
    pub fn start(node_agents: &[Option<String>], env: &[(&str, &str)]) -> StandaloneSpark {
        assert!(
            !node_agents.is_empty(),
            "a standalone cluster needs at least one worker"
        );
        let agents = node_agents
            .iter()
            .map(|a| {
                let a = a.as_deref().unwrap_or("");
                assert!(!a.contains(','), "agent address `{a}` contains a comma");
                a
            })
            .collect::<Vec<_>>()
            .join(",");
        let workers = node_agents.len().to_string();
        let mut all: Vec<(&str, &str)> = vec![
            ("KINDLING_SPARK_WORKERS", &workers),
            ("KINDLING_SPARK_NODE_AGENTS", &agents),
        ];
        all.extend_from_slice(env);
        StandaloneSpark {
            spark: PrivateSpark::start_with("standalone", &all),
        }
    }

    /// `sc://127.0.0.1:<port>`.
    pub fn remote(&self) -> String {
        self.spark.remote()
    }

    /// The live executor JVMs of this cluster, `(pid, node name)`, sorted by
    /// node (`spark-connect.sh executors`).
    pub fn executors(&self) -> Vec<(u32, String)> {
        let out = self
            .spark
            .script("executors")
            .output()
            .expect("run spark-connect.sh executors");
        assert!(
            out.status.success(),
            "spark-connect.sh executors failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (pid, node) = line.trim().split_once(' ')?;
                Some((pid.parse().ok()?, node.trim().to_owned()))
            })
            .collect()
    }
}

/// The venv's Python `major.minor` (`spark-connect.sh python`): the
/// executors' Python on the clusters this script starts.
pub fn executor_python() -> String {
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/spark-connect.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .arg("python")
        .output()
        .expect("spark-connect.sh python");
    let python = String::from_utf8(out.stdout).expect("utf-8");
    let out = std::process::Command::new(python.trim())
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()
        .expect("the venv's python");
    String::from_utf8(out.stdout).expect("utf-8").trim().to_owned()
}

/// The rule data as SQL text, for the `kindling` CLI's `--sql`: `rows` rows
/// of `x1`, `x2` in [-1, 1) (`rand(1)`, `rand(2)`) and `y = x1 + 2·x2 > 0.1`.
pub fn rule_sql(rows: usize) -> String {
    format!(
        "SELECT x1, x2, CAST(x1 + 2 * x2 > 0.1 AS INT) AS y FROM \
         (SELECT rand(1) * 2 - 1 AS x1, rand(2) * 2 - 1 AS x2 FROM range({rows}))"
    )
}

/// `kindling <command>` of the rule on [`rule_sql`]'s `rows` rows over the
/// test's Spark: its query, features, label, an `mlp:16` and `slots` agents.
pub fn rule_cli(command: &str, rows: usize, slots: u32) -> Vec<String> {
    let args = [command, "--remote", &spark_remote(), "--sql", &rule_sql(rows)]
        .map(str::to_owned)
        .into_iter();
    let rest = [
        "--features",
        "x1,x2",
        "--label",
        "y",
        "--model",
        "mlp:16",
        "--slots",
    ];
    args.chain(rest.map(str::to_owned))
        .chain([slots.to_string()])
        .collect()
}

/// `rows` rows in 4 partitions, computed in Spark: float features `x1`, `x2`
/// in [-1, 1) (seeded) and the label `y = x1 + 2·x2 > 0.1`, a linear rule a
/// model can learn to > 95 %.
pub async fn rule_df(spark: &kindling::SparkSession, rows: usize) -> kindling::DataFrame {
    rule_df_in(spark, rows, 4).await
}

/// [`rule_df`] over `partitions` partitions.
pub async fn rule_df_in(
    spark: &kindling::SparkSession,
    rows: usize,
    partitions: usize,
) -> kindling::DataFrame {
    spark
        .sql(&format!(
            "SELECT x1, x2, CAST(x1 + 2 * x2 > 0.1 AS INT) AS y FROM ({})",
            features_sql(rows, partitions, 11)
        ))
        .await
        .expect("sql")
}

/// The features of [`rule_df`] alone — `x1` double, `x2` float, in [-1, 1)
/// from `rand(seed)` and `rand(seed + 1)` — `rows` rows over `partitions`
/// partitions: the input `predict` and `transform` take.
pub async fn features_df(
    spark: &kindling::SparkSession,
    rows: usize,
    partitions: usize,
    seed: u64,
) -> kindling::DataFrame {
    spark
        .sql(&features_sql(rows, partitions, seed))
        .await
        .expect("sql")
}

fn features_sql(rows: usize, partitions: usize, seed: u64) -> String {
    format!(
        "SELECT CAST(rand({seed}) * 2 - 1 AS DOUBLE) AS x1, CAST(rand({}) * 2 - 1 AS FLOAT) AS x2 \
         FROM range(0, {rows}, 1, {partitions})",
        seed + 1
    )
}

/// The job the rule DataFrame trains ([`rule_df`]): an MLP with 16 hidden
/// units over `x1`, `x2` for the label `y` (2 classes, Adam 0.02), on 2 local
/// slots, batch 64, 5 epochs, a 0.2 eval split, seed 3, no progress output.
pub fn rule_job() -> kindling::job::TrainingJobBuilder {
    use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};
    kindling::job::TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![16] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.02))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .batch_size(64)
        .epochs(5)
        .eval_fraction(0.2)
        .seed(3)
        .local_mode(true)
        .progress(kindling::job::ProgressMode::Silent)
}

/// Per partition: the Python worker's pid, its node's environment and the
/// address it sends from towards `toward` (a UDP socket's source address).
const WHERE_PY: &str = r#"
import os
import socket
import pyarrow as pa


def where(toward):
    def run(batches):
        for _ in batches:
            pass
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect((toward, 9))
            ip = s.getsockname()[0]
        finally:
            s.close()
        yield pa.RecordBatch.from_pydict({
            "pid": pa.array([os.getpid()], pa.int64()),
            "node": pa.array([os.environ.get("KINDLING_NODE_NAME", "")], pa.string()),
            "agent": pa.array([os.environ.get("KINDLING_AGENT_ADDRESS", "")], pa.string()),
            "ip": pa.array([ip], pa.string()),
        })
    return run, "pid long, node string, agent string, ip string"
"#;

/// Where one Spark task ran ([`where_tasks_ran`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPlace {
    /// The Python worker's pid.
    pub pid: i64,
    /// `KINDLING_NODE_NAME` ("" when unset).
    pub node: String,
    /// `KINDLING_AGENT_ADDRESS` ("" when unset).
    pub agent: String,
    /// The task's source address towards the `toward` of the call.
    pub ip: String,
}

/// Runs `partitions` tasks (`range` over `mapInArrow`, executors' Python
/// from [`executor_python`]) and says where each ran: one row per task.
pub async fn where_tasks_ran(
    spark: &kindling::SparkSession,
    partitions: i64,
    toward: &str,
) -> Vec<TaskPlace> {
    use arrow::array::AsArray;
    use arrow::datatypes::{DataType, Int64Type};
    spark
        .add_python_file("kindling_where.py", WHERE_PY)
        .await
        .expect("add kindling_where.py");
    let udf = kindling::spark::MapInArrowUdf::new(
        "kindling_where",
        "where",
        "pid long, node string, agent string, ip string",
        executor_python(),
    )
    .arg(toward.to_owned());
    let batches = spark
        .range_partitions(0, partitions, 1, Some(partitions as i32))
        .map_in_arrow(&udf)
        .expect("mapInArrow")
        .collect()
        .await
        .expect("the mapInArrow query");
    let mut out = Vec::new();
    for b in &batches {
        let col = |name: &str, ty: &DataType| {
            let c = b.column_by_name(name).unwrap_or_else(|| panic!("column {name}"));
            arrow::compute::cast(c, ty).expect("cast")
        };
        let pid = col("pid", &DataType::Int64);
        let text = [
            col("node", &DataType::Utf8),
            col("agent", &DataType::Utf8),
            col("ip", &DataType::Utf8),
        ];
        let pid = pid.as_primitive::<Int64Type>();
        let [node, agent, ip] = text.each_ref().map(|c| c.as_string::<i32>());
        for i in 0..b.num_rows() {
            out.push(TaskPlace {
                pid: pid.value(i),
                node: node.value(i).to_owned(),
                agent: agent.value(i).to_owned(),
                ip: ip.value(i).to_owned(),
            });
        }
    }
    out
}
