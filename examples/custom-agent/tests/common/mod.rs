//! The cluster of the tests: a rendezvous (the real gRPC server, in this
//! process on loopback) and `kindling-example-agent` binaries as child
//! processes, configured with `KINDLING_*` variables and probed through
//! `/readyz`; the data, made in Spark.

// Each test file uses part of this module.
#![allow(dead_code)]

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kindling::arrow::array::{AsArray, RecordBatch};
use kindling::arrow::datatypes::{Float32Type, UInt64Type};
use kindling::feed::AgentClient;
use kindling::job::{TrainingEvent, TrainingJob, TrainingJobBuilder};
use kindling::{DataFrame, SparkSession};
use kindling::{ModelSpec, Task};
use kindling_example_agent::{MODEL, WideAndDeepConfig};
use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig};
use kindling_schemas::action::{Action, AgentJobState, AgentJobStatus, JobList};
use kindling_schemas::auth::Token;
use kindling_schemas::rendezvous::RendezvousClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const AGENT_BIN: &str = env!("CARGO_BIN_EXE_kindling-example-agent");
pub const TOKEN: &str = "custom-agent-test-token";

/// The tests share two cores: one cluster trains at a time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn free_port() -> u16 {
    let l = StdListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// An agent process, SIGKILLed when dropped.
pub struct Agent {
    pub name: String,
    pub url: String,
    child: Child,
    log: PathBuf,
    health: String,
}

impl Agent {
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `/readyz` (200 once registered with the rendezvous); the
    /// process's logs if it exits first.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_status(&self.health, "/readyz").await != Some(200) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "{} exited ({status}) before ready:\n{}",
                    self.name,
                    self.logs()
                ));
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Ok(())
    }

    /// SIGKILL (no goodbye to the rendezvous or the gang), and reaps it.
    pub fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{} died of SIGKILL", self.name);
    }

    /// A Flight client for this agent.
    pub fn client(&self) -> AgentClient {
        AgentClient::connect(&self.url, Some(&Token::new(TOKEN))).expect("client")
    }

    /// Every job this agent has (running or finished).
    pub async fn jobs(&self) -> Vec<AgentJobStatus> {
        let list: JobList = self.client().action(&Action::ListJobs).await.expect("list jobs");
        list.jobs
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The HTTP status of `GET path`, or `None` when nothing answers.
async fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: probe\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

/// A rendezvous and `n` ready agent processes.
pub struct Cluster {
    pub agents: Vec<Agent>,
    pub rendezvous: EmbeddedRendezvous,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub async fn start(n: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = RendezvousConfig::default()
            .with_lease(Duration::from_millis(600))
            .with_gang_timeout(Duration::from_secs(30));
        let rendezvous = EmbeddedRendezvous::start(config, Some(Token::new(TOKEN)))
            .await
            .expect("rendezvous");
        let mut agents = Vec::with_capacity(n);
        for i in 0..n {
            agents.push(ready_agent(dir.path(), &rendezvous.url(), &format!("node-{i}")).await);
        }
        Cluster {
            agents,
            rendezvous,
            dir,
        }
    }

    /// Starts the agent that served `url` again on its node (same agent id
    /// and work directory; new ports, as a restarted pod gets), once it is
    /// ready; returns its new URL. The old process must be gone.
    pub async fn restart(&mut self, url: &str) -> String {
        let i = self
            .agents
            .iter()
            .position(|a| a.url == url)
            .unwrap_or_else(|| panic!("no agent at {url}"));
        let node = self.agents[i]
            .name
            .strip_prefix("agent-")
            .expect("agents are named agent-<node>")
            .to_owned();
        let agent = ready_agent(self.dir.path(), &self.rendezvous.url(), &node).await;
        let new_url = agent.url.clone();
        self.agents[i] = agent;
        new_url
    }

    /// Waits until the agent at `url` has taken a step of epoch 2 of
    /// `job_id`, SIGKILLs it, and waits until the rendezvous dropped it (its
    /// lease lapsed): from then on it is no spare. Returns its agent id.
    pub async fn sigkill_in_epoch_2(&mut self, url: &str, job_id: &str) -> String {
        let victim = self.by_url(url);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = victim.client().job_status(job_id).await.expect("status");
            if s.state == AgentJobState::Training && s.epoch >= 2 && s.step > 0 {
                break;
            }
            assert!(!s.state.is_terminal(), "the job ended before the kill: {s:#?}");
            assert!(Instant::now() < deadline, "not training epoch 2: {s:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let victim_id = victim.name.clone();
        victim.sigkill();
        let rv = RendezvousClient::connect(self.rendezvous.url(), Some(&Token::new(TOKEN)))
            .await
            .expect("rendezvous");
        while rv
            .list_agents()
            .await
            .expect("agents")
            .iter()
            .any(|a| a.agent_id == victim_id)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        victim_id
    }

    /// The agent serving `url`.
    pub fn by_url(&mut self, url: &str) -> &mut Agent {
        let logs = self.dir.path().display().to_string();
        self.agents
            .iter_mut()
            .find(|a| a.url == url)
            .unwrap_or_else(|| panic!("no agent at {url} (logs in {logs})"))
    }

    /// A job builder driving this cluster (remote mode, the cluster's token).
    pub fn job(&self, builder: TrainingJobBuilder) -> TrainingJobBuilder {
        builder
            .rendezvous(self.rendezvous.url())
            .token(Token::new(TOKEN))
            .progress(kindling::job::ProgressMode::Silent)
    }

    /// Every agent's logs, for failure messages.
    pub fn logs(&self) -> String {
        self.agents
            .iter()
            .map(|a| format!("--- {} ---\n{}", a.name, a.logs()))
            .collect()
    }
}

/// A ready agent process. Its ports are picked free, but another process on
/// the machine may take one before the agent binds it: then it is started
/// again on others.
async fn ready_agent(dir: &Path, rendezvous: &str, node: &str) -> Agent {
    let mut tries = 0;
    loop {
        let mut agent = spawn_agent(dir, rendezvous, node);
        match agent.wait_ready().await {
            Ok(()) => return agent,
            Err(logs) if logs.contains("Address already in use") && tries < 3 => tries += 1,
            Err(logs) => panic!("{logs}"),
        }
    }
}

fn spawn_agent(dir: &Path, rendezvous: &str, node: &str) -> Agent {
    let port = free_port();
    let health = format!("127.0.0.1:{}", free_port());
    let work = dir.join(node);
    let log = dir.join(format!("{node}.log"));
    let child = Command::new(AGENT_BIN)
        .env_clear()
        .env("KINDLING_NODE_NAME", node)
        .env("KINDLING_AGENT_ID", format!("agent-{node}"))
        .env("KINDLING_LISTEN", format!("127.0.0.1:{port}"))
        .env("KINDLING_HEALTH_LISTEN", &health)
        .env("KINDLING_RENDEZVOUS", rendezvous)
        .env("KINDLING_TOKEN", TOKEN)
        .env("KINDLING_WORK_DIR", &work)
        .env("KINDLING_MEMORY_BUDGET", "64MiB")
        .env("KINDLING_TRAIN_THREADS", "1")
        .env("KINDLING_COLLECTIVE_TIMEOUT_MS", "20000")
        .env("KINDLING_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {AGENT_BIN}: {e}"));
    Agent {
        name: format!("agent-{node}"),
        url: format!("http://127.0.0.1:{port}"),
        child,
        log,
        health,
    }
}

pub async fn spark() -> SparkSession {
    SparkSession::connect(&kindling_tests::spark::spark_remote())
        .await
        .expect("spark")
}

/// Each city's shift of the decision boundary on `x1`.
pub const CITIES: usize = 5;

/// `rows` rows in `partitions` equal partitions, computed in Spark: a float
/// feature `x1` in [-1, 1), an integer categorical `city` in `0..5` and the
/// label `y = x1 + shift(city) > 0`, which only a model that reads the city
/// learns (no randomness: the same rows every time the query runs).
pub async fn city_df(spark: &SparkSession, rows: usize, partitions: usize, city_type: &str) -> DataFrame {
    let sql = format!(
        "SELECT x1, CAST(city AS {city_type}) AS city, \
         CAST(x1 + CASE city WHEN 0 THEN -0.7 WHEN 1 THEN -0.3 WHEN 2 THEN 0.0 WHEN 3 THEN 0.3 ELSE 0.7 END > 0 AS INT) AS y \
         FROM (SELECT CAST(((id * 7919) % 2003) / 1001.5 - 1.0 AS DOUBLE) AS x1, CAST(id % {CITIES} AS INT) AS city \
         FROM range(0, {rows}, 1, {partitions}))"
    );
    spark.sql(&sql).await.expect("sql")
}

/// A model table's rows: (name, shape, values).
pub type Table = Vec<(String, Vec<u64>, Vec<f32>)>;

pub fn table(weights: &RecordBatch) -> Table {
    let names = weights.column(0).as_string::<i32>();
    let shapes = weights.column(1).as_list::<i32>();
    let values = weights.column(2).as_list::<i32>();
    (0..weights.num_rows())
        .map(|i| {
            let shape = shapes.value(i);
            let vals = values.value(i);
            (
                names.value(i).to_owned(),
                shape.as_primitive::<UInt64Type>().values().to_vec(),
                vals.as_primitive::<Float32Type>().values().to_vec(),
            )
        })
        .collect()
}

/// Reads `events` until `fit` started and a step of epoch 2 was reported;
/// returns the job id and its agents' URLs by shard.
pub async fn started_until_epoch_2(
    events: &mut tokio::sync::mpsc::Receiver<TrainingEvent>,
) -> (String, Vec<String>) {
    let mut started = None;
    while let Some(e) = events.recv().await {
        match e {
            TrainingEvent::Started { job_id, agents } => started = Some((job_id, agents)),
            TrainingEvent::Step { epoch, .. } if epoch >= 2 => break,
            _ => {}
        }
    }
    started.expect("the job started")
}

/// The events received so far.
pub fn drain(rx: &mut tokio::sync::mpsc::Receiver<TrainingEvent>) -> Vec<TrainingEvent> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e);
    }
    out
}

/// Asserts no job ever reached an agent (nothing started, nothing fed).
pub async fn assert_no_job_on_agents(cluster: &Cluster, what: &str) {
    for a in &cluster.agents {
        let jobs = a.jobs().await;
        assert!(jobs.is_empty(), "{what}: {} has jobs {jobs:#?}", a.name);
    }
}

/// The python interpreter with pyarrow.
pub fn python() -> PathBuf {
    match std::env::var("KINDLING_PYTHON_BIN") {
        Ok(bin) => PathBuf::from(bin),
        Err(_) => {
            let home = std::env::var("KINDLING_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|_| {
                    PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/kindling")
                });
            home.join("venv/bin/python")
        }
    }
}

/// The tests' wide-and-deep config: an embedding of 4 per city, 8 hidden.
pub fn config() -> WideAndDeepConfig {
    WideAndDeepConfig::new(vec!["city".into()])
        .with_embedding(4)
        .with_hidden(8)
}

/// The model spec naming the example's model with `config`.
pub fn custom(config: &WideAndDeepConfig) -> ModelSpec {
    ModelSpec::custom(MODEL, config).expect("config")
}

/// A classification job over `x1` and the categorical `city` (this process
/// does not link the model unless the caller adds `.models(registry())`).
pub fn job(model: ModelSpec) -> TrainingJobBuilder {
    TrainingJob::builder()
        .model(model)
        .task(Task::Classification { num_classes: 2 })
        .features(["x1", "city"])
        .categorical("city", CITIES)
        .label("y")
}
