//! The tabular embedding model of `bench_embedding` (a user model behind the
//! `KindlingModel` trait), its synthetic batches and its PyTorch twin
//! (`bench_embedding.py`), shared with `bench_gpu --embedding`, which trains it
//! on the GPU.

use std::sync::Arc;

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

pub const VOCABULARIES: [usize; 4] = [1000, 500, 100, 50];
pub const CATEGORICAL: [&str; 4] = ["c0", "c1", "c2", "c3"];
pub const FLOATS: usize = 16;

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

pub fn batches(n: usize, rows: usize) -> Vec<RecordBatch> {
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
                        (0..rows).map(|_| rng.random_range(0..v as i64)),
                    )) as ArrayRef
                })
                .collect();
            let values: Vec<f32> = (0..rows * FLOATS).map(|_| rng.random_range(-1.0..1.0)).collect();
            columns.push(Arc::new(FixedSizeListArray::new(
                item.clone(),
                FLOATS as i32,
                Arc::new(Float32Array::from(values)),
                None,
            )));
            columns.push(Arc::new(Int32Array::from_iter_values(
                (0..rows).map(|_| rng.random_range(0..2)),
            )));
            RecordBatch::try_new(schema.clone(), columns).expect("batch")
        })
        .collect()
}

/// PyTorch's samples/s over `steps` steps, or `None` when it cannot run.
pub fn torch(threads: usize, steps: usize, warmup: usize, extra: &[&str]) -> Option<f64> {
    let python = std::env::var("KINDLING_TORCH_PYTHON").unwrap_or_else(|_| {
        format!(
            "{}/.cache/kindling/torchvenv/bin/python",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    // From the repository's root (a bundle run on another machine), else
    // where this program was built.
    let here = "agent/examples/bench_embedding.py";
    let built = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bench_embedding.py");
    let script = if std::path::Path::new(here).exists() {
        here
    } else {
        built
    };
    let out = std::process::Command::new(&python)
        .args([script, "--threads", &threads.to_string()])
        .args(["--steps", &steps.to_string(), "--warmup", &warmup.to_string()])
        .args(extra)
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

/// The benchmark's job at `batch` rows a step, on the GPU when `gpu`.
pub fn spec(batch: usize, gpu: bool) -> anyhow::Result<JobSpec> {
    let mut spec = JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .model(ModelSpec::custom("tabular", &TabularConfig::new())?)
        .optimizer(OptimizerSpec::adam(1e-3))
        .batch_size(batch)
        .features(CATEGORICAL.iter().copied().chain(["x"]))
        .label("y")
        .use_gpu(gpu);
    for (c, v) in CATEGORICAL.iter().zip(VOCABULARIES) {
        spec = spec.categorical(*c, v);
    }
    Ok(spec.build()?)
}

/// One agent's step on the GPU (kept on the device, batches kept) at each
/// of `--batches`, against PyTorch eager on CUDA (`bench_embedding --gpu`,
/// `bench_gpu --embedding`).
pub fn on_gpu(steps: usize, warmup: usize) -> anyhow::Result<()> {
    use kindling_agent::models::kindling_model::staged::Pipeline;
    use kindling_agent::optim::DeviceOptimizer;
    let (gpu, info) = kindling_agent::models::backend::gpu().map_err(|e| anyhow::anyhow!("{e}"))?;
    let device = gpu.autodiff();
    let sizes: Vec<usize> = crate::common::list("--batches", "256,4096")
        .iter()
        .map(|b| b.parse())
        .collect::<Result<_, _>>()?;
    println!(
        "embedding model on {info}, one agent's step kept on the device, batches kept, {steps} steps after {warmup}"
    );
    println!("| batch | Kindling samples/s | PyTorch eager (CUDA) samples/s | Kindling / PyTorch |");
    println!("|---:|---:|---:|---:|");
    let models = ModelRegistry::empty().with::<Tabular>("tabular");
    for batch in sizes {
        let spec = spec(batch, true)?;
        let data = batches(8, batch);
        let layout = schema::validate(&data[0].schema(), &spec, StreamKind::Train)?;
        let model = models.build(&spec, &layout, &device)?;
        let weights = model.flat_weights();
        let optim = FlatOptimizer::new(&spec.optimizer, weights.len());
        let mut opt = DeviceOptimizer::upload(&optim, &weights, &model.param_layout(), None, &device);
        let k = crate::common::device_steps(
            model,
            &mut opt,
            Pipeline::new(true).keeping(u64::MAX),
            (&data, &layout, &spec, &device),
            (steps, warmup),
            trainer::LOSS_READ_EVERY,
        )?;
        let extra = ["--device", "cuda", "--batch", &batch.to_string()];
        match torch(1, steps, warmup, &extra) {
            Some(t) => println!("| {batch} | {k:.0} | {t:.0} | {:.2}× |", k / t),
            None => println!("| {batch} | {k:.0} | no PyTorch | |"),
        }
    }
    Ok(())
}
