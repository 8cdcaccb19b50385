//! Executor push driven from the Rust client: `TrainingJob` with
//! `Feed::ExecutorPush` builds a `mapInArrow` relation that calls
//! `kindling_client.push.udf_command` (shipped as a session Python file) on a real
//! Spark Connect server; the tasks push straight into real local agents.

use kindling::SparkSession;
use kindling::job::{ExecutorPush, Feed, JobError, PushedPartition};
use kindling_tests::events::{accuracy, fed_events};
use kindling_tests::spark::{PrivateSpark, rule_df, rule_df_in, rule_job, spark_remote};

fn job(feed: Feed) -> kindling::job::TrainingJobBuilder {
    rule_job().feed(feed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executor_push_trains_like_the_driver_relay_without_rows_through_the_client() {
    const ROWS: usize = 20_000;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, ROWS).await;

    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let relay = job(Feed::DriverRelay)
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("driver relay fit");
    let relay_fed = fed_events(&mut rx);

    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let push = job(Feed::ExecutorPush(ExecutorPush::new()))
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("executor push fit");
    let push_fed = fed_events(&mut rx);

    // Same data, same model: both learn the rule, to within a small tolerance.
    let (a_relay, a_push) = (accuracy(&relay), accuracy(&push));
    assert!(a_relay > 0.95, "driver relay accuracy {a_relay}");
    assert!(a_push > 0.95, "executor push accuracy {a_push}");
    assert!(
        (a_relay - a_push).abs() <= 0.02,
        "driver relay {a_relay} vs executor push {a_push}"
    );

    // Every row landed exactly once, on the shard of its partition (p mod 2).
    assert_eq!(push_fed.len(), 2, "{push_fed:#?}");
    let mut total = 0;
    for fed in &push_fed {
        assert_eq!(fed.feed, "executor-push");
        let mut per_shard = vec![0u64; 2];
        let mut ids: Vec<u32> = fed.partitions.iter().map(|p| p.partition).collect();
        ids.dedup();
        assert_eq!(ids, vec![0, 1, 2, 3], "{:#?}", fed.partitions);
        for p in &fed.partitions {
            assert_eq!(p.attempt, 0, "{p:?}");
            assert!(!p.duplicate, "{p:?}");
            assert_eq!(p.committed_rows, p.rows, "{p:?}");
            assert_eq!(p.shard, Some(p.partition as usize % 2), "{p:?}");
            per_shard[p.partition as usize % 2] += p.rows;
        }
        assert_eq!(per_shard, fed.rows_per_shard, "{}", fed.split);
        total += fed.rows_per_shard.iter().sum::<u64>();
    }
    assert_eq!(total, ROWS as u64);
    let relay_total: u64 = relay_fed.iter().flat_map(|f| f.rows_per_shard.iter()).sum();
    assert_eq!(relay_total, ROWS as u64);

    // The rows did not cross the client: it moved the module and the summaries,
    // far less than the relay's Arrow data (received from Spark, sent to agents).
    let relay_bytes: u64 = relay_fed.iter().map(|f| f.client_bytes).sum();
    let push_bytes: u64 = push_fed.iter().map(|f| f.client_bytes).sum();
    assert!(
        relay_bytes > 2 * ROWS as u64 * 9,
        "relay moved only {relay_bytes} bytes"
    );
    assert!(
        push_bytes * 10 < relay_bytes,
        "executor push moved {push_bytes} bytes through the client, relay {relay_bytes}"
    );
}

#[test]
fn the_executor_python_setting_must_be_major_minor() {
    for bad in ["3", "3.", "three.11", "3.11.7"] {
        let err = job(Feed::ExecutorPush(ExecutorPush::new().python_version(bad)))
            .build()
            .expect_err(bad);
        assert!(
            matches!(err, JobError::Setting { setting, .. } if setting.contains("python_version")),
            "{err:?}"
        );
        assert!(err.to_string().contains("must be `major.minor`"), "{err}");
    }
    let ok = job(Feed::ExecutorPush(ExecutorPush::new().python_version("3.12")))
        .build()
        .expect("3.12");
    assert_eq!(
        ok.feed(),
        &Feed::ExecutorPush(ExecutorPush::new().python_version("3.12"))
    );
}

/// A Spark server whose tasks run again after a failure (`local[2,2]`), and a
/// task whose first attempt fails mid-stream: the retry pushes the partition
/// again and no row is held twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_retried_after_a_failure_mid_stream_does_not_double_rows() {
    const ROWS: usize = 8_000;
    let server = PrivateSpark::start("local[2,2]");
    let spark = SparkSession::connect(&server.remote()).await.expect("spark");
    // Several batches per partition, so the failure falls mid-stream.
    spark
        .conf_set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .await
        .expect("conf");
    let df = rule_df(&spark, ROWS).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let push = ExecutorPush::new().fail_first_attempt_for_test(1, 2);
    let model = job(Feed::ExecutorPush(push))
        .eval_fraction(0.0)
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit with a retried task");
    let fed = fed_events(&mut rx);
    assert_eq!(fed.len(), 1, "{fed:#?}");
    let train = &fed[0];
    let retried: Vec<&PushedPartition> = train.partitions.iter().filter(|p| p.attempt > 0).collect();
    assert_eq!(retried.len(), 1, "{:#?}", train.partitions);
    assert_eq!(retried[0].partition, 1);
    assert_eq!(retried[0].attempt, 1);
    assert!(retried[0].rows > 1_000, "{:?}", retried[0]);
    assert_eq!(retried[0].committed_rows, retried[0].rows, "{:?}", retried[0]);
    assert_eq!(train.rows_per_shard.iter().sum::<u64>(), ROWS as u64);
    // Every epoch trained each row once (the agents hold exactly the rows).
    for epoch in model.history() {
        assert!(epoch.rows > 0, "{epoch:?}");
    }
    assert!(accuracy_or_loss_finite(&model));
    drop(spark);
    drop(server);
}

fn accuracy_or_loss_finite(m: &kindling::job::TrainedModel) -> bool {
    m.history().last().is_some_and(|h| h.train_loss.is_finite())
}

/// A shard no partition reaches — here one partition for two agents
/// (`p mod 2`); on a cluster, node-local push while only some nodes run
/// executors — still gets the split's schema, so its agent trains with no
/// rows of its own beside the other, and the job learns every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_no_partition_reaches_trains_with_no_rows_beside_the_others() {
    const ROWS: usize = 4_000;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df_in(&spark, ROWS, 1).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let model = job(Feed::ExecutorPush(ExecutorPush::new()))
        .eval_fraction(0.0)
        .epochs(3)
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit with an empty shard");
    let fed = fed_events(&mut rx);
    assert_eq!(fed.len(), 1, "{fed:#?}");
    assert_eq!(fed[0].rows_per_shard, [ROWS as u64, 0], "{fed:#?}");
    assert_eq!(fed[0].partitions.len(), 1, "{fed:#?}");
    let history = model.history();
    assert_eq!(history.len(), 3);
    for epoch in history {
        assert_eq!(epoch.rows, ROWS as u64, "every row trained each epoch: {epoch:?}");
    }
    assert!(
        history[2].train_loss < history[0].train_loss,
        "it learns: {history:?}"
    );
}
