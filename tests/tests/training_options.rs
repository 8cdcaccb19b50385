//! The training options end to end: optimizers with weight decay and
//! parameter groups, schedules by global step (continued across a
//! recovery), clipping, accumulation, early stopping with the best epoch
//! kept, and empty input refused at every entry point — on real agents and
//! a real rendezvous on loopback, and through a real Spark Connect server.

use arrow::array::RecordBatch;
use futures::{FutureExt, TryStreamExt};
use kindling::job::{JobError, TrainingEvent};
use kindling::{EarlyStopping, GradientClip, Metric, OptimizerSpec, Schedule, SparkSession};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::spec::{CheckpointPolicy, JobSpec, ModelSpec, Task};
use kindling_tests::cluster::*;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};

fn mlp(num_slots: u32, batch: usize, epochs: u32) -> kindling_schemas::spec::JobSpecBuilder {
    JobSpec::builder()
        .model(ModelSpec::Mlp { hidden: vec![8] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adamw(0.02, 0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(num_slots)
        .batch_size(batch)
        .epochs(epochs)
        .seed(5)
}

fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut diff = 0f32;
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        for (x, y) in va.iter().zip(vb) {
            diff = diff.max((x - y).abs());
        }
    }
    diff
}

/// Feeds each agent its shard and ends the train split.
async fn feed(cluster: &kindling::local::LocalCluster, job: &str, shards: &[RecordBatch], agents: &[usize]) {
    for (shard, &i) in shards.iter().zip(agents) {
        let c = agent_client(cluster, i);
        let rows = shard.num_rows() as u64;
        put(&c, job, Split::Train, "s", std::slice::from_ref(shard))
            .await
            .expect("put");
        end_of_data(&c, job, Split::Train, Some(rows)).await;
    }
}

/// k = 4 micro-batches of b rows per step train as k = 1 at 4b: the same
/// rows in each step, the gradient sums added up before the all-reduce.
/// With AdamW, norm clipping and a warmup + cosine schedule, over 3 shuffled
/// epochs on 2 ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_accumulated_micro_batches_train_as_one_four_times_larger_batch() {
    let (cluster, _dir) = cluster(2).await;
    let options = |b: usize, k: u32| {
        mlp(2, b, 3)
            .accumulate(k)
            .clip(GradientClip::Norm { max_norm: 0.5 })
            .schedule(Schedule::Cosine {
                warmup_epochs: 0.5,
                min_factor: 0.1,
            })
            .no_weight_decay(["bias"])
            .build()
            .expect("spec")
    };
    let shards = [rule_batch(1000, 1), rule_batch(900, 2)];
    start_job(&cluster, "k4", &options(16, 4), &[0, 1]).await;
    feed(&cluster, "k4", &shards, &[0, 1]).await;
    start_job(&cluster, "k1", &options(64, 1), &[0, 1]).await;
    feed(&cluster, "k1", &shards, &[0, 1]).await;
    let mut statuses = Vec::new();
    for job in ["k4", "k1"] {
        let s = wait_done(&agent_client(&cluster, 0), job).await;
        assert_eq!(s.state, AgentJobState::Succeeded, "{job}: {s:#?}");
        statuses.push(s);
    }
    // ceil(1000 / 64) steps per epoch either way; every row once per epoch.
    assert_eq!(statuses[0].steps_per_epoch, 16);
    assert_eq!(statuses[1].steps_per_epoch, 16);
    assert_eq!(statuses[0].rows_trained_per_epoch, vec![1900; 3]);
    let lrs = |s: &kindling_schemas::action::AgentJobStatus| -> Vec<f64> {
        s.history.iter().map(|m| m.learning_rate.expect("lr")).collect()
    };
    assert_eq!(lrs(&statuses[0]), lrs(&statuses[1]));
    let k4 = weights(&agent_client(&cluster, 0), "k4").await;
    let k1 = weights(&agent_client(&cluster, 0), "k1").await;
    let diff = max_diff(&k4, &k1);
    assert!(diff < 1e-5, "k = 4 at b vs k = 1 at 4b: max |Δw| {diff}");
    // And the options did something: without them the weights differ.
    let plain = mlp(2, 64, 3).build().expect("spec");
    start_job(&cluster, "plain", &plain, &[0, 1]).await;
    feed(&cluster, "plain", &shards, &[0, 1]).await;
    wait_done(&agent_client(&cluster, 0), "plain").await;
    let other = weights(&agent_client(&cluster, 0), "plain").await;
    assert!(
        max_diff(&k1, &other) > 1e-3,
        "clipping and the schedule change training"
    );
    cluster.shutdown().await;
}

/// The rate of a step is the schedule's at its place in the job; an agent
/// killed in epoch 3 and the attempt resumed from the epoch-2 checkpoint
/// continue the same curve (the global step comes from the checkpoint).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warmup_cosine_schedule_continues_its_curve_after_an_agent_is_killed() {
    let (cluster, _dir) = cluster(2).await;
    let mut spec = mlp(2, 10, 6)
        .optimizer(OptimizerSpec::sgd_momentum(0.1, 0.9))
        .schedule(Schedule::Cosine {
            warmup_epochs: 1.0,
            min_factor: 0.05,
        })
        .build()
        .expect("spec");
    spec.checkpoint = CheckpointPolicy {
        every_epochs: 1,
        keep_last: 2,
        ..Default::default()
    };
    start_job(&cluster, "curve", &spec, &[0, 1]).await;
    let shards = [rule_batch(1500, 3), rule_batch(1500, 4)];
    feed(&cluster, "curve", &shards, &[0, 1]).await;
    let c0 = agent_client(&cluster, 0);
    kill_and_replace(&cluster, &c0, "curve", &spec, 1, &shards[1], |s| {
        s.epoch >= 3 && s.step > 0
    })
    .await;
    let s0 = wait_done(&c0, "curve").await;
    assert_eq!(s0.state, AgentJobState::Succeeded, "{s0:#?}");
    assert!(s0.resumed_from_epoch.is_some_and(|e| e >= 2), "{s0:#?}");
    // 150 steps per epoch; the last step of epoch e sits at (e - 1) + 149/150.
    let steps = 150.0;
    let want = |e: u32| {
        let p = (e - 1) as f64 + (steps - 1.0) / steps;
        let f = if p < 1.0 {
            (p + 1.0 / steps).min(1.0)
        } else {
            let q = (p - 1.0) / 5.0;
            0.05 + 0.95 * (1.0 + (std::f64::consts::PI * q).cos()) / 2.0
        };
        0.1 * f
    };
    assert_eq!(s0.history.len(), 6);
    for m in &s0.history {
        let lr = m.learning_rate.expect("lr");
        assert!(
            (lr - want(m.epoch)).abs() < 1e-9,
            "epoch {}: {lr} vs {}",
            m.epoch,
            want(m.epoch)
        );
    }
    assert_eq!(s0.rows_trained_per_epoch, vec![3000; 6]);
    cluster.shutdown().await;
}

/// A checkpoint torn by a crash is passed over: with the survivor's latest
/// checkpoint truncated after an agent is killed, the gang resumes from the
/// one before it and still trains every row once per epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_torn_latest_checkpoint_resumes_from_the_one_before() {
    let (cluster, dir) = cluster(2).await;
    let mut spec = mlp(2, 10, 6).build().expect("spec");
    spec.checkpoint = CheckpointPolicy {
        every_epochs: 1,
        keep_last: 3,
        ..Default::default()
    };
    start_job(&cluster, "torn", &spec, &[0, 1]).await;
    let shards = [rule_batch(1500, 5), rule_batch(1500, 6)];
    feed(&cluster, "torn", &shards, &[0, 1]).await;
    let c0 = agent_client(&cluster, 0);
    wait_until(&c0, "torn", std::time::Duration::from_secs(120), |s| {
        s.epoch >= 4 && s.step > 0
    })
    .await;
    cluster.kill_agent(1);
    wait_until(&c0, "torn", std::time::Duration::from_secs(30), |s| {
        matches!(s.state, AgentJobState::Recovering | AgentJobState::Ganging)
    })
    .await;
    // Every agent's latest checkpoint of the job, torn mid-file.
    let mut latest: std::collections::BTreeMap<std::path::PathBuf, (u32, std::path::PathBuf)> =
        Default::default();
    let mut stack = vec![dir.path().to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            match (
                p.is_dir(),
                name.strip_prefix("epoch-").and_then(|n| n.parse::<u32>().ok()),
            ) {
                (true, Some(epoch)) if p.to_string_lossy().contains("/torn/") => {
                    let store = p.parent().and_then(|a| a.parent()).expect("store").to_owned();
                    let slot = latest.entry(store).or_insert((0, p.clone()));
                    if epoch > slot.0 {
                        *slot = (epoch, p);
                    }
                }
                (true, _) => stack.push(p),
                _ => {}
            }
        }
    }
    assert!(!latest.is_empty(), "checkpoints were written");
    let newest = latest.values().map(|(e, _)| *e).max().expect("an epoch");
    for (_, path) in latest.values() {
        let model = path.join("model.bpk");
        let bytes = std::fs::read(&model).expect("read");
        std::fs::write(&model, &bytes[..bytes.len() / 2]).expect("tear");
    }
    let replacement = cluster.add_agent().await.expect("replacement");
    start_on(&cluster, replacement, "torn", &spec).await;
    let c = agent_client(&cluster, replacement);
    put(&c, "torn", Split::Train, "s", std::slice::from_ref(&shards[1]))
        .await
        .expect("re-send");
    end_of_data(&c, "torn", Split::Train, Some(1500)).await;
    let s0 = wait_done(&c0, "torn").await;
    assert_eq!(s0.state, AgentJobState::Succeeded, "{s0:#?}");
    assert_eq!(
        s0.resumed_from_epoch,
        Some(newest - 1),
        "resumed from the checkpoint before the torn one: {s0:#?}"
    );
    assert_eq!(s0.rows_trained_per_epoch, vec![3000; 6]);
    cluster.shutdown().await;
}

/// A Flight client that ends an empty train split gets a failed job naming
/// the split, no second attempt, and no model to fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_train_split_fails_the_job_for_good_and_serves_no_model() {
    let (cluster, _dir) = cluster(2).await;
    let spec = mlp(2, 16, 3).build().expect("spec");
    start_job(&cluster, "empty", &spec, &[0, 1]).await;
    let empty = rule_batch(10, 1).slice(0, 0);
    feed(&cluster, "empty", &[empty.clone(), empty], &[0, 1]).await;
    let c0 = agent_client(&cluster, 0);
    let s = wait_done(&c0, "empty").await;
    assert_eq!(s.state, AgentJobState::Failed, "{s:#?}");
    let error = s.error.clone().unwrap_or_default();
    assert!(
        error.contains("train split of job `empty` is empty") && error.contains("no model is saved"),
        "{error}"
    );
    assert_eq!(s.attempt, 1, "no attempt is tried again: {s:#?}");
    assert!(s.history.is_empty());
    let ticket = DataPath::Model {
        job_id: "empty".into(),
    }
    .ticket();
    let fetched = match c0.flight().do_get(ticket).await {
        Ok(stream) => stream.into_inner().try_collect::<Vec<_>>().await.map(drop),
        Err(status) => Err(status),
    };
    assert!(fetched.is_err(), "no model is served for a failed job");
    cluster.shutdown().await;
}

async fn spark() -> SparkSession {
    SparkSession::connect(&spark_remote()).await.expect("spark")
}

/// `fit` on a DataFrame with no rows, and `fit_arrow` on no batches, fail
/// naming the empty train split; the agents' failure is the only error the
/// events show.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fit_and_fit_arrow_on_no_rows_fail_naming_the_empty_split() {
    let spark = spark().await;
    let df = rule_df(&spark, 1_000)
        .await
        .filter(kindling::functions::expr("1 = 0"));
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let err = rule_job()
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect_err("empty input");
    let msg = err.to_string();
    assert!(matches!(err, JobError::TrainingFailed { .. }), "{err:?}");
    assert!(msg.contains("train split") && msg.contains("is empty"), "{msg}");
    let mut errors = Vec::new();
    while let Ok(e) = rx.try_recv() {
        if let TrainingEvent::AgentLog { event, .. } = e {
            errors.push(event.message);
        }
    }
    assert!(
        errors.iter().all(|m| !m.contains("cancelled")),
        "no cancellation line before the error: {errors:?}"
    );

    let schema = rule_batch(1, 1).schema();
    let err = rule_job()
        .eval_fraction(0.0)
        .build()
        .expect("job")
        .fit_arrow(schema, || {
            async {
                let rows: kindling::spark::RecordBatchStream = Box::pin(futures::stream::empty());
                Ok(rows)
            }
            .boxed()
        })
        .await
        .expect_err("no batches");
    assert!(err.to_string().contains("is empty"), "{err}");
}

/// Through Spark: AdamW with biases exempt from decay, warmup + cosine,
/// norm clipping and accumulation learn the rule; early stopping on a
/// metric that cannot improve by `min_delta` stops after `patience` epochs
/// and returns the best (first) epoch's weights — bitwise those of the same
/// job trained for that one epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn options_train_the_rule_through_spark_and_early_stopping_keeps_the_best_epoch() {
    let spark = spark().await;
    let df = rule_df(&spark, 8_000).await;
    let model = rule_job()
        .optimizer(OptimizerSpec::adamw(0.02, 0.01))
        .no_weight_decay(["bias"])
        .schedule(Schedule::Cosine {
            warmup_epochs: 0.5,
            min_factor: 0.0,
        })
        .clip(GradientClip::Norm { max_norm: 1.0 })
        .accumulate(2)
        .epochs(6)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    let last = model.history().last().expect("history");
    assert!(last.eval_accuracy.expect("accuracy") > 0.95, "{last:?}");
    let lrs: Vec<f64> = model.history().iter().filter_map(|m| m.learning_rate).collect();
    assert!(
        lrs.windows(2).skip(1).all(|w| w[1] < w[0]),
        "cosine decays: {lrs:?}"
    );

    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let stopped = rule_job()
        .epochs(10)
        .early_stopping(EarlyStopping {
            monitor: Metric::TrainLoss,
            patience: 2,
            min_delta: 10.0,
            restore_best: true,
        })
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    assert_eq!(stopped.history().len(), 3, "epoch 1, then 2 without improvement");
    assert_eq!(stopped.best_epoch(), Some(1));
    let mut early = None;
    while let Ok(e) = rx.try_recv() {
        if let TrainingEvent::EarlyStopped { epoch, best_epoch } = e {
            early = Some((epoch, best_epoch));
        }
    }
    assert_eq!(early, Some((3, Some(1))));
    let one = rule_job()
        .epochs(1)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    let (a, b) = (stopped.weights().expect("w"), one.weights().expect("w"));
    assert_eq!(a, b, "the returned weights are epoch 1's");

    // Options are checked when the job is built, naming the field.
    let err = rule_job()
        .epochs(2)
        .schedule(Schedule::Linear {
            warmup_epochs: 3.0,
            min_factor: 0.0,
        })
        .build()
        .expect_err("too long");
    assert!(err.to_string().contains("schedule.warmup_epochs"), "{err}");
    let err = rule_job()
        .task(Task::Regression)
        .early_stopping(EarlyStopping::new(Metric::EvalAccuracy, 2))
        .build()
        .expect_err("no accuracy in regression");
    assert!(err.to_string().contains("early_stopping.monitor"), "{err}");
    // A decay exemption that matches no parameter fails the job at once, naming it.
    let err = rule_job()
        .optimizer(OptimizerSpec::adamw(0.02, 0.01))
        .no_weight_decay(["bais"])
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect_err("typo");
    let msg = err.to_string();
    assert!(
        msg.contains("no_weight_decay[0]") && msg.contains("bias"),
        "{msg}"
    );
}
