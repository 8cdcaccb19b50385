//! `kindling`: the command-line front end of the Kindling client.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use clap::{Parser, Subcommand, ValueEnum};
use futures::TryStreamExt;
use kindling::spark::SparkSession;

mod commands;

/// Kindling: Spark ETL streamed as Arrow into training agents.
#[derive(Debug, Parser)]
#[command(name = "kindling", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// One subcommand per task.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run a Spark SQL query through Spark Connect and stream its result.
    Sql(SqlArgs),
    /// Train a model on a Spark query, table or file (local mode or a cluster).
    Train(Box<commands::TrainArgs>),
    /// Search a model's options on one feed of the rows: many trials, the
    /// weak ones stopped early; saves the best trial's model.
    Tune(Box<commands::TuneArgs>),
    /// Predict with a saved model over a Spark query, table or file.
    Predict(commands::PredictArgs),
    /// Score a saved model on a Spark query, table or file (every metric).
    Evaluate(commands::EvaluateArgs),
    /// Show the agents and jobs a rendezvous knows.
    Status(commands::StatusArgs),
    /// List the jobs a rendezvous knows, detached ones marked.
    Jobs(commands::JobsArgs),
    /// Follow a job (one `train --detach` left running) to its end.
    Wait(commands::WaitArgs),
    /// Save a finished job's model from its agents.
    Fetch(commands::FetchArgs),
    /// Write a saved model as safetensors with PyTorch's names and layouts.
    Export(commands::ExportArgs),
}

#[derive(Debug, clap::Args)]
struct SqlArgs {
    /// Spark Connect URL, e.g. sc://127.0.0.1:15002/;token=...;use_ssl=true
    #[arg(long, env = "SPARK_REMOTE")]
    remote: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Write to this file instead of stdout.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// The SQL query.
    query: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Human-readable table, printed batch by batch.
    Table,
    /// CSV with a header row.
    Csv,
    /// JSON lines, one object per row.
    Json,
    /// Arrow IPC stream.
    Arrow,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(io::stderr)
        .init();
    match Cli::parse().command {
        Command::Sql(args) => sql(args).await,
        Command::Train(args) => commands::train(*args).await,
        Command::Tune(args) => commands::tune(*args).await,
        Command::Predict(args) => commands::predict(args).await,
        Command::Evaluate(args) => commands::evaluate(args).await,
        Command::Status(args) => commands::status(args).await,
        Command::Jobs(args) => commands::jobs(args).await,
        Command::Wait(args) => commands::wait(args).await,
        Command::Fetch(args) => commands::fetch(args).await,
        Command::Export(args) => commands::export(args),
    }
}

async fn sql(args: SqlArgs) -> Result<()> {
    let spark = SparkSession::connect(&args.remote)
        .await
        .with_context(|| format!("connecting to {}", redact(&args.remote)))?;
    let df = spark.sql(&args.query).await.context("running the query")?;
    let mut stream = df.execute_stream().await.context("running the query")?;
    let out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(File::create(path).with_context(|| format!("creating {}", path.display()))?),
        None => Box::new(io::stdout().lock()),
    };
    let mut sink = Sink::new(args.format, stream.schema(), BufWriter::new(out))?;
    let mut rows = 0usize;
    while let Some(batch) = stream.try_next().await.context("reading the result")? {
        rows += batch.num_rows();
        sink.write(&batch)?;
    }
    sink.finish()?;
    if args.output.is_some() || args.format == Format::Table {
        eprintln!("{rows} row(s)");
    }
    Ok(())
}

fn redact(url: &str) -> String {
    kindling::spark::RemoteUrl::parse(url)
        .map(|u| u.to_string())
        .unwrap_or_else(|_| "the given URL".into())
}

/// Writes batches in the chosen format as they arrive.
enum Sink<W: Write> {
    Table(W),
    Csv(Box<arrow::csv::Writer<W>>),
    Json(arrow::json::LineDelimitedWriter<W>),
    Arrow(arrow::ipc::writer::StreamWriter<W>),
}

impl<W: Write> Sink<W> {
    fn new(format: Format, schema: SchemaRef, out: W) -> Result<Self> {
        Ok(match format {
            Format::Table => Sink::Table(out),
            Format::Csv => Sink::Csv(Box::new(
                arrow::csv::WriterBuilder::new().with_header(true).build(out),
            )),
            Format::Json => Sink::Json(arrow::json::LineDelimitedWriter::new(out)),
            Format::Arrow => Sink::Arrow(arrow::ipc::writer::StreamWriter::try_new(out, &schema)?),
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            Sink::Table(out) => {
                writeln!(
                    out,
                    "{}",
                    arrow::util::pretty::pretty_format_batches(std::slice::from_ref(batch))?
                )?;
                out.flush()?;
            }
            Sink::Csv(w) => w.write(batch)?,
            Sink::Json(w) => w.write(batch)?,
            Sink::Arrow(w) => w.write(batch)?,
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        match self {
            Sink::Table(mut out) => out.flush()?,
            Sink::Csv(w) => w.into_inner().flush()?,
            Sink::Json(mut w) => {
                w.finish()?;
                w.into_inner().flush()?;
            }
            Sink::Arrow(mut w) => {
                w.finish()?;
                w.into_inner()?.flush()?;
            }
        }
        Ok(())
    }
}
