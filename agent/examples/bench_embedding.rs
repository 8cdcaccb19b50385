//! Training samples/s of a tabular embedding model — a user model behind
//! the `KindlingModel` trait, trained through the trainer's own step path —
//! against the same model written in PyTorch (`bench_embedding.py`, CPU, same
//! threads), measured in the same run.
//!
//! The model: four categorical columns (vocabularies 1000, 500, 100, 50) each
//! through an embedding of 16, a numeric tower 16 → 32 (ReLU) over a
//! 16-float column, the concatenation through 96 → 64 (ReLU) → 2; Adam
//! (lr 1e-3), cross-entropy, batch 512, synthetic rows.
//!
//! Kindling's step: Arrow batch → id and float tensors, forward, backward,
//! gradients flattened for the all-reduce, the fused flat Adam step, weights
//! written back (`AnyModel::gradients` + `trainer::apply_summed_gradients`),
//! on a rayon pool of `--threads`. The two run in `--rounds` interleaved
//! rounds after an untimed warm-up round, alternating which goes first.
//!
//! Needs PyTorch, see `bench_mlp.rs`. Then:
//! `cargo run --release -p kindling-agent --example bench_embedding -- --steps 400 --rounds 4`
//!
//! `--gpu` (an agent built with `--features gpu`): on the GPU instead, one
//! agent's step as the trainer runs it there — kept on the device, the
//! batches' inputs kept on the device once staged (its epochs after the
//! first), the losses read every 25 steps — at each of `--batches`
//! (256,4096), against the same model in PyTorch eager on CUDA with its data
//! already there (`bench_embedding.py --device cuda`; `KINDLING_TORCH_PYTHON`
//! names the Python, `python3` on the GPU machine).

use std::time::{Duration, Instant};

use burn::tensor::Device;
use kindling_agent::models::kindling_model::{Batch, ModelRegistry};
use kindling_agent::optim::FlatOptimizer;
use kindling_agent::training::trainer;
use kindling_schemas::schema::{self, StreamKind};

mod common;
use common::arg;

#[path = "common/tabular.rs"]
mod tabular;
use tabular::{Tabular, batches, on_gpu, spec, torch};

/// The CPU benchmark's batch.
const BATCH: usize = 512;

fn main() -> anyhow::Result<()> {
    let steps = arg("--steps", 200);
    let warmup = arg("--warmup", 20);
    if std::env::args().any(|a| a == "--gpu") {
        return on_gpu(steps, warmup);
    }
    let rounds = arg("--rounds", 4).max(1);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = arg("--threads", cores);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let spec = spec(BATCH, false)?;
    let data = batches(64, BATCH);
    let layout = schema::validate(&data[0].schema(), &spec, StreamKind::Train)?;
    let models = ModelRegistry::empty().with::<Tabular>("tabular");
    models.check(&spec)?;
    let device = Device::flex().autodiff();
    let mut model = models.build_seeded(&spec, &layout, 0)?;
    let mut weights = model.flat_weights();
    let mut optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let per_round = steps.div_ceil(rounds);
    let (mut kindling, mut torch_total, mut torch_rounds) = (Duration::ZERO, Duration::ZERO, 0);
    for round in 0..=rounds {
        let n = if round == 0 { warmup } else { per_round };
        let mut line = format!("round {round}:");
        for who in [round % 2, (round + 1) % 2] {
            if who == 0 {
                let t = Instant::now();
                model = pool.install(|| {
                    let mut m = model;
                    for i in 0..n {
                        let batch = Batch::new(&data[i % data.len()], &layout, &spec, &device);
                        let buf = m.gradients(&batch).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                        m = trainer::apply_summed_gradients(m, &mut optim, &mut weights, buf).0;
                    }
                    anyhow::Ok(m)
                })?;
                if round > 0 {
                    kindling += t.elapsed();
                    line += &format!(" kindling {:.0}", (n * BATCH) as f64 / t.elapsed().as_secs_f64());
                }
            } else if round > 0
                && let Some(sps) = torch(threads, per_round, warmup, &[])
            {
                line += &format!(" torch {sps:.0}");
                torch_total += Duration::from_secs_f64((per_round * BATCH) as f64 / sps);
                torch_rounds += 1;
            }
        }
        if round > 0 {
            eprintln!("{line} samples/s");
        }
    }
    let k = (rounds * per_round * BATCH) as f64 / kindling.as_secs_f64();
    println!("\nembedding model, batch {BATCH}, {threads} threads, {rounds} rounds of {per_round} steps");
    println!("| path | samples/s | vs PyTorch |");
    println!("|---|---:|---:|");
    if torch_rounds > 0 {
        let t = (torch_rounds * per_round * BATCH) as f64 / torch_total.as_secs_f64();
        println!("| kindling step (trait, trainer path) | {k:.0} | {:.2}× |", k / t);
        println!("| PyTorch CPU | {t:.0} | 1.00× |");
    } else {
        println!("| kindling step (trait, trainer path) | {k:.0} | no PyTorch |");
    }
    Ok(())
}
