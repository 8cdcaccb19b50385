//! Spark workers inside network namespaces, as nodes: `deploy/local/netns.sh`
//! makes two nodes on a bridge (shaped with `tc`), each with a real
//! `kindling-agent` on its node's IP and a standalone Spark worker (its
//! executor JVM and Python workers with it) started in its namespace by
//! `spark-connect.sh` (`KINDLING_SPARK_NETNS`); the master, the driver and a
//! real `kindling-rendezvous` listen on the bridge's address in the root
//! namespace. So task scheduling, results and the ring cross the veths and
//! the bridge, and "the agent on my node" is an address on the node's own
//! interface (`KINDLING_AGENT_ADDRESS=http://<node ip>:50051`), as a
//! DaemonSet's is on Kubernetes:
//!
//! - every task runs in its node's namespace (its outbound address is its
//!   node's IP) and sees its node's agent;
//! - executor push (node-local) over the rendezvous-made cluster trains every
//!   row exactly once per epoch, each partition committed by the agent on the
//!   node whose executor ran it;
//! - `transform` (`require_node_local`) predicts on the executors through
//!   their nodes' agents: one prediction per row, as `predict`, the model
//!   loaded once per agent, both agents serving;
//! - afterwards no process is left in a namespace and `netns.sh down` leaves
//!   nothing behind.
//!
//! Needs root and network namespaces: skipped with `skipped: <reason>` on
//! stderr otherwise, except under `CI=true`, where only "not root" is
//! accepted (`kindling_tests::netns::available`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use kindling::SparkSession;
use kindling::job::{ExecutorPush, Feed, TrainedModel, TrainingEvent, Transform};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_tests::events::assert_same_as_predict;
use kindling_tests::netns::{self, NodeCluster, Nodes, sent_bytes};
use kindling_tests::spark::{
    StandaloneSpark, TaskPlace, executor_python, features_df, rule_df, rule_job, where_tasks_ran,
};

const TOKEN: &str = "spark-netns-test-token";
const NODES: usize = 2;
/// Rows pushed and trained, over 4 partitions.
const ROWS: usize = 20_000;
const EPOCHS: u32 = 2;
/// Rows predicted by `transform`, over 8 partitions.
const SCORED: usize = 40_000;

/// Pids of the processes in node `node`'s namespace (`ip netns pids`).
fn pids_in(nodes: &Nodes, node: usize) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "pids", &format!("{}-node-{node}", nodes.prefix)])
        .output()
        .expect("ip netns pids");
    assert!(
        out.status.success(),
        "ip netns pids: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spark_workers_in_node_namespaces_push_to_and_predict_with_their_nodes_agents() {
    let Some(netem) = netns::available("Spark workers in network namespaces") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).expect("token file");
    // Executors carry per-job credentials, never the token.
    let key_file = dir.path().join("credential.key");
    std::fs::write(&key_file, "spark-netns-test-credential-key-0123456789").expect("key file");

    // Declared before the processes: dropped (brought down) after them.
    let nodes = Nodes::up(NODES, netem);
    eprintln!(
        "nodes: prefix {}, bridge {}, node IPs {:?}",
        nodes.prefix, nodes.gateway, nodes.ips
    );
    let key = key_file.to_str().expect("utf-8 path");
    let mut agents = NodeCluster::start(
        &nodes,
        dir.path(),
        &token_file,
        &[
            "--memory-budget",
            "256MiB",
            "--train-threads",
            "1",
            "--credential-key-file",
            key,
        ],
    )
    .await;
    let urls = agents.agent_urls.clone();
    let started = Instant::now();
    let cluster = StandaloneSpark::start(
        &[Some(urls[0].clone()), Some(urls[1].clone())],
        &[
            ("KINDLING_SPARK_NETNS", &nodes.prefix),
            // Credentials cross the bridge in plaintext (no TLS in this test).
            ("KINDLING_ALLOW_PLAINTEXT_TOKEN", "1"),
        ],
    );
    eprintln!(
        "standalone cluster in the namespaces up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let spark = SparkSession::connect(&cluster.remote()).await.expect("spark");

    // Every task runs in its node's namespace and sees its node's agent.
    let found = where_tasks_ran(&spark, 8, &nodes.gateway).await;
    assert_eq!(found.len(), 8, "{found:?}");
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for TaskPlace { node, agent, ip, .. } in &found {
        let i: usize = node
            .strip_prefix("node-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a task ran outside the workers (node `{node}`)"));
        assert_eq!(ip, nodes.ip(i), "{node}'s task left through its node's interface");
        assert_eq!(agent, &urls[i - 1], "{node}'s task sees its node's agent");
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(per_node.len(), NODES, "tasks ran on both nodes: {found:?}");

    // Executor push, node-local, to a cluster made by the rendezvous.
    let token = Token::new(TOKEN);
    let channel = ChannelConfig::default().with_plaintext_token(true);
    spark
        .conf_set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        .await
        .expect("conf");
    let df = rule_df(&spark, ROWS).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let job = rule_job()
        .local_mode(false)
        .rendezvous(&agents.rendezvous_url)
        .token(token.clone())
        .channel(channel.clone())
        .eval_fraction(0.0)
        .epochs(EPOCHS)
        .feed(Feed::ExecutorPush(
            ExecutorPush::new()
                .python_version(executor_python())
                .node_local(true),
        ))
        .events(tx)
        .build()
        .expect("job");
    let model = tokio::time::timeout(Duration::from_secs(300), job.fit(&df))
        .await
        .unwrap_or_else(|_| panic!("fit took over 300 s\n{}", agents.logs()))
        .unwrap_or_else(|e| panic!("fit failed: {e}\n{}", agents.logs()));
    let (mut shard_urls, mut fed) = (None, Vec::new());
    while let Ok(e) = rx.try_recv() {
        match e {
            TrainingEvent::Started { agents, .. } => shard_urls = Some(agents),
            TrainingEvent::Fed {
                feed,
                rows_per_shard,
                partitions,
                ..
            } => fed.push((feed, rows_per_shard, partitions)),
            _ => {}
        }
    }
    let shard_urls = shard_urls.expect("a Started event");
    assert_eq!(fed.len(), 1, "{fed:#?}");
    let (feed, rows_per_shard, partitions) = &fed[0];
    assert_eq!(*feed, "executor-push");
    assert_eq!(rows_per_shard.iter().sum::<u64>(), ROWS as u64, "{fed:#?}");
    let mut pushed_per_node: BTreeMap<&str, u64> = BTreeMap::new();
    for p in partitions {
        let i: usize = p
            .node
            .strip_prefix("node-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("partition {} ran outside the workers: {p:?}", p.partition));
        assert!(
            p.node_local,
            "partition {} went to its node's agent: {p:?}",
            p.partition
        );
        let shard = p.shard.expect("a shard");
        assert_eq!(
            shard_urls[shard],
            urls[i - 1],
            "partition {} held on {}: {p:?}",
            p.partition,
            p.node
        );
        *pushed_per_node.entry(&p.node).or_default() += p.rows;
    }
    eprintln!("rows pushed per node: {pushed_per_node:?}");
    for url in &urls {
        let client =
            kindling::feed::AgentClient::connect_with(url, Some(&token), &channel).expect("agent client");
        let s = client.job_status(model.job_id()).await.expect("job status");
        assert_eq!(
            s.rows_trained_per_epoch,
            vec![ROWS as u64; EPOCHS as usize],
            "{url}: {s:#?}"
        );
    }

    // transform on the executors, each task through its node's agent.
    let big = features_df(&spark, SCORED, 8, 41).await;
    let strict = Transform::new()
        .python_version(executor_python())
        .require_node_local(true);
    let scored = model.transform_with(&big, &strict).await.expect("transform");
    let sent_before: Vec<u64> = (1..=NODES).map(|n| sent_bytes(&nodes.qdisc(n))).collect();
    let batches = scored.collect().await.expect("collect the predictions");
    assert_eq!(assert_same_as_predict(&model, &batches), SCORED);
    for node in 1..=NODES {
        let sent = sent_bytes(&nodes.qdisc(node)) - sent_before[node - 1];
        eprintln!("node-{node} eth0 sent {sent} bytes while its predictions went to the driver");
        assert!(sent > 0, "node-{node}'s results crossed its interface");
    }
    let serving = model.serving_cluster().expect("a serving cluster").clone();
    let (mut streams, mut predicted) = (0, 0);
    for url in &urls {
        let list = TrainedModel::served_on(&serving, url)
            .await
            .expect("served models");
        assert_eq!(list.models.len(), 1, "{url}: {list:?}");
        let m = &list.models[0];
        assert_eq!(m.loads, 1, "{url}: loaded once: {list:?}");
        assert!(
            m.streams > 0 && m.rows > 0,
            "{url} predicted for its node's tasks: {list:?}"
        );
        streams += m.streams;
        predicted += m.rows;
    }
    assert_eq!(
        (streams, predicted),
        (8, SCORED as u64),
        "one stream per task, every row once"
    );

    // Nothing is left in the namespaces once Spark and the agents stop.
    drop(spark);
    drop(cluster);
    for node in 1..=NODES {
        let left = pids_in(&nodes, node);
        assert_eq!(
            left.len(),
            1,
            "only node-{node}'s agent is left in its namespace: {left:?}"
        );
    }
    agents.sigkill();
    for node in 1..=NODES {
        assert_eq!(pids_in(&nodes, node), Vec::<String>::new(), "node-{node}");
    }
    nodes.down().expect("netns.sh down");
    let left = nodes.leftovers();
    assert!(left.is_empty(), "netns.sh down left {left:?}");
}
