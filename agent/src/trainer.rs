//! The data-parallel training loop. Runs on its own thread (burn is
//! synchronous and CPU-heavy) and calls the async ring through a runtime handle.
//!
//! Per attempt: agree on where to start (the latest checkpoint any rank holds,
//! else rank 0's fresh weights) and broadcast it; per epoch: agree on the
//! number of steps (every rank's row count); per step: forward, backward,
//! all-reduce of `[gradient sums…, rows, loss sum]`, divide by the total rows,
//! the same optimizer step everywhere ([`crate::exchange`]: in buckets, the
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

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use burn::tensor::Device;
use kindling_schemas::action::EpochMetrics;
use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::{JobSpec, Task};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use tokio_util::sync::CancellationToken;

use crate::cache::CachedBatch;
use crate::checkpoint::{self, Checkpoint, CheckpointMeta, CheckpointStore};
use crate::collective::Ring;
use crate::error::AgentError;
use crate::exchange::{Exchange, StepTimes};
use crate::model::{AnyModel, Batch, ModelRegistry};
use crate::optim::FlatOptimizer;
use crate::tensorize;

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
    /// Where this rank's step time went, this attempt.
    pub step_times: StepTimes,
    /// The loss per step, sampled over the whole run.
    pub step_losses: crate::joblog::StepSamples,
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
    /// The committed eval batches.
    fn eval(&self) -> Vec<Arc<CachedBatch>>;
    /// Blocks until data may have changed since the last `train_since`, or
    /// `timeout` passed.
    fn wait(&self, timeout: Duration);
}

/// The result of a successful training.
#[derive(Debug)]
pub struct TrainOutcome {
    /// The trained model (inference mode, plain device).
    pub model: Box<dyn AnyModel>,
    /// Metrics per epoch.
    pub history: Vec<EpochMetrics>,
}

/// The burn device for a spec (see [`crate::device::for_spec`]).
pub fn device_for(spec: &JobSpec) -> Result<Device, AgentError> {
    crate::device::for_spec(spec)
}

fn lock(p: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Trains one attempt to the end. Returns early with an error when the ring
/// fails (a peer died), the token is cancelled, or the loss diverges.
pub fn train(mut ctx: TrainContext) -> Result<TrainOutcome, AgentError> {
    let spec = ctx.spec.clone();
    let device = device_for(&spec)?.autodiff();
    let mut model = {
        // Initial weights always come from the CPU's seeded RNG, so a seed gives
        // the same weights on every device (the GPU's RNG draws differently).
        let init = ctx.models.build_seeded(&spec, &ctx.layout, spec.seed)?;
        if spec.use_gpu {
            let on_device = ctx.models.build(&spec, &ctx.layout, &device)?;
            on_device.from_record_bytes(init.to_record_bytes()?)?
        } else {
            init
        }
    };
    let mut optim = FlatOptimizer::new(&spec.optimizer, model.num_params());
    let rt = ctx.runtime.clone();
    let rank = ctx.ring.rank() as usize;
    let world = ctx.ring.world() as usize;

    // Where to start: the newest checkpoint any rank holds, else rank 0's weights.
    let mine = ctx.checkpoints.latest_epoch();
    let mut epochs = vec![0f32; world];
    epochs[rank] = mine as f32;
    rt.block_on(ctx.ring.all_reduce_sum(&mut epochs))?;
    let (root, best) = epochs.iter().enumerate().fold(
        (0usize, 0f32),
        |acc, (r, &e)| if e > acc.1 { (r, e) } else { acc },
    );
    let mut start_epoch = 0;
    let mut history = Vec::new();
    let mut rows_per_epoch = Vec::new();
    if best > 0.0 {
        let payload = if rank == root {
            ctx.checkpoints.load_latest()?.map(|c| checkpoint::pack(&c))
        } else {
            None
        };
        let bytes = rt.block_on(ctx.ring.broadcast(root as u32, payload))?;
        let ckpt = checkpoint::unpack(&bytes)?;
        model = model.from_record_bytes(ckpt.weights)?;
        optim.load_bytes(&ckpt.optimizer)?;
        start_epoch = ckpt.meta.epoch;
        history = ckpt.meta.history;
        rows_per_epoch = ckpt.meta.rows_trained_per_epoch;
        let mut p = lock(&ctx.progress);
        p.resumed_from_epoch = Some(start_epoch);
        p.history = history.clone();
        p.rows_trained_per_epoch = rows_per_epoch.clone();
    } else {
        let payload = (rank == 0).then(|| model.to_record_bytes()).transpose()?;
        let bytes = rt.block_on(ctx.ring.broadcast(0, payload))?;
        if rank != 0 {
            model = model.from_record_bytes(bytes)?;
        }
    }

    // The master copy of the weights the optimizer steps (the model's, flat).
    let mut weights = model.flat_weights();
    let exchange = Exchange::for_spec(&spec);
    let mut times = StepTimes::default();
    for epoch in start_epoch + 1..=spec.epochs {
        let started = Instant::now();
        let (train, ended) = ctx.data.train_since(0);
        let local_rows: u64 = train.iter().map(|b| b.rows() as u64).sum();
        // Every rank's row count, and how many ranks' data is still arriving.
        let mut counts = vec![0f32; world + 1];
        counts[rank] = local_rows as f32;
        counts[world] = if ended { 0.0 } else { 1.0 };
        rt.block_on(ctx.ring.all_reduce_sum(&mut counts))?;
        let live = counts[world] > 0.0;
        let b = spec.batch_size as f64;
        let steps = if live {
            0
        } else {
            counts[..world]
                .iter()
                .map(|&n| (n as f64 / b).ceil() as u64)
                .max()
                .unwrap_or(0)
        };
        {
            let mut p = lock(&ctx.progress);
            p.epoch = epoch;
            p.step = 0;
            p.steps_per_epoch = steps;
        }
        // From epoch 2 the shard is shuffled: the order of its cached batches
        // and the rows inside each. (The first epoch trains in commit order,
        // so it can start while the rows arrive.)
        let mut order: Vec<usize> = (0..train.len()).collect();
        let shuffle = (ctx.shuffle && epoch > 1).then_some(spec.seed ^ ((epoch as u64) << 32) ^ rank as u64);
        if let Some(seed) = shuffle {
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        }
        let mut cursor = if live {
            BatchCursor::arriving(ctx.data.clone(), train, ended, spec.batch_size)
        } else {
            let cursor = BatchCursor::new(train, order, spec.batch_size);
            match shuffle {
                Some(seed) => cursor.shuffling_rows(seed.rotate_left(17)),
                None => cursor,
            }
        };
        let mut loss_sum = 0f64;
        let mut rows_total = 0f64;
        let mut rows_mine = 0u64;
        // This rank's gradients for a batch its peers were not all ready for.
        let mut pending: Option<(Vec<f32>, u64)> = None;
        let mut step = 0u64;
        loop {
            if !live && step >= steps {
                break;
            }
            if ctx.cancel.is_cancelled() {
                return Err(AgentError::AttemptFailed {
                    job_id: ctx.job_id.clone(),
                    attempt: ctx.attempt,
                    cause: "cancelled".into(),
                });
            }
            let mut not_ready = 0.0;
            let mut exhausted = 0.0;
            if pending.is_none() {
                match cursor.pull(LIVE_WAIT)? {
                    Pull::Ready(batch) => {
                        let computing = Instant::now();
                        let buf = model
                            .gradients(&Batch::new(&batch, &ctx.layout, &spec, &device))
                            .map_err(|e| e.at(epoch, step))?;
                        times.compute += computing.elapsed();
                        pending = Some((buf, batch.num_rows() as u64));
                    }
                    Pull::NotYet => not_ready = 1.0,
                    Pull::Exhausted => exhausted = 1.0,
                }
            }
            // A live step may not be taken: keep this rank's gradients until it is.
            let local = if live { pending.clone() } else { pending.take() };
            let (mut buf, rows) = match local {
                Some(local) => local,
                None => {
                    let mut buf = model.zero_grads();
                    buf.extend([0.0, 0.0]);
                    (buf, 0)
                }
            };
            if live {
                buf.extend([not_ready, exhausted]);
            }
            let grads = weights.len();
            let world_f = world as f32;
            // The trailer: [rows, loss sum] and, live, [not ready, exhausted].
            let taken = exchange.run(
                &rt,
                &mut ctx.ring,
                &mut buf,
                grads,
                &mut optim,
                &mut weights,
                &mut times,
                |t| {
                    let skipped = live && (t[2] > 0.0 || t[3] >= world_f);
                    (!skipped && t[0] > 0.0).then(|| 1.0 / t[0])
                },
            )?;
            if live {
                if buf[grads + 2] > 0.0 {
                    continue; // nobody steps; ready ranks keep their batch
                }
                if buf[grads + 3] >= world_f {
                    break;
                }
            }
            pending = None;
            rows_mine += rows;
            let (n_total, step_loss) = (buf[grads] as f64, buf[grads + 1] as f64);
            if taken {
                model = model.load_flat(&weights);
            }
            loss_sum += step_loss;
            rows_total += n_total;
            step += 1;
            let mut p = lock(&ctx.progress);
            p.step = step;
            p.loss = (n_total > 0.0).then(|| step_loss / n_total);
            if let Some(loss) = p.loss {
                p.step_losses.push(epoch, step, loss);
            }
            p.samples_per_sec = rows_mine as f64 / started.elapsed().as_secs_f64().max(1e-9);
            p.step_times = times.clone();
        }
        if live {
            lock(&ctx.progress).steps_per_epoch = step;
        }
        let (eval_loss, eval_accuracy) = evaluate(&mut ctx, model.valid().as_ref(), rank, world)?;
        let metrics = EpochMetrics {
            epoch,
            train_loss: if rows_total > 0.0 {
                loss_sum / rows_total
            } else {
                0.0
            },
            rows: rows_mine,
            eval_loss,
            eval_accuracy,
            samples_per_sec: rows_mine as f64 / started.elapsed().as_secs_f64().max(1e-9),
            wall_secs: Some(started.elapsed().as_secs_f64()),
        };
        tracing::info!(job = %ctx.job_id, rank, epoch, loss = metrics.train_loss, ?eval_accuracy, "epoch done");
        history.push(metrics);
        rows_per_epoch.push(rows_total as u64);
        {
            let mut p = lock(&ctx.progress);
            p.history = history.clone();
            p.rows_trained_per_epoch = rows_per_epoch.clone();
        }
        let every = spec.checkpoint.every_epochs;
        if every > 0 && (epoch % every == 0 || epoch == spec.epochs) {
            let ckpt = Checkpoint {
                meta: CheckpointMeta {
                    epoch,
                    attempt: ctx.attempt,
                    rows_trained_per_epoch: rows_per_epoch.clone(),
                    history: history.clone(),
                },
                weights: model.to_record_bytes()?,
                optimizer: optim.to_bytes(),
            };
            ctx.checkpoints.save(&spec, &ckpt)?;
        }
    }
    Ok(TrainOutcome {
        model: model.valid(),
        history,
    })
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
    if n_total <= 0.0 {
        return (model, n_total, step_loss);
    }
    optim.step(weights, &buf, (1.0 / n_total) as f32);
    (model.load_flat(weights), n_total, step_loss)
}

/// Loss and accuracy over every rank's eval shard (identical on all ranks).
fn evaluate(
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

/// What [`BatchCursor::pull`] found.
#[derive(Debug)]
pub enum Pull {
    /// A training batch of `batch_size` rows (fewer only at the shard's end).
    Ready(RecordBatch),
    /// The shard is still arriving and has no full batch yet.
    NotYet,
    /// The shard has ended and every row was handed out.
    Exhausted,
}

#[derive(Debug)]
enum Order {
    /// A complete shard in a given order.
    Fixed {
        cached: Vec<Arc<CachedBatch>>,
        order: std::vec::IntoIter<usize>,
    },
    /// A shard still arriving, in commit order.
    Arriving {
        source: Arc<dyn ShardSource>,
        seen: usize,
        ready: std::collections::VecDeque<Arc<CachedBatch>>,
        ended: bool,
    },
}

/// Cuts a shard's cached batches, in a given order (or in commit order as
/// they arrive), into training batches of `batch_size` rows (the last may be
/// smaller), concatenating across cached batches when needed. Holds at most
/// one cached batch plus the parts of one training batch in memory.
#[derive(Debug)]
pub struct BatchCursor {
    source: Order,
    current: Option<(RecordBatch, usize)>,
    parts: Vec<RecordBatch>,
    have: usize,
    batch_size: usize,
    /// Permute the rows of each cached batch as it is loaded (seed, batches loaded).
    shuffle_rows: Option<(u64, u64)>,
}

impl BatchCursor {
    /// A cursor over a complete shard `cached` in `order`.
    pub fn new(cached: Vec<Arc<CachedBatch>>, order: Vec<usize>, batch_size: usize) -> Self {
        Self::over(
            Order::Fixed {
                cached,
                order: order.into_iter(),
            },
            batch_size,
        )
    }

    /// A cursor over a train split that may still be arriving, in commit
    /// order, starting with `committed` (what `source.train_since(0)` gave,
    /// and whether the split had `ended` then).
    pub fn arriving(
        source: Arc<dyn ShardSource>,
        committed: Vec<Arc<CachedBatch>>,
        ended: bool,
        batch_size: usize,
    ) -> Self {
        Self::over(
            Order::Arriving {
                source,
                seen: committed.len(),
                ready: committed.into(),
                ended,
            },
            batch_size,
        )
    }

    fn over(source: Order, batch_size: usize) -> Self {
        BatchCursor {
            source,
            current: None,
            parts: Vec::new(),
            have: 0,
            batch_size,
            shuffle_rows: None,
        }
    }

    /// Also permutes the rows inside every cached batch (seeded by `seed` and
    /// the batch's position in the order), so a step's rows change from epoch
    /// to epoch even when a shard is a few large cached batches whose rows
    /// arrived sorted.
    pub fn shuffling_rows(mut self, seed: u64) -> Self {
        self.shuffle_rows = Some((seed, 0));
        self
    }

    fn permuted(&mut self, batch: RecordBatch) -> Result<RecordBatch, AgentError> {
        let Some((seed, loaded)) = self.shuffle_rows.as_mut() else {
            return Ok(batch);
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(*seed ^ loaded.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        *loaded += 1;
        let mut rows: Vec<u32> = (0..batch.num_rows() as u32).collect();
        rows.shuffle(&mut rng);
        arrow::compute::take_record_batch(&batch, &arrow::array::UInt32Array::from(rows))
            .map_err(AgentError::arrow)
    }

    /// The next cached batch: `Ok(Some(Some))`, `Ok(Some(None))` when the
    /// shard has ended, `Ok(None)` when nothing arrived within `wait`.
    fn next_cached(&mut self, wait: Duration) -> Option<Option<Arc<CachedBatch>>> {
        match &mut self.source {
            Order::Fixed { cached, order } => Some(order.next().map(|i| cached[i].clone())),
            Order::Arriving {
                source,
                seen,
                ready,
                ended,
            } => {
                let mut waited = false;
                loop {
                    if let Some(b) = ready.pop_front() {
                        return Some(Some(b));
                    }
                    if *ended {
                        return Some(None);
                    }
                    let (more, now_ended) = source.train_since(*seen);
                    *seen += more.len();
                    ready.extend(more);
                    *ended = now_ended;
                    if ready.is_empty() && !*ended {
                        if waited {
                            return None;
                        }
                        source.wait(wait);
                        waited = true;
                    }
                }
            }
        }
    }

    /// The next training batch; on an arriving shard waits up to `wait` for
    /// rows before answering [`Pull::NotYet`] (the rows gathered so far stay).
    pub fn pull(&mut self, wait: Duration) -> Result<Pull, AgentError> {
        while self.have < self.batch_size {
            let (batch, pos) = match self.current.take() {
                Some(c) => c,
                None => match self.next_cached(wait) {
                    Some(Some(cached)) => (self.permuted(cached.load()?)?, 0),
                    Some(None) => break,
                    None => return Ok(Pull::NotYet),
                },
            };
            let take = (self.batch_size - self.have).min(batch.num_rows() - pos);
            if take > 0 {
                self.parts.push(batch.slice(pos, take));
                self.have += take;
            }
            if pos + take < batch.num_rows() {
                self.current = Some((batch, pos + take));
            }
        }
        self.have = 0;
        let mut parts = std::mem::take(&mut self.parts);
        match parts.len() {
            0 => Ok(Pull::Exhausted),
            1 => Ok(Pull::Ready(parts.pop().expect("one part"))),
            _ => {
                let schema = parts[0].schema();
                arrow::compute::concat_batches(&schema, &parts)
                    .map(Pull::Ready)
                    .map_err(AgentError::arrow)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::{BatchCursor, Pull};
    use crate::cache::{MemoryBudget, ShardCache};

    /// Two cached batches of sorted ids, read in batches of 64.
    fn steps(shuffle: Option<u64>) -> Vec<Vec<i64>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cache = ShardCache::new(dir.path().join("s"), MemoryBudget::new(1 << 20));
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        for start in [0i64, 1000] {
            let ids = Int64Array::from_iter_values(start..start + 1000);
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids)]).expect("batch");
            cache.append(1, batch).expect("append");
        }
        cache.commit(1);
        let cursor = BatchCursor::new(cache.snapshot(), vec![1, 0], 64);
        let mut cursor = match shuffle {
            Some(seed) => cursor.shuffling_rows(seed),
            None => cursor,
        };
        let mut out = Vec::new();
        while let Pull::Ready(b) = cursor.pull(std::time::Duration::ZERO).expect("pull") {
            out.push(b.column(0).as_primitive::<Int64Type>().values().to_vec());
        }
        out
    }

    #[test]
    fn shuffled_rows_cover_the_shard_once_and_differ_by_seed_but_not_by_run() {
        let plain = steps(None);
        assert_eq!(
            plain[0],
            (1000..1064).collect::<Vec<_>>(),
            "batch order is followed"
        );
        let a = steps(Some(7));
        assert_eq!(a, steps(Some(7)), "same seed, same steps");
        assert_ne!(a, steps(Some(8)), "another seed, other steps");
        assert_ne!(a[0], plain[0], "rows are permuted inside a cached batch");
        assert!(
            a[0].iter().all(|id| (1000..2000).contains(id)),
            "…but stay in their batch"
        );
        assert_eq!(a.len(), plain.len());
        let mut all: Vec<i64> = a.concat();
        all.sort_unstable();
        assert_eq!(all, (0..2000).collect::<Vec<_>>());
    }
}
