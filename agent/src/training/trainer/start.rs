//! The resume agreement at the start of an attempt: every rank says which
//! checkpoint epoch it holds; the newest any rank holds is broadcast from
//! that rank (weights, optimizer state, history, the best epoch's weights),
//! else rank 0's fresh weights are, so every replica starts identical.

use super::{TrainContext, Trainer, lock};
use crate::error::AgentError;
use crate::models::kindling_model::AnyModel;
use crate::training::checkpoint;

/// Brings `t` and `model` to where the job stands; returns the model and
/// the epoch it starts after.
pub(super) fn agree(
    ctx: &mut TrainContext,
    t: &mut Trainer,
    model: Box<dyn AnyModel>,
) -> Result<(Box<dyn AnyModel>, u32), AgentError> {
    let rt = ctx.runtime.clone();
    let rank = ctx.ring.rank() as usize;
    let world = ctx.ring.world() as usize;
    // The newest checkpoint whose files are whole (a corrupt one is passed
    // over for the one before it).
    let latest = ctx.checkpoints.load_latest()?;
    let mine = latest.as_ref().map_or(0, |c| c.meta.epoch);
    let mut epochs = vec![0f32; world];
    epochs[rank] = mine as f32;
    rt.block_on(ctx.ring.all_reduce_sum(&mut epochs))?;
    let (root, newest) = epochs.iter().enumerate().fold(
        (0usize, 0f32),
        |acc, (r, &e)| if e > acc.1 { (r, e) } else { acc },
    );
    if newest <= 0.0 {
        let payload = (rank == 0).then(|| model.to_record_bytes()).transpose()?;
        let bytes = rt.block_on(ctx.ring.broadcast(0, payload))?;
        return match rank {
            0 => Ok((model, 0)),
            _ => Ok((model.from_record_bytes(bytes)?, 0)),
        };
    }
    let payload = match rank == root {
        true => latest.map(|c| checkpoint::pack(&c)),
        false => None,
    };
    let bytes = rt.block_on(ctx.ring.broadcast(root as u32, payload))?;
    let ckpt = checkpoint::unpack(&bytes)?;
    let model = model.from_record_bytes(ckpt.weights)?;
    t.optim.load_bytes(&ckpt.optimizer)?;
    t.history = ckpt.meta.history;
    t.rows_per_epoch = ckpt.meta.rows_trained_per_epoch;
    t.best = ckpt.meta.best_epoch.zip(ckpt.best);
    let start = ckpt.meta.epoch;
    let mut p = lock(&ctx.progress);
    p.resumed_from_epoch = Some(start);
    p.history = t.history.clone();
    p.rows_trained_per_epoch = t.rows_per_epoch.clone();
    Ok((model, start))
}
