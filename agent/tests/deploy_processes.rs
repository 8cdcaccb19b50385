//! The deployment as processes: the real `kindling-rendezvous` and
//! `kindling-agent` binaries, configured with exactly the environment
//! variables the Kubernetes manifests set (mutual TLS included: every call
//! and the agents' ring go over TLS with client certificates), probed through
//! `/readyz`, running a training job through the Flight contract, surviving a
//! SIGTERM'd agent and a certificate rotation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::StreamExt;
use kindling_fixtures::pki::{Files, TestCa};
use kindling_fixtures::{committed_rows, pieces, put_messages, rule_batch, rule_schema};
use kindling_schemas::action::{Action, AgentJobState, AgentJobStatus, EndOfData, JobRef, StartJob};
use kindling_schemas::auth::{BearerAttach, Token};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::descriptor::Split;
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::{CheckpointPolicy, JobSpec, ModelSpec, OptimizerSpec, Task};
use kindling_schemas::tls::{Tls, TlsFiles};
use kindling_schemas::trace::TraceContext;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const TOKEN: &str = "deploy-test-token";
/// The viewer token the manifests mount: reads `/metrics` and the status page only.
const VIEWER_TOKEN: &str = "deploy-test-viewer-token";
const AGENT_BIN: &str = env!("CARGO_BIN_EXE_kindling-agent");

/// The `kindling-rendezvous` binary: another package's, so cargo names no
/// path for it here. It is built next to this test (`target/<profile>/`) by
/// the README's test command (`--bins`), or named by
/// `KINDLING_RENDEZVOUS_BIN`.
fn rendezvous_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let path = std::env::var_os("KINDLING_RENDEZVOUS_BIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                let exe = std::env::current_exe().expect("test executable");
                // target/<profile>/deps/deploy_processes-<hash> → target/<profile>/kindling-rendezvous
                exe.parent()
                    .and_then(Path::parent)
                    .expect("target dir")
                    .join("kindling-rendezvous")
            });
        assert!(
            path.is_file(),
            "{} not found: build it first with `cargo build -p kindling-rendezvous` (same \
             CARGO_TARGET_DIR), or set KINDLING_RENDEZVOUS_BIN",
            path.display()
        );
        path.to_string_lossy().into_owned()
    })
}

/// The name on the agents' shared certificate (the DaemonSet's
/// `KINDLING_TLS_SERVER_NAME`): agents are dialled by IP.
const AGENT_CERT_NAME: &str = "kindling-agent";

/// The tests' certificate authorities: the cluster's, the one certificates
/// are rotated to, and a client certificate the first signs. Every process
/// trusts both CAs (`ca.crt` is the bundle), as during a CA rotation.
struct Pki {
    ca: TestCa,
    next_ca: TestCa,
    bundle: String,
    client: Files,
    _dir: tempfile::TempDir,
}

static PKI: LazyLock<Pki> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("pki dir");
    let ca = TestCa::new("kindling test CA");
    let next_ca = TestCa::new("kindling test CA (next)");
    let bundle = format!("{}{}", ca.pem(), next_ca.pem());
    let client = ca
        .issue("kindling-client", &["kindling-client"])
        .write(&dir.path().join("client"), &bundle);
    Pki {
        ca,
        next_ca,
        bundle,
        client,
        _dir: dir,
    }
});

/// Channel settings of a client with `files` (server name: the agents').
fn tls_channel(cert: Option<&Files>, ca: &Path) -> ChannelConfig {
    let tls = Tls::new(TlsFiles {
        cert: cert.map(|f| f.cert.clone()),
        key: cert.map(|f| f.key.clone()),
        ca: Some(ca.to_owned()),
        client_auth: false,
        server_name: Some(AGENT_CERT_NAME.into()),
    })
    .expect("client TLS");
    ChannelConfig::default().with_tls(Some(tls))
}

/// The test's own client: a client certificate, trusting both CAs.
fn client_channel() -> ChannelConfig {
    static CHANNEL: LazyLock<ChannelConfig> =
        LazyLock::new(|| tls_channel(Some(&PKI.client), &PKI.client.ca));
    CHANNEL.clone()
}

fn k8s_base() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s/base")
}

/// The `KINDLING_*` names a manifest sets in its containers' `env`.
fn manifest_env(file: &str) -> BTreeSet<String> {
    let path = k8s_base().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- name: "))
        .map(|n| n.trim().trim_matches('"').to_owned())
        .filter(|n| n.starts_with("KINDLING_"))
        .collect();
    assert!(!names.is_empty(), "no KINDLING_* env in {}", path.display());
    names
}

fn free_port() -> u16 {
    let l = StdListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A child process, SIGKILLed if the test ends without stopping it.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    health: String,
}

impl Proc {
    fn spawn(name: &str, bin: &str, env: &BTreeMap<String, String>, health: String, dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {bin}: {e}"));
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

    /// Polls `/readyz` until it answers 200.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http_status(&self.health, "/readyz").await == Some(200) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}) before ready:\n{}", self.name, self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "could not signal {}", self.name);
    }

    async fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Proc {
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

struct Cluster {
    dir: tempfile::TempDir,
    token_file: PathBuf,
    rendezvous_port: u16,
    rendezvous_url: String,
    rendezvous: Option<Proc>,
    /// The servers log JSON lines (`KINDLING_LOG_FORMAT=json`) instead of text.
    json_logs: bool,
}

impl Cluster {
    /// A token file and a port for the rendezvous; nothing running yet.
    fn new() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
        std::fs::write(
            dir.path().join("credential-key"),
            "deploy-test-credential-key-0123456789\n",
        )
        .expect("credential key file");
        std::fs::write(dir.path().join("viewer-token"), format!("{VIEWER_TOKEN}\n"))
            .expect("viewer token file");
        let port = free_port();
        let cluster = Cluster {
            dir,
            token_file,
            rendezvous_port: port,
            // Dialled by name: its certificate is checked for `localhost`.
            rendezvous_url: format!("https://localhost:{port}"),
            rendezvous: None,
            json_logs: false,
        };
        cluster.issue_certificates(&PKI.ca);
        cluster
    }

    /// The rendezvous' and the agents' certificates (the two Secrets),
    /// signed by `ca`; replaces the files in place, as cert-manager does.
    fn issue_certificates(&self, ca: &TestCa) {
        ca.issue("kindling-rendezvous", &["localhost"])
            .write(&self.tls_dir("rendezvous"), &PKI.bundle);
        ca.issue(AGENT_CERT_NAME, &[AGENT_CERT_NAME])
            .write(&self.tls_dir("agent"), &PKI.bundle);
    }

    fn tls_dir(&self, who: &str) -> PathBuf {
        self.dir.path().join("tls").join(who)
    }

    /// The TLS variables of a manifest whose Secret is mounted at `tls_dir(who)`.
    fn tls_env(&self, who: &str) -> [(String, String); 4] {
        let dir = self.tls_dir(who);
        let file = |name: &str| dir.join(name).display().to_string();
        [
            ("KINDLING_TLS_CERT".to_owned(), file("tls.crt")),
            ("KINDLING_TLS_KEY".to_owned(), file("tls.key")),
            ("KINDLING_TLS_CA".to_owned(), file("ca.crt")),
            ("KINDLING_TLS_CLIENT_AUTH".to_owned(), "true".to_owned()),
        ]
    }

    /// With a ready rendezvous.
    async fn start() -> Cluster {
        let mut cluster = Cluster::new();
        cluster.start_rendezvous().await;
        cluster
    }

    async fn start_rendezvous(&mut self) {
        let health = format!("127.0.0.1:{}", free_port());
        let env = self.rendezvous_env(self.rendezvous_port, &health);
        let mut rendezvous = Proc::spawn("rendezvous", rendezvous_bin(), &env, health, self.dir.path());
        rendezvous.wait_ready().await;
        self.rendezvous = Some(rendezvous);
    }

    /// The rendezvous Deployment's variables, with values for loopback: the
    /// cluster's state dir, listening on `port` (probes on `health`).
    fn rendezvous_env(&self, port: u16, health: &str) -> BTreeMap<String, String> {
        let (dir, token_file) = (self.dir.path(), &self.token_file);
        let mut env = BTreeMap::from([
            (
                "KINDLING_RENDEZVOUS_LISTEN".to_owned(),
                format!("127.0.0.1:{port}"),
            ),
            ("KINDLING_RENDEZVOUS_HEALTH_LISTEN".to_owned(), health.to_owned()),
            ("KINDLING_TOKEN_FILE".to_owned(), token_file.display().to_string()),
            (
                "KINDLING_VIEWER_TOKEN_FILE".to_owned(),
                dir.join("viewer-token").display().to_string(),
            ),
            ("KINDLING_RENDEZVOUS_LEASE_MS".to_owned(), "600".to_owned()),
            (
                "KINDLING_RENDEZVOUS_STATE_DIR".to_owned(),
                dir.join("rendezvous-state").display().to_string(),
            ),
        ]);
        env.extend(self.tls_env("rendezvous"));
        assert_eq!(
            env.keys().cloned().collect::<BTreeSet<_>>(),
            manifest_env("rendezvous.yaml"),
            "the test sets exactly the rendezvous Deployment's variables"
        );
        env.insert("KINDLING_RENDEZVOUS_GANG_TIMEOUT_MS".into(), "60000".into());
        env.insert("RUST_LOG".into(), "info".into());
        if self.json_logs {
            env.insert("KINDLING_LOG_FORMAT".into(), "json".into());
        }
        env
    }

    /// A ready agent configured like the DaemonSet's container, and its Flight URL.
    async fn agent(&self, node: &str) -> (Proc, String) {
        self.agent_with_budget(node, "64MiB").await
    }

    /// [`Cluster::agent`] with another cache memory budget.
    async fn agent_with_budget(&self, node: &str, budget: &str) -> (Proc, String) {
        let (mut agent, url) = self.spawn_agent_with_budget(node, budget);
        agent.wait_ready().await;
        (agent, url)
    }

    /// Like [`Cluster::agent`] without waiting for readiness.
    fn spawn_agent(&self, node: &str) -> (Proc, String) {
        self.spawn_agent_with_budget(node, "64MiB")
    }

    fn spawn_agent_with_budget(&self, node: &str, budget: &str) -> (Proc, String) {
        self.spawn_agent_with(node, budget, &[])
    }

    /// An agent with `budget` and, beyond the DaemonSet's variables, `extra`.
    fn spawn_agent_with(&self, node: &str, budget: &str, extra: &[(&str, &str)]) -> (Proc, String) {
        let port = free_port();
        let health = format!("127.0.0.1:{}", free_port());
        let work = self.dir.path().join(node);
        let mut env = BTreeMap::from([
            ("KINDLING_NODE_NAME".to_owned(), node.to_owned()),
            ("KINDLING_AGENT_ID".to_owned(), format!("agent-{node}")),
            ("KINDLING_ADVERTISE_HOST".to_owned(), "127.0.0.1".to_owned()),
            ("KINDLING_LISTEN".to_owned(), format!("127.0.0.1:{port}")),
            ("KINDLING_HEALTH_LISTEN".to_owned(), health.clone()),
            ("KINDLING_RENDEZVOUS".to_owned(), self.rendezvous_url.clone()),
            (
                "KINDLING_TOKEN_FILE".to_owned(),
                self.token_file.display().to_string(),
            ),
            (
                "KINDLING_VIEWER_TOKEN_FILE".to_owned(),
                self.dir.path().join("viewer-token").display().to_string(),
            ),
            ("KINDLING_WORK_DIR".to_owned(), work.display().to_string()),
            ("KINDLING_MEMORY_BUDGET".to_owned(), budget.to_owned()),
            ("KINDLING_DISK_WATERMARK".to_owned(), "40GiB".to_owned()),
            ("KINDLING_CAPACITY".to_owned(), "1".to_owned()),
            // As from a pod requesting one CPU: the test runs several agents.
            ("KINDLING_TRAIN_THREADS".to_owned(), "1".to_owned()),
            ("KINDLING_LOG".to_owned(), "info".to_owned()),
            ("KINDLING_TLS_SERVER_NAME".to_owned(), AGENT_CERT_NAME.to_owned()),
            (
                "KINDLING_CREDENTIAL_KEY_FILE".to_owned(),
                self.dir.path().join("credential-key").display().to_string(),
            ),
        ]);
        env.extend(self.tls_env("agent"));
        assert_eq!(
            env.keys().cloned().collect::<BTreeSet<_>>(),
            manifest_env("agent-daemonset.yaml"),
            "the test sets exactly the agent DaemonSet's variables"
        );
        if self.json_logs {
            env.insert("KINDLING_LOG_FORMAT".into(), "json".into());
        }
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let agent = Proc::spawn(&format!("agent-{node}"), AGENT_BIN, &env, health, self.dir.path());
        (agent, format!("https://127.0.0.1:{port}"))
    }

    async fn rendezvous_client(&self) -> RendezvousClient {
        RendezvousClient::connect_with(
            self.rendezvous_url.clone(),
            Some(&Token::new(TOKEN)),
            &client_channel(),
        )
        .await
        .expect("rendezvous client")
    }
}

type Flight = FlightServiceClient<InterceptedService<Channel, BearerAttach>>;

fn flight(url: &str) -> Flight {
    flight_with(url, &client_channel())
}

fn flight_with(url: &str, channel: &ChannelConfig) -> Flight {
    let channel = channel.dial(url, true).expect("dial").connect_lazy();
    let attach = BearerAttach::new(Some(&Token::new(TOKEN))).expect("token");
    FlightServiceClient::with_interceptor(channel, attach)
}

async fn action<T: serde::de::DeserializeOwned>(url: &str, action: &Action) -> T {
    let mut results = flight(url)
        .do_action(action.to_flight())
        .await
        .unwrap_or_else(|s| panic!("{url}: {action:?}: {s}"))
        .into_inner();
    let first = results.next().await.expect("a result").expect("ok result");
    serde_json::from_slice(&first.body).expect("json")
}

async fn start_on(url: &str, job_id: &str, spec: &JobSpec, rendezvous: &str) {
    let _: serde_json::Value = action(
        url,
        &Action::StartJob(StartJob {
            job_id: job_id.into(),
            spec: spec.clone(),
            rendezvous: rendezvous.into(),
            initial_weights: None,
        }),
    )
    .await;
}

async fn status(url: &str, job_id: &str) -> AgentJobStatus {
    action(
        url,
        &Action::JobStatus(JobRef {
            job_id: job_id.into(),
        }),
    )
    .await
}

async fn wait_until(url: &str, job_id: &str, pred: impl Fn(&AgentJobStatus) -> bool) -> AgentJobStatus {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = status(url, job_id).await;
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{url}: condition not reached; last: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// One producer's DoPut of `batch` (in 500-row pieces); returns the rows committed.
async fn put(url: &str, job_id: &str, batch: &RecordBatch) -> u64 {
    put_generated(url, job_id, "shard", pieces(batch, 500).into_iter()).await
}

/// One producer's DoPut of `batches`, generated as the stream is sent (the
/// test never holds the shard); returns the rows committed.
async fn put_generated(
    url: &str,
    job_id: &str,
    producer: &'static str,
    batches: impl Iterator<Item = RecordBatch> + Send + 'static,
) -> u64 {
    let messages = put_messages(job_id, Split::Train, producer, &rule_schema(), batches);
    committed_rows(flight(url).do_put(messages).await.expect("do_put").into_inner()).await
}

/// A process's `VmHWM` (peak resident set) or `VmRSS`, in bytes.
fn proc_memory(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("kB value");
    kib * 1024
}

async fn end_of_data(url: &str, job_id: &str, rows: u64) {
    let _: serde_json::Value = action(
        url,
        &Action::EndOfData(EndOfData {
            job_id: job_id.into(),
            split: Split::Train,
            expected_rows: Some(rows),
        }),
    )
    .await;
}

#[test]
fn every_variable_the_manifests_set_is_read_by_the_binary() {
    for (bin, manifest) in [
        (AGENT_BIN, "agent-daemonset.yaml"),
        (rendezvous_bin(), "rendezvous.yaml"),
        (AGENT_BIN, "../overlays/rendezvous-ha/agent-rendezvous.yaml"),
        (
            rendezvous_bin(),
            "../overlays/rendezvous-ha/rendezvous-statefulset.yaml",
        ),
    ] {
        let help = Command::new(bin).arg("--help").output().expect("--help");
        assert!(help.status.success());
        let help = String::from_utf8_lossy(&help.stdout);
        for name in manifest_env(manifest) {
            assert!(
                help.contains(&format!("env: {name}")),
                "{manifest} sets {name}, which {bin} does not read"
            );
        }
    }
}

#[test]
fn an_agent_without_a_token_refuses_to_start() {
    let out = Command::new(AGENT_BIN)
        .env_clear()
        .env("KINDLING_NODE_NAME", "n1")
        .env("KINDLING_LISTEN", "127.0.0.1:0")
        .env("KINDLING_HEALTH_LISTEN", "127.0.0.1:0")
        .output()
        .expect("run");
    assert!(!out.status.success(), "started without a token");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no token"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_agent_fails_its_attempt_cleanly_and_the_job_finishes_on_a_replacement() {
    let mut cluster = Cluster::start().await;
    let (mut a, url_a) = cluster.agent("node-a").await;
    let (mut b, url_b) = cluster.agent("node-b").await;
    let rv = cluster.rendezvous_client().await;
    let live: BTreeSet<String> = rv
        .list_agents()
        .await
        .expect("agents")
        .into_iter()
        .map(|a| a.agent_id)
        .collect();
    assert_eq!(
        live,
        BTreeSet::from(["agent-node-a".to_owned(), "agent-node-b".to_owned()])
    );

    let mut spec = JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .batch_size(8)
        .epochs(8)
        .seed(7)
        .build()
        .expect("spec");
    spec.checkpoint = CheckpointPolicy {
        every_epochs: 1,
        keep_last: 2,
        ..Default::default()
    };
    rv.create_job(&JobConfig::new("deploy", 2).with_max_attempts(4))
        .await
        .expect("create job");
    let shards = [rule_batch(3000, 5), rule_batch(3000, 6)];
    for (url, shard) in [(&url_a, &shards[0]), (&url_b, &shards[1])] {
        start_on(url, "deploy", &spec, &cluster.rendezvous_url).await;
        assert_eq!(put(url, "deploy", shard).await, 3000);
        end_of_data(url, "deploy", 3000).await;
    }
    // Mid-training, past epoch 1's checkpoint.
    wait_until(&url_a, "deploy", |s| s.epoch >= 2 && s.step > 0).await;

    b.sigterm();
    let exit = b.wait_exit().await;
    assert!(exit.success(), "SIGTERM exits 0, got {exit}:\n{}", b.logs());
    // The agent told the rendezvous itself (no lease lapse) and left the live set.
    let job = rv.status("deploy").await.expect("status");
    let failure = job.failures.first().expect("the attempt failed");
    assert_eq!(failure.agent_id, "agent-node-b", "{job:#?}");
    assert!(
        failure.cause.contains("left"),
        "reported by the leaving agent: {job:#?}"
    );
    let live: Vec<String> = rv
        .list_agents()
        .await
        .expect("agents")
        .into_iter()
        .map(|a| a.agent_id)
        .collect();
    assert!(
        !live.contains(&"agent-node-b".to_owned()),
        "deregistered: {live:?}"
    );

    // A replacement gets the lost shard; the gang re-forms and finishes.
    let (mut c, url_c) = cluster.agent("node-c").await;
    start_on(&url_c, "deploy", &spec, &cluster.rendezvous_url).await;
    assert_eq!(put(&url_c, "deploy", &shards[1]).await, 3000);
    end_of_data(&url_c, "deploy", 3000).await;
    let sa = wait_until(&url_a, "deploy", |s| s.state.is_terminal()).await;
    let sc = wait_until(&url_c, "deploy", |s| s.state.is_terminal()).await;
    assert_eq!(sa.state, AgentJobState::Succeeded, "{sa:#?}");
    assert_eq!(sc.state, AgentJobState::Succeeded, "{sc:#?}");
    assert!(sa.attempt >= 2, "a new attempt formed: {sa:#?}");
    assert_eq!(
        sa.rows_trained_per_epoch,
        vec![6000; 8],
        "every row once per epoch"
    );

    let mut rendezvous = cluster.rendezvous.take().expect("rendezvous");
    for p in [&mut a, &mut c, &mut rendezvous] {
        p.sigterm();
        let exit = p.wait_exit().await;
        assert!(exit.success(), "{} exits 0 on SIGTERM, got {exit}", p.name);
    }
}

/// One process per state dir: a second rendezvous on the first's state dir
/// (an evicted pod still running beside its replacement) refuses to start,
/// naming the first; once the first is SIGKILLed a new one starts on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_rendezvous_on_a_state_dir_refuses_to_start_naming_the_first() {
    let mut cluster = Cluster::start().await;
    let first = cluster.rendezvous.as_ref().expect("rendezvous").child.id();
    let health = format!("127.0.0.1:{}", free_port());
    let env = cluster.rendezvous_env(free_port(), &health);
    let mut second = Proc::spawn("rendezvous-2", rendezvous_bin(), &env, health, cluster.dir.path());
    let exit = second.wait_exit().await;
    assert!(!exit.success(), "the second rendezvous must not start: {exit}");
    let logs = second.logs();
    assert!(
        logs.contains(&format!("in use by another rendezvous (pid {first} on")),
        "second rendezvous' log:\n{logs}"
    );
    let mut dead = cluster.rendezvous.take().expect("rendezvous");
    dead.child.kill().expect("SIGKILL the rendezvous");
    dead.wait_exit().await;
    cluster.start_rendezvous().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_rendezvous_restarted_on_its_address_loses_no_job_and_no_attempt() {
    let mut cluster = Cluster::start().await;
    let (mut a, url_a) = cluster.agent("node-a").await;
    let (mut b, url_b) = cluster.agent("node-b").await;
    let rv = cluster.rendezvous_client().await;
    let spec = JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .batch_size(8)
        .epochs(12)
        .seed(7)
        .build()
        .expect("spec");
    rv.create_job(&JobConfig::new("outage", 2).with_max_attempts(3))
        .await
        .expect("create job");
    let shards = [rule_batch(3000, 5), rule_batch(3000, 6)];
    for (url, shard) in [(&url_a, &shards[0]), (&url_b, &shards[1])] {
        start_on(url, "outage", &spec, &cluster.rendezvous_url).await;
        assert_eq!(put(url, "outage", shard).await, 3000);
        end_of_data(url, "outage", 3000).await;
    }
    let before = wait_until(&url_a, "outage", |s| s.epoch >= 1 && s.step > 0).await;
    assert_eq!(before.attempt, 1);

    // SIGKILL mid-epoch: no shutdown, nothing flushed beyond what was acknowledged.
    let mut dead = cluster.rendezvous.take().expect("rendezvous");
    dead.child.kill().expect("SIGKILL the rendezvous");
    let exit = dead.wait_exit().await;
    assert!(!exit.success(), "killed, not exited: {exit}");
    // The gang trains on without it (the ring is agent to agent): a whole
    // epoch passes while the rendezvous is gone.
    let during = wait_until(&url_a, "outage", |s| {
        s.epoch > before.epoch || s.state.is_terminal()
    })
    .await;
    assert_eq!(during.state, AgentJobState::Training, "{during:#?}");
    assert_eq!(status(&url_b, "outage").await.state, AgentJobState::Training);

    // Restarted on the same address with the same state dir: ready only once
    // its state is restored (`serve_ready`). The log line reaches the test
    // through a pipe, so it is awaited (bounded) rather than read once.
    cluster.start_rendezvous().await;
    let restarted = cluster.rendezvous.as_ref().expect("rendezvous");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut logs = restarted.logs();
    while !logs.contains("state restored") && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        logs = restarted.logs();
    }
    assert!(
        logs.contains("state restored"),
        "rendezvous log after the restart:\n{logs}"
    );
    let sa = wait_until(&url_a, "outage", |s| s.state.is_terminal()).await;
    let sb = wait_until(&url_b, "outage", |s| s.state.is_terminal()).await;
    for s in [&sa, &sb] {
        assert_eq!(s.state, AgentJobState::Succeeded, "{s:#?}");
        assert_eq!(s.attempt, 1, "the restart cost no attempt: {s:#?}");
        assert_eq!(
            s.rows_trained_per_epoch,
            vec![6000; 12],
            "every row once per epoch"
        );
    }
    let rv = cluster.rendezvous_client().await;
    let job = rv.status("outage").await.expect("status after the restart");
    assert_eq!(
        job.state,
        kindling_schemas::rendezvous::JobState::Succeeded,
        "{job:#?}"
    );
    assert_eq!(job.attempt, 1, "{job:#?}");
    assert!(job.failures.is_empty(), "{job:#?}");

    let mut rendezvous = cluster.rendezvous.take().expect("rendezvous");
    for p in [&mut a, &mut b, &mut rendezvous] {
        p.sigterm();
        let exit = p.wait_exit().await;
        assert!(exit.success(), "{} exits 0 on SIGTERM, got {exit}", p.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_live_at_once_and_ready_only_once_registered() {
    let mut cluster = Cluster::new();
    // The rendezvous is not up yet: the agent keeps retrying, alive but not ready.
    let (mut agent, _) = cluster.spawn_agent("early");
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(&agent.health, "/healthz").await != Some(200) {
        assert!(Instant::now() < deadline, "no liveness:\n{}", agent.logs());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(http_status(&agent.health, "/readyz").await, Some(503));
    cluster.start_rendezvous().await;
    agent.wait_ready().await;
    let live = cluster
        .rendezvous_client()
        .await
        .list_agents()
        .await
        .expect("agents");
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].agent_id, "agent-early");
    assert_eq!(live[0].node_name, "early");
    assert!(
        live[0].flight_address.starts_with("https://127.0.0.1:"),
        "the advertised host: {:?}",
        live[0].flight_address
    );
    agent.sigterm();
    assert!(agent.wait_exit().await.success());
    assert!(
        cluster
            .rendezvous_client()
            .await
            .list_agents()
            .await
            .expect("agents")
            .is_empty(),
        "deregistered on SIGTERM"
    );
}

/// A shard 16× the agent's memory budget spills to disk and trains two
/// epochs over it (read back from the spill files) while the agent process's
/// peak resident memory stays far below the shard's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_far_bigger_than_the_budget_trains_with_bounded_process_memory() {
    const BUDGET: u64 = 16 << 20;
    const PIECE: usize = 65_536; // rows per batch: 1 MiB of values (8 + 4 + 4 bytes a row)
    const PIECES: usize = 256; // 16 M rows, 256 MiB of Arrow values: 16 budgets
    let cluster = Cluster::start().await;
    let (agent, url) = cluster.agent_with_budget("big", "16MiB").await;
    let pid = agent.child.id();
    let spec = one_agent_rule_spec(8192);
    let rv = cluster.rendezvous_client().await;
    rv.create_job(&JobConfig::new("big", 1))
        .await
        .expect("create job");
    start_on(&url, "big", &spec, &cluster.rendezvous_url).await;
    let idle = proc_memory(pid, "VmRSS:");

    let rows = (PIECE * PIECES) as u64;
    let shard_bytes = rows * 16;
    let committed = put_generated(
        &url,
        "big",
        "generated",
        (0..PIECES).map(|i| rule_batch(PIECE, i as u64)),
    )
    .await;
    assert_eq!(committed, rows);
    end_of_data(&url, "big", rows).await;
    let done = wait_until(&url, "big", |s| s.state.is_terminal()).await;
    assert_eq!(
        done.state,
        AgentJobState::Succeeded,
        "{done:#?}\n{}",
        agent.logs()
    );
    assert_eq!(
        done.rows_trained_per_epoch,
        vec![rows; 2],
        "every row, both epochs"
    );
    assert!(
        done.cache_bytes_memory <= BUDGET,
        "cache holds {} bytes in memory, budget {BUDGET}",
        done.cache_bytes_memory
    );
    assert!(
        done.cache_bytes_disk >= shard_bytes - BUDGET,
        "only {} bytes spilled of a {shard_bytes}-byte shard",
        done.cache_bytes_disk
    );
    let accuracy = done.history.last().and_then(|m| m.eval_accuracy);
    let loss = done.history.last().map(|m| m.train_loss).expect("history");
    assert!(
        loss < 0.3,
        "learned the rule from spilled batches: loss {loss}, accuracy {accuracy:?}"
    );

    let peak = proc_memory(pid, "VmHWM:");
    eprintln!(
        "shard {} MiB, budget {} MiB: agent RSS idle {} MiB, peak {} MiB",
        shard_bytes >> 20,
        BUDGET >> 20,
        idle >> 20,
        peak >> 20
    );
    assert!(
        peak < idle + shard_bytes / 4,
        "agent peak RSS {} MiB grew with the {} MiB shard (idle {} MiB, budget {} MiB)",
        peak >> 20,
        shard_bytes >> 20,
        idle >> 20,
        BUDGET >> 20
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                found.push(e.path());
            }
        }
    }
    found
}

/// A real agent SIGKILLed while it holds a shard spilled to disk (and a
/// checkpoint prune it was in the middle of): what it left on disk is
/// removed when an agent starts again on the node's work directory, before
/// it is ready, and the new agent takes a job of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_agent_s_spill_and_half_removed_checkpoints_are_cleaned_when_it_starts_again() {
    const PIECE: usize = 65_536; // 1 MiB of values a batch
    let cluster = Cluster::start().await;
    let (mut agent, url) = cluster.agent_with_budget("crash", "16MiB").await;
    let rv = cluster.rendezvous_client().await;
    rv.create_job(&JobConfig::new("spilled", 1))
        .await
        .expect("create job");
    start_on(
        &url,
        "spilled",
        &one_agent_rule_spec(8192),
        &cluster.rendezvous_url,
    )
    .await;
    let committed = put_generated(
        &url,
        "spilled",
        "generated",
        (0..48).map(|i| rule_batch(PIECE, i as u64)),
    )
    .await;
    assert_eq!(committed, 48 * PIECE as u64);
    let held = wait_until(&url, "spilled", |s| s.cache_bytes_disk > 16 << 20).await;
    let work = cluster.dir.path().join("crash");
    let spill = work.join("spill").join("agent-crash");
    let checkpoints = work.join("checkpoints").join("agent-crash");
    let pruning = checkpoints.join(".removing-older");
    std::fs::create_dir_all(&pruning).expect("a prune under way");
    std::fs::write(pruning.join("weights.bin"), vec![0u8; 4096]).expect("its file");
    agent.child.kill().expect("SIGKILL");
    agent.child.wait().expect("reaped");
    let left = files_under(&spill);
    assert!(
        !left.is_empty(),
        "nothing spilled on disk ({} bytes reported)",
        held.cache_bytes_disk
    );

    eprintln!("{} spill files left by the killed agent", left.len());
    let (again, url) = cluster.agent_with_budget("crash", "16MiB").await;
    let remaining: Vec<_> = left.iter().filter(|p| p.exists()).collect();
    assert!(remaining.is_empty(), "left after the restart: {remaining:?}");
    assert!(!pruning.exists(), "the half-removed checkpoint is still there");
    assert!(
        again
            .logs()
            .contains("removed what a previous agent process left behind"),
        "{}",
        again.logs()
    );
    rv.create_job(&JobConfig::new("after", 1))
        .await
        .expect("create job");
    start_on(&url, "after", &one_agent_rule_spec(256), &cluster.rendezvous_url).await;
    assert_eq!(put(&url, "after", &rule_batch(1000, 7)).await, 1000);
    end_of_data(&url, "after", 1000).await;
    let done = wait_until(&url, "after", |s| s.state.is_terminal()).await;
    assert_eq!(done.state, AgentJobState::Succeeded, "{}", again.logs());
}

/// The rule's linear classifier on one agent, two epochs, in batches of `batch_size`.
fn one_agent_rule_spec(batch_size: usize) -> JobSpec {
    JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(1)
        .batch_size(batch_size)
        .epochs(2)
        .seed(3)
        .build()
        .expect("spec")
}

/// A rule job of `epochs` on the agents at `urls`, one 3000-row shard each.
async fn rule_job_on(cluster: &Cluster, job_id: &str, urls: &[&str], epochs: u32) {
    let spec = JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(urls.len() as u32)
        .batch_size(8)
        .epochs(epochs)
        .seed(7)
        .build()
        .expect("spec");
    cluster
        .rendezvous_client()
        .await
        .create_job(&JobConfig::new(job_id, urls.len() as u32))
        .await
        .expect("create job");
    for (i, url) in urls.iter().enumerate() {
        start_on(url, job_id, &spec, &cluster.rendezvous_url).await;
        assert_eq!(put(url, job_id, &rule_batch(3000, 5 + i as u64)).await, 3000);
        end_of_data(url, job_id, 3000).await;
    }
}

/// A `job_status` call on a fresh connection with `channel`.
async fn status_with(
    url: &str,
    channel: &ChannelConfig,
    job_id: &str,
) -> Result<AgentJobStatus, tonic::Status> {
    let action = Action::JobStatus(JobRef {
        job_id: job_id.into(),
    });
    let mut results = flight_with(url, channel)
        .do_action(action.to_flight())
        .await?
        .into_inner();
    let first = results.next().await.expect("a result")?;
    Ok(serde_json::from_slice(&first.body).expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotated_mid_job_reach_new_connections_and_the_job_runs_on() {
    let cluster = Cluster::start().await;
    let (_a, url_a) = cluster.agent("node-a").await;
    let (_b, url_b) = cluster.agent("node-b").await;
    rule_job_on(&cluster, "rotate", &[&url_a, &url_b], 10).await;
    wait_until(&url_a, "rotate", |s| s.epoch >= 1 && s.step > 0).await;

    // Only the first CA's certificates are served so far.
    let ca_only = |ca: &TestCa, name: &str| {
        let path = cluster.dir.path().join(name);
        std::fs::write(&path, ca.pem()).expect("CA file");
        tls_channel(Some(&PKI.client), &path)
    };
    let (old_ca, new_ca) = (
        ca_only(&PKI.ca, "old-ca.crt"),
        ca_only(&PKI.next_ca, "new-ca.crt"),
    );
    assert!(status_with(&url_a, &old_ca, "rotate").await.is_ok());
    assert!(status_with(&url_a, &new_ca, "rotate").await.is_err());

    // cert-manager renews: both Secrets' files are replaced mid-training.
    cluster.issue_certificates(&PKI.next_ca);
    for url in [&url_a, &url_b] {
        let served = status_with(url, &new_ca, "rotate").await;
        assert_eq!(
            served.map(|s| s.state).ok(),
            Some(AgentJobState::Training),
            "{url} serves the new certificate to a new connection, and trains on"
        );
        let old = status_with(url, &old_ca, "rotate").await;
        assert!(old.is_err(), "{url} still serves the old certificate");
    }
    let rv =
        RendezvousClient::connect_with(cluster.rendezvous_url.clone(), Some(&Token::new(TOKEN)), &new_ca)
            .await
            .expect("a client trusting only the new CA reaches the rendezvous");
    assert!(rv.status("rotate").await.is_ok());

    for url in [&url_a, &url_b] {
        let done = wait_until(url, "rotate", |s| s.state.is_terminal()).await;
        assert_eq!(done.state, AgentJobState::Succeeded, "{done:#?}");
        assert_eq!(done.attempt, 1, "the rotation cost no attempt: {done:#?}");
        assert_eq!(
            done.rows_trained_per_epoch,
            vec![6000; 10],
            "every row once per epoch"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_right_certificates_nothing_gets_in() {
    let cluster = Cluster::start().await;
    let (a, url_a) = cluster.agent("node-a").await;
    rule_job_on(&cluster, "guarded", &[&url_a], 1).await;
    // What the agent logged about refused handshakes, once it says `what`.
    let refused = |what: &'static str| {
        let a = &a;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !a.logs().contains(what) {
                assert!(
                    Instant::now() < deadline,
                    "the agent never logged {what:?}:\n{}",
                    a.logs()
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    };
    assert!(status_with(&url_a, &client_channel(), "guarded").await.is_ok());

    // No client certificate: the mutual-TLS handshake is refused.
    let anonymous = tls_channel(None, &PKI.client.ca);
    status_with(&url_a, &anonymous, "guarded")
        .await
        .expect_err("no client certificate");
    refused("peer sent no certificates").await;
    // A client certificate from another CA.
    let stranger_dir = cluster.dir.path().join("stranger");
    let stranger = TestCa::new("someone else")
        .issue("intruder", &["intruder"])
        .write(&stranger_dir, &PKI.bundle);
    status_with(&url_a, &tls_channel(Some(&stranger), &PKI.client.ca), "guarded")
        .await
        .expect_err("a certificate no CA of the cluster signed");
    refused("UnknownIssuer").await;
    // Plaintext to the TLS port (no token: the dial itself would refuse one).
    let plain = ChannelConfig::default()
        .dial(&url_a.replace("https://", "http://"), false)
        .expect("dial")
        .connect_lazy();
    let err = FlightServiceClient::new(plain)
        .do_action(
            Action::JobStatus(JobRef {
                job_id: "guarded".into(),
            })
            .to_flight(),
        )
        .await
        .expect_err("plaintext to a TLS port");
    assert_ne!(err.code(), tonic::Code::NotFound, "no call got through: {err}");
    // And a client that would send the token in plaintext off loopback stops itself.
    let err = ChannelConfig::default()
        .dial("http://10.255.0.1:50051", true)
        .expect_err("plaintext token");
    assert!(err.to_string().contains("plaintext"), "{err}");
}

#[test]
fn a_server_that_would_take_a_token_in_plaintext_off_loopback_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).expect("token");
    let token = token.display().to_string();
    let agent = [
        ("KINDLING_NODE_NAME", "n1"),
        ("KINDLING_LISTEN", "0.0.0.0:0"),
        ("KINDLING_ADVERTISE_HOST", "10.0.0.7"),
        ("KINDLING_HEALTH_LISTEN", "127.0.0.1:0"),
        ("KINDLING_RENDEZVOUS", "https://kindling-rendezvous:7070"),
        ("KINDLING_TOKEN_FILE", &token),
    ];
    let rendezvous = [
        ("KINDLING_RENDEZVOUS_LISTEN", "0.0.0.0:0"),
        ("KINDLING_RENDEZVOUS_HEALTH_LISTEN", "127.0.0.1:0"),
        ("KINDLING_TOKEN_FILE", &token),
    ];
    for (bin, env) in [(AGENT_BIN, &agent[..]), (rendezvous_bin(), &rendezvous[..])] {
        let out = Command::new(bin)
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .expect("run");
        assert!(!out.status.success(), "{bin} started in plaintext");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--tls-cert") && stderr.contains("plaintext"),
            "{bin}: {stderr}"
        );
        // A named certificate that does not exist is named.
        let out = Command::new(bin)
            .env_clear()
            .envs(env.iter().copied())
            .env("KINDLING_TLS_CERT", "/nonexistent/tls.crt")
            .env("KINDLING_TLS_KEY", "/nonexistent/tls.key")
            .output()
            .expect("run");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("/nonexistent/tls.crt"), "{bin}: {stderr}");
    }
}

#[test]
fn a_json_log_format_writes_one_json_object_per_line() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(rendezvous_bin())
        .env_clear()
        .args(["--allow-unauthenticated", "--log-format", "json"])
        .args(["--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = BufReader::new(child.stderr.take().expect("stderr"));
    // Its first lines: where it listens; read until the listening line.
    let mut seen = Vec::new();
    for line in stderr.lines() {
        let line = line.expect("a log line");
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["level"].as_str().is_some_and(|l| ["INFO", "WARN"].contains(&l)),
            "{line}"
        );
        assert!(
            v["timestamp"].as_str().is_some() && v["target"].as_str().is_some(),
            "{line}"
        );
        seen.push(v["fields"]["message"].as_str().unwrap_or("").to_owned());
        if seen.last().is_some_and(|m| m == "rendezvous listening") {
            assert!(
                v["fields"]["addr"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("127.0.0.1:")),
                "{line}"
            );
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen.iter().any(|m| m == "rendezvous listening"), "{seen:?}");
}

/// Silent connections from `from` (a loopback address of its own) to `addr`.
async fn silent_connections(from: std::net::Ipv4Addr, addr: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    let to = tokio::net::lookup_host(addr)
        .await
        .expect("resolve")
        .find(std::net::SocketAddr::is_ipv4)
        .expect("an IPv4 address");
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind((from, 0).into()).expect("bind a loopback address");
        conns.push(socket.connect(to).await.expect("connect"));
    }
    conns
}

/// How many of `conns` the server closed unanswered: each is read at once,
/// all together, for 2 s (within a held one's read or handshake timeout, 5 s
/// or 10 s, so those closed at accept count, if nothing slows the test).
async fn closed_of(conns: &mut [tokio::net::TcpStream]) -> usize {
    let reads = conns.iter_mut().map(|conn| async move {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(2), conn.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .filter(|&c| c)
        .count()
}

/// `n` TLS connections from `from` to `addr` that send HTTP/2's preface and
/// an empty SETTINGS frame, then nothing: idle gRPC connections.
async fn idle_http2_connections(
    from: std::net::Ipv4Addr,
    addr: &str,
    n: usize,
) -> Vec<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tls = Tls::new(TlsFiles {
        cert: Some(PKI.client.cert.clone()),
        key: Some(PKI.client.key.clone()),
        ca: Some(PKI.client.ca.clone()),
        client_auth: false,
        server_name: Some(AGENT_CERT_NAME.into()),
    })
    .expect("client TLS");
    let connector = tokio_rustls::TlsConnector::from(tls.client_config().expect("a client config"));
    let name = rustls_pki_types::ServerName::try_from(AGENT_CERT_NAME).expect("name");
    let mut conns = Vec::with_capacity(n);
    // One at a time: a handshake not yet begun holds one of the address's
    // 32 pending places.
    for _ in 0..n {
        let tcp = silent_connections(from, addr, 1).await.remove(0);
        let mut conn = connector.connect(name.clone(), tcp).await.expect("TLS handshake");
        conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .expect("preface");
        conns.push(conn);
    }
    conns
}

/// Idle HTTP/2 connections — handshake done, then silence — from one
/// address at a real agent: it keeps that address's cap of them open
/// (each answered with the server's SETTINGS) and closes the rest at once,
/// its descriptors stay within the cap, a Flight call from another address
/// is answered meanwhile, and once they go the address connects again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_from_one_address_hold_its_cap_and_others_are_served() {
    use kindling_ops::listen::MAX_GRPC_PER_PEER;
    let cluster = Cluster::start().await;
    let (agent, url) = cluster.agent("idle").await;
    let pid = agent.child.id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let before = fds();
    let main = url.trim_start_matches("https://").to_owned();
    let extra = 8;
    let from = std::net::Ipv4Addr::new(127, 0, 0, 4);
    let mut idle = idle_http2_connections(from, &main, MAX_GRPC_PER_PEER + extra).await;
    // Each is read once: the server's SETTINGS on a kept one, the end of
    // the stream on a closed one.
    let reads = idle.iter_mut().map(|conn| async move {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => "closed",
            Ok(Ok(_)) => "answered",
            Err(_) => "silent",
        }
    });
    let outcomes = futures::future::join_all(reads).await;
    let count = |what| outcomes.iter().filter(|&&o| o == what).count();
    assert_eq!(
        (count("answered"), count("closed"), count("silent")),
        (MAX_GRPC_PER_PEER, extra, 0),
        "(kept and answered, closed, neither)\n{}",
        agent.logs()
    );
    let held = fds();
    assert!(
        held <= before + MAX_GRPC_PER_PEER + 16,
        "the agent holds {} descriptors more than before (cap {MAX_GRPC_PER_PEER})",
        held - before
    );
    let jobs: serde_json::Value = action(&url, &Action::ListJobs).await;
    assert!(
        jobs["jobs"].as_array().is_some_and(Vec::is_empty),
        "from another address, during it: {jobs}"
    );
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut again = idle_http2_connections(from, &main, 1).await;
        let mut buf = [0u8; 64];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), again[0].read(&mut buf)).await
            && n > 0
        {
            break;
        }
        // The server may not have seen the closes yet.
        assert!(
            Instant::now() < deadline,
            "the address cannot connect again once its idle connections went\n{}",
            agent.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Floods of silent connections at a real agent process: its probe port,
/// and its main port (TLS handshakes never begun). Each listener holds at
/// most its cap of them and closes the rest at once, so the process's
/// descriptors stay within the caps. One address holds at most its share of
/// the main port's pending handshakes, so a Flight call from another
/// address is answered during that flood; once the floods go, the probe and
/// a Flight call are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_silent_connections_hold_each_listener_s_cap_and_the_agent_serves_after() {
    use std::net::Ipv4Addr;

    use kindling_ops::listen::{MAX_PENDING_CONNECTIONS, MAX_PENDING_PER_PEER};
    use kindling_ops::web::probes::MAX_PROBE_CONNECTIONS;
    let cluster = Cluster::start().await;
    let (agent, url) = cluster.agent("flood").await;
    let pid = agent.child.id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let before = fds();
    let main = url.trim_start_matches("https://").to_owned();
    let extra = 100;
    // One address floods the main port: it holds its share, no more, and a
    // caller from another address is answered while the flood is held.
    let from = Ipv4Addr::new(127, 0, 0, 2);
    let mut one = silent_connections(from, &main, MAX_PENDING_PER_PEER + extra).await;
    let jobs: serde_json::Value = action(&url, &Action::ListJobs).await;
    assert!(
        jobs["jobs"].as_array().is_some_and(Vec::is_empty),
        "during the flood: {jobs}"
    );
    let closed = closed_of(&mut one).await;
    assert!(
        closed >= extra,
        "only {closed} of one address's connections past its share were closed"
    );
    // Many addresses, and the probe port: every listener holds its cap.
    let mut flood =
        silent_connections(Ipv4Addr::LOCALHOST, &agent.health, MAX_PROBE_CONNECTIONS + extra).await;
    for a in 0..MAX_PENDING_CONNECTIONS / MAX_PENDING_PER_PEER {
        let from = Ipv4Addr::new(127, 0, 0, 3 + a as u8);
        flood.extend(silent_connections(from, &main, MAX_PENDING_PER_PEER).await);
    }
    let peak = fds();
    assert!(
        peak <= before + MAX_PROBE_CONNECTIONS + MAX_PENDING_CONNECTIONS + 16,
        "the agent held {} descriptors more than before the flood (caps {MAX_PROBE_CONNECTIONS} + {MAX_PENDING_CONNECTIONS})",
        peak - before
    );
    let closed = closed_of(&mut flood).await;
    assert!(
        closed >= extra,
        "only {closed} connections past the caps were closed"
    );
    drop((one, flood));
    // The flood gone, the agent answers again.
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(&agent.health, "/readyz").await != Some(200) {
        assert!(
            Instant::now() < deadline,
            "not ready after the flood:\n{}",
            agent.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let jobs: serde_json::Value = action(&url, &Action::ListJobs).await;
    assert!(jobs["jobs"].as_array().is_some_and(Vec::is_empty), "{jobs}");
}

/// One address floods a real agent's probe port with silent connections,
/// re-opened as soon as the agent drops them (at accept, past the address's
/// share, or when a held one's time is up), for several turns of the held
/// connections' lifetime: meanwhile every `/healthz` from another address
/// is answered 200, so a pod cannot fail the kubelet's probes and have the
/// agent restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_probe_connections_from_one_address_leaves_healthz_to_another() {
    use std::net::Ipv4Addr;

    use kindling_ops::web::probes::{MAX_PROBE_CONNECTIONS, PROBE_CONNECTION_TIMEOUT};
    let cluster = Cluster::start().await;
    let (agent, _url) = cluster.agent("probe-flood").await;
    let to: std::net::SocketAddr = agent.health.parse().expect("the probe address");
    let stop = tokio_util::sync::CancellationToken::new();
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood: Vec<_> = (0..MAX_PROBE_CONNECTIONS + 16)
        .map(|_| {
            let (stop, opened) = (stop.clone(), opened.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                    socket
                        .bind((Ipv4Addr::new(127, 0, 0, 2), 0).into())
                        .expect("bind 127.0.0.2");
                    let Ok(mut conn) = socket.connect(to).await else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // Silent until the agent closes it.
                    let mut byte = [0u8; 1];
                    tokio::select! {
                        _ = conn.read(&mut byte) => {}
                        _ = stop.cancelled() => {}
                    }
                }
            })
        })
        .collect();
    let until = Instant::now() + 3 * PROBE_CONNECTION_TIMEOUT + Duration::from_secs(1);
    let mut answered = 0;
    while Instant::now() < until {
        let status = http_status(&agent.health, "/healthz").await;
        assert_eq!(
            status,
            Some(200),
            "/healthz from 127.0.0.1 during the flood from 127.0.0.2 (after {answered} answers)\n{}",
            agent.logs()
        );
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for task in flood {
        task.await.expect("flood task");
    }
    // The flood re-opened what the agent dropped: more connections than it
    // holds at once, so the probes were answered while it was at its caps.
    let opened = opened.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        opened > MAX_PROBE_CONNECTIONS + 16,
        "the flood opened only {opened} connections"
    );
}

/// `n` TLS connections from `from` to `addr` that ask for HTTP/1.1 (the
/// status page and `/metrics`) and then send nothing.
async fn idle_page_connections(
    from: std::net::Ipv4Addr,
    addr: &str,
    n: usize,
) -> Vec<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let tcp = silent_connections(from, addr, 1).await.remove(0);
        conns.push(
            page_connector()
                .connect(page_name(), tcp)
                .await
                .expect("TLS handshake"),
        );
    }
    conns
}

fn page_connector() -> tokio_rustls::TlsConnector {
    let tls = Tls::new(TlsFiles {
        cert: Some(PKI.client.cert.clone()),
        key: Some(PKI.client.key.clone()),
        ca: Some(PKI.client.ca.clone()),
        client_auth: false,
        server_name: Some(AGENT_CERT_NAME.into()),
    })
    .expect("client TLS");
    let mut config = (*tls.client_config().expect("a client config")).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

fn page_name() -> rustls_pki_types::ServerName<'static> {
    rustls_pki_types::ServerName::try_from(AGENT_CERT_NAME).expect("name")
}

/// A flood of idle page connections (TLS done, HTTP/1.1 asked, no request)
/// from one address at a real agent's main port: the address holds its
/// share of the port's HTTP connections and the rest are closed at once;
/// the held ones are dropped once the request-head timeout passes; meanwhile
/// `/metrics` from another address is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_page_connections_from_one_address_hold_its_share_and_another_reads_metrics() {
    use std::net::Ipv4Addr;

    use kindling_ops::web::{MAX_CONNECTIONS_PER_PEER, READ_TIMEOUT};
    let cluster = Cluster::start().await;
    let (agent, url) = cluster.agent("pages").await;
    let main = url.trim_start_matches("https://").to_owned();
    let extra = 8;
    let mut flood = idle_page_connections(
        Ipv4Addr::new(127, 0, 0, 2),
        &main,
        MAX_CONNECTIONS_PER_PEER + extra,
    )
    .await;
    let started = Instant::now();
    let reads = flood.iter_mut().map(|conn| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(READ_TIMEOUT * 3, conn.read(&mut byte)).await;
        (matches!(read, Ok(Ok(0) | Err(_))), Instant::now())
    });
    // Meanwhile another address reads /metrics with the viewer token.
    let metrics = async {
        let tcp = silent_connections(Ipv4Addr::new(127, 0, 0, 3), &main, 1)
            .await
            .remove(0);
        let mut conn = page_connector()
            .connect(page_name(), tcp)
            .await
            .expect("TLS handshake");
        let request = format!(
            "GET /metrics HTTP/1.1\r\nhost: agent\r\nauthorization: Bearer {VIEWER_TOKEN}\r\nconnection: close\r\n\r\n"
        );
        conn.write_all(request.as_bytes()).await.expect("request");
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer).await;
        answer
    };
    let (ends, answer) = tokio::join!(futures::future::join_all(reads), metrics);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "another address: {answer}\n{}",
        agent.logs()
    );
    let closed: Vec<Duration> = ends
        .iter()
        .filter(|(c, _)| *c)
        .map(|(_, at)| *at - started)
        .collect();
    assert_eq!(
        closed.len(),
        ends.len(),
        "some idle page connections were never closed"
    );
    let at_once = closed.iter().filter(|t| **t < READ_TIMEOUT / 2).count();
    assert_eq!(
        at_once, extra,
        "the connections past the address's share are closed at once, the others after the read timeout: {closed:?}"
    );
}

/// The CPU time `pid` has used (user + system), from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // After the command's parenthesised name: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat")
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    let hz = Command::new("getconf").arg("CLK_TCK").output().expect("getconf");
    let hz: u64 = String::from_utf8_lossy(&hz.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK");
    Duration::from_millis(ticks * 1000 / hz)
}

/// A real agent process out of file descriptors (its limit lowered with
/// `prlimit` to a few past what it holds, then a flood of connections takes
/// them): every accept fails, and each listener waits before it tries again
/// instead of spinning — the process uses under a quarter of a core while
/// the flood holds it — and once the flood goes, a Flight call is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_listeners_back_off_and_serve_once_freed() {
    use std::net::Ipv4Addr;
    let cluster = Cluster::start().await;
    let (agent, url) = cluster.agent("nofile").await;
    let pid = agent.child.id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let limit = fds() + 16;
    let lowered = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("prlimit");
    assert!(lowered.success(), "prlimit --nofile on the agent");
    let main = url.trim_start_matches("https://").to_owned();
    let mut flood = Vec::new();
    for a in 0..4u8 {
        flood.extend(silent_connections(Ipv4Addr::new(127, 0, 0, 10 + a), &main, 24).await);
    }
    flood.extend(silent_connections(Ipv4Addr::LOCALHOST, &agent.health, 24).await);
    let deadline = Instant::now() + Duration::from_secs(30);
    while fds() + 2 < limit {
        assert!(
            Instant::now() < deadline,
            "the flood never took the agent's descriptors"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A window while every accept fails: the backoff keeps the process idle.
    let (cpu, started) = (cpu_time(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (used, window) = (cpu_time(pid) - cpu, started.elapsed());
    assert!(
        used < window / 4,
        "out of descriptors the agent used {used:?} of CPU in {window:?}: its listeners spin"
    );
    assert!(
        agent.logs().contains("accept"),
        "no failed accept was logged:\n{}",
        agent.logs()
    );
    drop(flood);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answered = flight(&url).do_action(Action::ListJobs.to_flight()).await.is_ok();
        if answered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not answered after the flood:\n{}",
            agent.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status a refused streaming call ends with: the call's own, or its
/// reply stream's first item.
async fn refused_with<T>(call: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>) -> tonic::Status {
    match call {
        Err(status) => status,
        Ok(answers) => answers
            .into_inner()
            .next()
            .await
            .expect("an answer")
            .err()
            .expect("a refusal, not an answer"),
    }
}

/// A Flight client of agent `url` holding a credential for `job_id` in
/// `role`, issued by the agent with the operator token.
async fn credential_client(url: &str, job_id: &str, role: kindling_schemas::credential::Role) -> Flight {
    use kindling_schemas::action::{CredentialResponse, IssueCredential};
    let issued: CredentialResponse = action(
        url,
        &Action::IssueCredential(IssueCredential {
            job_id: job_id.into(),
            role,
            ttl_secs: 600,
        }),
    )
    .await;
    let channel = client_channel().dial(url, true).expect("dial").connect_lazy();
    let attach = BearerAttach::new(Some(&Token::new(issued.credential))).expect("token");
    FlightServiceClient::with_interceptor(channel, attach)
}

/// The memory oracle. One producer credential sends hostile traffic — 100
/// streams whose message bodies are padded far past their one-row batches,
/// staged and then held open; a stream of thousands of one-row batches,
/// held; a dictionary-encoded stream; streams past the credential's cap —
/// while another job trains on the same agent. The agent's peak resident
/// memory stays within its budget, its receive-buffer bound
/// (`--max-receiving-bytes`) and [`ORACLE_OVERHEAD`]; the hostile streams
/// past the credential's share of that bound are refused with
/// `RESOURCE_EXHAUSTED` before their messages are read, and the other job
/// trains every row of both epochs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_traffic_from_one_credential_leaves_memory_bounded_and_the_other_job_trains() {
    use kindling_schemas::credential::Role;
    const BUDGET: u64 = 16 << 20;
    const RECEIVING: u64 = 32 << 20;
    const PAD: usize = 1 << 20;
    const HELD: usize = 100;
    let cluster = Cluster::start().await;
    let (mut agent, url) =
        cluster.spawn_agent_with("oracle", "16MiB", &[("KINDLING_MAX_RECEIVING_BYTES", "32MiB")]);
    agent.wait_ready().await;
    let pid = agent.child.id();
    let spec = one_agent_rule_spec(1024);
    let rv = cluster.rendezvous_client().await;
    for job in ["hostile", "honest", "calm"] {
        rv.create_job(&JobConfig::new(job, 1)).await.expect("create job");
        start_on(&url, job, &spec, &cluster.rendezvous_url).await;
    }
    // What training the other job's rows takes with nothing else going on.
    let rows = 64 * 1024;
    let train = |job: &'static str| {
        let url = url.clone();
        async move {
            let committed =
                put_generated(&url, job, "shard", pieces(&rule_batch(rows, 9), 4096).into_iter()).await;
            assert_eq!(committed, rows as u64);
            let started = Instant::now();
            end_of_data(&url, job, rows as u64).await;
            let done = wait_until(&url, job, |s| s.state.is_terminal()).await;
            (done, started.elapsed())
        }
    };
    let (calm, calm_took) = train("calm").await;
    assert_eq!(calm.state, AgentJobState::Succeeded, "{calm:#?}");
    let idle = proc_memory(pid, "VmRSS:");
    let hostile = credential_client(&url, "hostile", Role::Producer).await;
    // A dictionary-encoded stream is refused at its schema (sent first: past
    // the cap below it would be refused for that).
    let dict_schema = arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
        "x1",
        arrow::datatypes::DataType::Dictionary(
            Box::new(arrow::datatypes::DataType::Int32),
            Box::new(arrow::datatypes::DataType::Utf8),
        ),
        true,
    )]);
    let dict: Vec<arrow_flight::FlightData> =
        put_messages("hostile", Split::Train, "dict", &dict_schema, std::iter::empty())
            .collect()
            .await;
    let dict = futures::stream::iter(dict);
    let refusal = refused_with(hostile.clone().do_put(dict).await).await;
    assert_eq!(refusal.code(), tonic::Code::InvalidArgument, "{refusal}");

    // Each stream opened, then read until it has acknowledged all its
    // batches (it is held) or it is refused; its messages padded PAD bytes
    // past their one row.
    let hold = |producer: String, rows: usize, batches: usize, pad: usize| {
        let (hostile, agent) = (&hostile, &agent);
        async move { hold_stream(hostile, "hostile", &producer, (rows, batches, pad), agent).await }
    };
    let mut open = Vec::new();
    let mut refused = Vec::new();
    let mut padded_held = 0;
    for i in 0..HELD {
        match hold(format!("padded-{i}"), 1, 2, PAD).await {
            Ok(acks) => {
                open.push(acks);
                padded_held += 1;
            }
            Err(status) => refused.push(status),
        }
    }
    match hold("tiny".into(), 1, 3000, 0).await {
        Ok(acks) => open.push(acks),
        Err(status) => panic!("the tiny-batch stream was refused: {status}"),
    }
    // Small streams up to the credential's cap of open streams, and 10 past it.
    let under_cap = 128 - open.len();
    for i in 0..under_cap + 10 {
        match hold(format!("more-{i}"), 10, 1, 0).await {
            Ok(acks) => open.push(acks),
            Err(status) => refused.push(status),
        }
    }
    let share = RECEIVING / 2;
    assert!(
        padded_held > 0 && padded_held as u64 * PAD as u64 <= share,
        "{padded_held} padded streams held: each pins over {PAD} bytes, the credential's share is {share}"
    );
    assert_eq!(open.len(), 128, "held up to the credential's cap of streams");
    assert_eq!(
        refused.len(),
        HELD - padded_held + 10,
        "the padded streams past the share and the streams past the cap were refused"
    );
    assert!(
        refused.iter().all(|s| s.code() == tonic::Code::ResourceExhausted),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|s| s.message().contains("--max-receiving-bytes")),
        "the padded streams past the share are refused naming the bound: {refused:?}"
    );
    assert_eq!(
        refused
            .iter()
            .filter(|s| s.message().contains("streams open on this agent, its cap"))
            .count(),
        10,
        "the streams past the credential's cap are refused naming it: {refused:?}"
    );
    // Meanwhile the other job trains on the agent.
    let (done, took) = train("honest").await;
    eprintln!(
        "memory oracle: the other job trained in {took:?} beside the hostile streams, {calm_took:?} alone"
    );
    assert_eq!(
        done.state,
        AgentJobState::Succeeded,
        "{done:#?}\n{}",
        agent.logs()
    );
    assert_eq!(done.rows_trained_per_epoch, vec![rows as u64; 2]);
    // A dictionary-encoded DoExchange (a reader of the trained job, its
    // dictionary batches sent after the schema) is refused at the schema:
    // no dictionary, nor any delta, is kept.
    let reader = credential_client(&url, "honest", Role::Reader).await;
    let values: Vec<String> = (0..1000).map(|i| format!("value-{}", i % 7)).collect();
    let coded: arrow::array::DictionaryArray<arrow::datatypes::Int32Type> =
        values.iter().map(String::as_str).collect();
    let coded = RecordBatch::try_new(
        std::sync::Arc::new(dict_schema.clone()),
        vec![std::sync::Arc::new(coded)],
    )
    .expect("a dictionary batch");
    let path = kindling_schemas::descriptor::DataPath::Predict {
        job_id: "honest".into(),
    };
    let exchange = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(path.descriptor()))
        .with_dictionary_handling(arrow_flight::encode::DictionaryHandling::Resend)
        .build(futures::stream::iter([Ok(coded.clone()), Ok(coded)]))
        .map(|m| m.expect("encoded"));
    let refusal = refused_with(reader.clone().do_exchange(exchange).await).await;
    assert_eq!(refusal.code(), tonic::Code::InvalidArgument, "{refusal}");
    assert!(refusal.message().contains("dictionary"), "{refusal}");
    let hostile_status = status(&url, "hostile").await;
    assert_eq!(
        hostile_status.rows_train, 0,
        "nothing of the held streams was committed"
    );
    eprintln!(
        "memory oracle: the hostile job's cache holds {} B in memory, {} B on disk",
        hostile_status.cache_bytes_memory, hostile_status.cache_bytes_disk
    );

    let peak = proc_memory(pid, "VmHWM:");
    let now = proc_memory(pid, "VmRSS:");
    eprintln!(
        "memory oracle: agent RSS idle {} MiB, peak {} MiB, now {} MiB (budget {} MiB; {} streams held, {padded_held} of them padded, {} MiB of padding sent)",
        idle >> 20,
        peak >> 20,
        now >> 20,
        BUDGET >> 20,
        open.len(),
        (HELD * 2 * PAD) >> 20
    );
    assert!(
        peak <= idle + BUDGET + RECEIVING + ORACLE_OVERHEAD,
        "agent peak RSS {} MiB past idle {} MiB + budget {} MiB + receive buffers {} MiB + overhead {} MiB",
        peak >> 20,
        idle >> 20,
        BUDGET >> 20,
        RECEIVING >> 20,
        ORACLE_OVERHEAD >> 20
    );
    drop(open);
}

/// One producer's `DoPut` of `batches` into `split` of `job_id`: the rows
/// committed, or the status the stream was refused with.
async fn try_put(
    url: &str,
    job_id: &str,
    split: Split,
    producer: &str,
    batches: Vec<RecordBatch>,
) -> Result<u64, tonic::Status> {
    let messages = put_messages(job_id, split, producer, &rule_schema(), batches.into_iter());
    let mut acks = flight(url).do_put(messages).await?.into_inner();
    let mut committed = None;
    while let Some(answer) = acks.next().await {
        let ack = kindling_schemas::metadata::PutAck::decode(&answer?.app_metadata).expect("ack metadata");
        if ack.committed {
            committed = Some(ack.rows);
        }
    }
    Ok(committed.expect("a commit acknowledgement"))
}

/// Streams of 64 Ki rows (1 MiB of values) from new producers into `job_id`
/// until one is refused: the rows committed before, and the refusal.
async fn push_until_refused(url: &str, job_id: &str) -> (u64, tonic::Status) {
    let mut committed = 0;
    for i in 0..32 {
        let batches = pieces(&rule_batch(64 * 1024, i), 4096);
        match try_put(url, job_id, Split::Train, &format!("{job_id}-{i}"), batches).await {
            Ok(rows) => committed += rows,
            Err(status) => return (committed, status),
        }
    }
    panic!("{job_id}: 32 MiB of rows committed, none refused");
}

/// Opens a `DoPut` stream of `job` with `client` that sends `batches`
/// batches of `rows` rows, each message padded `pad` bytes past its batch,
/// and then holds the stream open; reads its acks. Returns the stream, or
/// its refusal; panics, with `agent`'s logs, if neither comes in 120 s.
async fn hold_stream(
    client: &Flight,
    job: &str,
    producer: &str,
    (rows, batches, pad): (usize, usize, usize),
    agent: &Proc,
) -> Result<tonic::Streaming<arrow_flight::PutResult>, tonic::Status> {
    let messages: Vec<arrow_flight::FlightData> = put_messages(
        job,
        Split::Train,
        producer,
        &rule_schema(),
        (0..batches).map(move |i| rule_batch(rows, i as u64)),
    )
    .collect()
    .await;
    let padded = messages.into_iter().map(move |mut m| {
        if !m.app_metadata.is_empty() && pad > 0 {
            let mut body = m.data_body.to_vec();
            body.resize(body.len() + pad, 0);
            m.data_body = body.into();
        }
        m
    });
    let request = futures::stream::iter(padded).chain(futures::stream::pending());
    let mut acks = client.clone().do_put(request).await?.into_inner();
    for _ in 0..batches {
        match tokio::time::timeout(Duration::from_secs(120), acks.next()).await {
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(status))) => return Err(status),
            Ok(None) => panic!("{producer}: the agent ended the stream without an error"),
            Err(_) => panic!("{producer}: no ack and no refusal in 120 s\n{}", agent.logs()),
        }
    }
    Ok(acks)
}

/// The receive budget is split among the credentials holding it (#59,
/// point 6): two producer credentials hold as many 1 MiB-padded messages
/// open as the agent lets them (24 MiB in all), each refused past its
/// part — the first at half of it, the second at a third while the first
/// holds — and a third credential's 3 MiB message is still taken (the
/// first two would have left it under 2 MiB at half each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_credentials_holding_the_receive_buffers_leave_a_third_room_to_push() {
    use kindling_schemas::credential::Role;
    const MIB: u64 = 1 << 20;
    let cluster = Cluster::start().await;
    let (mut agent, url) =
        cluster.spawn_agent_with("fair", "16MiB", &[("KINDLING_MAX_RECEIVING_BYTES", "24MiB")]);
    agent.wait_ready().await;
    let spec = one_agent_rule_spec(1024);
    let rv = cluster.rendezvous_client().await;
    for job in ["first", "second", "third"] {
        rv.create_job(&JobConfig::new(job, 1)).await.expect("create job");
        start_on(&url, job, &spec, &cluster.rendezvous_url).await;
    }
    let mut open = Vec::new();
    let mut held = Vec::new();
    for (job, part) in [("first", 12 * MIB), ("second", 8 * MIB)] {
        let client = credential_client(&url, job, Role::Producer).await;
        let mut n = 0u64;
        let refusal = loop {
            match hold_stream(&client, job, &format!("{job}-{n}"), (1, 1, MIB as usize), &agent).await {
                Ok(acks) => {
                    open.push(acks);
                    n += 1;
                }
                Err(status) => break status,
            }
            assert!(
                n <= 24,
                "{job}: {n} MiB held, past the whole bound\n{}",
                agent.logs()
            );
        };
        assert_eq!(refusal.code(), tonic::Code::ResourceExhausted, "{refusal}");
        assert!(
            refusal.message().contains(&format!("past its bound of {part}")),
            "{job}: {refusal}"
        );
        // Each message pins a little over 1 MiB.
        assert_eq!(n, part / MIB - 1, "{job}: {refusal}");
        held.push(n);
    }
    let third = credential_client(&url, "third", Role::Producer).await;
    // A 3 MiB message: 16 bytes a row.
    let rows = (3 * MIB as usize) / 16;
    let taken = hold_stream(&third, "third", "third-0", (rows, 1, 0), &agent)
        .await
        .unwrap_or_else(|status| panic!("the third credential was refused: {status}\n{}", agent.logs()));
    assert_eq!(held, vec![11, 7]);
    drop((taken, open));
}

/// Committed rows are bounded (#59, point 5): a producer committing stream
/// after stream is refused at its job's cap on this agent
/// (`--max-job-bytes`), another at the disk watermark over all jobs' spill
/// files (`--disk-watermark`), and a split that ended takes no new rows
/// until the job's client reopens it — while another job's rows stay and
/// it trains to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_cap_or_the_disk_watermark_is_refused_and_another_job_trains_to_the_end() {
    const JOB_CAP: u64 = 6 << 20;
    const WATERMARK: u64 = 8 << 20;
    let cluster = Cluster::start().await;
    let (mut agent, url) = cluster.spawn_agent_with(
        "bounded",
        "2MiB",
        &[
            ("KINDLING_MAX_JOB_BYTES", "6MiB"),
            ("KINDLING_DISK_WATERMARK", "8MiB"),
        ],
    );
    agent.wait_ready().await;
    let spec = one_agent_rule_spec(1024);
    let rv = cluster.rendezvous_client().await;
    for job in ["greedy", "flood", "honest", "late"] {
        rv.create_job(&JobConfig::new(job, 1)).await.expect("create job");
        start_on(&url, job, &spec, &cluster.rendezvous_url).await;
    }
    // A split that ended takes no new rows until the job's client reopens
    // it (as it does to feed a lost agent's shards to the agents that take
    // them over).
    let _: serde_json::Value = action(
        &url,
        &Action::EndOfData(EndOfData {
            job_id: "late".into(),
            split: Split::Eval,
            expected_rows: Some(0),
        }),
    )
    .await;
    let late = try_put(&url, "late", Split::Eval, "late", vec![rule_batch(10, 1)]).await;
    let late = late.expect_err("rows into an ended split");
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late}");
    assert!(
        late.message().contains("split ended") && late.message().contains("reopen_split"),
        "{late}"
    );
    assert_eq!(status(&url, "late").await.rows_eval, 0);
    let _: serde_json::Value = action(
        &url,
        &Action::ReopenSplit(kindling_schemas::action::ReopenSplit {
            job_id: "late".into(),
            split: Split::Eval,
            drop_producers: Vec::new(),
        }),
    )
    .await;
    let taken = try_put(&url, "late", Split::Eval, "late", vec![rule_batch(10, 1)]).await;
    assert_eq!(taken.expect("rows into the reopened split"), 10);
    assert_eq!(status(&url, "late").await.rows_eval, 10);

    // The other job's rows, committed before the flood (512 KiB in memory).
    let rows = 32 * 1024;
    let honest = try_put(
        &url,
        "honest",
        Split::Train,
        "shard",
        pieces(&rule_batch(rows, 9), 4096),
    )
    .await;
    assert_eq!(honest.expect("the honest job's rows"), rows as u64);

    // One job commits stream after stream: refused at its cap, and the
    // refused stream commits nothing.
    let (committed, refused) = push_until_refused(&url, "greedy").await;
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert!(refused.message().contains("--max-job-bytes"), "{refused}");
    let greedy = status(&url, "greedy").await;
    assert_eq!(
        greedy.rows_train, committed,
        "the refused stream committed nothing"
    );
    let held = greedy.cache_bytes_memory + greedy.cache_bytes_disk;
    assert!(
        held <= JOB_CAP,
        "the job holds {held} bytes, past its cap {JOB_CAP}"
    );
    assert!(
        committed * 16 >= JOB_CAP - (2 << 20),
        "refused early: {committed} rows"
    );

    // Another refused at the watermark: all spill files stay below it.
    let (_, refused) = push_until_refused(&url, "flood").await;
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert!(refused.message().contains("--disk-watermark"), "{refused}");
    let mut spilled = 0;
    for job in ["greedy", "flood", "honest"] {
        spilled += status(&url, job).await.cache_bytes_disk;
    }
    assert!(
        spilled <= WATERMARK,
        "spill files hold {spilled} bytes, past {WATERMARK}"
    );

    // The other job trains every row to the end.
    end_of_data(&url, "honest", rows as u64).await;
    let done = wait_until(&url, "honest", |s| s.state.is_terminal()).await;
    assert_eq!(
        done.state,
        AgentJobState::Succeeded,
        "{done:#?}\n{}",
        agent.logs()
    );
    assert_eq!(done.rows_trained_per_epoch, vec![rows as u64; 2]);
}

/// Opens `n` model reads on `client` and reads none of them: the reads
/// the agent took, and those it refused.
async fn unread_reads(client: &Flight, path: &kindling_schemas::descriptor::DataPath, n: usize) -> Reads {
    let mut reads = Reads::default();
    for _ in 0..n {
        match client.clone().do_get(path.ticket()).await {
            Ok(stream) => reads.held.push(stream.into_inner()),
            Err(status) => reads.refused.push(status),
        }
    }
    reads
}

#[derive(Default)]
struct Reads {
    held: Vec<tonic::Streaming<arrow_flight::FlightData>>,
    refused: Vec<tonic::Status>,
}

/// Trains job `served` on the agent at `url` (one agent; an MLP with
/// `hidden` layers on 2,048 rule rows, one epoch) to success; returns the
/// path of its model.
async fn served_model(
    cluster: &Cluster,
    url: &str,
    hidden: Vec<usize>,
) -> kindling_schemas::descriptor::DataPath {
    let spec = JobSpec::builder()
        .model(ModelSpec::Mlp { hidden })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.01))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(1)
        .batch_size(1024)
        .epochs(1)
        .seed(3)
        .build()
        .expect("spec");
    let rv = cluster.rendezvous_client().await;
    rv.create_job(&JobConfig::new("served", 1))
        .await
        .expect("create job");
    start_on(url, "served", &spec, &cluster.rendezvous_url).await;
    assert_eq!(put(url, "served", &rule_batch(2048, 5)).await, 2048);
    end_of_data(url, "served", 2048).await;
    let done = wait_until(url, "served", |s| s.state.is_terminal()).await;
    assert_eq!(done.state, AgentJobState::Succeeded, "{done:#?}");
    kindling_schemas::descriptor::DataPath::Model {
        job_id: "served".into(),
    }
}

/// A read of `path` by `reader`, once one of its slots is free: refused
/// with `RESOURCE_EXHAUSTED` until then; fails with `held` after 120 s.
async fn read_when_a_slot_frees(
    reader: &Flight,
    path: &kindling_schemas::descriptor::DataPath,
    held: &str,
) -> tonic::Streaming<arrow_flight::FlightData> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match reader.clone().do_get(path.ticket()).await {
            Ok(stream) => return stream.into_inner(),
            Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}"),
        }
        assert!(Instant::now() < deadline, "{held}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Model reads are bounded (#59, point 4). A reader credential opens 100
/// `DoGet`s of a model of a million parameters and reads none, the operator
/// 100 more: the agent takes half of its `--max-reads` (8) from the
/// credential and the rest from the operator, refuses every other read
/// (`GetFlightInfo` too) with `RESOURCE_EXHAUSTED` naming the cap, and its
/// resident memory grows by less than [`READ_OVERHEAD`] (every read sends
/// the one encoding of the model; before, each copied the weights). Once
/// the reader resets its unread reads, its reads are taken again and get
/// the whole model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_model_reads_past_the_cap_are_refused_and_memory_stays_bounded() {
    use kindling_schemas::credential::Role;
    const UNREAD: usize = 100;
    let cluster = Cluster::start().await;
    let (mut agent, url) = cluster.spawn_agent_with("reads", "64MiB", &[("KINDLING_MAX_READS", "8")]);
    agent.wait_ready().await;
    let pid = agent.child.id();
    let path = served_model(&cluster, &url, vec![1024, 1024]).await;
    // The whole model, as the client downloads it.
    // A tensor of the model (1024 × 1024) is one 4 MiB message.
    let operator = flight(&url).max_decoding_message_size(64 << 20);
    let whole = operator.clone().do_get(path.ticket()).await.expect("a read");
    let whole = kindling_fixtures::model_weights(whole.into_inner()).await;
    let params: usize = whole.iter().map(|(_, v)| v.len()).sum();
    assert!(params > 1_000_000, "{params} parameters");
    let idle = proc_memory(pid, "VmRSS:");

    let reader = credential_client(&url, "served", Role::Reader)
        .await
        .max_decoding_message_size(64 << 20);
    let mut readers = unread_reads(&reader, &path, UNREAD).await;
    assert_eq!(readers.held.len(), 4, "a credential's share: half of --max-reads");
    let info = reader.clone().get_flight_info(path.descriptor()).await;
    readers
        .refused
        .push(info.expect_err("GetFlightInfo takes a read slot too"));
    let operators = unread_reads(&operator, &path, UNREAD).await;
    assert_eq!(operators.held.len(), 4, "the rest of --max-reads");
    for refused in readers.refused.iter().chain(&operators.refused) {
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
        assert!(refused.message().contains("--max-reads"), "{refused}");
    }
    assert_eq!(
        readers.refused.len() + operators.refused.len(),
        2 * UNREAD + 1 - 8
    );
    let held = proc_memory(pid, "VmRSS:");
    eprintln!(
        "model reads: agent RSS {} MiB idle, {} MiB with 8 unread reads held and {} refused ({params} parameters)",
        idle >> 20,
        held >> 20,
        2 * UNREAD - 8
    );
    assert!(
        held <= idle + READ_OVERHEAD,
        "agent RSS {} MiB with the unread reads, past idle {} MiB + {} MiB",
        held >> 20,
        idle >> 20,
        READ_OVERHEAD >> 20
    );

    // A read's slot is held while the agent holds what the client has not
    // read; once the client resets its unread reads the slots come back,
    // and a read gets the whole model.
    drop(readers.held);
    let again = read_when_a_slot_frees(&reader, &path, "the reset reads still hold their slots").await;
    assert_eq!(kindling_fixtures::model_weights(again).await, whole);
    drop(operators.held);
}

/// A model read whose client reads nothing is ended at the idle bound
/// (`--stream-idle-secs`, #59 point 4): the agent stops feeding it and says
/// so in its log; the stalled client, reading at last, gets what was queued
/// for it and then `DEADLINE_EXCEEDED` — never a model cut short that looks
/// whole — and then the read's slot (the reader credential's only one, half
/// of `--max-reads` 2) takes a new read, which gets the whole model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_read_that_reads_nothing_ends_at_the_idle_bound_and_gives_its_slot_back() {
    use kindling_schemas::credential::Role;
    let cluster = Cluster::start().await;
    let (mut agent, url) = cluster.spawn_agent_with(
        "stalled",
        "64MiB",
        &[("KINDLING_MAX_READS", "2"), ("KINDLING_STREAM_IDLE_SECS", "1")],
    );
    agent.wait_ready().await;
    // Four 1024 × 1024 tensors, a 4 MiB message each: more than a client
    // that reads nothing takes in (its HTTP/2 window, 2 MiB) and the agent
    // queues for it, so the agent's send waits.
    let path = served_model(&cluster, &url, vec![1024; 5]).await;
    let reader = credential_client(&url, "served", Role::Reader)
        .await
        .max_decoding_message_size(64 << 20);
    let mut stalled = reader
        .clone()
        .do_get(path.ticket())
        .await
        .expect("a read")
        .into_inner();
    let held = reader.clone().do_get(path.ticket()).await;
    let held = held.expect_err("the credential's one read slot is taken");
    assert_eq!(held.code(), tonic::Code::ResourceExhausted, "{held}");
    // The agent ends the read nobody reads.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !agent
        .logs()
        .lines()
        .any(|l| l.contains("stream ended") && l.contains("DoGet"))
    {
        assert!(
            Instant::now() < deadline,
            "the unread DoGet was never ended:\n{}",
            agent.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The stalled client reads what was queued for it, then the error.
    let mut queued = 0;
    let ended = loop {
        match stalled.message().await {
            Ok(Some(_)) => queued += 1,
            Ok(None) => panic!("the ended read looked whole after {queued} messages"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::DeadlineExceeded, "{ended}");
    assert!(
        ended.message().contains("DoGet") && ended.message().contains("--stream-idle-secs"),
        "{ended}"
    );
    drop(stalled);
    // Its slot is back: a new read gets the whole model.
    let again = read_when_a_slot_frees(&reader, &path, "the ended read still holds its slot").await;
    let whole = kindling_fixtures::model_weights(again).await;
    let params: usize = whole.iter().map(|(_, v)| v.len()).sum();
    assert!(params > 4_000_000, "{params} parameters");
}

/// What a model's unread reads may add to an agent's resident memory: the
/// message in flight of each read it holds (8, each at most the model's
/// largest tensor, 4 MiB, as tonic encodes it), their tasks and the
/// refused calls' buffers; one copy of the weights per read, as before the
/// bound, is 800 MiB.
const READ_OVERHEAD: u64 = 96 << 20;

/// What an agent may hold past its budget under the memory oracle's
/// traffic: the messages being decoded (one per active stream, each at most
/// a flow-control window in flight), the held streams' tasks and buffers,
/// the trainer's working set (docs/operations.md, caps).
const ORACLE_OVERHEAD: u64 = 96 << 20;

/// The JSON log lines of `logs` whose message is `message`.
fn json_lines(logs: &str, message: &str) -> Vec<serde_json::Value> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .collect()
}

/// The value of `field` in the spans a JSON log line was written in, innermost last.
fn span_field<'a>(line: &'a serde_json::Value, field: &str) -> Vec<&'a serde_json::Value> {
    line["spans"]
        .as_array()
        .map(|spans| spans.iter().filter_map(|s| s.get(field)).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_job_logs_its_trace_id_on_the_rendezvous_and_on_every_agent_with_rank_and_attempt() {
    let mut cluster = Cluster::new();
    cluster.json_logs = true;
    cluster.start_rendezvous().await;
    let (a, url_a) = cluster.agent("trace-a").await;
    let (b, url_b) = cluster.agent("trace-b").await;
    // What `fit` does: every call of the job made inside one trace.
    let trace = TraceContext::new_root();
    let id = serde_json::Value::from(trace.trace_id());
    trace
        .scope(rule_job_on(&cluster, "traced", &[&url_a, &url_b], 2))
        .await;
    for url in [&url_a, &url_b] {
        wait_until(url, "traced", |s| s.state == AgentJobState::Succeeded).await;
    }
    // A job started outside any trace logs none.
    rule_job_on(&cluster, "untraced", &[&url_a, &url_b], 1).await;
    for url in [&url_a, &url_b] {
        wait_until(url, "untraced", |s| s.state == AgentJobState::Succeeded).await;
    }

    // The rendezvous: the client's CreateJob, the agents' last Join and their
    // CompleteJob, each in a call span with the trace id.
    let rendezvous = cluster.rendezvous.as_ref().expect("rendezvous").logs();
    for (message, job) in [
        ("job created", "traced"),
        ("gang formed", "traced"),
        ("job succeeded", "traced"),
    ] {
        let lines: Vec<_> = json_lines(&rendezvous, message)
            .into_iter()
            .filter(|l| l["fields"]["job"] == job)
            .collect();
        assert!(!lines.is_empty(), "no `{message}` line for {job}:\n{rendezvous}");
        for line in &lines {
            assert_eq!(span_field(line, "trace_id"), [&id], "{line}");
            assert!(
                span_field(line, "rpc")[0]
                    .as_str()
                    .is_some_and(|r| r.starts_with("/kindling.rendezvous.v1.Rendezvous/")),
                "{line}"
            );
        }
    }
    let untraced = json_lines(&rendezvous, "job created")
        .into_iter()
        .find(|l| l["fields"]["job"] == "untraced")
        .expect("the untraced job was created");
    assert!(span_field(&untraced, "trace_id").is_empty(), "{untraced}");

    // Each agent: every epoch of the traced job logged in the job's span
    // (its trace id) and the attempt's (attempt 1, the agent's rank).
    let mut ranks = BTreeSet::new();
    for agent in [&a, &b] {
        let logs = agent.logs();
        let epochs: Vec<_> = json_lines(&logs, "epoch done")
            .into_iter()
            .filter(|l| l["fields"]["job"] == "traced")
            .collect();
        assert_eq!(epochs.len(), 2, "{logs}");
        for line in &epochs {
            assert_eq!(span_field(line, "trace_id"), [&id], "{line}");
            assert_eq!(
                span_field(line, "attempt"),
                [&serde_json::Value::from(1)],
                "{line}"
            );
            ranks.insert(span_field(line, "rank")[0].as_u64().expect("a rank"));
        }
        let untraced = json_lines(&logs, "epoch done")
            .into_iter()
            .find(|l| l["fields"]["job"] == "untraced")
            .expect("the untraced job trained");
        assert!(span_field(&untraced, "trace_id").is_empty(), "{untraced}");
    }
    assert_eq!(ranks, BTreeSet::from([0, 1]));
}
