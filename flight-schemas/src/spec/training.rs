//! What a job spec says about *how* it trains: the optimizer and its weight
//! decay ([`OptimizerSpec`]), the learning-rate schedule by global step
//! ([`Schedule`]), gradient clipping ([`GradientClip`]), early stopping
//! ([`EarlyStopping`]) and the metric a schedule or early stopping watches
//! ([`Metric`]). Each checks itself against the job ([`check`]) and names
//! the offending field.

use serde::{Deserialize, Serialize};

use super::{SpecError, Task};

/// The optimizer and its hyper-parameters. Every rule steps all ranks'
/// replicas identically; each is burn 0.22's update rule, operation for
/// operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerSpec {
    /// Stochastic gradient descent, with optional (Nesterov) momentum and
    /// L2 weight decay added to the gradient (`torch.optim.SGD`).
    Sgd {
        /// Step size.
        learning_rate: f64,
        /// Momentum (0 disables), without dampening.
        #[serde(default)]
        momentum: f64,
        /// Nesterov momentum (needs `momentum > 0`).
        #[serde(default, skip_serializing_if = "is_false")]
        nesterov: bool,
        /// L2 penalty added to the gradient: `g + weight_decay · w`.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
    },
    /// Adam (burn's form: ε inside the bias correction), with optional L2
    /// weight decay added to the gradient (`torch.optim.Adam`).
    Adam {
        /// Step size.
        learning_rate: f64,
        /// β₁.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// β₂.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// ε (burn's default 1e-5).
        #[serde(default = "default_epsilon", skip_serializing_if = "is_default_epsilon")]
        epsilon: f32,
        /// L2 penalty added to the gradient: `g + weight_decay · w`.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
    },
    /// AdamW: Adam with weight decay decoupled from the gradient,
    /// `w ← w · (1 − lr · weight_decay) − lr · update` (Loshchilov & Hutter;
    /// `torch.optim.AdamW`, Keras' `AdamW`).
    #[serde(rename = "adamw")]
    AdamW {
        /// Step size.
        learning_rate: f64,
        /// β₁.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// β₂.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// ε (burn's default 1e-5).
        #[serde(default = "default_epsilon", skip_serializing_if = "is_default_epsilon")]
        epsilon: f32,
        /// Decoupled weight decay (default 0.01, as PyTorch's).
        #[serde(default = "default_adamw_decay")]
        weight_decay: f64,
    },
    /// RMSprop (`torch.optim.RMSprop`), optionally centered and with
    /// momentum; L2 weight decay added to the gradient.
    #[serde(rename = "rmsprop")]
    RmsProp {
        /// Step size.
        learning_rate: f64,
        /// Smoothing constant of the squared-gradient average.
        #[serde(default = "default_alpha")]
        alpha: f32,
        /// ε added to the root (burn's default 1e-5).
        #[serde(default = "default_epsilon", skip_serializing_if = "is_default_epsilon")]
        epsilon: f32,
        /// Momentum (0 disables).
        #[serde(default, skip_serializing_if = "is_zero32")]
        momentum: f32,
        /// Normalise by the variance estimate instead of the second moment.
        #[serde(default, skip_serializing_if = "is_false")]
        centered: bool,
        /// L2 penalty added to the gradient: `g + weight_decay · w`.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
    },
}

fn default_beta1() -> f32 {
    0.9
}
fn default_beta2() -> f32 {
    0.999
}
fn default_epsilon() -> f32 {
    1e-5
}
fn is_default_epsilon(e: &f32) -> bool {
    *e == default_epsilon()
}
fn default_adamw_decay() -> f64 {
    0.01
}
fn default_alpha() -> f32 {
    0.99
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}
fn is_zero32(x: &f32) -> bool {
    *x == 0.0
}

impl OptimizerSpec {
    /// Adam with the usual betas.
    pub fn adam(learning_rate: f64) -> Self {
        OptimizerSpec::Adam {
            learning_rate,
            beta1: default_beta1(),
            beta2: default_beta2(),
            epsilon: default_epsilon(),
            weight_decay: 0.0,
        }
    }

    /// AdamW with the usual betas and `weight_decay`.
    pub fn adamw(learning_rate: f64, weight_decay: f64) -> Self {
        OptimizerSpec::AdamW {
            learning_rate,
            beta1: default_beta1(),
            beta2: default_beta2(),
            epsilon: default_epsilon(),
            weight_decay,
        }
    }

    /// Plain SGD.
    pub fn sgd(learning_rate: f64) -> Self {
        Self::sgd_momentum(learning_rate, 0.0)
    }

    /// SGD with (heavy-ball) momentum.
    pub fn sgd_momentum(learning_rate: f64, momentum: f64) -> Self {
        OptimizerSpec::Sgd {
            learning_rate,
            momentum,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// RMSprop with burn's defaults (α 0.99, no momentum, not centered).
    pub fn rmsprop(learning_rate: f64) -> Self {
        OptimizerSpec::RmsProp {
            learning_rate,
            alpha: default_alpha(),
            epsilon: default_epsilon(),
            momentum: 0.0,
            centered: false,
            weight_decay: 0.0,
        }
    }

    /// The same optimizer with `momentum` (SGD and RMSprop; the others
    /// have none and are returned as they are).
    pub fn with_momentum(mut self, value: f64) -> Self {
        match &mut self {
            OptimizerSpec::Sgd { momentum, .. } => *momentum = value,
            OptimizerSpec::RmsProp { momentum, .. } => *momentum = value as f32,
            OptimizerSpec::Adam { .. } | OptimizerSpec::AdamW { .. } => {}
        }
        self
    }

    /// The same optimizer with `weight_decay` (decoupled for AdamW, an L2
    /// term on the gradient for the others).
    pub fn with_weight_decay(mut self, decay: f64) -> Self {
        match &mut self {
            OptimizerSpec::Sgd { weight_decay, .. }
            | OptimizerSpec::Adam { weight_decay, .. }
            | OptimizerSpec::AdamW { weight_decay, .. }
            | OptimizerSpec::RmsProp { weight_decay, .. } => *weight_decay = decay,
        }
        self
    }

    /// The base learning rate (a schedule scales it per step).
    pub fn learning_rate(&self) -> f64 {
        match self {
            OptimizerSpec::Sgd { learning_rate, .. }
            | OptimizerSpec::Adam { learning_rate, .. }
            | OptimizerSpec::AdamW { learning_rate, .. }
            | OptimizerSpec::RmsProp { learning_rate, .. } => *learning_rate,
        }
    }

    /// The weight decay (0: none).
    pub fn weight_decay(&self) -> f64 {
        match self {
            OptimizerSpec::Sgd { weight_decay, .. }
            | OptimizerSpec::Adam { weight_decay, .. }
            | OptimizerSpec::AdamW { weight_decay, .. }
            | OptimizerSpec::RmsProp { weight_decay, .. } => *weight_decay,
        }
    }

    /// The rule's name as the CLI and the docs write it.
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerSpec::Sgd { .. } => "sgd",
            OptimizerSpec::Adam { .. } => "adam",
            OptimizerSpec::AdamW { .. } => "adamw",
            OptimizerSpec::RmsProp { .. } => "rmsprop",
        }
    }

    fn check(&self) -> Result<(), SpecError> {
        let lr = self.learning_rate();
        if !(lr.is_finite() && lr > 0.0) {
            return Err(SpecError::new(
                "optimizer.learning_rate",
                "must be a finite number > 0",
            ));
        }
        let decay = self.weight_decay();
        if !(decay.is_finite() && decay >= 0.0) {
            return Err(SpecError::new(
                "optimizer.weight_decay",
                format!("must be a finite number ≥ 0, got {decay}"),
            ));
        }
        let unit = |field: &str, x: f64| match (0.0..1.0).contains(&x) {
            true => Ok(()),
            false => Err(SpecError::new(
                format!("optimizer.{field}"),
                format!("must be in [0, 1), got {x}"),
            )),
        };
        let positive = |field: &str, x: f32| match x.is_finite() && x > 0.0 {
            true => Ok(()),
            false => Err(SpecError::new(
                format!("optimizer.{field}"),
                format!("must be a finite number > 0, got {x}"),
            )),
        };
        match *self {
            OptimizerSpec::Sgd {
                momentum, nesterov, ..
            } => {
                unit("momentum", momentum)?;
                if nesterov && momentum == 0.0 {
                    return Err(SpecError::new(
                        "optimizer.nesterov",
                        "Nesterov momentum needs momentum > 0",
                    ));
                }
            }
            OptimizerSpec::Adam {
                beta1,
                beta2,
                epsilon,
                ..
            }
            | OptimizerSpec::AdamW {
                beta1,
                beta2,
                epsilon,
                ..
            } => {
                unit("beta1", beta1 as f64)?;
                unit("beta2", beta2 as f64)?;
                positive("epsilon", epsilon)?;
            }
            OptimizerSpec::RmsProp {
                alpha,
                epsilon,
                momentum,
                ..
            } => {
                unit("momentum", momentum as f64)?;
                positive("epsilon", epsilon)?;
                if !(alpha > 0.0 && alpha < 1.0) {
                    return Err(SpecError::new(
                        "optimizer.alpha",
                        format!("must be in (0, 1), got {alpha}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A value computed every epoch that a schedule or early stopping watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Mean loss over the epoch's training rows.
    TrainLoss,
    /// Mean loss over the eval split.
    EvalLoss,
    /// Share of eval rows classified right (classification only).
    EvalAccuracy,
}

impl Metric {
    /// The name as the spec, the CLI and the history write it.
    pub fn name(self) -> &'static str {
        match self {
            Metric::TrainLoss => "train_loss",
            Metric::EvalLoss => "eval_loss",
            Metric::EvalAccuracy => "eval_accuracy",
        }
    }

    /// Whether larger values are better (`max` mode in Keras' terms).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::EvalAccuracy)
    }

    /// Whether it is computed on the eval split (so needs one).
    pub fn needs_eval(self) -> bool {
        !matches!(self, Metric::TrainLoss)
    }

    /// Parses [`name`](Self::name).
    pub fn parse(s: &str) -> Option<Metric> {
        [Metric::TrainLoss, Metric::EvalLoss, Metric::EvalAccuracy]
            .into_iter()
            .find(|m| m.name() == s)
    }

    fn check(self, field: &str, task: Task) -> Result<(), SpecError> {
        if self == Metric::EvalAccuracy && task == Task::Regression {
            return Err(SpecError::new(
                field,
                "eval_accuracy needs a classification task; a regression job has train_loss and eval_loss",
            ));
        }
        Ok(())
    }
}

/// How the learning rate moves, as a factor of the optimizer's rate by
/// global step. Lengths are in epochs (fractions allowed: `0.5` is half an
/// epoch's steps); a decay runs from the end of the warmup to the end of
/// the job. Every schedule but `constant` without warmup and `plateau`
/// needs each epoch's step count, so its first epoch starts once the train
/// split has arrived.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    /// The optimizer's rate, after an optional linear warmup.
    Constant {
        /// Epochs of linear warmup from 0 to the rate.
        #[serde(default, skip_serializing_if = "is_zero")]
        warmup_epochs: f64,
    },
    /// Linear warmup, then half a cosine down to `min_factor` × the rate.
    Cosine {
        /// Epochs of linear warmup.
        #[serde(default)]
        warmup_epochs: f64,
        /// The final rate as a share of the optimizer's (0..1).
        #[serde(default)]
        min_factor: f64,
    },
    /// Linear warmup, then a straight line down to `min_factor` × the rate.
    Linear {
        /// Epochs of linear warmup.
        #[serde(default)]
        warmup_epochs: f64,
        /// The final rate as a share of the optimizer's (0..1).
        #[serde(default)]
        min_factor: f64,
    },
    /// Linear warmup, then × `gamma` every `every_epochs` (`StepLR`).
    Step {
        /// Epochs of linear warmup.
        #[serde(default)]
        warmup_epochs: f64,
        /// Epochs between two drops.
        every_epochs: f64,
        /// Factor per drop (0..1].
        gamma: f64,
    },
    /// Linear warmup, then × `gamma` per epoch, continuously by step
    /// (`ExponentialLR` applied per step).
    Exponential {
        /// Epochs of linear warmup.
        #[serde(default)]
        warmup_epochs: f64,
        /// Factor per epoch (0..1].
        gamma: f64,
    },
    /// The one-cycle policy (`OneCycleLR` with cosine annealing): from
    /// rate / `div_factor` up to the rate over `pct_start` of the job, then
    /// down to rate / (`div_factor` · `final_div_factor`).
    OneCycle {
        /// Share of the job spent rising.
        #[serde(default = "default_pct_start")]
        pct_start: f64,
        /// The starting rate is the optimizer's / this.
        #[serde(default = "default_div_factor")]
        div_factor: f64,
        /// The final rate is the starting rate / this.
        #[serde(default = "default_final_div_factor")]
        final_div_factor: f64,
    },
    /// × `factor` whenever `monitor` has not improved by `min_delta` for
    /// `patience` epochs (`ReduceLROnPlateau`), never below `min_factor`.
    Plateau {
        /// The watched metric (default `eval_loss`).
        #[serde(default = "default_monitor")]
        monitor: Metric,
        /// Factor per reduction (0..1).
        #[serde(default = "default_plateau_factor")]
        factor: f64,
        /// Epochs without improvement before a reduction.
        #[serde(default = "default_patience")]
        patience: u32,
        /// Smallest change that counts as an improvement.
        #[serde(default)]
        min_delta: f64,
        /// The rate never goes below this share of the optimizer's.
        #[serde(default)]
        min_factor: f64,
    },
}

fn default_pct_start() -> f64 {
    0.3
}
fn default_div_factor() -> f64 {
    25.0
}
fn default_final_div_factor() -> f64 {
    1e4
}
fn default_monitor() -> Metric {
    Metric::EvalLoss
}
fn default_plateau_factor() -> f64 {
    0.1
}
fn default_patience() -> u32 {
    2
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule::Constant { warmup_epochs: 0.0 }
    }
}

impl Schedule {
    /// The one-cycle policy with PyTorch's defaults (30 % rising, from
    /// rate / 25 down to rate / 25 / 10⁴).
    pub fn one_cycle() -> Self {
        Schedule::OneCycle {
            pct_start: default_pct_start(),
            div_factor: default_div_factor(),
            final_div_factor: default_final_div_factor(),
        }
    }

    /// Whether this is the default (a constant rate, no warmup).
    pub fn is_constant(&self) -> bool {
        *self == Schedule::default()
    }

    /// Whether the rate within an epoch depends on that epoch's step count.
    pub fn needs_steps_per_epoch(&self) -> bool {
        !matches!(
            self,
            Schedule::Constant { warmup_epochs } if *warmup_epochs == 0.0
        ) && !matches!(self, Schedule::Plateau { .. })
    }

    /// The schedule's name as the CLI and the docs write it.
    pub fn name(&self) -> &'static str {
        match self {
            Schedule::Constant { .. } => "constant",
            Schedule::Cosine { .. } => "cosine",
            Schedule::Linear { .. } => "linear",
            Schedule::Step { .. } => "step",
            Schedule::Exponential { .. } => "exponential",
            Schedule::OneCycle { .. } => "one_cycle",
            Schedule::Plateau { .. } => "plateau",
        }
    }

    /// The warmup, in epochs.
    pub fn warmup_epochs(&self) -> f64 {
        match self {
            Schedule::Constant { warmup_epochs }
            | Schedule::Cosine { warmup_epochs, .. }
            | Schedule::Linear { warmup_epochs, .. }
            | Schedule::Step { warmup_epochs, .. }
            | Schedule::Exponential { warmup_epochs, .. } => *warmup_epochs,
            Schedule::OneCycle { .. } | Schedule::Plateau { .. } => 0.0,
        }
    }

    fn check(&self, epochs: u32, task: Task) -> Result<(), SpecError> {
        let job = epochs as f64;
        let warmup = self.warmup_epochs();
        if !(warmup.is_finite() && warmup >= 0.0) {
            return Err(SpecError::new(
                "schedule.warmup_epochs",
                format!("must be a finite number ≥ 0, got {warmup}"),
            ));
        }
        let decays = !matches!(self, Schedule::Constant { .. });
        if warmup > job || (decays && warmup >= job && warmup > 0.0) {
            return Err(SpecError::new(
                "schedule.warmup_epochs",
                format!("{warmup} epochs of warmup do not fit a {epochs}-epoch job"),
            ));
        }
        let share = |field: &str, x: f64, upper_open: bool| {
            let ok = x.is_finite() && x >= 0.0 && if upper_open { x < 1.0 } else { x <= 1.0 };
            match ok {
                true => Ok(()),
                false => Err(SpecError::new(
                    format!("schedule.{field}"),
                    format!("must be in [0, 1{}, got {x}", if upper_open { ")" } else { "]" }),
                )),
            }
        };
        let factor = |field: &str, x: f64| match x.is_finite() && x > 0.0 && x <= 1.0 {
            true => Ok(()),
            false => Err(SpecError::new(
                format!("schedule.{field}"),
                format!("must be in (0, 1], got {x}"),
            )),
        };
        match *self {
            Schedule::Constant { .. } => {}
            Schedule::Cosine { min_factor, .. } | Schedule::Linear { min_factor, .. } => {
                share("min_factor", min_factor, false)?
            }
            Schedule::Step {
                every_epochs, gamma, ..
            } => {
                factor("gamma", gamma)?;
                if !(every_epochs.is_finite() && every_epochs > 0.0) {
                    return Err(SpecError::new(
                        "schedule.every_epochs",
                        format!("must be a finite number > 0, got {every_epochs}"),
                    ));
                }
                if warmup + every_epochs > job {
                    return Err(SpecError::new(
                        "schedule.every_epochs",
                        format!(
                            "the first drop would come after epoch {}, past the {epochs}-epoch job",
                            warmup + every_epochs
                        ),
                    ));
                }
            }
            Schedule::Exponential { gamma, .. } => factor("gamma", gamma)?,
            Schedule::OneCycle {
                pct_start,
                div_factor,
                final_div_factor,
            } => {
                if !(pct_start.is_finite() && pct_start > 0.0 && pct_start < 1.0) {
                    return Err(SpecError::new(
                        "schedule.pct_start",
                        format!("must be in (0, 1), got {pct_start}"),
                    ));
                }
                for (field, x) in [("div_factor", div_factor), ("final_div_factor", final_div_factor)] {
                    if !(x.is_finite() && x >= 1.0) {
                        return Err(SpecError::new(
                            format!("schedule.{field}"),
                            format!("must be a finite number ≥ 1, got {x}"),
                        ));
                    }
                }
            }
            Schedule::Plateau {
                monitor,
                factor: f,
                patience,
                min_delta,
                min_factor,
            } => {
                monitor.check("schedule.monitor", task)?;
                share("factor", f, true)?;
                if f == 0.0 {
                    return Err(SpecError::new("schedule.factor", "must be in (0, 1), got 0"));
                }
                share("min_factor", min_factor, true)?;
                if patience == 0 {
                    return Err(SpecError::new("schedule.patience", "must be at least 1"));
                }
                if !(min_delta.is_finite() && min_delta >= 0.0) {
                    return Err(SpecError::new(
                        "schedule.min_delta",
                        format!("must be a finite number ≥ 0, got {min_delta}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Gradient clipping, on the all-reduced mean gradient (so the same on
/// every rank), before the optimizer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GradientClip {
    /// Scales the whole gradient down when its global L2 norm passes
    /// `max_norm` (`clip_grad_norm_`, Keras' `global_clipnorm`).
    Norm {
        /// The largest norm let through.
        max_norm: f64,
    },
    /// Clamps every gradient value into `[-max_value, max_value]`
    /// (`clip_grad_value_`, Keras' `clipvalue`).
    Value {
        /// The largest magnitude let through.
        max_value: f64,
    },
}

impl GradientClip {
    fn check(&self) -> Result<(), SpecError> {
        let (field, x) = match *self {
            GradientClip::Norm { max_norm } => ("clip.max_norm", max_norm),
            GradientClip::Value { max_value } => ("clip.max_value", max_value),
        };
        match x.is_finite() && x > 0.0 {
            true => Ok(()),
            false => Err(SpecError::new(
                field,
                format!("must be a finite number > 0, got {x}"),
            )),
        }
    }
}

/// Stops training when `monitor` has not improved by `min_delta` for
/// `patience` epochs (Keras' `EarlyStopping`, Lightning's callback); with
/// `restore_best`, the job's model and final checkpoint are the best
/// epoch's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EarlyStopping {
    /// The watched metric; its direction follows from it.
    #[serde(default = "default_monitor")]
    pub monitor: Metric,
    /// Epochs without improvement before stopping.
    pub patience: u32,
    /// Smallest change that counts as an improvement.
    #[serde(default)]
    pub min_delta: f64,
    /// Return the best epoch's weights rather than the last's.
    #[serde(default = "yes")]
    pub restore_best: bool,
}

fn yes() -> bool {
    true
}

impl EarlyStopping {
    /// Stops after `patience` epochs without improvement of `monitor`,
    /// restoring the best epoch's weights.
    pub fn new(monitor: Metric, patience: u32) -> Self {
        EarlyStopping {
            monitor,
            patience,
            min_delta: 0.0,
            restore_best: true,
        }
    }

    fn check(&self, task: Task) -> Result<(), SpecError> {
        self.monitor.check("early_stopping.monitor", task)?;
        if self.patience == 0 {
            return Err(SpecError::new("early_stopping.patience", "must be at least 1"));
        }
        if !(self.min_delta.is_finite() && self.min_delta >= 0.0) {
            return Err(SpecError::new(
                "early_stopping.min_delta",
                format!("must be a finite number ≥ 0, got {}", self.min_delta),
            ));
        }
        Ok(())
    }
}

/// Most parameter-path patterns a job may exempt from weight decay.
pub const MAX_NO_DECAY: usize = 64;

/// Checks the training options of a spec against its task and length.
pub(crate) fn check(spec: &super::JobSpec) -> Result<(), SpecError> {
    spec.optimizer.check()?;
    if spec.no_weight_decay.len() > MAX_NO_DECAY {
        return Err(SpecError::new(
            "no_weight_decay",
            format!("at most {MAX_NO_DECAY} patterns"),
        ));
    }
    for (i, p) in spec.no_weight_decay.iter().enumerate() {
        if p.trim().is_empty() || p.len() > 256 {
            return Err(SpecError::new(
                format!("no_weight_decay[{i}]"),
                "must be a parameter path pattern of 1 to 256 characters",
            ));
        }
    }
    if !spec.no_weight_decay.is_empty() && spec.optimizer.weight_decay() == 0.0 {
        return Err(SpecError::new(
            "no_weight_decay",
            format!(
                "the {} optimizer has no weight decay to exempt parameters from",
                spec.optimizer.name()
            ),
        ));
    }
    spec.schedule.check(spec.epochs, spec.task)?;
    if let Some(clip) = &spec.clip {
        clip.check()?;
    }
    if !(1..=MAX_ACCUMULATE).contains(&spec.accumulate) {
        return Err(SpecError::new(
            "accumulate",
            format!("must be in 1..={MAX_ACCUMULATE}"),
        ));
    }
    if let Some(stop) = &spec.early_stopping {
        stop.check(spec.task)?;
    }
    Ok(())
}

/// Most micro-batches a step may accumulate.
pub const MAX_ACCUMULATE: u32 = 1024;

/// Whether parameter `path` (module names joined by `.`, e.g.
/// `hidden.0.bias`) matches `pattern`: a glob over the whole path (`*`
/// any run of characters), or, without a `*`, one of the path's segments
/// or a run of them (`bias`, `norm.gamma`).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    if pattern.contains('*') {
        return glob(pattern.as_bytes(), path.as_bytes());
    }
    let segments: Vec<&str> = path.split('.').collect();
    let wanted: Vec<&str> = pattern.split('.').collect();
    segments.windows(wanted.len()).any(|w| w == wanted.as_slice())
}

/// `*`-only glob matching, iterative with one backtrack point.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_segments_or_globs() {
        assert!(path_matches("bias", "hidden.0.bias"));
        assert!(!path_matches("bias", "hidden.0.biases"));
        assert!(path_matches("norm.gamma", "block.norm.gamma"));
        assert!(!path_matches("norm.gamma", "block.norm.beta"));
        assert!(path_matches("*norm*", "block.layer_norm.gamma"));
        assert!(path_matches("embed*", "embedding.weight"));
        assert!(!path_matches("embed*", "wide.embedding.weight"));
        assert!(path_matches("*.weight", "wide.embedding.weight"));
        assert!(!path_matches("*.weight", "output.bias"));
    }

    #[test]
    fn serde_names_are_the_documented_ones() {
        let json = serde_json::to_value(OptimizerSpec::adamw(1e-3, 0.05)).expect("json");
        assert_eq!(json["kind"], "adamw");
        let json = serde_json::to_value(OptimizerSpec::rmsprop(1e-3)).expect("json");
        assert_eq!(json["kind"], "rmsprop");
        let s: Schedule = serde_json::from_str(r#"{"kind":"cosine","warmup_epochs":1}"#).expect("cosine");
        assert_eq!(
            s,
            Schedule::Cosine {
                warmup_epochs: 1.0,
                min_factor: 0.0
            }
        );
        let s: Schedule = serde_json::from_str(r#"{"kind":"one_cycle"}"#).expect("one cycle");
        assert!(matches!(s, Schedule::OneCycle { pct_start, .. } if pct_start == 0.3));
        // A spec written before these options parses as before.
        let old: OptimizerSpec =
            serde_json::from_str(r#"{"kind":"sgd","learning_rate":0.1,"momentum":0.9}"#).expect("old sgd");
        assert_eq!(old, OptimizerSpec::sgd_momentum(0.1, 0.9));
    }
}
