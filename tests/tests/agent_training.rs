//! Data-parallel training across real agents on loopback.

use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use futures::TryStreamExt;

use kindling_schemas::action::AgentJobState;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_schemas::spec::{CheckpointPolicy, JobSpec, ModelSpec, OptimizerSpec, Task};
use kindling_tests::cluster::*;

fn logistic(num_slots: u32, batch: usize, epochs: u32) -> JobSpec {
    JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(num_slots)
        .batch_size(batch)
        .epochs(epochs)
        .seed(7)
        .build()
        .expect("spec")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_agents_learn_a_separating_rule() {
    let (cluster, _dir) = cluster(2).await;
    let spec = logistic(2, 32, 8);
    start_job(&cluster, "rule", &spec, &[0, 1]).await;
    let eval = rule_batch(1000, 99);
    for i in 0..2 {
        let c = agent_client(&cluster, i);
        let shard = [rule_batch(1500, i as u64 + 1), rule_batch(500, i as u64 + 10)];
        let r = put(&c, "rule", Split::Train, "shard", &shard).await.expect("put");
        assert_eq!((r.rows_sent, r.rows_committed), (2000, 2000));
        // Eval rows are split between the agents; metrics are gathered over both.
        let half = eval.slice(i * 500, 500);
        put(&c, "rule", Split::Eval, "eval", &[half])
            .await
            .expect("eval put");
        end_of_data(&c, "rule", Split::Eval, Some(500)).await;
        end_of_data(&c, "rule", Split::Train, Some(2000)).await;
    }
    let s0 = wait_done(&agent_client(&cluster, 0), "rule").await;
    let s1 = wait_done(&agent_client(&cluster, 1), "rule").await;
    assert_eq!(s0.state, AgentJobState::Succeeded, "{s0:#?}");
    assert_eq!(s1.state, AgentJobState::Succeeded, "{s1:#?}");
    let last = s0.history.last().expect("history");
    let accuracy = last.eval_accuracy.expect("accuracy");
    assert!(accuracy > 0.95, "eval accuracy {accuracy}");
    let strip = |h: &[kindling_schemas::action::EpochMetrics]| {
        h.iter()
            .map(|m| (m.epoch, m.train_loss, m.eval_loss, m.eval_accuracy))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&s0.history), strip(&s1.history), "ranks agree on metrics");
    assert_eq!(
        s0.rows_trained_per_epoch,
        vec![4000; 8],
        "every row trained once per epoch"
    );
    // Loss went down.
    assert!(last.train_loss < s0.history[0].train_loss);

    // The typed client predicts through the agent's DoExchange, batch by
    // batch, with the model it trained (and reads that model's table).
    let c = agent_client(&cluster, 1);
    let batches = vec![eval.slice(0, 400), eval.slice(400, 600)];
    let predicted: Vec<RecordBatch> = c
        .predict("rule", eval.schema(), futures::stream::iter(batches))
        .await
        .expect("predict")
        .try_collect()
        .await
        .expect("predictions");
    assert_eq!(
        predicted.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
        [400, 600]
    );
    let mut right = 0;
    for b in &predicted {
        let column = |name: &str| {
            let c = b
                .column_by_name(name)
                .unwrap_or_else(|| panic!("no `{name}` in {:?}", b.schema()));
            arrow::compute::cast(c, &arrow::datatypes::DataType::Int64).expect("cast")
        };
        let (y, p) = (column("y"), column("prediction"));
        let (y, p) = (y.as_primitive::<Int64Type>(), p.as_primitive::<Int64Type>());
        right += (0..b.num_rows()).filter(|&i| y.value(i) == p.value(i)).count();
    }
    assert!(right as f64 / 1000.0 > 0.95, "{right} of 1000 predicted right");
    let table = c.fetch_model("rule").await.expect("model table");
    assert_eq!(table.schema().field(0).name(), "name");
    assert!(table.num_rows() > 0);
    // The latest checkpoint (written after the last epoch) holds the trained weights.
    let ticket = DataPath::Checkpoint {
        job_id: "rule".into(),
    }
    .ticket();
    let stream = c
        .flight()
        .do_get(ticket)
        .await
        .expect("checkpoint do_get")
        .into_inner();
    let checkpoint = kindling_fixtures::model_weights(stream).await;
    assert_eq!(
        checkpoint,
        weights(&c, "rule").await,
        "checkpoint = trained model"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_ranks_equal_each_other_and_one_rank_with_double_batch() {
    let (cluster, _dir) = cluster(2).await;
    let b = 16;
    let mut two = logistic(2, b, 3);
    two.shuffle = false;
    let mut one = logistic(1, 2 * b, 3);
    one.shuffle = false;
    let a = rule_batch(640, 1);
    let c = rule_batch(640, 2);

    start_job(&cluster, "two", &two, &[0, 1]).await;
    for (i, shard) in [&a, &c].into_iter().enumerate() {
        let client = agent_client(&cluster, i);
        put(&client, "two", Split::Train, "s", std::slice::from_ref(shard))
            .await
            .expect("put");
        end_of_data(&client, "two", Split::Train, Some(640)).await;
    }
    // One rank with batch 2b sees, at step k, rank 0's batch k then rank 1's.
    let mut interleaved = Vec::new();
    for k in 0..640 / b {
        interleaved.push(a.slice(k * b, b));
        interleaved.push(c.slice(k * b, b));
    }
    start_job(&cluster, "one", &one, &[0]).await;
    let c0 = agent_client(&cluster, 0);
    put(&c0, "one", Split::Train, "s", &interleaved)
        .await
        .expect("put");
    end_of_data(&c0, "one", Split::Train, Some(1280)).await;

    for (job, agent) in [("two", 0), ("two", 1), ("one", 0)] {
        let s = wait_done(&agent_client(&cluster, agent), job).await;
        assert_eq!(s.state, AgentJobState::Succeeded, "{job}@{agent}: {s:#?}");
    }
    let w0 = weights(&agent_client(&cluster, 0), "two").await;
    let w1 = weights(&agent_client(&cluster, 1), "two").await;
    let single = weights(&c0, "one").await;
    assert!(!w0.is_empty());
    for ((n0, v0), (n1, v1)) in w0.iter().zip(&w1) {
        assert_eq!(n0, n1);
        let same_bits = v0.iter().zip(v1).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same_bits, "{n0}: ranks differ: {v0:?} vs {v1:?}");
    }
    let mut max_diff = 0f32;
    for ((n0, v0), (ns, vs)) in w0.iter().zip(&single) {
        assert_eq!(n0, ns);
        for (x, y) in v0.iter().zip(vs) {
            max_diff = max_diff.max((x - y).abs());
        }
    }
    assert!(
        max_diff < 1e-5,
        "2 ranks × b vs 1 rank × 2b: max abs diff {max_diff}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_agent_makes_the_gang_rejoin_and_finish_from_the_checkpoint() {
    let (cluster, _dir) = cluster(2).await;
    let mut spec = logistic(2, 8, 6);
    spec.checkpoint = CheckpointPolicy {
        every_epochs: 1,
        keep_last: 2,
        ..Default::default()
    };
    start_job(&cluster, "crash", &spec, &[0, 1]).await;
    let shards = [rule_batch(3000, 5), rule_batch(3000, 6)];
    for (i, shard) in shards.iter().enumerate() {
        let c = agent_client(&cluster, i);
        put(&c, "crash", Split::Train, "s", std::slice::from_ref(shard))
            .await
            .expect("put");
        end_of_data(&c, "crash", Split::Train, Some(3000)).await;
    }
    let c0 = agent_client(&cluster, 0);
    // Mid-epoch 2 or later: epoch 1's checkpoint exists. The replacement
    // gets the lost shard.
    let replacement = kill_and_replace(&cluster, &c0, "crash", &spec, 1, &shards[1], |s| {
        s.epoch >= 2 && s.step > 0
    })
    .await;
    let cr = agent_client(&cluster, replacement);

    let s0 = wait_done(&c0, "crash").await;
    let sr = wait_done(&cr, "crash").await;
    assert_eq!(s0.state, AgentJobState::Succeeded, "{s0:#?}");
    assert_eq!(sr.state, AgentJobState::Succeeded, "{sr:#?}");
    assert!(s0.attempt >= 2, "a new attempt formed: {s0:#?}");
    let resumed = s0.resumed_from_epoch.expect("resumed from a checkpoint");
    assert!(resumed >= 1);
    assert_eq!(s0.history.len(), 6, "all epochs accounted for");
    assert_eq!(
        sr.resumed_from_epoch,
        Some(resumed),
        "both ranks resumed from the same checkpoint"
    );
    // Every epoch trained each shard's rows exactly once.
    assert_eq!(s0.rows_trained_per_epoch, vec![6000; 6]);
    assert_eq!(sr.rows_trained_per_epoch, vec![6000; 6]);
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rv");
    let status = rv.status("crash").await.expect("status");
    assert!(!status.failures.is_empty(), "the rendezvous recorded the failure");
    cluster.shutdown().await;
}

/// The first epoch trains the rows as they arrive: steps are taken before the
/// producer has sent everything, and the result is bitwise the same as when
/// the same rows arrive in one stream per agent (each step is every rank's
/// next full batch either way). Shuffling is off: it reorders cached batches,
/// and the two runs cache the rows in differently sized batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn training_starts_while_the_first_epoch_arrives_and_ends_as_if_it_had_not() {
    let (cluster, _dir) = cluster(2).await;
    let mut spec = logistic(2, 32, 3);
    spec.shuffle = false;
    let shards = [rule_batch(1000, 21), rule_batch(1000, 22)];

    start_job(&cluster, "arriving", &spec, &[0, 1]).await;
    // First 500 rows per agent: 15 full batches each, 20 rows left over.
    for (i, shard) in shards.iter().enumerate() {
        let c = agent_client(&cluster, i);
        put(&c, "arriving", Split::Train, "first", &[shard.slice(0, 500)])
            .await
            .expect("first half");
    }
    let c0 = agent_client(&cluster, 0);
    let early = wait_until(&c0, "arriving", Duration::from_secs(60), |s| s.step >= 15).await;
    assert_eq!(early.state, AgentJobState::Training, "{early:#?}");
    assert_eq!((early.epoch, early.rows_train), (1, 500), "{early:#?}");
    assert!(
        early.rows_trained_per_epoch.is_empty(),
        "no epoch can end before the data does: {early:#?}"
    );
    // The rest, split into two more streams per agent.
    for (i, shard) in shards.iter().enumerate() {
        let c = agent_client(&cluster, i);
        put(&c, "arriving", Split::Train, "second", &[shard.slice(500, 300)])
            .await
            .expect("second part");
        put(&c, "arriving", Split::Train, "third", &[shard.slice(800, 200)])
            .await
            .expect("third part");
        end_of_data(&c, "arriving", Split::Train, Some(1000)).await;
    }

    start_job(&cluster, "at-once", &spec, &[0, 1]).await;
    for (i, shard) in shards.iter().enumerate() {
        let c = agent_client(&cluster, i);
        put(&c, "at-once", Split::Train, "all", std::slice::from_ref(shard))
            .await
            .expect("put");
        end_of_data(&c, "at-once", Split::Train, Some(1000)).await;
    }
    for job in ["arriving", "at-once"] {
        for agent in 0..2 {
            let s = wait_done(&agent_client(&cluster, agent), job).await;
            assert_eq!(s.state, AgentJobState::Succeeded, "{job}@{agent}: {s:#?}");
            assert_eq!(s.rows_trained_per_epoch, vec![2000; 3], "{job}@{agent}");
            assert_eq!(s.steps_per_epoch, 32, "{job}@{agent}: ceil(1000 / 32) steps");
        }
    }
    let arriving = weights(&c0, "arriving").await;
    let at_once = weights(&c0, "at-once").await;
    assert!(!arriving.is_empty());
    for ((n0, v0), (n1, v1)) in arriving.iter().zip(&at_once) {
        assert_eq!(n0, n1);
        let same_bits = v0.iter().zip(v1).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same_bits, "{n0}: arriving {v0:?} vs at once {v1:?}");
    }
    cluster.shutdown().await;
}

/// `gradient_compression: bf16` halves the gradients' bytes; the stated
/// tolerance: on the same data, its final train loss is within 0.02 + 10 %
/// of the `f32` run's, and it classifies as well (eval accuracy within 0.02).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bf16_run_converges_like_the_f32_run_on_the_same_data() {
    use kindling_schemas::spec::GradientCompression;
    let (cluster, _dir) = cluster(2).await;
    let eval = rule_batch(1000, 99);
    let mut outcomes = Vec::new();
    for (job, compression) in [
        ("f32", GradientCompression::None),
        ("bf16", GradientCompression::Bf16),
    ] {
        let mut spec = logistic(2, 32, 6);
        spec.gradient_compression = compression;
        spec.shuffle = false;
        start_job(&cluster, job, &spec, &[0, 1]).await;
        for i in 0..2 {
            let c = agent_client(&cluster, i);
            put(&c, job, Split::Train, "s", &[rule_batch(1500, i as u64 + 1)])
                .await
                .expect("put");
            put(&c, job, Split::Eval, "e", &[eval.slice(i * 500, 500)])
                .await
                .expect("eval");
            end_of_data(&c, job, Split::Eval, Some(500)).await;
            end_of_data(&c, job, Split::Train, Some(1500)).await;
        }
        let s0 = wait_done(&agent_client(&cluster, 0), job).await;
        let s1 = wait_done(&agent_client(&cluster, 1), job).await;
        assert_eq!(s0.state, AgentJobState::Succeeded, "{job}: {s0:#?}");
        // Still bitwise-identical replicas.
        assert_eq!(
            weights(&agent_client(&cluster, 0), job).await,
            weights(&agent_client(&cluster, 1), job).await,
            "{job}: ranks differ"
        );
        assert_eq!(s1.rows_trained_per_epoch, vec![3000; 6]);
        outcomes.push(s0.history.last().cloned().expect("history"));
    }
    let (f32_run, bf16_run) = (&outcomes[0], &outcomes[1]);
    eprintln!("f32 {f32_run:?}\nbf16 {bf16_run:?}");
    assert!(
        (bf16_run.train_loss - f32_run.train_loss).abs() <= 0.02 + 0.1 * f32_run.train_loss,
        "bf16 loss {} vs f32 {}",
        bf16_run.train_loss,
        f32_run.train_loss
    );
    let (a16, a32) = (
        bf16_run.eval_accuracy.expect("accuracy"),
        f32_run.eval_accuracy.expect("accuracy"),
    );
    assert!(
        a32 > 0.95 && (a16 - a32).abs() <= 0.02,
        "accuracy bf16 {a16} vs f32 {a32}"
    );
    // And bf16 did change the arithmetic (the runs are not the same run).
    assert_ne!(bf16_run.train_loss, f32_run.train_loss);
    cluster.shutdown().await;
}
