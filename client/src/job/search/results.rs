//! What a search returns: every trial's options, outcome, metric and
//! time, the best trial and its model, and a table of them all.

use std::collections::BTreeMap;
use std::time::Duration;

use kindling_schemas::spec::Metric;
use kindling_schemas::status::EpochMetrics;
use serde_json::Value;

use super::space;
use crate::job::TrainedModel;

/// How a trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialOutcome {
    /// Trained every epoch (or stopped early by its own early stopping).
    Finished,
    /// Stopped by the scheduler after the rung `at_epoch`.
    Stopped {
        /// The rung's epoch.
        at_epoch: u32,
    },
    /// Failed (see [`TrialResult::error`]); the other trials went on.
    Failed,
}

/// One trial of a search.
#[derive(Debug)]
pub struct TrialResult {
    /// Its index, from 0, in the order the space produced the trials.
    pub trial: usize,
    /// Its job id (`<search>-tNN`).
    pub job_id: String,
    /// The options it set.
    pub options: BTreeMap<String, Value>,
    /// How it ended.
    pub outcome: TrialOutcome,
    /// Why it failed.
    pub error: Option<String>,
    /// Its epochs (a stopped trial's up to its rung).
    pub history: Vec<EpochMetrics>,
    /// Its best value of the search's metric, and the epoch of it.
    pub best: Option<(f64, u32)>,
    /// Wall time from its start to its end.
    pub elapsed: Duration,
    /// The trained model of a finished trial.
    pub model: Option<TrainedModel>,
}

/// How one trial ran, as [`TrialResult::new`] takes it.
pub(super) struct TrialRun {
    pub trial: usize,
    pub job_id: String,
    pub options: BTreeMap<String, Value>,
    pub outcome: TrialOutcome,
    pub error: Option<String>,
    pub history: Vec<EpochMetrics>,
    pub elapsed: Duration,
    pub model: Option<TrainedModel>,
}

impl TrialResult {
    /// The result of `run`, its best value of `metric` found in its history.
    pub(super) fn new(run: TrialRun, metric: Metric) -> Self {
        let TrialRun {
            trial,
            job_id,
            options,
            outcome,
            error,
            history,
            elapsed,
            model,
        } = run;
        let best = history
            .iter()
            .filter_map(|m| m.get(metric).filter(|v| !v.is_nan()).map(|v| (v, m.epoch)))
            .reduce(|a, b| if better(metric, b.0, a.0) { b } else { a });
        TrialResult {
            trial,
            job_id,
            options,
            outcome,
            error,
            history,
            best,
            elapsed,
            model,
        }
    }

    /// `finished: eval_loss 0.1234 at epoch 4` and the like.
    pub(super) fn summary(&self, metric: Metric) -> String {
        let best = self
            .best
            .map(|(v, e)| format!(": best {} {v:.6} at epoch {e}", metric.name()))
            .unwrap_or_default();
        match (&self.outcome, &self.error) {
            (TrialOutcome::Failed, Some(e)) => format!("failed: {e}"),
            (TrialOutcome::Stopped { at_epoch }, _) => format!("stopped at epoch {at_epoch}{best}"),
            _ => format!("finished{best}"),
        }
    }
}

/// Whether `a` is a better value of `metric` than `b`.
fn better(metric: Metric, a: f64, b: f64) -> bool {
    if metric.higher_is_better() { a > b } else { a < b }
}

/// What [`TrainingJob::search`](crate::job::TrainingJob::search) returns.
#[derive(Debug)]
pub struct SearchResult {
    /// The metric that ranked the trials.
    pub metric: Metric,
    /// Every trial, in trial order.
    pub trials: Vec<TrialResult>,
    /// The index of the best finished trial.
    pub best: Option<usize>,
    /// Wall time of the whole search, the feed included.
    pub elapsed: Duration,
    /// The scheduler's rungs (epochs where trials may stop; none without ASHA).
    pub rungs: Vec<u32>,
}

impl SearchResult {
    pub(super) fn new(metric: Metric, trials: Vec<TrialResult>, elapsed: Duration, rungs: Vec<u32>) -> Self {
        let best = trials
            .iter()
            .enumerate()
            .filter(|(_, t)| t.outcome == TrialOutcome::Finished && t.model.is_some())
            .filter_map(|(i, t)| t.best.map(|(v, _)| (i, v)))
            .reduce(|a, b| if better(metric, b.1, a.1) { b } else { a })
            .map(|(i, _)| i);
        SearchResult {
            metric,
            trials,
            best,
            elapsed,
            rungs,
        }
    }

    /// The best finished trial.
    pub fn best_trial(&self) -> Option<&TrialResult> {
        self.best.map(|i| &self.trials[i])
    }

    /// The best finished trial's model.
    pub fn best_model(&self) -> Option<&TrainedModel> {
        self.best_trial().and_then(|t| t.model.as_ref())
    }

    /// Takes the best finished trial's model.
    pub fn into_best_model(mut self) -> Option<TrainedModel> {
        let i = self.best?;
        self.trials[i].model.take()
    }

    /// Every trial as JSON: trial, job id, options, outcome (`finished`,
    /// `stopped`, `failed`), the rung it stopped at, its error, best metric
    /// and epoch, epochs run, seconds, and each epoch's metrics; with the
    /// metric, the best trial and the rungs.
    pub fn to_json(&self) -> serde_json::Value {
        let trials: Vec<serde_json::Value> = self
            .trials
            .iter()
            .map(|t| {
                let (outcome, stopped_at) = match t.outcome {
                    TrialOutcome::Finished => ("finished", None),
                    TrialOutcome::Stopped { at_epoch } => ("stopped", Some(at_epoch)),
                    TrialOutcome::Failed => ("failed", None),
                };
                serde_json::json!({
                    "trial": t.trial,
                    "job_id": t.job_id,
                    "options": t.options,
                    "outcome": outcome,
                    "stopped_at_epoch": stopped_at,
                    "error": t.error,
                    "best": t.best.map(|b| b.0),
                    "best_epoch": t.best.map(|b| b.1),
                    "epochs": t.history.len(),
                    "seconds": t.elapsed.as_secs_f64(),
                    "history": t.history,
                })
            })
            .collect();
        serde_json::json!({
            "metric": self.metric.name(),
            "best_trial": self.best,
            "rungs": self.rungs,
            "seconds": self.elapsed.as_secs_f64(),
            "trials": trials,
        })
    }

    /// The search's outcome as MLflow tags: the best trial, its options
    /// and metric, how many trials finished and stopped.
    pub(crate) fn tags(&self) -> Vec<(String, String)> {
        let count = |o: fn(&TrialOutcome) -> bool| self.trials.iter().filter(|t| o(&t.outcome)).count();
        let mut tags = vec![
            ("kindling.search.trials".into(), self.trials.len().to_string()),
            (
                "kindling.search.finished".into(),
                count(|o| *o == TrialOutcome::Finished).to_string(),
            ),
            (
                "kindling.search.stopped".into(),
                count(|o| matches!(o, TrialOutcome::Stopped { .. })).to_string(),
            ),
        ];
        if let Some(best) = self.best_trial() {
            tags.push(("kindling.search.best_trial".into(), best.job_id.clone()));
            tags.push(("kindling.search.best_options".into(), space::show(&best.options)));
            if let Some((v, e)) = best.best {
                tags.push((
                    format!("kindling.search.best_{}", self.metric.name()),
                    v.to_string(),
                ));
                tags.push(("kindling.search.best_epoch".into(), e.to_string()));
            }
        }
        tags
    }

    /// One line per trial: options, best metric and its epoch, epochs run,
    /// outcome, time; the best trial marked `*`.
    pub fn table(&self) -> String {
        let name = self.metric.name();
        let rows: Vec<[String; 6]> = self
            .trials
            .iter()
            .map(|t| {
                let mark = if Some(t.trial) == self.best { "*" } else { "" };
                [
                    format!("{}{mark}", t.trial),
                    space::show(&t.options),
                    t.best
                        .map(|(v, _)| format!("{v:.6}"))
                        .unwrap_or_else(|| "-".into()),
                    t.history.len().to_string(),
                    match t.outcome {
                        TrialOutcome::Finished => "finished".into(),
                        TrialOutcome::Stopped { at_epoch } => format!("stopped at {at_epoch}"),
                        TrialOutcome::Failed => "failed".into(),
                    },
                    format!("{:.1}", t.elapsed.as_secs_f64()),
                ]
            })
            .collect();
        let header = ["trial", "options", name, "epochs", "outcome", "seconds"].map(String::from);
        let mut widths = header.clone().map(|h| h.len());
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String; 6]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut out = vec![line(&header)];
        out.extend(rows.iter().map(line));
        for t in self
            .trials
            .iter()
            .filter(|t| t.error.is_some() && t.outcome == TrialOutcome::Failed)
        {
            out.push(format!(
                "trial {} failed: {}",
                t.trial,
                t.error.as_deref().unwrap_or_default()
            ));
        }
        out.join("\n")
    }
}
