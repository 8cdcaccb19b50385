//! Benchmark: choosing a model's options — a search of N trials on one feed
//! of a Spark query vs N separate `fit`s of the same query, and ASHA vs every
//! trial to the end — in one run, on the same local cluster, rows and trials.
//!
//! - **N fits**: `TrainingJob::fit_on` once per trial (its options set on the
//!   builder), `P` at a time: each runs the query and feeds its rows.
//! - **search, all to the end**: `TrainingJob::search_on` with the same N
//!   trials, `P` at a time, every trial every epoch: the query runs once.
//! - **search, ASHA**: the same, ASHA with its first rung at 1 epoch, η = 3.
//!
//! ```text
//! deploy/local/spark-connect.sh start
//! export CARGO_TARGET_DIR=$HOME/.cache/kindling/target
//! cargo run --release -p kindling --features local --example bench_search -- sc://127.0.0.1:15002 1000000 16 4 2
//! ```
//!
//! Arguments: Spark Connect URL, rows, trials N, epochs, trials at once P,
//! the ETL: `plain` (the generated rows) or `join` (each row's bucket of
//! 1,000 joined with that bucket's means of two features, a group-by over
//! every row, and the features centred on them: feature engineering as
//! ETL does it).
//! Spark's CPU is the Spark Connect server's process (driver and local
//! executors: the query, persisting, splitting and streaming its rows),
//! read from `/proc` when `deploy/local/spark-connect.sh` runs it on this
//! machine. The trials: learning rate log-uniform in [1e-4, 3e-2), hidden
//! layer 16, 32 or 64 units, drawn with seed 7; an MLP over 8 float
//! features, 2 classes, batch 512 per agent, a 0.1 eval split ranking trials
//! by eval loss, 2 agents (`LocalCluster` in this process).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use futures::StreamExt;
use kindling::SparkSession;
use kindling::job::{ProgressMode, Search, SearchSpace, TrainingJob, TrialOutcome};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};
use serde_json::Value;

#[allow(dead_code)]
mod common;
use common::{cpu_seconds, load_average, process_cpu_seconds, spark_pid};

const FEATURES: usize = 8;

/// One way's figures.
struct Row {
    way: &'static str,
    wall: f64,
    spark_cpu: Option<f64>,
    client_cpu: f64,
    to_the_end: usize,
    stopped: usize,
    best: f64,
}

fn feature_names() -> Vec<String> {
    (1..=FEATURES).map(|i| format!("x{i}")).collect()
}

fn builder(epochs: u32) -> kindling::job::TrainingJobBuilder {
    TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![32] })
        .task(Task::Classification { num_classes: 2 })
        .features(feature_names())
        .label("y")
        .num_slots(2)
        .batch_size(512)
        .epochs(epochs)
        .eval_fraction(0.1)
        .seed(1)
        .local_mode(true)
        .progress(ProgressMode::Silent)
}

/// The job of one trial's options, for a `fit` of its own.
fn trial_job(epochs: u32, options: &BTreeMap<String, Value>) -> anyhow::Result<TrainingJob> {
    let lr = options["lr"].as_f64().context("lr")?;
    let hidden: Vec<usize> = serde_json::from_value(options["hidden"].clone())?;
    Ok(builder(epochs)
        .optimizer(OptimizerSpec::adam(lr))
        .model(ModelSpec::Mlp { hidden })
        .build()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_owned());
    let remote = arg(0, "sc://127.0.0.1:15002");
    let rows: u64 = arg(1, "1000000").parse()?;
    let trials: usize = arg(2, "16").parse()?;
    let epochs: u32 = arg(3, "4").parse()?;
    let parallel: usize = arg(4, "2").parse()?;
    let spark = SparkSession::connect(&remote).await?;
    let jvm = spark_pid(&remote, None);
    let features: Vec<String> = (1..=FEATURES)
        .map(|i| format!("CAST(rand({i}) * 2 - 1 AS FLOAT) AS x{i}"))
        .collect();
    let etl = arg(5, "plain");
    let base = format!("SELECT id, {} FROM range(0, {rows}, 1, 8)", features.join(", "));
    let label = "CAST(x1 + 2 * x2 - x3 + 0.5 * x4 > x5 * x6 AS INT) AS y";
    let sql = match etl.as_str() {
        // The rows as generated.
        "plain" => format!("SELECT {}, {label} FROM ({base})", feature_names().join(", ")),
        // Feature engineering as ETL does it: each row's bucket (of 1,000)
        // joined with that bucket's mean of x1 and x2 (a group-by over all
        // rows), the features centred on them.
        "join" => format!(
            "WITH r AS ({base}), b AS (SELECT id % 1000 AS bucket, avg(x1) AS m1, avg(x2) AS m2 FROM r GROUP BY id % 1000) \
             SELECT CAST(x1 - m1 AS FLOAT) AS x1, CAST(x2 - m2 AS FLOAT) AS x2, {}, {label} \
             FROM r JOIN b ON r.id % 1000 = b.bucket",
            feature_names()[2..].join(", ")
        ),
        other => anyhow::bail!("ETL {other}: `plain` or `join`"),
    };
    let df = spark.sql(&sql).await?;
    let space = SearchSpace::new().log_uniform("lr", 1e-4, 3e-2).choice(
        "hidden",
        [
            serde_json::json!([16]),
            serde_json::json!([32]),
            serde_json::json!([64]),
        ],
    );
    let drawn = space.trials(Some(trials), 7)?;
    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::start(2, LocalClusterConfig::new(dir.path())).await?;
    // Warm-up (not measured): the JVM compiles the query's code paths.
    trial_job(1, &drawn[0])?.fit_on(&cluster, &df).await?;

    let spark_cpu = || jvm.as_deref().map(process_cpu_seconds);
    let mut table = Vec::new();
    let measure = |way: &'static str, start: (Instant, Option<f64>, f64)| {
        move |to_the_end, stopped, best| Row {
            way,
            wall: start.0.elapsed().as_secs_f64(),
            spark_cpu: spark_cpu().zip(start.1).map(|(now, then)| now - then),
            client_cpu: cpu_seconds() - start.2,
            to_the_end,
            stopped,
            best,
        }
    };

    eprintln!("{trials} separate fits, {parallel} at a time");
    let done = measure("separate fits", (Instant::now(), spark_cpu(), cpu_seconds()));
    let jobs = drawn
        .iter()
        .map(|o| trial_job(epochs, o))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let fits: Vec<_> = jobs.iter().map(|j| j.fit_on(&cluster, &df)).collect();
    let models: Vec<_> = futures::stream::iter(fits)
        .buffer_unordered(parallel)
        .collect()
        .await;
    let best = models
        .iter()
        .filter_map(|m| m.as_ref().ok())
        .filter_map(|m| m.history().iter().filter_map(|h| h.eval_loss).reduce(f64::min))
        .fold(f64::INFINITY, f64::min);
    table.push(done(models.iter().filter(|m| m.is_ok()).count(), 0, best));

    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let job = builder(epochs).events(tx).build()?;
    for (way, search) in [
        (
            "search, all to the end",
            Search::new(space.clone()).trials(trials).seed(7),
        ),
        (
            "search, ASHA (1 epoch, η 3)",
            Search::new(space.clone()).trials(trials).seed(7).asha(1, 3),
        ),
    ] {
        eprintln!("{way}");
        let done = measure(way, (Instant::now(), spark_cpu(), cpu_seconds()));
        let result = job.search_on(&cluster, &df, &search.parallel(parallel)).await?;
        eprintln!("{}", result.table());
        let mut fed = 0.0;
        while let Ok(event) = rx.try_recv() {
            if let kindling::job::TrainingEvent::Fed { seconds, .. } = event {
                fed += seconds;
            }
        }
        eprintln!(
            "{way}: the dataset fed in {fed:.1} s of its {:.1} s",
            result.elapsed.as_secs_f64()
        );
        let count = |f: fn(&TrialOutcome) -> bool| result.trials.iter().filter(|t| f(&t.outcome)).count();
        let best = result.best_trial().and_then(|t| t.best).map_or(f64::NAN, |b| b.0);
        table.push(done(
            count(|o| *o == TrialOutcome::Finished),
            count(|o| matches!(o, TrialOutcome::Stopped { .. })),
            best,
        ));
    }
    cluster.shutdown().await;

    println!(
        "\n{rows} rows, {FEATURES} float features, ETL {etl}, {trials} trials (lr log-uniform, hidden 16/32/64), \
         {epochs} epochs, {parallel} at a time, 2 agents; load {}",
        load_average()
    );
    println!(
        "| way | wall s | Spark server CPU s | client + agents CPU s | trials to the end | stopped | best eval loss |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &table {
        let spark = r.spark_cpu.map_or("n/a".into(), |c| format!("{c:.1}"));
        println!(
            "| {} | {:.1} | {spark} | {:.1} | {} | {} | {:.4} |",
            r.way, r.wall, r.client_cpu, r.to_the_end, r.stopped, r.best
        );
    }
    let base = &table[0];
    for r in &table[1..] {
        let spark = match (r.spark_cpu, base.spark_cpu) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
            _ => "n/a".into(),
        };
        println!(
            "{}: wall {:.2}× the separate fits', Spark CPU {spark}",
            r.way,
            r.wall / base.wall
        );
    }
    Ok(())
}
