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
//! ones next to this test's (`cargo build -p kindling-agent -p kindling-rendezvous --bins`), or
//! `KINDLING_AGENT_BIN` / `KINDLING_RENDEZVOUS_BIN`.

use std::collections::BTreeSet;
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
use kindling_tests::netns::{self, DELAY, HEALTH_PORT, NodeCluster, Nodes, sent_bytes};

const TOKEN: &str = "netns-nodes-test-token";
const NODES: usize = 2;
const JOB_ID: &str = "netns-job";
const ROWS_PER_BATCH: usize = 1_000;
const BATCHES: u64 = 4;
const EPOCHS: u32 = 3;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_in_node_namespaces_train_over_the_bridge_known_by_their_node_ips() {
    let Some(netem) = netns::available("nodes in network namespaces") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).expect("token file");

    // Declared before the processes: dropped (brought down) after them.
    let nodes = Nodes::up(NODES, netem);
    eprintln!(
        "nodes: prefix {}, bridge {}, node IPs {:?}",
        nodes.prefix, nodes.gateway, nodes.ips
    );
    let mut cluster = NodeCluster::start(
        &nodes,
        dir.path(),
        &token_file,
        &["--memory-budget", "64MiB", "--train-threads", "1"],
    )
    .await;
    let rendezvous_url = cluster.rendezvous_url.clone();
    let expected = cluster.agent_urls.clone();

    // The rendezvous knows each agent by its node's address.
    let token = Token::new(TOKEN);
    let channel = ChannelConfig::default().with_plaintext_token(true);
    let rv = RendezvousClient::connect_with(&rendezvous_url, Some(&token), &channel)
        .await
        .expect("rendezvous");
    let mut registered = rv.list_agents().await.expect("list agents");
    registered.sort_by(|a, b| a.node_name.cmp(&b.node_name));
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
    .unwrap_or_else(|_| panic!("fit took over 300 s\n{}", cluster.logs()))
    .unwrap_or_else(|e| panic!("fit failed: {e}\n{}", cluster.logs()));
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
    cluster.sigkill();
    nodes.down().expect("netns.sh down");
    let left = nodes.leftovers();
    assert!(left.is_empty(), "netns.sh down left {left:?}");
    eprintln!("netns.sh down --prefix {}: nothing left", nodes.prefix);
}
