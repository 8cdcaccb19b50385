//! `kindling tune`: a search over `kindling train`'s job — one ETL, the
//! rows held on the agents, many trials trained on them.

use anyhow::{Context, Result, bail};
use kindling::Metric;
use kindling::job::{Search, SearchSpace};
use kindling::spark::SparkSession;

use super::TrainArgs;

/// The space's syntax, shown by `kindling tune --help`.
const SPACE_HELP: &str = "\
Search space (--space NAME=VALUES, once per option):
  NAME    an alias: lr (= learning_rate), optimizer, weight_decay, momentum,
          hidden, schedule, warmup_epochs; or a dotted path into the job
          spec's JSON: batch_size, epochs, accumulate, optimizer.beta1,
          model.config.width (a custom model's config field), ...
  VALUES  a|b|c          a list (each value JSON, else a string): 32|64|128,
                         adam|sgd, [64]|[128,64]
          low..high      uniform floats in [low, high)
          log:low..high  log-uniform floats (0 < low < high): learning rates
          int:low..high  integers, both ends included
A space of lists alone is a grid (every combination) unless --trials draws
at random. The columns, task, slots and device cannot vary: the trials share
one dataset. A space that cannot work (an empty range, an unknown option, a
value the spec refuses) is refused before anything is fed.

Example:
  kindling tune --local --sql 'SELECT * FROM t' --features x1,x2 --label y \\
    --epochs 9 --space lr=log:1e-4..1e-1 --space hidden=[32]|[128,64] \\
    --trials 16 --scheduler asha --parallel 4 --output best.model";

/// `kindling tune`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = SPACE_HELP)]
pub struct TuneArgs {
    #[command(flatten)]
    pub job: TrainArgs,
    /// An option and its values, `NAME=VALUES` (see below); repeat per option.
    #[arg(long = "space", required = true, value_name = "NAME=VALUES")]
    pub space: Vec<String>,
    /// Trials drawn at random from the space (default: the whole grid).
    #[arg(long)]
    pub trials: Option<usize>,
    /// Seed of the random draws.
    #[arg(long, default_value_t = 0)]
    pub search_seed: u64,
    /// `asha` (stop weak trials at rungs) or `all` (every trial to the end).
    #[arg(long, default_value = "asha")]
    pub scheduler: String,
    /// ASHA: epochs before the first rung.
    #[arg(long, default_value_t = 1)]
    pub grace_epochs: u32,
    /// ASHA: η, each rung keeps the best 1/η.
    #[arg(long, default_value_t = 3)]
    pub reduction: u32,
    /// The metric that ranks trials (default: --monitor with an eval split,
    /// else train_loss).
    #[arg(long)]
    pub metric: Option<String>,
    /// Trials training at once (each on every agent of the dataset).
    #[arg(long, default_value_t = 2)]
    pub parallel: usize,
    /// Also write every trial (options, outcome, best metric, epochs, each
    /// epoch's metrics) to this file as JSON.
    #[arg(long, value_name = "FILE")]
    pub results: Option<std::path::PathBuf>,
}

/// Runs `kindling tune`.
pub async fn tune(args: TuneArgs) -> Result<()> {
    let Some(output) = &args.job.output else {
        bail!("kindling tune follows its trials to the end: --detach does not apply, give --output");
    };
    let space = SearchSpace::parse(args.space.iter().map(String::as_str))?;
    let mut search = Search::new(space).seed(args.search_seed).parallel(args.parallel);
    if let Some(n) = args.trials {
        search = search.trials(n);
    }
    search = match args.scheduler.as_str() {
        "asha" => search.asha(args.grace_epochs, args.reduction),
        "all" => search,
        other => bail!("--scheduler {other}: expected `asha` or `all`"),
    };
    let monitor = (args.job.eval_fraction > 0.0).then_some(args.job.training.monitor.as_str());
    if let Some(name) = args.metric.as_deref().or(monitor) {
        let metric = Metric::parse(name).with_context(|| {
            let names: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
            format!("--metric {name}: expected one of {}", names.join(", "))
        })?;
        search = search.metric(metric);
    }
    let job = super::job(&args.job)?;
    // The space is checked before Spark runs anything.
    job.check_search(&search)?;
    let spark = SparkSession::connect(&args.job.remote)
        .await
        .context("connecting to Spark Connect")?;
    let df = args.job.input.dataframe(&spark).await?;
    let result = job.search(&df, &search).await.context("searching")?;
    println!("{}", result.table());
    if let Some(path) = &args.results {
        let json = serde_json::to_string_pretty(&result.to_json())?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    let Some(best) = result.best_trial() else {
        bail!("no trial finished: nothing to save");
    };
    println!("best: trial {} ({})", best.trial, best.job_id);
    let model = best.model.as_ref().context("the best trial's model")?;
    model.save(output)?;
    super::report_model(model);
    println!("model saved to {}", output.display());
    Ok(())
}
