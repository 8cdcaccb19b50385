//! Benchmark: stream one query through this client and through PySpark Connect's
//! `toArrow()` in the same run; print rows/s, client CPU time and peak RSS for both,
//! on three queries (wide computed rows; the same rows cached in Spark; large values).
//!
//! Each query is measured twice: from the Spark server itself, and from a replay
//! of the responses Spark sent for it (`replay.rs`, a process of its own), where
//! the server's cost is out of the way and each client's own limit shows.
//!
//! ```text
//! deploy/local/spark-connect.sh start
//! cargo run --release -p kindling --example bench_spark_stream -- sc://127.0.0.1:15002 10000000 [query index]
//! ```

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
mod replay;

use common::{cpu_seconds, load_average, proc_field};

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use futures::TryStreamExt;
use kindling::spark::{SparkSession, memory_and_disk};

/// One benchmark query and why it is there.
struct Query {
    name: &'static str,
    sql: String,
    rows: u64,
    /// Cache it in Spark first (both clients then read the cached columns:
    /// Spark's cache is shared by every session of the server).
    cached: bool,
}

fn queries(rows: u64) -> Vec<Query> {
    let wide = |rows: u64| {
        format!(
            "SELECT id, id * 0.5D AS a, id % 97 AS b, sqrt(id) AS c, id * 3 AS d, \
             cast(id AS double) / 7 AS e, concat('row-', id) AS s, id % 2 = 0 AS even \
             FROM range(0, {rows}, 1, 16)"
        )
    };
    vec![
        // Wide rows computed by the server, many partitions.
        Query {
            name: "wide rows, 16 partitions",
            sql: wide(rows),
            rows,
            cached: false,
        },
        // The same rows cached in Spark: the server only re-encodes cached columns.
        Query {
            name: "same, cached in Spark",
            sql: wide(rows / 2),
            rows: rows / 2,
            cached: true,
        },
        // Large values: few rows, ~1 KiB of string each, 64 partitions.
        Query {
            name: "1 KiB strings, 64 partitions",
            sql: format!(
                "SELECT id, repeat(cast(id % 10 AS string), 1024) AS blob FROM range(0, {}, 1, 64)",
                rows / 20
            ),
            rows: rows / 20,
            cached: false,
        },
    ]
}

const PYSPARK: &str = r#"
import resource, sys, time
from pyspark.sql import SparkSession
remote, rows, sql = sys.argv[1], int(sys.argv[2]), sys.argv[3]
spark = SparkSession.builder.remote(remote).getOrCreate()
if sys.argv[4] == "warm":
    spark.sql("SELECT 1").collect()
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
cpu0, start = cpu(), time.perf_counter()
table = spark.sql(sql).toArrow()
elapsed, cpu1 = time.perf_counter() - start, cpu()
assert table.num_rows == rows, table.num_rows
print(f"{elapsed} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} {cpu1 - cpu0}")
"#;

/// (seconds, peak RSS MiB, CPU seconds) of one PySpark `toArrow()` in a fresh process.
fn pyspark(remote: &str, q: &Query, warm_up: bool) -> anyhow::Result<(f64, f64, f64)> {
    let python = format!(
        "{}/.cache/kindling/venv/bin/python",
        std::env::var("HOME").unwrap_or_default()
    );
    let out = Command::new(&python)
        .current_dir(std::env::temp_dir())
        .args(["-c", PYSPARK, remote, &q.rows.to_string(), &q.sql])
        .arg(if warm_up { "warm" } else { "cold" })
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "pyspark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let f: Vec<f64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(f.len() == 3, "unexpected pyspark output {text}");
    Ok((f[0], f[1] / 1024.0, f[2]))
}

/// (seconds, CPU seconds, Arrow bytes) of one pass of this client over `q`.
async fn rust_run(spark: &SparkSession, q: &Query) -> anyhow::Result<(f64, f64, usize)> {
    let (cpu0, start) = (cpu_seconds(), Instant::now());
    let mut stream = spark.sql(&q.sql).await?.execute_stream().await?;
    let (mut seen, mut bytes) = (0u64, 0usize);
    while let Some(batch) = stream.try_next().await? {
        seen += batch.num_rows() as u64;
        bytes += batch
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
            .sum::<usize>();
    }
    let (secs, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    anyhow::ensure!(seen == q.rows, "kindling saw {seen} rows of {}", q.rows);
    Ok((secs, cpu, bytes))
}

/// A replay of `q`'s responses (this program with `--serve-replay`), killed on drop.
struct ReplayServer {
    child: Child,
    remote: String,
}

impl ReplayServer {
    fn start(remote: &str, q: &Query) -> anyhow::Result<ReplayServer> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--serve-replay", remote, &q.sql])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let Some(port) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            anyhow::bail!("the replay server did not start: {line:?}");
        };
        Ok(ReplayServer {
            remote: format!("sc://127.0.0.1:{port}"),
            child,
        })
    }
}

impl Drop for ReplayServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--serve-replay REMOTE SQL`: record the query from the Spark server at REMOTE,
/// then serve the recording on a loopback port (printed as `listening on PORT`).
async fn serve_replay(remote: &str, sql: &str) -> anyhow::Result<()> {
    let endpoint = remote.replacen("sc://", "http://", 1);
    let endpoint = endpoint
        .split("/;")
        .next()
        .unwrap_or(&endpoint)
        .trim_end_matches('/');
    let recording = replay::Recording::record(endpoint, sql).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on {}", listener.local_addr()?.port());
    tonic::transport::Server::builder()
        .add_service(replay::Replay::new(recording))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await?;
    Ok(())
}

/// One query measured through both clients against one server: this client runs
/// before and after PySpark (A-B-A) and the two runs are averaged, so neither
/// client alone pays for a cold server (JIT, caches).
async fn measure(server: &str, remote: &str, q: &Query, warm_up: bool) -> anyhow::Result<()> {
    let spark = SparkSession::connect(remote).await?;
    let first = rust_run(&spark, q).await?;
    let (py_secs, py_rss, py_cpu) = pyspark(remote, q, warm_up)?;
    let second = rust_run(&spark, q).await?;
    let (secs, cpu, bytes) = ((first.0 + second.0) / 2.0, (first.1 + second.1) / 2.0, first.2);
    let rss = proc_field("self", "status", "VmHWM:") as f64 / (1u64 << 20) as f64;
    let mb = bytes as f64 / 1e6;
    let n = q.rows as f64;
    for (client, s, c, r) in [
        ("kindling", secs, cpu, rss),
        ("PySpark toArrow()", py_secs, py_cpu, py_rss),
    ] {
        println!(
            "| {} | {server} | {} | {client} | {s:.2} | {:.0} | {:.0} | {c:.2} | {:.3} | {r:.0} |",
            q.name,
            q.rows,
            n / s,
            mb / s,
            c * 1e6 / n,
        );
    }
    println!(
        "| {} | {server} | | ratio kindling/PySpark | | **{:.2}×** | | {:.2}× | | {:.3}× |",
        q.name,
        py_secs / secs,
        cpu / py_cpu,
        rss / py_rss
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("--serve-replay") {
        let (remote, sql) = (args.nth(1), args.next());
        let (Some(remote), Some(sql)) = (remote, sql) else {
            anyhow::bail!("usage: --serve-replay REMOTE SQL");
        };
        return serve_replay(&remote, &sql).await;
    }
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let rows: u64 = args.next().map(|r| r.parse()).transpose()?.unwrap_or(10_000_000);
    let only: Option<usize> = args.next().map(|r| r.parse()).transpose()?;
    println!("load average: {}", load_average());
    println!(
        "| query | server | rows | client | seconds | rows/s | MB/s (Arrow) | client CPU s | CPU µs/row | peak RSS MiB |"
    );
    println!("|---|---|---:|---|---:|---:|---:|---:|---:|---:|");

    let spark = SparkSession::connect(&remote).await?;
    spark.sql("SELECT 1").await?.collect().await?;
    for (i, q) in queries(rows).iter().enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let df = spark.sql(&q.sql).await?;
        if q.cached {
            df.persist(memory_and_disk()).await?;
            anyhow::ensure!(df.count().await? == q.rows as i64, "cache fill");
        }
        measure("Spark", &remote, q, true).await?;
        // The same responses again, from a replay that costs next to nothing.
        let replay = ReplayServer::start(&remote, q)?;
        measure("replay", &replay.remote, q, false).await?;
        drop(replay);
        if q.cached {
            df.unpersist(true).await?;
        }
    }
    Ok(())
}
