//! `TrainingJob` end to end: a real Spark Connect server, real local agents.

use std::time::Duration;

use futures::TryStreamExt;
use kindling::SparkSession;
use kindling::job::{JobError, TrainingEvent};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::action::{Action, AgentJobState, JobList};
use kindling_schemas::schema::SchemaError;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};

fn job(slots: u32, epochs: u32) -> kindling::job::TrainingJobBuilder {
    rule_job().num_slots(slots).epochs(epochs)
}

async fn spark() -> SparkSession {
    SparkSession::connect(&spark_remote()).await.expect("spark")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_fit_on_two_slots_matches_one_slot_and_predicts_back_into_spark() {
    let spark = spark().await;
    let df = rule_df(&spark, 20_000).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let two = job(2, 5)
        .local_mode(true)
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit 2");
    // The same model in one process: batch_size is per rank, so one slot
    // takes the two slots' global batch (2 × 64) per step.
    let one = job(1, 5)
        .batch_size(128)
        .local_mode(true)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit 1");
    let acc = |m: &kindling::job::TrainedModel| {
        m.history()
            .last()
            .and_then(|h| h.eval_accuracy)
            .expect("accuracy")
    };
    assert!(acc(&two) > 0.95, "2 slots: {}", acc(&two));
    assert!(
        (acc(&two) - acc(&one)).abs() <= 0.01,
        "2 slots {} vs 1 slot {}",
        acc(&two),
        acc(&one)
    );

    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    assert!(matches!(events.first(), Some(TrainingEvent::Started { agents, .. }) if agents.len() == 2));
    let fed: Vec<&Vec<u64>> = events
        .iter()
        .filter_map(|e| match e {
            TrainingEvent::Fed {
                split: "train",
                rows_per_shard,
                ..
            } => Some(rows_per_shard),
            _ => None,
        })
        .collect();
    assert_eq!(fed.len(), 1);
    // The rows are dealt evenly over the two shards.
    assert!(fed[0].iter().all(|&r| r > 0), "{:?}", fed[0]);
    assert!(fed[0][0].abs_diff(fed[0][1]) <= 1, "{:?}", fed[0]);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, TrainingEvent::Epoch(_)))
            .count(),
        5
    );
    // Every epoch trained exactly the training split's rows.
    for h in two.history() {
        assert!(h.rows > 0);
    }

    // Predictions stream back and round-trip into Spark.
    let features = df.select(["x1", "x2", "y"]);
    let predicted = two
        .predict_into_spark(&spark, &features)
        .await
        .expect("predict into spark");
    assert_eq!(predicted.count().await.expect("count"), 20_000);
    let wrong = predicted.filter(kindling::functions::col("prediction").neq(kindling::functions::col("y")));
    let errors = wrong.count().await.expect("count");
    assert!(errors < 1_000, "{errors} of 20000 mispredicted");

    // Save, load, predict locally: same answers.
    let dir = tempfile::tempdir().expect("tempdir");
    two.save(dir.path()).expect("save");
    let loaded = kindling::job::TrainedModel::load(dir.path()).expect("load");
    let a: Vec<_> = two
        .predict(&features.limit(500))
        .await
        .expect("predict")
        .try_collect()
        .await
        .expect("a");
    let b: Vec<_> = loaded
        .predict(&features.limit(500))
        .await
        .expect("predict")
        .try_collect()
        .await
        .expect("b");
    assert_eq!(a, b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_agent_is_replaced_and_every_epoch_trains_every_row_once() {
    let spark = spark().await;
    let df = rule_df(&spark, 30_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path());
    config.lease = Duration::from_millis(600);
    let cluster = std::sync::Arc::new(LocalCluster::start(2, config).await.expect("cluster"));
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let job = job(2, 6)
        .batch_size(16)
        .eval_fraction(0.0)
        .events(tx)
        .build()
        .expect("job");
    let fit = {
        let cluster = cluster.clone();
        let df = df.clone();
        tokio::spawn(async move { job.fit_on(&cluster, &df).await })
    };
    // Kill one of the job's agents once epoch 2 is under way.
    let mut victim = None;
    while let Some(e) = rx.recv().await {
        match e {
            TrainingEvent::Started { agents, .. } => victim = Some(agents[1].clone()),
            TrainingEvent::Step { epoch, .. } if epoch >= 2 => break,
            _ => {}
        }
    }
    let victim = victim.expect("started");
    cluster.kill_agent(cluster.index_of(&victim).expect("victim index"));
    let mut recovered = false;
    while let Some(e) = rx.recv().await {
        if let TrainingEvent::Recovering { resent_shards, .. } = &e {
            assert_eq!(resent_shards, &vec![1]);
            recovered = true;
        }
    }
    let model = fit.await.expect("task").expect("fit survives the crash");
    assert!(recovered, "the client re-sent the lost shard");
    assert_eq!(model.history().len(), 6);
    let rows = df.count().await.expect("count") as u64;
    // The agents' counters: every epoch trained exactly the dataset's rows.
    for url in cluster.agent_urls() {
        let c = kindling::feed::AgentClient::connect(&url, cluster.token()).expect("client");
        let jobs: JobList = c.action(&Action::ListJobs).await.expect("list");
        for j in jobs.jobs.iter().filter(|j| j.state == AgentJobState::Succeeded) {
            assert_eq!(j.rows_trained_per_epoch, vec![rows; 6], "agent {url}");
        }
    }
    std::sync::Arc::try_unwrap(cluster)
        .expect("sole owner")
        .shutdown()
        .await;
}

/// `fit` follows its job from the rendezvous's watch, which carries what the
/// agents report in their heartbeats: steps and epochs arrive as they happen,
/// while each agent is asked for its status only a few times (for its final
/// status), not every few hundred milliseconds as the job trains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fit_follows_progress_from_the_rendezvous_and_asks_each_agent_only_at_the_end() {
    let spark = spark().await;
    // Enough steps (4 epochs of 8-row steps) to train for seconds.
    let df = rule_df(&spark, 120_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = LocalCluster::start(2, LocalClusterConfig::new(dir.path()))
        .await
        .expect("cluster");
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let started = std::time::Instant::now();
    job(2, 4)
        .batch_size(8)
        .events(tx)
        .build()
        .expect("job")
        .fit_on(&cluster, &df)
        .await
        .expect("fit");
    let took = started.elapsed();
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let epochs: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            TrainingEvent::Epoch(m) => Some(m.epoch),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, vec![1, 2, 3, 4], "each epoch once, in order");
    let steps: Vec<(u32, u64)> = events
        .iter()
        .filter_map(|e| match e {
            TrainingEvent::Step { epoch, step, .. } => Some((*epoch, *step)),
            _ => None,
        })
        .collect();
    assert!(steps.len() >= 4, "progress while training: {steps:?}");
    assert!(
        steps.windows(2).all(|w| w[0] <= w[1]),
        "steps in order: {steps:?}"
    );
    // Each agent's count of the job_status actions it answered.
    let token = cluster.token().expect("token").expose().to_owned();
    for url in cluster.agent_urls() {
        let addr = url.trim_start_matches("http://");
        let page = kindling_tests::http::get(addr, "/metrics", &[kindling_tests::http::bearer(&token)]).await;
        assert_eq!(page.code, 200, "{}", page.body);
        let asked: u64 = page
            .body
            .lines()
            .find(|l| l.starts_with("kindling_agent_actions") && l.contains(r#"action="job_status""#))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no job_status count at {url}:\n{}", page.body));
        eprintln!(
            "{url}: asked for its status {asked} times in a fit of {took:?} with {} step events",
            steps.len()
        );
        assert!(
            asked <= 4,
            "{url} was asked for its status {asked} times in {took:?}"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_agents_is_a_clear_error() {
    let spark = spark().await;
    let df = rule_df(&spark, 100).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = LocalCluster::start(1, LocalClusterConfig::new(dir.path()))
        .await
        .expect("cluster");
    let mut builder = job(2, 1).local_mode(false).rendezvous(cluster.rendezvous_url());
    if let Some(t) = cluster.token() {
        builder = builder.token(t.clone());
    }
    let err = builder.build().expect("job").fit(&df).await.expect_err("too few");
    assert!(
        matches!(
            err,
            JobError::NotEnoughAgents {
                needed: 2,
                live: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("needs 2 agents but only 1"), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_features_and_null_labels_fail_before_training() {
    let spark = spark().await;
    let strings = spark
        .sql("SELECT CAST(id AS STRING) AS x1, CAST(id AS DOUBLE) AS x2, CAST(id % 2 AS INT) AS y FROM range(100)")
        .await
        .expect("sql");
    let err = job(2, 1)
        .local_mode(true)
        .build()
        .expect("job")
        .fit(&strings)
        .await
        .expect_err("string");
    match &err {
        JobError::Data(SchemaError::WrongType { column, .. }) => assert_eq!(column, "x1"),
        other => panic!("expected a wrong-type error naming x1, got {other}"),
    }
    let nulls = spark
        .sql("SELECT CAST(id AS DOUBLE) AS x1, CAST(id AS DOUBLE) AS x2, CASE WHEN id = 77 THEN NULL ELSE CAST(id % 2 AS INT) END AS y FROM range(100)")
        .await
        .expect("sql");
    let err = job(2, 1)
        .local_mode(true)
        .eval_fraction(0.0)
        .build()
        .expect("job")
        .fit(&nulls)
        .await
        .expect_err("nulls");
    match &err {
        JobError::Data(SchemaError::Nulls { column, .. }) => assert_eq!(column, "y"),
        other => panic!("expected a null error naming y, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_client_leaves_no_job_running_on_the_agents() {
    let spark = spark().await;
    let df = rule_df(&spark, 200_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path());
    config.lease = Duration::from_millis(600);
    let cluster = std::sync::Arc::new(LocalCluster::start(2, config).await.expect("cluster"));
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let job = job(2, 50)
        .eval_fraction(0.0)
        .window_bytes(256 << 10)
        .events(tx)
        .build()
        .expect("job");
    let fit = {
        let cluster = cluster.clone();
        tokio::spawn(async move { job.fit_on(&cluster, &df).await })
    };
    // Cancel mid-stream.
    while let Some(e) = rx.recv().await {
        if matches!(e, TrainingEvent::Streamed { .. } | TrainingEvent::Fed { .. }) {
            break;
        }
    }
    fit.abort();
    let _ = fit.await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut running = 0;
        for url in cluster.agent_urls() {
            let c = kindling::feed::AgentClient::connect(&url, cluster.token()).expect("client");
            let jobs: JobList = c.action(&Action::ListJobs).await.expect("list");
            running += jobs.jobs.iter().filter(|j| !j.state.is_terminal()).count();
        }
        if running == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{running} jobs still running on the agents"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::sync::Arc::try_unwrap(cluster)
        .expect("sole owner")
        .shutdown()
        .await;
}
