//! `TrainingJob::fit_arrow`: training on Arrow batches that do not come from Spark.

use std::sync::Arc;

use arrow::array::{AsArray, Float32Array, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::FutureExt;
use futures::future::BoxFuture;
use kindling::job::{JobError, ProgressMode, TrainingEvent, TrainingJob};
use kindling::spark::RecordBatchStream;
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};

/// `rows` rows of two features in [-1, 1) and label = (x0 > x1).
fn batches(rows: usize, per_batch: usize) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("x0", DataType::Float32, false),
        Field::new("x1", DataType::Float32, false),
        Field::new("label", DataType::Int32, false),
    ]));
    (0..rows)
        .step_by(per_batch)
        .map(|start| {
            let ids: Vec<usize> = (start..(start + per_batch).min(rows)).collect();
            let x0: Vec<f32> = ids
                .iter()
                .map(|i| ((i * 7919) % 2000) as f32 / 1000.0 - 1.0)
                .collect();
            let x1: Vec<f32> = ids
                .iter()
                .map(|i| ((i * 104_729) % 2000) as f32 / 1000.0 - 1.0)
                .collect();
            let label: Vec<i32> = x0.iter().zip(&x1).map(|(a, b)| i32::from(a > b)).collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Float32Array::from(x0)),
                    Arc::new(Float32Array::from(x1)),
                    Arc::new(Int32Array::from(label)),
                ],
            )
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// Opens a stream of `data`'s batches (a fresh one per call, as `fit_arrow` asks).
fn replay(data: &[RecordBatch]) -> BoxFuture<'static, Result<RecordBatchStream, kindling::spark::Error>> {
    let data = data.to_vec();
    async move {
        let rows: RecordBatchStream = Box::pin(futures::stream::iter(data.into_iter().map(Ok)));
        Ok(rows)
    }
    .boxed()
}

fn job(eval_fraction: f64) -> Result<TrainingJob, JobError> {
    builder(eval_fraction).build()
}

fn builder(eval_fraction: f64) -> kindling::job::TrainingJobBuilder {
    TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![16] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.02))
        .features(["x0", "x1"])
        .label("label")
        .epochs(5)
        .batch_size(64)
        .num_slots(2)
        .eval_fraction(eval_fraction)
        .local_mode(true)
        .progress(ProgressMode::Silent)
}

#[tokio::test]
async fn trains_on_arrow_batches_in_local_mode() -> Result<(), JobError> {
    let data = batches(20_000, 1_000);
    let schema = data[0].schema();
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let model = job(0.0)?
        .fit_arrow(schema, || {
            opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            replay(&data)
        })
        .await?;
    assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 1, "one feed");
    assert_eq!(model.history().len(), 5);
    // Each of the two ranks trained half the rows.
    assert_eq!(model.history()[0].rows, 10_000);
    let (mut correct, mut total) = (0usize, 0usize);
    for batch in batches(2_000, 500) {
        let predicted = model.predict_batch(&batch)?;
        let labels = batch.column(2).as_primitive::<arrow::datatypes::Int32Type>();
        let predictions = predicted
            .column_by_name("prediction")
            .unwrap_or_else(|| panic!("no prediction column"))
            .as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            total += 1;
            correct += usize::from(i64::from(labels.value(i)) == predictions.value(i));
        }
    }
    assert!(
        correct * 10 >= total * 9,
        "accuracy {correct}/{total} on a linear rule"
    );
    Ok(())
}

#[tokio::test]
async fn a_single_batch_is_dealt_evenly_over_the_shards() -> Result<(), JobError> {
    // One 3,001-row batch (a small Spark result often is one batch): both
    // ranks get rows, within one row of each other.
    let data = batches(3_001, 3_001);
    assert_eq!(data.len(), 1);
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let model = builder(0.0)
        .epochs(1)
        .events(tx)
        .build()?
        .fit_arrow(data[0].schema(), || replay(&data))
        .await?;
    let mut fed = Vec::new();
    while let Ok(event) = rx.try_recv() {
        if let TrainingEvent::Fed { rows_per_shard, .. } = event {
            fed.push(rows_per_shard);
        }
    }
    assert_eq!(fed, vec![vec![1_501, 1_500]]);
    // Rank 0 (whose history this is) trained every row of its shard.
    assert_eq!(model.history().len(), 1);
    assert_eq!(model.history()[0].rows, 1_501);
    Ok(())
}

#[tokio::test]
async fn an_eval_split_is_refused_before_anything_starts() -> Result<(), JobError> {
    let data = batches(100, 100);
    let err = job(0.2)?
        .fit_arrow(data[0].schema(), || {
            async { Err(kindling::spark::Error::InvalidArgument("not opened".into())) }.boxed()
        })
        .await
        .expect_err("eval split on Arrow batches");
    assert!(
        matches!(err, JobError::Setting { setting: "eval_fraction", ref reason } if reason.contains("eval_fraction")),
        "{err}"
    );
    Ok(())
}

/// A search on Arrow batches: opened once for the dataset, both trials
/// finish ranked by the train loss (no eval split), each rank training
/// half the rows every epoch.
#[tokio::test]
async fn a_search_on_arrow_batches_opens_them_once() -> Result<(), JobError> {
    use kindling::job::{Search, SearchSpace, TrialOutcome};
    let data = batches(8_000, 1_000);
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let space = SearchSpace::parse(["lr=0.05|0.01"])?;
    let result = job(0.0)?
        .search_arrow(
            data[0].schema(),
            || {
                opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                replay(&data)
            },
            &Search::new(space),
        )
        .await?;
    assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 1, "one feed");
    assert_eq!(result.metric, kindling::Metric::TrainLoss);
    for t in &result.trials {
        assert_eq!(t.outcome, TrialOutcome::Finished, "{}", result.table());
        assert!(t.history.iter().all(|m| m.rows == 4_000));
    }
    Ok(())
}
