//! Time to a trained model: Kindling streaming vs the intermediate-storage
//! pipeline it replaces, on the same ETL, the same model and the same local
//! cluster, at two data sizes (N and 10N).
//!
//! - **kindling**: `TrainingJob::fit(&df)` — Spark executes the ETL and the rows
//!   stream through this process (the driver relay) into 2 agents.
//! - **parquet**: Spark writes the ETL's result as Parquet (`df.write().parquet`),
//!   then this process reads the files back (the `parquet` crate) and trains the
//!   same model on the same agents with `TrainingJob::fit_arrow`.
//!
//! Each (pipeline, size) runs in a fresh client process, against a fresh local
//! cluster (rendezvous + 2 agents, `LocalCluster`) in a process of its own, so
//! the client's peak RSS is the client's alone (in `local_mode` the agents'
//! caches would share its address space) and the agents' disk writes are
//! counted from `/proc/<pid>/io`. The CPU seconds of the client, of the
//! agents' process and (when its process is on this machine) of the Spark
//! Connect server are reported per run.
//!
//! A third run per size measures what no streaming pipeline can beat: Spark
//! executing the same ETL and streaming it to a client that drops every batch
//! (no agents, no training). Its time over the Parquet path's "data in agents"
//! time is the ratio the two pipelines would have if training cost nothing.
//!
//! Before the first measured run, the server executes the ETL once each way
//! (streamed and written as Parquet, N rows, not measured), so that neither
//! pipeline pays for the JVM compiling Spark's code paths.
//!
//! ```text
//! cargo run --release -p kindling --features bench-parquet --example bench_pipeline -- sc://127.0.0.1:15002 500000 \
//!     [--batch-size 512] [--epochs 2] [--partitions 8] [--spark-pid PID] [--spark-cpus LIST]
//! ```
//!
//! `--spark-pid` defaults to the pid `deploy/local/spark-connect.sh` recorded
//! for a server on 127.0.0.1. `--spark-cpus 0` pins the Spark server (all its
//! threads) to CPU 0 and runs the client and the agents on the other CPUs, as a
//! cluster gives executors and agents CPU requests of their own; the server's
//! affinity is restored at the end.
//!
//! Dataset: a synthetic binary classification in Spark from `range`: 16
//! pseudo-random float features in [-0.5, 0.5) (multiplicative hashing of the
//! id), label = 1 when a fixed weighted sum of them is positive.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use arrow::array::AsArray;
use arrow::datatypes::{Int32Type, Int64Type};
use futures::{FutureExt, StreamExt};
use kindling::SparkSession;
use kindling::functions::{col, lit, when};
use kindling::job::{ProgressMode, TrainedModel, TrainingEvent, TrainingJob};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling::spark::{DataFrame, RecordBatchStream, SaveMode};
use kindling_schemas::auth::Token;
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

mod common;
use common::{cpu_seconds, load_average, proc_field, process_cpu_seconds, spark_pid};

const FEATURES: usize = 16;
/// Spark partitions of the ETL unless `--partitions` says otherwise.
const PARTITIONS: i32 = 8;
/// Passes over the data unless `--epochs` says otherwise.
const EPOCHS: u32 = 2;
const HOLDOUT: i64 = 20_000;
/// Rows per batch read back from Parquet (the reader's default is 1,024).
const PARQUET_BATCH_ROWS: usize = 65_536;

fn feature_names() -> Vec<String> {
    (0..FEATURES).map(|i| format!("f{i}")).collect()
}

/// The ETL: `rows` rows from `start` in `partitions` Spark partitions,
/// features and a label with a known rule.
fn dataset(spark: &SparkSession, start: i64, rows: i64, partitions: i32) -> DataFrame {
    let mut columns = Vec::new();
    let mut score = lit(0.0);
    for (i, name) in feature_names().into_iter().enumerate() {
        let multiplier = 2_654_435_761i64 + 40_503 * i as i64;
        let x = ((col("id") * lit(multiplier) + lit(977 * i as i64)) % lit(1_000_003i64)).cast("double")
            / lit(1_000_003.0)
            - lit(0.5);
        let weight = if i % 2 == 0 {
            1.0 + i as f64 / 8.0
        } else {
            -(1.0 + i as f64 / 16.0)
        };
        score = score + x.clone() * lit(weight);
        columns.push((name, x.cast("float")));
    }
    columns.push(("label".into(), when(score.gt(lit(0.0)), lit(1)).otherwise(lit(0))));
    let names: Vec<String> = feature_names().into_iter().chain(["label".into()]).collect();
    spark
        .range_partitions(start, start + rows, 1, Some(partitions))
        .with_columns(columns)
        .select(names.iter().map(String::as_str))
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Test accuracy of `model` on rows the training never saw.
async fn holdout_accuracy(spark: &SparkSession, model: &TrainedModel) -> anyhow::Result<f64> {
    let batches = dataset(spark, 1_000_000_000, HOLDOUT, PARTITIONS)
        .collect()
        .await?;
    let (mut correct, mut total) = (0usize, 0usize);
    for batch in &batches {
        let predicted = model.predict_batch(batch)?;
        let labels = batch
            .column_by_name("label")
            .context("label")?
            .as_primitive::<Int32Type>();
        let predictions = predicted
            .column_by_name("prediction")
            .context("prediction")?
            .as_primitive::<Int64Type>();
        for i in 0..labels.len() {
            total += 1;
            correct += usize::from(i64::from(labels.value(i)) == predictions.value(i));
        }
    }
    Ok(correct as f64 / total.max(1) as f64)
}

/// Reads every Parquet file of `dir` (in name order) on a blocking thread.
fn read_parquet(files: Vec<PathBuf>) -> RecordBatchStream {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        for file in files {
            let reader = std::fs::File::open(&file)
                .map_err(|e| arrow::error::ArrowError::IoError(format!("{}", file.display()), e))
                .and_then(|f| {
                    ParquetRecordBatchReaderBuilder::try_new(f)
                        .and_then(|b| b.with_batch_size(PARQUET_BATCH_ROWS).build())
                        .map_err(|e| arrow::error::ArrowError::ExternalError(Box::new(e)))
                });
            let reader = match reader {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e.into()));
                    return;
                }
            };
            for batch in reader {
                if tx.blocking_send(batch.map_err(Into::into)).is_err() {
                    return;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// What `--client` runs: one pipeline at one size (the arguments `measure`
/// passes, in order).
struct ClientRun {
    pipeline: String,
    remote: String,
    rows: i64,
    rendezvous: String,
    token: String,
    batch_size: usize,
    partitions: i32,
    epochs: u32,
}

impl ClientRun {
    fn parse(args: &[String]) -> anyhow::Result<ClientRun> {
        let arg = |i: usize| {
            args.get(i)
                .cloned()
                .with_context(|| format!("--client argument {i} missing"))
        };
        Ok(ClientRun {
            pipeline: arg(0)?,
            remote: arg(1)?,
            rows: arg(2)?.parse()?,
            rendezvous: arg(3)?,
            token: arg(4)?,
            batch_size: arg(5)?.parse()?,
            partitions: arg(6)?.parse()?,
            epochs: arg(7)?.parse()?,
        })
    }
}

/// One pipeline at one size, in this (fresh) process; prints one JSON line.
async fn run_client(run: ClientRun) -> anyhow::Result<()> {
    let ClientRun {
        pipeline,
        remote,
        rows,
        rendezvous,
        token,
        batch_size,
        partitions,
        epochs,
    } = run;
    let spark = SparkSession::connect(&remote).await?;
    match pipeline.as_str() {
        "stream" => return stream_only(&spark, rows, partitions).await,
        "warmup" => return warm_up(&spark, rows, partitions).await,
        _ => {}
    }
    let (events_tx, mut events_rx) = tokio::sync::mpsc::channel(1024);
    let job = job(&rendezvous, Token::new(token), batch_size, epochs, events_tx)?;
    let fed_at = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let fed = fed_at.clone();
    tokio::spawn(async move {
        while let Some(event) = events_rx.recv().await {
            if let TrainingEvent::Fed { split: "train", .. } = event {
                *fed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            }
        }
    });
    let df = dataset(&spark, 0, rows, partitions);
    let started = Instant::now();
    let cpu_before = cpu_seconds();
    let (model, written_at, parquet_bytes) = match pipeline.as_str() {
        "kindling" => (job.fit(&df).await?, None, 0),
        "parquet" => {
            let dir = std::env::temp_dir().join(format!("kindling-bench-parquet-{}", std::process::id()));
            write_parquet(&df, &dir).await?;
            let written = Instant::now();
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                .collect();
            files.sort();
            if files.is_empty() {
                bail!("Spark wrote no Parquet files into {}", dir.display());
            }
            let bytes = dir_bytes(&dir);
            let schema = {
                let f = std::fs::File::open(&files[0])?;
                ParquetRecordBatchReaderBuilder::try_new(f)?.schema().clone()
            };
            let model = job
                .fit_arrow(schema, || {
                    let files = files.clone();
                    async move { Ok(read_parquet(files)) }.boxed()
                })
                .await?;
            std::fs::remove_dir_all(&dir)?;
            (model, Some(written), bytes)
        }
        other => bail!("unknown pipeline {other}"),
    };
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let fed = fed_at
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map(|t| (t - started).as_secs_f64());
    let accuracy = holdout_accuracy(&spark, &model).await?;
    let trained_rows: u64 = model.history().first().map(|e| e.rows).unwrap_or(0);
    let line = serde_json::json!({
        "wall": wall,
        "written": written_at.map(|t| (t - started).as_secs_f64()),
        "fed": fed,
        "parquet_bytes": parquet_bytes,
        "client_rss": proc_field("self", "status", "VmHWM:"),
        "client_cpu": cpu,
        "accuracy": accuracy,
        "rank_rows": trained_rows,
        "loss": model.history().last().map(|e| e.train_loss),
    });
    println!("RESULT {line}");
    Ok(())
}

/// The floor of the streaming path: Spark executes the same ETL and streams
/// it to this process, which drops every batch (no agents, no training).
async fn stream_only(spark: &SparkSession, rows: i64, partitions: i32) -> anyhow::Result<()> {
    let started = Instant::now();
    let received = drain(&dataset(spark, 0, rows, partitions)).await?;
    if received != rows {
        bail!("the stream ended after {received} of {rows} rows");
    }
    let line = serde_json::json!({ "wall": started.elapsed().as_secs_f64() });
    println!("RESULT {line}");
    Ok(())
}

/// Runs the ETL once each way, streamed and written as Parquet, so that the
/// measured runs find the server's code paths compiled by the JVM.
async fn warm_up(spark: &SparkSession, rows: i64, partitions: i32) -> anyhow::Result<()> {
    let df = dataset(spark, 0, rows, partitions);
    drain(&df).await?;
    let dir = tempfile_dir("warmup")?;
    write_parquet(&df, &dir).await?;
    std::fs::remove_dir_all(&dir)?;
    println!("RESULT {{}}");
    Ok(())
}

/// Streams `df` from Spark and drops every batch; returns the rows received.
async fn drain(df: &DataFrame) -> anyhow::Result<i64> {
    let mut stream = df.execute_stream().await?;
    let mut received = 0;
    while let Some(batch) = stream.next().await {
        received += batch?.num_rows() as i64;
    }
    Ok(received)
}

/// Has Spark write `df` as Parquet files into `dir` (replacing what is there).
async fn write_parquet(df: &DataFrame, dir: &Path) -> anyhow::Result<()> {
    let path = dir.to_str().context("temp dir path")?;
    df.write().mode(SaveMode::Overwrite).parquet(path).await?;
    Ok(())
}

/// The same job for both pipelines, on the cluster at `rendezvous`.
fn job(
    rendezvous: &str,
    token: Token,
    batch_size: usize,
    epochs: u32,
    events: tokio::sync::mpsc::Sender<TrainingEvent>,
) -> anyhow::Result<TrainingJob> {
    Ok(TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![32] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.01))
        .features(feature_names())
        .label("label")
        .epochs(epochs)
        .batch_size(batch_size)
        .num_slots(2)
        .seed(7)
        .eval_fraction(0.0)
        .persist(false)
        .local_mode(false)
        .rendezvous(rendezvous)
        .token(token)
        .progress(ProgressMode::Silent)
        .events(events)
        .build()?)
}

/// A local cluster (rendezvous + 2 agents) in this process until stdin closes.
async fn serve_cluster(dir: &str) -> anyhow::Result<()> {
    let config = LocalClusterConfig::new(dir);
    let token = config.token.clone().context("local cluster token")?;
    let cluster = LocalCluster::start(2, config).await?;
    println!("CLUSTER {} {}", cluster.rendezvous_url(), token.expose());
    std::io::stdout().flush()?;
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin()
            .read_line(&mut sink)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
    .await?;
    cluster.shutdown().await;
    Ok(())
}

struct Measured {
    result: serde_json::Value,
    cluster_rss: u64,
    cluster_disk_writes: u64,
    /// Bytes left under the agents' `spill/` and `checkpoints/` after the job.
    spill_bytes: u64,
    checkpoint_bytes: u64,
    /// CPU seconds the agents' process used (start-up, ingest, training).
    cluster_cpu: f64,
    /// CPU seconds the Spark Connect server used while the client ran, when
    /// its process is on this machine.
    spark_cpu: Option<f64>,
}

/// Where the client and the agents run, and where the Spark server is.
struct Setup<'a> {
    remote: &'a str,
    partitions: i32,
    batch_size: usize,
    epochs: u32,
    spark_pid: Option<&'a str>,
    /// The CPUs the client and agents are pinned to (`taskset -c`), if any.
    trainer_cpus: Option<&'a str>,
}

impl Setup<'_> {
    /// This program, run again (under `taskset` when the trainer side is pinned).
    fn command(&self) -> anyhow::Result<Command> {
        let exe = std::env::current_exe()?;
        Ok(match self.trainer_cpus {
            Some(cpus) => {
                let mut command = Command::new("taskset");
                command.args(["-c", cpus]).arg(exe);
                command
            }
            None => Command::new(exe),
        })
    }
}

/// Runs `pipeline` at `rows` in a fresh client process; the two pipelines
/// get a fresh local cluster in a process of its own.
fn measure(pipeline: &str, rows: i64, setup: &Setup<'_>) -> anyhow::Result<Measured> {
    let Setup {
        remote,
        partitions,
        batch_size,
        epochs,
        spark_pid,
        ..
    } = *setup;
    let dir = tempfile_dir(&format!("cluster-{pipeline}-{rows}"))?;
    let mut cluster = None;
    let (mut url, mut token) = (String::new(), String::new());
    if matches!(pipeline, "kindling" | "parquet") {
        let mut child = setup
            .command()?
            .args(["--serve-cluster", dir.to_str().context("dir")?])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("cluster stdout")?).read_line(&mut line)?;
        let mut parts = line.split_whitespace().skip(1);
        url = parts.next().context("cluster url")?.to_string();
        token = parts.next().context("cluster token")?.to_string();
        cluster = Some(child);
    }
    let spark_before = spark_pid.map(process_cpu_seconds);
    let client = setup
        .command()?
        .args([
            "--client",
            pipeline,
            remote,
            &rows.to_string(),
            &url,
            &token,
            &batch_size.to_string(),
            &partitions.to_string(),
            &epochs.to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()?;
    let spark_cpu = spark_pid
        .zip(spark_before)
        .map(|(pid, before)| process_cpu_seconds(pid) - before);
    let stdout = String::from_utf8_lossy(&client.stdout);
    let result = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .with_context(|| format!("{pipeline} at {rows} rows failed: {}", client.status))?;
    let result: serde_json::Value = serde_json::from_str(result)?;
    let mut measured = Measured {
        result,
        cluster_rss: 0,
        cluster_disk_writes: 0,
        spill_bytes: dir_bytes(&dir.join("spill")),
        checkpoint_bytes: dir_bytes(&dir.join("checkpoints")),
        cluster_cpu: 0.0,
        spark_cpu,
    };
    if let Some(mut cluster) = cluster {
        let pid = cluster.id().to_string();
        measured.cluster_rss = proc_field(&pid, "status", "VmHWM:");
        measured.cluster_disk_writes = proc_field(&pid, "io", "write_bytes:");
        measured.cluster_cpu = process_cpu_seconds(&pid);
        drop(cluster.stdin.take());
        cluster.wait()?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(measured)
}

/// The CPUs of a `taskset -c` style list ("0", "0-3,6").
fn parse_cpu_list(list: &str) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) = (first.trim().parse()?, last.trim().parse()?);
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

/// `taskset` with `args`; fails with its stderr.
fn taskset(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("taskset")
        .args(args)
        .output()
        .context("running taskset (util-linux)")?;
    if !out.status.success() {
        bail!(
            "taskset {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every thread of the Spark server pinned to some CPUs, until dropped; then
/// the affinity it had is restored.
struct PinnedSpark {
    pid: String,
    mask: String,
}

impl PinnedSpark {
    fn pin(pid: &str, cpus: &str) -> anyhow::Result<Self> {
        // "pid 42's current affinity mask: 3"
        let current = taskset(&["-p", pid])?;
        let mask = current
            .rsplit(':')
            .next()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .with_context(|| format!("no affinity mask in {current:?}"))?
            .to_string();
        taskset(&["-a", "-p", "-c", cpus, pid])?;
        Ok(Self {
            pid: pid.to_string(),
            mask,
        })
    }
}

impl Drop for PinnedSpark {
    fn drop(&mut self) {
        if let Err(e) = taskset(&["-a", "-p", &self.mask, &self.pid]) {
            eprintln!("could not restore the Spark server's CPU affinity: {e:#}");
        }
    }
}

/// The CPUs left to the client and agents when Spark has `spark_cpus`, as a list.
fn trainer_cpus(spark_cpus: &str) -> anyhow::Result<String> {
    let allowed = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(str::to_string))
        .context("no Cpus_allowed_list in /proc/self/status")?;
    let spark = parse_cpu_list(spark_cpus)?;
    let rest: Vec<String> = parse_cpu_list(&allowed)?
        .into_iter()
        .filter(|c| !spark.contains(c))
        .map(|c| c.to_string())
        .collect();
    if rest.is_empty() {
        bail!(
            "--spark-cpus {spark_cpus} leaves no CPU of {} for the client and agents",
            allowed.trim()
        );
    }
    Ok(rest.join(","))
}

fn tempfile_dir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kindling-bench-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Runtime::new()?;
    match args.first().map(String::as_str) {
        Some("--serve-cluster") => return runtime.block_on(serve_cluster(&args[1])),
        Some("--client") => return runtime.block_on(run_client(ClientRun::parse(&args[1..])?)),
        _ => {}
    }
    drop(runtime);
    let mut explicit_pid = None;
    let mut spark_cpus = None;
    let mut batch_size = 512usize;
    let mut epochs = EPOCHS;
    let mut partitions = PARTITIONS;
    let mut positional = Vec::new();
    let mut rest = args.into_iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--spark-pid" => explicit_pid = Some(rest.next().context("--spark-pid needs a pid")?),
            "--partitions" => {
                partitions = rest.next().context("--partitions needs a number")?.parse()?;
            }
            "--spark-cpus" => spark_cpus = Some(rest.next().context("--spark-cpus needs a CPU list")?),
            "--batch-size" => {
                batch_size = rest.next().context("--batch-size needs a number")?.parse()?;
            }
            "--epochs" => epochs = rest.next().context("--epochs needs a number")?.parse()?,
            _ => positional.push(arg),
        }
    }
    let remote = positional
        .first()
        .cloned()
        .unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let n: i64 = positional
        .get(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(500_000);
    let spark = spark_pid(&remote, explicit_pid);
    let (_pinned, trainer_cpus) = match &spark_cpus {
        Some(cpus) => {
            let pid = spark
                .as_deref()
                .context("--spark-cpus needs the Spark server's pid (--spark-pid)")?;
            let trainer = trainer_cpus(cpus)?;
            (Some(PinnedSpark::pin(pid, cpus)?), Some(trainer))
        }
        None => (None, None),
    };
    let setup = Setup {
        remote: &remote,
        partitions,
        batch_size,
        epochs,
        spark_pid: spark.as_deref(),
        trainer_cpus: trainer_cpus.as_deref(),
    };
    let cpu = |s: Option<f64>| s.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "n/a".into());
    let placement = match (&spark_cpus, &trainer_cpus) {
        (Some(s), Some(t)) => format!("Spark server on CPU {s}, client and agents on CPU {t}"),
        _ => "all processes share every CPU".into(),
    };
    println!(
        "{FEATURES} float features + int label, {partitions} partitions, MLP [32], {epochs} epochs, batch {batch_size} per agent, 2 agents; {placement}; load {}; Spark server pid {}",
        load_average(),
        spark.as_deref().unwrap_or("unknown (its CPU is not reported)")
    );
    measure("warmup", n, &setup)?;
    println!(
        "| rows | pipeline | wall to model | data in agents at | dataset bytes written | agents' disk writes (spill / checkpoints left) | client peak RSS | client CPU | agents' CPU | Spark server CPU | agents' peak RSS | holdout accuracy |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut floors = Vec::new();
    for rows in [n, 10 * n] {
        let mut walls = Vec::new();
        let mut fed = Vec::new();
        for pipeline in ["kindling", "parquet"] {
            let m = measure(pipeline, rows, &setup)?;
            let r = &m.result;
            let wall = r["wall"].as_f64().unwrap_or(f64::NAN);
            let written = r["written"]
                .as_f64()
                .map(|w| format!(" (Parquet written at {w:.1} s)"));
            println!(
                "| {rows} | {pipeline} | {wall:.1} s | {:.1} s{} | {} | {} ({} / {}) | {} | {:.2} s | {:.1} s | {} | {} | {:.2}% |",
                r["fed"].as_f64().unwrap_or(f64::NAN),
                written.unwrap_or_default(),
                mib(r["parquet_bytes"].as_u64().unwrap_or(0)),
                mib(m.cluster_disk_writes),
                mib(m.spill_bytes),
                mib(m.checkpoint_bytes),
                mib(r["client_rss"].as_u64().unwrap_or(0)),
                r["client_cpu"].as_f64().unwrap_or(f64::NAN),
                m.cluster_cpu,
                cpu(m.spark_cpu),
                mib(m.cluster_rss),
                100.0 * r["accuracy"].as_f64().unwrap_or(f64::NAN),
            );
            walls.push(wall);
            fed.push(r["fed"].as_f64().unwrap_or(f64::NAN));
        }
        // What no streaming client can beat: Spark streaming the same rows
        // to a client that drops them.
        let floor = measure("stream", rows, &setup)?;
        floors.push((rows, floor, walls, fed));
    }
    println!();
    println!(
        "| rows | Spark alone: ETL streamed to a client that drops it | its Spark server CPU | parquet: data in agents at | kindling / parquet if training were free (stream alone / parquet data in) | kindling / parquet wall time |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (rows, floor, walls, fed) in &floors {
        let stream = floor.result["wall"].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {rows} | {stream:.1} s | {} | {:.1} s | {:.2}× | **{:.2}×** |",
            cpu(floor.spark_cpu),
            fed[1],
            stream / fed[1],
            walls[0] / walls[1]
        );
    }
    Ok(())
}
