//! The `train`, `predict` and `status` subcommands of the `kindling` binary.
//! (Agents and the rendezvous run as their own binaries, `kindling-agent`
//! and `kindling-rendezvous`.)

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use arrow::array::RecordBatch;
use futures::StreamExt;
use kindling::job::{ProgressMode, ServingCluster, TrainedModel, TrainingJob, Transform};
use kindling::spark::{DataFrame, SparkSession};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_schemas::spec::{ModelSpec, Precision, Task};
use kindling_schemas::tls::{Tls, TlsFiles};

mod evaluate;
mod export;
mod options;
mod tune;

pub use evaluate::{EvaluateArgs, evaluate};
pub use export::{ExportArgs, export};
pub use tune::{TuneArgs, tune};

/// Where the input rows come from.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct Input {
    /// A Spark SQL query.
    #[arg(long)]
    pub sql: Option<String>,
    /// A table or view name.
    #[arg(long)]
    pub table: Option<String>,
    /// A CSV file or directory (header row, schema inferred).
    #[arg(long)]
    pub csv: Option<String>,
    /// A Parquet file or directory.
    #[arg(long)]
    pub parquet: Option<String>,
}

impl Input {
    async fn dataframe(&self, spark: &SparkSession) -> Result<DataFrame> {
        Ok(if let Some(q) = &self.sql {
            spark.sql(q).await.context("running the query")?
        } else if let Some(t) = &self.table {
            spark.table(t)
        } else if let Some(p) = &self.csv {
            spark
                .read()
                .option("header", "true")
                .option("inferSchema", "true")
                .csv([p])
        } else if let Some(p) = &self.parquet {
            spark.read().parquet([p])
        } else {
            bail!("give one of --sql, --table, --csv, --parquet")
        })
    }
}

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
    /// Rendezvous of a cluster (implies not --local).
    #[arg(long, env = "KINDLING_RENDEZVOUS")]
    pub rendezvous: Option<String>,
    /// File holding the cluster's bearer token.
    #[arg(long, env = "KINDLING_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
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
    #[command(flatten)]
    pub training: options::TrainingOptions,
    /// Where to save the trained model.
    #[arg(long, short)]
    pub output: PathBuf,
}

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
    /// Predict on the Spark executors with this cluster's agents
    /// (`TrainedModel::transform`): the model is served on its live agents and
    /// each task sends its partition to one, so with `table:` or `parquet:` no
    /// row passes through this process. Without it the model runs here and
    /// every row does.
    #[arg(long, env = "KINDLING_RENDEZVOUS")]
    pub rendezvous: Option<String>,
    /// File holding the cluster's bearer token (with --rendezvous).
    #[arg(long, env = "KINDLING_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
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

/// `kindling status [JOB]`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// A job to show in detail: its attempts and their causes, and per
    /// epoch its losses, accuracy and throughput, with a sparkline of the loss.
    pub job: Option<String>,
    /// Rendezvous URL.
    #[arg(long, env = "KINDLING_RENDEZVOUS", default_value = "http://127.0.0.1:7070")]
    pub rendezvous: String,
    /// File holding the bearer token.
    #[arg(long, env = "KINDLING_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// How the CLI dials a cluster's rendezvous and agents over TLS.
#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// CA bundle that signs the rendezvous' and agents' certificates (PEM);
    /// needed for https:// URLs.
    #[arg(long, env = "KINDLING_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate for clusters that require one (mutual TLS): PEM.
    #[arg(long, env = "KINDLING_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert: PEM.
    #[arg(long, env = "KINDLING_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Name the certificate of a server dialled by IP address is checked
    /// against (the agents' shared certificate); a server dialled by name is
    /// checked against its name.
    #[arg(long, env = "KINDLING_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Send the token over plaintext http:// to other machines (a network you trust only).
    #[arg(long, env = "KINDLING_ALLOW_PLAINTEXT_TOKEN")]
    pub allow_plaintext_token: bool,
}

impl TlsArgs {
    /// Channel settings with this TLS material.
    pub fn channel(&self) -> Result<ChannelConfig> {
        let tls = Tls::load(TlsFiles {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
            client_auth: false,
            server_name: self.tls_server_name.clone().filter(|n| !n.is_empty()),
        })?;
        Ok(ChannelConfig::default()
            .with_tls(tls)
            .with_plaintext_token(self.allow_plaintext_token))
    }
}

/// The token in `--token-file` (trailing whitespace ignored), if given.
fn read_token(path: &Option<PathBuf>) -> Result<Option<Token>> {
    Ok(Token::read(path.as_deref(), None)?)
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
    let model = job(&args)?.fit(&df).await.context("training")?;
    model.save(&args.output)?;
    report_model(&model);
    println!("model saved to {}", args.output.display());
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
        .channel(args.tls.channel()?)
        .progress(ProgressMode::Auto)
        .local_mode(args.local || args.rendezvous.is_none());
    if let Some(r) = &args.rendezvous {
        builder = builder.rendezvous(r.clone());
    }
    if let Some(addr) = args.status_addr {
        builder = builder.status_addr(addr);
    }
    if let Some(m) = args.min_slots {
        builder = builder.min_slots(m);
    }
    if let Some(column) = &args.split_by {
        builder = builder.eval_split_by(column.clone());
    }
    if let Some(t) = read_token(&args.token_file)? {
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

/// Runs `kindling predict`.
pub async fn predict(args: PredictArgs) -> Result<()> {
    let output = PredictOutput::parse(&args.output)?;
    let model = TrainedModel::load(&args.model)?;
    let spark = SparkSession::connect(&args.remote)
        .await
        .context("connecting to Spark Connect")?;
    let df = args.input.dataframe(&spark).await?;
    // On the executors: a lazy DataFrame whose tasks call the agents.
    let (model, on_agents) = match &args.rendezvous {
        Some(url) => {
            let serving = ServingCluster {
                rendezvous: url.clone(),
                token: read_token(&args.token_file)?,
                channel: args.tls.channel()?,
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

/// Runs `kindling status`.
pub async fn status(args: StatusArgs) -> Result<()> {
    let token = read_token(&args.token_file)?;
    let channel = args.tls.channel()?;
    let rv = RendezvousClient::connect_with(args.rendezvous.clone(), token.as_ref(), &channel)
        .await
        .with_context(|| format!("connecting to the rendezvous at {}", args.rendezvous))?;
    if let Some(job) = &args.job {
        return job_status(&rv, job, token.as_ref(), &channel).await;
    }
    let agents = rv.list_agents().await?;
    println!("{} live agents", agents.len());
    for a in agents {
        println!(
            "  {:<24} {:<32} node {:<16} gpu {:<5} models {}",
            a.agent_id,
            a.flight_address,
            a.node_name,
            a.has_gpu,
            a.models.join(",")
        );
    }
    let jobs = rv.list_jobs().await?;
    println!("{} jobs", jobs.len());
    for j in jobs {
        println!(
            "  {:<24} {:?} attempt {}/{} members {}",
            j.job_id,
            j.state,
            j.attempt,
            j.max_attempts,
            j.members.len()
        );
        if let Some(cause) = j.first_cause() {
            println!("    first failure: {cause}");
        }
    }
    Ok(())
}

/// `kindling status JOB`: the rendezvous' view (state, attempts, every
/// failure's cause), then the per-epoch history one of its agents keeps.
async fn job_status(
    rv: &RendezvousClient,
    job: &str,
    token: Option<&kindling_schemas::auth::Token>,
    channel: &kindling_schemas::channel::ChannelConfig,
) -> Result<()> {
    let j = rv
        .status(job)
        .await
        .with_context(|| format!("job `{job}` at the rendezvous"))?;
    println!(
        "{}: {:?}, attempt {}/{}, {} of {} members",
        j.job_id,
        j.state,
        j.attempt,
        j.max_attempts,
        j.members.len(),
        j.num_slots
    );
    for f in &j.failures {
        println!("  attempt {} failed ({}): {}", f.attempt, f.agent_id, f.cause);
    }
    let agents = rv.list_agents().await?;
    let member = agents.iter().find(|a| j.members.contains(&a.agent_id));
    let Some(member) = member else {
        println!("  no live member agent holds the job's history");
        return Ok(());
    };
    let agent = kindling::feed::AgentClient::connect_with(&member.flight_address, token, channel)?;
    let s = agent
        .job_status(job)
        .await
        .with_context(|| format!("job `{job}` on agent {}", member.agent_id))?;
    println!(
        "  on {}: {:?}, epoch {}/{}, step {}/{}",
        member.agent_id, s.state, s.epoch, s.epochs, s.step, s.steps_per_epoch
    );
    if s.history.is_empty() {
        println!("  no epoch completed yet");
        return Ok(());
    }
    // Every other eval metric an epoch reported, as a column each.
    let names: std::collections::BTreeSet<&String> =
        s.history.iter().flat_map(|h| h.metrics.keys()).collect();
    let extra: String = names
        .iter()
        .map(|n| format!(" {:>12}", n.trim_start_matches("eval_")))
        .collect();
    println!(
        "  epoch  train loss   eval loss   accuracy         lr   samples/s     wall s       rows{extra}"
    );
    for h in &s.history {
        let metrics: String = names
            .iter()
            .map(|n| {
                h.metrics
                    .get(*n)
                    .map_or(format!(" {:>12}", "-"), |v| format!(" {v:>12.4}"))
            })
            .collect();
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.4}"));
        // The best epoch of the monitored metric (early stopping) is starred.
        let mark = if s.best_epoch == Some(h.epoch) { "*" } else { " " };
        println!(
            "  {:>5}{mark} {:>10.4}  {:>10}  {:>9}  {:>9}  {:>10.0}  {:>9}  {:>9}{metrics}",
            h.epoch,
            h.train_loss,
            opt(h.eval_loss),
            opt(h.eval_accuracy),
            h.learning_rate.map_or("-".to_owned(), |lr| format!("{lr:.2e}")),
            h.samples_per_sec,
            h.wall_secs.map_or("-".to_owned(), |w| format!("{w:.2}")),
            h.rows
        );
    }
    if let Some(best) = s.best_epoch {
        println!("  best epoch {best} (*)");
    }
    if let Some(epoch) = s.stopped_early {
        println!("  early stopping ended training after epoch {epoch}");
    }
    let losses: Vec<f64> = s.history.iter().map(|h| h.train_loss).collect();
    println!("  train loss {}", sparkline(&losses));
    for e in &s.events {
        println!("  {}", kindling::job::agent_log_line(job, e));
    }
    Ok(())
}

/// `values` as a line of block characters, lowest to highest.
pub fn sparkline(values: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
        (l.min(v), h.max(v))
    });
    values
        .iter()
        .map(|&v| {
            if !v.is_finite() {
                return '?';
            }
            let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
            BARS[((t * 7.0).round() as usize).min(7)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{PredictOutput, sparkline};

    #[test]
    fn a_sparkline_spans_the_range() {
        assert_eq!(sparkline(&[1.0, 0.5, 0.25, 0.0]), "█▅▃▁");
        assert_eq!(sparkline(&[2.0, 2.0]), "▅▅");
        assert_eq!(sparkline(&[1.0, f64::NAN, 0.0]), "█?▁");
        assert_eq!(sparkline(&[]), "");
    }

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
