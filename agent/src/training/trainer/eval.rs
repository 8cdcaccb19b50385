//! Evaluation on every rank's eval split after each epoch: each rank
//! tallies its rows ([`Tally`]), the ring gathers every rank's tally, and
//! every rank merges them in rank order — so the loss and every metric are
//! exact over all ranks' rows and bitwise the same on every rank.

use std::collections::BTreeMap;

use burn::tensor::activation::softmax;
use kindling_schemas::scoring::{Tally, TallyKind};
use kindling_schemas::spec::Task;

use super::{TrainContext, device_for};
use crate::error::{AgentError, ModelError};
use crate::models::kindling_model::{AnyModel, Batch};
use crate::models::tensorize;

/// One epoch's evaluation over every rank's eval shard.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Evaluation {
    /// The model's (weighted) mean loss; `None` without eval rows.
    pub loss: Option<f64>,
    /// Share of rows classified right (classification).
    pub accuracy: Option<f64>,
    /// Every other metric by name (see `kindling_schemas::scoring`).
    pub metrics: BTreeMap<String, f64>,
}

/// Evaluates `model` on every rank's eval shard (identical on all ranks).
pub(super) fn evaluate(
    ctx: &mut TrainContext,
    model: &dyn AnyModel,
    rank: usize,
    world: usize,
) -> Result<Evaluation, AgentError> {
    let device = device_for(&ctx.spec)?;
    let kind = TallyKind::for_spec(&ctx.spec);
    let names = model.metric_names();
    let mut tally = Tally::new(kind, names.len());
    let (mut loss_sum, mut weight) = (0f64, 0f64);
    for cached in &ctx.data.eval() {
        let batch = cached.load()?;
        if batch.num_rows() == 0 {
            continue;
        }
        let input = Batch::new(&batch, &ctx.layout, &ctx.spec, &device);
        let out = model.forward(&input)?;
        let weights = input.row_weights()?;
        let w: f64 = match &weights {
            Some(w) => w.iter().map(|&v| v as f64).sum(),
            None => batch.num_rows() as f64,
        };
        if w > 0.0 {
            let loss = model.loss(out.clone(), &input)?.into_scalar::<f32>() as f64;
            loss_sum += loss * w;
            weight += w;
        }
        tally.add_custom(&model.metric_sums(&out, &input)?);
        // Metrics weigh rows by the sample-weight column only: class
        // weights shape the loss, not what is measured.
        let row_weights = tensorize::sample_weights(&batch, &ctx.spec)?;
        match kind {
            TallyKind::Classes { .. } => {
                let probabilities = floats(softmax(out, 1))?;
                let labels = tensorize::class_labels(&batch, &ctx.spec.label)?;
                tally.add_classes(&probabilities, &labels, row_weights.as_deref());
            }
            TallyKind::Values { .. } => {
                let targets = tensorize::target_values(&batch, &ctx.spec.label)?;
                tally.add_values(&floats(out)?, &targets, row_weights.as_deref());
            }
        }
    }
    let mut sums = tally.to_sums();
    sums.extend([loss_sum, weight]);
    let gathered = gather_f64(ctx, rank, world, &sums)?;
    let mut total = Tally::new(kind, names.len());
    let (mut loss_sum, mut weight) = (0f64, 0f64);
    let scores = match kind {
        TallyKind::Classes { classes: 2, .. } => gather_scores(ctx, rank, &gathered, tally.scores())?,
        _ => vec![Vec::new(); world],
    };
    for (sums, scores) in gathered.iter().zip(scores) {
        let (fixed, own) = sums.split_at(sums.len() - 2);
        total.merge(&Tally::from_sums(kind, names.len(), fixed, scores));
        loss_sum += own[0];
        weight += own[1];
    }
    if total.rows() == 0 {
        return Ok(Evaluation::default());
    }
    let mut report = total.report(names);
    let accuracy = report.metrics.remove("eval_accuracy");
    Ok(Evaluation {
        loss: (weight > 0.0).then(|| loss_sum / weight),
        accuracy: matches!(ctx.spec.task, Task::Classification { .. })
            .then_some(accuracy)
            .flatten(),
        metrics: report.metrics,
    })
}

/// A tensor's values, row-major.
fn floats(t: burn::tensor::Tensor<2>) -> Result<Vec<f32>, AgentError> {
    let d = t.into_data().convert::<f32>();
    Ok(d.as_slice::<f32>().map_err(ModelError::TensorData)?.to_vec())
}

/// Every rank's `values` (all ranks pass the same length), in rank order.
/// Each `f64` travels as two `f32`s (high part and remainder) in this
/// rank's own slot of a zeroed buffer, so the ring's sum copies it exactly.
fn gather_f64(
    ctx: &mut TrainContext,
    rank: usize,
    world: usize,
    values: &[f64],
) -> Result<Vec<Vec<f64>>, AgentError> {
    let len = values.len();
    let mut buf = vec![0f32; 2 * len * world];
    for (i, &x) in values.iter().enumerate() {
        let hi = x as f32;
        buf[2 * (rank * len + i)] = hi;
        buf[2 * (rank * len + i) + 1] = (x - hi as f64) as f32;
    }
    ctx.runtime.clone().block_on(ctx.ring.all_reduce_sum(&mut buf))?;
    Ok(buf
        .chunks_exact(2 * len)
        .map(|r| r.chunks_exact(2).map(|p| p[0] as f64 + p[1] as f64).collect())
        .collect())
}

/// Every rank's `(score, label, weight)` rows of a two-class eval split,
/// in rank order; each rank's count is the rows its gathered tally holds.
fn gather_scores(
    ctx: &mut TrainContext,
    rank: usize,
    gathered: &[Vec<f64>],
    mine: &[[f32; 3]],
) -> Result<Vec<Vec<[f32; 3]>>, AgentError> {
    let counts: Vec<usize> = gathered.iter().map(|s| s[0] as usize).collect();
    let total: usize = counts.iter().sum();
    if total == 0 {
        return Ok(vec![Vec::new(); counts.len()]);
    }
    let start: usize = counts[..rank].iter().sum();
    let mut buf = vec![0f32; 3 * total];
    buf[3 * start..3 * (start + mine.len())].copy_from_slice(mine.as_flattened());
    ctx.runtime.clone().block_on(ctx.ring.all_reduce_sum(&mut buf))?;
    let mut out = Vec::with_capacity(counts.len());
    let mut at = 0;
    for n in counts {
        out.push(
            buf[3 * at..3 * (at + n)]
                .chunks_exact(3)
                .map(|c| [c[0], c[1], c[2]])
                .collect(),
        );
        at += n;
    }
    Ok(out)
}
