//! `kindling evaluate`: a saved model scored on a Spark query, table or
//! file (`TrainedModel::evaluate`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use kindling::job::TrainedModel;
use kindling::spark::SparkSession;

use super::Input;

/// Arguments of `kindling evaluate`.
#[derive(Debug, clap::Args)]
pub struct EvaluateArgs {
    /// Spark Connect URL.
    #[arg(long, env = "SPARK_REMOTE", default_value = "sc://127.0.0.1:15002")]
    pub remote: String,
    /// Model directory written by `kindling train`.
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub input: Input,
    /// Print the report as one JSON object (metrics by name, the confusion
    /// matrix) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `kindling evaluate`.
pub async fn evaluate(args: EvaluateArgs) -> Result<()> {
    let model = TrainedModel::load(&args.model)
        .with_context(|| format!("loading the model in {}", args.model.display()))?;
    let spark = SparkSession::connect(&args.remote)
        .await
        .context("connecting to Spark Connect")?;
    let df = args.input.dataframe(&spark).await?;
    let report = model.evaluate(&df).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("{} rows", report.rows);
    for (name, value) in &report.metrics {
        println!("{:<24} {value:.6}", name.trim_start_matches("eval_"));
    }
    if let Some(confusion) = report.confusion.as_ref().filter(|c| c.len() <= 20) {
        println!("confusion matrix (rows: label, columns: prediction)");
        for (label, row) in confusion.iter().enumerate() {
            let cells: Vec<String> = row.iter().map(|v| format!("{v:>7}")).collect();
            println!("{label:>5} {}", cells.join(" "));
        }
    }
    Ok(())
}
