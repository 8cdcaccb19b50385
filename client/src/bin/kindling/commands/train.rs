//! `kindling train`: a job from flags, trained on a query's or a file's rows
//! and saved. `kindling tune` builds its trials' job the same way.

use std::path::PathBuf;

use super::{ClusterArgs, Input, options};
use anyhow::{Context, Result, bail};
use kindling::job::{ProgressMode, TrainedModel, TrainingJob};
use kindling::spark::SparkSession;
use kindling_schemas::spec::{ModelSpec, Precision, Task};

/// `kindling train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Spark Connect URL.
    #[arg(long, env = "SPARK_REMOTE", default_value = "sc://127.0.0.1:15002")]
    pub remote: String,
    #[command(flatten)]
    pub input: Input,
    /// Feature columns, comma-separated, in input order.
    #[arg(long, value_delimiter = ',', required = true)]
    pub features: Vec<String>,
    /// Label column.
    #[arg(long)]
    pub label: String,
    /// `classification:<classes>` or `regression`.
    #[arg(long, default_value = "classification:2")]
    pub task: String,
    /// `linear`, `mlp:<h1>,<h2>,…`, or `cnn:<c>x<h>x<w>:<conv1>,<conv2>:<dense>`.
    #[arg(long, default_value = "mlp:64")]
    pub model: String,
    /// Passes over the data.
    #[arg(long, default_value_t = 5)]
    pub epochs: u32,
    /// Rows per step on each agent.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Agents training together.
    #[arg(long, default_value_t = 2)]
    pub slots: u32,
    /// Run the rendezvous and agents in this process.
    #[arg(long)]
    pub local: bool,
    /// With --local: where the in-process rendezvous and its status page
    /// listen (a loopback address, e.g. 127.0.0.1:8080; default a free port).
    #[arg(long)]
    pub status_addr: Option<std::net::SocketAddr>,
    /// Train on GPUs.
    #[arg(long)]
    pub gpu: bool,
    /// With --gpu, mixed precision: bf16 compute (f16 where the GPU has no
    /// bf16), f32 master weights and all-reduce.
    #[arg(long, requires = "gpu")]
    pub bf16: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Fraction of rows held out for evaluation (0: none).
    #[arg(long, default_value_t = 0.2)]
    pub eval_fraction: f64,
    /// Hold out the eval rows by a hash of this column's value and --seed
    /// (an integer or string column without nulls, e.g. an id; it need not
    /// be a feature): the same rows whatever order Spark returns them in.
    /// Default: Spark's random split, which moves with the rows' order.
    #[arg(long, value_name = "COLUMN")]
    pub split_by: Option<String>,
    /// Seed of the initial weights, the shuffle and the eval split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seconds the job outlives this process if it dies without cleaning up
    /// (the rendezvous then cancels it and frees its agents).
    #[arg(long, default_value_t = 30.0)]
    pub client_lease_secs: f64,
    /// Seconds to wait for a replacement when an agent is lost and no spare
    /// is live (its pod restarting on its node, or a new node's agent).
    #[arg(long, default_value_t = 120.0)]
    pub replacement_wait_secs: f64,
    /// Elastic shrink: the fewest agents the job may go on with when no
    /// replacement comes (default: --slots, no shrink).
    #[arg(long)]
    pub min_slots: Option<u32>,
    /// Elastic growth: the most agents the job may grow to when agents join
    /// while it trains (default: --slots, no growth; driver relay feed; with
    /// --detach, while `kindling wait` follows the job).
    #[arg(long)]
    pub max_slots: Option<u32>,
    #[command(flatten)]
    pub training: options::TrainingOptions,
    /// The job's id (default: a fresh `kindling-…`).
    #[arg(long)]
    pub job_id: Option<String>,
    /// Return once every row is fed and committed, printing the job's id on
    /// stdout, and leave the job training on the cluster without this
    /// process (`kindling wait JOB`, `kindling fetch JOB -o DIR`). Needs
    /// --rendezvous.
    #[arg(long, requires = "rendezvous", conflicts_with = "local")]
    pub detach: bool,
    /// Where to save the trained model (not with --detach).
    #[arg(long, short, required_unless_present = "detach", conflicts_with = "detach")]
    pub output: Option<PathBuf>,
}

fn parse_task(s: &str) -> Result<Task> {
    match s.split_once(':') {
        None if s == "regression" => Ok(Task::Regression),
        Some(("classification", n)) => Ok(Task::Classification {
            num_classes: n.parse().context("--task classes")?,
        }),
        _ => bail!("--task must be `classification:<classes>` or `regression`, got `{s}`"),
    }
}

fn list(s: &str, what: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .with_context(|| format!("{what}: `{v}` is not a number"))
        })
        .collect()
}

fn parse_model(s: &str) -> Result<ModelSpec> {
    let mut parts = s.split(':');
    Ok(match parts.next() {
        Some("linear") => ModelSpec::Linear,
        Some("mlp") => ModelSpec::Mlp {
            hidden: list(parts.next().unwrap_or("64"), "--model mlp widths")?,
        },
        Some("cnn") => {
            let dims = list(
                &parts.next().unwrap_or_default().replace('x', ","),
                "--model cnn image",
            )?;
            let [channels, height, width] = dims[..] else {
                bail!("--model cnn needs <c>x<h>x<w>")
            };
            let conv = list(parts.next().unwrap_or("8,16"), "--model cnn conv")?;
            let dense = parts
                .next()
                .unwrap_or("64")
                .parse()
                .context("--model cnn dense")?;
            ModelSpec::Cnn {
                channels,
                height,
                width,
                conv,
                dense,
            }
        }
        _ => bail!("--model must be linear, mlp:<widths> or cnn:<c>x<h>x<w>:<convs>:<dense>, got `{s}`"),
    })
}

/// Runs `kindling train`.
pub async fn train(args: TrainArgs) -> Result<()> {
    let spark = SparkSession::connect(&args.remote)
        .await
        .context("connecting to Spark Connect")?;
    let df = args.input.dataframe(&spark).await?;
    let job = job(&args)?;
    let Some(output) = &args.output else {
        let handle = job.submit(&df).await.context("submitting the job")?;
        // The id alone on stdout, for `JOB=$(kindling train --detach ...)`.
        println!("{}", handle.job_id());
        return Ok(());
    };
    let model = job.fit(&df).await.context("training")?;
    model.save(output)?;
    report_model(&model);
    println!("model saved to {}", output.display());
    Ok(())
}

/// The job `kindling train`'s (and `kindling tune`'s) flags describe.
pub fn job(args: &TrainArgs) -> Result<TrainingJob> {
    let builder = TrainingJob::builder()
        .model(parse_model(&args.model)?)
        .task(parse_task(&args.task)?)
        .features(args.features.clone())
        .label(args.label.clone())
        .epochs(args.epochs)
        .batch_size(args.batch_size)
        .num_slots(args.slots)
        .use_gpu(args.gpu)
        .precision(if args.bf16 {
            Precision::Bf16
        } else {
            Precision::F32
        })
        .eval_fraction(args.eval_fraction)
        .seed(args.seed);
    let mut builder = args
        .training
        .apply(builder)?
        .client_lease(
            std::time::Duration::try_from_secs_f64(args.client_lease_secs)
                .context("--client-lease-secs must be a non-negative number of seconds")?,
        )
        .replacement_wait(
            std::time::Duration::try_from_secs_f64(args.replacement_wait_secs)
                .context("--replacement-wait-secs must be a non-negative number of seconds")?,
        )
        .channel(args.cluster.channel()?)
        .progress(ProgressMode::Auto)
        .local_mode(args.local || args.cluster.rendezvous.is_none());
    if let Some(r) = &args.cluster.rendezvous {
        builder = builder.rendezvous(r.clone());
    }
    if let Some(addr) = args.status_addr {
        builder = builder.status_addr(addr);
    }
    if let Some(id) = &args.job_id {
        builder = builder.job_id(id.clone());
    }
    if let Some(m) = args.min_slots {
        builder = builder.min_slots(m);
    }
    if let Some(m) = args.max_slots {
        builder = builder.max_slots(m);
    }
    if let Some(column) = &args.split_by {
        builder = builder.eval_split_by(column.clone());
    }
    if let Some(t) = args.cluster.token()? {
        builder = builder.token(t);
    }
    Ok(builder.build()?)
}

/// What a trained model reached, in one line.
pub fn report_model(model: &TrainedModel) {
    // The saved weights are the best epoch's when early stopping kept it.
    let kept = model
        .best_epoch()
        .and_then(|e| model.history().iter().find(|m| m.epoch == e))
        .or(model.history().last());
    if let Some(kept) = kept {
        let mut acc = kept
            .eval_accuracy
            .map(|a| format!(", eval accuracy {:.2}%", a * 100.0))
            .unwrap_or_default();
        if let Some(f1) = kept.metrics.get("eval_f1_macro") {
            acc.push_str(&format!(", macro F1 {f1:.4}"));
        }
        let best = match model.best_epoch() {
            Some(e) => format!("; the model is epoch {e}'s (best)"),
            None => String::new(),
        };
        println!(
            "trained {} epochs{best}: train loss {:.4}{acc}",
            model.history().len(),
            kept.train_loss
        );
    }
}
