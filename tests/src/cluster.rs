//! Fixtures for agent tests: a local cluster on 127.0.0.1, synthetic data with
//! a known rule, and helpers that drive agents through their Flight contract.

use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use kindling::feed::{AgentClient, ShardReceipt};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_fixtures::pki::{Files, TestCa};
use kindling_schemas::action::{AgentJobStatus, EndOfDataResponse};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::JobSpec;
use kindling_schemas::tls::{Tls, TlsFiles};

/// A local cluster in a temp dir, with short leases so failures show quickly.
pub async fn cluster(agents: usize) -> (LocalCluster, tempfile::TempDir) {
    start_cluster(agents, None).await
}

/// Like [`cluster`] with a per-agent cache budget.
pub async fn cluster_with_budget(agents: usize, budget: u64) -> (LocalCluster, tempfile::TempDir) {
    start_cluster(agents, Some(budget)).await
}

/// A [`cluster`] speaking mutual TLS only: the rendezvous and the agents
/// serve a certificate for `127.0.0.1` and `localhost` and accept only client
/// certificates of the test CA. Returns the client's files (certificate,
/// key, CA) and its channel settings.
pub async fn tls_cluster(agents: usize) -> (LocalCluster, tempfile::TempDir, Files, ChannelConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("kindling test CA");
    let server = ca
        .issue("kindling-agent", &["127.0.0.1", "localhost"])
        .write(&dir.path().join("tls/server"), ca.pem());
    let client = ca
        .issue("kindling-client", &["kindling-client"])
        .write(&dir.path().join("tls/client"), ca.pem());
    let tls = |files: &Files, client_auth| {
        Tls::new(TlsFiles {
            cert: Some(files.cert.clone()),
            key: Some(files.key.clone()),
            ca: Some(files.ca.clone()),
            client_auth,
            server_name: None,
        })
        .expect("TLS files")
    };
    let mut config = short_leases(LocalClusterConfig::new(dir.path()));
    config.tls = Some(tls(&server, true));
    let cluster = LocalCluster::start(agents, config).await.expect("local cluster");
    let channel = ChannelConfig::default().with_tls(Some(tls(&client, false)));
    (cluster, dir, client, channel)
}

fn short_leases(mut config: LocalClusterConfig) -> LocalClusterConfig {
    config.lease = Duration::from_millis(600);
    config.gang_timeout = Duration::from_secs(30);
    config.collective_timeout = Duration::from_secs(20);
    config
}

/// Like [`cluster`] with settings of the test's own.
pub async fn cluster_with(
    agents: usize,
    set: impl FnOnce(&mut LocalClusterConfig),
) -> (LocalCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = short_leases(LocalClusterConfig::new(dir.path()));
    set(&mut config);
    (
        LocalCluster::start(agents, config).await.expect("local cluster"),
        dir,
    )
}

async fn start_cluster(agents: usize, budget: Option<u64>) -> (LocalCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = short_leases(LocalClusterConfig::new(dir.path()));
    if let Some(budget) = budget {
        config.memory_budget = budget;
    }
    (
        LocalCluster::start(agents, config).await.expect("local cluster"),
        dir,
    )
}

pub use kindling_fixtures::{rule_batch, rule_schema};

/// A Flight client for agent `index`.
pub fn agent_client(cluster: &LocalCluster, index: usize) -> AgentClient {
    let url = cluster.agent_url(index).expect("agent running");
    AgentClient::connect_with(&url, cluster.token(), &cluster.channel()).expect("client")
}

/// Creates `job_id` at the rendezvous and starts it on the given agents.
pub async fn start_job(cluster: &LocalCluster, job_id: &str, spec: &JobSpec, agents: &[usize]) {
    let rv = RendezvousClient::connect_with(cluster.rendezvous_url(), cluster.token(), &cluster.channel())
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
    agent_client(cluster, index)
        .start_job(job_id, spec, &cluster.rendezvous_url())
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
        .end_of_data(job_id, split, expected)
        .await
        .expect("end_of_data")
}

/// The agent's status of a job.
pub async fn status(client: &AgentClient, job_id: &str) -> AgentJobStatus {
    client.job_status(job_id).await.expect("job_status")
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

/// Polls the job's status until `pred` holds, `what` naming the wait;
/// a job the agent does not know yet (or cannot answer for) is polled
/// again; panics after `limit`.
pub async fn wait_for_job(
    client: &AgentClient,
    job_id: &str,
    what: &str,
    limit: Duration,
    pred: impl Fn(&AgentJobStatus) -> bool,
) -> AgentJobStatus {
    let deadline = Instant::now() + limit;
    loop {
        let last = match client.job_status(job_id).await {
            Ok(s) if pred(&s) => return s,
            Ok(s) => format!("{s:#?}"),
            Err(e) => format!("no status: {e}"),
        };
        assert!(
            Instant::now() < deadline,
            "{job_id}: {what} not seen within {limit:?}; last status: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a terminal state.
pub async fn wait_done(client: &AgentClient, job_id: &str) -> AgentJobStatus {
    wait_until(client, job_id, Duration::from_secs(300), |s| {
        s.state.is_terminal()
    })
    .await
}

/// The model table of a job, as (name, values) pairs, fetched with DoGet.
pub async fn weights(client: &AgentClient, job_id: &str) -> Vec<(String, Vec<f32>)> {
    let ticket = DataPath::Model {
        job_id: job_id.into(),
    }
    .ticket();
    let stream = client.flight().do_get(ticket).await.expect("do_get").into_inner();
    kindling_fixtures::model_weights(stream).await
}

/// The weights of `model` by name, each value's bits: two models are the
/// same when these are equal.
pub fn weight_bits(model: &kindling::job::TrainedModel) -> Vec<(String, Vec<u32>)> {
    use arrow::array::AsArray;
    use arrow::datatypes::Float32Type;
    let table = model.weights().expect("weights");
    let names = table.column(0).as_string::<i32>();
    let values = table.column(2).as_list::<i32>();
    (0..table.num_rows())
        .map(|i| {
            let v = values.value(i);
            let bits = v
                .as_primitive::<Float32Type>()
                .values()
                .iter()
                .map(|x| x.to_bits());
            (names.value(i).to_owned(), bits.collect())
        })
        .collect()
}

/// Asserts that the agent at `url` (its status `s`) resumed inside the
/// epoch of a kill at `(epoch, step)`, from a checkpoint less than `every`
/// steps before it (the survivor may have taken one step more); returns the
/// steps it trains again.
pub fn resumed_near(url: &str, s: &AgentJobStatus, (epoch, step): (u32, u64), every: u64) -> u64 {
    let from = s
        .resumed_from_epoch
        .unwrap_or_else(|| panic!("{url} resumed: {s:#?}"));
    let at = s
        .resumed_from_step
        .unwrap_or_else(|| panic!("{url} resumed inside an epoch: {s:#?}"));
    assert_eq!(from + 1, epoch, "{url}: resumed inside the epoch of the kill");
    assert!(
        at.is_multiple_of(every) && at <= step + 1 && step < at + every,
        "{url}: resumed at step {at} for a kill at step {step}"
    );
    step.saturating_sub(at)
}

/// Kills agent `victim` of running job `job_id` once `client`'s status
/// says `reached`, waits for the survivor to see the attempt fail, then
/// does the client's part of a recovery: a replacement agent gets the job
/// and the lost `shard` (`rows` rows, ended). Returns the replacement.
pub async fn kill_and_replace(
    cluster: &LocalCluster,
    client: &AgentClient,
    job_id: &str,
    spec: &JobSpec,
    victim: usize,
    shard: &RecordBatch,
    reached: impl Fn(&AgentJobStatus) -> bool,
) -> usize {
    wait_until(client, job_id, Duration::from_secs(120), reached).await;
    cluster.kill_agent(victim);
    // The survivor learns of the failure from the rendezvous and waits for the next gang.
    wait_until(client, job_id, Duration::from_secs(30), |s| {
        matches!(
            s.state,
            kindling_schemas::action::AgentJobState::Recovering
                | kindling_schemas::action::AgentJobState::Ganging
        )
    })
    .await;
    let replacement = cluster.add_agent().await.expect("replacement");
    start_on(cluster, replacement, job_id, spec).await;
    let c = agent_client(cluster, replacement);
    put(&c, job_id, Split::Train, "s", std::slice::from_ref(shard))
        .await
        .expect("re-send");
    end_of_data(&c, job_id, Split::Train, Some(shard.num_rows() as u64)).await;
    replacement
}

/// A 1-slot linear classifier of [`rule_batch`] rows (`x1`, `x2` → `y`),
/// batches of 64, `epochs` passes.
pub fn linear_spec(epochs: u32) -> JobSpec {
    use kindling_schemas::spec::{ModelSpec, Task};
    JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .features(["x1", "x2"])
        .label("y")
        .num_slots(1)
        .batch_size(64)
        .epochs(epochs)
        .build()
        .expect("spec")
}
