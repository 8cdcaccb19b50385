//! Benchmark: feed the same DataFrame into local agents by driver relay and by
//! executor push, in one run; print rows/s of the feed and the data bytes that
//! flowed through this client process for each.
//!
//! ```text
//! deploy/local/spark-connect.sh start
//! cargo run --release -p kindling --example bench_feed -- sc://127.0.0.1:15002 2000000 3
//! ```
//!
//! Arguments: Spark Connect URL, rows, repetitions (each repetition runs both
//! feeds, alternating which goes first). The executors need Python with pyarrow;
//! their version comes from env `KINDLING_EXECUTOR_PYTHON` (default 3.11).

use kindling::SparkSession;
use kindling::job::{ExecutorPush, Feed, ProgressMode, TrainingEvent, TrainingJob};
use kindling_schemas::spec::{ModelSpec, Task};

// Only `load_average` here; the other benchmarks use the rest.
#[allow(dead_code)]
mod common;
use common::load_average;

/// 8 float features and a label over 8 partitions, computed by Spark.
fn query(rows: u64) -> String {
    let features: Vec<String> = (1..=8)
        .map(|i| format!("CAST(rand({i}) AS FLOAT) AS x{i}"))
        .collect();
    format!(
        "SELECT {}, CAST(id % 2 AS INT) AS y FROM range(0, {rows}, 1, 8)",
        features.join(", ")
    )
}

struct Run {
    feed: &'static str,
    rows: u64,
    seconds: f64,
    client_bytes: u64,
}

async fn run(df: &kindling::DataFrame, feed: Feed) -> anyhow::Result<Run> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    TrainingJob::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .features((1..=8).map(|i| format!("x{i}")))
        .label("y")
        .num_slots(2)
        .epochs(1)
        .batch_size(4096)
        .local_mode(true)
        .progress(ProgressMode::Silent)
        .events(tx)
        .feed(feed)
        .build()?
        .fit(df)
        .await?;
    while let Ok(e) = rx.try_recv() {
        if let TrainingEvent::Fed {
            rows_per_shard,
            feed,
            client_bytes,
            seconds,
            ..
        } = e
        {
            return Ok(Run {
                feed,
                rows: rows_per_shard.iter().sum(),
                seconds,
                client_bytes,
            });
        }
    }
    anyhow::bail!("the job reported no fed split")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let rows: u64 = args.next().map(|r| r.parse()).transpose()?.unwrap_or(2_000_000);
    let reps: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(3);
    let python = std::env::var("KINDLING_EXECUTOR_PYTHON").unwrap_or_else(|_| "3.11".into());

    let spark = SparkSession::connect(&remote).await?;
    let df = spark.sql(&query(rows)).await?;
    // Warm up both paths (JIT, Python workers, the session's module upload).
    let small = spark.sql(&query(20_000)).await?;
    run(&small, Feed::DriverRelay).await?;
    let push = || Feed::ExecutorPush(ExecutorPush::new().python_version(python.clone()));
    run(&small, push()).await?;

    println!("load average before: {}", load_average());
    println!("| rep | feed | rows | seconds | rows/s | bytes through the client | bytes/row |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut totals = [(0.0f64, 0u64, 0u64); 2];
    for rep in 1..=reps {
        let order = if rep % 2 == 1 { [0, 1] } else { [1, 0] };
        for which in order {
            let feed = if which == 0 { Feed::DriverRelay } else { push() };
            let r = run(&df, feed).await?;
            anyhow::ensure!(r.rows == rows, "{}: {} rows fed, expected {rows}", r.feed, r.rows);
            println!(
                "| {rep} | {} | {} | {:.2} | {:.0} | {} | {:.2} |",
                r.feed,
                r.rows,
                r.seconds,
                r.rows as f64 / r.seconds,
                r.client_bytes,
                r.client_bytes as f64 / r.rows as f64
            );
            totals[which].0 += r.seconds;
            totals[which].1 += r.rows;
            totals[which].2 += r.client_bytes;
        }
    }
    let rate = |t: (f64, u64, u64)| t.1 as f64 / t.0;
    println!();
    println!("| feed | mean rows/s | bytes through the client per run |");
    println!("|---|---:|---:|");
    for (name, t) in ["driver relay", "executor push"].iter().zip(totals) {
        println!("| {name} | {:.0} | {} |", rate(t), t.2 / reps as u64);
    }
    println!(
        "executor push / driver relay: {:.2}× rows/s, {:.5}× client bytes",
        rate(totals[1]) / rate(totals[0]),
        totals[1].2 as f64 / totals[0].2.max(1) as f64
    );
    println!("load average after: {}", load_average());
    Ok(())
}
