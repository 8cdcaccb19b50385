//! One training step's gradients ([`GradientStep`]): the all-reduce of every rank's gradient
//! sums and its [`Trailer`], gradient clipping by global norm, and the
//! optimizer step on the result.
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
//!
//! A data-parallel rank whose step stays on the device
//! ([`exchange_on_device`](GradientStep::exchange_on_device)) sends the
//! trailer first as well, then its gradient sums in smaller buckets of
//! whole parameters: bucket `k + 1` is read back from the device on a thread
//! of its own while bucket `k` is on the ring, and each bucket is written
//! back to the device as soon as it is summed; the optimizer then steps on
//! the device.

use std::time::{Duration, Instant};

use kindling_schemas::spec::{GradientClip, GradientCompression, JobSpec};

use crate::collective::{Precision, Ring};
use crate::error::AgentError;
use crate::optim::{BucketHost, DeviceOptimizer, FlatOptimizer};

/// Gradient values per all-reduce bucket (8 MB of `f32`).
pub const BUCKET_VALUES: usize = 1 << 21;

/// Gradient values per bucket of a step kept on the device (256 KB of
/// `f32`): small enough that a model of a few hundred thousand weights
/// already reads back, rings and writes back in a pipeline.
pub const DEVICE_BUCKET_VALUES: usize = 1 << 16;

/// The values every step's all-reduce carries after the gradient sums:
/// summed over the ranks, they say how many rows the step trained, its
/// loss, and whether it can be taken.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Trailer {
    /// Rows in the step.
    pub rows: f32,
    /// The rows' weight (their count when the job weights no rows): the
    /// optimizer divides the gradient sums by its total.
    pub weight: f32,
    /// Summed (weighted) loss over those rows.
    pub loss_sum: f32,
    /// Ranks that had no full batch yet (a live epoch): the step is not taken.
    pub not_ready: f32,
    /// Ranks whose shard has ended: when all have, a live epoch ends.
    pub exhausted: f32,
    /// Ranks asking for a checkpoint after this step (rank 0, by its clock):
    /// every rank writes one when any asks.
    pub checkpoint: f32,
}

impl Trailer {
    /// Values a trailer takes in the buffer.
    pub const LEN: usize = 6;

    /// Appends the trailer to a gradient buffer.
    pub fn append_to(self, buf: &mut Vec<f32>) {
        buf.extend([
            self.rows,
            self.weight,
            self.loss_sum,
            self.not_ready,
            self.exhausted,
            self.checkpoint,
        ]);
    }

    /// Sets the loss sum of the trailer that ends `buf` (a step kept on the
    /// device learns it with its gradients' all-reduce, after the trailer's).
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`](Self::LEN) (a layout bug).
    pub fn write_loss_sum(buf: &mut [f32], loss_sum: f32) {
        let at = buf.len() - Self::LEN + 2;
        buf[at] = loss_sum;
    }

    /// Reads the trailer from the `LEN` values after the gradients.
    ///
    /// # Panics
    /// If `values` is shorter than [`LEN`](Self::LEN) (a layout bug).
    pub fn read(values: &[f32]) -> Trailer {
        Trailer::from_values(values)
    }

    /// The trailer that ends a step's buffer (`[sums…, trailer]`, or the
    /// trailer alone).
    ///
    /// # Panics
    /// If `buf` is shorter than [`LEN`](Self::LEN) (a layout bug).
    pub fn of(buf: &[f32]) -> Trailer {
        Trailer::from_values(&buf[buf.len() - Self::LEN..])
    }

    fn from_values(values: &[f32]) -> Trailer {
        Trailer {
            rows: values[0],
            weight: values[1],
            loss_sum: values[2],
            not_ready: values[3],
            exhausted: values[4],
            checkpoint: values[5],
        }
    }
}

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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradientStep {
    /// Wire precision of the gradients.
    pub precision: Precision,
    /// Gradient values per bucket.
    pub bucket_values: usize,
    /// Gradient values per bucket when the step stays on the device (whole
    /// parameters: a larger parameter is a bucket of its own).
    pub device_bucket_values: usize,
    /// Step the optimizer on bucket `k` while bucket `k + 1` is all-reduced.
    pub overlap: bool,
    /// Scale the mean gradient down to this global L2 norm when it is
    /// larger (needs every bucket before any weight steps).
    pub clip_norm: Option<f64>,
}

impl GradientStep {
    /// The exchange a job's spec asks for.
    pub fn for_spec(spec: &JobSpec) -> GradientStep {
        GradientStep {
            precision: match spec.gradient_compression {
                GradientCompression::None => Precision::F32,
                GradientCompression::Bf16 => Precision::Bf16,
            },
            bucket_values: BUCKET_VALUES,
            device_bucket_values: DEVICE_BUCKET_VALUES,
            overlap: true,
            clip_norm: match spec.clip {
                Some(GradientClip::Norm { max_norm }) => Some(max_norm),
                _ => None,
            },
        }
    }

    /// All-reduces `buf` over `ring` (driven on `rt`) — `grads` gradient
    /// sums, then the step's [`Trailer`] — and, when `take(trailer)` gives
    /// the scale that turns the sums into means, steps `weights` with
    /// `optim` (clipped to `clip_norm` first). Returns whether it stepped;
    /// the trailer in `buf` is the all-ranks sum either way.
    pub fn run(
        &self,
        (rt, ring): (&tokio::runtime::Handle, &mut Ring),
        (buf, grads): (&mut [f32], usize),
        (optim, weights): (&mut FlatOptimizer, &mut [f32]),
        times: &mut StepTimes,
        take: impl FnOnce(&Trailer) -> Option<f32>,
    ) -> Result<bool, AgentError> {
        times.steps += 1;
        if ring.world() == 1 || (grads <= self.bucket_values && self.precision == Precision::F32) {
            let started = Instant::now();
            rt.block_on(ring.all_reduce_sum(buf))?;
            times.all_reduce += started.elapsed();
            times.bytes += (buf.len() * 4) as u64;
            let (sums, trailer) = buf.split_at_mut(grads);
            let Some(scale) = take(&Trailer::read(trailer)) else {
                return Ok(false);
            };
            let started = Instant::now();
            let scale = self.clipped(sums, scale);
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
        let Some(scale) = take(&Trailer::read(trailer)) else {
            return Ok(false);
        };
        times.bytes += (grads * self.precision.width()) as u64;
        optim.begin_step();
        let bucket = self.bucket_values.max(1);
        if !self.overlap || self.clip_norm.is_some() {
            let started = Instant::now();
            rt.block_on(async {
                for part in sums.chunks_mut(bucket) {
                    ring.all_reduce(part, self.precision).await?;
                }
                Ok::<(), AgentError>(())
            })?;
            times.all_reduce += started.elapsed();
            let started = Instant::now();
            let scale = self.clipped(sums, scale);
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

    /// A data-parallel step kept on the device: all-reduces `trailer` (this
    /// rank's [`Trailer`] alone) and, when `take(trailer)` gives the scale
    /// that turns the sums into means, the gradient sums gathered in `opt`,
    /// bucket by bucket: each bucket read back on a thread of its own while
    /// the one before it is on the ring, and written back to the device as
    /// soon as it is summed. Returns the scale, or `None` for a step not
    /// taken (the sums stay gathered in `opt`, as a live epoch needs). The
    /// loss sum set in `opt` ([`DeviceOptimizer::set_loss`]) travels with the
    /// last bucket: the trailer's `loss_sum` is the ranks' total after a step
    /// taken. The caller then steps `opt` on the device with the scale;
    /// clipping by norm is done there, on the summed gradients.
    pub fn exchange_on_device(
        &self,
        rt: &tokio::runtime::Handle,
        ring: &mut Ring,
        opt: &mut DeviceOptimizer,
        times: &mut StepTimes,
        trailer: &mut [f32],
        take: impl FnOnce(&Trailer) -> Option<f32>,
    ) -> Result<Option<f32>, AgentError> {
        times.steps += 1;
        let started = Instant::now();
        rt.block_on(ring.all_reduce_sum(trailer))?;
        times.idle += started.elapsed();
        let Some(scale) = take(&Trailer::of(trailer)) else {
            return Ok(None);
        };
        let precision = self.precision;
        let buckets = opt.buckets(self.device_bucket_values.max(1));
        let values: usize = buckets.iter().map(|b| opt.bucket_len(b)).sum();
        times.bytes += (values * precision.width()) as u64;
        // Every bucket's concatenation queued before the first read.
        let mut downs: Vec<_> = buckets.into_iter().map(|b| opt.take_bucket(b)).collect();
        let started = Instant::now();
        if downs.len() == 1 {
            let mut host = downs.pop().expect("one bucket").read();
            rt.block_on(ring.all_reduce(&mut host.values, precision))?;
            opt.put_bucket(host);
            times.all_reduce += started.elapsed();
            Trailer::write_loss_sum(trailer, opt.take_summed_loss().unwrap_or(0.0));
            return Ok(Some(scale));
        }
        let reduced = std::thread::scope(|scope| {
            // Two buckets read ahead at most: the reads wait for the device,
            // the ring for the peers.
            let (tx, rx) = std::sync::mpsc::sync_channel::<BucketHost>(2);
            let reader = scope.spawn(move || {
                for down in downs {
                    // A closed channel: the ring failed, the step is lost.
                    if tx.send(down.read()).is_err() {
                        break;
                    }
                }
            });
            let mut reduced = Ok(());
            for mut host in rx.iter() {
                if let Err(e) = rt.block_on(ring.all_reduce(&mut host.values, precision)) {
                    reduced = Err(e);
                    break;
                }
                opt.put_bucket(host);
            }
            drop(rx);
            reader.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            reduced
        });
        times.all_reduce += started.elapsed();
        reduced?;
        Trailer::write_loss_sum(trailer, opt.take_summed_loss().unwrap_or(0.0));
        Ok(Some(scale))
    }

    /// `scale`, times the factor that brings the mean gradient
    /// (`sums · scale`) down to `clip_norm` when its global L2 norm is
    /// larger (`clip_grad_norm_`: `max_norm / (norm + 1e-6)`, at most 1).
    /// The sums are the all-reduced ones, so every rank clips alike.
    pub fn clipped(&self, sums: &[f32], scale: f32) -> f32 {
        let Some(max_norm) = self.clip_norm else {
            return scale;
        };
        // Eight running sums, so that the pass vectorizes; the order is
        // fixed, so every rank gets the same norm.
        let mut lanes = [0f64; 8];
        let chunks = sums.chunks_exact(8);
        let rest: f64 = chunks.remainder().iter().map(|&g| (g as f64).powi(2)).sum();
        for c in chunks {
            for (lane, &g) in lanes.iter_mut().zip(c) {
                *lane += g as f64 * g as f64;
            }
        }
        let sq = (lanes.iter().sum::<f64>() + rest) * (scale as f64).powi(2);
        let coef = max_norm / (sq.sqrt() + 1e-6);
        if coef < 1.0 {
            (scale as f64 * coef) as f32
        } else {
            scale
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_clipping_scales_the_mean_gradient_to_the_bound_and_leaves_small_ones() {
        let spec = JobSpec::builder()
            .features(["a"])
            .label("y")
            .clip(GradientClip::Norm { max_norm: 1.0 })
            .build()
            .expect("spec");
        let ex = GradientStep::for_spec(&spec);
        // Sums of 2 rows: mean (3, 4), norm 5 → scaled to norm 1.
        let scale = ex.clipped(&[6.0, 8.0], 0.5);
        let norm = ((6.0 * scale).powi(2) + (8.0 * scale).powi(2)).sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(ex.clipped(&[0.6, 0.8], 0.5), 0.5, "norm 0.5 passes unchanged");
        let plain = GradientStep::for_spec(
            &JobSpec::builder()
                .features(["a"])
                .label("y")
                .build()
                .expect("spec"),
        );
        assert_eq!(plain.clipped(&[6.0, 8.0], 0.5), 0.5);
    }

    #[test]
    fn a_trailer_reads_back_what_was_appended() {
        let t = Trailer {
            rows: 3.0,
            weight: 2.5,
            loss_sum: 1.5,
            not_ready: 1.0,
            exhausted: 0.0,
            checkpoint: 1.0,
        };
        let mut buf = vec![9.0, 9.0];
        t.append_to(&mut buf);
        assert_eq!(buf.len(), 2 + Trailer::LEN);
        assert_eq!(Trailer::read(&buf[2..]), t);
    }
}
