//! A `kindling train` process SIGKILLed in the middle of its job leaves
//! nothing behind: its client lease lapses at the rendezvous, which cancels
//! the job; every agent drops the job's rows, and the same agents then train
//! a new job to the end. (The `kindling` binary as a real process; agents and
//! rendezvous in this test's process; a real Spark Connect server.)

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kindling::feed::AgentClient;
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::rendezvous::{JobState, RendezvousClient};

const CLIENT_LEASE_SECS: u64 = 2;

/// The local Spark Connect server (`deploy/local/spark-connect.sh start` is
/// idempotent and returns once a query answers; a server already listening
/// is reused as is).
fn spark_remote() -> String {
    let port = std::env::var("KINDLING_SPARK_PORT").unwrap_or_else(|_| "15002".into());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/spark-connect.sh");
        let status = Command::new("bash")
            .arg(&script)
            .arg("start")
            .env("KINDLING_SPARK_PORT", &port)
            .status()
            .expect("spark-connect.sh");
        assert!(status.success(), "spark-connect.sh start: {status}");
    }
    format!("sc://{addr}")
}

/// `kindling train` on `rows` rows of a rule (y = x1 + x2 > 1) on the cluster.
fn train(cluster: &LocalCluster, dir: &Path, name: &str, rows: u64, epochs: u32) -> (Child, PathBuf) {
    let token_file = dir.join("token");
    std::fs::write(&token_file, cluster.token().expect("token").expose()).expect("token file");
    let log = dir.join(format!("{name}.log"));
    let sql = format!(
        "SELECT x1, x2, CAST(x1 + x2 > 1.0 AS INT) AS y \
         FROM (SELECT rand(1) AS x1, rand(2) AS x2 FROM range({rows}))"
    );
    let child = Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(["train", "--remote", &spark_remote(), "--sql", &sql])
        .args(["--features", "x1,x2", "--label", "y", "--model", "mlp:16"])
        .args([
            "--slots",
            "2",
            "--epochs",
            &epochs.to_string(),
            "--batch-size",
            "64",
        ])
        .args(["--eval-fraction", "0"])
        .arg("--rendezvous")
        .arg(cluster.rendezvous_url())
        .arg("--token-file")
        .arg(&token_file)
        .args(["--client-lease-secs", &CLIENT_LEASE_SECS.to_string()])
        .arg("--output")
        .arg(dir.join(name))
        .stdout(Stdio::from(std::fs::File::create(&log).expect("log")))
        .stderr(Stdio::from(
            std::fs::File::create(dir.join(format!("{name}.err"))).expect("log"),
        ))
        .spawn()
        .expect("kindling train");
    (child, log)
}

async fn wait_for<T>(what: &str, within: Duration, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_client_s_job_is_cancelled_within_its_lease_and_its_agents_train_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path().join("cluster"));
    config.lease = Duration::from_millis(600);
    let cluster = LocalCluster::start(2, config).await.expect("cluster");
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rendezvous");
    let agents: Vec<AgentClient> = cluster
        .agent_urls()
        .iter()
        .map(|url| AgentClient::connect(url, cluster.token()).expect("agent"))
        .collect();

    // Far more epochs than can train before the kill: the job is never done.
    let (mut client, _log) = train(&cluster, dir.path(), "killed", 400_000, 1000);
    let job_id = wait_for("the job to be created", Duration::from_secs(120), async || {
        rv.list_jobs().await.ok()?.into_iter().next().map(|j| j.job_id)
    })
    .await;
    // Rows are arriving on an agent: the client is in the middle of its job.
    wait_for("rows to arrive", Duration::from_secs(120), async || {
        for a in &agents {
            if a.job_status(&job_id).await.ok()?.rows_train > 0 {
                return Some(());
            }
        }
        None
    })
    .await;
    client.kill().expect("SIGKILL the client");
    client.wait().expect("reaped");
    let killed = Instant::now();

    // Within the lease (plus the reaper's tick), the rendezvous cancels the
    // job and every agent drops it.
    let within = Duration::from_secs(CLIENT_LEASE_SECS + 10);
    let status = wait_for("the rendezvous to cancel the job", within, async || {
        let s = rv.status(&job_id).await.ok()?;
        (s.state == JobState::Cancelled).then_some(s)
    })
    .await;
    assert_eq!(
        status.cancel_reason.as_deref(),
        Some("the client's lease lapsed: no renewal within 2s"),
        "{status:?}"
    );
    for (i, a) in agents.iter().enumerate() {
        let s = wait_for("the agent to cancel the job", within, async || {
            let s = a.job_status(&job_id).await.ok()?;
            (s.state == AgentJobState::Cancelled).then_some(s)
        })
        .await;
        let error = s.error.clone().unwrap_or_default();
        assert!(error.contains("client's lease lapsed"), "agent {i}: {s:?}");
        assert_eq!(
            (s.cache_bytes_memory, s.cache_bytes_disk),
            (0, 0),
            "agent {i}: {s:?}"
        );
    }
    eprintln!("cancelled everywhere {:?} after the kill", killed.elapsed());

    // The same two agents train a new job to the end.
    let (mut next, log) = train(&cluster, dir.path(), "next", 4_000, 2);
    let exit = next.wait().expect("kindling train");
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let err = std::fs::read_to_string(dir.path().join("next.err")).unwrap_or_default();
    assert!(exit.success(), "{exit}\n{out}\n{err}");
    assert!(out.contains("trained 2 epochs"), "{out}");
    assert!(dir.path().join("next").exists());
    cluster.shutdown().await;
}
