//! The flat optimizer's step kept on the device, for a rank with nothing to
//! all-reduce (a job of one agent on a GPU): the gradients, the master
//! weights and the optimizer state stay on the GPU, so a step reads back
//! nothing but its loss instead of the gradients down and the weights up.
//!
//! Per parameter and in the parameter's own shape, not one flat buffer nor
//! flat tensors reshaped: a parameter written back as a slice of one large
//! device buffer made every later step slower on wgpu, and so, on an H200,
//! did weights kept flat and reshaped into the parameter each step. The
//! arithmetic is [`FlatOptimizer`]'s (burn 0.22's) as tensor operations, which
//! burn's fusion joins into a few kernels per parameter; clipping by global
//! norm is computed on the device too (no read back). The state moves between
//! the host's [`FlatOptimizer`] and the device at an attempt's start and each
//! epoch's end ([`upload`](DeviceOptimizer::upload),
//! [`download_into`](DeviceOptimizer::download_into)), so checkpoints, the
//! host's data-parallel path and a resumed job see one optimizer. A
//! data-parallel rank keeps its step here too: only its gradient sums leave
//! the device, bucket by bucket, for the all-reduce ([`buckets`]).

mod buckets;
pub use buckets::{BucketDown, BucketHost};

use std::any::Any;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Device, Tensor, TensorData};

use super::{FlatOptimizer, Rule};

/// A tensor of any rank, as [`Held`] keeps it.
trait Shaped: Send + Sync + std::fmt::Debug {
    /// Its values read back, flat (row-major).
    fn values(&self) -> Vec<f32>;
    /// The sum of its squares, on the device.
    fn squares(&self) -> Tensor<1>;
    /// Its shape.
    fn dims(&self) -> Vec<usize>;
    /// Its values as one row (a view where the backend allows).
    fn flat(&self) -> Tensor<1>;
    fn as_any(&self) -> &dyn Any;
}

impl<const D: usize> Shaped for Tensor<D> {
    fn values(&self) -> Vec<f32> {
        let data = self.clone().into_data().convert::<f32>();
        data.as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_default()
    }

    fn squares(&self) -> Tensor<1> {
        self.clone().powi_scalar(2).sum()
    }

    fn dims(&self) -> Vec<usize> {
        self.shape().to_vec()
    }

    fn flat(&self) -> Tensor<1> {
        let n = self.shape().num_elements();
        self.clone().reshape([n])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One parameter's master weights, state slot or gradient sums: the host's
/// flat values until the parameter's shape is first seen (its gradient, the
/// step's mapper), then a device tensor in that shape.
#[derive(Debug)]
enum Held {
    Host(Vec<f32>),
    Device(Box<dyn Shaped>),
}

impl Held {
    fn of<const D: usize>(t: Tensor<D>) -> Self {
        Held::Device(Box::new(t))
    }

    /// The tensor in `shape` (uploaded from the host's values the first
    /// time), taken out so that the step holds its only handle and burn can
    /// update it in place; the caller puts the next value back.
    ///
    /// # Panics
    /// If it was kept with another rank (a layout bug).
    fn take<const D: usize>(&mut self, shape: [usize; D], device: &Device) -> Tensor<D> {
        match std::mem::replace(self, Held::Host(Vec::new())) {
            Held::Host(values) => Tensor::from_data(TensorData::new(values, shape), device),
            Held::Device(t) => t
                .as_any()
                .downcast_ref::<Tensor<D>>()
                .expect("a parameter keeps its rank from step to step")
                .clone(),
        }
    }

    fn values(&self) -> Vec<f32> {
        match self {
            Held::Host(values) => values.clone(),
            Held::Device(t) => t.values(),
        }
    }

    /// The sum of its squares, on `device`.
    fn squares(&self, device: &Device) -> Tensor<1> {
        match self {
            Held::Host(values) => {
                let sq: f32 = values.iter().map(|v| v * v).sum();
                Tensor::from_data(TensorData::new(vec![sq], [1]), device)
            }
            Held::Device(t) => t.squares(),
        }
    }
}

/// An optimizer whose weights, state and gradient sums live on a device.
#[derive(Debug)]
pub struct DeviceOptimizer {
    rule: Rule,
    lr: f64,
    weight_decay: f64,
    /// Per parameter: whether it takes weight decay.
    decay: Vec<bool>,
    clip_value: Option<f32>,
    clip_norm: Option<f64>,
    time: u64,
    sizes: Vec<usize>,
    /// The device without autodiff, where the tensors below live.
    device: Device,
    /// Per parameter, the `f32` master weights.
    master: Vec<Held>,
    /// Per slot ([`Rule::slots`]), per parameter.
    state: Vec<Vec<Held>>,
    /// Per parameter, the gradient sums gathered for the next step (the
    /// host's values only for a parameter whose all-reduced sums came back
    /// before its shape was first seen).
    sums: Vec<Option<Held>>,
    /// A data-parallel step's loss sum on this rank, sent with the last
    /// bucket of gradient sums, and the ranks' total it came back as.
    loss: Option<Tensor<1>>,
    summed_loss: Option<f32>,
}

impl DeviceOptimizer {
    /// `flat`'s rule, rate, groups and state, with `weights` (laid out as
    /// `layout`, the parameters' paths and value counts in flat order) as the
    /// master weights, on `device`; `clip_norm` clips the mean gradient's global
    /// norm (`clip_grad_norm_`'s rule, as the exchange does on the host).
    ///
    /// # Panics
    /// If `weights` or `sizes` do not match `flat`'s length (a layout bug).
    pub fn upload(
        flat: &FlatOptimizer,
        weights: &[f32],
        layout: &[(String, usize)],
        clip_norm: Option<f64>,
        device: &Device,
    ) -> Self {
        let sizes: Vec<usize> = layout.iter().map(|(_, n)| *n).collect();
        assert_eq!(weights.len(), flat.len, "weights laid out for another model");
        assert_eq!(
            sizes.iter().sum::<usize>(),
            flat.len,
            "parameters laid out for another model"
        );
        let part = |values: &[f32], at: usize, n: usize| Held::Host(values[at..at + n].to_vec());
        let mut decay = Vec::with_capacity(sizes.len());
        let mut master = Vec::with_capacity(sizes.len());
        let slots = flat.rule.slots();
        let mut state: Vec<Vec<Held>> = (0..slots).map(|_| Vec::with_capacity(sizes.len())).collect();
        let mut at = 0;
        for &n in &sizes {
            decay.push(flat.groups.iter().any(|g| g.decay && g.start <= at && at < g.end));
            master.push(part(weights, at, n));
            for (s, slot) in state.iter_mut().enumerate() {
                slot.push(part(&flat.state, s * flat.len + at, n));
            }
            at += n;
        }
        DeviceOptimizer {
            rule: flat.rule,
            lr: flat.lr,
            weight_decay: flat.weight_decay,
            decay,
            clip_value: flat.clip_value,
            clip_norm,
            time: flat.time,
            sums: (0..sizes.len()).map(|_| None).collect(),
            loss: None,
            summed_loss: None,
            sizes,
            device: device.clone().without_autodiff(),
            master,
            state,
        }
    }

    /// Writes the steps taken, the state and the master weights back into
    /// `flat` and `weights` (one read back per tensor: an epoch's end, a
    /// checkpoint).
    pub fn download_into(&self, flat: &mut FlatOptimizer, weights: &mut Vec<f32>) {
        let read = |held: &Held, out: &mut [f32]| {
            let values = held.values();
            if values.len() == out.len() {
                out.copy_from_slice(&values);
            }
        };
        weights.resize(flat.len, 0.0);
        let mut at = 0;
        for (i, &n) in self.sizes.iter().enumerate() {
            read(&self.master[i], &mut weights[at..at + n]);
            for (s, slot) in self.state.iter().enumerate() {
                let start = s * flat.len + at;
                read(&slot[i], &mut flat.state[start..start + n]);
            }
            at += n;
        }
        flat.time = self.time;
    }

    /// Sets the rate of the next steps.
    pub fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// Adds parameter `index`'s gradient sums (`f32`, on the device, in the
    /// parameter's shape) to those gathered for the next step.
    ///
    /// # Panics
    /// If the sums gathered for it have another rank (a layout bug).
    pub(crate) fn add_gradient<const D: usize>(&mut self, index: usize, grad: Tensor<D>) {
        let shape: [usize; D] = grad.shape().dims();
        let sum = match self.sums[index].take() {
            Some(mut sum) => sum.take(shape, &self.device) + grad,
            None => grad,
        };
        self.sums[index] = Some(Held::of(sum));
    }

    /// Drops the gradients gathered (a step not taken).
    pub fn clear(&mut self) {
        self.sums.iter_mut().for_each(|s| *s = None);
        self.loss = None;
        self.summed_loss = None;
    }

    /// Starts a step on the gathered sums, `scale` turning them into means
    /// (clipped to the global norm on the device where the job clips so);
    /// each parameter is then stepped once by [`step_param`](Self::step_param).
    pub(crate) fn begin_step(&mut self, scale: f32) -> StepScale {
        self.time += 1;
        let Some(max_norm) = self.clip_norm else {
            return StepScale::Host(scale);
        };
        let squares = self
            .sums
            .iter()
            .flatten()
            .map(|g| g.squares(&self.device))
            .reduce(|a, b| a + b);
        let Some(squares) = squares else {
            return StepScale::Host(scale);
        };
        // max_norm / (‖sums · scale‖ + 1e-6), at most 1, times scale.
        let norm = squares.mul_scalar(scale * scale).sqrt().add_scalar(1e-6);
        let coef = norm.recip().mul_scalar(max_norm as f32).clamp_max(1.0);
        StepScale::Device(Box::new(coef.mul_scalar(scale)))
    }

    /// The gathered sums `g` as `(g', k)` whose product `g' · k` is the step's
    /// mean gradient, clipped: a host scale is not multiplied in but left
    /// for the rules to fold into their coefficients (one operation fewer
    /// per parameter and step); clipping by value then clamps `g` to `c / k`,
    /// which is clamping `g · k` to `c` (k > 0).
    fn clipped<const D: usize>(&self, g: Tensor<D>, scale: &StepScale) -> (Tensor<D>, f32) {
        match scale {
            StepScale::Host(s) => match self.clip_value {
                Some(c) => (g.clamp(-c / s, c / s), *s),
                None => (g, *s),
            },
            StepScale::Device(s) => {
                let g = g.mul(s.as_ref().clone().reshape([1; D]));
                match self.clip_value {
                    Some(c) => (g.clamp(-c, c), 1.0),
                    None => (g, 1.0),
                }
            }
        }
    }

    /// Steps parameter `index` (its gathered sums taken, none counted as
    /// zeros), whose shape is `shape`, and returns its new master weights.
    ///
    /// # Panics
    /// If the parameter was stepped or gathered with another rank (a layout bug).
    pub(crate) fn step_param<const D: usize>(
        &mut self,
        index: usize,
        scale: &StepScale,
        shape: [usize; D],
    ) -> Tensor<D> {
        let device = self.device.clone();
        let w = self.master[index].take(shape, &device);
        let g = match self.sums[index].take() {
            Some(mut g) => g.take(shape, &device),
            None => w.zeros_like(),
        };
        let (g, k) = self.clipped(g, scale);
        let wd = if self.decay[index] { self.weight_decay } else { 0.0 };
        let lr = self.lr as f32;
        // The mean gradient itself (`g · k`), with L2 decay added (every rule
        // but AdamW's): for the rules that do not fold `k`.
        let scaled = |g: Tensor<D>| if k == 1.0 { g } else { g.mul_scalar(k) };
        let with_l2 = |g: Tensor<D>, w: &Tensor<D>| match wd > 0.0 {
            true => scaled(g) + w.clone().mul_scalar(wd as f32),
            false => scaled(g),
        };
        let slot = |s: &mut Self, k: usize| s.state[k][index].take(shape, &device);
        let next = match self.rule {
            Rule::Sgd { momentum, nesterov } if momentum > 0.0 => {
                let g = with_l2(g, &w);
                let v = g.clone() + slot(self, 0).mul_scalar(momentum);
                self.state[0][index] = Held::of(v.clone());
                let d = if nesterov { v.mul_scalar(momentum) + g } else { v };
                w - d.mul_scalar(lr)
            }
            // `w - g · (k · lr)`, decay added as `w · (1 - lr · wd)`.
            Rule::Sgd { .. } => {
                let w = if wd > 0.0 {
                    w.mul_scalar(1.0 - lr * wd as f32)
                } else {
                    w
                };
                w - g.mul_scalar(k * lr)
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
                // With L2 decay the mean gradient is made; without, `k` is
                // folded into the moments' coefficients.
                let (g, k) = match wd > 0.0 {
                    true => (with_l2(g, &w), 1.0),
                    false => (g, k),
                };
                let m = slot(self, 0).mul_scalar(beta1) + g.clone().mul_scalar((1.0 - beta1) * k);
                let v = slot(self, 1).mul_scalar(beta2) + g.square().mul_scalar((1.0 - beta2) * k * k);
                self.state[0][index] = Held::of(m.clone());
                self.state[1][index] = Held::of(v.clone());
                w - m.div(v.sqrt().add_scalar(eps)).mul_scalar(factor * lr)
            }
            Rule::AdamW {
                beta1,
                beta2,
                epsilon,
            } => {
                let t = self.time.min(i32::MAX as u64) as i32;
                let (c1, c2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
                let keep = (1.0 - self.lr * wd) as f32;
                let m = slot(self, 0).mul_scalar(beta1) + g.clone().mul_scalar((1.0 - beta1) * k);
                let v = slot(self, 1).mul_scalar(beta2) + g.square().mul_scalar((1.0 - beta2) * k * k);
                self.state[0][index] = Held::of(m.clone());
                self.state[1][index] = Held::of(v.clone());
                // (m / c1) / (sqrt(v / c2) + eps) = m / (sqrt(v) + eps·sqrt(c2)) · sqrt(c2) / c1
                let (c2_sqrt, eps) = (c2.sqrt(), epsilon);
                let delta = m.div(v.sqrt().add_scalar(eps * c2_sqrt));
                let decayed = if wd > 0.0 { w.mul_scalar(keep) } else { w };
                decayed - delta.mul_scalar(c2_sqrt / c1 * lr)
            }
            Rule::RmsProp {
                alpha,
                epsilon,
                momentum,
                centered,
            } => {
                let f = 1.0 - alpha;
                let g = with_l2(g, &w);
                let sq = slot(self, 0).mul_scalar(alpha) + g.clone().square().mul_scalar(f);
                self.state[0][index] = Held::of(sq.clone());
                let denom = match centered {
                    true => {
                        let avg = slot(self, 1).mul_scalar(alpha) + g.clone().mul_scalar(f);
                        self.state[1][index] = Held::of(avg.clone());
                        sq - avg.clone().mul(avg)
                    }
                    false => sq,
                };
                let mut d = g.div(denom.sqrt().add_scalar(epsilon));
                if momentum > 0.0 {
                    let k = 1 + usize::from(centered);
                    let b = slot(self, k).mul_scalar(momentum) + d;
                    self.state[k][index] = Held::of(b.clone());
                    d = b;
                }
                w - d.mul_scalar(lr)
            }
        };
        self.master[index] = Held::of(next.clone());
        next
    }
}

/// What turns a step's gradient sums into means: a number, or a one-value
/// tensor on the device (clipping by norm, computed there).
#[derive(Debug, Clone)]
pub(crate) enum StepScale {
    Host(f32),
    Device(Box<Tensor<1>>),
}

/// Adds `grads` of `model`'s parameters to `opt`'s sums, in flat order (a
/// parameter without a gradient adds nothing).
pub fn gather<M: Module>(model: &M, grads: &GradientsParams, opt: &mut DeviceOptimizer) {
    struct Gather<'a> {
        grads: &'a GradientsParams,
        opt: &'a mut DeviceOptimizer,
        index: usize,
    }
    impl ModuleVisitor for Gather<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(grad) = self.grads.get::<D>(param.id) {
                let grad = grad.inner();
                // An f32 gradient as it is: a cast would be one more operation per step.
                let grad = match grad.dtype() {
                    DType::F32 => grad,
                    _ => grad.cast(DType::F32),
                };
                self.opt.add_gradient(self.index, grad);
            }
            self.index += 1;
        }
    }
    model.visit(&mut Gather { grads, opt, index: 0 });
}

/// `model` after one step of `opt` on the sums gathered (`scale` turning
/// them into means): each parameter replaced by its new weights, in its
/// dtype, tracked as before.
pub fn step<M: Module>(model: M, opt: &mut DeviceOptimizer, scale: f32) -> M {
    struct Step<'a> {
        opt: &'a mut DeviceOptimizer,
        scale: StepScale,
        index: usize,
    }
    impl ModuleMapper for Step<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let shape = param.lazy_shape().dims::<D>();
            let index = self.index;
            self.index += 1;
            let (opt, scale) = (&mut *self.opt, &self.scale);
            param.map(|t| {
                let (tracked, autodiff, dtype) = (t.is_require_grad(), t.is_autodiff(), t.dtype());
                // The old weights' handle gone first: the step then holds the
                // master weights' only one and burn may update them in place.
                drop(t);
                let fresh = opt.step_param(index, scale, shape);
                let fresh = if dtype == DType::F32 {
                    fresh
                } else {
                    fresh.cast(dtype)
                };
                let fresh = if autodiff { fresh.autodiff() } else { fresh };
                if tracked { fresh.require_grad() } else { fresh }
            })
        }
    }
    let scale = opt.begin_step(scale);
    model.map(&mut Step { opt, scale, index: 0 })
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};
    use kindling_schemas::spec::{GradientClip, JobSpec, OptimizerSpec};

    use super::DeviceOptimizer;
    use crate::optim::FlatOptimizer;

    const SIZES: [usize; 3] = [6, 3, 5];

    /// Step `s`'s gradient sums (of two micro-batches' worth of rows).
    fn sums(s: usize) -> Vec<f32> {
        (0..14)
            .map(|i| ((i * 5 + s * 3) as f32 * 0.37).sin() * 3.0)
            .collect()
    }

    /// `scale` with `clip_grad_norm_`'s factor for the mean gradient `sums ·
    /// scale` (PyTorch's rule: `max_norm / (norm + 1e-6)`, at most 1).
    fn clipped(clip: Option<GradientClip>, sums: &[f32], scale: f32) -> f32 {
        let Some(GradientClip::Norm { max_norm }) = clip else {
            return scale;
        };
        let norm = sums
            .iter()
            .map(|&g| (g as f64 * scale as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            (scale as f64 * coef) as f32
        } else {
            scale
        }
    }

    fn spec(optimizer: OptimizerSpec, clip: Option<GradientClip>) -> JobSpec {
        let decays = optimizer.weight_decay() > 0.0;
        let b = JobSpec::builder().features(["a"]).label("y").optimizer(optimizer);
        let b = if decays { b.no_weight_decay(["bias"]) } else { b };
        match clip {
            Some(c) => b.clip(c),
            None => b,
        }
        .build()
        .expect("spec")
    }

    /// The device optimizer against the host's (burn's rules, checked against
    /// burn's optimizers in `optim::tests`): every rule, decay groups, both
    /// clippings, a start from a host state mid-way, the sums of two
    /// micro-batches, a matrix beside vectors; weights and state within f32
    /// rounding after 25 steps.
    #[test]
    fn steps_on_the_device_like_the_flat_optimizer_on_the_host() {
        let layout: Vec<(String, usize)> = ["a.weight", "a.bias", "b.weight"]
            .iter()
            .zip(SIZES)
            .map(|(p, n)| (p.to_string(), n))
            .collect();
        let clips = [
            None,
            Some(GradientClip::Value { max_value: 0.4 }),
            Some(GradientClip::Norm { max_norm: 0.5 }),
        ];
        let device = Device::default();
        for optimizer in super::super::tests::every_rule() {
            for clip in clips {
                let spec = spec(optimizer.clone(), clip);
                let mut host = FlatOptimizer::for_job(&spec, &layout).expect("optimizer");
                let mut w: Vec<f32> = (0..14).map(|i| (i as f32 * 0.7).cos()).collect();
                let scale = 0.25;
                let host_step = |host: &mut FlatOptimizer, w: &mut Vec<f32>, s: usize| {
                    let g = sums(s);
                    host.step(w, &g, clipped(clip, &g, scale));
                };
                for s in 0..5 {
                    host_step(&mut host, &mut w, s);
                }
                let clip_norm = match clip {
                    Some(GradientClip::Norm { max_norm }) => Some(max_norm),
                    _ => None,
                };
                let mut dev = DeviceOptimizer::upload(&host, &w, &layout, clip_norm, &device);
                for s in 5..25 {
                    host_step(&mut host, &mut w, s);
                    let g = sums(s);
                    let mut at = 0;
                    for (i, n) in SIZES.into_iter().enumerate() {
                        // Two micro-batches' halves, summed on the device; the
                        // first parameter a 2×3 matrix, the others vectors.
                        for _ in 0..2 {
                            let half: Vec<f32> = g[at..at + n].iter().map(|x| x / 2.0).collect();
                            match i {
                                0 => dev.add_gradient(
                                    i,
                                    Tensor::<2>::from_data(TensorData::new(half, [2, 3]), &device),
                                ),
                                _ => dev.add_gradient(
                                    i,
                                    Tensor::<1>::from_data(TensorData::new(half, [n]), &device),
                                ),
                            }
                        }
                        at += n;
                    }
                    let sc = dev.begin_step(scale);
                    let matrix: Tensor<2> = dev.step_param(0, &sc, [2, 3]);
                    assert_eq!(matrix.dims(), [2, 3], "the weights come back in their shape");
                    for (i, n) in SIZES.into_iter().enumerate().skip(1) {
                        dev.step_param(i, &sc, [n]);
                    }
                }
                let mut back = FlatOptimizer::for_job(&spec, &layout).expect("optimizer");
                let mut wd = Vec::new();
                dev.download_into(&mut back, &mut wd);
                assert_eq!(back.steps(), host.steps(), "{optimizer:?} {clip:?}");
                let close = |a: &[f32], b: &[f32], what: &str| {
                    for (i, (x, y)) in a.iter().zip(b).enumerate() {
                        assert!(
                            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                            "{optimizer:?} {clip:?}: {what}[{i}] {x} on the device, {y} on the host"
                        );
                    }
                };
                close(&wd, &w, "weight");
                close(&back.state, &host.state, "state");
                if !host.state.is_empty() {
                    assert!(back.state.iter().any(|&x| x != 0.0), "state came back");
                }
            }
        }
    }
}
