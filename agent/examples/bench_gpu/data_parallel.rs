//! `--ab`'s data-parallel paths: two ranks sharing this GPU in one process,
//! each a thread with its own model, optimizer and ring (the agents' own
//! collective servers on loopback), stepping together as two agent
//! processes on one GPU do. The step kept on the device (only the gradient
//! sums read back, bucket by bucket, for the all-reduce) against the host
//! round trip (gradients down, the flat optimizer on the host, weights up).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use burn::tensor::{Device, Tensor};
use kindling_agent::collective::Ring;
use kindling_agent::models::kindling_model::ModelRegistry;
use kindling_agent::models::kindling_model::staged::Pipeline;
use kindling_agent::optim::{DeviceOptimizer, FlatOptimizer};
use kindling_agent::training::gradients::{GradientStep, StepTimes, Trailer};
use kindling_agent::training::trainer;
use kindling_schemas::auth::Token;
use kindling_schemas::schema::FeatureLayout as Layout;
use kindling_schemas::spec::JobSpec;
use tokio_util::sync::CancellationToken;

use crate::common::{collective_servers, read_losses, ring};

/// How a data-parallel rank steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Gradients down, the all-reduce, the flat optimizer on the host,
    /// weights up (`--gpu-step-on-device=false`).
    Host,
    /// The step on the device, the gradient sums read back bucket by
    /// bucket for the ring (the default); `kept`: the batches' inputs kept
    /// on the device once staged (epochs after the first).
    Device { kept: bool },
}

/// One timed run of two ranks: their samples/s together and where rank 0's
/// step time went.
pub struct Run {
    pub samples_per_sec: f64,
    /// Share of the wall time rank 0 spent in the all-reduce (the trailer's
    /// wait for the other rank and the gradients' read back, ring and write
    /// back).
    pub all_reduce_share: f64,
}

/// What every rank of a run trains, and how.
#[derive(Clone, Copy)]
struct Setting<'a> {
    spec: &'a JobSpec,
    layout: &'a Layout,
    data: &'a [RecordBatch],
    device: &'a Device,
    steps: usize,
    warmup: usize,
    path: Path,
    step: GradientStep,
}

/// Two ranks on `device`, `steps` timed steps each after `warmup`.
pub fn run(
    (spec, layout, data): (&JobSpec, &Layout, &[RecordBatch]),
    device: &Device,
    (steps, warmup): (usize, usize),
    path: Path,
    bucket_values: usize,
) -> anyhow::Result<Run> {
    let setting = Setting {
        spec,
        layout,
        data,
        device,
        steps,
        warmup,
        path,
        step: step_with(spec, bucket_values),
    };
    const WORLD: usize = 2;
    let rt = runtime()?;
    let token = Token::new("bench");
    let stop = CancellationToken::new();
    let rings = rt.block_on(async {
        let (urls, inboxes) = collective_servers(WORLD, &token, None, &stop).await?;
        inboxes
            .iter()
            .enumerate()
            .map(|(rank, inbox)| ring("bench-gpu-dp", rank, &urls, &token, inbox))
            .collect::<anyhow::Result<Vec<Ring>>>()
    })?;
    let start = Arc::new(Barrier::new(WORLD));
    let handle = rt.handle().clone();
    let results: Vec<anyhow::Result<(Duration, StepTimes)>> = std::thread::scope(|scope| {
        let ranks: Vec<_> = rings
            .into_iter()
            .map(|ring| {
                let (start, handle) = (start.clone(), handle.clone());
                scope.spawn(move || rank(setting, ring, &handle, &start))
            })
            .collect();
        ranks
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    stop.cancel();
    let mut walls = Vec::new();
    let mut first = None;
    for r in results {
        let (wall, times) = r?;
        walls.push(wall);
        first.get_or_insert(times);
    }
    let wall = walls
        .iter()
        .max()
        .copied()
        .unwrap_or_default()
        .as_secs_f64()
        .max(1e-9);
    let times = first.unwrap_or_default();
    Ok(Run {
        samples_per_sec: (WORLD * steps * spec.batch_size) as f64 / wall,
        all_reduce_share: (times.all_reduce + times.idle).as_secs_f64() / walls[0].as_secs_f64().max(1e-9),
    })
}

/// The gradient step of `spec`'s job with device buckets of `bucket_values`.
fn step_with(spec: &JobSpec, bucket_values: usize) -> GradientStep {
    GradientStep {
        device_bucket_values: bucket_values,
        ..GradientStep::for_spec(spec)
    }
}

/// The runtime a rank's ring runs on.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// One rank's steps: the timed span's wall time and where it went.
fn rank(
    setting: Setting<'_>,
    mut ring: Ring,
    rt: &tokio::runtime::Handle,
    start: &Barrier,
) -> anyhow::Result<(Duration, StepTimes)> {
    let Setting {
        spec,
        layout,
        data,
        device,
        steps,
        warmup,
        path,
        step,
    } = setting;
    let failed = |e| anyhow::anyhow!("{e:?}");
    let mut model = ModelRegistry::builtin().build(spec, layout, device)?;
    let mut weights = model.flat_weights();
    let mut optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let params = model.param_layout();
    let mut on_device = match path {
        Path::Host => None,
        Path::Device { .. } => Some(DeviceOptimizer::upload(&optim, &weights, &params, None, device)),
    };
    let mut pipeline = Pipeline::new(true);
    if path == (Path::Device { kept: true }) {
        pipeline = pipeline.keeping(u64::MAX);
    }
    let mut times = StepTimes::default();
    let mut pending: Vec<Tensor<1>> = Vec::new();
    let mut t = Instant::now();
    for i in 0..warmup + steps {
        if i == warmup {
            read_losses(&mut pending);
            start.wait();
            t = Instant::now();
            times = StepTimes::default();
        }
        let next = (i + 1 < warmup + steps).then(|| &data[(i + 1) % data.len()]);
        let batch = &data[i % data.len()];
        let mean = |sum: &Trailer| Some(1.0 / sum.weight);
        match on_device.as_mut() {
            Some(opt) => {
                let share = pipeline
                    .run(batch, next, layout, spec, device, |b| {
                        model.device_gradients(b, opt)
                    })
                    .map_err(failed)?;
                let mut trailer = Vec::new();
                Trailer {
                    rows: share.rows as f32,
                    weight: share.weight as f32,
                    ..Trailer::default()
                }
                .append_to(&mut trailer);
                let scale = step.exchange_on_device(rt, &mut ring, opt, &mut times, &mut trailer, mean)?;
                model = model.device_step(opt, scale.unwrap_or(0.0));
                pending.extend(share.loss_sum);
                if (i + 1) % trainer::LOSS_READ_EVERY == 0 {
                    read_losses(&mut pending);
                }
            }
            None => {
                let mut buf = pipeline
                    .gradients(model.as_ref(), batch, next, layout, spec, device)
                    .map_err(failed)?;
                // `[sums…, rows, weight, loss sum]` to `[sums…, trailer]`.
                let tail = buf.split_off(buf.len() - 3);
                Trailer {
                    rows: tail[0],
                    weight: tail[1],
                    loss_sum: tail[2],
                    ..Trailer::default()
                }
                .append_to(&mut buf);
                let grads = weights.len();
                step.run(
                    (rt, &mut ring),
                    (&mut buf, grads),
                    (&mut optim, &mut weights),
                    &mut times,
                    mean,
                )?;
                model = model.load_flat(&weights);
            }
        }
    }
    read_losses(&mut pending);
    Ok((t.elapsed(), times))
}

/// Two ranks as two processes on this GPU (this program run twice with
/// `--dp-child`), each with its own device, queue and ring, as two agent
/// processes on one GPU are (with `--dp-one-per-gpu`, each on a GPU of its
/// own): their samples/s together and rank 0's
/// all-reduce share. The children print their collective address, get both
/// on stdin, train, and print their wall time and share.
pub fn run_processes(
    (model, batch, precision): (&str, usize, kindling_schemas::spec::Precision),
    (steps, warmup): (usize, usize),
    path: Path,
    bucket_values: usize,
) -> anyhow::Result<Run> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let path_arg = match path {
        Path::Host => "host",
        Path::Device { kept: false } => "device",
        Path::Device { kept: true } => "kept",
    };
    let precision_arg = match precision {
        kindling_schemas::spec::Precision::F32 => "f32",
        _ => "bf16",
    };
    // `--dp-one-per-gpu` (a machine with several GPUs): rank r on the r-th
    // discrete adapter, as one agent per GPU is, instead of both on the first.
    let one_per_gpu = std::env::args().any(|a| a == "--dp-one-per-gpu");
    let mut children = Vec::new();
    for rank in 0..2 {
        let mut command = Command::new(std::env::current_exe()?);
        if one_per_gpu {
            command.env("CUBECL_WGPU_DEFAULT_DEVICE", format!("DiscreteGpu({rank})"));
        }
        let child = command
            .args([
                "--dp-child",
                &rank.to_string(),
                "--dp-path",
                path_arg,
                "--dp-model",
                model,
            ])
            .args(["--dp-precision", precision_arg, "--batch", &batch.to_string()])
            .args(["--steps", &steps.to_string(), "--warmup", &warmup.to_string()])
            .args(["--bucket-values", &bucket_values.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let mut outs = Vec::new();
    let mut urls = Vec::new();
    for c in &mut children {
        let mut out = BufReader::new(c.stdout.take().expect("piped"));
        let mut line = String::new();
        out.read_line(&mut line)?;
        let url = line.trim().strip_prefix("url ").map(str::to_owned);
        urls.push(url.ok_or_else(|| anyhow::anyhow!("a child said `{}`, not its address", line.trim()))?);
        outs.push(out);
    }
    for c in &mut children {
        writeln!(c.stdin.take().expect("piped"), "{}", urls.join(","))?;
    }
    let mut results = Vec::new();
    for (mut out, mut c) in outs.into_iter().zip(children) {
        let mut line = String::new();
        out.read_line(&mut line)?;
        let status = c.wait()?;
        let parsed: Option<(f64, f64)> = line
            .trim()
            .strip_prefix("result ")
            .and_then(|r| r.split_once(' '))
            .and_then(|(w, s)| Some((w.parse().ok()?, s.parse().ok()?)));
        results.push(
            parsed.ok_or_else(|| anyhow::anyhow!("a child ended ({status}) saying `{}`", line.trim()))?,
        );
    }
    let wall = results.iter().map(|r| r.0).fold(1e-9, f64::max);
    Ok(Run {
        samples_per_sec: (2 * steps * batch) as f64 / wall,
        all_reduce_share: results[0].1,
    })
}

/// `--dp-child RANK`: one rank of [`run_processes`].
pub fn child(rank: usize) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let value = |name: &str| crate::common::list(name, "").pop().unwrap_or_default();
    let path = match value("--dp-path").as_str() {
        "host" => Path::Host,
        "device" => Path::Device { kept: false },
        _ => Path::Device { kept: true },
    };
    let precision = match value("--dp-precision").as_str() {
        "f32" => kindling_schemas::spec::Precision::F32,
        _ => kindling_schemas::spec::Precision::Bf16,
    };
    let batch = crate::arg("--batch", 4096);
    let (device, _) = kindling_agent::models::backend::gpu().map_err(|e| anyhow::anyhow!("{e}"))?;
    let device = device.autodiff();
    let data = crate::common::mlp_batches(crate::DISTINCT, batch);
    let spec = crate::spec(&value("--dp-model"), batch, precision)?;
    let layout = kindling_schemas::schema::validate(
        &data[0].schema(),
        &spec,
        kindling_schemas::schema::StreamKind::Train,
    )?;
    let rt = runtime()?;
    let token = Token::new("bench");
    let stop = CancellationToken::new();
    let (mut urls, inboxes) = rt.block_on(collective_servers(1, &token, None, &stop))?;
    let (url, inbox) = (urls.remove(0), &inboxes[0]);
    println!("url {url}");
    std::io::stdout().flush()?;
    let mut urls = String::new();
    std::io::stdin().lock().read_line(&mut urls)?;
    let urls: Vec<String> = urls.trim().split(',').map(str::to_owned).collect();
    let ring = ring("bench-gpu-dp", rank, &urls, &token, inbox)?;
    let setting = Setting {
        spec: &spec,
        layout: &layout,
        data: &data,
        device: &device,
        steps: crate::arg("--steps", 100),
        warmup: crate::arg("--warmup", 5),
        path,
        step: step_with(&spec, crate::arg("--bucket-values", 1 << 16)),
    };
    let (wall, times) = self::rank(setting, ring, rt.handle(), &Barrier::new(1))?;
    stop.cancel();
    let share = (times.all_reduce + times.idle).as_secs_f64() / wall.as_secs_f64().max(1e-9);
    println!("result {} {share}", wall.as_secs_f64());
    Ok(())
}
