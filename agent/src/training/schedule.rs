//! The learning rate by global step ([`LrSchedule`]) and the watch of a
//! monitored metric that reduce-on-plateau and early stopping share
//! ([`Watch`]).
//!
//! Everything here is a pure function of the spec, the position in the job
//! (epoch, step, the epoch's step count) and the history of finished
//! epochs, which a checkpoint carries: so every rank computes the same
//! rate, and a resumed, replaced or shrunk job continues the same curve.

use kindling_schemas::action::EpochMetrics;
use kindling_schemas::spec::{EarlyStopping, JobSpec, Metric, Schedule};

/// A job's learning rate at every step.
#[derive(Clone, Debug, PartialEq)]
pub struct LrSchedule {
    base: f64,
    schedule: Schedule,
    epochs: f64,
}

impl LrSchedule {
    /// The schedule of `spec`.
    pub fn of(spec: &JobSpec) -> Self {
        LrSchedule {
            base: spec.optimizer.learning_rate(),
            schedule: spec.schedule.clone(),
            epochs: spec.epochs as f64,
        }
    }

    /// Whether the rate within an epoch needs that epoch's step count.
    pub fn needs_steps_per_epoch(&self) -> bool {
        self.schedule.needs_steps_per_epoch()
    }

    /// The rate of step `step` (from 0) of the `steps` steps of epoch
    /// `epoch` (from 1), after the finished epochs `history`.
    pub fn rate(&self, epoch: u32, step: u64, steps: u64, history: &[EpochMetrics]) -> f64 {
        self.base * self.factor(epoch, step, steps, history)
    }

    /// The rate as a share of the optimizer's.
    pub fn factor(&self, epoch: u32, step: u64, steps: u64, history: &[EpochMetrics]) -> f64 {
        let steps = steps.max(1) as f64;
        // Where in the job this step starts, in epochs, and one step's length.
        let p = (epoch.max(1) - 1) as f64 + step as f64 / steps;
        let one = 1.0 / steps;
        let total = self.epochs;
        let warmup = self.schedule.warmup_epochs();
        if p < warmup {
            return ((p + one) / warmup).min(1.0);
        }
        let after = p - warmup;
        let span = (total - warmup).max(f64::MIN_POSITIVE);
        let q = (after / span).clamp(0.0, 1.0);
        match self.schedule {
            Schedule::Constant { .. } => 1.0,
            Schedule::Cosine { min_factor, .. } => {
                min_factor + (1.0 - min_factor) * (1.0 + (std::f64::consts::PI * q).cos()) / 2.0
            }
            Schedule::Linear { min_factor, .. } => 1.0 - (1.0 - min_factor) * q,
            Schedule::Step {
                every_epochs, gamma, ..
            } => gamma.powf((after / every_epochs + 1e-9).floor()),
            Schedule::Exponential { gamma, .. } => gamma.powf(after),
            Schedule::OneCycle {
                pct_start,
                div_factor,
                final_div_factor,
            } => {
                let initial = 1.0 / div_factor;
                let last = initial / final_div_factor;
                let q = (p / total).clamp(0.0, 1.0);
                if q <= pct_start {
                    cosine_between(initial, 1.0, q / pct_start)
                } else {
                    cosine_between(1.0, last, (q - pct_start) / (1.0 - pct_start))
                }
            }
            Schedule::Plateau {
                monitor,
                factor,
                patience,
                min_delta,
                min_factor,
            } => {
                let mut watch = Watch::new(monitor, min_delta);
                let mut f = 1.0f64;
                for m in history {
                    watch.observe(m);
                    if watch.wait >= patience {
                        f = (f * factor).max(min_factor);
                        watch.wait = 0;
                    }
                }
                f
            }
        }
    }
}

/// From `start` to `end` along half a cosine, at `t` in `[0, 1]`.
fn cosine_between(start: f64, end: f64, t: f64) -> f64 {
    end + (start - end) * (1.0 + (std::f64::consts::PI * t).cos()) / 2.0
}

/// The value of `metric` in an epoch's metrics, when it was computed.
pub fn metric_value(metric: Metric, m: &EpochMetrics) -> Option<f64> {
    m.get(metric)
}

/// Follows a monitored metric epoch by epoch: the best value, its epoch,
/// and the epochs since it improved (by more than `min_delta`).
#[derive(Clone, Debug, PartialEq)]
pub struct Watch {
    metric: Metric,
    min_delta: f64,
    /// The best value so far.
    pub best: Option<f64>,
    /// The epoch of the best value.
    pub best_epoch: Option<u32>,
    /// Epochs since the best.
    pub wait: u32,
}

impl Watch {
    /// A watch of `metric` with nothing seen.
    pub fn new(metric: Metric, min_delta: f64) -> Self {
        Watch {
            metric,
            min_delta,
            best: None,
            best_epoch: None,
            wait: 0,
        }
    }

    /// Takes an epoch's metrics; returns whether it is the new best. An
    /// epoch without the metric changes nothing.
    pub fn observe(&mut self, m: &EpochMetrics) -> bool {
        let Some(value) = metric_value(self.metric, m) else {
            return false;
        };
        let improved = match self.best {
            None => true,
            Some(best) if self.metric.higher_is_better() => value > best + self.min_delta,
            Some(best) => value < best - self.min_delta,
        };
        if improved {
            self.best = Some(value);
            self.best_epoch = Some(m.epoch);
            self.wait = 0;
        } else {
            self.wait += 1;
        }
        improved
    }
}

/// Early stopping over a job's history: the watch after every finished
/// epoch, and whether training stops there.
#[derive(Clone, Debug, PartialEq)]
pub struct Stopper {
    rule: EarlyStopping,
    /// The watch of the monitored metric.
    pub watch: Watch,
}

impl Stopper {
    /// The stopper of `rule`, replayed over `history` (a resumed job).
    pub fn new(rule: EarlyStopping, history: &[EpochMetrics]) -> Self {
        let mut s = Stopper {
            rule,
            watch: Watch::new(rule.monitor, rule.min_delta),
        };
        for m in history {
            s.watch.observe(m);
        }
        s
    }

    /// Takes a finished epoch; returns whether it is the new best.
    pub fn observe(&mut self, m: &EpochMetrics) -> bool {
        self.watch.observe(m)
    }

    /// Whether the patience ran out.
    pub fn should_stop(&self) -> bool {
        self.watch.wait >= self.rule.patience
    }
}

#[cfg(test)]
mod tests {
    use kindling_schemas::spec::{JobSpec, OptimizerSpec, Schedule, Task};

    use super::*;

    fn spec(schedule: Schedule, epochs: u32) -> JobSpec {
        JobSpec::builder()
            .task(Task::Classification { num_classes: 2 })
            .features(["a"])
            .label("y")
            .optimizer(OptimizerSpec::adamw(0.1, 0.01))
            .epochs(epochs)
            .schedule(schedule)
            .build()
            .expect("spec")
    }

    fn epoch(n: u32, eval_loss: f64) -> EpochMetrics {
        EpochMetrics {
            epoch: n,
            train_loss: eval_loss,
            rows: 1,
            eval_loss: Some(eval_loss),
            eval_accuracy: None,
            samples_per_sec: 0.0,
            wall_secs: None,
            learning_rate: None,
            ..Default::default()
        }
    }

    /// The factor at every global step of a job of `epochs` × `steps`.
    fn curve(s: &LrSchedule, epochs: u32, steps: u64) -> Vec<f64> {
        (1..=epochs)
            .flat_map(|e| (0..steps).map(move |k| (e, k)))
            .map(|(e, k)| s.factor(e, k, steps, &[]))
            .collect()
    }

    #[test]
    fn cosine_with_warmup_matches_its_closed_form_by_global_step() {
        let s = LrSchedule::of(&spec(
            Schedule::Cosine {
                warmup_epochs: 1.0,
                min_factor: 0.1,
            },
            5,
        ));
        let c = curve(&s, 5, 10);
        // Warmup: linear to 1 at the last warmup step.
        for (i, f) in c[..10].iter().enumerate() {
            assert!((f - (i + 1) as f64 / 10.0).abs() < 1e-12, "warmup step {i}: {f}");
        }
        // Decay: the cosine from 1 to 0.1 over the remaining 40 steps.
        for (i, f) in c[10..].iter().enumerate() {
            let q = i as f64 / 40.0;
            let want = 0.1 + 0.9 * (1.0 + (std::f64::consts::PI * q).cos()) / 2.0;
            assert!((f - want).abs() < 1e-12, "decay step {i}: {f} vs {want}");
        }
        assert_eq!(s.rate(2, 0, 10, &[]), 0.1, "the rate is base × factor");
    }

    #[test]
    fn linear_step_exponential_and_one_cycle_follow_their_rules() {
        let lin = LrSchedule::of(&spec(
            Schedule::Linear {
                warmup_epochs: 0.0,
                min_factor: 0.0,
            },
            4,
        ));
        assert!((lin.factor(3, 0, 8, &[]) - 0.5).abs() < 1e-12);
        let step = LrSchedule::of(&spec(
            Schedule::Step {
                warmup_epochs: 0.0,
                every_epochs: 2.0,
                gamma: 0.5,
            },
            6,
        ));
        let by_epoch: Vec<f64> = (1..=6).map(|e| step.factor(e, 0, 4, &[])).collect();
        assert_eq!(by_epoch, vec![1.0, 1.0, 0.5, 0.5, 0.25, 0.25]);
        let exp = LrSchedule::of(&spec(
            Schedule::Exponential {
                warmup_epochs: 0.0,
                gamma: 0.5,
            },
            4,
        ));
        assert!((exp.factor(2, 2, 4, &[]) - 0.5f64.powf(1.5)).abs() < 1e-12);
        let one = LrSchedule::of(&spec(
            Schedule::OneCycle {
                pct_start: 0.25,
                div_factor: 10.0,
                final_div_factor: 100.0,
            },
            4,
        ));
        let c = curve(&one, 4, 100);
        assert!((c[0] - 0.1).abs() < 1e-12, "starts at 1/div: {}", c[0]);
        let peak = c.iter().cloned().fold(0.0, f64::max);
        assert!((peak - 1.0).abs() < 1e-3, "peaks at the rate: {peak}");
        let argmax = c.iter().position(|&f| f == peak).expect("peak");
        assert!(
            (99..=101).contains(&argmax),
            "peak at 25 % of 400 steps: {argmax}"
        );
        assert!(
            *c.last().expect("last") < 0.1 / 100.0 + 1e-4,
            "ends near 1/(div·final_div)"
        );
    }

    #[test]
    fn plateau_reduces_after_patience_epochs_without_improvement() {
        let s = LrSchedule::of(&spec(
            Schedule::Plateau {
                monitor: Metric::EvalLoss,
                factor: 0.5,
                patience: 2,
                min_delta: 0.01,
                min_factor: 0.2,
            },
            10,
        ));
        let losses = [1.0, 0.8, 0.795, 0.81, 0.7, 0.71, 0.705, 0.72, 0.73, 0.74];
        let history: Vec<EpochMetrics> = losses
            .iter()
            .enumerate()
            .map(|(i, &l)| epoch(i as u32 + 1, l))
            .collect();
        let factors: Vec<f64> = (0..=history.len())
            .map(|n| s.factor(n as u32 + 1, 0, 1, &history[..n]))
            .collect();
        // 0.795 and 0.81 are no improvement on 0.8 (min_delta): halve after
        // epoch 4; 0.71, 0.705: halve after epoch 7; 0.72, 0.73: floor 0.2.
        assert_eq!(
            factors,
            vec![1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2]
        );
    }

    #[test]
    fn early_stopping_finds_the_best_epoch_and_stops_after_patience() {
        let history: Vec<EpochMetrics> = [0.5, 0.4, 0.45, 0.42, 0.41]
            .iter()
            .enumerate()
            .map(|(i, &l)| epoch(i as u32 + 1, l))
            .collect();
        let rule = EarlyStopping::new(Metric::EvalLoss, 3);
        let mut s = Stopper::new(rule, &[]);
        let mut stopped = None;
        for m in &history {
            s.observe(m);
            if s.should_stop() {
                stopped = Some(m.epoch);
                break;
            }
        }
        assert_eq!(stopped, Some(5));
        assert_eq!(s.watch.best_epoch, Some(2));
        // Replayed from a checkpoint's history, the same state.
        let resumed = Stopper::new(rule, &history);
        assert_eq!(resumed, s);
        // Accuracy is watched upwards.
        let mut acc = Watch::new(Metric::EvalAccuracy, 0.0);
        for (i, a) in [0.5, 0.7, 0.6].into_iter().enumerate() {
            acc.observe(&EpochMetrics {
                eval_accuracy: Some(a),
                ..epoch(i as u32 + 1, 1.0)
            });
        }
        assert_eq!((acc.best_epoch, acc.wait), (Some(2), 1));
    }
}
