//! Evaluation on every rank's eval split after each epoch: loss and
//! accuracy summed over all ranks' rows, so the result is exact and the
//! same on every rank.

use kindling_schemas::spec::Task;

use super::{TrainContext, device_for};
use crate::error::AgentError;
use crate::model::{AnyModel, Batch};
use crate::tensorize;

/// Loss and accuracy over every rank's eval shard (identical on all ranks).
pub(super) fn evaluate(
    ctx: &mut TrainContext,
    model: &dyn AnyModel,
    rank: usize,
    world: usize,
) -> Result<(Option<f64>, Option<f64>), AgentError> {
    let device = device_for(&ctx.spec)?;
    let mut sums = [0f64; 3]; // loss sum, correct, rows
    for cached in &ctx.data.eval() {
        let batch = cached.load()?;
        let n = batch.num_rows();
        if n == 0 {
            continue;
        }
        let input = Batch::new(&batch, &ctx.layout, &ctx.spec, &device);
        let out = model.forward(&input)?;
        let loss = model.loss(out.clone(), &input)?.into_scalar::<f32>() as f64;
        sums[0] += loss * n as f64;
        sums[2] += n as f64;
        if let Task::Classification { .. } = ctx.spec.task {
            let predicted = out.argmax(1).into_data().convert::<i64>();
            let labels = tensorize::class_labels(&batch, &ctx.spec.label)?;
            let p = predicted.as_slice::<i64>().map_err(AgentError::TensorData)?;
            sums[1] += p.iter().zip(&labels).filter(|(a, b)| a == b).count() as f64;
        }
    }
    let mut buf = vec![0f32; 3 * world];
    for (i, s) in sums.iter().enumerate() {
        buf[rank * 3 + i] = *s as f32;
    }
    ctx.runtime.clone().block_on(ctx.ring.all_reduce_sum(&mut buf))?;
    let mut total = [0f64; 3];
    for r in 0..world {
        for i in 0..3 {
            total[i] += buf[r * 3 + i] as f64;
        }
    }
    if total[2] == 0.0 {
        return Ok((None, None));
    }
    let accuracy = matches!(ctx.spec.task, Task::Classification { .. }).then(|| total[1] / total[2]);
    Ok((Some(total[0] / total[2]), accuracy))
}
