//! Training throughput on the GPU (`--features gpu`): the trainer's own step
//! path on the agent's GPU device, for the MLP 784-256-128-10 and a CNN
//! (1×28×28, 3×3 conv blocks of 32 and 64 channels with ReLU and 2×2
//! max-pool, dense 128), batch 256 and 4096, f32 and mixed precision (bf16
//! compute, f16 where the adapter has no bf16), Adam, cross-entropy,
//! synthetic data.
//!
//! Every configuration first runs untimed (its kernels compiled and
//! autotuned: cubecl tunes a new shape while steps run, which made the first
//! row of each batch size pay for it), then each is timed.
//!
//! Rows, in samples/s:
//! - `kindling step`: what the trainer does per step on a rank — the Arrow
//!   batch to tensors on the device, forward, backward, the gradients read
//!   back into the all-reduce buffer, the flat Adam step on the host's master
//!   weights, the weights written back to the device (the all-reduce itself
//!   left out: one rank), the next batch's inputs staged meanwhile; for the
//!   MLP with a breakdown by phase (median ms);
//! - `step on the device` (MLP, f32): a job of one agent, by default
//!   ([`DeviceOptimizer`]: the optimizer, its state
//!   and the master weights on the device, the loss the only read back);
//! - `step on the device, batches kept` (every model and precision): one
//!   agent's step in the trainer's epochs after the first;
//! - `burn alone` (MLP): the same model and batch as device tensors already,
//!   forward, backward and burn's Adam on the device (no Arrow, no loss read
//!   back per step): burn's kernels alone.
//!
//! PyTorch eager on the same GPU is `deploy/gpu/bench_gpu.py`, which
//! `deploy/gpu/prove.sh` runs in the same run and sets beside these rows.
//!
//! `cargo run --release -p kindling-agent --features gpu --example bench_gpu -- --steps 100`
//! (`--models mlp,cnn`, `--batches 256,4096` to choose rows);
//! `--embedding` trains `bench_embedding`'s tabular model instead, one
//! agent's step kept on the device, against PyTorch eager on CUDA;
//! `--json` prints one JSON line (the rows, the phases, the adapter) instead
//! of the tables; `--ab` (`--rounds 5`) measures only the MLP step, f32, in
//! alternating rounds: the host round trip; on the device, its losses read
//! each step or every 25 as the trainer reads them, and with the batches kept
//! on the device as themselves or as a job keeps them (its epochs after the
//! first: the trainer's cursor cutting each epoch's batches from cached
//! batches kept whole, gathered on the device) or with room there
//! for half of them (a data set twice what an agent may keep); each batch's
//! upload alone (the bound of an epoch whose batches are not kept); and burn's own loop
//! as it is, with Kindling's optimizer, with each batch converted from Arrow,
//! and with Adam written out as burn's optimizer adaptor steps (with and
//! without a second handle on the weights), which splits what Kindling's
//! optimizer costs; and a data-parallel job of two ranks sharing this GPU
//! (two threads with their own rings, as two agent processes on one GPU):
//! the host round trip against the step kept on the device, with the
//! all-reduce's share of the step and the pair's samples/s against one
//! agent's step on the device (`--bucket-values N`: the device path's
//! all-reduce bucket, 65,536 by default, as the agent's
//! `--gpu-bucket-values`). With a `cubecl.toml` turning on cubecl's profiling
//! logger, `deploy/gpu/launches.py` reads each path's kernels from the log.

use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::Device;
use kindling_agent::models::builtin::{MlpModel, MlpModelConfig};
use kindling_agent::models::kindling_model::staged::Pipeline;
use kindling_agent::models::kindling_model::{Inputs, KindlingModel, ModelRegistry, task_loss};
use kindling_agent::models::{backend, params, tensorize};
use kindling_agent::optim::{self, DeviceOptimizer, FlatOptimizer};
use kindling_agent::training::trainer;
use kindling_schemas::schema::{self, FeatureLayout as Layout, StreamKind};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Precision, Task};
use serde_json::json;

mod ab;
#[path = "../common/mod.rs"]
mod common;
mod data_parallel;
#[path = "../common/tabular.rs"]
mod tabular;
use common::{arg, list, mlp_batches};

/// The one-agent trainer's path in its epochs after the first.
const KEPT: StepPath = StepPath::DeviceKept(trainer::LOSS_READ_EVERY);

/// Distinct batches cycled through (kept on the host as Arrow, as the cache keeps them).
pub(crate) const DISTINCT: usize = 4;

pub(crate) fn spec(model: &str, batch: usize, precision: Precision) -> anyhow::Result<JobSpec> {
    let model = match model {
        "mlp" => ModelSpec::Mlp {
            hidden: vec![256, 128],
        },
        _ => ModelSpec::Cnn {
            channels: 1,
            height: 28,
            width: 28,
            conv: vec![32, 64],
            dense: 128,
        },
    };
    Ok(JobSpec::builder()
        .task(Task::Classification { num_classes: 10 })
        .model(model)
        .optimizer(OptimizerSpec::adam(1e-3))
        .batch_size(batch)
        .features(["x"])
        .label("y")
        .use_gpu(true)
        .precision(precision)
        .build()?)
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
}

/// Where a timed step's optimizer runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum StepPath {
    /// A data-parallel rank's: the gradients down to the host optimizer, the
    /// weights back up (the trainer's default).
    Host,
    /// One rank's step kept on the device, its loss read back each step (the
    /// trainer's `--gpu-step-on-device`).
    Device,
    /// As `Device`, the losses summed on the device and read every `k`
    /// steps (and after the last).
    DeviceEvery(usize),
    /// As `DeviceEvery`, the batches' inputs kept on the device once staged
    /// (the trainer's epochs after the first).
    DeviceKept(usize),
    /// As `DeviceKept`, with room on the device for half of the batches:
    /// the epochs of a data set twice the size an agent may keep there.
    DeviceKeptHalf(usize),
}

/// The trainer's step path, `steps` timed steps after `warmup`: samples/s.
pub(crate) fn kindling_step(
    spec: &JobSpec,
    layout: &Layout,
    data: &[RecordBatch],
    device: &Device,
    (steps, warmup): (usize, usize),
    path: StepPath,
) -> anyhow::Result<f64> {
    let resident = path != StepPath::Host;
    let mut model = ModelRegistry::builtin().build(spec, layout, device)?;
    let mut weights = model.flat_weights();
    let mut optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let layout_of_params = model.param_layout();
    let mut on_device =
        resident.then(|| DeviceOptimizer::upload(&optim, &weights, &layout_of_params, None, device));
    // The next batch staged meanwhile, as the trainer does on a GPU.
    let mut pipeline = Pipeline::new(true);
    match path {
        StepPath::DeviceKept(_) => pipeline = pipeline.keeping(u64::MAX),
        StepPath::DeviceKeptHalf(_) => {
            // Each batch's inputs on the device: its f32 features and its
            // labels (8 bytes a row at most); room for half of them.
            let bytes = |b: &RecordBatch| (b.num_rows() * (layout.input_dim * 4 + 8)) as u64;
            let half: u64 = data.iter().take(data.len() / 2).map(bytes).sum();
            pipeline = pipeline.keeping(half + 1024);
        }
        _ => {}
    }
    if let Some(opt) = on_device.as_mut() {
        let every = match path {
            StepPath::DeviceEvery(k) | StepPath::DeviceKept(k) | StepPath::DeviceKeptHalf(k) => k,
            _ => 1,
        };
        return common::device_steps(
            model,
            opt,
            pipeline,
            (data, layout, spec, device),
            (steps, warmup),
            every,
        );
    }
    let mut t = Instant::now();
    for i in 0..warmup + steps {
        if i == warmup {
            t = Instant::now();
        }
        // Reading the gradients back is the step's sync point: every step
        // timed here has finished on the device. The next batch is staged
        // meanwhile, as the trainer does on a GPU.
        let next = (i + 1 < warmup + steps).then(|| &data[(i + 1) % data.len()]);
        let buf = pipeline
            .gradients(model.as_ref(), &data[i % data.len()], next, layout, spec, device)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        model = trainer::apply_summed_gradients(model, &mut optim, &mut weights, buf).0;
    }
    Ok((steps * spec.batch_size) as f64 / t.elapsed().as_secs_f64())
}

/// What [`burn_alone`] changes in burn's own loop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum BurnLoop {
    /// Device tensors ready, burn's Adam, only the last loss read.
    Plain,
    /// Kindling's optimizer kept on the device ([`DeviceOptimizer`]) in
    /// place of burn's Adam.
    KindlingOptimizer,
    /// Each step's batch converted from Arrow and uploaded then.
    ArrowEachStep,
    /// Adam written here as burn's optimizer adaptor applies it (the
    /// parameter's own tensor stepped, state per parameter), `master` also
    /// keeping each parameter's weights as a second handle as
    /// [`DeviceOptimizer`] does: what part of Kindling's optimizer costs.
    ByHand { master: bool },
}

/// Adam by hand for [`BurnLoop::ByHand`]: burn 0.22's arithmetic, the
/// gradient taken out of `grads`, the state per parameter in visiting order.
struct HandAdam<'a> {
    grads: &'a mut GradientsParams,
    state: &'a mut Vec<Option<Box<dyn std::any::Any>>>,
    master: Option<&'a mut Vec<Option<Box<dyn std::any::Any>>>>,
    time: i32,
    lr: f32,
    index: usize,
}

impl burn::module::ModuleMapper for HandAdam<'_> {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::tensor::Tensor<D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let i = self.index;
        self.index += 1;
        let Some(grad) = self.grads.remove::<D>(id) else {
            return burn::module::Param::from_mapped_value(id, tensor, mapper);
        };
        let require_grad = tensor.is_require_grad();
        type T<const D: usize> = burn::tensor::Tensor<D>;
        let w = match self.master.as_mut().and_then(|m| m[i].take()) {
            Some(m) => {
                drop(tensor);
                *m.downcast::<T<D>>().expect("rank")
            }
            None => tensor.inner(),
        };
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-5f32);
        let (m, v) = match self.state[i].take() {
            Some(mv) => *mv.downcast::<(T<D>, T<D>)>().expect("rank"),
            None => (grad.zeros_like(), grad.zeros_like()),
        };
        let m = m.mul_scalar(b1).add(grad.clone().mul_scalar(1.0 - b1));
        let v = v.mul_scalar(b2).add(grad.square().mul_scalar(1.0 - b2));
        let bias2 = (1.0 - b2.powi(self.time)).sqrt();
        let factor = bias2 / (1.0 - b1.powi(self.time));
        let delta = m.clone().div(v.clone().sqrt().add_scalar(eps)).mul_scalar(factor);
        let next = w - delta.mul_scalar(self.lr);
        self.state[i] = Some(Box::new((m, v)));
        if let Some(master) = self.master.as_mut() {
            master[i] = Some(Box::new(next.clone()));
        }
        let next = burn::tensor::Tensor::from_inner(next);
        let next = if require_grad { next.require_grad() } else { next };
        burn::module::Param::from_mapped_value(id, next, mapper)
    }
}

/// The MLP in burn's own loop (device tensors, forward, backward, burn's
/// Adam on the device, no read back), changed as `variant` says: samples/s.
pub(crate) fn burn_alone(
    spec: &JobSpec,
    layout: &Layout,
    data: &[RecordBatch],
    device: &Device,
    (steps, warmup): (usize, usize),
    variant: BurnLoop,
) -> anyhow::Result<f64> {
    let mut model = MlpModel::init(&MlpModelConfig::new(vec![256, 128]), &Inputs::new(layout), device)?;
    let mut optim = AdamConfig::new().init();
    let mut ours = (variant == BurnLoop::KindlingOptimizer).then(|| {
        let weights = params::flat_weights(&model);
        let flat = FlatOptimizer::new(&spec.optimizer, weights.len());
        DeviceOptimizer::upload(&flat, &weights, &params::layout(&model), None, device)
    });
    let tensorized = |b: &RecordBatch| {
        let x = tensorize::features(b, layout, device)?;
        let y = tensorize::targets(b, "y", spec.task, device)?;
        anyhow::Ok((x, y))
    };
    let tensors: Vec<_> = data.iter().map(tensorized).collect::<Result<_, _>>()?;
    let mut hand_state = Vec::new();
    let mut hand_master = Vec::new();
    let lr = spec.optimizer.learning_rate();
    let mut t = Instant::now();
    let mut last: Option<burn::tensor::Tensor<1>> = None;
    for i in 0..warmup + steps {
        if i == warmup {
            // Wait for the warm-up steps before the clock starts.
            if let Some(loss) = last.take() {
                std::hint::black_box(loss.into_scalar::<f32>());
            }
            t = Instant::now();
        }
        let (x, y) = match variant {
            BurnLoop::ArrowEachStep => tensorized(&data[i % data.len()])?,
            _ => tensors[i % tensors.len()].clone(),
        };
        let loss = task_loss(spec.task, model.forward_features(x), y, device);
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        model = match (ours.as_mut(), variant) {
            (Some(opt), _) => {
                optim::on_device::gather(&model, &grads, opt);
                // As the trainer does: the gradients held only by the optimizer.
                drop(grads);
                optim::on_device::step(model, opt, 1.0)
            }
            (None, BurnLoop::ByHand { master }) => {
                let n = params::layout(&model).len();
                hand_state.resize_with(n, || None);
                hand_master.resize_with(n, || None);
                model.map(&mut HandAdam {
                    grads: &mut grads,
                    state: &mut hand_state,
                    master: master.then_some(&mut hand_master),
                    time: i as i32 + 1,
                    lr: lr as f32,
                    index: 0,
                })
            }
            (None, _) => optim.step(lr, model, grads),
        };
        last = Some(loss);
    }
    // The last loss read back: every step has run on the device.
    if let Some(loss) = last {
        std::hint::black_box(loss.into_scalar::<f32>());
    }
    Ok((steps * spec.batch_size) as f64 / t.elapsed().as_secs_f64())
}

/// Median ms of each of `names`' phases over `steps` steps after 5 untimed
/// ones: `step(i)` runs step `i` and returns its phases' times.
fn phase_medians<const N: usize>(
    names: [&'static str; N],
    steps: usize,
    mut step: impl FnMut(usize) -> anyhow::Result<[Duration; N]>,
) -> anyhow::Result<(Vec<(&'static str, f64)>, Duration)> {
    let mut times: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::new());
    let mut total = Duration::ZERO;
    for i in 0..steps + 5 {
        let phases = step(i)?;
        if i < 5 {
            continue; // warm-up
        }
        for (p, d) in times.iter_mut().zip(phases) {
            total += d;
            p.push(d);
        }
    }
    Ok((names.into_iter().zip(times.map(median)).collect(), total))
}

/// Median ms of each phase of the trainer's MLP step (the gradients and the
/// loss read back as one buffer), and the step's samples/s.
fn phases(
    spec: &JobSpec,
    layout: &Layout,
    data: &[RecordBatch],
    device: &Device,
    steps: usize,
) -> anyhow::Result<(Vec<(&'static str, f64)>, f64)> {
    let model = MlpModel::init(&MlpModelConfig::new(vec![256, 128]), &Inputs::new(layout), device)?;
    let mut weights = params::flat_weights(&model);
    let mut optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let mut model = Some(model);
    let names = [
        "Arrow batch → device tensors (upload queued)",
        "forward + loss + backward (queued)",
        "gradients (and loss) read back into the all-reduce buffer (waits for the device)",
        "Adam step on the host (flat, fused)",
        "weights back to the device",
    ];
    let (medians, total) = phase_medians(names, steps, |i| {
        let b = &data[i % data.len()];
        let t0 = Instant::now();
        let x = tensorize::features(b, layout, device)?;
        let y = tensorize::targets(b, "y", spec.task, device)?;
        let m = model.take().expect("the model between steps");
        let t1 = Instant::now();
        let loss = task_loss(spec.task, m.forward_features(x), y, device);
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        let t2 = Instant::now();
        let mut buf = params::flatten_grads_and(&m, &grads, loss);
        std::hint::black_box(buf.pop());
        let t3 = Instant::now();
        optim.step(&mut weights, &buf, 1.0);
        let t4 = Instant::now();
        model = Some(params::load_flat(m, &weights));
        let t5 = Instant::now();
        Ok([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4])
    })?;
    let sps = (steps * spec.batch_size) as f64 / total.as_secs_f64();
    Ok((medians, sps))
}

/// Median ms of each phase of a step kept on the device (the MLP, f32),
/// the next batch staged meanwhile as the trainer does.
pub(crate) fn device_phases(
    spec: &JobSpec,
    layout: &Layout,
    data: &[RecordBatch],
    device: &Device,
    steps: usize,
) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let mut model = Some(ModelRegistry::builtin().build(spec, layout, device)?);
    let weights = model.as_ref().map(|m| m.flat_weights()).unwrap_or_default();
    let optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let layout_of_params = model.as_ref().map(|m| m.param_layout()).unwrap_or_default();
    let mut opt = DeviceOptimizer::upload(&optim, &weights, &layout_of_params, None, device);
    let mut pipeline = Pipeline::new(true);
    let names = [
        "staged batch to tensors, forward + loss + backward queued",
        "the optimizer's step queued",
        "the loss read back (waits for the device)",
    ];
    let (medians, _) = phase_medians(names, steps, |i| {
        let next = Some(&data[(i + 1) % data.len()]);
        let m = model.take().expect("the model between steps");
        let t0 = Instant::now();
        let share = pipeline
            .run(&data[i % data.len()], next, layout, spec, device, |b| {
                m.device_gradients(b, &mut opt)
            })
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let t1 = Instant::now();
        model = Some(m.device_step(&mut opt, (1.0 / share.weight) as f32));
        let t2 = Instant::now();
        std::hint::black_box(share.loss_sum.map(|l| l.into_scalar::<f32>()));
        let t3 = Instant::now();
        Ok([t1 - t0, t2 - t1, t3 - t2])
    })?;
    Ok(medians)
}

fn main() -> anyhow::Result<()> {
    if let Some(rank) = list("--dp-child", "").pop().filter(|r| !r.is_empty()) {
        return data_parallel::child(rank.parse()?);
    }
    let steps = arg("--steps", 100);
    let warmup = arg("--warmup", 10);
    if std::env::args().any(|a| a == "--embedding") {
        return tabular::on_gpu(steps, warmup);
    }
    let as_json = std::env::args().any(|a| a == "--json");
    let (gpu, info) = backend::gpu().map_err(|e| anyhow::anyhow!("{e}"))?;
    let autodiff = gpu.clone().autodiff();
    gpu.seed(0);
    if std::env::args().any(|a| a == "--ab") {
        println!(
            "The step's paths in alternating rounds, on {info}: MLP 784-256-128-10, f32, Adam, {steps} steps a round"
        );
        println!();
        let batches: Vec<usize> = list("--batches", "256,4096")
            .iter()
            .map(|b| b.parse())
            .collect::<Result<_, _>>()?;
        return ab::device_ab(&autodiff, &batches, steps, arg("--rounds", 5));
    }
    let mut rows = Vec::new();
    let mut all_phases = Vec::new();
    // bf16 rows compute in f16 where the adapter has no bf16 (`dtype` says which).
    let half = if info.bf16 { "bf16" } else { "f16" };
    let models = list("--models", "mlp,cnn");
    let batch_sizes: Vec<usize> = list("--batches", "256,4096")
        .iter()
        .map(|b| b.parse())
        .collect::<Result<_, _>>()?;
    let precisions = [(Precision::F32, "f32", "f32"), (Precision::Bf16, "bf16", half)];
    let precisions: Vec<_> = precisions
        .into_iter()
        .filter(|(p, ..)| *p == Precision::F32 || info.bf16 || info.f16)
        .collect();
    // The untimed pass: every configuration's kernels compiled and tuned.
    for model in models.iter().map(String::as_str) {
        for &batch in &batch_sizes {
            let data = mlp_batches(DISTINCT, batch);
            for &(precision, ..) in &precisions {
                let spec = spec(model, batch, precision)?;
                let layout = schema::validate(&data[0].schema(), &spec, StreamKind::Train)?;
                let resident = model == "mlp" && precision == Precision::F32;
                for path in [StepPath::Host, StepPath::Device, KEPT] {
                    if path != StepPath::Device || resident {
                        // A path that fails is reported in its timed row.
                        let _ = kindling_step(&spec, &layout, &data, &autodiff, (1, warmup), path);
                    }
                }
            }
        }
    }
    for model in models.iter().map(String::as_str) {
        for &batch in &batch_sizes {
            let data = mlp_batches(DISTINCT, batch);
            for &(precision, name, dtype) in &precisions {
                let spec = spec(model, batch, precision)?;
                let layout = schema::validate(&data[0].schema(), &spec, StreamKind::Train)?;
                let sps = kindling_step(&spec, &layout, &data, &autodiff, (steps, warmup), StepPath::Host)?;
                eprintln!("{model} batch {batch} {name} ({dtype}): kindling step {sps:.0} samples/s");
                rows.push(json!({"model": model, "batch": batch, "precision": name, "dtype": dtype, "path": "kindling step", "samples_per_sec": sps}));
                // One agent's step, batches kept on the device: the
                // trainer's epochs after the first, for every model and precision.
                let path = "step on the device, batches kept (one agent, epochs after the first)";
                match kindling_step(&spec, &layout, &data, &autodiff, (steps, warmup), KEPT) {
                    Ok(sps) => {
                        eprintln!("{model} batch {batch} {name} ({dtype}): {path} {sps:.0} samples/s");
                        rows.push(json!({"model": model, "batch": batch, "precision": name, "dtype": dtype, "path": path, "samples_per_sec": sps}));
                    }
                    Err(e) => {
                        eprintln!("{model} batch {batch} {name} ({dtype}): {path} failed: {e:#}");
                        rows.push(json!({"model": model, "batch": batch, "precision": name, "dtype": dtype, "path": path, "samples_per_sec": 0.0, "error": format!("{e:#}")}));
                    }
                }
            }
            if model == "mlp" {
                let spec = spec(model, batch, Precision::F32)?;
                let layout = schema::validate(&data[0].schema(), &spec, StreamKind::Train)?;
                let sps = burn_alone(&spec, &layout, &data, &autodiff, (steps, warmup), BurnLoop::Plain)?;
                eprintln!("{model} batch {batch} f32: burn alone {sps:.0} samples/s");
                rows.push(json!({"model": model, "batch": batch, "precision": "f32", "path": "burn alone", "samples_per_sec": sps}));
                let sps = kindling_step(
                    &spec,
                    &layout,
                    &data,
                    &autodiff,
                    (steps, warmup),
                    StepPath::Device,
                )?;
                let path = "step on the device (a one-agent job's default)";
                eprintln!("{model} batch {batch} f32: {path} {sps:.0} samples/s");
                rows.push(json!({"model": model, "batch": batch, "precision": "f32", "path": path, "samples_per_sec": sps}));
                let (phases, _) = phases(&spec, &layout, &data, &autodiff, steps.min(50))?;
                for (phase, ms) in phases {
                    all_phases
                        .push(json!({"batch": batch, "path": "kindling step", "phase": phase, "ms": ms}));
                }
            }
        }
    }
    let out = json!({
        "device": info.to_string(),
        "steps": steps,
        "warmup": warmup,
        "rows": rows.iter().filter(|r| r["path"] == "kindling step").collect::<Vec<_>>(),
        "other_paths": rows.iter().filter(|r| r["path"] != "kindling step").collect::<Vec<_>>(),
        "phases": all_phases,
    });
    if as_json {
        println!("{out}");
        return Ok(());
    }
    println!("Training step on {info}: Adam, cross-entropy, {steps} timed steps after {warmup}");
    println!();
    println!("| model | batch | precision | path | samples/s |");
    println!("|---|---:|---|---|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} |",
            r["model"].as_str().unwrap_or(""),
            r["batch"],
            r["dtype"].as_str().or(r["precision"].as_str()).unwrap_or(""),
            r["path"].as_str().unwrap_or(""),
            r["samples_per_sec"].as_f64().unwrap_or(0.0)
        );
    }
    println!();
    println!("| batch | path | phase of an MLP step | median ms |");
    println!("|---:|---|---|---:|");
    for p in &all_phases {
        println!(
            "| {} | {} | {} | {:.3} |",
            p["batch"],
            p["path"].as_str().unwrap_or(""),
            p["phase"].as_str().unwrap_or(""),
            p["ms"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
