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

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, Relu};
use burn::tensor::{Device, Tensor};
use kindling_agent::AgentError;
use kindling_agent::models::kindling_model::{Batch, Inputs, KindlingModel, ModelRegistry};
use kindling_agent::optim::FlatOptimizer;
use kindling_agent::training::trainer;
use kindling_schemas::schema::{self, StreamKind};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};
use rand::{Rng, SeedableRng};

mod common;
use common::arg;

const VOCABULARIES: [usize; 4] = [1000, 500, 100, 50];
const CATEGORICAL: [&str; 4] = ["c0", "c1", "c2", "c3"];
const FLOATS: usize = 16;
const BATCH: usize = 512;

/// Config of [`Tabular`].
#[derive(Config, Debug)]
pub struct TabularConfig {
    /// Embedding width of every categorical column.
    #[config(default = 16)]
    pub embedding: usize,
}

/// Embeddings per categorical column plus a numeric tower.
#[derive(Module, Debug)]
pub struct Tabular {
    embeddings: Vec<Embedding>,
    tower: Linear,
    hidden: Linear,
    head: Linear,
    activation: Relu,
}

impl KindlingModel for Tabular {
    type Config = TabularConfig;

    fn init(config: &TabularConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        let embeddings = CATEGORICAL
            .iter()
            .map(|c| Ok(EmbeddingConfig::new(inputs.vocabulary(c)?, config.embedding).init(device)))
            .collect::<Result<Vec<_>, AgentError>>()?;
        let width = config.embedding * CATEGORICAL.len() + 32;
        Ok(Tabular {
            embeddings,
            tower: LinearConfig::new(inputs.float_width(), 32).init(device),
            hidden: LinearConfig::new(width, 64).init(device),
            head: LinearConfig::new(64, inputs.outputs()).init(device),
            activation: Relu::new(),
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        let mut parts = Vec::with_capacity(CATEGORICAL.len() + 1);
        for (column, embedding) in CATEGORICAL.iter().zip(&self.embeddings) {
            let ids = batch.ids(column)?.unsqueeze_dim(1);
            parts.push(embedding.forward(ids).squeeze_dim::<2>(1));
        }
        parts.push(self.activation.forward(self.tower.forward(batch.features()?)));
        let hidden = self
            .activation
            .forward(self.hidden.forward(Tensor::cat(parts, 1)));
        Ok(self.head.forward(hidden))
    }
}

fn batches(n: usize) -> Vec<RecordBatch> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let mut fields: Vec<Field> = CATEGORICAL
        .iter()
        .map(|c| Field::new(*c, DataType::Int64, false))
        .collect();
    fields.push(Field::new(
        "x",
        DataType::FixedSizeList(item.clone(), FLOATS as i32),
        false,
    ));
    fields.push(Field::new("y", DataType::Int32, false));
    let schema = Arc::new(Schema::new(fields));
    (0..n)
        .map(|_| {
            let mut columns: Vec<ArrayRef> = VOCABULARIES
                .iter()
                .map(|&v| {
                    Arc::new(Int64Array::from_iter_values(
                        (0..BATCH).map(|_| rng.random_range(0..v as i64)),
                    )) as ArrayRef
                })
                .collect();
            let values: Vec<f32> = (0..BATCH * FLOATS).map(|_| rng.random_range(-1.0..1.0)).collect();
            columns.push(Arc::new(FixedSizeListArray::new(
                item.clone(),
                FLOATS as i32,
                Arc::new(Float32Array::from(values)),
                None,
            )));
            columns.push(Arc::new(Int32Array::from_iter_values(
                (0..BATCH).map(|_| rng.random_range(0..2)),
            )));
            RecordBatch::try_new(schema.clone(), columns).expect("batch")
        })
        .collect()
}

/// PyTorch's samples/s over `steps` steps, or `None` when it cannot run.
fn torch(threads: usize, steps: usize, warmup: usize) -> Option<f64> {
    let python = std::env::var("KINDLING_TORCH_PYTHON").unwrap_or_else(|_| {
        format!(
            "{}/.cache/kindling/torchvenv/bin/python",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bench_embedding.py");
    let out = std::process::Command::new(&python)
        .args([script, "--threads", &threads.to_string()])
        .args(["--steps", &steps.to_string(), "--warmup", &warmup.to_string()])
        .output();
    match out {
        Ok(out) if out.status.success() => serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v["samples_per_sec"].as_f64()),
        Ok(out) => {
            eprintln!(
                "PyTorch baseline failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("cannot run {python}: {e} (set KINDLING_TORCH_PYTHON)");
            None
        }
    }
}

fn main() -> anyhow::Result<()> {
    let steps = arg("--steps", 200);
    let warmup = arg("--warmup", 20);
    let rounds = arg("--rounds", 4).max(1);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = arg("--threads", cores);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let mut spec = JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .model(ModelSpec::custom("tabular", &TabularConfig::new())?)
        .optimizer(OptimizerSpec::adam(1e-3))
        .batch_size(BATCH)
        .features(CATEGORICAL.iter().copied().chain(["x"]))
        .label("y");
    for (c, v) in CATEGORICAL.iter().zip(VOCABULARIES) {
        spec = spec.categorical(*c, v);
    }
    let spec = spec.build()?;
    let data = batches(64);
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
                && let Some(sps) = torch(threads, per_round, warmup)
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
