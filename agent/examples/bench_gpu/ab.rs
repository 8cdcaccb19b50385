//! `--ab`: the MLP step's paths (f32) in alternating rounds, each against
//! the host round trip and against one agent's step on the device, the
//! data-parallel ones with the all-reduce's share of the step.

use arrow::array::RecordBatch;
use burn::tensor::Device;
use kindling_agent::training::trainer;
use kindling_schemas::schema::{self, FeatureLayout as Layout, StreamKind};
use kindling_schemas::spec::{JobSpec, Precision};

use crate::common::{arg, mlp_batches};
use crate::{BurnLoop, DISTINCT, StepPath, burn_alone, data_parallel, device_phases, kindling_step, spec};

/// The paths `--ab` alternates, in each round's order.
const AB_PATHS: [&str; 19] = [
    "host round trip (default)",
    "step on the device, loss read each step",
    "step on the device, losses read every 25 steps (the trainer's)",
    "burn alone, Kindling's optimizer on the device",
    "burn alone, each batch from Arrow",
    "burn alone",
    "burn alone, Adam by hand as burn's adaptor steps",
    "burn alone, Adam by hand with master weights kept",
    "step on the device, losses every 25 steps, batches kept on the device (epochs after the first)",
    "data-parallel, 2 ranks on this GPU, host round trip (both ranks' samples)",
    "data-parallel, 2 ranks on this GPU, step on the device (both ranks' samples)",
    "data-parallel, 2 ranks on this GPU, step on the device, batches kept (both ranks' samples)",
    "step on the device, losses every 25 steps, room on the device for half the batches (data twice what is kept)",
    "each batch's upload alone (Arrow to the device, no step; waited for every 25)",
    "data-parallel, 2 processes on this GPU, step on the device, batches kept (both ranks' samples)",
    "data-parallel, 2 processes on this GPU, step on the device, batches kept, the gradient in one bucket (both ranks' samples)",
    "data-parallel, 2 ranks on this GPU, step on the device, batches kept, the gradient in one bucket (both ranks' samples)",
    "step on the device, losses every 25 steps, batches kept, mixed precision (f16 where the adapter has no bf16)",
    "step on the device, losses every 25 steps, batches kept as a job keeps them (cut anew each epoch from 32 cached batches kept whole, rows shuffled, gathered on the device)",
];

/// The one-agent path the others are held against: the trainer's step on
/// the device, each batch uploaded (its first epoch).
const AB_ONE_AGENT: usize = 2;

/// The one-agent path a path with its batches kept is held against: the
/// trainer's step on the device in its epochs after the first (#55's goal
/// for a data-parallel pair: 0.8× of it).
const AB_ONE_AGENT_KEPT: usize = 8;

/// Whether `--paths` (indices into [`AB_PATHS`], all by default) names path `which`.
fn chosen(which: usize) -> bool {
    let paths = crate::common::list("--paths", "");
    paths.iter().all(|p| p.is_empty()) || paths.iter().any(|p| p.parse() == Ok(which))
}

/// A device bucket that holds the whole gradient: one read a step.
const ONE_BUCKET: usize = 1 << 28;

/// One run of `--ab`'s path `which`: samples/s, and the all-reduce's
/// share of the step for a data-parallel path.
fn ab_path(
    which: usize,
    (spec, layout, data): (&JobSpec, &Layout, &[RecordBatch]),
    device: &Device,
    steps: usize,
) -> anyhow::Result<(f64, Option<f64>)> {
    let run = (steps, 5);
    let dp = |path| -> anyhow::Result<(f64, Option<f64>)> {
        let r = data_parallel::run(
            (spec, layout, data),
            device,
            run,
            path,
            arg("--bucket-values", 1 << 16),
        )?;
        Ok((r.samples_per_sec, Some(r.all_reduce_share)))
    };
    let one = match which {
        12 => kindling_step(
            spec,
            layout,
            data,
            device,
            run,
            StepPath::DeviceKeptHalf(trainer::LOSS_READ_EVERY),
        )?,
        13 => upload_alone(spec, layout, data, device, run)?,
        14 | 15 => {
            let bucket = if which == 14 {
                arg("--bucket-values", 1 << 16)
            } else {
                ONE_BUCKET
            };
            let kept = data_parallel::Path::Device { kept: true };
            let r =
                data_parallel::run_processes(("mlp", spec.batch_size, Precision::F32), run, kept, bucket)?;
            return Ok((r.samples_per_sec, Some(r.all_reduce_share)));
        }
        16 => {
            let r = data_parallel::run(
                (spec, layout, data),
                device,
                run,
                data_parallel::Path::Device { kept: true },
                ONE_BUCKET,
            )?;
            return Ok((r.samples_per_sec, Some(r.all_reduce_share)));
        }
        17 => {
            let mixed = crate::spec("mlp", spec.batch_size, Precision::Bf16)?;
            kindling_step(
                &mixed,
                layout,
                data,
                device,
                run,
                StepPath::DeviceKept(trainer::LOSS_READ_EVERY),
            )?
        }
        18 => cut_from_kept((spec, layout, data), device, run)?,
        9 => return dp(data_parallel::Path::Host),
        10 => return dp(data_parallel::Path::Device { kept: false }),
        11 => return dp(data_parallel::Path::Device { kept: true }),
        _ => one_rank(which, (spec, layout, data), device, run)?,
    };
    Ok((one, None))
}

/// Each batch's features and labels made tensors on `device` from Arrow, as
/// a step's inputs are, with no step: what the upload alone costs (the
/// bound of every epoch whose batches are not kept), waited for every 25
/// batches. Samples/s.
fn upload_alone(
    spec: &JobSpec,
    layout: &Layout,
    data: &[RecordBatch],
    device: &Device,
    (steps, warmup): (usize, usize),
) -> anyhow::Result<f64> {
    use kindling_agent::models::tensorize;
    let wait = |x: &burn::tensor::Tensor<2>| {
        std::hint::black_box(x.clone().slice([0..1, 0..1]).into_scalar::<f32>());
    };
    let mut t = std::time::Instant::now();
    for i in 0..warmup + steps {
        let b = &data[i % data.len()];
        let x = tensorize::features(b, layout, device)?;
        std::hint::black_box(tensorize::targets(b, "y", spec.task, device)?);
        if i + 1 == warmup {
            wait(&x);
            t = std::time::Instant::now();
        } else if (i + 1) % trainer::LOSS_READ_EVERY == 0 || i + 1 == warmup + steps {
            wait(&x);
        }
    }
    Ok((steps * spec.batch_size) as f64 / t.elapsed().as_secs_f64())
}

/// The trainer's step kept on the device in a job's epochs after the first,
/// as a job runs it: each epoch's batches cut anew by the trainer's cursor
/// from the shard's cached batches (`data` cycled to 32 of them, a batch of
/// rows each), their rows shuffled, and gathered on the device from the
/// cached batches kept whole; the first batch of each epoch converted as it
/// comes (as the trainer's is). The first epoch (each cached batch uploaded
/// whole) runs untimed. Samples/s.
fn cut_from_kept(
    (spec, layout, data): (&JobSpec, &Layout, &[RecordBatch]),
    device: &Device,
    (steps, warmup): (usize, usize),
) -> anyhow::Result<f64> {
    use kindling_agent::cache::{CachedBatch, MemoryBudget};
    use kindling_agent::models::kindling_model::ModelRegistry;
    use kindling_agent::models::kindling_model::staged::{Next, Pipeline};
    use kindling_agent::optim::{DeviceOptimizer, FlatOptimizer};
    use kindling_agent::training::trainer::cursor::{BatchCursor, Pull};
    let budget = MemoryBudget::new(u64::MAX);
    let cached: Vec<_> = (0..32)
        .map(|i| {
            std::sync::Arc::new(CachedBatch::Memory {
                batch: data[i % data.len()].clone(),
                bytes: 0,
                budget: budget.clone(),
            })
        })
        .collect();
    let mut model = ModelRegistry::builtin().build(spec, layout, device)?;
    let weights = model.flat_weights();
    let optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let mut opt = DeviceOptimizer::upload(&optim, &weights, &model.param_layout(), None, device);
    let mut pipeline = Pipeline::new(true).keeping(u64::MAX);
    let warmup = warmup + cached.len();
    let (mut pending, mut t, mut done) = (Vec::new(), std::time::Instant::now(), 0);
    for epoch in 1.. {
        let order = (0..cached.len()).collect();
        let mut cursor = BatchCursor::new(cached.clone(), order, spec.batch_size).shuffling_rows(epoch);
        let mut ahead = cursor.pull(std::time::Duration::ZERO)?;
        while done < warmup + steps {
            let Pull::Ready(batch, _) = std::mem::replace(&mut ahead, Pull::Exhausted) else {
                break;
            };
            ahead = cursor.pull(std::time::Duration::ZERO)?;
            if done == warmup {
                crate::common::read_losses(&mut pending);
                t = std::time::Instant::now();
            }
            let next = match &ahead {
                Pull::Ready(n, pieces) => Some(Next::Cut(n, pieces)),
                _ => None,
            };
            let share = pipeline
                .run(&batch, next, layout, spec, device, |b| {
                    model.device_gradients(b, &mut opt)
                })
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            model = model.device_step(&mut opt, (1.0 / share.weight) as f32);
            pending.extend(share.loss_sum);
            done += 1;
            if done % trainer::LOSS_READ_EVERY == 0 {
                crate::common::read_losses(&mut pending);
            }
        }
        if done >= warmup + steps {
            break;
        }
    }
    crate::common::read_losses(&mut pending);
    Ok((steps * spec.batch_size) as f64 / t.elapsed().as_secs_f64())
}

/// `--ab`'s one-rank path `which`: samples/s.
fn one_rank(
    which: usize,
    (spec, layout, data): (&JobSpec, &Layout, &[RecordBatch]),
    device: &Device,
    run: (usize, usize),
) -> anyhow::Result<f64> {
    match which {
        0 => kindling_step(spec, layout, data, device, run, StepPath::Host),
        1 => kindling_step(spec, layout, data, device, run, StepPath::Device),
        2 => kindling_step(
            spec,
            layout,
            data,
            device,
            run,
            StepPath::DeviceEvery(trainer::LOSS_READ_EVERY),
        ),
        3 => burn_alone(spec, layout, data, device, run, BurnLoop::KindlingOptimizer),
        4 => burn_alone(spec, layout, data, device, run, BurnLoop::ArrowEachStep),
        5 => burn_alone(spec, layout, data, device, run, BurnLoop::Plain),
        6 => burn_alone(
            spec,
            layout,
            data,
            device,
            run,
            BurnLoop::ByHand { master: false },
        ),
        7 => burn_alone(spec, layout, data, device, run, BurnLoop::ByHand { master: true }),
        _ => kindling_step(
            spec,
            layout,
            data,
            device,
            run,
            StepPath::DeviceKept(trainer::LOSS_READ_EVERY),
        ),
    }
}

/// `--ab`: the MLP step (f32, one rank) on each of [`AB_PATHS`], in
/// `rounds` alternating rounds of `steps` after one untimed round of each
/// (so that none pays for kernel compilation and autotuning, and drift hits
/// all alike); prints each round's samples/s and the medians, each against
/// the host round trip.
pub fn device_ab(autodiff: &Device, batches: &[usize], steps: usize, rounds: usize) -> anyhow::Result<()> {
    println!(
        "| batch | path | median samples/s | against the host round trip | against one agent's step on the device (a path with batches kept: its step with batches kept) | all-reduce's share of the step | rounds |"
    );
    println!("|---:|---|---:|---:|---:|---:|---|");
    for &batch in batches {
        let data = mlp_batches(DISTINCT, batch);
        let spec = spec("mlp", batch, Precision::F32)?;
        let layout = schema::validate(&data[0].schema(), &spec, StreamKind::Train)?;
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); AB_PATHS.len()];
        let mut shares: Vec<Vec<f64>> = vec![Vec::new(); AB_PATHS.len()];
        for round in 0..=rounds {
            for (which, name) in AB_PATHS.iter().enumerate().filter(|(w, _)| chosen(*w)) {
                let (sps, share) = ab_path(which, (&spec, &layout, &data), autodiff, steps)?;
                eprintln!("batch {batch} round {round}: {name} {sps:.0} samples/s, all-reduce {share:?}");
                if round > 0 {
                    runs[which].push(sps);
                    shares[which].extend(share);
                }
            }
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            // A path `--paths` left out: no figure (its ratios read NaN).
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let host = median(&runs[0]);
        let one_agent = median(&runs[AB_ONE_AGENT]);
        let one_agent_kept = median(&runs[AB_ONE_AGENT_KEPT]);
        for ((name, v), share) in AB_PATHS
            .iter()
            .zip(&runs)
            .zip(&shares)
            .filter(|((_, v), _)| !v.is_empty())
        {
            let m = median(v);
            let each: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
            let share = match share.is_empty() {
                true => String::new(),
                false => format!("{:.0} %", 100.0 * median(share)),
            };
            println!(
                "| {batch} | {name} | {m:.0} | {:.2}× | {:.2}× | {share} | {} |",
                m / host,
                m / if name.contains("batches kept") {
                    one_agent_kept
                } else {
                    one_agent
                },
                each.join(", ")
            );
        }
        for (phase, ms) in device_phases(&spec, &layout, &data, autodiff, steps)? {
            println!("| {batch} | step on the device, phase: {phase} | {ms:.3} ms (median) | | |");
        }
    }
    Ok(())
}
