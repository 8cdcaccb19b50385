//! The resume agreement at the start of an attempt: every rank says where
//! the checkpoint it holds stands (epochs done, steps into the next); the
//! newest any rank holds is broadcast from that rank (weights, optimizer
//! state, history, the best epoch's weights, an epoch's partial sums), else
//! rank 0's fresh weights are, so every replica starts identical.

use super::{TrainContext, Trainer, lock};
use crate::error::AgentError;
use crate::models::kindling_model::AnyModel;
use crate::training::checkpoint::{self, PartialEpoch, Position};

/// Brings `t` and `model` to where the job stands; returns the model and
/// the position it starts from (with an epoch's partial sums when that is
/// inside an epoch).
pub(super) fn agree(
    ctx: &mut TrainContext,
    t: &mut Trainer,
    model: Box<dyn AnyModel>,
) -> Result<(Box<dyn AnyModel>, Start), AgentError> {
    let rt = ctx.runtime.clone();
    let rank = ctx.ring.rank() as usize;
    let world = ctx.ring.world() as usize;
    // The newest checkpoint whose files are whole (a corrupt one is passed
    // over for the one before it) and that this gang can resume from (not
    // inside an epoch a gang of another size trained).
    let latest = ctx.checkpoints.load_latest_for(world as u32)?;
    let mine = latest.as_ref().map(|c| c.meta.position()).unwrap_or_default();
    // Every rank's (epochs, steps), exact in f32 below 2^24 steps.
    let mut at = vec![0f32; 2 * world];
    at[2 * rank] = mine.epoch as f32;
    at[2 * rank + 1] = mine.step as f32;
    rt.block_on(ctx.ring.all_reduce_sum(&mut at))?;
    let (root, newest) = (0..world)
        .map(|r| {
            (
                r,
                Position {
                    epoch: at[2 * r] as u32,
                    step: at[2 * r + 1] as u64,
                },
            )
        })
        .fold((0usize, Position::default()), |acc, (r, p)| {
            if p > acc.1 { (r, p) } else { acc }
        });
    if newest == Position::default() {
        let payload = (rank == 0).then(|| model.to_record_bytes()).transpose()?;
        let bytes = rt.block_on(ctx.ring.broadcast(0, payload))?;
        return match rank {
            0 => Ok((model, Start::default())),
            _ => Ok((model.from_record_bytes(bytes)?, Start::default())),
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
    let start = Start {
        at: newest,
        partial: ckpt.meta.partial.filter(|_| newest.step > 0),
    };
    let mut p = lock(&ctx.progress);
    p.resumed_from_epoch = Some(newest.epoch);
    p.resumed_from_step = (newest.step > 0).then_some(newest.step);
    p.history = t.history.clone();
    p.rows_trained_per_epoch = t.rows_per_epoch.clone();
    Ok((model, start))
}

/// Where an attempt starts: after `at.epoch` epochs and `at.step` steps of
/// the next, whose first steps summed `partial`.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Start {
    pub at: Position,
    pub partial: Option<PartialEpoch>,
}
