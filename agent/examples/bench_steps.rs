//! Where a data-parallel training step's time goes: an MLP of ~12.6 M
//! parameters (1024 → 4096 → 2048 → 10) trained on 2 and 4 local ranks,
//! each rank a thread that runs the trainer's own step — `gradients`, then
//! [`Exchange::run`] (the trailer's all-reduce, the gradients in buckets,
//! the optimizer), then `load_flat` — over in-process collective listeners
//! on loopback. Printed per step (the slowest rank's mean): compute, idle
//! (waiting for the slowest rank), all-reduce wait, the optimizer time the
//! step waited for, and the all-reduce's bytes and bus bandwidth; for each
//! world with the optimizer overlapping the all-reduce and without
//! (the baseline for what overlap buys), and in `bf16`.
//!
//! `cargo run --release -p kindling-agent --example bench_steps -- --steps 8 --batch 32`

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{FixedSizeListArray, Float32Array, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use kindling_agent::collective::{Precision, Ring, RingConfig};
use kindling_agent::models::kindling_model::{Batch, ModelRegistry};
use kindling_agent::optim::FlatOptimizer;
use kindling_agent::training::gradients::{BUCKET_VALUES, GradientStep, StepTimes, Trailer};
use kindling_agent::training::trainer;
use kindling_schemas::auth::Token;
use kindling_schemas::schema::{self, StreamKind};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

mod common;
use common::{arg, collective_servers};

const IN: usize = 1024;

fn batch(rows: usize, seed: u64) -> RecordBatch {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new("x", DataType::FixedSizeList(item.clone(), IN as i32), false),
        Field::new("y", DataType::Int32, false),
    ]));
    let values: Vec<f32> = (0..rows * IN).map(|_| rng.random_range(-1.0..1.0)).collect();
    let x = FixedSizeListArray::new(item, IN as i32, Arc::new(Float32Array::from(values)), None);
    let y = Int32Array::from_iter_values((0..rows).map(|_| rng.random_range(0..10)));
    RecordBatch::try_new(schema, vec![Arc::new(x), Arc::new(y)]).expect("batch")
}

/// Runs `steps` steps on `world` ranks; returns the slowest rank's times.
async fn run(
    world: usize,
    steps: usize,
    rows: usize,
    exchange: GradientStep,
) -> anyhow::Result<(StepTimes, usize)> {
    let spec = JobSpec::builder()
        .model(ModelSpec::Mlp {
            hidden: vec![4096, 2048],
        })
        .task(Task::Classification { num_classes: 10 })
        .optimizer(OptimizerSpec::adam(1e-3))
        .features(["x"])
        .label("y")
        .num_slots(world as u32)
        .batch_size(rows)
        .build()?;
    let token = Token::new("bench");
    let stop = CancellationToken::new();
    let (urls, inboxes) = collective_servers(world, &token, None, &stop).await?;
    let job = format!("steps-{world}-{:?}-{}", exchange.precision, exchange.overlap);
    let mut ranks = Vec::new();
    for (rank, inbox) in inboxes.iter().enumerate() {
        inbox.enter_attempt(&job, 1);
        let mut ring = Ring::new(
            RingConfig {
                job_id: job.clone(),
                attempt: 1,
                rank: rank as u32,
                peers: urls.clone(),
                token: Some(token.clone()),
                timeout: Duration::from_secs(120),
                channel: Default::default(),
            },
            inbox.clone(),
            CancellationToken::new(),
        )?;
        let (spec, rt) = (spec.clone(), tokio::runtime::Handle::current());
        ranks.push(tokio::task::spawn_blocking(move || {
            let data = batch(rows, rank as u64);
            let layout = schema::validate(&data.schema(), &spec, StreamKind::Train)?;
            let device = trainer::device_for(&spec)?.autodiff();
            let mut model = ModelRegistry::builtin().build_seeded(&spec, &layout, 7)?;
            let mut weights = model.flat_weights();
            let params = weights.len();
            let mut optim = FlatOptimizer::new(&spec.optimizer, params);
            let mut times = StepTimes::default();
            // One step untimed: connections, first-touch of every buffer.
            for step in 0..=steps {
                let mut t = StepTimes::default();
                let started = std::time::Instant::now();
                let mut buf = model
                    .gradients(&Batch::new(&data, &layout, &spec, &device))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                // `[sums…, rows, weight, loss sum]` to `[sums…, trailer]`.
                let tail = buf.split_off(buf.len() - 3);
                let (rows, weight, loss_sum) = (tail[0], tail[1], tail[2]);
                Trailer {
                    rows,
                    weight,
                    loss_sum,
                    ..Trailer::default()
                }
                .append_to(&mut buf);
                t.compute += started.elapsed();
                let taken = exchange.run(
                    (&rt, &mut ring),
                    (&mut buf, params),
                    (&mut optim, &mut weights),
                    &mut t,
                    |tr| (tr.weight > 0.0).then(|| 1.0 / tr.weight),
                )?;
                if taken {
                    model = model.load_flat(&weights);
                }
                if step > 0 {
                    times.add(&t);
                }
            }
            anyhow::Ok((times, params))
        }));
    }
    let mut slowest = StepTimes::default();
    let mut params = 0;
    for r in ranks {
        let (t, p) = r.await??;
        params = p;
        let total = |t: &StepTimes| t.compute + t.idle + t.all_reduce + t.optimizer;
        if total(&t) > total(&slowest) {
            slowest = t;
        }
    }
    stop.cancel();
    Ok((slowest, params))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let steps = arg("--steps", 8);
    let rows = arg("--batch", 32);
    println!(
        "| ranks | exchange | compute | idle | all-reduce wait | optimizer (waited) | optimizer (busy) | step | all-reduce bytes | bus bandwidth |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for world in [2usize, 4] {
        for (name, precision, overlap) in [
            ("f32, no overlap (baseline)", Precision::F32, false),
            ("f32, overlap", Precision::F32, true),
            ("bf16, overlap", Precision::Bf16, true),
        ] {
            let exchange = GradientStep {
                precision,
                bucket_values: BUCKET_VALUES,
                device_bucket_values: kindling_agent::training::gradients::DEVICE_BUCKET_VALUES,
                overlap,
                clip_norm: None,
            };
            let (t, params) = run(world, steps, rows, exchange).await?;
            let per = |d: Duration| d.as_secs_f64() * 1e3 / t.steps.max(1) as f64;
            let bytes = t.bytes as f64 / t.steps.max(1) as f64;
            let bus = 2.0 * (world as f64 - 1.0) / world as f64 * bytes / (per(t.all_reduce) / 1e3) / 1e9;
            println!(
                "| {world} | {name} ({:.1} M params) | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} MB | {bus:.2} GB/s |",
                params as f64 / 1e6,
                per(t.compute),
                per(t.idle),
                per(t.all_reduce),
                per(t.optimizer),
                per(t.optimizer_busy),
                per(t.compute + t.idle + t.all_reduce + t.optimizer),
                bytes / 1e6,
            );
        }
    }
    Ok(())
}
