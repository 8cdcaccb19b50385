//! Fixtures for agent tests: a local cluster on 127.0.0.1, synthetic data with
//! a known rule, and helpers that drive agents through their Flight contract.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Float32Array, Float64Array, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use kindling::feed::{AgentClient, ShardReceipt};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_agent::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::action::{Action, AgentJobStatus, EndOfData, EndOfDataResponse, JobRef, StartJob};
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::spec::JobSpec;

/// A local cluster in a temp dir, with short leases so failures show quickly.
pub async fn cluster(agents: usize) -> (LocalCluster, tempfile::TempDir) {
    start_cluster(agents, None).await
}

/// Like [`cluster`] with a per-agent cache budget.
pub async fn cluster_with_budget(agents: usize, budget: u64) -> (LocalCluster, tempfile::TempDir) {
    start_cluster(agents, Some(budget)).await
}

async fn start_cluster(agents: usize, budget: Option<u64>) -> (LocalCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path());
    config.lease = Duration::from_millis(600);
    config.gang_timeout = Duration::from_secs(30);
    config.collective_timeout = Duration::from_secs(20);
    if let Some(budget) = budget {
        config.memory_budget = budget;
    }
    (
        LocalCluster::start(agents, config).await.expect("local cluster"),
        dir,
    )
}

/// Schema of [`rule_batch`].
pub fn rule_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Float64, true),
        Field::new("x2", DataType::Float32, true),
        Field::new("y", DataType::Int32, true),
    ]))
}

/// `rows` points with a linear rule: `y = 1` iff `x1 + 2·x2 > 0.1`.
/// Deterministic in `seed`.
pub fn rule_batch(rows: usize, seed: u64) -> RecordBatch {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    };
    let mut x1 = Vec::with_capacity(rows);
    let mut x2 = Vec::with_capacity(rows);
    let mut y = Vec::with_capacity(rows);
    for _ in 0..rows {
        let a = next();
        let b = next() as f32;
        x1.push(a);
        x2.push(b);
        y.push(i32::from(a + 2.0 * b as f64 > 0.1));
    }
    RecordBatch::try_new(
        rule_schema(),
        vec![
            Arc::new(Float64Array::from(x1)),
            Arc::new(Float32Array::from(x2)),
            Arc::new(Int32Array::from(y)),
        ],
    )
    .expect("batch")
}

/// A Flight client for agent `index`.
pub fn agent_client(cluster: &LocalCluster, index: usize) -> AgentClient {
    let url = cluster.agent_url(index).expect("agent running");
    AgentClient::connect(&url, cluster.token()).expect("client")
}

/// Creates `job_id` at the rendezvous and starts it on the given agents.
pub async fn start_job(cluster: &LocalCluster, job_id: &str, spec: &JobSpec, agents: &[usize]) {
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rendezvous");
    rv.create_job(&JobConfig::new(job_id, spec.num_slots).with_max_attempts(4))
        .await
        .expect("create job");
    for &i in agents {
        start_on(cluster, i, job_id, spec).await;
    }
}

/// Starts `job_id` on agent `index` (the job exists at the rendezvous).
pub async fn start_on(cluster: &LocalCluster, index: usize, job_id: &str, spec: &JobSpec) {
    let start = Action::StartJob(StartJob {
        job_id: job_id.into(),
        spec: spec.clone(),
        rendezvous: cluster.rendezvous_url(),
    });
    let _: serde_json::Value = agent_client(cluster, index)
        .action(&start)
        .await
        .expect("start_job");
}

/// Sends `batches` as one producer's stream and commits them.
pub async fn put(
    client: &AgentClient,
    job_id: &str,
    split: Split,
    producer: &str,
    batches: &[RecordBatch],
) -> Result<ShardReceipt, kindling::feed::FeedError> {
    let schema = batches.first().map(|b| b.schema()).unwrap_or_else(rule_schema);
    let mut w = client
        .put(&DataPath::data(job_id, split), producer, &schema, 8 << 20)
        .await?;
    for b in batches {
        w.write(b).await?;
    }
    w.finish().await
}

/// Says the split is complete on one agent.
pub async fn end_of_data(
    client: &AgentClient,
    job_id: &str,
    split: Split,
    expected: Option<u64>,
) -> EndOfDataResponse {
    client
        .action(&Action::EndOfData(EndOfData {
            job_id: job_id.into(),
            split,
            expected_rows: expected,
        }))
        .await
        .expect("end_of_data")
}

/// The agent's status of a job.
pub async fn status(client: &AgentClient, job_id: &str) -> AgentJobStatus {
    client
        .action(&Action::JobStatus(JobRef {
            job_id: job_id.into(),
        }))
        .await
        .expect("job_status")
}

/// Polls the job's status until `pred` holds; panics after `limit`.
pub async fn wait_until(
    client: &AgentClient,
    job_id: &str,
    limit: Duration,
    pred: impl Fn(&AgentJobStatus) -> bool,
) -> AgentJobStatus {
    let deadline = Instant::now() + limit;
    loop {
        let s = status(client, job_id).await;
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "condition not reached within {limit:?}; last status: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits for a terminal state.
pub async fn wait_done(client: &AgentClient, job_id: &str) -> AgentJobStatus {
    wait_until(client, job_id, Duration::from_secs(300), |s| {
        s.state.is_terminal()
    })
    .await
}
