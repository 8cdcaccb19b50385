//! Exact evaluation metrics from sums: each rank (or each batch of a
//! prediction stream) tallies its rows into a [`Tally`], tallies merge in
//! any grouping, and [`Tally::report`] turns the total into the metrics
//! scikit-learn computes from all the rows at once — never an average of
//! per-rank averages. Written here because the state must be plain sums a
//! ring all-reduce can carry and merge bit for bit alike on every rank,
//! which no metrics crate exposes.
//!
//! Definitions (scikit-learn 1.9, with `sample_weight` when the job weights
//! its rows): `accuracy_score`; `log_loss` on the predicted probabilities
//! clipped to `[ε, 1 − ε]` with `ε = f32::EPSILON`; `precision_score`,
//! `recall_score` and `f1_score` with `average="macro"` over the classes
//! that occur as truth or prediction (a class without predictions counts
//! 0, `zero_division=0`) and `average="micro"`; `confusion_matrix`;
//! `top_k_accuracy_score` (ties ranked as its stable sort ranks them); for
//! two classes `roc_auc_score` and `average_precision_score` on the
//! probability of class 1; `root_mean_squared_error`,
//! `mean_absolute_error`, `r2_score` and `mean_absolute_percentage_error`
//! averaged uniformly over the targets.

use std::collections::BTreeMap;

use crate::spec::{JobSpec, Metric, Task};

/// What a tally counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TallyKind {
    /// Class probabilities against class ids.
    Classes {
        /// Number of classes.
        classes: usize,
        /// `k` of the top-k accuracy (reported when below `classes`).
        top_k: usize,
    },
    /// Predicted values against targets.
    Values {
        /// Values per row.
        targets: usize,
    },
}

impl TallyKind {
    /// The kind a job's spec evaluates.
    pub fn for_spec(spec: &JobSpec) -> TallyKind {
        match spec.task {
            Task::Classification { num_classes } => TallyKind::Classes {
                classes: num_classes,
                top_k: spec.top_k as usize,
            },
            Task::Regression => TallyKind::Values {
                targets: spec.targets,
            },
        }
    }
}

/// Per target of a regression: `[weight, mean y, M2 of y, Σw·e², Σw·|e|,
/// Σw·|e|/max(|y|, ε)]`; the mean and M2 merge by Chan's rule, so R²
/// keeps its precision when the targets' mean is far from zero.
const VALUE_SUMS: usize = 6;

/// The sums of rows seen so far (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq)]
pub struct Tally {
    kind: TallyKind,
    rows: u64,
    /// Classes: `[weight, log-loss sum, top-k hits]`, the confusion matrix
    /// (`truth · classes + prediction`), then per class the rows that have
    /// it as truth or prediction (unweighted: which classes occur).
    /// Values: [`VALUE_SUMS`] per target.
    sums: Vec<f64>,
    /// Two classes: `(probability of class 1, label, weight)` of every row.
    scores: Vec<[f32; 3]>,
    /// A model's own metrics: `(sum, count)` each.
    custom: Vec<(f64, f64)>,
}

/// Per-row weights of a batch, or all ones.
fn weight(weights: Option<&[f32]>, row: usize) -> f64 {
    weights.map_or(1.0, |w| w[row] as f64)
}

impl Tally {
    /// An empty tally with room for `custom` metrics of a model's own.
    pub fn new(kind: TallyKind, custom: usize) -> Tally {
        let sums = match kind {
            TallyKind::Classes { classes, .. } => 3 + classes * classes + classes,
            TallyKind::Values { targets } => VALUE_SUMS * targets,
        };
        Tally {
            kind,
            rows: 0,
            sums: vec![0.0; sums],
            scores: Vec::new(),
            custom: vec![(0.0, 0.0); custom],
        }
    }

    /// What it counts.
    pub fn kind(&self) -> TallyKind {
        self.kind
    }

    /// Rows tallied.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Adds rows of class probabilities (`probabilities[row · classes + c]`)
    /// with their class ids and optional weights.
    ///
    /// # Panics
    /// If the slices' lengths disagree with each other or with the kind.
    pub fn add_classes(&mut self, probabilities: &[f32], labels: &[i64], weights: Option<&[f32]>) {
        let TallyKind::Classes { classes, top_k } = self.kind else {
            panic!("add_classes on a tally of values");
        };
        assert_eq!(
            probabilities.len(),
            labels.len() * classes,
            "probabilities per row"
        );
        let eps = f32::EPSILON as f64;
        for (row, (p, &label)) in probabilities.chunks_exact(classes).zip(labels).enumerate() {
            let w = weight(weights, row);
            let y = label as usize;
            let predicted = argmax(p);
            let py = p[y];
            self.sums[0] += w;
            self.sums[1] += w * -(py as f64).clamp(eps, 1.0 - eps).ln();
            // Rank of the true class in a stable ascending sort reversed:
            // higher scores first, and among equal scores the later class.
            let above = p
                .iter()
                .enumerate()
                .filter(|&(c, &s)| s > py || (s == py && c > y))
                .count();
            if above < top_k {
                self.sums[2] += w;
            }
            self.sums[3 + y * classes + predicted] += w;
            let seen = 3 + classes * classes;
            self.sums[seen + y] += 1.0;
            self.sums[seen + predicted] += 1.0;
            if classes == 2 {
                self.scores.push([p[1], y as f32, w as f32]);
            }
        }
        self.rows += labels.len() as u64;
    }

    /// Adds rows of predicted values against targets (`[row · targets + t]`
    /// each) with optional weights.
    ///
    /// # Panics
    /// If the slices' lengths disagree with each other or with the kind.
    pub fn add_values(&mut self, predicted: &[f32], targets: &[f32], weights: Option<&[f32]>) {
        let TallyKind::Values { targets: width } = self.kind else {
            panic!("add_values on a tally of classes");
        };
        assert_eq!(predicted.len(), targets.len(), "a prediction per target");
        let rows = targets.len() / width;
        for row in 0..rows {
            let w = weight(weights, row);
            if w == 0.0 {
                continue;
            }
            for t in 0..width {
                let (y, p) = (targets[row * width + t] as f64, predicted[row * width + t] as f64);
                let s = &mut self.sums[t * VALUE_SUMS..(t + 1) * VALUE_SUMS];
                s[0] += w;
                let delta = y - s[1];
                s[1] += delta * w / s[0];
                s[2] += w * delta * (y - s[1]);
                let e = y - p;
                s[3] += w * e * e;
                s[4] += w * e.abs();
                s[5] += w * e.abs() / y.abs().max(f64::EPSILON);
            }
        }
        self.rows += rows as u64;
    }

    /// Adds a batch's sums of a model's own metrics (one `(sum, count)` per
    /// metric, in the model's order).
    pub fn add_custom(&mut self, sums: &[(f64, f64)]) {
        for (acc, (s, n)) in self.custom.iter_mut().zip(sums) {
            acc.0 += s;
            acc.1 += n;
        }
    }

    /// Adds another tally of the same kind.
    pub fn merge(&mut self, other: &Tally) {
        self.rows += other.rows;
        match self.kind {
            TallyKind::Classes { .. } => {
                for (a, b) in self.sums.iter_mut().zip(&other.sums) {
                    *a += b;
                }
            }
            TallyKind::Values { .. } => {
                for (a, b) in self
                    .sums
                    .chunks_exact_mut(VALUE_SUMS)
                    .zip(other.sums.chunks_exact(VALUE_SUMS))
                {
                    merge_values(a, b);
                }
            }
        }
        self.scores.extend_from_slice(&other.scores);
        self.add_custom(&other.custom);
    }

    /// The fixed-size part as numbers, for a collective to carry: rows,
    /// the sums, the custom sums.
    pub fn to_sums(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(1 + self.sums.len() + 2 * self.custom.len());
        out.push(self.rows as f64);
        out.extend_from_slice(&self.sums);
        out.extend(self.custom.iter().flat_map(|&(s, n)| [s, n]));
        out
    }

    /// Length of [`to_sums`](Self::to_sums) for a kind and custom count.
    pub fn sums_len(kind: TallyKind, custom: usize) -> usize {
        Tally::new(kind, custom).to_sums().len()
    }

    /// A tally from [`to_sums`](Self::to_sums) and the scores of its rows.
    ///
    /// # Panics
    /// If `sums` has another length than [`sums_len`](Self::sums_len).
    pub fn from_sums(kind: TallyKind, custom: usize, sums: &[f64], scores: Vec<[f32; 3]>) -> Tally {
        let mut t = Tally::new(kind, custom);
        assert_eq!(sums.len(), Tally::sums_len(kind, custom), "tally length");
        t.rows = sums[0] as u64;
        let n = t.sums.len();
        t.sums.copy_from_slice(&sums[1..1 + n]);
        for (i, c) in t.custom.iter_mut().enumerate() {
            *c = (sums[1 + n + 2 * i], sums[2 + n + 2 * i]);
        }
        t.scores = scores;
        t
    }

    /// Every row's `(probability of class 1, label, weight)`, for two
    /// classes (empty otherwise).
    pub fn scores(&self) -> &[[f32; 3]] {
        &self.scores
    }

    /// The metrics of the rows tallied; `custom_names` name the model's own
    /// metrics (reported as `eval_<name>`).
    pub fn report(&self, custom_names: &[&str]) -> Report {
        let mut metrics = Vec::new();
        let mut confusion = None;
        match self.kind {
            TallyKind::Classes { classes, top_k } => {
                let w = self.sums[0];
                if w > 0.0 {
                    let cm = &self.sums[3..3 + classes * classes];
                    let seen = &self.sums[3 + classes * classes..];
                    classification(&mut metrics, cm, seen, classes, w);
                    metrics.push((Metric::EvalLogLoss.name().to_owned(), self.sums[1] / w));
                    if top_k < classes {
                        metrics.push((Metric::EvalTopKAccuracy.name().to_owned(), self.sums[2] / w));
                    }
                    if classes == 2 {
                        let (roc, ap) = binary_curves(&self.scores);
                        metrics.extend(roc.map(|v| (Metric::EvalAucRoc.name().to_owned(), v)));
                        metrics.extend(ap.map(|v| (Metric::EvalPrAuc.name().to_owned(), v)));
                    }
                    confusion = Some(cm.chunks_exact(classes).map(<[f64]>::to_vec).collect());
                }
            }
            TallyKind::Values { targets } => {
                let per: Vec<&[f64]> = self.sums.chunks_exact(VALUE_SUMS).collect();
                if per.first().is_some_and(|s| s[0] > 0.0) {
                    let mean =
                        |f: &dyn Fn(&[f64]) -> f64| per.iter().map(|s| f(s)).sum::<f64>() / targets as f64;
                    metrics.push((
                        Metric::EvalRmse.name().to_owned(),
                        mean(&|s| (s[3] / s[0]).sqrt()),
                    ));
                    metrics.push((Metric::EvalMae.name().to_owned(), mean(&|s| s[4] / s[0])));
                    metrics.push((
                        Metric::EvalR2.name().to_owned(),
                        mean(&|s| match (s[3] == 0.0, s[2] == 0.0) {
                            (true, _) => 1.0,
                            (false, true) => 0.0,
                            (false, false) => 1.0 - s[3] / s[2],
                        }),
                    ));
                    metrics.push((Metric::EvalMape.name().to_owned(), mean(&|s| s[5] / s[0])));
                }
            }
        }
        for (name, &(sum, n)) in custom_names.iter().zip(&self.custom) {
            if n > 0.0 {
                metrics.push((format!("eval_{name}"), sum / n));
            }
        }
        Report {
            rows: self.rows,
            metrics: metrics.into_iter().collect(),
            confusion,
        }
    }
}

/// The index of the first largest value (as `numpy.argmax`).
fn argmax(p: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in p.iter().enumerate() {
        if v > p[best] {
            best = i;
        }
    }
    best
}

/// Merges `[weight, mean, M2, …sums]` of `b` into `a` (Chan et al.).
fn merge_values(a: &mut [f64], b: &[f64]) {
    let w = a[0] + b[0];
    if b[0] == 0.0 {
        return;
    }
    if a[0] == 0.0 {
        a.copy_from_slice(b);
        return;
    }
    let delta = b[1] - a[1];
    a[1] += delta * b[0] / w;
    a[2] += b[2] + delta * delta * a[0] * b[0] / w;
    a[0] = w;
    for i in 3..VALUE_SUMS {
        a[i] += b[i];
    }
}

/// Accuracy, macro and micro precision / recall / F1 from a confusion
/// matrix of total weight `w`.
fn classification(metrics: &mut Vec<(String, f64)>, cm: &[f64], seen: &[f64], classes: usize, w: f64) {
    let at = |t: usize, p: usize| cm[t * classes + p];
    let tp_all: f64 = (0..classes).map(|c| at(c, c)).sum();
    let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
    let (mut precision, mut recall, mut f1, mut present) = (0.0, 0.0, 0.0, 0.0);
    for c in (0..classes).filter(|&c| seen[c] > 0.0) {
        let tp = at(c, c);
        let predicted: f64 = (0..classes).map(|t| at(t, c)).sum();
        let actual: f64 = (0..classes).map(|p| at(c, p)).sum();
        precision += ratio(tp, predicted);
        recall += ratio(tp, actual);
        f1 += ratio(2.0 * tp, predicted + actual);
        present += 1.0;
    }
    // Micro precision, recall and F1 of single-label classes all equal the
    // pooled TP over every row's weight.
    let micro = ratio(tp_all, w);
    metrics.extend([
        (Metric::EvalAccuracy.name().to_owned(), tp_all / w),
        (
            Metric::EvalPrecisionMacro.name().to_owned(),
            ratio(precision, present),
        ),
        (Metric::EvalRecallMacro.name().to_owned(), ratio(recall, present)),
        (Metric::EvalF1Macro.name().to_owned(), ratio(f1, present)),
        (Metric::EvalF1Micro.name().to_owned(), micro),
    ]);
}

/// Area under the ROC curve and average precision of `(score, label,
/// weight)` rows; `None` where one class has no weight (undefined).
fn binary_curves(scores: &[[f32; 3]]) -> (Option<f64>, Option<f64>) {
    let mut rows: Vec<[f32; 3]> = scores.iter().copied().filter(|r| r[2] != 0.0).collect();
    rows.sort_by(|a, b| b[0].total_cmp(&a[0]));
    // Cumulative true and false positives at each distinct threshold.
    let (mut tps, mut fps) = (0f64, 0f64);
    let mut points = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let w = r[2] as f64;
        match r[1] == 1.0 {
            true => tps += w,
            false => fps += w,
        }
        if rows.get(i + 1).is_none_or(|next| next[0] != r[0]) {
            points.push((tps, fps));
        }
    }
    let (p_total, n_total) = (tps, fps);
    if p_total <= 0.0 {
        return (None, None);
    }
    let mut ap = 0.0;
    let mut prev_recall = 0.0;
    for &(tp, fp) in &points {
        let recall = tp / p_total;
        ap += (recall - prev_recall) * tp / (tp + fp);
        prev_recall = recall;
    }
    if n_total <= 0.0 {
        return (None, Some(ap));
    }
    let (mut auc, mut prev) = (0.0, (0.0, 0.0));
    for &(tp, fp) in &points {
        let (tpr, fpr) = (tp / p_total, fp / n_total);
        auc += (fpr - prev.1) * (tpr + prev.0) / 2.0;
        prev = (tpr, fpr);
    }
    (Some(auc), Some(ap))
}

/// The metrics of a tally: by name (`eval_accuracy`, …, `eval_<own>`), and
/// for classes the confusion matrix.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// Rows evaluated.
    pub rows: u64,
    /// Each metric's value by its name.
    pub metrics: BTreeMap<String, f64>,
    /// Weighted counts, `[truth][prediction]` (classification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confusion: Option<Vec<Vec<f64>>>,
}

impl Report {
    /// A metric's value, when the task has it.
    pub fn get(&self, metric: Metric) -> Option<f64> {
        self.metrics.get(metric.name()).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(n: usize) -> TallyKind {
        TallyKind::Classes { classes: n, top_k: 3 }
    }

    #[test]
    fn a_tally_split_and_merged_equals_the_whole() {
        let probs: Vec<f32> = (0..30).map(|i| ((i * 7 % 11) as f32 + 1.0) / 20.0).collect();
        let labels: Vec<i64> = (0..10).map(|i| (i * 5 % 3) as i64).collect();
        let weights: Vec<f32> = (0..10).map(|i| 0.5 + i as f32).collect();
        let mut whole = Tally::new(classes(3), 0);
        whole.add_classes(&probs, &labels, Some(&weights));
        let mut a = Tally::new(classes(3), 0);
        a.add_classes(&probs[..12], &labels[..4], Some(&weights[..4]));
        let mut b = Tally::new(classes(3), 0);
        b.add_classes(&probs[12..], &labels[4..], Some(&weights[4..]));
        a.merge(&b);
        let close = |x: &Report, y: &Report| {
            assert_eq!(
                x.metrics.keys().collect::<Vec<_>>(),
                y.metrics.keys().collect::<Vec<_>>()
            );
            for (name, v) in &x.metrics {
                assert!(
                    (v - y.metrics[name]).abs() < 1e-12,
                    "{name}: {v} vs {}",
                    y.metrics[name]
                );
            }
        };
        close(&a.report(&[]), &whole.report(&[]));
        let back = Tally::from_sums(a.kind(), 0, &a.to_sums(), a.scores().to_vec());
        assert_eq!(back.report(&[]), a.report(&[]));
        assert!(
            whole.report(&[]).get(Metric::EvalTopKAccuracy).is_none(),
            "k = 2 of 3 classes"
        );
    }

    #[test]
    fn regression_sums_merge_like_one_pass() {
        let y: Vec<f32> = (0..40).map(|i| 1000.0 + (i as f32 * 0.37).sin()).collect();
        let p: Vec<f32> = y.iter().map(|v| v + 0.1).collect();
        let mut whole = Tally::new(TallyKind::Values { targets: 2 }, 0);
        whole.add_values(&p, &y, None);
        let mut parts = Tally::new(TallyKind::Values { targets: 2 }, 0);
        for (pc, yc) in p.chunks(6).zip(y.chunks(6)) {
            let mut t = Tally::new(TallyKind::Values { targets: 2 }, 0);
            t.add_values(pc, yc, None);
            parts.merge(&t);
        }
        let (a, b) = (whole.report(&[]), parts.report(&[]));
        for (name, v) in &a.metrics {
            assert!(
                (v - b.metrics[name]).abs() < 1e-9,
                "{name}: {v} vs {}",
                b.metrics[name]
            );
        }
        assert!((a.get(Metric::EvalMae).expect("mae") - 0.1).abs() < 1e-4);
    }

    #[test]
    fn binary_curves_of_a_perfect_and_a_reversed_ranking() {
        let rows = |flip: bool| -> Vec<[f32; 3]> {
            (0..8)
                .map(|i| [i as f32 / 8.0, ((i >= 4) != flip) as u8 as f32, 1.0])
                .collect()
        };
        assert_eq!(binary_curves(&rows(false)), (Some(1.0), Some(1.0)));
        assert_eq!(binary_curves(&rows(true)).0, Some(0.0));
        // One class only: undefined.
        assert_eq!(binary_curves(&[[0.3, 0.0, 1.0], [0.6, 0.0, 1.0]]).0, None);
    }
}
