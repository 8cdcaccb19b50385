//! What a job spec says about the learning rate over time and about
//! watching a metric: the [`Schedule`], the [`Metric`] a plateau schedule
//! or [`EarlyStopping`] watches. Each checks itself against the job and
//! names the offending field.

use serde::{Deserialize, Serialize};

use super::{SpecError, Task};

/// A value computed every epoch that a schedule or early stopping watches.
/// The eval metrics are defined as scikit-learn defines them (see
/// [`crate::scoring`]), over every rank's eval rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Mean loss over the epoch's training rows.
    TrainLoss,
    /// Mean loss over the eval split.
    EvalLoss,
    /// Share of eval rows classified right (classification only).
    EvalAccuracy,
    /// Cross-entropy of the predicted probabilities (`log_loss`).
    EvalLogLoss,
    /// Unweighted mean of the per-class F1 scores.
    EvalF1Macro,
    /// F1 over all classes' counts pooled.
    EvalF1Micro,
    /// Unweighted mean of the per-class precisions.
    EvalPrecisionMacro,
    /// Unweighted mean of the per-class recalls.
    EvalRecallMacro,
    /// Share of rows whose class is among the `top_k` highest scores.
    EvalTopKAccuracy,
    /// Area under the ROC curve (two classes only).
    EvalAucRoc,
    /// Average precision, the area under the precision-recall curve (two
    /// classes only).
    EvalPrAuc,
    /// Root mean squared error (regression).
    EvalRmse,
    /// Mean absolute error (regression).
    EvalMae,
    /// Coefficient of determination (regression).
    EvalR2,
    /// Mean absolute percentage error, as a fraction (regression).
    EvalMape,
}

impl Metric {
    /// Every metric, in the order reports list them.
    pub const ALL: [Metric; 15] = [
        Metric::TrainLoss,
        Metric::EvalLoss,
        Metric::EvalAccuracy,
        Metric::EvalLogLoss,
        Metric::EvalF1Macro,
        Metric::EvalF1Micro,
        Metric::EvalPrecisionMacro,
        Metric::EvalRecallMacro,
        Metric::EvalTopKAccuracy,
        Metric::EvalAucRoc,
        Metric::EvalPrAuc,
        Metric::EvalRmse,
        Metric::EvalMae,
        Metric::EvalR2,
        Metric::EvalMape,
    ];

    /// The name as the spec, the CLI and the history write it.
    pub fn name(self) -> &'static str {
        match self {
            Metric::TrainLoss => "train_loss",
            Metric::EvalLoss => "eval_loss",
            Metric::EvalAccuracy => "eval_accuracy",
            Metric::EvalLogLoss => "eval_log_loss",
            Metric::EvalF1Macro => "eval_f1_macro",
            Metric::EvalF1Micro => "eval_f1_micro",
            Metric::EvalPrecisionMacro => "eval_precision_macro",
            Metric::EvalRecallMacro => "eval_recall_macro",
            Metric::EvalTopKAccuracy => "eval_top_k_accuracy",
            Metric::EvalAucRoc => "eval_auc_roc",
            Metric::EvalPrAuc => "eval_pr_auc",
            Metric::EvalRmse => "eval_rmse",
            Metric::EvalMae => "eval_mae",
            Metric::EvalR2 => "eval_r2",
            Metric::EvalMape => "eval_mape",
        }
    }

    /// Whether larger values are better (`max` mode in Keras' terms).
    pub fn higher_is_better(self) -> bool {
        matches!(
            self,
            Metric::EvalAccuracy
                | Metric::EvalF1Macro
                | Metric::EvalF1Micro
                | Metric::EvalPrecisionMacro
                | Metric::EvalRecallMacro
                | Metric::EvalTopKAccuracy
                | Metric::EvalAucRoc
                | Metric::EvalPrAuc
                | Metric::EvalR2
        )
    }

    /// Whether it is computed on the eval split (so needs one).
    pub fn needs_eval(self) -> bool {
        !matches!(self, Metric::TrainLoss)
    }

    /// Parses [`name`](Self::name).
    pub fn parse(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The metrics a job of `task` reports every epoch with an eval split
    /// (`top_k` is the spec's).
    pub fn for_task(task: Task, top_k: u32) -> Vec<Metric> {
        Metric::ALL
            .into_iter()
            .filter(|m| m.why_not(task, top_k).is_none())
            .collect()
    }

    /// Why a job of `task` has no such metric, if it has none.
    fn why_not(self, task: Task, top_k: u32) -> Option<String> {
        let classes = match task {
            Task::Classification { num_classes } => Some(num_classes),
            Task::Regression => None,
        };
        match (self, classes) {
            (Metric::TrainLoss | Metric::EvalLoss, _) => None,
            (Metric::EvalRmse | Metric::EvalMae | Metric::EvalR2 | Metric::EvalMape, None) => None,
            (Metric::EvalRmse | Metric::EvalMae | Metric::EvalR2 | Metric::EvalMape, Some(_)) => {
                Some(format!(
                    "{} needs a regression task; a classification job has eval_accuracy, eval_f1_macro and the other class metrics",
                    self.name()
                ))
            }
            (_, None) => Some(format!(
                "{} needs a classification task; a regression job has eval_rmse, eval_mae, eval_r2, eval_mape and the losses",
                self.name()
            )),
            (Metric::EvalAucRoc | Metric::EvalPrAuc, Some(n)) if n != 2 => Some(format!(
                "{} needs a two-class task; this one has {n} classes",
                self.name()
            )),
            (Metric::EvalTopKAccuracy, Some(n)) if top_k as usize >= n => Some(format!(
                "eval_top_k_accuracy needs `top_k` ({top_k}) below the {n} classes"
            )),
            _ => None,
        }
    }

    pub(super) fn check(self, field: &str, task: Task, top_k: u32) -> Result<(), SpecError> {
        match self.why_not(task, top_k) {
            Some(reason) => Err(SpecError::new(field, reason)),
            None => Ok(()),
        }
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

    pub(super) fn check(&self, epochs: u32, task: Task, top_k: u32) -> Result<(), SpecError> {
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
                monitor.check("schedule.monitor", task, top_k)?;
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

    pub(super) fn check(&self, task: Task, top_k: u32) -> Result<(), SpecError> {
        self.monitor.check("early_stopping.monitor", task, top_k)?;
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

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}
