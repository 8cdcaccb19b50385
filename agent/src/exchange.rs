//! One training step's exchange: the all-reduce of every rank's gradient
//! sums and the optimizer step on the result.
//!
//! A small model's gradients travel with the step's trailer (`rows`, loss
//! sum, live flags) in one all-reduce, which is all a step can afford. A
//! larger one (more than [`BUCKET_VALUES`] values), or any model with
//! `gradient_compression` on, first all-reduces the trailer alone: it says
//! whether the step is taken at all (no gradients move for a skipped live
//! step), waits out the slowest rank (reported as *idle*), and gives the
//! rows the optimizer divides by. Then the gradients go in buckets, and
//! while bucket `k + 1` is on the wire the optimizer steps the weights of
//! bucket `k` on a thread of its own. Each weight is stepped exactly as in
//! one whole step ([`FlatOptimizer::step_part`]), so buckets and overlap
//! change the timing, not the result.

use std::time::{Duration, Instant};

use kindling_schemas::spec::{GradientCompression, JobSpec};

use crate::collective::{Precision, Ring};
use crate::error::AgentError;
use crate::optim::FlatOptimizer;

/// Gradient values per all-reduce bucket (8 MB of `f32`).
pub const BUCKET_VALUES: usize = 1 << 21;

/// Where the time of a rank's steps went, summed over the steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTimes {
    /// Steps counted.
    pub steps: u64,
    /// Forward and backward.
    pub compute: Duration,
    /// Waiting for the slowest rank (the trailer's all-reduce).
    pub idle: Duration,
    /// Waiting for the gradients' all-reduce.
    pub all_reduce: Duration,
    /// Optimizer time the step waited for (not hidden behind the all-reduce).
    pub optimizer: Duration,
    /// Optimizer time in all (overlapped or not).
    pub optimizer_busy: Duration,
    /// Bytes of gradients all-reduced (each rank's buffer, as sent).
    pub bytes: u64,
}

impl StepTimes {
    /// Adds another span of steps.
    pub fn add(&mut self, other: &StepTimes) {
        self.steps += other.steps;
        self.compute += other.compute;
        self.idle += other.idle;
        self.all_reduce += other.all_reduce;
        self.optimizer += other.optimizer;
        self.optimizer_busy += other.optimizer_busy;
        self.bytes += other.bytes;
    }
}

/// How a job exchanges its gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Wire precision of the gradients.
    pub precision: Precision,
    /// Gradient values per bucket.
    pub bucket_values: usize,
    /// Step the optimizer on bucket `k` while bucket `k + 1` is all-reduced.
    pub overlap: bool,
}

impl Exchange {
    /// The exchange a job's spec asks for.
    pub fn for_spec(spec: &JobSpec) -> Exchange {
        Exchange {
            precision: match spec.gradient_compression {
                GradientCompression::None => Precision::F32,
                GradientCompression::Bf16 => Precision::Bf16,
            },
            bucket_values: BUCKET_VALUES,
            overlap: true,
        }
    }

    /// All-reduces `buf` — `grads` gradient sums, then the step's trailer —
    /// and, when `take(trailer)` gives the scale that turns the sums into
    /// means, steps `weights`. Returns whether it stepped; the trailer in
    /// `buf` is the all-ranks sum either way.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        rt: &tokio::runtime::Handle,
        ring: &mut Ring,
        buf: &mut [f32],
        grads: usize,
        optim: &mut FlatOptimizer,
        weights: &mut [f32],
        times: &mut StepTimes,
        take: impl FnOnce(&[f32]) -> Option<f32>,
    ) -> Result<bool, AgentError> {
        times.steps += 1;
        if ring.world() == 1 || (grads <= self.bucket_values && self.precision == Precision::F32) {
            let started = Instant::now();
            rt.block_on(ring.all_reduce_sum(buf))?;
            times.all_reduce += started.elapsed();
            times.bytes += (buf.len() * 4) as u64;
            let (sums, trailer) = buf.split_at_mut(grads);
            let Some(scale) = take(trailer) else {
                return Ok(false);
            };
            let started = Instant::now();
            optim.step(weights, sums, scale);
            times.optimizer += started.elapsed();
            times.optimizer_busy += started.elapsed();
            return Ok(true);
        }
        // Large or compressed: the trailer first, then the buckets.
        let (sums, trailer) = buf.split_at_mut(grads);
        let started = Instant::now();
        rt.block_on(ring.all_reduce_sum(trailer))?;
        times.idle += started.elapsed();
        let Some(scale) = take(trailer) else {
            return Ok(false);
        };
        times.bytes += (grads * self.precision.width()) as u64;
        optim.begin_step();
        let bucket = self.bucket_values.max(1);
        if !self.overlap {
            let started = Instant::now();
            rt.block_on(async {
                for part in sums.chunks_mut(bucket) {
                    ring.all_reduce(part, self.precision).await?;
                }
                Ok::<(), AgentError>(())
            })?;
            times.all_reduce += started.elapsed();
            let started = Instant::now();
            for (i, (w, g)) in weights.chunks_mut(bucket).zip(sums.chunks(bucket)).enumerate() {
                optim.step_part(i * bucket, w, g, scale);
            }
            times.optimizer += started.elapsed();
            times.optimizer_busy += started.elapsed();
            return Ok(true);
        }
        let precision = self.precision;
        std::thread::scope(|scope| {
            // The buckets arrive in order: each steps the weights after the last.
            let (tx, rx) = std::sync::mpsc::channel::<&mut [f32]>();
            let stepper = scope.spawn(move || {
                let mut busy = Duration::ZERO;
                let mut rest = &mut weights[..];
                let mut offset = 0;
                for g in rx {
                    let started = Instant::now();
                    let (part, after) = std::mem::take(&mut rest).split_at_mut(g.len());
                    optim.step_part(offset, part, g, scale);
                    rest = after;
                    offset += g.len();
                    busy += started.elapsed();
                }
                busy
            });
            let started = Instant::now();
            let reduced = rt.block_on(async {
                for part in sums.chunks_mut(bucket) {
                    ring.all_reduce(part, precision).await?;
                    // The stepper only ends when this sender is dropped.
                    let _ = tx.send(part);
                }
                Ok::<(), AgentError>(())
            });
            drop(tx);
            times.all_reduce += started.elapsed();
            let tail = Instant::now();
            let busy = stepper.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            times.optimizer += tail.elapsed();
            times.optimizer_busy += busy;
            reduced.map(|()| true)
        })
    }
}
