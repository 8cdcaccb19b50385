//! The README demo: ETL in Spark (join, feature engineering, normalisation,
//! train/test split), training on 2 local agents (AdamW, warmup + cosine
//! schedule, early stopping that keeps the best epoch), test accuracy on
//! predictions written back into Spark, and every metric of the test rows
//! (`TrainedModel::evaluate`) — no files in between.
//!
//! `cargo run -p kindling-example-digits -- sc://127.0.0.1:15002 <dir with digits.csv, writers.csv>`
use kindling::functions::{col, count, lit, mean, stddev};
use kindling::spark::JoinType;
use kindling::{EarlyStopping, Metric, ModelSpec, OptimizerSpec, Schedule, SparkSession, Task, TrainingJob};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let data = args.next().unwrap_or_else(|| "target/digits".into());
    let spark = SparkSession::connect(&remote).await?;
    let read = |name: &str| {
        spark
            .read()
            .option("header", "true")
            .option("inferSchema", "true")
            .csv([format!("{data}/{name}")])
    };

    // ETL: join the writer table, engineer an "ink" feature, normalise, split.
    let pixels: Vec<String> = (0..64).map(|i| format!("p{i}")).collect();
    let digits = read("digits.csv").join_using(&read("writers.csv"), ["id"], JoinType::Inner);
    let digits = digits.filter(col("writer_group").is_not_null());
    let ink = pixels.iter().fold(lit(0.0), |acc, p| acc + col(p));
    let digits = digits.with_column("ink", ink);
    let stats = digits.agg([
        mean(col("ink")).alias("ink_mean"),
        stddev(col("ink")).alias("ink_std"),
    ]);
    let mut features: Vec<String> = pixels.iter().map(|p| format!("{p}_n")).collect();
    features.push("ink_z".into());
    let mut columns: Vec<(String, kindling::Column)> = pixels
        .iter()
        .map(|p| (format!("{p}_n"), col(p) / lit(16.0)))
        .collect();
    columns.push(("ink_z".into(), (col("ink") - col("ink_mean")) / col("ink_std")));
    let prepared = digits
        .cross_join(&stats)
        .with_columns(columns)
        .select(features.iter().map(String::as_str).chain(["label"]));
    let [train, test]: [_; 2] = prepared
        .random_split(&[0.8, 0.2], 42)?
        .try_into()
        .map_err(|_| anyhow::anyhow!("split"))?;

    // Train on 2 slots in local mode (rendezvous + agents in this process).
    let model = TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![64] })
        .task(Task::Classification { num_classes: 10 })
        .optimizer(OptimizerSpec::adamw(0.01, 0.01))
        .no_weight_decay(["bias"])
        .schedule(Schedule::Cosine {
            warmup_epochs: 1.0,
            min_factor: 0.01,
        })
        .early_stopping(EarlyStopping::new(Metric::EvalLoss, 5))
        .features(features.clone())
        .label("label")
        .epochs(30)
        .batch_size(32)
        .num_slots(2)
        .eval_fraction(0.1)
        .local_mode(true)
        .build()?
        .fit(&train)
        .await?;

    // Test accuracy, computed in Spark on predictions sent back as a DataFrame.
    let predicted = model.predict_into_spark(&spark, &test).await?;
    let total = predicted.count().await?;
    let correct = predicted
        .filter(col("prediction").eq(col("label")))
        .count()
        .await?;
    println!(
        "test accuracy: {:.2}% ({correct} of {total})",
        100.0 * correct as f64 / total as f64
    );
    // Every metric over the test rows, as scikit-learn computes them.
    let report = model.evaluate(&test).await?;
    let metric = |m: Metric| report.get(m).unwrap_or(f64::NAN);
    println!(
        "test macro F1: {:.4}  log loss {:.4}  top-5 accuracy {:.2}%",
        metric(Metric::EvalF1Macro),
        metric(Metric::EvalLogLoss),
        100.0 * metric(Metric::EvalTopKAccuracy)
    );
    match model.best_epoch() {
        Some(best) => println!(
            "best epoch: {best} of {} trained (early stopping on eval loss kept its weights)",
            model.history().len()
        ),
        None => println!("best epoch: the last ({})", model.history().len()),
    }
    predicted
        .group_by(["prediction"])
        .agg([count(lit(1)).alias("n")])
        .order_by(["prediction"])
        .show(10)
        .await?;
    Ok(())
}
