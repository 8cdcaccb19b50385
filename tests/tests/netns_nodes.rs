//! Nodes in network namespaces: `deploy/local/netns.sh` puts each "node" in
//! a namespace of its own on a bridge (shaped with `tc netem`: 500 mbit and
//! 2 ms each way out of a node). A real `kindling-rendezvous` listens on the
//! bridge's address in the root namespace and one real `kindling-agent` runs
//! in each node, on its node's IP and the same port on every node, as on
//! Kubernetes. A job trained from this process (the root namespace, reaching
//! the agents over the bridge) gangs both agents, whose ring all-reduce
//! crosses the veths and the bridge; the rendezvous knows each agent by its
//! node's address. Every process is SIGKILLed and `netns.sh down` leaves
//! nothing behind.
//!
//! Needs root and network namespaces: without them the test says
//! `skipped: <reason>` on stderr and passes, except under `CI=true`, where only
//! "not root" is accepted. Without netem in the kernel the nodes are shaped to
//! the rate alone (tbf, no delay), with a note on stderr. The binaries are the
//! ones next to this test's (`cargo build -p kindling-agent --bins`), or
//! `KINDLING_AGENT_BIN` / `KINDLING_RENDEZVOUS_BIN`.

use std::collections::BTreeSet;
use std::net::TcpListener as StdListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use futures::FutureExt;
use futures::future::BoxFuture;
use kindling::feed::AgentClient;
use kindling::job::{ProgressMode, TrainingEvent, TrainingJob};
use kindling::spark::RecordBatchStream;
use kindling_fixtures::{rule_batch, rule_schema};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::rendezvous::{JobState, RendezvousClient};
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "netns-nodes-test-token";
/// The agents' port: the same on every node, each on its own IP.
const AGENT_PORT: u16 = 50051;
/// The agents' probe port, on the node IP (reached over the bridge).
const HEALTH_PORT: u16 = 8080;
const NODES: usize = 2;
const RATE: &str = "500mbit";
const DELAY: &str = "2ms";
const JOB_ID: &str = "netns-job";
const ROWS_PER_BATCH: usize = 1_000;
const BATCHES: u64 = 4;
const EPOCHS: u32 = 3;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/netns.sh")
}

/// The script's message (its stderr, without the `netns.sh: ` prefixes).
fn message(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| l.strip_prefix("netns.sh: ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why `netns.sh check <args>` says nodes cannot be made here, or `None`.
fn unavailable(args: &[&str]) -> Option<String> {
    match Command::new(script()).arg("check").args(args).output() {
        Err(e) => Some(format!("cannot run {}: {e}", script().display())),
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(message(&out)),
    }
}

/// `netns.sh up` nodes, brought `down` when dropped (also on a panic): drop
/// it after every process in its namespaces is gone.
#[derive(Debug)]
struct Nodes {
    prefix: String,
    /// The bridge's address in the root namespace: `<subnet>.1`.
    gateway: String,
    /// Node `i`'s (1-based) IP is `ips[i - 1]`.
    ips: Vec<String>,
}

impl Nodes {
    /// `up` with a fresh short prefix and subnet (others are tried when
    /// one is in use); `netem` false shapes the rate alone with tbf.
    fn up(n: usize, netem: bool) -> Nodes {
        let mut last = String::new();
        for _ in 0..5 {
            let tag: u16 = rand::random();
            let prefix = format!("kt{tag:04x}");
            let subnet = format!("10.77.{}", tag % 250);
            let mut up = Command::new(script());
            up.args(["up", &n.to_string(), "--prefix", &prefix, "--subnet", &subnet])
                .args(["--rate", RATE, "--delay", DELAY]);
            if !netem {
                up.args(["--if-no-netem", "tbf"]);
            }
            let out = up.output().expect("running netns.sh up");
            if !out.status.success() {
                last = message(&out);
                if last.contains("is in use") || last.contains("already on an interface") {
                    continue;
                }
                panic!("netns.sh up failed: {last}");
            }
            if !netem {
                eprintln!("{}", message(&out));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            let ips: Vec<String> = stdout
                .lines()
                .enumerate()
                .map(|(i, line)| {
                    let (ns, ip) = line.split_once(' ').expect("`<namespace> <ip>` lines");
                    assert_eq!(ns, format!("{prefix}-node-{}", i + 1), "{stdout}");
                    ip.to_owned()
                })
                .collect();
            assert_eq!(ips.len(), n, "one line per node: {stdout}");
            return Nodes {
                gateway: format!("{subnet}.1"),
                prefix,
                ips,
            };
        }
        panic!("no free prefix and subnet for netns.sh up: {last}");
    }

    fn ip(&self, node: usize) -> &str {
        &self.ips[node - 1]
    }

    /// A command running `program` in node `node`'s namespace; the process
    /// spawned becomes `program` (the script and `ip netns exec` exec it).
    fn command(&self, node: usize, program: &Path) -> Command {
        let mut c = Command::new(script());
        c.args(["exec", &node.to_string(), "--prefix", &self.prefix, "--"])
            .arg(program);
        c
    }

    /// `tc -s qdisc` of node `node`'s eth0.
    fn qdisc(&self, node: usize) -> String {
        let out = self
            .command(node, Path::new("tc"))
            .args(["-s", "qdisc", "show", "dev", "eth0"])
            .output()
            .expect("tc");
        assert!(out.status.success(), "tc: {}", message(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn down(&self) -> Result<(), String> {
        let out = Command::new(script())
            .args(["down", "--prefix", &self.prefix])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(message(&out))
        }
    }

    /// Namespaces and links named `<prefix>-...` that exist.
    fn leftovers(&self) -> Vec<String> {
        let named = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("ip");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let mine = format!("{}-", self.prefix);
        let namespaces = named(&["netns", "list"]);
        let links = named(&["-o", "link", "show"]);
        namespaces
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .chain(
                links
                    .lines()
                    .filter_map(|l| l.split(": ").nth(1))
                    .map(|name| name.split('@').next().unwrap_or(name)),
            )
            .filter(|name| name.starts_with(&mine))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!("netns.sh down --prefix {}: {e}", self.prefix);
        }
    }
}

/// A server binary built next to this test (`target/<profile>/`), or the
/// one `env` names.
fn binary(name: &str, env: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("test executable");
        // target/<profile>/deps/netns_nodes-<hash> → target/<profile>/<name>
        exe.parent()
            .and_then(Path::parent)
            .expect("target dir")
            .join(name)
    });
    assert!(
        path.is_file(),
        "{} not found: build it first with `cargo build -p kindling-agent --bins` (same \
         CARGO_TARGET_DIR), or set {env}",
        path.display()
    );
    path
}

/// A spawned server, SIGKILLed when dropped.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    /// `/readyz` address.
    health: String,
}

impl Proc {
    /// Spawns `command` with only `PATH` from this process's environment
    /// (the flags say everything; no stray `KINDLING_*` variable), its stderr
    /// in `<dir>/<name>.log`.
    fn spawn(name: &str, mut command: Command, health: String, dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        command
            .env_clear()
            .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name} ({command:?}): {e}"));
        Proc {
            name: name.into(),
            child,
            log,
            health,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `/readyz` until it answers 200 (the agent: registered with the
    /// rendezvous); panics with the logs if the process exits first.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if tokio::time::timeout(Duration::from_secs(2), ready(&self.health))
                .await
                .unwrap_or(false)
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}) before ready:\n{}", self.name, self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready at {}:\n{}",
                self.name,
                self.health,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// SIGKILLs the process and asserts it died of it.
    fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("wait");
        assert_eq!(status.signal(), Some(9), "{} died of SIGKILL", self.name);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `GET /readyz` on `addr` answers 200 (false while nothing answers).
async fn ready(addr: &str) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET /readyz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    let mut answer = String::new();
    s.write_all(request.as_bytes()).await.is_ok()
        && s.read_to_string(&mut answer).await.is_ok()
        && answer.split_whitespace().nth(1) == Some("200")
}

/// A port free on `ip` (in this namespace) now.
fn free_port(ip: &str) -> u16 {
    let l = StdListener::bind((ip, 0)).unwrap_or_else(|e| panic!("bind {ip}: {e}"));
    l.local_addr().expect("addr").port()
}

/// The fastest of a few TCP connects to `addr`: one round trip.
async fn connect_rtt(addr: &str) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        best = best.min(start.elapsed());
        drop(s);
    }
    best
}

/// Bytes a node's root qdisc sent (`Sent N bytes` of `tc -s qdisc`).
fn sent_bytes(qdisc: &str) -> u64 {
    qdisc
        .split_once("Sent ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `Sent N bytes` in {qdisc}"))
}

fn rows() -> Vec<RecordBatch> {
    (0..BATCHES)
        .map(|seed| rule_batch(ROWS_PER_BATCH, seed))
        .collect()
}

/// The same rows on every call, as `fit_arrow` asks.
fn replay(
    data: Arc<Vec<RecordBatch>>,
) -> BoxFuture<'static, Result<RecordBatchStream, kindling::spark::Error>> {
    async move {
        let rows: RecordBatchStream =
            Box::pin(futures::stream::iter(data.as_ref().clone().into_iter().map(Ok)));
        Ok(rows)
    }
    .boxed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_in_node_namespaces_train_over_the_bridge_known_by_their_node_ips() {
    if let Some(reason) = unavailable(&[]) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true") || reason.starts_with("not root"),
            "CI is expected to have network namespaces: {reason}"
        );
        eprintln!("skipped: nodes in network namespaces: {reason}");
        return;
    }
    // Without netem, `up` shapes the rate alone and warns so.
    let netem = unavailable(&["--netem"]).is_none();
    let agent_bin = binary("kindling-agent", "KINDLING_AGENT_BIN");
    let rendezvous_bin = binary("kindling-rendezvous", "KINDLING_RENDEZVOUS_BIN");
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).expect("token file");

    // Declared before the processes: dropped (brought down) after them.
    let nodes = Nodes::up(NODES, netem);
    eprintln!(
        "nodes: prefix {}, bridge {}, node IPs {:?}",
        nodes.prefix, nodes.gateway, nodes.ips
    );

    let rendezvous_addr = format!("{}:{}", nodes.gateway, free_port(&nodes.gateway));
    let rendezvous_url = format!("http://{rendezvous_addr}");
    let mut rendezvous = {
        let health = format!("127.0.0.1:{}", free_port("127.0.0.1"));
        let mut c = Command::new(&rendezvous_bin);
        c.args(["--listen", &rendezvous_addr, "--health-listen", &health])
            .arg("--token-file")
            .arg(&token_file)
            // The bridge is not loopback: the token crosses it in plaintext.
            .arg("--allow-plaintext-token")
            .args(["--lease-ms", "2000", "--gang-timeout-ms", "30000"]);
        Proc::spawn("rendezvous", c, health, dir.path())
    };
    rendezvous.wait_ready().await;

    let mut agents: Vec<Proc> = (1..=NODES)
        .map(|node| {
            let ip = nodes.ip(node);
            let mut c = nodes.command(node, &agent_bin);
            c.args(["--node-name", &format!("node-{node}")])
                .args(["--listen", &format!("{ip}:{AGENT_PORT}")])
                .args(["--advertise-host", ip])
                .args(["--health-listen", &format!("{ip}:{HEALTH_PORT}")])
                .args(["--rendezvous", &rendezvous_url])
                .arg("--token-file")
                .arg(&token_file)
                .arg("--allow-plaintext-token")
                .arg("--work-dir")
                .arg(dir.path().join(format!("node-{node}")))
                .args(["--memory-budget", "64MiB", "--train-threads", "1"])
                .args(["--collective-timeout-ms", "20000", "--log-level", "info"]);
            Proc::spawn(
                &format!("agent-node-{node}"),
                c,
                format!("{ip}:{HEALTH_PORT}"),
                dir.path(),
            )
        })
        .collect();
    for agent in &mut agents {
        agent.wait_ready().await;
    }
    let logs = |agents: &[Proc], rendezvous: &Proc| -> String {
        std::iter::once(rendezvous)
            .chain(agents)
            .map(|p| format!("--- {} ---\n{}", p.name, p.logs()))
            .collect()
    };

    // The rendezvous knows each agent by its node's address.
    let token = Token::new(TOKEN);
    let channel = ChannelConfig::default().with_plaintext_token(true);
    let rv = RendezvousClient::connect_with(&rendezvous_url, Some(&token), &channel)
        .await
        .expect("rendezvous");
    let mut registered = rv.list_agents().await.expect("list agents");
    registered.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    let expected: Vec<String> = nodes
        .ips
        .iter()
        .map(|ip| format!("http://{ip}:{AGENT_PORT}"))
        .collect();
    assert_eq!(registered.len(), NODES, "{registered:#?}");
    for (i, agent) in registered.iter().enumerate() {
        assert_eq!(agent.node_name, format!("node-{}", i + 1), "{agent:#?}");
        assert_eq!(agent.flight_address, expected[i], "{agent:#?}");
        assert!(
            agent.collective_address.contains(&format!("//{}:", nodes.ips[i])),
            "the ring endpoint is on the node IP too: {agent:#?}"
        );
        eprintln!(
            "registered: {} on {} at {} (ring {})",
            agent.agent_id, agent.node_name, agent.flight_address, agent.collective_address
        );
    }

    // Crossing into a node pays the shaping: a round trip takes the delay.
    for ip in &nodes.ips {
        let rtt = connect_rtt(&format!("{ip}:{HEALTH_PORT}")).await;
        eprintln!("TCP connect to {ip}: {rtt:?}");
        if netem {
            assert!(rtt >= Duration::from_millis(2), "{DELAY} netem delay: {rtt:?}");
        }
    }
    let sent_before: Vec<u64> = (1..=NODES).map(|n| sent_bytes(&nodes.qdisc(n))).collect();

    // A job across both nodes, fed and followed from the root namespace.
    let data = Arc::new(rows());
    let (tx, mut events) = tokio::sync::mpsc::channel(1024);
    let job = TrainingJob::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .features(["x1", "x2"])
        .label("y")
        .optimizer(OptimizerSpec::adam(0.05))
        .num_slots(NODES as u32)
        .batch_size(64)
        .epochs(EPOCHS)
        .job_id(JOB_ID)
        .rendezvous(&rendezvous_url)
        .token(token.clone())
        .channel(channel.clone())
        .progress(ProgressMode::Silent)
        .events(tx)
        .build()
        .expect("job");
    let started = Instant::now();
    let model = tokio::time::timeout(
        Duration::from_secs(300),
        job.fit_arrow(rule_schema(), || replay(data.clone())),
    )
    .await
    .unwrap_or_else(|_| panic!("fit took over 300 s\n{}", logs(&agents, &rendezvous)))
    .unwrap_or_else(|e| panic!("fit failed: {e}\n{}", logs(&agents, &rendezvous)));
    eprintln!(
        "trained {EPOCHS} epochs in {:?}: {:?}",
        started.elapsed(),
        model.history().last()
    );
    assert_eq!(model.history().len(), EPOCHS as usize);

    let mut shards = None;
    while let Ok(event) = events.try_recv() {
        if let TrainingEvent::Started { agents, .. } = event {
            shards = Some(agents);
        }
    }
    let shards: BTreeSet<String> = shards.expect("a Started event").into_iter().collect();
    assert_eq!(
        shards,
        expected.iter().cloned().collect(),
        "fit chose the agents by their node addresses"
    );

    // Both agents trained, as the two ranks of one gang.
    let mut ranks = BTreeSet::new();
    let mut rows_train = 0;
    for url in &expected {
        let client = AgentClient::connect_with(url, Some(&token), &channel).expect("agent client");
        let s = client.job_status(JOB_ID).await.expect("job status");
        assert_eq!(s.state, AgentJobState::Succeeded, "{url}: {s:#?}");
        assert_eq!(s.world_size, NODES as u32, "{url}: {s:#?}");
        assert!(s.rows_train > 0, "{url} trained rows: {s:#?}");
        assert_eq!(s.history.len(), EPOCHS as usize, "{url}: {s:#?}");
        ranks.insert(s.rank.expect("a rank"));
        rows_train += s.rows_train;
        eprintln!(
            "{url}: {} rank {:?} of {}, {} rows, loss {:?}",
            s.agent_id, s.rank, s.world_size, s.rows_train, s.loss
        );
    }
    assert_eq!(ranks, BTreeSet::from([0, 1]));
    assert_eq!(
        rows_train,
        BATCHES * ROWS_PER_BATCH as u64,
        "every row on one shard"
    );
    let status = rv.status(JOB_ID).await.expect("job status at the rendezvous");
    assert_eq!(status.state, JobState::Succeeded, "{status:#?}");
    assert_eq!(status.members, ["node-1", "node-2"], "{status:#?}");

    // The ring's traffic left each node through its shaped eth0.
    for node in 1..=NODES {
        let qdisc = nodes.qdisc(node);
        let sent = sent_bytes(&qdisc) - sent_before[node - 1];
        eprintln!(
            "node-{node} eth0 sent {sent} bytes during the job: {}",
            qdisc.trim()
        );
        assert!(sent > 0, "node-{node} sent nothing through its qdisc");
    }

    // SIGKILL everything, then nothing named <prefix>- is left.
    for agent in &mut agents {
        agent.sigkill();
    }
    rendezvous.sigkill();
    nodes.down().expect("netns.sh down");
    let left = nodes.leftovers();
    assert!(left.is_empty(), "netns.sh down left {left:?}");
    eprintln!("netns.sh down --prefix {}: nothing left", nodes.prefix);
}
