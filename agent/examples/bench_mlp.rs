//! Training throughput of an MLP 784-256-128-10 (ReLU), batch 256, Adam,
//! cross-entropy, on synthetic data: the agent's own step path against
//! PyTorch CPU with the same number of threads, in the same run.
//!
//! Rows, in samples/s:
//! - `kindling step`: exactly what the trainer does per step on one rank
//!   (Arrow batch → tensors, forward, backward, gradients flattened into the
//!   all-reduce buffer, the flat Adam step on the master weights, weights
//!   written back into the model);
//! - `kindling step, AdamW + cosine + clipping`: the same step path with the
//!   training options a tuned job uses — AdamW with biases exempt from
//!   decay, a warmup + cosine schedule setting the rate every step, and
//!   clipping by global norm (one more pass over the gradient) — against the
//!   plain Adam step in the same rounds;
//! - `burn alone`: the same model and batch as tensors already, forward,
//!   backward and burn's Adam straight from burn's gradients (no Arrow, no
//!   flattening);
//! - `PyTorch`: `agent/examples/bench_mlp.py` with `torch.set_num_threads`
//!   equal to burn's thread count (rayon's, `RAYON_NUM_THREADS` or the cores),
//!   with OpenMP's default and passive wait policies; ratios are against the faster;
//!   and `--tuned`, the same options as the tuned kindling row (AdamW with
//!   biases exempt, warmup + cosine by step, `clip_grad_norm_`), which that
//!   row is compared with.
//!
//! The three run in `--rounds` interleaved rounds, each round in a rotated
//! order (kindling, burn, PyTorch; then burn, PyTorch, kindling; …), after an
//! untimed warm-up round, so that load from other processes on a shared
//! machine hits all of them alike and none always runs after the same one;
//! samples/s are over all timed rounds. Then a breakdown of one kindling step (median ms per phase).
//!
//! PyTorch is not a project dependency; install a CPU build once:
//! `python3 -m venv ~/.cache/kindling/torchvenv && ~/.cache/kindling/torchvenv/bin/pip install torch==2.9.0`
//! (or point `KINDLING_TORCH_PYTHON` at any Python with torch). Then:
//! `cargo run --release -p kindling-agent --example bench_mlp -- --steps 600 --rounds 4`

use std::time::{Duration, Instant};

use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::Device;
use kindling_agent::models::builtin::{MlpModel, MlpModelConfig};
use kindling_agent::models::kindling_model::{Batch, Inputs, KindlingModel, ModelRegistry, task_loss};
use kindling_agent::models::{params, tensorize};
use kindling_agent::optim::FlatOptimizer;
use kindling_agent::training::gradients::GradientStep;
use kindling_agent::training::schedule::LrSchedule;
use kindling_agent::training::trainer;
use kindling_schemas::schema::{self, StreamKind};
use kindling_schemas::spec::{GradientClip, JobSpec, ModelSpec, OptimizerSpec, Schedule, Task};

mod common;
use common::{arg, mlp_batches};

const BATCH: usize = 256;

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
}

fn main() -> anyhow::Result<()> {
    let steps = arg("--steps", 200);
    let warmup = arg("--warmup", 20);
    let cores = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    // PyTorch and burn alone get `--threads`; the trainer computes on a pool
    // of `--kindling-threads` (default the same), as an agent's
    // `train_threads` sets it.
    let threads = arg("--threads", cores);
    let k_threads = arg("--kindling-threads", threads);
    let pool = |n: usize| rayon::ThreadPoolBuilder::new().num_threads(n).build();
    let (k_pool, b_pool) = (pool(k_threads)?, pool(threads)?);
    let spec = JobSpec::builder()
        .task(Task::Classification { num_classes: 10 })
        .model(ModelSpec::Mlp {
            hidden: vec![256, 128],
        })
        .optimizer(OptimizerSpec::adam(1e-3))
        .batch_size(BATCH)
        .features(["x"])
        .label("y")
        .build()?;
    let data = mlp_batches(64, BATCH);
    let layout = schema::validate(&data[0].schema(), &spec, StreamKind::Train)?;
    let base = Device::flex();
    let device = base.clone().autodiff();
    base.seed(0);
    let lr = spec.optimizer.learning_rate();

    // 1 + 2, interleaved in rounds so that load from other processes hits
    // both alike: the trainer's step path, and burn alone (tensors made once,
    // gradients straight into Adam).
    let rounds = arg("--rounds", 4).max(1);
    let per_round = steps.div_ceil(rounds);
    let steps = per_round * rounds;
    // Kindling's path: the model behind the trait, as the trainer runs it.
    let mut k_model = ModelRegistry::builtin().build(&spec, &layout, &device)?;
    let mut k_weights = k_model.flat_weights();
    let mut k_optim = FlatOptimizer::new(&spec.optimizer, k_weights.len());
    // The same path with the options of a tuned job, over 10 "epochs".
    let tuned = JobSpec::builder()
        .optimizer(OptimizerSpec::adamw(1e-3, 0.01))
        .no_weight_decay(["bias"])
        .schedule(Schedule::Cosine {
            warmup_epochs: 1.0,
            min_factor: 0.0,
        })
        .clip(GradientClip::Norm { max_norm: 1.0 })
        .epochs(10)
        .task(spec.task)
        .model(spec.model.clone())
        .batch_size(BATCH)
        .features(["x"])
        .label("y")
        .build()?;
    let mut t_model = ModelRegistry::builtin().build(&tuned, &layout, &device)?;
    let mut t_weights = t_model.flat_weights();
    let mut t_optim = FlatOptimizer::for_job(&tuned, &t_model.param_layout())?;
    let (t_schedule, t_exchange) = (LrSchedule::of(&tuned), GradientStep::for_spec(&tuned));
    let t_steps_per_epoch = ((steps.div_ceil(rounds) * rounds + warmup) as u64)
        .div_ceil(10)
        .max(1);
    let mut t_step = 0u64;
    let mlp = |device: &Device| {
        let config = MlpModelConfig::new(vec![256, 128]);
        MlpModel::init(&config, &Inputs::new(&layout), device)
    };
    let mut b_model = mlp(&device)?;
    // burn's own Adam, as the trainer configured it before it stepped flat buffers.
    let mut b_optim = AdamConfig::new().init();
    let tensors: Vec<_> = data
        .iter()
        .map(|b| {
            let x = tensorize::features(b, &layout, &device)?;
            let y = tensorize::targets(b, "y", spec.task, &device)?;
            anyhow::Ok((x, y))
        })
        .collect::<Result<_, _>>()?;
    let mut kindling = Duration::ZERO;
    let mut kindling_tuned = Duration::ZERO;
    let mut burn_alone = Duration::ZERO;
    let mut torch_time: Vec<(&str, Duration)> = Vec::new();
    for round in 0..=rounds {
        // Round 0 warms both up and is not timed. Each round runs the three
        // in a rotated order, so none always follows the same neighbour.
        let n = if round == 0 { warmup } else { per_round };
        let mut line = format!("round {round}:");
        for who in (0..4).map(|k| (k + round) % 4) {
            let t = Instant::now();
            match who {
                0 => {
                    k_model = k_pool.install(|| {
                        let mut m = k_model;
                        for i in 0..n {
                            let buf = m
                                .gradients(&Batch::new(&data[i % data.len()], &layout, &spec, &device))
                                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                            m = trainer::apply_summed_gradients(m, &mut k_optim, &mut k_weights, buf).0;
                        }
                        anyhow::Ok(m)
                    })?;
                    if round > 0 {
                        kindling += t.elapsed();
                        line += &format!(" kindling {:.0}", (n * BATCH) as f64 / t.elapsed().as_secs_f64());
                    }
                }
                3 => {
                    t_model = k_pool.install(|| {
                        let mut m = t_model;
                        for i in 0..n {
                            let mut buf = m
                                .gradients(&Batch::new(&data[i % data.len()], &layout, &tuned, &device))
                                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                            let _loss = buf.pop();
                            let rows = buf.pop().unwrap_or(1.0);
                            let _rows = buf.pop();
                            let scale = t_exchange.clipped(&buf, 1.0 / rows);
                            let epoch = (t_step / t_steps_per_epoch) as u32 + 1;
                            let lr =
                                t_schedule.rate(epoch, t_step % t_steps_per_epoch, t_steps_per_epoch, &[]);
                            t_optim.set_learning_rate(lr);
                            t_optim.step(&mut t_weights, &buf, scale);
                            m = m.load_flat(&t_weights);
                            t_step += 1;
                        }
                        anyhow::Ok(m)
                    })?;
                    if round > 0 {
                        kindling_tuned += t.elapsed();
                        line += &format!(" tuned {:.0}", (n * BATCH) as f64 / t.elapsed().as_secs_f64());
                    }
                }
                1 => {
                    b_model = b_pool.install(|| {
                        let mut m = b_model;
                        for i in 0..n {
                            let (x, y) = tensors[i % tensors.len()].clone();
                            let loss = task_loss(spec.task, m.forward_features(x), y, &device);
                            let grads = GradientsParams::from_grads(loss.backward(), &m);
                            m = b_optim.step(lr, m, grads);
                        }
                        m
                    });
                    if round > 0 {
                        burn_alone += t.elapsed();
                        line += &format!(" burn {:.0}", (n * BATCH) as f64 / t.elapsed().as_secs_f64());
                    }
                }
                _ if round > 0 => {
                    // PyTorch (its own warm-up inside each run), same threads.
                    let runs = [false, true]
                        .into_iter()
                        .flat_map(|tuned| torch(threads, per_round, warmup, tuned));
                    for (policy, sps) in runs {
                        line += &format!(" torch-{policy} {sps:.0}");
                        let d = Duration::from_secs_f64((per_round * BATCH) as f64 / sps);
                        match torch_time.iter_mut().find(|(p, _)| *p == policy) {
                            Some((_, total)) => *total += d,
                            None => torch_time.push((policy, d)),
                        }
                    }
                }
                _ => {}
            }
        }
        if round > 0 {
            eprintln!("{line} samples/s");
        }
    }
    std::hint::black_box((&k_model, &b_model, &t_model));

    // 3. Where a kindling step goes.
    let mut phases: [Vec<Duration>; 6] = Default::default();
    let model = mlp(&device)?;
    let mut weights = params::flat_weights(&model);
    let mut optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let model = k_pool.install(|| {
        let mut model = model;
        for i in 0..steps.min(100) {
            let b = &data[i % data.len()];
            let t0 = Instant::now();
            let x = tensorize::features(b, &layout, &device)?;
            let y = tensorize::targets(b, "y", spec.task, &device)?;
            let t1 = Instant::now();
            let loss = task_loss(spec.task, model.forward_features(x), y, &device);
            let loss_value = loss.clone().into_scalar::<f32>();
            let t2 = Instant::now();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let t3 = Instant::now();
            let buf = params::flatten_grads(&model, &grads);
            let t4 = Instant::now();
            optim.step(&mut weights, &buf, 1.0);
            let t5 = Instant::now();
            model = params::load_flat(model, &weights);
            let t6 = Instant::now();
            std::hint::black_box(loss_value);
            for (p, d) in phases
                .iter_mut()
                .zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5])
            {
                p.push(d);
            }
        }
        anyhow::Ok(model)
    })?;
    std::hint::black_box(&model);

    let sps = |d: Duration| (steps * BATCH) as f64 / d.as_secs_f64();
    let torch_runs: Vec<(&str, f64)> = torch_time.iter().map(|(p, d)| (*p, sps(*d))).collect();
    let fastest = |tuned: bool| {
        torch_runs
            .iter()
            .filter(|r| r.0.contains("AdamW") == tuned)
            .map(|r| r.1)
            .reduce(f64::max)
    };
    let (torch_sps, torch_tuned) = (fastest(false), fastest(true));
    let vs_tuned = |x: f64| {
        torch_tuned
            .map(|t| format!("{:.2}×", x / t))
            .unwrap_or_else(|| "n/a".into())
    };

    let vs = |x: f64| {
        torch_sps
            .map(|t| format!("{:.2}×", x / t))
            .unwrap_or_else(|| "n/a".into())
    };
    println!(
        "MLP 784-256-128-10, batch {BATCH}, Adam, cross-entropy, {steps} steps in {rounds} interleaved \
         rounds; PyTorch and burn alone on {threads} threads, the kindling trainer on {k_threads}"
    );
    println!();
    println!("| path | samples/s | vs PyTorch |");
    println!("|---|---:|---:|");
    println!(
        "| kindling step (trainer path, {k_threads} threads) | {:.0} | {} |",
        sps(kindling),
        vs(sps(kindling))
    );
    println!(
        "| kindling step, AdamW + warmup-cosine + norm clipping | {:.0} | {} of PyTorch's tuned step ({:.3}× the Adam step) |",
        sps(kindling_tuned),
        vs_tuned(sps(kindling_tuned)),
        sps(kindling_tuned) / sps(kindling)
    );
    println!(
        "| burn alone (tensors ready, no flatten) | {:.0} | {} |",
        sps(burn_alone),
        vs(sps(burn_alone))
    );
    for (policy, t) in &torch_runs {
        let ratio = match policy.contains("AdamW") {
            true => vs_tuned(*t),
            false => vs(*t),
        };
        println!("| PyTorch {threads} threads, OMP_WAIT_POLICY {policy} | {t:.0} | {ratio} |");
    }
    if torch_runs.is_empty() {
        println!("| PyTorch {threads} threads | not run | |");
    }
    println!();
    println!("| phase of a kindling step | median ms |");
    println!("|---|---:|");
    let names = [
        "Arrow batch → tensors",
        "forward + loss (+ loss read back)",
        "backward",
        "flatten gradients",
        "Adam step (flat, fused)",
        "weights back into the model",
    ];
    for (name, p) in names.iter().zip(phases) {
        println!("| {name} | {:.2} |", median(p));
    }
    Ok(())
}

/// One PyTorch run per OpenMP wait policy (default, PASSIVE): samples/s.
/// OpenMP threads spin while waiting by default, which collapses on cores
/// shared with other processes; PASSIVE makes them sleep. Both are run and the
/// faster one is the baseline.
fn torch(threads: usize, steps: usize, warmup: usize, tuned: bool) -> Vec<(&'static str, f64)> {
    let python = std::env::var("KINDLING_TORCH_PYTHON").unwrap_or_else(|_| {
        format!(
            "{}/.cache/kindling/torchvenv/bin/python",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bench_mlp.py");
    let mut runs = Vec::new();
    for policy in [None, Some("PASSIVE")] {
        let mut cmd = std::process::Command::new(&python);
        cmd.args([
            script,
            "--threads",
            &threads.to_string(),
            "--steps",
            &steps.to_string(),
        ])
        .args(["--warmup", &warmup.to_string()]);
        if tuned {
            cmd.arg("--tuned");
        }
        if let Some(p) = policy {
            cmd.env("OMP_WAIT_POLICY", p);
        }
        match cmd.output() {
            Ok(out) if out.status.success() => {
                let v: serde_json::Value = match serde_json::from_slice(&out.stdout) {
                    Ok(v) => v,
                    Err(e) => {
                        eprintln!("PyTorch baseline printed no JSON: {e}");
                        continue;
                    }
                };
                if let Some(x) = v["samples_per_sec"].as_f64() {
                    let label = match (tuned, policy) {
                        (false, None) => "default",
                        (false, Some(_)) => "PASSIVE",
                        (true, None) => "default, AdamW + warmup-cosine + clip_grad_norm_",
                        (true, Some(_)) => "PASSIVE, AdamW + warmup-cosine + clip_grad_norm_",
                    };
                    runs.push((label, x));
                }
            }
            Ok(out) => eprintln!(
                "PyTorch baseline failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => {
                eprintln!(
                    "PyTorch baseline not run ({python}: {e}); see the header of this file to install it"
                );
                break;
            }
        }
    }
    runs
}
