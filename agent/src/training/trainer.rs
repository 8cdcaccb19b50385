//! The data-parallel training loop. Runs on its own thread (burn is
//! synchronous and CPU-heavy) and calls the async ring through a runtime handle.
//!
//! Per attempt: agree on where to start (the latest checkpoint any rank holds,
//! else rank 0's fresh weights) and broadcast it; per epoch: agree on the
//! number of steps (every rank's row count); per step: forward, backward,
//! all-reduce of `[gradient sums…, rows, weight, loss sum]`, divide by the total weight (the rows, unweighted),
//! the same optimizer step everywhere ([`crate::training::gradients`]: in buckets, the
//! optimizer overlapping the all-reduce, for large models). A rank that ran out of rows contributes
//! zeros, so every row of every shard is trained exactly once per epoch and
//! the replicas stay bitwise identical.
//!
//! Training does not wait for the data: while any rank's train split is still
//! arriving, the epoch is *live*. Each rank trains its committed batches in
//! commit order as they come; every step's all-reduce also carries
//! `[not ready, exhausted]` flags. A rank with no full batch yet waits briefly
//! ([`LIVE_WAIT`]) and then contributes a "not ready" zero; a step that anyone
//! was not ready for is not taken (the others keep their batch for the next
//! round), and the epoch ends when every rank has exhausted an ended split.
//! So each step is every rank's next full batch exactly as without streaming,
//! and the result does not depend on when the rows arrived. The first epoch
//! of a job always trains in commit order (shuffling starts with epoch 2), so
//! streamed and fully-cached starts train identically.
//!
//! A job of one agent on a GPU has nothing to all-reduce: its step stays on
//! the device (the agent's `--gpu-step-on-device`, on by default;
//! [`DeviceOptimizer`]: gradients, optimizer state and master weights there,
//! the losses the only read back, every [`LOSS_READ_EVERY`] steps), and the
//! host's copies are brought up to date at each epoch's end for the
//! checkpoint. On a GPU the batches' inputs staged in the first epoch are
//! kept on the device for the next ones, within a quarter of its memory.
//!
//! A step is `accumulate` micro-batches of `batch_size` rows per rank,
//! their gradient sums added up before the one all-reduce. The learning
//! rate of every step comes from the job's schedule ([`LrSchedule`]) by
//! its position in the job; a schedule that needs each epoch's step count
//! waits for the train split to end before its first epoch. After each
//! epoch: evaluation, early stopping's watch (the best epoch's weights kept
//! beside the last), a checkpoint. From the second epoch, checkpoints also
//! come inside an epoch (`checkpoint.every_steps`, or `every_secs` by rank
//! 0's clock, asked for in the step's trailer so every rank writes one
//! after the same step); an attempt resuming from one trains the rest of
//! that epoch, every rank skipping the rows its first steps trained. So
//! that a shard fed again (to a replacement) is trained in the same order,
//! those epochs order a shard's batches by their origin (producer and
//! sequence number) and seed its shuffle by the shard, not the rank.
//!
//! The parts: `start` (the resume agreement), `epoch` (the epoch plan
//! and its steps), `eval`, [`cursor`](BatchCursor) (batches from the cache).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::tensor::Device;
use kindling_schemas::action::{EpochMetrics, EventLevel};
use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::JobSpec;
use tokio_util::sync::CancellationToken;

use crate::cache::CachedBatch;
use crate::collective::Ring;
use crate::error::{AgentError, TrainingError};
use crate::models::kindling_model::staged::Pipeline;
use crate::models::kindling_model::{AnyModel, ModelRegistry};
use crate::optim::{DeviceOptimizer, FlatOptimizer};
use crate::training::checkpoint::{Checkpoint, CheckpointMeta, CheckpointStore, PartialEpoch, Position};
use crate::training::gradients::{GradientStep, StepTimes};
use crate::training::schedule::{LrSchedule, Stopper};

pub mod cursor;
mod epoch;
mod eval;
mod start;

pub use cursor::{BatchCursor, Pull};
pub use epoch::LOSS_READ_EVERY;

/// Live numbers of a running training, shared with the status endpoint.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Current epoch (from 1).
    pub epoch: u32,
    /// Steps done in the epoch.
    pub step: u64,
    /// Steps in the epoch.
    pub steps_per_epoch: u64,
    /// Mean loss of the latest step across ranks.
    pub loss: Option<f64>,
    /// Samples per second on this rank over the epoch so far.
    pub samples_per_sec: f64,
    /// Rows all ranks trained together per completed epoch.
    pub rows_trained_per_epoch: Vec<u64>,
    /// Completed epochs' metrics.
    pub history: Vec<EpochMetrics>,
    /// Epoch of the checkpoint this attempt resumed from.
    pub resumed_from_epoch: Option<u32>,
    /// Steps into the next epoch of that checkpoint, when it was taken
    /// inside an epoch.
    pub resumed_from_step: Option<u64>,
    /// Where this rank's step time went, this attempt.
    pub step_times: StepTimes,
    /// The loss per step, sampled over the whole run.
    pub step_losses: crate::training::joblog::StepSamples,
    /// With early stopping: the best epoch of the monitored metric so far.
    pub best_epoch: Option<u32>,
    /// The epoch after which early stopping ended training.
    pub stopped_early: Option<u32>,
}

/// Everything one rank needs to train one attempt.
#[derive(Debug)]
pub struct TrainContext {
    /// The job.
    pub job_id: String,
    /// Attempt.
    pub attempt: u32,
    /// What to train.
    pub spec: JobSpec,
    /// The models the spec can name.
    pub models: ModelRegistry,
    /// How batches map to the model input.
    pub layout: FeatureLayout,
    /// This rank's shards, train split possibly still arriving.
    pub data: Arc<dyn ShardSource>,
    /// The ring to the other ranks.
    pub ring: Ring,
    /// Runtime to drive the ring from this thread.
    pub runtime: tokio::runtime::Handle,
    /// Where checkpoints go.
    pub checkpoints: CheckpointStore,
    /// Live progress.
    pub progress: Arc<Mutex<Progress>>,
    /// Fires when the attempt fails or the job is cancelled.
    pub cancel: CancellationToken,
    /// Shuffle the order of cached batches every epoch.
    pub shuffle: bool,
    /// How a GPU job uses the device (the agent's `--gpu-*` flags).
    pub gpu: GpuSettings,
    /// Where it tells the job's users what they should know.
    pub report: Report,
    /// The weights to start from (`init_from`) instead of seeded ones.
    pub initial: Option<arrow::array::RecordBatch>,
}

/// Says a warning or an error in the job's log (`job_status` and the
/// client show it) and the agent's.
#[derive(Clone)]
pub struct Report(pub Arc<ReportFn>);

/// What [`Report`] calls: the event's level and message.
pub type ReportFn = dyn Fn(EventLevel, &str) + Send + Sync;

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Report")
    }
}

/// How a GPU job uses its device: the agent's `--gpu-*` flags.
#[derive(Debug, Clone, Copy)]
pub struct GpuSettings {
    /// Keep the step on the device (only the gradients leave it, for a
    /// data-parallel job's all-reduce).
    pub step_on_device: bool,
    /// Gradient values per all-reduce bucket of a data-parallel step kept
    /// on the device.
    pub bucket_values: usize,
    /// Device bytes the job keeps its rows' inputs in (each cached batch
    /// whole) for the epochs after the first; `None`: a quarter of the
    /// adapter's memory.
    pub kept_bytes: Option<u64>,
}

/// How long a rank with no full batch waits for rows before it tells its
/// peers it is not ready (they wait for it inside the all-reduce meanwhile).
pub const LIVE_WAIT: Duration = Duration::from_millis(200);

/// A rank's cached data as the trainer sees it: the train split may still be
/// arriving; batches are addressed by commit index, which never changes.
pub trait ShardSource: Send + Sync + std::fmt::Debug {
    /// Committed train batches from index `from` on, and whether the train
    /// split has ended (no more batches will commit).
    fn train_since(&self, from: usize) -> (Vec<Arc<CachedBatch>>, bool);
    /// Where the first `n` committed train batches came from, by commit
    /// index (`None` where unknown: commit order is then kept).
    fn train_origins(&self, n: usize) -> Vec<Option<crate::cache::Origin>> {
        vec![None; n]
    }
    /// The committed eval batches.
    fn eval(&self) -> Vec<Arc<CachedBatch>>;
    /// Blocks until data may have changed since the last `train_since`, or
    /// `timeout` passed.
    fn wait(&self, timeout: Duration);
}

/// The result of a successful training.
#[derive(Debug)]
pub struct TrainOutcome {
    /// The trained model (inference mode, plain device): the best epoch's
    /// with early stopping's `restore_best`, else the last's.
    pub model: Box<dyn AnyModel>,
    /// Metrics per epoch.
    pub history: Vec<EpochMetrics>,
}

/// The burn device for a spec (see [`crate::models::backend::for_spec`]).
pub fn device_for(spec: &JobSpec) -> Result<Device, AgentError> {
    crate::models::backend::for_spec(spec)
}

fn lock(p: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// The state one rank carries from epoch to epoch.
struct Trainer {
    spec: JobSpec,
    device: Device,
    optim: FlatOptimizer,
    /// The master copy of the weights the optimizer steps (the model's, flat).
    weights: Vec<f32>,
    gradient_step: GradientStep,
    times: StepTimes,
    schedule: LrSchedule,
    history: Vec<EpochMetrics>,
    rows_per_epoch: Vec<u64>,
    stopper: Option<Stopper>,
    /// The best epoch's weights (burn record bytes), with `restore_best`.
    best: Option<(u32, Vec<u8>)>,
    /// Steps' gradients, the next batch staged meanwhile on a GPU.
    pipeline: Pipeline,
    /// On a GPU: the optimizer, its state and the master weights kept on the
    /// device (only the gradient sums leave it, for the all-reduce of a
    /// data-parallel job).
    resident: Option<DeviceOptimizer>,
    /// When the last checkpoint was written (or training started): rank 0
    /// asks for one inside an epoch `checkpoint.every_secs` later.
    last_checkpoint: std::time::Instant,
    /// Whether it said that batches did not fit on the device.
    warned_not_kept: bool,
}

/// Device bytes a GPU job keeps its batches' inputs in for the epochs after
/// the first ([`Pipeline::keeping`]): `kept` where the agent says, else a
/// quarter of the adapter's memory; none off the GPU or where the adapter
/// states no size.
fn kept_batches_budget(device: &Device, kept: Option<u64>) -> u64 {
    if !crate::models::backend::is_gpu(device) {
        return 0;
    }
    if let Some(bytes) = kept {
        return bytes;
    }
    crate::models::backend::gpu()
        .ok()
        .and_then(|(_, info)| info.memory_bytes)
        .map_or(0, |bytes| bytes / 4)
}

/// Trains one attempt to the end. Returns early with an error when the ring
/// fails (a peer died), the token is cancelled, the loss diverges, or the
/// train split is empty on every rank.
pub fn train(mut ctx: TrainContext) -> Result<TrainOutcome, AgentError> {
    let spec = ctx.spec.clone();
    let device = device_for(&spec)?.autodiff();
    let model = {
        // Initial weights always come from the CPU's seeded RNG, so a seed gives
        // the same weights on every device (the GPU's RNG draws differently).
        let init = ctx.models.build_seeded(&spec, &ctx.layout, spec.seed)?;
        // Pretrained weights (checked by name and shape) replace the seeded
        // ones; a checkpoint, when there is one, still wins (`start::agree`).
        let init = match &ctx.initial {
            Some(table) => init.from_arrow(table)?,
            None => init,
        };
        if spec.use_gpu {
            let on_device = ctx.models.build(&spec, &ctx.layout, &device)?;
            on_device.from_record_bytes(init.to_record_bytes()?)?
        } else {
            init
        }
    };
    let optim = FlatOptimizer::for_job(&spec, &model.param_layout())?;
    let mut t = Trainer {
        pipeline: Pipeline::new(crate::models::backend::is_gpu(&device))
            .keeping(kept_batches_budget(&device, ctx.gpu.kept_bytes)),
        device,
        weights: Vec::new(),
        gradient_step: GradientStep {
            device_bucket_values: ctx.gpu.bucket_values,
            ..GradientStep::for_spec(&spec)
        },
        times: StepTimes::default(),
        schedule: LrSchedule::of(&spec),
        history: Vec::new(),
        rows_per_epoch: Vec::new(),
        stopper: None,
        best: None,
        resident: None,
        last_checkpoint: std::time::Instant::now(),
        warned_not_kept: false,
        optim,
        spec,
    };
    let (mut model, start) = start::agree(&mut ctx, &mut t, model)?;
    let mut resume = Some(start).filter(|s| s.at.step > 0);
    t.weights = model.flat_weights();
    if ctx.gpu.step_on_device && crate::models::backend::is_gpu(&t.device) {
        let layout = model.param_layout();
        let clip_norm = t.gradient_step.clip_norm;
        t.resident = Some(DeviceOptimizer::upload(
            &t.optim, &t.weights, &layout, clip_norm, &t.device,
        ));
    }
    t.stopper = t.spec.early_stopping.map(|rule| Stopper::new(rule, &t.history));
    for epoch in start.at.epoch + 1..=t.spec.epochs {
        let (trained, metrics) = epoch::train_epoch(&mut ctx, &mut t, model, epoch, resume.take())?;
        model = trained;
        t.say_if_batches_not_kept(&ctx, epoch);
        let stop = t.observe(&mut ctx, model.as_ref(), metrics)?;
        let every = t.spec.checkpoint.every_epochs;
        if every > 0 && (epoch % every == 0 || epoch == t.spec.epochs || stop) {
            let at = Position { epoch, step: 0 };
            t.checkpoint(&ctx, model.as_ref(), at, None)?;
        }
        if stop {
            tracing::info!(job = %ctx.job_id, epoch, best = ?t.best_epoch(), "early stopping");
            lock(&ctx.progress).stopped_early = Some(epoch);
            break;
        }
    }
    let keep_best = t.spec.early_stopping.is_some_and(|s| s.restore_best);
    // The last epoch's weights are already the model's when it was the best.
    let model = match t.best.take() {
        Some((epoch, bytes)) if keep_best && Some(epoch) != t.history.last().map(|m| m.epoch) => {
            model.from_record_bytes(bytes)?
        }
        _ => model,
    };
    Ok(TrainOutcome {
        model: model.valid(),
        history: t.history,
    })
}

impl Trainer {
    /// Warns, once, when the epoch staged batches it could not keep on the
    /// device and more epochs follow: they upload them again.
    fn say_if_batches_not_kept(&mut self, ctx: &TrainContext, epoch: u32) {
        let passed_over = self.pipeline.take_passed_over();
        let budget = self.pipeline.kept_budget();
        if passed_over == 0 || budget == 0 || epoch >= self.spec.epochs || self.warned_not_kept {
            return;
        }
        self.warned_not_kept = true;
        (ctx.report.0)(
            EventLevel::Warn,
            &format!(
                "{} of this rank's batches (inputs) did not fit in the {} of device memory the agent \
                 keeps them in ({} kept): every epoch uploads them again, which slows it; raise the \
                 agent's --gpu-kept-bytes if the GPU has the room",
                size(passed_over),
                size(budget),
                size(self.pipeline.kept_bytes()),
            ),
        );
    }
}

/// `bytes` for a reader, in GiB, MiB or KiB.
fn size(bytes: u64) -> String {
    let (unit, scale) = match bytes {
        b if b >= 1 << 30 => ("GiB", 1u64 << 30),
        b if b >= 1 << 20 => ("MiB", 1 << 20),
        _ => ("KiB", 1 << 10),
    };
    format!("{:.1} {unit}", bytes as f64 / scale as f64)
}

/// The error when `field` watches an eval metric and the job has no eval
/// split (a metric undefined for one epoch's rows, such as AUC with one
/// class, only skips that epoch).
fn require_metric(
    job_id: &str,
    field: &'static str,
    metric: kindling_schemas::spec::Metric,
    metrics: &EpochMetrics,
) -> Result<(), AgentError> {
    match metric.needs_eval() && metrics.eval_loss.is_none() {
        true => Err(TrainingError::NoEvalSplit {
            job_id: job_id.to_owned(),
            field,
            metric: metric.name(),
        }
        .into()),
        false => Ok(()),
    }
}

impl Trainer {
    /// The best epoch so far, with early stopping.
    fn best_epoch(&self) -> Option<u32> {
        self.stopper.as_ref().and_then(|s| s.watch.best_epoch)
    }

    /// Takes a finished epoch's metrics: the history, early stopping's
    /// watch and the best weights. Returns whether training stops here.
    fn observe(
        &mut self,
        ctx: &mut TrainContext,
        model: &dyn AnyModel,
        metrics: EpochMetrics,
    ) -> Result<bool, AgentError> {
        let epoch = metrics.epoch;
        let mut stop = false;
        if let Some(stopper) = self.stopper.as_mut() {
            if let Some(rule) = self.spec.early_stopping {
                require_metric(&ctx.job_id, "early_stopping.monitor", rule.monitor, &metrics)?;
            }
            if stopper.observe(&metrics) && self.spec.early_stopping.is_some_and(|s| s.restore_best) {
                self.best = Some((epoch, model.to_record_bytes()?));
            }
            stop = stopper.should_stop() && epoch < self.spec.epochs;
        }
        if let kindling_schemas::spec::Schedule::Plateau { monitor, .. } = self.spec.schedule {
            require_metric(&ctx.job_id, "schedule.monitor", monitor, &metrics)?;
        }
        tracing::info!(job = %ctx.job_id, epoch, loss = metrics.train_loss, eval_accuracy = ?metrics.eval_accuracy, "epoch done");
        self.history.push(metrics);
        let mut p = lock(&ctx.progress);
        p.history = self.history.clone();
        p.rows_trained_per_epoch = self.rows_per_epoch.clone();
        p.best_epoch = self.best_epoch();
        Ok(stop)
    }

    /// Writes a checkpoint at `at`: an epoch's end, or `at.step` steps into
    /// epoch `at.epoch + 1`, whose steps so far summed `partial`.
    fn checkpoint(
        &mut self,
        ctx: &TrainContext,
        model: &dyn AnyModel,
        at: Position,
        partial: Option<PartialEpoch>,
    ) -> Result<(), AgentError> {
        self.last_checkpoint = std::time::Instant::now();
        let ckpt = Checkpoint {
            meta: CheckpointMeta {
                epoch: at.epoch,
                step: at.step,
                partial,
                attempt: ctx.attempt,
                rows_trained_per_epoch: self.rows_per_epoch.clone(),
                history: self.history.clone(),
                best_epoch: self.best.as_ref().map(|(e, _)| *e),
                // Filled in by the store as it writes them.
                files: Vec::new(),
            },
            weights: model.to_record_bytes()?,
            optimizer: self.optim.to_bytes(),
            best: self.best.as_ref().map(|(_, b)| b.clone()),
        };
        ctx.checkpoints.save(&self.spec, &ckpt)?;
        Ok(())
    }
}

/// The optimizer step on an all-reduced buffer from [`AnyModel::gradients`]:
/// averages the gradient sums over the total rows, steps the flat `weights`
/// and writes them into the model. Returns the model, the total rows and the
/// summed loss (no step when no rank had rows).
pub fn apply_summed_gradients(
    model: Box<dyn AnyModel>,
    optim: &mut FlatOptimizer,
    weights: &mut [f32],
    mut buf: Vec<f32>,
) -> (Box<dyn AnyModel>, f64, f64) {
    let step_loss = buf.pop().unwrap_or(0.0) as f64;
    let n_total = buf.pop().unwrap_or(0.0) as f64;
    buf.pop(); // the rows: the weight divides
    if n_total <= 0.0 {
        return (model, n_total, step_loss);
    }
    optim.step(weights, &buf, (1.0 / n_total) as f32);
    (model.load_flat(weights), n_total, step_loss)
}
