//! The optimizer step on flat buffers.
//!
//! The all-reduce already hands every rank the summed gradients as one flat
//! `f32` buffer laid out in module visit order ([`params::flatten_grads`]). The
//! trainer keeps the weights in the same layout (a master copy), and steps them
//! here in one fused pass per element — average, clip, decay, moments,
//! update — instead of rebuilding burn `GradientsParams` and running burn's
//! optimizer, whose Adam makes a dozen whole-tensor temporaries per parameter
//! per step. The updated weights then go back into the model
//! ([`params::load_flat`]). Written by hand because no library steps a flat
//! buffer in parts as its all-reduce buckets arrive.
//!
//! The arithmetic is burn 0.22's, operation for operation: SGD (momentum
//! without dampening, Nesterov, L2 decay on the gradient), Adam (burn's ε
//! and bias-correction form, L2 decay on the gradient), AdamW (decoupled
//! decay) and RMSprop (centered or not, momentum, L2 decay). Weight decay
//! applies per parameter group: the parameters whose paths match the job's
//! `no_weight_decay` patterns take none. Every rank runs the same step on
//! the same buffers, so replicas stay bitwise identical.
//!
//! [`params::flatten_grads`]: crate::models::params::flatten_grads
//! [`params::load_flat`]: crate::models::params::load_flat

use kindling_schemas::spec::{GradientClip, JobSpec, OptimizerSpec, path_matches};

use crate::error::{AgentError, TrainingError};

pub mod on_device;
pub use on_device::{BucketDown, BucketHost, DeviceOptimizer};

/// Leads the optimizer state in a checkpoint.
const MAGIC: &[u8; 8] = b"KOPTv1\0\0";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    Sgd {
        momentum: f32,
        nesterov: bool,
    },
    Adam {
        beta1: f32,
        beta2: f32,
        epsilon: f32,
    },
    AdamW {
        beta1: f32,
        beta2: f32,
        epsilon: f32,
    },
    RmsProp {
        alpha: f32,
        epsilon: f32,
        momentum: f32,
        centered: bool,
    },
}

impl Rule {
    fn of(spec: &OptimizerSpec) -> Rule {
        match *spec {
            OptimizerSpec::Sgd {
                momentum, nesterov, ..
            } => Rule::Sgd {
                momentum: momentum as f32,
                nesterov,
            },
            OptimizerSpec::Adam {
                beta1,
                beta2,
                epsilon,
                ..
            } => Rule::Adam {
                beta1,
                beta2,
                epsilon,
            },
            OptimizerSpec::AdamW {
                beta1,
                beta2,
                epsilon,
                ..
            } => Rule::AdamW {
                beta1,
                beta2,
                epsilon,
            },
            OptimizerSpec::RmsProp {
                alpha,
                epsilon,
                momentum,
                centered,
                ..
            } => Rule::RmsProp {
                alpha,
                epsilon,
                momentum,
                centered,
            },
        }
    }

    fn tag(self) -> u8 {
        match self {
            Rule::Sgd { .. } => 1,
            Rule::Adam { .. } => 2,
            Rule::AdamW { .. } => 3,
            Rule::RmsProp { .. } => 4,
        }
    }

    /// State values kept per weight.
    fn slots(self) -> usize {
        match self {
            Rule::Sgd { momentum, .. } if momentum > 0.0 => 1,
            Rule::Sgd { .. } => 0,
            Rule::Adam { .. } | Rule::AdamW { .. } => 2,
            Rule::RmsProp {
                momentum, centered, ..
            } => 1 + usize::from(centered) + usize::from(momentum > 0.0),
        }
    }
}

/// A run of weights `[start, end)` that takes weight decay or not.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Group {
    start: usize,
    end: usize,
    decay: bool,
}

/// An optimizer over a flat weight buffer of a fixed length.
#[derive(Clone, Debug)]
pub struct FlatOptimizer {
    rule: Rule,
    /// The rate of the step being taken (a schedule moves it).
    lr: f64,
    weight_decay: f64,
    /// Runs of weights with and without decay, covering `0..len`.
    groups: Vec<Group>,
    clip_value: Option<f32>,
    len: usize,
    /// Steps taken.
    time: u64,
    /// Per weight, `slots()` vectors of `len`: SGD velocity; Adam first
    /// then second moments; RMSprop square average, then the gradient
    /// average (centered), then the momentum buffer.
    state: Vec<f32>,
}

impl FlatOptimizer {
    /// The optimizer `spec` names, for `len` weights that all take its
    /// weight decay, before any step.
    pub fn new(spec: &OptimizerSpec, len: usize) -> Self {
        let rule = Rule::of(spec);
        FlatOptimizer {
            rule,
            lr: spec.learning_rate(),
            weight_decay: spec.weight_decay(),
            groups: vec![Group {
                start: 0,
                end: len,
                decay: true,
            }],
            clip_value: None,
            len,
            time: 0,
            state: vec![0.0; len * rule.slots()],
        }
    }

    /// The optimizer of a job for a model whose parameters are `layout`
    /// (path and size, in flat order): its weight-decay groups and value
    /// clipping. A `no_weight_decay` pattern that matches no parameter is
    /// refused, naming it and the model's parameters.
    pub fn for_job(spec: &JobSpec, layout: &[(String, usize)]) -> Result<Self, AgentError> {
        let len = layout.iter().map(|(_, n)| n).sum();
        let mut opt = Self::new(&spec.optimizer, len);
        if let Some(GradientClip::Value { max_value }) = spec.clip {
            opt.clip_value = Some(max_value as f32);
        }
        if spec.no_weight_decay.is_empty() {
            return Ok(opt);
        }
        for (index, pattern) in spec.no_weight_decay.iter().enumerate() {
            if !layout.iter().any(|(path, _)| path_matches(pattern, path)) {
                let params: Vec<&str> = layout.iter().map(|(p, _)| p.as_str()).collect();
                return Err(TrainingError::NoDecayMatchesNothing {
                    index,
                    pattern: pattern.clone(),
                    params: params.join(", "),
                }
                .into());
            }
        }
        let mut groups: Vec<Group> = Vec::new();
        let mut at = 0;
        for (path, n) in layout {
            let decay = !spec.no_weight_decay.iter().any(|p| path_matches(p, path));
            match groups.last_mut() {
                Some(g) if g.decay == decay => g.end += n,
                _ => groups.push(Group {
                    start: at,
                    end: at + n,
                    decay,
                }),
            }
            at += n;
        }
        opt.groups = groups;
        Ok(opt)
    }

    /// Steps taken so far (the global step a schedule follows).
    pub fn steps(&self) -> u64 {
        self.time
    }

    /// Sets the rate of the next steps.
    pub fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// The rate of the next step.
    pub fn learning_rate(&self) -> f64 {
        self.lr
    }

    /// How many weights take no weight decay.
    pub fn undecayed(&self) -> usize {
        self.groups
            .iter()
            .filter(|g| !g.decay)
            .map(|g| g.end - g.start)
            .sum()
    }

    /// One step: `weights -= update(grads · scale)`, where `scale` turns the
    /// all-reduced gradient sums into means.
    ///
    /// # Panics
    /// If `weights` or `grads` is not `len` long (a layout bug, not bad input).
    pub fn step(&mut self, weights: &mut [f32], grads: &[f32], scale: f32) {
        assert_eq!(weights.len(), self.len, "weights laid out for another model");
        self.begin_step();
        self.step_part(0, weights, grads, scale);
    }

    /// Starts a step taken in parts ([`step_part`](Self::step_part)), so
    /// that one bucket of gradients is applied while the next is still
    /// being all-reduced. Every weight must then be stepped exactly once.
    pub fn begin_step(&mut self) {
        self.time += 1;
    }

    /// Steps the weights `offset..offset + weights.len()` of the step begun
    /// last: the same arithmetic as [`step`](Self::step) for those weights.
    ///
    /// # Panics
    /// If the part does not fit the layout or `grads` is not as long as
    /// `weights` (a layout bug, not bad input).
    pub fn step_part(&mut self, offset: usize, weights: &mut [f32], grads: &[f32], scale: f32) {
        let n = weights.len();
        assert!(offset + n <= self.len, "weights laid out for another model");
        assert_eq!(grads.len(), n, "gradients laid out for another model");
        let end = offset + n;
        for g in 0..self.groups.len() {
            let Group {
                start,
                end: stop,
                decay,
            } = self.groups[g];
            let (a, b) = (start.max(offset), stop.min(end));
            if a >= b {
                continue;
            }
            let wd = if decay { self.weight_decay } else { 0.0 };
            self.kernel(
                a,
                &mut weights[a - offset..b - offset],
                &grads[a - offset..b - offset],
                scale,
                wd,
            );
        }
    }

    /// The fused update of weights `at..at + weights.len()` with decay `wd`:
    /// one loop per rule with the clipping and decay decided outside it, so
    /// that the loop has no branch and vectorizes.
    fn kernel(&mut self, at: usize, weights: &mut [f32], grads: &[f32], scale: f32, wd: f64) {
        match (self.clip_value.is_some(), wd > 0.0) {
            (false, false) => self.kernel_with::<false, false>(at, weights, grads, scale, wd),
            (false, true) => self.kernel_with::<false, true>(at, weights, grads, scale, wd),
            (true, false) => self.kernel_with::<true, false>(at, weights, grads, scale, wd),
            (true, true) => self.kernel_with::<true, true>(at, weights, grads, scale, wd),
        }
    }

    /// [`kernel`](Self::kernel) for clipping by value (`CLIP`) and weight
    /// decay (`DECAY`) known at compile time.
    #[inline(always)]
    fn kernel_with<const CLIP: bool, const DECAY: bool>(
        &mut self,
        at: usize,
        weights: &mut [f32],
        grads: &[f32],
        scale: f32,
        wd: f64,
    ) {
        let n = weights.len();
        let lr = self.lr as f32;
        let wd32 = wd as f32;
        let c = self.clip_value.unwrap_or(f32::INFINITY);
        let grad = |g: f32| match CLIP {
            true => (g * scale).clamp(-c, c),
            false => g * scale,
        };
        // The mean gradient with L2 decay added (every rule but AdamW's).
        let with_l2 = |g: f32, w: f32| match DECAY {
            true => grad(g) + w * wd32,
            false => grad(g),
        };
        let len = self.len;
        match self.rule {
            Rule::Sgd { momentum, nesterov } if momentum > 0.0 => {
                let velocity = &mut self.state[at..at + n];
                for ((w, &g), v) in weights.iter_mut().zip(grads).zip(velocity) {
                    let g = with_l2(g, *w);
                    *v = g + *v * momentum;
                    let d = if nesterov { *v * momentum + g } else { *v };
                    *w -= d * lr;
                }
            }
            Rule::Sgd { .. } => {
                for (w, &g) in weights.iter_mut().zip(grads) {
                    let g = with_l2(g, *w);
                    *w -= g * lr;
                }
            }
            Rule::Adam {
                beta1,
                beta2,
                epsilon,
            } => {
                let t = self.time.min(i32::MAX as u64) as i32;
                let bias2_sqrt = (1.0 - beta2.powi(t)).sqrt();
                let factor = bias2_sqrt / (1.0 - beta1.powi(t));
                let eps = epsilon * bias2_sqrt;
                let (f1, f2) = (1.0 - beta1, 1.0 - beta2);
                let (m, v) = self.state.split_at_mut(len);
                let (m, v) = (&mut m[at..at + n], &mut v[at..at + n]);
                for (((w, &g), m), v) in weights.iter_mut().zip(grads).zip(m).zip(v) {
                    let g = with_l2(g, *w);
                    *m = *m * beta1 + g * f1;
                    *v = *v * beta2 + g * g * f2;
                    *w -= (*m * factor) / (v.sqrt() + eps) * lr;
                }
            }
            Rule::AdamW {
                beta1,
                beta2,
                epsilon,
            } => {
                let t = self.time.min(i32::MAX as u64) as i32;
                let (c1, c2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
                let (f1, f2) = (1.0 - beta1, 1.0 - beta2);
                // burn forms the decay rate in f64, then scales in f32.
                let keep = (1.0 - self.lr * wd) as f32;
                let (m, v) = self.state.split_at_mut(len);
                let (m, v) = (&mut m[at..at + n], &mut v[at..at + n]);
                for (((w, &g), m), v) in weights.iter_mut().zip(grads).zip(m).zip(v) {
                    let g = grad(g);
                    *m = *m * beta1 + g * f1;
                    *v = *v * beta2 + g * g * f2;
                    let delta = (*m / c1) / ((*v / c2).sqrt() + epsilon);
                    let decayed = if DECAY { *w * keep } else { *w };
                    *w = decayed - delta * lr;
                }
            }
            Rule::RmsProp {
                alpha,
                epsilon,
                momentum,
                centered,
            } => {
                let f = 1.0 - alpha;
                let (sq, rest) = self.state.split_at_mut(len);
                let (avg, rest) = match centered {
                    true => {
                        let (a, r) = rest.split_at_mut(len);
                        (Some(&mut a[at..at + n]), r)
                    }
                    false => (None, rest),
                };
                let mut buf = (momentum > 0.0).then(|| &mut rest[at..at + n]);
                let mut avg = avg;
                let sq = &mut sq[at..at + n];
                for i in 0..n {
                    let w = &mut weights[i];
                    let g = with_l2(grads[i], *w);
                    sq[i] = sq[i] * alpha + g * g * f;
                    let denom = match avg.as_deref_mut() {
                        Some(a) => {
                            a[i] = a[i] * alpha + g * f;
                            sq[i] - a[i] * a[i]
                        }
                        None => sq[i],
                    };
                    let mut d = g / (denom.sqrt() + epsilon);
                    if let Some(b) = buf.as_deref_mut() {
                        b[i] = b[i] * momentum + d;
                        d = b[i];
                    }
                    *w -= d * lr;
                }
            }
        }
    }

    /// The state as bytes for a checkpoint.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAGIC.len() + 17 + self.state.len() * 4);
        out.extend_from_slice(MAGIC);
        out.push(self.rule.tag());
        out.extend_from_slice(&self.time.to_le_bytes());
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        for x in &self.state {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    /// Restores the state [`to_bytes`](Self::to_bytes) wrote, checking it
    /// belongs to this optimizer and model size.
    pub fn load_bytes(&mut self, bytes: &[u8]) -> Result<(), AgentError> {
        let bad = |reason: String| AgentError::from(TrainingError::OptimizerState(reason));
        let head = MAGIC.len() + 17;
        if bytes.len() < head || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad("not written by this version of the agent".into()));
        }
        let tag = bytes[MAGIC.len()];
        if tag != self.rule.tag() {
            return Err(bad(format!(
                "written by optimizer {tag}, the job uses {}",
                self.rule.tag()
            )));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let time = u64_at(MAGIC.len() + 1);
        let len = u64_at(MAGIC.len() + 9) as usize;
        if len != self.len {
            return Err(bad(format!("for {len} weights, the model has {}", self.len)));
        }
        let body = &bytes[head..];
        if body.len() != self.state.len() * 4 {
            return Err(bad(format!(
                "{} bytes of state, expected {}",
                body.len(),
                self.state.len() * 4
            )));
        }
        for (x, b) in self.state.iter_mut().zip(body.chunks_exact(4)) {
            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        self.time = time;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
