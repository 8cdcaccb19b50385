//! Benchmark: predicting over a Spark DataFrame three ways, in one run, with
//! the same model on the same rows, each finished by the same aggregate over
//! the predictions (`count(*)`, `sum(prediction)`, one row back):
//!
//! - **transform**: `TrainedModel::transform` — the model served on the local
//!   agents, each Spark task sends its partition to an agent (`DoExchange`,
//!   from the executors' Python) and gets the predictions back;
//! - **predict_into_spark**: the model run in this process (burn), every row
//!   read from Spark Connect and the predictions sent back as a local relation;
//! - **pandas_udf**: a PySpark Connect client (`bench_transform_pandas.py`)
//!   applying the same weights in numpy inside a `pandas_udf` on the same
//!   executors — no Kindling in the data path.
//!
//! ```text
//! deploy/local/spark-connect.sh start
//! export CARGO_TARGET_DIR=$HOME/.cache/kindling/target
//! cargo run --release -p kindling --example bench_transform -- sc://127.0.0.1:15002 1000000,10000000 2
//! ```
//!
//! Arguments: Spark Connect URL, comma-separated row counts, repetitions (each
//! repetition runs the three ways, rotating which goes first). The model (an
//! MLP, 8 float features, 32 hidden units, 2 classes) is trained once, not
//! timed, on 200,000 rows by a `LocalCluster` of 2 agents in this process,
//! which then serves it for `transform`. The executors need Python with
//! pyarrow (version from env `KINDLING_EXECUTOR_PYTHON`, default 3.11); the
//! pandas_udf baseline runs `KINDLING_PYTHON_BIN` (default the venv of
//! `deploy/local/spark-connect.sh`) with pyspark, pandas and numpy.
//!
//! Env: `KINDLING_BENCH_RELAY_MAX_ROWS` (default 2,000,000): larger sizes
//! skip `predict_into_spark` — at 10M rows its local relation took the
//! server of `deploy/local/spark-connect.sh` (4 GiB heap) down with an
//! `OutOfMemoryError`; with `KINDLING_SPARK_DRIVER_MEMORY=12g` it completes
//! (docs/benchmarks.md); `KINDLING_BENCH_ARROW_BATCH_ROWS` (default 5,000):
//! rows per Arrow batch handed to the executors' Python, in both sessions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use arrow::array::{ArrayRef, AsArray, Float32Array, RecordBatch};
use arrow::datatypes::Int64Type;
use kindling::SparkSession;
use kindling::job::{ProgressMode, TrainedModel, TrainingJob, Transform};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling::spark::DataFrame;
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};

// Only `load_average` here; the other benchmarks use the rest.
#[allow(dead_code)]
mod common;
use common::load_average;

const FEATURES: usize = 8;
const TRAIN_ROWS: u64 = 200_000;
/// Rows of the warm-up runs (not timed) and of the numpy check.
const WARMUP_ROWS: u64 = 20_000;
const CHECK_ROWS: u64 = 2_000;
/// Prediction sums of two ways may differ by this many rows (float ties:
/// numpy and burn sum the dot products in different orders).
const SUM_TOLERANCE: i64 = 10;
/// Rows per Arrow batch the executors hand Python (both sessions'
/// `spark.sql.execution.arrow.maxRecordsPerBatch`; Spark's default is
/// 10,000). Env `KINDLING_BENCH_ARROW_BATCH_ROWS` overrides it. Below
/// Spark's default because `kindling_predict.py` reads one answer message
/// per batch while the agent's `DoExchange` encoder splits an answer larger
/// than its 2 MiB message limit (by its memory-size estimate): a 10,000-row
/// batch of 8 float features comes back as two 5,000-row messages and the
/// task fails with "answered 5000 rows for a batch of 10000".
const ARROW_BATCH_ROWS: u64 = 5_000;
/// The most rows `predict_into_spark` is asked to relay (env
/// `KINDLING_BENCH_RELAY_MAX_ROWS` overrides it): its local relation at 10M
/// rows (~0.5 GB of Arrow uploaded) exhausted the 4 GiB heap of the Spark
/// Connect server of `deploy/local/spark-connect.sh` — minutes of full GCs,
/// then `OutOfMemoryError` in the DAG scheduler and the context cleaner, and
/// a SparkContext that stopped, for every session of that server. Larger
/// sizes get a "not run" row instead.
const RELAY_MAX_ROWS: u64 = 2_000_000;
/// A `predict_into_spark` run still going after this long is abandoned (and
/// its session released).
const RELAY_TIMEOUT_SECS: u64 = 300;
/// Seconds to wait after a failed way before the next one.
const FAILURE_PAUSE_SECS: u64 = 15;
const WAYS: [&str; 3] = ["transform", "predict_into_spark", "pandas_udf"];

fn feature_names() -> Vec<String> {
    (1..=FEATURES).map(|i| format!("x{i}")).collect()
}

/// 8 float features over 8 partitions, computed by Spark (as bench_feed's).
/// `rand(seed)` is a function of the seed, the partition and the row's place
/// in it, so every execution of the query yields the same rows.
fn features_query(rows: u64) -> String {
    let features: Vec<String> = (1..=FEATURES)
        .map(|i| format!("CAST(rand({i}) AS FLOAT) AS x{i}"))
        .collect();
    format!("SELECT {} FROM range(0, {rows}, 1, 8)", features.join(", "))
}

/// The training rows: the features and `y = x1 + x2 > x3 + x4`.
fn training_query(rows: u64) -> String {
    format!(
        "SELECT *, CAST(x1 + x2 > x3 + x4 AS INT) AS y FROM ({})",
        features_query(rows)
    )
}

/// The aggregate every way ends with: `(count(*), sum(prediction))`.
async fn aggregate(scored: &DataFrame) -> anyhow::Result<(i64, i64)> {
    let batches = scored
        .select_expr(["count(*) AS n", "sum(prediction) AS s"])
        .collect()
        .await?;
    let b = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .context("the aggregate returned no row")?;
    let n = b.column(0).as_primitive::<Int64Type>().value(0);
    let s = b.column(1).as_primitive::<Int64Type>().value(0);
    Ok((n, s))
}

struct Outcome {
    seconds: f64,
    n: i64,
    sum: i64,
    /// Data bytes through this client (`None`: another process's client).
    client_bytes: Option<u64>,
}

/// One timed way, from building the DataFrame to the aggregate's row.
async fn run_rust(
    spark: &SparkSession,
    model: &TrainedModel,
    transform: &Transform,
    way: &str,
    rows: u64,
) -> anyhow::Result<Outcome> {
    let before = spark.data_bytes();
    let start = Instant::now();
    let df = spark.sql(&features_query(rows)).await?;
    let scored = match way {
        "transform" => model.transform_with(&df, transform).await?,
        _ => model.predict_into_spark(spark, &df).await?,
    };
    let (n, sum) = aggregate(&scored).await?;
    let seconds = start.elapsed().as_secs_f64();
    let after = spark.data_bytes();
    Ok(Outcome {
        seconds,
        n,
        sum,
        client_bytes: Some(after.received - before.received + after.sent - before.sent),
    })
}

/// A Spark Connect session with the benchmark's Arrow batch size.
async fn session(remote: &str) -> anyhow::Result<SparkSession> {
    let spark = SparkSession::connect(remote).await?;
    spark
        .conf_set(
            "spark.sql.execution.arrow.maxRecordsPerBatch",
            &arrow_batch_rows().to_string(),
        )
        .await?;
    Ok(spark)
}

/// One timed way run in this process. `predict_into_spark` runs in a session
/// of its own, released afterwards (not timed): the server holds the local
/// relation it uploads until its session ends.
async fn run_way(
    spark: &SparkSession,
    remote: &str,
    model: &TrainedModel,
    transform: &Transform,
    way: &str,
    rows: u64,
) -> anyhow::Result<Outcome> {
    if way == "transform" {
        return run_rust(spark, model, transform, way, rows).await;
    }
    let own = session(remote).await?;
    let limit = std::time::Duration::from_secs(RELAY_TIMEOUT_SECS);
    let outcome = match tokio::time::timeout(limit, run_rust(&own, model, transform, way, rows)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(anyhow::anyhow!("no answer within {RELAY_TIMEOUT_SECS} s")),
    };
    if let Err(e) = own.stop().await {
        eprintln!("releasing the predict_into_spark session: {e}");
    }
    outcome
}

fn relay_max_rows() -> u64 {
    std::env::var("KINDLING_BENCH_RELAY_MAX_ROWS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(RELAY_MAX_ROWS)
}

fn arrow_batch_rows() -> u64 {
    std::env::var("KINDLING_BENCH_ARROW_BATCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ARROW_BATCH_ROWS)
}

fn python_bin() -> PathBuf {
    std::env::var("KINDLING_PYTHON_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/kindling/venv/bin/python")
        })
}

/// Runs `bench_transform_pandas.py` with one JSON argument; returns the JSON
/// object it prints last.
async fn run_python(args: serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bench_transform_pandas.py");
    let bin = python_bin();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin)
            .arg(script)
            .arg(args.to_string())
            .output()
            .with_context(|| format!("running {}", bin.display()))
    })
    .await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect::<Vec<_>>();
        anyhow::bail!(
            "bench_transform_pandas.py failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let last = stdout
        .lines()
        .last()
        .context("bench_transform_pandas.py printed nothing")?;
    Ok(serde_json::from_str(last)?)
}

async fn run_pandas(remote: &str, model_dir: &str, rows: u64) -> anyhow::Result<Outcome> {
    let out = run_python(serde_json::json!({
        "mode": "bench",
        "remote": remote,
        "model_dir": model_dir,
        "features": feature_names(),
        "query": features_query(rows),
        "warmup_query": features_query(WARMUP_ROWS),
        "rows": rows,
        "arrow_batch_rows": arrow_batch_rows(),
    }))
    .await?;
    Ok(Outcome {
        seconds: out["seconds"].as_f64().context("seconds")?,
        n: out["n"].as_i64().context("n")?,
        sum: out["sum"].as_i64().context("sum")?,
        client_bytes: None,
    })
}

/// Runs the pandas_udf on a few rows and compares its classes with
/// `predict_batch` of the same features here: (rows, mismatches).
async fn check_numpy(remote: &str, model_dir: &str, model: &TrainedModel) -> anyhow::Result<(usize, usize)> {
    let out = run_python(serde_json::json!({
        "mode": "check",
        "remote": remote,
        "model_dir": model_dir,
        "features": feature_names(),
        "query": features_query(CHECK_ROWS),
        "arrow_batch_rows": arrow_batch_rows(),
    }))
    .await?;
    let rows = out["rows"].as_array().context("rows")?;
    let mut columns: Vec<ArrayRef> = Vec::new();
    for k in 0..FEATURES {
        let values: Vec<f32> = rows
            .iter()
            .map(|r| r[k].as_f64().map(|v| v as f32))
            .collect::<Option<_>>()
            .context("feature values")?;
        columns.push(Arc::new(Float32Array::from(values)));
    }
    let batch = RecordBatch::try_from_iter(feature_names().into_iter().zip(columns))?;
    let expected = model.predict_batch(&batch)?;
    let classes = expected
        .column_by_name("prediction")
        .context("prediction")?
        .as_primitive::<Int64Type>();
    let mismatches = rows
        .iter()
        .enumerate()
        .filter(|(i, r)| r[FEATURES].as_i64() != Some(classes.value(*i)))
        .count();
    Ok((rows.len(), mismatches))
}

/// `1234567` as `1 234 567`.
fn grouped(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// An error, short enough for a table cell: its last 3 lines (a Python
/// traceback ends with the exception), 240 characters at most.
fn cell(e: &anyhow::Error) -> String {
    let full = format!("{e:#}");
    let lines: Vec<&str> = full.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let text = lines[lines.len().saturating_sub(3)..].join(" ").replace('|', "/");
    let chars: Vec<char> = text.chars().collect();
    match chars.len() > 240 {
        true => format!("…{}", chars[chars.len() - 240..].iter().collect::<String>()),
        false => text,
    }
}

#[derive(Default)]
struct Totals {
    seconds: f64,
    rows: u64,
    bytes: Option<u64>,
    runs: u64,
    failures: Vec<String>,
    sums: Vec<i64>,
    /// Not run at this size (above the relay cap).
    skipped: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let sizes: Vec<u64> = match args.next() {
        Some(list) => list
            .split(',')
            .map(|r| r.trim().replace('_', "").parse())
            .collect::<Result<_, _>>()?,
        None => vec![1_000_000, 10_000_000],
    };
    let reps: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(2);
    let python = std::env::var("KINDLING_EXECUTOR_PYTHON").unwrap_or_else(|_| "3.11".into());
    let transform = Transform::new().python_version(python);

    println!("load average at start: {}", load_average());
    let spark = session(&remote).await?;
    println!(
        "Arrow batches of {} rows to the executors' Python",
        arrow_batch_rows()
    );
    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::start(2, LocalClusterConfig::new(dir.path().join("cluster"))).await?;

    // 1. Train once, not timed.
    let started = Instant::now();
    let train = spark.sql(&training_query(TRAIN_ROWS)).await?;
    let model = TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![32] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.01))
        .features(feature_names())
        .label("y")
        .num_slots(2)
        .batch_size(256)
        .epochs(1)
        .eval_fraction(0.1)
        .seed(7)
        .local_mode(true)
        .progress(ProgressMode::Silent)
        .build()?
        .fit_on(&cluster, &train)
        .await?;
    let last = model.history().last().context("no epoch")?;
    println!(
        "trained in {:.1} s on {TRAIN_ROWS} rows: train loss {:.4}, eval accuracy {:?}",
        started.elapsed().as_secs_f64(),
        last.train_loss,
        last.eval_accuracy
    );
    let model_dir = dir.path().join("model");
    model.save(&model_dir)?;
    let model_dir = model_dir.to_string_lossy().into_owned();

    // The baseline computes what the model computes.
    let (checked, mismatches) = check_numpy(&remote, &model_dir, &model).await?;
    println!("numpy pandas_udf vs predict_batch on {checked} rows: {mismatches} different classes");
    anyhow::ensure!(mismatches == 0, "the numpy forward differs from the model");

    // Warm up the Rust ways (JIT, Python workers, module upload, serving);
    // the Python script warms its own session up before it times.
    for way in &WAYS[..2] {
        let o = run_way(&spark, &remote, &model, &transform, way, WARMUP_ROWS).await?;
        anyhow::ensure!(o.n == WARMUP_ROWS as i64, "{way} warm-up: {} rows", o.n);
    }

    println!("load average before: {}", load_average());
    println!();
    println!(
        "| rows | rep | way | seconds | rows/s | bytes through the client | bytes/row | sum(prediction) |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    let mut totals: BTreeMap<(u64, usize), Totals> = BTreeMap::new();
    for &rows in &sizes {
        for rep in 1..=reps {
            for k in 0..WAYS.len() {
                let which = (k + rep - 1) % WAYS.len();
                let way = WAYS[which];
                // A way that failed at a size (predict_into_spark's local
                // relation at 10M rows: minutes of the server's GC, then an
                // OutOfMemoryError) is not tried again at that size.
                if !totals.get(&(rows, which)).is_none_or(|t| t.failures.is_empty()) {
                    println!(
                        "| {} | {rep} | {way} | skipped | — | — | — | failed in an earlier repetition |",
                        grouped(rows)
                    );
                    continue;
                }
                if way == "predict_into_spark" && rows > relay_max_rows() {
                    println!(
                        "| {} | {rep} | {way} | not run | — | — | — | above KINDLING_BENCH_RELAY_MAX_ROWS = {}: \
                         the server's 4 GiB heap cannot hold its local relation |",
                        grouped(rows),
                        grouped(relay_max_rows())
                    );
                    totals.entry((rows, which)).or_default().skipped = true;
                    continue;
                }
                let started = Instant::now();
                let outcome = match way {
                    "pandas_udf" => run_pandas(&remote, &model_dir, rows).await,
                    _ => run_way(&spark, &remote, &model, &transform, way, rows).await,
                };
                let elapsed = started.elapsed().as_secs_f64();
                let outcome = outcome.and_then(|o| {
                    anyhow::ensure!(o.n == rows as i64, "count(*) = {}, expected {rows}", o.n);
                    Ok(o)
                });
                let t = totals.entry((rows, which)).or_default();
                match outcome {
                    Ok(o) => {
                        let bytes = o.client_bytes.map_or("— (another process)".into(), grouped);
                        let per_row = o
                            .client_bytes
                            .map_or("—".into(), |b| format!("{:.2}", b as f64 / rows as f64));
                        println!(
                            "| {} | {rep} | {way} | {:.2} | {} | {bytes} | {per_row} | {} |",
                            grouped(rows),
                            o.seconds,
                            grouped((rows as f64 / o.seconds) as u64),
                            grouped(o.sum as u64)
                        );
                        t.seconds += o.seconds;
                        t.rows += rows;
                        t.runs += 1;
                        t.sums.push(o.sum);
                        if let Some(b) = o.client_bytes {
                            t.bytes = Some(t.bytes.unwrap_or(0) + b);
                        }
                    }
                    Err(e) => {
                        eprintln!("{} rows, rep {rep}, {way} failed: {e:#}", grouped(rows));
                        println!(
                            "| {} | {rep} | {way} | failed after {elapsed:.0} s | — | — | — | {} |",
                            grouped(rows),
                            cell(&e)
                        );
                        t.failures.push(format!("after {elapsed:.0} s: {}", cell(&e)));
                        // Let the server settle before the next way.
                        tokio::time::sleep(std::time::Duration::from_secs(FAILURE_PAUSE_SECS)).await;
                    }
                }
            }
        }
    }
    println!();
    println!("load average after: {}", load_average());
    println!();
    println!("| rows | way | mean rows/s | bytes through the client per run | runs ok |");
    println!("|---:|---|---:|---:|---:|");
    let rate = |t: &Totals| (t.runs > 0).then(|| t.rows as f64 / t.seconds);
    let mut problems = Vec::new();
    for &rows in &sizes {
        for (which, way) in WAYS.iter().enumerate() {
            let t = &totals[&(rows, which)];
            if t.skipped {
                println!("| {} | {way} | not run | — | — |", grouped(rows));
                continue;
            }
            println!(
                "| {} | {way} | {} | {} | {}/{} |",
                grouped(rows),
                rate(t).map_or("—".into(), |r| grouped(r as u64)),
                t.bytes
                    .filter(|_| t.runs > 0)
                    .map_or("—".into(), |b| grouped(b / t.runs)),
                t.runs,
                reps
            );
        }
    }
    println!();
    for &rows in &sizes {
        let [tr, pis, pandas] = [0, 1, 2].map(|w| &totals[&(rows, w)]);
        let ratio = |a: &Totals, b: &Totals| match (rate(a), rate(b)) {
            (Some(a), Some(b)) => format!("{:.2}×", a / b),
            _ => "— (a way failed or was not run)".into(),
        };
        println!(
            "{} rows: transform / predict_into_spark {} rows/s; transform / pandas_udf {} rows/s",
            grouped(rows),
            ratio(tr, pis),
            ratio(tr, pandas)
        );
        // The same rows and the same weights: the same sum of classes.
        let reference = tr.sums.first().or(pis.sums.first()).copied();
        for (way, t) in WAYS.iter().zip([tr, pis, pandas]) {
            for s in &t.sums {
                if let Some(r) = reference
                    && (s - r).abs() > 0
                {
                    let line = format!(
                        "{} rows: {way} sum {s} differs from {r} by {}",
                        grouped(rows),
                        s - r
                    );
                    println!("{line}");
                    if (s - r).abs() > SUM_TOLERANCE {
                        problems.push(line);
                    }
                }
            }
            for f in &t.failures {
                println!("{} rows: {way} failed: {f}", grouped(rows));
            }
        }
        if let Some(r) = reference {
            let all = [tr, pis, pandas].iter().all(|t| t.sums.iter().all(|s| *s == r));
            if all {
                println!("{} rows: every run's sum(prediction) = {r}", grouped(rows));
            }
        }
    }
    cluster.shutdown().await;
    if let Err(e) = spark.stop().await {
        eprintln!("releasing the session: {e}");
    }
    anyhow::ensure!(problems.is_empty(), "sums differ: {problems:?}");
    Ok(())
}
