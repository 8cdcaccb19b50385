//! `kindling predict`: a saved model's predictions for a query's rows,
//! printed, written to an Arrow file, or kept in Spark (a view, Parquet).

use std::path::PathBuf;

use super::{ClusterArgs, Input};
use anyhow::{Context, Result, bail};
use arrow::array::RecordBatch;
use futures::StreamExt;
use kindling::job::{ServingCluster, TrainedModel, Transform};
use kindling::spark::SparkSession;

/// `kindling predict`.
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// Spark Connect URL.
    #[arg(long, env = "SPARK_REMOTE", default_value = "sc://127.0.0.1:15002")]
    pub remote: String,
    /// Model directory written by `kindling train`.
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub input: Input,
    /// `print`, a path ending in `.arrow` (Arrow IPC file), `table:<name>` (a
    /// Spark temp view of this session), or `parquet:<path>` (written by Spark;
    /// fails if the path exists).
    #[arg(long, default_value = "print")]
    pub output: String,
    /// With --rendezvous: predict on the Spark executors with this
    /// cluster's agents (`TrainedModel::transform`): the model is served on
    /// its live agents and each task sends its partition to one, so with
    /// `table:` or `parquet:` no row passes through this process. Without it
    /// the model runs here and every row does.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// With --rendezvous: the executors' Python `major.minor` (default 3.11).
    #[arg(long)]
    pub executor_python: Option<String>,
}

/// Where `kindling predict` puts the predictions.
#[derive(Debug, PartialEq, Eq)]
enum PredictOutput<'a> {
    Print,
    ArrowFile(&'a str),
    View(&'a str),
    Parquet(&'a str),
}

impl<'a> PredictOutput<'a> {
    fn parse(s: &'a str) -> Result<Self> {
        let named = |prefix: &str, what: &str| -> Result<Option<&'a str>> {
            match s.strip_prefix(prefix) {
                Some("") => bail!("--output {s}: {what} is empty"),
                other => Ok(other),
            }
        };
        Ok(if s == "print" {
            PredictOutput::Print
        } else if let Some(view) = named("table:", "the view name")? {
            PredictOutput::View(view)
        } else if let Some(path) = named("parquet:", "the path")? {
            PredictOutput::Parquet(path)
        } else if s.ends_with(".arrow") {
            PredictOutput::ArrowFile(s)
        } else {
            bail!(
                "--output {s}: expected `print`, a path ending in .arrow, `table:<name>` or `parquet:<path>`"
            )
        })
    }
}

/// Runs `kindling predict`.
pub async fn predict(args: PredictArgs) -> Result<()> {
    let output = PredictOutput::parse(&args.output)?;
    let model = TrainedModel::load(&args.model)?;
    let spark = SparkSession::connect(&args.remote)
        .await
        .context("connecting to Spark Connect")?;
    let df = args.input.dataframe(&spark).await?;
    // On the executors: a lazy DataFrame whose tasks call the agents.
    let (model, on_agents) = match &args.cluster.rendezvous {
        Some(url) => {
            let serving = ServingCluster {
                rendezvous: url.clone(),
                token: args.cluster.token()?,
                channel: args.cluster.channel()?,
                local: false,
            };
            let mut how = Transform::new();
            if let Some(python) = &args.executor_python {
                how = how.python_version(python.clone());
            }
            let served = model.serve_on(serving);
            let out = served
                .transform_with(&df, &how)
                .await
                .with_context(|| format!("serving the model on the agents of {url}"))?;
            (served, Some(out))
        }
        None => (model, None),
    };
    let into_spark = async {
        Ok::<_, anyhow::Error>(match &on_agents {
            Some(out) => out.clone(),
            None => model.predict_into_spark(&spark, &df).await?,
        })
    };
    match output {
        PredictOutput::View(view) => {
            let out = into_spark.await?;
            out.create_or_replace_temp_view(view).await?;
            println!("{} predictions in temp view `{view}`", out.count().await?);
        }
        PredictOutput::Parquet(path) => {
            into_spark.await?.write().format("parquet").save(path).await?;
            let rows = spark.read().format("parquet").load([path]).count().await?;
            println!("{rows} predictions written to {path} (parquet)");
        }
        PredictOutput::Print | PredictOutput::ArrowFile(_) => {
            let mut stream: futures::stream::BoxStream<'_, Result<RecordBatch>> = match &on_agents {
                Some(out) => Box::pin(out.execute_stream().await?.map(|b| Ok(b?))),
                None => Box::pin(model.predict(&df).await?.map(|b| Ok(b?))),
            };
            let PredictOutput::ArrowFile(path) = output else {
                while let Some(batch) = stream.next().await {
                    println!("{}", arrow::util::pretty::pretty_format_batches(&[batch?])?);
                }
                return Ok(());
            };
            let mut writer: Option<arrow::ipc::writer::FileWriter<std::fs::File>> = None;
            let mut rows = 0;
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                if writer.is_none() {
                    let file = std::fs::File::create(path).with_context(|| format!("creating {path}"))?;
                    writer = Some(arrow::ipc::writer::FileWriter::try_new(file, &batch.schema())?);
                }
                rows += batch.num_rows();
                if let Some(w) = writer.as_mut() {
                    w.write(&batch)?;
                }
            }
            if let Some(mut w) = writer {
                w.finish()?;
            }
            println!("{rows} predictions written to {path}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::PredictOutput;

    #[test]
    fn predict_outputs_parse_and_malformed_ones_name_the_forms() {
        assert_eq!(
            PredictOutput::parse("print").expect("parses"),
            PredictOutput::Print
        );
        assert_eq!(
            PredictOutput::parse("p.arrow").expect("parses"),
            PredictOutput::ArrowFile("p.arrow")
        );
        assert_eq!(
            PredictOutput::parse("table:v").expect("parses"),
            PredictOutput::View("v")
        );
        assert_eq!(
            PredictOutput::parse("parquet:/tmp/p").expect("parses"),
            PredictOutput::Parquet("/tmp/p")
        );
        let empty = PredictOutput::parse("parquet:")
            .expect_err("malformed")
            .to_string();
        assert!(empty.contains("the path is empty"), "{empty}");
        let other = PredictOutput::parse("p.csv").expect_err("malformed").to_string();
        assert!(other.contains("`table:<name>` or `parquet:<path>`"), "{other}");
    }
}
