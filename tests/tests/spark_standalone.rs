//! Kindling on a real standalone Spark cluster (`StandaloneSpark`: a master,
//! two workers, one executor JVM per worker, the Spark Connect server
//! attached), each worker's node with its own agent: tasks run in separate
//! executor JVMs that carry their node's environment (`KINDLING_NODE_NAME`,
//! `KINDLING_AGENT_ADDRESS`); executor push survives a task that fails
//! mid-stream and an executor JVM SIGKILLed mid-push with every row trained
//! exactly once per epoch; `transform` predicts 100,000 rows on the executors
//! like `predict` does, with none through the client. One cluster for the
//! whole scenario: it takes over a minute to start.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use kindling::SparkSession;
use kindling_tests::spark::{StandaloneSpark, executor_python, features_df, rule_df_in, where_tasks_ran};

/// The process ids from `pid` up to the root: `pid`, its parent, ….
fn ancestors(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut pid = pid;
    while pid > 1 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            break;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let (comm, rest) = stat
            .split_once(" (")
            .and_then(|(_, r)| r.rsplit_once(") "))
            .expect("a /proc stat line");
        out.push((pid, comm.to_owned()));
        pid = rest.split(' ').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn push_survives_task_failures_and_executor_loss_and_transform_predicts_on_the_executors() {
    use kindling::job::{ExecutorPush, Feed};
    use kindling_tests::events::{assert_same_as_predict, fed_events};
    use kindling_tests::spark::{rule_df, rule_job};

    let _one_cluster_at_a_time = ONE_CLUSTER.lock().await;
    let (agents, _dir) = kindling_tests::cluster::cluster(2).await;
    let urls = agents.agent_urls();
    let started = Instant::now();
    let cluster = StandaloneSpark::start(&[Some(urls[0].clone()), Some(urls[1].clone())], &[]);
    eprintln!(
        "standalone cluster up in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let spark = SparkSession::connect(&cluster.remote()).await.expect("spark");

    // Each task runs in its node's executor and sees its node's agent.
    let found = where_tasks_ran(&spark, 8, "127.0.0.1").await;
    assert_eq!(found.len(), 8, "one row per partition: {found:#?}");
    let mut per_node: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for row in &found {
        match row.node.as_str() {
            "node-1" => assert_eq!(row.agent, urls[0], "{row:?}"),
            "node-2" => assert_eq!(row.agent, urls[1], "{row:?}"),
            other => panic!("a task ran outside the workers' executors (node `{other}`): {row:?}"),
        }
        per_node.entry(&row.node).or_default().push(row.pid);
    }
    assert_eq!(
        per_node.keys().copied().collect::<Vec<_>>(),
        ["node-1", "node-2"],
        "{found:#?}"
    );
    let executors = cluster.executors();
    assert_eq!(
        executors
            .iter()
            .map(|(_, node)| node.as_str())
            .collect::<Vec<_>>(),
        ["node-1", "node-2"],
        "{executors:?}"
    );

    // Executor push (node-local) with two faults in one job: partition 2's
    // first attempt fails after 1 batch; partition 1's first attempt stalls
    // after 2 batches and its executor JVM is SIGKILLed mid-stream.
    const ROWS: usize = 40_000;
    spark
        .conf_set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        .await
        .expect("conf");
    let df = rule_df(&spark, ROWS).await;
    let marker = _dir.path().join("stalled.pid");
    let push = ExecutorPush::new()
        .python_version(executor_python())
        .fail_first_attempt_for_test(2, 1)
        .stall_first_attempt_for_test(1, 2, marker.clone());
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let job = rule_job()
        .eval_fraction(0.0)
        .epochs(3)
        .feed(Feed::ExecutorPush(push))
        .events(tx)
        .build()
        .expect("job");
    let model = {
        let fit = job.fit_on(&agents, &df);
        tokio::pin!(fit);
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut killed = None;
        loop {
            tokio::select! {
                done = &mut fit => break done.expect("fit with a failed task and a lost executor"),
                _ = tokio::time::sleep(Duration::from_millis(100)), if killed.is_none() => {
                    assert!(Instant::now() < deadline, "partition 1 never stalled");
                    let Ok(pid) = std::fs::read_to_string(&marker) else { continue };
                    let chain = ancestors(pid.trim().parse().expect("a pid"));
                    let (jvm, _) = chain
                        .iter()
                        .find(|(_, comm)| comm == "java")
                        .unwrap_or_else(|| panic!("no executor JVM above the Python worker: {chain:?}"))
                        .clone();
                    assert!(executors.iter().any(|(p, _)| *p == jvm), "{jvm} is not an executor: {executors:?}");
                    let status = Command::new("kill").args(["-9", &jvm.to_string()]).status().expect("kill");
                    assert!(status.success());
                    eprintln!("SIGKILLed executor JVM {jvm} in the middle of partition 1's push");
                    killed = Some(jvm);
                }
            }
        }
    };
    let fed = fed_events(&mut rx);
    assert_eq!(fed.len(), 1, "{fed:#?}");
    let train = &fed[0];
    assert_eq!(train.feed, "executor-push");
    assert_eq!(
        train.rows_per_shard.iter().sum::<u64>(),
        ROWS as u64,
        "{train:#?}"
    );
    let mut partitions: Vec<u32> = train.partitions.iter().map(|p| p.partition).collect();
    partitions.sort();
    assert_eq!(
        partitions,
        [0, 1, 2, 3],
        "each partition summarised once: {train:#?}"
    );
    for p in &train.partitions {
        assert_eq!(p.committed_rows, p.rows, "{p:?}");
        if p.partition == 1 || p.partition == 2 {
            assert!(p.attempt >= 1, "partition {} was retried: {p:?}", p.partition);
        }
    }
    // Every epoch trained every row exactly once, over both agents (the
    // count is the gang's, all-reduced).
    for i in 0..2 {
        let s = kindling_tests::cluster::status(
            &kindling_tests::cluster::agent_client(&agents, i),
            model.job_id(),
        )
        .await;
        assert_eq!(s.rows_trained_per_epoch, vec![ROWS as u64; 3], "agent {i}");
    }
    assert_eq!(model.history().len(), 3);

    // transform: 100,000 rows over 8 partitions, predicted on the executors
    // by their nodes' agents, one prediction per row, as `predict` gives.
    const SCORED: usize = 100_000;
    let big = features_df(&spark, SCORED, 8, 21).await;
    let strict = kindling::job::Transform::new()
        .python_version(executor_python())
        .require_node_local(true);
    let scored = model.transform_with(&big, &strict).await.expect("transform");
    let before = spark.data_bytes();
    let summary = scored
        .select_expr(["count(*) AS n", "count(DISTINCT x1, x2) AS distinct_rows"])
        .collect()
        .await
        .expect("aggregate");
    let received = spark.data_bytes().received - before.received;
    assert_eq!(
        summary[0].column(0).as_primitive::<Int64Type>().value(0),
        SCORED as i64
    );
    assert!(received < 4096, "{received} bytes reached the client for one row");
    let serving = model.serving_cluster().expect("cluster").clone();
    let (mut streams, mut rows) = (0, 0);
    for url in &urls {
        let list = kindling::job::TrainedModel::served_on(&serving, url)
            .await
            .expect("served");
        assert_eq!(list.models.len(), 1, "{list:?}");
        assert_eq!(list.models[0].loads, 1, "loaded once per agent: {list:?}");
        streams += list.models[0].streams;
        rows += list.models[0].rows;
    }
    assert_eq!(
        (streams, rows),
        (8, SCORED as u64),
        "one stream per task, every row once"
    );
    let batches = scored.collect().await.expect("collect");
    assert_eq!(assert_same_as_predict(&model, &batches), SCORED);
    drop(spark);
    drop(cluster);
    agents.shutdown().await;
}

/// Dynamic allocation on the standalone cluster: the job starts on one
/// executor, Spark adds the second while tasks queue and removes idle ones;
/// every row is still trained exactly once per epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn push_trains_every_row_once_while_dynamic_allocation_adds_and_removes_executors() {
    use kindling::job::{ExecutorPush, Feed};
    use kindling_tests::events::fed_events;
    use kindling_tests::spark::rule_job;

    let _one_cluster_at_a_time = ONE_CLUSTER.lock().await;
    let (agents, _dir) = kindling_tests::cluster::cluster(2).await;
    let urls = agents.agent_urls();
    let cluster = StandaloneSpark::start(
        &[Some(urls[0].clone()), Some(urls[1].clone())],
        &[("KINDLING_SPARK_DYNAMIC", "1")],
    );
    let spark = SparkSession::connect(&cluster.remote()).await.expect("spark");
    // Enough small tasks that they queue behind one executor.
    const ROWS: usize = 40_000;
    let df = rule_df_in(&spark, ROWS, 16).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let job = rule_job()
        .eval_fraction(0.0)
        .epochs(2)
        .feed(Feed::ExecutorPush(
            ExecutorPush::new().python_version(executor_python()),
        ))
        .events(tx)
        .build()
        .expect("job");
    let mut seen = Vec::new();
    let model = {
        let fit = job.fit_on(&agents, &df);
        tokio::pin!(fit);
        loop {
            tokio::select! {
                done = &mut fit => break done.expect("fit under dynamic allocation"),
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    let n = cluster.executors().len();
                    if seen.last() != Some(&n) {
                        seen.push(n);
                    }
                }
            }
        }
    };
    eprintln!("executors over the job: {seen:?}");
    assert!(
        seen.contains(&2),
        "a second executor was added during the job: {seen:?}"
    );
    let fed = fed_events(&mut rx);
    assert_eq!(fed[0].rows_per_shard.iter().sum::<u64>(), ROWS as u64, "{fed:#?}");
    for i in 0..2 {
        let s = kindling_tests::cluster::status(
            &kindling_tests::cluster::agent_client(&agents, i),
            model.job_id(),
        )
        .await;
        assert_eq!(s.rows_trained_per_epoch, vec![ROWS as u64; 2], "agent {i}");
    }
    // Idle executors go (executorIdleTimeout 3 s).
    let deadline = Instant::now() + Duration::from_secs(120);
    while cluster.executors().len() == 2 {
        assert!(Instant::now() < deadline, "idle executors were never removed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(spark);
    drop(cluster);
    agents.shutdown().await;
}

/// Each test's cluster is five JVMs: one at a time on a small machine.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
