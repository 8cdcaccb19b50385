//! `kindling train` as a real process against a local cluster (agents and
//! rendezvous in this test's process; a real Spark Connect server):
//!
//! - SIGKILLed in the middle of its job it leaves nothing behind: its client
//!   lease lapses at the rendezvous, which cancels the job; every agent drops
//!   the job's rows, and the same agents then train a new job to the end.
//! - An agent's errors during the job appear in its output, with the job,
//!   the agent's rank and the attempt.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::spark_remote;
use kindling::feed::AgentClient;
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::rendezvous::{JobState, RendezvousClient};

const CLIENT_LEASE_SECS: u64 = 2;

/// `kindling train` on `rows` rows of a rule (y = x1 + x2 > 1) on the
/// cluster, with `extra` arguments.
fn train(
    cluster: &LocalCluster,
    dir: &Path,
    name: &str,
    rows: u64,
    epochs: u32,
    extra: &[&str],
) -> (Child, PathBuf) {
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
        .args(extra)
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
    let (mut client, _log) = train(&cluster, dir.path(), "killed", 400_000, 1000, &[]);
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
    let (mut next, log) = train(&cluster, dir.path(), "next", 4_000, 2, &[]);
    let exit = next.wait().expect("kindling train");
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let err = std::fs::read_to_string(dir.path().join("next.err")).unwrap_or_default();
    assert!(exit.success(), "{exit}\n{out}\n{err}");
    assert!(out.contains("trained 2 epochs"), "{out}");
    assert!(dir.path().join("next").exists());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_s_error_appears_in_the_client_s_output_with_job_rank_and_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path().join("cluster"));
    config.lease = Duration::from_millis(600);
    let cluster = LocalCluster::start(2, config).await.expect("cluster");
    // A learning rate no loss survives: every attempt fails on the agents
    // ("the loss became NaN"), and the job fails after its attempts.
    let (mut client, _) = train(
        &cluster,
        dir.path(),
        "diverging",
        4_000,
        2,
        &["--optimizer", "sgd:1e30"],
    );
    let exit = client.wait().expect("kindling train");
    assert!(!exit.success(), "a job that cannot train fails");
    let err = std::fs::read_to_string(dir.path().join("diverging.err")).unwrap_or_default();
    let line = err
        .lines()
        .find(|l| {
            l.contains("ERROR agent ")
                && l.contains(", attempt 1): attempt 1 failed: training failed: loss became")
        })
        .unwrap_or_else(|| panic!("no agent error in the client's output:\n{err}"));
    // `[kindling] ERROR agent <id> (job <job>, rank <r>, attempt 1): ...`
    let job = line
        .split("(job ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("the job in the line");
    assert!(job.starts_with("kindling-"), "{line}");
    assert!(
        line.contains(", rank 0, attempt 1)") || line.contains(", rank 1, attempt 1)"),
        "{line}"
    );
    cluster.shutdown().await;
}
