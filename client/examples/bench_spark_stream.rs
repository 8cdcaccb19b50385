//! Benchmark: stream one query through this client and through PySpark Connect's
//! `toArrow()` in the same run; print rows/s and peak RSS for both.
//!
//! ```text
//! deploy/local/spark-connect.sh start
//! cargo run --release -p kindling --example bench_spark_stream -- sc://127.0.0.1:15002 10000000
//! ```

use std::process::Command;
use std::time::Instant;

use futures::TryStreamExt;
use kindling::spark::SparkSession;

/// Wide rows (8 columns) over many partitions.
fn query(rows: u64) -> String {
    format!(
        "SELECT id, id * 0.5D AS a, id % 97 AS b, sqrt(id) AS c, id * 3 AS d, \
         cast(id AS double) / 7 AS e, concat('row-', id) AS s, id % 2 = 0 AS even \
         FROM range(0, {rows}, 1, 16)"
    )
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

const PYSPARK: &str = r#"
import resource, sys, time
from pyspark.sql import SparkSession
remote, rows, sql = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spark = SparkSession.builder.remote(remote).getOrCreate()
spark.sql("SELECT 1").collect()
start = time.perf_counter()
table = spark.sql(sql).toArrow()
elapsed = time.perf_counter() - start
assert table.num_rows == rows, table.num_rows
print(f"{elapsed} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
"#;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let rows: u64 = args.next().map(|r| r.parse()).transpose()?.unwrap_or(10_000_000);
    let sql = query(rows);

    // This client.
    let spark = SparkSession::connect(&remote).await?;
    spark.sql("SELECT 1").await?.collect().await?;
    let start = Instant::now();
    let mut stream = spark.sql(&sql).await?.execute_stream().await?;
    let mut seen = 0u64;
    while let Some(batch) = stream.try_next().await? {
        seen += batch.num_rows() as u64;
    }
    let rust_secs = start.elapsed().as_secs_f64();
    anyhow::ensure!(seen == rows, "kindling saw {seen} rows");
    let rust_rss_mb = peak_rss_kb() as f64 / 1024.0;

    // PySpark Connect toArrow(), measured inside its own process.
    let python = format!(
        "{}/.cache/kindling/venv/bin/python",
        std::env::var("HOME").unwrap_or_default()
    );
    let out = Command::new(&python)
        .current_dir(std::env::temp_dir())
        .args(["-c", PYSPARK, &remote, &rows.to_string(), &sql])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "pyspark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut fields = text.split_whitespace();
    let py_secs: f64 = fields.next().unwrap_or("nan").parse()?;
    let py_rss_mb = fields.next().unwrap_or("0").parse::<f64>()? / 1024.0;

    let (rust_rate, py_rate) = (rows as f64 / rust_secs, rows as f64 / py_secs);
    println!("query: {rows} rows x 8 columns, 16 partitions");
    println!("| client | seconds | rows/s | peak RSS (MiB) |");
    println!("|---|---:|---:|---:|");
    println!("| kindling execute_stream | {rust_secs:.2} | {rust_rate:.0} | {rust_rss_mb:.0} |");
    println!("| PySpark Connect toArrow() | {py_secs:.2} | {py_rate:.0} | {py_rss_mb:.0} |");
    println!(
        "| ratio (kindling / PySpark) | | {:.2}x | {:.3}x |",
        rust_rate / py_rate,
        rust_rss_mb / py_rss_mb
    );
    Ok(())
}
