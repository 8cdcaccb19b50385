//! One epoch on one rank: the plan every rank agrees on at its start
//! ([`EpochPlan`]), then its steps — gather `accumulate` micro-batches,
//! exchange, step — and evaluation.

use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor};
use kindling_schemas::action::EpochMetrics;

use super::cursor::{BatchCursor, Pull};
use super::start::Start;
use super::{LIVE_WAIT, Progress, TrainContext, Trainer, eval, lock};
use crate::error::{AgentError, JobStateError, TrainingError};
use crate::models::kindling_model::staged::Next;
use crate::models::kindling_model::{AnyModel, DeviceShare, StepError};
use crate::training::checkpoint::{PartialEpoch, Position};
use crate::training::gradients::Trailer;

/// What every rank agreed at an epoch's start.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct EpochPlan {
    /// Some rank's train split is still arriving: the epoch trains as the
    /// rows come and ends when every rank has exhausted an ended split.
    pub live: bool,
    /// Steps in the epoch (0 when live: known when it ends).
    pub steps: u64,
    /// Train rows per rank.
    pub rows: Vec<u64>,
}

/// What the plan was agreed on: this rank's committed train batches, and
/// whether its split had ended, as the cursor starts from them.
type Committed = (Vec<std::sync::Arc<crate::cache::CachedBatch>>, bool);

impl EpochPlan {
    /// The plan from every rank's `(rows, ended)`, summed by the ring, for
    /// steps of `rows_per_step` rows per rank.
    fn from_counts(counts: &[f32], rows_per_step: u64) -> Self {
        let world = counts.len() - 1;
        let rows: Vec<u64> = counts[..world].iter().map(|&n| n as u64).collect();
        let live = counts[world] > 0.0;
        let steps = match live {
            true => 0,
            false => rows.iter().map(|n| n.div_ceil(rows_per_step)).max().unwrap_or(0),
        };
        EpochPlan { live, steps, rows }
    }

    /// Agrees the plan with every rank. With `wait_for_data`, loops (every
    /// rank in step) until no rank's split is arriving any more.
    fn agree(
        ctx: &mut TrainContext,
        rows_per_step: u64,
        wait_for_data: bool,
    ) -> Result<(Self, Committed), AgentError> {
        let rank = ctx.ring.rank() as usize;
        let world = ctx.ring.world() as usize;
        loop {
            let (train, ended) = ctx.data.train_since(0);
            let mut counts = vec![0f32; world + 1];
            counts[rank] = train.iter().map(|b| b.rows() as u64).sum::<u64>() as f32;
            counts[world] = if ended { 0.0 } else { 1.0 };
            ctx.runtime.block_on(ctx.ring.all_reduce_sum(&mut counts))?;
            let plan = Self::from_counts(&counts, rows_per_step);
            if !(plan.live && wait_for_data) {
                return Ok((plan, (train, ended)));
            }
            if ctx.cancel.is_cancelled() {
                return Err(cancelled(ctx));
            }
            ctx.data.wait(LIVE_WAIT);
        }
    }

    /// The empty-input error when no rank holds a train row.
    fn check_not_empty(&self, job_id: &str) -> Result<(), AgentError> {
        if self.live || self.rows.iter().any(|&n| n > 0) {
            return Ok(());
        }
        Err(empty(job_id, self.rows.len()))
    }
}

fn empty(job_id: &str, ranks: usize) -> AgentError {
    TrainingError::EmptyTrainSplit {
        job_id: job_id.to_owned(),
        counted: format!("0 rows committed on each of its {ranks} agent(s) when the split ended"),
    }
    .into()
}

fn cancelled(ctx: &TrainContext) -> AgentError {
    JobStateError::AttemptFailed {
        job_id: ctx.job_id.clone(),
        attempt: ctx.attempt,
        cause: "cancelled".into(),
    }
    .into()
}

/// This rank's share of the step being gathered: the sums of up to
/// `accumulate` micro-batches' gradients (on the device, in the
/// [`DeviceOptimizer`](crate::optim::DeviceOptimizer), when the step stays
/// there; their losses too, read after the step).
#[derive(Clone, Debug, Default)]
struct Local {
    sums: Vec<f32>,
    rows: u64,
    weight: f64,
    loss_sum: f64,
    micro: u32,
    losses: Vec<Tensor<1>>,
}

impl Local {
    /// Adds a micro-batch's buffer from `AnyModel::gradients` (sums, then
    /// `[rows, weight, loss sum]`).
    fn add(slot: &mut Option<Local>, mut buf: Vec<f32>) {
        let loss = buf.pop().unwrap_or(0.0) as f64;
        let weight = buf.pop().unwrap_or(0.0) as f64;
        let rows = buf.pop().unwrap_or(0.0) as u64;
        match slot {
            Some(l) => {
                for (s, g) in l.sums.iter_mut().zip(&buf) {
                    *s += g;
                }
                l.rows += rows;
                l.weight += weight;
                l.loss_sum += loss;
                l.micro += 1;
            }
            None => {
                *slot = Some(Local {
                    sums: buf,
                    rows,
                    weight,
                    loss_sum: loss,
                    micro: 1,
                    losses: Vec::new(),
                })
            }
        }
    }

    /// Adds a micro-batch whose gradient sums stayed on the device.
    fn add_device(slot: &mut Option<Local>, share: DeviceShare) {
        let l = slot.get_or_insert_with(Local::default);
        l.rows += share.rows;
        l.weight += share.weight;
        l.micro += 1;
        l.losses.extend(share.loss_sum);
    }
}

/// Steps kept on the device between reads of their losses: a loss read is
/// the step's only wait for the device, and on an H200 reading it every 100
/// steps instead of each made the step 1.25–1.34× faster
/// (`docs/benchmarks.md#gpu`). A divergence is then named up to this many
/// steps late (still at the step whose loss was not finite); the epoch's end
/// reads whatever is left.
pub const LOSS_READ_EVERY: usize = 25;

/// The losses of steps kept on the device that are not read yet, each step's
/// summed on the device.
#[derive(Debug, Default)]
struct UnreadLosses {
    /// Per step: its index in the epoch and its weight.
    steps: Vec<(u64, f64)>,
    losses: Vec<Tensor<1>>,
}

impl UnreadLosses {
    /// Adds step `step`'s micro-batch losses (none for a rank without rows).
    fn push(&mut self, step: u64, weight: f64, losses: Vec<Tensor<1>>, device: &Device) {
        let loss = match losses.len() {
            0 => Tensor::zeros([1], device),
            1 => losses.into_iter().next().expect("one loss"),
            _ => Tensor::cat(losses, 0).sum(),
        };
        self.steps.push((step, weight));
        self.losses.push(loss);
    }

    fn due(&self) -> bool {
        self.losses.len() >= LOSS_READ_EVERY
    }

    /// Reads the steps' losses back in one transfer: `(step, weight, loss
    /// sum)` each; the first non-finite one is the divergence error at its
    /// step.
    fn read(&mut self, epoch: u32) -> Result<Vec<(u64, f64, f32)>, AgentError> {
        if self.losses.is_empty() {
            return Ok(Vec::new());
        }
        let losses = std::mem::take(&mut self.losses);
        let data = Tensor::cat(losses, 0).into_data().convert::<f32>();
        let values = data.as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_default();
        let steps = std::mem::take(&mut self.steps);
        let mut read = Vec::with_capacity(steps.len());
        for ((step, weight), loss) in steps.into_iter().zip(values) {
            if !loss.is_finite() {
                return Err(StepError::NonFinite(loss as f64).at(epoch, step));
            }
            read.push((step, weight, loss));
        }
        Ok(read)
    }
}

/// Adds steps' losses, read back (`(step, weight, loss sum)` each), to the
/// epoch's sum and to the job's progress: the latest step's mean loss and
/// each step's in the sampled history.
fn record_losses(p: &mut Progress, epoch: u32, read: Vec<(u64, f64, f32)>, loss_sum: &mut f64) {
    for (at, weight, loss) in read {
        *loss_sum += loss as f64;
        p.loss = (weight > 0.0).then(|| loss as f64 / weight);
        if let Some(loss) = p.loss {
            p.step_losses.push(epoch, at + 1, loss);
        }
    }
}

/// Where an epoch's batches come from and what this rank gathered of the
/// step: the cursor, a batch pulled ahead of its step (staged while the step
/// before runs), whether the shard has ended, and the micro-batches so far.
struct Gather {
    cursor: BatchCursor,
    ahead: Option<Pull>,
    drained: bool,
    local: Option<Local>,
    accumulate: u32,
}

impl Gather {
    fn new(cursor: BatchCursor, accumulate: u32) -> Self {
        Gather {
            cursor,
            ahead: None,
            drained: false,
            local: None,
            accumulate,
        }
    }

    /// Gathers micro-batches until the step's are in or the shard ends.
    /// Returns whether this rank is not ready (a live split with no full
    /// batch yet).
    fn gather(
        &mut self,
        ctx: &TrainContext,
        t: &mut Trainer,
        model: &dyn AnyModel,
        (epoch, step): (u32, u64),
    ) -> Result<bool, AgentError> {
        while !self.drained && self.local.as_ref().is_none_or(|l| l.micro < self.accumulate) {
            let pulled = match self.ahead.take() {
                Some(pulled) => pulled,
                None => self.cursor.pull(LIVE_WAIT)?,
            };
            let batch = match pulled {
                Pull::Ready(batch, _) => batch,
                Pull::NotYet => return Ok(true),
                Pull::Exhausted => {
                    self.drained = true;
                    continue;
                }
            };
            // The next batch, where it is in already, is staged while this one runs.
            self.ahead = match self.cursor.pull(Duration::ZERO)? {
                Pull::NotYet => None,
                next => Some(next),
            };
            let next = match &self.ahead {
                Some(Pull::Ready(next, pieces)) => Some(Next::Cut(next, pieces.as_slice())),
                _ => None,
            };
            let computing = Instant::now();
            let (pipeline, layout, spec, device) = (&mut t.pipeline, &ctx.layout, &t.spec, &t.device);
            match t.resident.as_mut() {
                Some(opt) => {
                    let share = pipeline
                        .run(&batch, next, layout, spec, device, |b| {
                            model.device_gradients(b, opt)
                        })
                        .map_err(|e| e.at(epoch, step))?;
                    Local::add_device(&mut self.local, share);
                }
                None => {
                    let buf = pipeline
                        .gradients(model, &batch, next, layout, spec, device)
                        .map_err(|e| e.at(epoch, step))?;
                    Local::add(&mut self.local, buf);
                }
            }
            t.times.compute += computing.elapsed();
        }
        Ok(false)
    }
}

/// The step's buffer from this rank's share (`[sums…, trailer]`; the
/// trailer alone when the step stays on the device), its rows and the
/// losses still on the device.
fn step_buffer(
    t: &Trainer,
    model: &dyn AnyModel,
    mine: Option<Local>,
    (not_ready, exhausted, checkpoint): (bool, bool, bool),
) -> (Vec<f32>, u64, Vec<Tensor<1>>) {
    let checkpoint = if checkpoint { 1.0 } else { 0.0 };
    match mine {
        Some(l) => {
            let trailer = Trailer {
                rows: l.rows as f32,
                weight: l.weight as f32,
                loss_sum: l.loss_sum as f32,
                checkpoint,
                ..Trailer::default()
            };
            let mut buf = l.sums;
            trailer.append_to(&mut buf);
            (buf, l.rows, l.losses)
        }
        None => {
            let mut buf = match t.resident {
                Some(_) => Vec::new(),
                None => model.zero_grads(),
            };
            let trailer = Trailer {
                not_ready: if not_ready { 1.0 } else { 0.0 },
                exhausted: if exhausted { 1.0 } else { 0.0 },
                checkpoint,
                ..Trailer::default()
            };
            trailer.append_to(&mut buf);
            (buf, 0, Vec::new())
        }
    }
}

/// The step: all-reduced and taken on the host's weights, or, on a GPU,
/// taken on the device (the gradient sums all-reduced bucket by bucket
/// around it when there are several ranks). `take` decides from the summed
/// trailer whether the step is taken and with what scale. Returns the model,
/// stepped where the step was taken.
fn take_step(
    ctx: &mut TrainContext,
    t: &mut Trainer,
    model: Box<dyn AnyModel>,
    buf: &mut [f32],
    lr: f64,
    take: impl FnOnce(&Trailer) -> Option<f32>,
) -> Result<Box<dyn AnyModel>, AgentError> {
    t.optim.set_learning_rate(lr);
    let Some(opt) = t.resident.as_mut() else {
        let grads = t.weights.len();
        let gradient_step = &t.gradient_step;
        let taken = gradient_step.run(
            (&ctx.runtime, &mut ctx.ring),
            (buf, grads),
            (&mut t.optim, &mut t.weights),
            &mut t.times,
            take,
        )?;
        return Ok(if taken { model.load_flat(&t.weights) } else { model });
    };
    opt.set_learning_rate(lr);
    let scale = match ctx.ring.world() {
        // One rank: nothing to all-reduce.
        1 => {
            t.times.steps += 1;
            take(&Trailer::of(buf))
        }
        _ => {
            let (rt, ring, times) = (&ctx.runtime, &mut ctx.ring, &mut t.times);
            t.gradient_step
                .exchange_on_device(rt, ring, opt, times, buf, take)?
        }
    };
    let Some(scale) = scale else {
        return Ok(model);
    };
    let started = Instant::now();
    let model = model.device_step(opt, scale);
    t.times.optimizer += started.elapsed();
    Ok(model)
}

/// The losses ready to record after step `step` (`sum` its all-reduced
/// trailer, `losses` this rank's on the device when it kept its step there
/// alone): `(step, weight, loss sum)` each.
fn read_losses(
    t: &mut Trainer,
    unread: &mut UnreadLosses,
    (epoch, step): (u32, u64),
    world: usize,
    sum: &Trailer,
    losses: Vec<Tensor<1>>,
) -> Result<Vec<(u64, f64, f32)>, AgentError> {
    Ok(match t.resident.as_mut() {
        Some(opt) if world == 1 => {
            opt.clear(); // what a step not taken gathered
            unread.push(step, sum.weight as f64, losses, &t.device);
            match unread.due() {
                true => unread.read(epoch)?,
                false => Vec::new(),
            }
        }
        // A data-parallel step on the device: its loss came back with the
        // gradients (after the step, as a loss read back one rank does).
        Some(opt) => {
            opt.clear();
            if !sum.loss_sum.is_finite() {
                return Err(StepError::NonFinite(sum.loss_sum as f64).at(epoch, step));
            }
            vec![(step, sum.weight as f64, sum.loss_sum)]
        }
        None => vec![(step, sum.weight as f64, sum.loss_sum)],
    })
}

/// What an epoch's steps summed so far on this rank, and since when it
/// trains (a resumed epoch counts the time of its steps before the
/// checkpoint).
#[derive(Debug)]
struct Sums {
    loss_sum: f64,
    weight_total: f64,
    rows_total: f64,
    rows_mine: u64,
    started: Instant,
}

impl Sums {
    /// The sums at the epoch's start, or where `resume` left it: returns
    /// them and the steps done; this rank's cursor skips the rows its first
    /// steps trained (`rows_per_step` each, of its `rows`).
    fn start(
        resume: Option<Start>,
        cursor: &mut BatchCursor,
        rows_per_step: u64,
        rows: u64,
    ) -> Result<(Sums, u64), AgentError> {
        let now = Instant::now();
        let Some(Start { at, partial }) = resume else {
            return Ok((
                Sums {
                    loss_sum: 0.0,
                    weight_total: 0.0,
                    rows_total: 0.0,
                    rows_mine: 0,
                    started: now,
                },
                0,
            ));
        };
        let rows_mine = (at.step * rows_per_step).min(rows);
        cursor.skip_rows(rows_mine)?;
        let p = partial.unwrap_or_default();
        let sums = Sums {
            loss_sum: p.loss_sum,
            weight_total: p.weight_total,
            rows_total: p.rows_total,
            rows_mine,
            started: now.checked_sub(Duration::from_secs_f64(p.secs)).unwrap_or(now),
        };
        Ok((sums, at.step))
    }

    fn samples_per_sec(&self) -> f64 {
        self.rows_mine as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    /// What a checkpoint inside the epoch records of these sums.
    fn partial(&self) -> PartialEpoch {
        PartialEpoch {
            loss_sum: self.loss_sum,
            weight_total: self.weight_total,
            rows_total: self.rows_total,
            secs: self.started.elapsed().as_secs_f64(),
            world: 0,
        }
    }
}

/// Writes a checkpoint after `step` steps of `epoch` (the losses still on
/// the device read first, the host's copies of a step kept there brought
/// up to date).
fn checkpoint_inside(
    ctx: &TrainContext,
    t: &mut Trainer,
    model: &dyn AnyModel,
    unread: &mut UnreadLosses,
    (epoch, step): (u32, u64),
    sums: &mut Sums,
) -> Result<(), AgentError> {
    let rest = unread.read(epoch)?;
    record_losses(&mut lock(&ctx.progress), epoch, rest, &mut sums.loss_sum);
    if let Some(opt) = &t.resident {
        opt.download_into(&mut t.optim, &mut t.weights);
    }
    let at = Position {
        epoch: epoch - 1,
        step,
    };
    let partial = PartialEpoch {
        world: ctx.ring.world(),
        ..sums.partial()
    };
    t.checkpoint(ctx, model, at, Some(partial))
}

/// Trains epoch `epoch` and evaluates it; returns its metrics. With
/// `resume` (a checkpoint taken inside this epoch), trains the rest of it:
/// every rank skips the rows its first steps trained, in the same order.
/// Epochs after the first start once every rank's shard is whole: fed again
/// after a failure, taken over by a shrunk gang, or moved to a grown gang's
/// newcomer (the giver's split reopened until the rows it gave are gone).
pub(super) fn train_epoch(
    ctx: &mut TrainContext,
    t: &mut Trainer,
    mut model: Box<dyn AnyModel>,
    epoch: u32,
    resume: Option<Start>,
) -> Result<(Box<dyn AnyModel>, EpochMetrics), AgentError> {
    let rank = ctx.ring.rank() as usize;
    let world = ctx.ring.world() as usize;
    let accumulate = t.spec.accumulate.max(1);
    let rows_per_step = t.spec.batch_size as u64 * accumulate as u64;
    // Only epoch 1 trains rows as they arrive; a later one waits for whole
    // shards (fed again, taken over or moved), to train each row once.
    let wait = t.schedule.needs_steps_per_epoch() || resume.is_some() || epoch > 1;
    let (plan, committed) = EpochPlan::agree(ctx, rows_per_step, wait)?;
    plan.check_not_empty(&ctx.job_id)?;
    let live = plan.live;
    let mut g = Gather::new(
        super::cursor::for_epoch(ctx, &t.spec, committed, epoch, live),
        accumulate,
    );
    let (mut sums, mut step) = Sums::start(resume, &mut g.cursor, rows_per_step, plan.rows[rank])?;
    if step > 0 {
        tracing::info!(job = %ctx.job_id, epoch, step, rows = sums.rows_mine, "resuming inside the epoch");
    }
    {
        let mut p = lock(&ctx.progress);
        (p.epoch, p.step, p.steps_per_epoch) = (epoch, step, plan.steps);
    }
    // Checkpoints inside the epoch: from the second (the first trains in
    // commit order, which a shard fed again does not keep), once its
    // shards are whole.
    let inside = !live && epoch > 1;
    let policy = t.spec.checkpoint.clone();
    let mut unread = UnreadLosses::default();
    let mut lr = t.optim.learning_rate();
    loop {
        if !live && step >= plan.steps {
            break;
        }
        if ctx.cancel.is_cancelled() {
            return Err(cancelled(ctx));
        }
        let not_ready = g.gather(ctx, t, model.as_ref(), (epoch, step))?;
        let exhausted = g.drained && g.local.is_none();
        // A live step may not be taken: keep this rank's gradients until it is.
        let mine = match (not_ready, live) {
            (true, _) => None,
            (false, true) => g.local.clone(),
            (false, false) => g.local.take(),
        };
        let due = policy.every_secs > 0 && t.last_checkpoint.elapsed().as_secs() >= policy.every_secs;
        let flags = (not_ready, exhausted, inside && rank == 0 && due);
        let (mut buf, rows, mut losses) = step_buffer(t, model.as_ref(), mine, flags);
        if let Some(opt) = t.resident.as_mut().filter(|_| world > 1) {
            // A data-parallel rank's loss goes with its gradients' all-reduce.
            opt.set_loss(std::mem::take(&mut losses));
        }
        lr = t.schedule.rate(epoch, step, plan.steps, &t.history);
        let world_f = world as f32;
        let take = |sum: &Trailer| {
            let skipped = live && (sum.not_ready > 0.0 || sum.exhausted >= world_f);
            (!skipped && sum.weight > 0.0).then(|| 1.0 / sum.weight)
        };
        model = take_step(ctx, t, model, &mut buf, lr, take)?;
        let sum = Trailer::of(&buf);
        if live {
            if sum.not_ready > 0.0 {
                continue; // nobody steps; ready ranks keep their batch
            }
            if sum.exhausted >= world_f {
                break;
            }
        }
        g.local = None;
        sums.rows_mine += rows;
        sums.weight_total += sum.weight as f64;
        sums.rows_total += sum.rows as f64;
        let read = read_losses(t, &mut unread, (epoch, step), world, &sum, losses)?;
        step += 1;
        {
            let mut p = lock(&ctx.progress);
            record_losses(&mut p, epoch, read, &mut sums.loss_sum);
            (p.step, p.samples_per_sec, p.step_times) = (step, sums.samples_per_sec(), t.times.clone());
        }
        let by_steps = policy.every_steps > 0 && step % policy.every_steps == 0;
        if inside && step < plan.steps && (by_steps || sum.checkpoint > 0.0) {
            checkpoint_inside(ctx, t, model.as_ref(), &mut unread, (epoch, step), &mut sums)?;
        }
    }
    let rest = unread.read(epoch)?;
    record_losses(&mut lock(&ctx.progress), epoch, rest, &mut sums.loss_sum);
    if live {
        lock(&ctx.progress).steps_per_epoch = step;
        if sums.rows_total == 0.0 {
            return Err(empty(&ctx.job_id, world));
        }
    }
    if let Some(opt) = &t.resident {
        // The host's copies, for a checkpoint and the next attempt.
        opt.download_into(&mut t.optim, &mut t.weights);
    }
    let eval = eval::evaluate(ctx, model.valid().as_ref(), rank, world)?;
    t.rows_per_epoch.push(sums.rows_total as u64);
    let metrics = EpochMetrics {
        epoch,
        train_loss: match sums.weight_total > 0.0 {
            true => sums.loss_sum / sums.weight_total,
            false => 0.0,
        },
        rows: sums.rows_mine,
        eval_loss: eval.loss,
        eval_accuracy: eval.accuracy,
        metrics: eval.metrics,
        samples_per_sec: sums.samples_per_sec(),
        wall_secs: Some(sums.started.elapsed().as_secs_f64()),
        learning_rate: Some(lr),
    };
    Ok((model, metrics))
}

#[cfg(test)]
mod tests {
    use super::EpochPlan;

    #[test]
    fn a_plan_counts_steps_of_every_rows_per_step_and_waits_while_live() {
        // Ranks with 1000 and 700 rows, steps of 4 × 64 rows.
        let plan = EpochPlan::from_counts(&[1000.0, 700.0, 0.0], 256);
        assert_eq!((plan.live, plan.steps), (false, 4));
        assert!(plan.check_not_empty("j").is_ok());
        let live = EpochPlan::from_counts(&[0.0, 0.0, 1.0], 256);
        assert!(live.live && live.check_not_empty("j").is_ok(), "still arriving");
        let err = EpochPlan::from_counts(&[0.0, 0.0, 0.0], 256)
            .check_not_empty("j")
            .expect_err("empty");
        let msg = err.to_string();
        assert!(
            msg.contains("train split of job `j` is empty") && msg.contains("2 agent(s)"),
            "{msg}"
        );
        assert!(msg.contains("no model is saved"), "{msg}");
    }
}
