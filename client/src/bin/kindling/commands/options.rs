//! `kindling train`'s training options: the optimizer, weight decay and its
//! exempt parameters, the schedule, clipping, accumulation and early
//! stopping, each parsed into the job spec's types with an error that
//! names the flag; and the weights to start from.

use anyhow::{Context, Result, bail};
use kindling::job::TrainingJobBuilder;
use kindling::{EarlyStopping, GradientClip, Metric, OptimizerSpec, Schedule};

/// The training options of `kindling train`.
#[derive(Debug, clap::Args)]
pub struct TrainingOptions {
    /// Start from the weights of this safetensors file or PyTorch state dict
    /// (`.pt`/`.pth` from `torch.save`), with PyTorch's `state_dict` names
    /// and layouts (as `kindling export` writes them): every tensor must fit
    /// the model by name, shape and dtype.
    #[arg(long)]
    pub init_from: Option<std::path::PathBuf>,
    /// `adam:<lr>`, `adamw:<lr>[:<weight decay>]`,
    /// `sgd:<lr>[:<momentum>[:nesterov]]` or `rmsprop:<lr>[:<momentum>]`.
    #[arg(long, default_value = "adam:0.001")]
    pub optimizer: String,
    /// Weight decay (decoupled for adamw, an L2 term for the others).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Parameter path patterns that take no weight decay, comma-separated
    /// (e.g. `bias,*norm*`).
    #[arg(long, value_delimiter = ',')]
    pub no_weight_decay: Vec<String>,
    /// `constant`, `cosine`, `linear`, `step:<every epochs>:<gamma>`,
    /// `exponential:<gamma per epoch>`, `one-cycle` or
    /// `plateau[:<factor>:<patience>]` (watches --monitor).
    #[arg(long, default_value = "constant")]
    pub schedule: String,
    /// Epochs of linear warmup before the schedule (fractions allowed).
    #[arg(long, default_value_t = 0.0)]
    pub warmup_epochs: f64,
    /// cosine/linear: the final rate as a share of the optimizer's.
    #[arg(long, default_value_t = 0.0)]
    pub min_lr_factor: f64,
    /// Clip the all-reduced gradient to this global L2 norm.
    #[arg(long, conflicts_with = "clip_value")]
    pub clip_norm: Option<f64>,
    /// Clamp every gradient value into [-v, v].
    #[arg(long)]
    pub clip_value: Option<f64>,
    /// Micro-batches of --batch-size rows summed per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub accumulate: u32,
    /// The metric plateau schedules and early stopping watch:
    /// `train_loss`, `eval_loss`, `eval_accuracy`, `eval_f1_macro`,
    /// `eval_auc_roc`, `eval_r2`… (the guide's "Training options" lists all).
    #[arg(long, default_value = "eval_loss")]
    pub monitor: String,
    /// A numeric column weighting each row in the loss and the metrics.
    #[arg(long)]
    pub sample_weight: Option<String>,
    /// One loss weight per class, comma-separated (e.g. `1,4`).
    #[arg(long, value_delimiter = ',')]
    pub class_weights: Vec<f64>,
    /// `k` of the eval split's top-k accuracy.
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Log the run to the MLflow tracking server at this URL (the spec as
    /// params, every epoch's metrics, the saved model as artifacts).
    #[arg(long, env = "MLFLOW_TRACKING_URI")]
    pub mlflow: Option<String>,
    /// The MLflow experiment (created when missing).
    #[arg(long, default_value = "kindling")]
    pub mlflow_experiment: String,
    /// Stop after this many epochs without improvement of --monitor, and
    /// keep the best epoch's weights.
    #[arg(long)]
    pub early_stopping: Option<u32>,
    /// Also checkpoint inside an epoch every this many steps (0: not by
    /// steps); from the second epoch on, a lost agent then costs the steps
    /// since, not the epoch.
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every_steps: u64,
    /// Also checkpoint inside an epoch once this many seconds passed since
    /// the last checkpoint (0: not by time).
    #[arg(long, default_value_t = kindling::CheckpointPolicy::EVERY_SECS)]
    pub checkpoint_every_secs: u64,
}

impl TrainingOptions {
    /// The builder with these options applied.
    pub fn apply(&self, builder: TrainingJobBuilder) -> Result<TrainingJobBuilder> {
        let mut optimizer = parse_optimizer(&self.optimizer)?;
        if let Some(decay) = self.weight_decay {
            optimizer = optimizer.with_weight_decay(decay);
        }
        let monitor = Metric::parse(&self.monitor).with_context(|| {
            let names: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
            format!(
                "--monitor must be one of {}, got `{}`",
                names.join(", "),
                self.monitor
            )
        })?;
        let mut builder = builder
            .optimizer(optimizer)
            .no_weight_decay(self.no_weight_decay.clone())
            .schedule(parse_schedule(
                &self.schedule,
                self.warmup_epochs,
                self.min_lr_factor,
                monitor,
            )?)
            .accumulate(self.accumulate)
            .checkpoint(kindling::CheckpointPolicy {
                every_steps: self.checkpoint_every_steps,
                every_secs: self.checkpoint_every_secs,
                ..Default::default()
            });
        if let Some(max_norm) = self.clip_norm {
            builder = builder.clip(GradientClip::Norm { max_norm });
        }
        if let Some(max_value) = self.clip_value {
            builder = builder.clip(GradientClip::Value { max_value });
        }
        if let Some(patience) = self.early_stopping {
            builder = builder.early_stopping(EarlyStopping::new(monitor, patience));
        }
        if let Some(column) = &self.sample_weight {
            builder = builder.sample_weight(column.clone());
        }
        if !self.class_weights.is_empty() {
            builder = builder.class_weights(self.class_weights.clone());
        }
        if let Some(k) = self.top_k {
            builder = builder.top_k(k);
        }
        if let Some(url) = &self.mlflow {
            builder = builder.mlflow(url.clone(), self.mlflow_experiment.clone());
        }
        if let Some(path) = &self.init_from {
            builder = builder.init_from(path.clone());
        }
        Ok(builder)
    }
}

fn number<T: std::str::FromStr>(flag: &str, what: &str, s: Option<&str>, default: T) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match s {
        None => Ok(default),
        Some(s) => s
            .parse()
            .with_context(|| format!("{flag}: {what} must be a number, got `{s}`")),
    }
}

/// Parses `--optimizer`.
pub fn parse_optimizer(s: &str) -> Result<OptimizerSpec> {
    let parts: Vec<&str> = s.split(':').collect();
    let at = |i: usize| parts.get(i).copied();
    let lr = number("--optimizer", "the learning rate", at(1), 0.001)?;
    Ok(match parts[0] {
        "adam" => OptimizerSpec::adam(lr),
        "adamw" => OptimizerSpec::adamw(lr, number("--optimizer", "the weight decay", at(2), 0.01)?),
        "sgd" => {
            let momentum = number("--optimizer", "the momentum", at(2), 0.0)?;
            let nesterov = match at(3) {
                None => false,
                Some("nesterov") => true,
                Some(other) => bail!("--optimizer: sgd's fourth part must be `nesterov`, got `{other}`"),
            };
            OptimizerSpec::Sgd {
                learning_rate: lr,
                momentum,
                nesterov,
                weight_decay: 0.0,
            }
        }
        "rmsprop" => {
            OptimizerSpec::rmsprop(lr).with_momentum(number("--optimizer", "the momentum", at(2), 0.0)?)
        }
        other => bail!(
            "--optimizer must be adam:<lr>, adamw:<lr>[:<decay>], sgd:<lr>[:<momentum>[:nesterov]] or \
             rmsprop:<lr>[:<momentum>], got `{other}`"
        ),
    })
}

/// Parses `--schedule` with the warmup and final factor flags.
pub fn parse_schedule(s: &str, warmup_epochs: f64, min_factor: f64, monitor: Metric) -> Result<Schedule> {
    let parts: Vec<&str> = s.split(':').collect();
    let at = |i: usize| parts.get(i).copied();
    let flag = "--schedule";
    Ok(match parts[0] {
        "constant" => Schedule::Constant { warmup_epochs },
        "cosine" => Schedule::Cosine {
            warmup_epochs,
            min_factor,
        },
        "linear" => Schedule::Linear {
            warmup_epochs,
            min_factor,
        },
        "step" => Schedule::Step {
            warmup_epochs,
            every_epochs: number(flag, "step's epochs between drops", at(1), 1.0)?,
            gamma: number(flag, "step's gamma", at(2), 0.1)?,
        },
        "exponential" => Schedule::Exponential {
            warmup_epochs,
            gamma: number(flag, "exponential's gamma", at(1), 0.9)?,
        },
        "one-cycle" | "one_cycle" => Schedule::one_cycle(),
        "plateau" => Schedule::Plateau {
            monitor,
            factor: number(flag, "plateau's factor", at(1), 0.1)?,
            patience: number(flag, "plateau's patience", at(2), 2)?,
            min_delta: 0.0,
            min_factor: 0.0,
        },
        other => bail!(
            "--schedule must be constant, cosine, linear, step:<every>:<gamma>, exponential:<gamma>, one-cycle \
             or plateau[:<factor>:<patience>], got `{other}`"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_and_a_bad_one_names_the_flag() {
        assert_eq!(
            parse_optimizer("adamw:0.003:0.05").expect("adamw"),
            OptimizerSpec::adamw(0.003, 0.05)
        );
        assert!(matches!(
            parse_optimizer("sgd:0.1:0.9:nesterov").expect("sgd"),
            OptimizerSpec::Sgd { nesterov: true, .. }
        ));
        assert!(matches!(
            parse_optimizer("rmsprop:0.01:0.5").expect("rmsprop"),
            OptimizerSpec::RmsProp { momentum, .. } if momentum == 0.5
        ));
        let err = parse_optimizer("lamb:0.1").expect_err("unknown");
        assert!(err.to_string().contains("--optimizer"), "{err}");
        let err = parse_optimizer("adam:fast").expect_err("not a number");
        assert!(format!("{err:#}").contains("learning rate"), "{err:#}");
        assert_eq!(
            parse_schedule("cosine", 1.0, 0.1, Metric::EvalLoss).expect("cosine"),
            Schedule::Cosine {
                warmup_epochs: 1.0,
                min_factor: 0.1
            }
        );
        assert!(matches!(
            parse_schedule("one-cycle", 0.0, 0.0, Metric::EvalLoss).expect("one-cycle"),
            Schedule::OneCycle { .. }
        ));
        assert!(matches!(
            parse_schedule("plateau:0.5:3", 0.0, 0.0, Metric::EvalAccuracy).expect("plateau"),
            Schedule::Plateau {
                patience: 3,
                monitor: Metric::EvalAccuracy,
                ..
            }
        ));
        let err = parse_schedule("cyclic", 0.0, 0.0, Metric::EvalLoss).expect_err("unknown");
        assert!(err.to_string().contains("--schedule"), "{err}");
    }
}
