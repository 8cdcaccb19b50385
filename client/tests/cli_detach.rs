//! `kindling train --detach`, `kindling jobs`, `kindling wait` and
//! `kindling fetch` as real processes against a local cluster (agents and
//! rendezvous in this test's process; a real Spark Connect server):
//!
//! - A detached job outlives its client: `train --detach` exits once the
//!   rows are fed; after its client lease would have lapsed the job trains
//!   on, every epoch over every row once; `kindling wait` (another process)
//!   sees it end and `kindling fetch` saves the model the agents trained
//!   (it predicts as they do).
//! - `train --detach` SIGKILLed while it is still feeding cancels its job
//!   within the lease, as a client that is not detached does.
//! - A job whose rows do not fit an agent's disk watermark, where every
//!   agent keeps them before the job is detached, fails `train --detach`
//!   naming the watermark; the job is cancelled, never detached, and no
//!   agent keeps a copy.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, Float64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use common::spark_remote;
use futures::TryStreamExt;
use kindling::feed::AgentClient;
use kindling::job::TrainedModel;
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::rendezvous::{JobConfig, JobState, RendezvousClient};

const LEASE_SECS: u64 = 2;

/// `kindling ARGS` with the cluster's flags, its stdout and stderr in
/// `dir/<name>.out` and `.err`.
fn kindling(cluster: &LocalCluster, dir: &Path, name: &str, args: &[&str]) -> Child {
    let token_file = dir.join("token");
    std::fs::write(&token_file, cluster.token().expect("token").expose()).expect("token file");
    let file = |ext: &str| std::fs::File::create(dir.join(format!("{name}.{ext}"))).expect("log");
    Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(args)
        .arg("--rendezvous")
        .arg(cluster.rendezvous_url())
        .arg("--token-file")
        .arg(&token_file)
        .stdout(Stdio::from(file("out")))
        .stderr(Stdio::from(file("err")))
        .spawn()
        .expect("kindling")
}

/// Waits for `child` and returns its stdout; fails with both outputs
/// unless it succeeded.
fn finished(mut child: Child, dir: &Path, name: &str) -> String {
    let exit = child.wait().expect("kindling");
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{name}.{ext}"))).unwrap_or_default();
    assert!(
        exit.success(),
        "kindling {name}: {exit}\n{}\n{}",
        read("out"),
        read("err")
    );
    read("out")
}

/// `kindling train --detach` of job `job_id` on `rows` rows of a rule
/// (y = x1 + x2 > 1), for `epochs` epochs.
fn train_detached(cluster: &LocalCluster, dir: &Path, job_id: &str, rows: u64, epochs: u32) -> Child {
    let args = train_args(job_id, rows, epochs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kindling(cluster, dir, job_id, &args)
}

/// [`train_detached`]'s arguments.
fn train_args(job_id: &str, rows: u64, epochs: u32) -> Vec<String> {
    let sql = format!(
        "SELECT x1, x2, CAST(x1 + x2 > 1.0 AS INT) AS y \
         FROM (SELECT rand(1) AS x1, rand(2) AS x2 FROM range({rows}))"
    );
    let (epochs, lease) = (epochs.to_string(), LEASE_SECS.to_string());
    [
        "train",
        "--remote",
        &spark_remote(),
        "--sql",
        &sql,
        "--features",
        "x1,x2",
        "--label",
        "y",
        "--model",
        "mlp:16",
        "--slots",
        "2",
        "--epochs",
        &epochs,
        "--batch-size",
        "64",
        "--eval-fraction",
        "0",
        "--client-lease-secs",
        &lease,
        "--job-id",
        job_id,
        "--detach",
    ]
    .map(str::to_owned)
    .to_vec()
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

async fn cluster(dir: &Path) -> (LocalCluster, RendezvousClient, Vec<AgentClient>) {
    cluster_with(LocalClusterConfig::new(dir.join("cluster"))).await
}

async fn cluster_with(mut config: LocalClusterConfig) -> (LocalCluster, RendezvousClient, Vec<AgentClient>) {
    config.lease = Duration::from_millis(600);
    let cluster = LocalCluster::start(2, config).await.expect("cluster");
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rendezvous");
    let agents = cluster
        .agent_urls()
        .iter()
        .map(|url| AgentClient::connect(url, cluster.token()).expect("agent"))
        .collect();
    (cluster, rv, agents)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_detached_job_outlives_its_client_and_is_waited_for_and_fetched_from_other_processes() {
    const ROWS: u64 = 20_000;
    const EPOCHS: u32 = 100;
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, rv, agents) = cluster(dir.path()).await;
    let job = "detached-1";

    // The client returns once every row is fed, the job's id on stdout.
    let out = finished(
        train_detached(&cluster, dir.path(), job, ROWS, EPOCHS),
        dir.path(),
        job,
    );
    assert_eq!(out.trim(), job);

    // The client is gone. A job created now with the same lease, never
    // renewed, is cancelled once such a lease lapses: by then the client's,
    // renewed last before it exited, would have lapsed too.
    let clock = JobConfig::new("lease-clock", 1).with_client_lease(Duration::from_secs(LEASE_SECS));
    rv.create_job(&clock).await.expect("the clock job");
    wait_for(
        "the clock job's lease to lapse",
        Duration::from_secs(30),
        async || (rv.status("lease-clock").await.ok()?.state == JobState::Cancelled).then_some(()),
    )
    .await;
    let status = rv.status(job).await.expect("status");
    assert!(status.detached, "{status:?}");
    assert!(
        matches!(status.state, JobState::Ganging | JobState::Running),
        "the job must still be training past its lease for this test to mean anything \
         (give it more epochs): {status:?}"
    );

    // `kindling jobs` lists it, detached.
    let jobs = finished(
        kindling(&cluster, dir.path(), "jobs", &["jobs"]),
        dir.path(),
        "jobs",
    );
    let line = jobs
        .lines()
        .find(|l| l.contains(job))
        .unwrap_or_else(|| panic!("{jobs}"));
    assert!(line.contains("detached"), "{jobs}");

    // Another process follows it to its end.
    let waited = finished(
        kindling(&cluster, dir.path(), "wait", &["wait", job]),
        dir.path(),
        "wait",
    );
    assert!(
        waited.contains(&format!("job {job} succeeded: {EPOCHS} epochs")),
        "{waited}"
    );

    // Exactly once per epoch: every epoch trained every row once.
    for (i, a) in agents.iter().enumerate() {
        let s = a.job_status(job).await.expect("agent status");
        assert_eq!(
            s.rows_trained_per_epoch,
            vec![ROWS; EPOCHS as usize],
            "agent {i}: {s:?}"
        );
    }

    // A third fetches the model: the job's, predicting as its agents do.
    let saved = dir.path().join("model");
    let fetch_args = ["fetch", job, "-o", saved.to_str().expect("path")];
    let fetched = finished(
        kindling(&cluster, dir.path(), "fetch", &fetch_args),
        dir.path(),
        "fetch",
    );
    assert!(fetched.contains(&format!("trained {EPOCHS} epochs")), "{fetched}");
    let model = TrainedModel::load(&saved).expect("the fetched model");
    assert_eq!((model.job_id(), model.history().len()), (job, EPOCHS as usize));
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Float64, false),
        Field::new("x2", DataType::Float64, false),
    ]));
    let xs: Vec<f64> = (0..64).map(|i| f64::from(i) / 64.0).collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            std::sync::Arc::new(Float64Array::from(xs.clone())),
            std::sync::Arc::new(Float64Array::from(xs.iter().rev().copied().collect::<Vec<_>>())),
        ],
    )
    .expect("batch");
    let here = model.predict_batch(&batch).expect("predict here");
    let there: Vec<RecordBatch> = agents[0]
        .predict(job, schema, futures::stream::iter([batch]))
        .await
        .expect("predict on the agent")
        .try_collect()
        .await
        .expect("predictions");
    let column = |b: &RecordBatch| b.column_by_name("prediction").expect("prediction").to_data();
    assert_eq!(there.len(), 1);
    assert_eq!(column(&here), column(&there[0]));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_detached_client_killed_while_feeding_still_cancels_its_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, rv, agents) = cluster(dir.path()).await;
    let job = "killed-feeding";
    // Far more rows than are fed before the kill.
    let mut client = train_detached(&cluster, dir.path(), job, 2_000_000, 1000);
    wait_for("rows to arrive", Duration::from_secs(180), async || {
        for a in &agents {
            if a.job_status(job).await.ok()?.rows_train > 0 {
                return Some(());
            }
        }
        None
    })
    .await;
    client.kill().expect("SIGKILL the client");
    client.wait().expect("reaped");
    let status = wait_for(
        "the rendezvous to cancel the job",
        Duration::from_secs(LEASE_SECS + 10),
        async || {
            let s = rv.status(job).await.ok()?;
            assert!(
                !s.detached,
                "the feed ended before the kill: feed more rows ({s:?})"
            );
            (s.state == JobState::Cancelled).then_some(s)
        },
    )
    .await;
    assert_eq!(
        status.cancel_reason.as_deref(),
        Some("the client's lease lapsed: no renewal within 2s"),
        "{status:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_detached_job_whose_rows_do_not_fit_the_agents_disks_is_refused_and_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path().join("cluster"));
    // Room for the agents' spill files, none for a copy of 4,000 rows.
    config.staging.disk_watermark = Some(4_096);
    let (cluster, rv, _agents) = cluster_with(config).await;
    let job = "no-room-to-keep";
    let exit = train_detached(&cluster, dir.path(), job, 4_000, 50)
        .wait()
        .expect("kindling");
    let err = std::fs::read_to_string(dir.path().join(format!("{job}.err"))).expect("stderr");
    assert!(!exit.success(), "{err}");
    assert!(
        err.contains(&format!("keeping job `{job}`'s rows"))
            && err.contains("disk watermark")
            && err.contains("the job is not detached"),
        "{err}"
    );
    let status = wait_for(
        "the job to be cancelled",
        Duration::from_secs(LEASE_SECS + 10),
        async || {
            let s = rv.status(job).await.ok()?;
            assert!(!s.detached, "{s:?}");
            (s.state == JobState::Cancelled).then_some(s)
        },
    )
    .await;
    assert!(!status.detached);
    let kept: Vec<_> = walk(&dir.path().join("cluster"))
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "kept") && p.is_file())
        .collect();
    assert!(kept.is_empty(), "no agent keeps a copy: {kept:?}");
    cluster.shutdown().await;
}

/// Every path under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}
