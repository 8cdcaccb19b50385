//! A model over variable-length id sequences: an `Embedding`, a 1-D
//! convolution and a masked max over time ([`MotifNet`]), classifying whether
//! a sequence contains the motif `3 1 4`, next to [`BagOfIds`] (an embedding
//! mean over the row's positions, blind to order). The data is made in
//! Spark: a `List<Int64>` column of 8 to 31 ids per row.
//!
//! Shared by `main.rs` (the example) and `tests/tests/model_examples.rs`.

use anyhow::{Context, anyhow};
use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv1d, Conv1dConfig};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, PaddingConfig1d, Relu};
use burn::tensor::{Device, Tensor};
use kindling::SparkSession;
use kindling::arrow::array::{AsArray, RecordBatch};
use kindling::arrow::datatypes::{DataType, Int64Type};
use kindling::functions::{col, count, lit};
use kindling::futures::StreamExt;
use kindling::job::{ProgressMode, TrainedModel, TrainingJob};
use kindling::model::{AgentError, Batch, ConfigError, Inputs, KindlingModel, ModelRegistry};
use kindling::{InputType, JobSpec, ModelSpec, OptimizerSpec, Task};

/// Ids in the sequences are `1..VOCABULARY`; 0 is left free, so the padding
/// `Batch::sequence` adds (id 0) is no id of the data.
pub const VOCABULARY: usize = 17;
/// The longest sequence: a base of at most 28 ids, plus 3 planted.
pub const MAX_LEN: usize = 32;
/// The names the networks are registered and named under.
pub const MOTIF_NET: &str = "motif-net";
/// See [`MOTIF_NET`].
pub const BAG_OF_IDS: &str = "bag-of-ids";
/// Rows generated (a fifth of them are the test rows).
pub const ROWS: i64 = 20_000;
/// Epochs the example and its test train for.
pub const EPOCHS: u32 = 8;

/// Hyper-parameters of [`MotifNet`].
#[derive(Config, Debug)]
pub struct MotifNetConfig {
    /// The sequence column it reads.
    pub column: String,
    /// Width of the id embedding.
    #[config(default = 16)]
    pub embedding: usize,
    /// Filters of the convolution.
    #[config(default = 32)]
    pub filters: usize,
    /// Width of the convolution's window, in ids.
    #[config(default = 3)]
    pub kernel: usize,
}

/// Embedding -> Conv1d -> ReLU -> max over the sequence's own positions -> Linear.
#[derive(Module, Debug)]
pub struct MotifNet {
    embedding: Embedding,
    conv: Conv1d,
    activation: Relu,
    head: Linear,
    #[module(skip)]
    column: String,
}

impl KindlingModel for MotifNet {
    type Config = MotifNetConfig;

    fn validate(config: &MotifNetConfig, spec: &JobSpec) -> Result<(), ConfigError> {
        if !matches!(spec.inputs.get(&config.column), Some(InputType::Sequence { .. })) {
            return Err(ConfigError::new(
                "column",
                format!("`{}` is not declared a sequence in the job", config.column),
            ));
        }
        for (field, value) in [
            ("embedding", config.embedding),
            ("filters", config.filters),
            ("kernel", config.kernel),
        ] {
            if value == 0 {
                return Err(ConfigError::new(field, "must be at least 1"));
            }
        }
        Ok(())
    }

    fn init(config: &MotifNetConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        let (vocabulary, _max_len) = inputs.sequence(&config.column)?;
        Ok(MotifNet {
            embedding: EmbeddingConfig::new(vocabulary, config.embedding).init(device),
            conv: Conv1dConfig::new(config.embedding, config.filters, config.kernel)
                .with_padding(PaddingConfig1d::Same)
                .init(device),
            activation: Relu::new(),
            head: LinearConfig::new(config.filters, inputs.outputs()).init(device),
            column: config.column.clone(),
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        let sequence = batch.sequence(&self.column)?; // ids [n, len], padded with 0
        let x = self.embedding.forward(sequence.ids).swap_dims(1, 2); // [n, embedding, len]
        let x = self.activation.forward(self.conv.forward(x)); // [n, filters, len], >= 0
        // Max over the row's own positions: padding is zeroed, which cannot
        // win against the ReLU outputs of a real position (all >= 0).
        let mask: Tensor<3> = sequence.mask.float().unsqueeze_dim(1); // [n, 1, len]
        let pooled: Tensor<2> = (x * mask).max_dim(2).squeeze_dim(2); // [n, filters]
        Ok(self.head.forward(pooled))
    }
}

/// Hyper-parameters of [`BagOfIds`].
#[derive(Config, Debug)]
pub struct BagOfIdsConfig {
    /// The sequence column it reads.
    pub column: String,
    /// Width of the id embedding.
    #[config(default = 16)]
    pub embedding: usize,
}

/// Embedding -> mean over the row's own positions -> Linear: what ids a
/// sequence holds, blind to their order.
#[derive(Module, Debug)]
pub struct BagOfIds {
    embedding: Embedding,
    head: Linear,
    #[module(skip)]
    column: String,
}

impl KindlingModel for BagOfIds {
    type Config = BagOfIdsConfig;

    fn init(config: &BagOfIdsConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        let (vocabulary, _max_len) = inputs.sequence(&config.column)?;
        Ok(BagOfIds {
            embedding: EmbeddingConfig::new(vocabulary, config.embedding).init(device),
            head: LinearConfig::new(config.embedding, inputs.outputs()).init(device),
            column: config.column.clone(),
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        let sequence = batch.sequence(&self.column)?;
        let x = self.embedding.forward(sequence.ids); // [n, len, embedding]
        let mask: Tensor<3> = sequence.mask.float().unsqueeze_dim(2); // [n, len, 1]
        let sum: Tensor<2> = (x * mask).sum_dim(1).squeeze_dim(1); // [n, embedding]
        // An empty row's mean stays 0 rather than 0 / 0.
        let lengths: Tensor<2> = sequence.lengths.float().clamp_min(1.0).unsqueeze_dim(1); // [n, 1]
        Ok(self.head.forward(sum / lengths))
    }
}

/// What one run measured.
#[derive(Debug)]
pub struct Outcome {
    /// Training rows.
    pub train_rows: i64,
    /// Test rows.
    pub test_rows: i64,
    /// Test accuracy of always answering the training rows' majority class.
    pub majority: f64,
    /// Test accuracy of [`MotifNet`].
    pub net: f64,
    /// Test accuracy of [`BagOfIds`], which ignores order.
    pub bag: f64,
}

impl Outcome {
    /// Prints the comparison table.
    pub fn print(&self) {
        println!(
            "contains `3 1 4`? {} train rows, {} test rows of 8 to 31 ids in 1..{VOCABULARY}",
            self.train_rows, self.test_rows
        );
        println!("{:<44} {:>14}", "model", "test accuracy");
        println!(
            "{:<44} {:>13.2}%",
            "majority class of the training rows",
            100.0 * self.majority
        );
        println!(
            "{:<44} {:>13.2}%",
            "kindling BagOfIds (masked mean), 2 slots",
            100.0 * self.bag
        );
        println!(
            "{:<44} {:>13.2}%",
            "kindling MotifNet (conv over ids), 2 slots",
            100.0 * self.net
        );
    }
}

/// Generates the sequences in Spark, trains [`MotifNet`] and [`BagOfIds`] on
/// 2 local slots for `epochs` each, and scores them and the majority class on
/// the test rows.
pub async fn run(remote: &str, epochs: u32) -> anyhow::Result<Outcome> {
    let spark = SparkSession::connect(remote).await?;

    // Every value is a hash of the row id: the same data every run. Each row
    // gets a base of 5..=28 random ids with three more planted at a random
    // place: `3 1 4` in about half the rows, `4 1 3` in the others. Both
    // classes hold the same ids, so only their order tells them apart.
    let base = spark.range(0, ROWS, 1).select_expr([
        "id",
        "transform(sequence(1, 5 + CAST(pmod(xxhash64(id, 'len'), 24) AS INT)), \
         i -> 1 + pmod(xxhash64(id, i), 16)) AS base",
        "IF(pmod(xxhash64(id, 'class'), 2) = 0, array(3L, 1L, 4L), array(4L, 1L, 3L)) AS planted",
    ]);
    let tokens = base.select_expr([
        "id",
        "concat(slice(base, 1, CAST(pmod(xxhash64(id, 'at'), size(base) + 1) AS INT)), planted, \
         slice(base, CAST(pmod(xxhash64(id, 'at'), size(base) + 1) AS INT) + 1, size(base))) AS tokens",
    ]);
    // The label is what the sequence holds (a base may contain the motif too).
    let data = tokens.select_expr([
        "tokens",
        "CAST(locate(',3,1,4,', concat(',', array_join(tokens, ','), ',')) > 0 AS INT) AS label",
        "pmod(xxhash64(id, 'split'), 5) = 0 AS test",
    ]);
    let train = data
        .filter(col("test").eq(lit(false)))
        .select(["tokens", "label"]);
    let test = data.filter(col("test")).select(["tokens", "label"]);

    // The majority baseline, counted in Spark.
    let counts = |df: &kindling::DataFrame| {
        let df = df.group_by(["label"]).agg([count(lit(1)).alias("n")]);
        async move { label_counts(&df.collect().await?) }
    };
    let (train_counts, test_counts) = (counts(&train).await?, counts(&test).await?);
    let majority_label = train_counts
        .iter()
        .max_by_key(|(_, n)| *n)
        .map(|(label, _)| *label)
        .context("no training rows")?;
    let test_rows: i64 = test_counts.iter().map(|(_, n)| n).sum();
    let majority_hits: i64 = test_counts
        .iter()
        .filter(|(label, _)| *label == majority_label)
        .map(|(_, n)| n)
        .sum();

    // Both networks train on the same rows, one job each.
    let models = ModelRegistry::builtin()
        .with::<MotifNet>(MOTIF_NET)
        .with::<BagOfIds>(BAG_OF_IDS);
    let motif = ModelSpec::custom(MOTIF_NET, &MotifNetConfig::new("tokens".into()))?;
    let bag = ModelSpec::custom(BAG_OF_IDS, &BagOfIdsConfig::new("tokens".into()))?;
    let mut scores = Vec::new();
    for spec in [motif, bag] {
        let model = TrainingJob::builder()
            .model(spec)
            .models(models.clone())
            .task(Task::Classification { num_classes: 2 })
            .optimizer(OptimizerSpec::adam(0.01))
            .features(["tokens"])
            .sequence("tokens", VOCABULARY, MAX_LEN)
            .label("label")
            .epochs(epochs)
            .batch_size(64)
            .num_slots(2)
            .seed(7)
            .progress(ProgressMode::Log)
            .local_mode(true)
            .build()?
            .fit(&train)
            .await?;
        scores.push(accuracy(&model, &test, test_rows).await?);
    }
    Ok(Outcome {
        train_rows: train_counts.iter().map(|(_, n)| n).sum(),
        test_rows,
        majority: majority_hits as f64 / test_rows as f64,
        net: scores[0],
        bag: scores[1],
    })
}

/// `model`'s accuracy on `test` (its `test_rows` rows), predicted in this process.
async fn accuracy(model: &TrainedModel, test: &kindling::DataFrame, test_rows: i64) -> anyhow::Result<f64> {
    let mut predictions = model.predict(test).await?;
    let (mut hits, mut scored) = (0i64, 0i64);
    while let Some(batch) = predictions.next().await {
        let batch = batch?;
        let column = |name: &str| -> anyhow::Result<Vec<i64>> {
            let c = batch
                .column_by_name(name)
                .ok_or_else(|| anyhow!("no `{name}` column"))?;
            let c = kindling::arrow::compute::cast(c, &DataType::Int64)?;
            Ok(c.as_primitive::<Int64Type>().values().to_vec())
        };
        hits += column("prediction")?
            .into_iter()
            .zip(column("label")?)
            .filter(|(p, y)| p == y)
            .count() as i64;
        scored += batch.num_rows() as i64;
    }
    anyhow::ensure!(scored == test_rows, "{scored} rows scored, {test_rows} test rows");
    Ok(hits as f64 / test_rows as f64)
}

/// `(label, rows)` from a `label, n` aggregate.
fn label_counts(batches: &[RecordBatch]) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut out = Vec::new();
    for batch in batches {
        let label = kindling::arrow::compute::cast(batch.column(0), &DataType::Int64)?;
        let label = label.as_primitive::<Int64Type>();
        let n = batch.column(1).as_primitive::<Int64Type>();
        out.extend(label.values().iter().copied().zip(n.values().iter().copied()));
    }
    Ok(out)
}
