//! Asynchronous successive halving (ASHA, Li et al. 2020), in its stopping
//! form as Ray Tune's `ASHAScheduler` runs it: rungs at `grace · ηᵏ`
//! epochs below the trials' length; a trial reaching a rung continues only
//! if its metric is at least the (1 − 1/η) quantile of what the trials
//! before it recorded there (the first at a rung always continues).

/// What the scheduler decided at an epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Train on.
    Continue,
    /// Stop: at the rung `epoch` the metric fell below `cutoff`.
    Stop {
        /// The rung.
        epoch: u32,
        /// The quantile the trial had to reach (in the metric's own sense).
        cutoff: f64,
    },
}

/// The rungs and what each recorded.
#[derive(Debug, Clone)]
pub struct Asha {
    /// Rung epochs, ascending, with what trials recorded there (as scores:
    /// higher is better).
    rungs: Vec<(u32, Vec<f64>)>,
    eta: u32,
    higher_is_better: bool,
}

impl Asha {
    /// Rungs at `grace · etaᵏ < max_epochs`.
    pub fn new(grace: u32, eta: u32, max_epochs: u32, higher_is_better: bool) -> Self {
        let mut rungs = Vec::new();
        let mut at = grace.max(1) as u64;
        while at < max_epochs as u64 {
            rungs.push((at as u32, Vec::new()));
            at *= eta.max(2) as u64;
        }
        Asha {
            rungs,
            eta: eta.max(2),
            higher_is_better,
        }
    }

    /// The rung epochs.
    pub fn rungs(&self) -> Vec<u32> {
        self.rungs.iter().map(|(e, _)| *e).collect()
    }

    /// A trial's metric after `epoch`: recorded at the rung if `epoch` is
    /// one; stop when it is below the cut the earlier trials set there.
    /// A NaN metric is the worst.
    pub fn on_epoch(&mut self, epoch: u32, metric: f64) -> Decision {
        let eta = self.eta;
        let Some((_, recorded)) = self.rungs.iter_mut().find(|(e, _)| *e == epoch) else {
            return Decision::Continue;
        };
        let score = match (metric.is_nan(), self.higher_is_better) {
            (true, _) => f64::NEG_INFINITY,
            (false, true) => metric,
            (false, false) => -metric,
        };
        let cutoff = quantile(recorded, 1.0 - 1.0 / eta as f64);
        recorded.push(score);
        match cutoff {
            Some(cut) if score < cut => Decision::Stop {
                epoch,
                cutoff: if self.higher_is_better { cut } else { -cut },
            },
            _ => Decision::Continue,
        }
    }
}

/// numpy's `percentile` with linear interpolation, `q` in [0, 1]; `None`
/// for no values.
fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_grow_by_eta_below_the_length() {
        assert_eq!(Asha::new(1, 3, 10, false).rungs(), vec![1, 3, 9]);
        assert_eq!(Asha::new(2, 2, 8, true).rungs(), vec![2, 4]);
        assert!(Asha::new(4, 3, 4, true).rungs().is_empty());
    }

    #[test]
    fn quantiles_match_numpy() {
        // numpy.percentile([1, 2, 3, 4], 66.67) = 3.0001; [5] → 5; [1, 3] at 50 % → 2.
        let q = quantile(&[4.0, 1.0, 3.0, 2.0], 2.0 / 3.0).expect("q");
        assert!((q - 3.0).abs() < 1e-9, "{q}");
        assert_eq!(quantile(&[5.0], 0.9), Some(5.0));
        assert_eq!(quantile(&[1.0, 3.0], 0.5), Some(2.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn a_trial_below_the_earlier_trials_cut_stops_at_the_rung() {
        // Lower is better (a loss); η = 2: a trial must be at least the median.
        let mut asha = Asha::new(1, 2, 4, false);
        assert_eq!(asha.on_epoch(1, 0.5), Decision::Continue); // first at the rung
        assert_eq!(asha.on_epoch(1, 0.4), Decision::Continue); // better
        // Recorded 0.5 and 0.4: the median loss is 0.45; 0.6 is worse.
        assert_eq!(
            asha.on_epoch(1, 0.6),
            Decision::Stop {
                epoch: 1,
                cutoff: 0.45
            }
        );
        // Epochs that are no rung never stop a trial.
        assert_eq!(asha.on_epoch(3, 9.0), Decision::Continue);
        assert_eq!(asha.on_epoch(2, 0.1), Decision::Continue);
        assert_eq!(
            asha.on_epoch(2, f64::NAN),
            Decision::Stop {
                epoch: 2,
                cutoff: 0.1
            }
        );
        // Higher is better (accuracy).
        let mut acc = Asha::new(1, 3, 3, true);
        assert_eq!(acc.on_epoch(1, 0.9), Decision::Continue);
        assert!(matches!(acc.on_epoch(1, 0.8), Decision::Stop { .. }));
    }
}
