//! The job spec: what to train, on which columns, how, and on how many slots.
//!
//! A [`JobSpec`] is only ever handed out validated: build it with
//! [`JobSpec::builder`] or parse it with [`JobSpec::from_json`]; both name the
//! offending field in their error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod kind;
mod model_spec;
mod schedule;
mod training;

pub use kind::JobKind;
pub use model_spec::{
    InputType, MAX_CONFIG_BYTES, MAX_MODEL_NAME, MAX_SEQUENCE, MAX_VOCABULARY, MAX_WIDTH, ModelSpec,
    Pretrained, valid_model_name,
};
pub use schedule::{EarlyStopping, Metric, Schedule};
pub use training::{GradientClip, MAX_ACCUMULATE, MAX_NO_DECAY, OptimizerSpec, path_matches};

/// What the label means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Task {
    /// Integer class labels in `0..num_classes`.
    Classification {
        /// Number of classes (≥ 2).
        num_classes: usize,
    },
    /// A real-valued label.
    Regression,
}

/// The loss function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Softmax cross-entropy (classification).
    CrossEntropy,
    /// Mean squared error (regression).
    Mse,
}

/// When to checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointPolicy {
    /// Checkpoint after every `every_epochs` epochs (0: never, except on demand).
    pub every_epochs: u32,
    /// How many completed checkpoints to keep per job.
    pub keep_last: u32,
    /// Also checkpoint inside an epoch (from the second), every this many
    /// steps (0: not by steps): a lost agent then costs the steps since.
    #[serde(default)]
    pub every_steps: u64,
    /// Also checkpoint inside an epoch once this many seconds of training
    /// passed since the last checkpoint (0: not by time), rank 0's clock
    /// deciding for every rank. Default [`CheckpointPolicy::EVERY_SECS`].
    #[serde(default = "CheckpointPolicy::default_every_secs")]
    pub every_secs: u64,
}

impl CheckpointPolicy {
    /// The default of `every_secs`: ten minutes, so a lost agent costs at
    /// most about ten minutes of training however long an epoch is.
    pub const EVERY_SECS: u64 = 600;

    fn default_every_secs() -> u64 {
        Self::EVERY_SECS
    }
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every_epochs: 1,
            keep_last: 2,
            every_steps: 0,
            every_secs: Self::EVERY_SECS,
        }
    }
}

/// How gradients travel between ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradientCompression {
    /// `f32`: the exact ring sum.
    #[default]
    None,
    /// `bf16` on the wire (half the bytes), sums accumulated in `f32`;
    /// every rank still ends with identical gradients.
    Bf16,
}

impl GradientCompression {
    fn is_none(&self) -> bool {
        *self == GradientCompression::None
    }
}

/// The precision of a job's forward and backward passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// `f32` throughout.
    #[default]
    F32,
    /// Mixed precision, on the GPU only: the model's weights, activations and
    /// gradients in `bf16` (`f16` where the adapter has no `bf16`); the loss,
    /// the gradients' all-reduce, the optimizer and its master weights in
    /// `f32`.
    Bf16,
}

impl Precision {
    fn is_f32(&self) -> bool {
        *self == Precision::F32
    }
}

/// Everything an agent needs to know to train one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Architecture.
    pub model: ModelSpec,
    /// Classification or regression.
    pub task: Task,
    /// Loss; must fit the task.
    pub loss: Loss,
    /// Optimizer.
    pub optimizer: OptimizerSpec,
    /// Passes over the data.
    pub epochs: u32,
    /// Rows per step on each rank.
    pub batch_size: usize,
    /// Number of agents (ranks) training together.
    pub num_slots: u32,
    /// Train on the GPU (burn-wgpu) instead of the CPU.
    #[serde(default)]
    pub use_gpu: bool,
    /// Compute precision (default `f32`; `bf16` needs `use_gpu`).
    #[serde(default, skip_serializing_if = "Precision::is_f32")]
    pub precision: Precision,
    /// Seed of the initial weights, of the shuffle from the second epoch
    /// on, and of the eval split the client draws.
    #[serde(default)]
    pub seed: u64,
    /// Feature columns, in the order they are concatenated into the input.
    pub features: Vec<String>,
    /// Label column.
    pub label: String,
    /// Checkpointing.
    #[serde(default)]
    pub checkpoint: CheckpointPolicy,
    /// Visit each rank's cached batches in a new seeded order every epoch.
    #[serde(default = "default_true")]
    pub shuffle: bool,
    /// Declared types of the feature columns that are not float: categorical
    /// ids and id sequences, by column name. Every other feature is a float
    /// input (a numeric scalar or a `FixedSizeList<Float32>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, InputType>,
    /// Values per label for regression: 1 (a numeric label) or more (a
    /// `FixedSizeList<Float32>` label of that length, several targets).
    #[serde(default = "one")]
    pub targets: usize,
    /// How the gradients' all-reduce sends its values (default `none`).
    #[serde(default, skip_serializing_if = "GradientCompression::is_none")]
    pub gradient_compression: GradientCompression,
    /// Parameter paths (patterns, see [`path_matches`]) that take no
    /// weight decay: biases, norms, embeddings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_weight_decay: Vec<String>,
    /// The learning rate by global step (default constant).
    #[serde(default, skip_serializing_if = "Schedule::is_constant")]
    pub schedule: Schedule,
    /// Gradient clipping on the all-reduced gradient (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip: Option<GradientClip>,
    /// Micro-batches of `batch_size` rows each rank sums before one
    /// optimizer step (default 1: none).
    #[serde(default = "one_u32", skip_serializing_if = "is_one")]
    pub accumulate: u32,
    /// Stop when a metric stops improving (default: train every epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStopping>,
    /// A weight per class the loss multiplies each row's loss by
    /// (classification; one positive weight per class, `torch`'s
    /// `CrossEntropyLoss(weight=…)`): the loss is `Σ wᵢ·lᵢ / Σ wᵢ`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_weights: Option<Vec<f64>>,
    /// A numeric column whose value (finite, ≥ 0) weights each row in the
    /// loss and in every eval metric (scikit-learn's `sample_weight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_weight: Option<String>,
    /// `k` of the eval split's top-k accuracy (default 5; reported when
    /// below the number of classes).
    #[serde(default = "default_top_k", skip_serializing_if = "is_default_top_k")]
    pub top_k: u32,
    /// The rows this job trains on are those of the dataset job named here
    /// on each of its agents (a search's trials): nothing is fed to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_from: Option<String>,
    /// This job trains nothing: it holds the rows fed to it for the jobs
    /// that name it in `rows_from`, until it is cancelled (a search's dataset).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_rows: bool,
    /// The file the initial weights came from (`init_from`); the weights
    /// themselves travel in `start_job`'s `initial_weights`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<Pretrained>,
    /// The eval rows were split off by a column's value and the seed
    /// ([`EvalSplit`]): recorded with the job and its saved model, so the
    /// held-out rows can be named again. Agents do not split; absent when
    /// the client drew no eval split or Spark's random one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_split: Option<EvalSplit>,
}

/// An eval split by a column: row `r` is an eval row when
///
/// ```text
/// pmod(hash(CAST(seed AS BIGINT), v(r)), 16777216) < round(fraction × 16777216)
/// ```
///
/// in Spark SQL, where `hash` is Spark's Murmur3 (x86, 32 bits, seed 42: the
/// hash Spark partitions and buckets tables by, so the same on every
/// machine and version), `seed` the job's seed as a signed 64-bit integer,
/// and `v(r)` the row's value of column `by`: `CAST(by AS BIGINT)` for an
/// integer column (the same split whether the ETL makes it an `INT` or a
/// `BIGINT`), the string itself for a string column (its UTF-8 bytes). The
/// split depends on those values only, never on the rows' order or
/// partitioning, and rows sharing a value fall on the same side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalSplit {
    /// The integer or string column whose value places each row.
    pub by: String,
    /// The expected share of eval rows, in `(0, 0.9)`.
    pub fraction: f64,
}

impl EvalSplit {
    /// Hash buckets rows fall in ([`EvalSplit`]): `2^24`.
    pub const BUCKETS: i64 = 1 << 24;

    /// A split of `fraction` of the rows by column `by`.
    pub fn new(by: impl Into<String>, fraction: f64) -> Self {
        EvalSplit {
            by: by.into(),
            fraction,
        }
    }

    /// The buckets `0..eval_buckets()` hold the eval rows.
    pub fn eval_buckets(&self) -> i64 {
        (self.fraction * Self::BUCKETS as f64).round() as i64
    }

    fn check(&self) -> Result<(), SpecError> {
        if self.by.trim().is_empty() {
            return Err(SpecError::new("eval_split.by", "empty column name"));
        }
        if !(self.fraction > 0.0 && self.fraction < 0.9) {
            return Err(SpecError::new(
                "eval_split.fraction",
                format!("must be in (0, 0.9), got {}", self.fraction),
            ));
        }
        Ok(())
    }
}

fn default_top_k() -> u32 {
    5
}

fn is_default_top_k(k: &u32) -> bool {
    *k == 5
}

fn one_u32() -> u32 {
    1
}

fn is_one(x: &u32) -> bool {
    *x == 1
}

fn one() -> usize {
    1
}

fn default_true() -> bool {
    true
}

/// A job spec field failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid job spec: `{field}`: {reason}")]
pub struct SpecError {
    /// The field, e.g. `batch_size` or `features[2]`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl SpecError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Upper bounds that keep a malformed spec from exhausting an agent.
pub const MAX_SLOTS: u32 = 4096;

impl JobSpec {
    /// Starts a builder with defaults: linear model, Adam(1e-3), 1 epoch,
    /// batch 64, 1 slot, CPU, seed 0.
    ///
    /// ```
    /// use kindling_schemas::spec::{JobSpec, ModelSpec, Task};
    /// let spec = JobSpec::builder()
    ///     .model(ModelSpec::Mlp { hidden: vec![32] })
    ///     .task(Task::Classification { num_classes: 3 })
    ///     .features(["x1", "x2"])
    ///     .label("y")
    ///     .num_slots(2)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(spec.num_slots, 2);
    /// ```
    pub fn builder() -> JobSpecBuilder {
        JobSpecBuilder::default()
    }

    /// Parses and validates a JSON spec.
    pub fn from_json(json: &str) -> Result<JobSpec, SpecError> {
        let spec: JobSpec =
            serde_json::from_str(json).map_err(|e| SpecError::new("<json>", e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// The spec in one readable line (model, task, optimizer and its
    /// options, length), as status pages show it.
    pub fn summary(&self) -> String {
        training::summary(self)
    }

    /// The columns a train or eval stream carries: the features in order,
    /// the label, and the sample-weight column when there is one.
    pub fn columns(&self) -> Vec<&str> {
        self.features
            .iter()
            .chain([&self.label])
            .chain(&self.sample_weight)
            .map(String::as_str)
            .collect()
    }

    /// The spec as JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.features.is_empty() {
            return Err(SpecError::new(
                "features",
                "at least one feature column is required",
            ));
        }
        for (i, f) in self.features.iter().enumerate() {
            if f.trim().is_empty() {
                return Err(SpecError::new(format!("features[{i}]"), "empty column name"));
            }
            if self.features[..i].contains(f) {
                return Err(SpecError::new(
                    format!("features[{i}]"),
                    format!("column `{f}` listed twice"),
                ));
            }
            if *f == self.label {
                return Err(SpecError::new(
                    format!("features[{i}]"),
                    format!("`{f}` is also the label"),
                ));
            }
        }
        if self.label.trim().is_empty() {
            return Err(SpecError::new("label", "empty column name"));
        }
        if self.epochs == 0 {
            return Err(SpecError::new("epochs", "must be at least 1"));
        }
        if self.batch_size == 0 || self.batch_size > 1 << 20 {
            return Err(SpecError::new("batch_size", "must be in 1..=1048576"));
        }
        if self.num_slots == 0 || self.num_slots > MAX_SLOTS {
            return Err(SpecError::new("num_slots", format!("must be in 1..={MAX_SLOTS}")));
        }
        match (self.task, self.loss) {
            (Task::Classification { num_classes }, Loss::CrossEntropy) => {
                if !(2..=MAX_WIDTH).contains(&num_classes) {
                    return Err(SpecError::new(
                        "task.num_classes",
                        format!("must be in 2..={MAX_WIDTH}"),
                    ));
                }
            }
            (Task::Regression, Loss::Mse) => {}
            (Task::Classification { .. }, Loss::Mse) => {
                return Err(SpecError::new(
                    "loss",
                    "mse does not fit a classification task; use cross_entropy",
                ));
            }
            (Task::Regression, Loss::CrossEntropy) => {
                return Err(SpecError::new(
                    "loss",
                    "cross_entropy does not fit a regression task; use mse",
                ));
            }
        }
        self.model.validate(&self.features)?;
        model_spec::validate_inputs(&self.inputs, &self.features, &self.label)?;
        if !(1..=MAX_WIDTH).contains(&self.targets) {
            return Err(SpecError::new("targets", format!("must be in 1..={MAX_WIDTH}")));
        }
        if self.targets > 1 && self.task != Task::Regression {
            return Err(SpecError::new(
                "targets",
                "several targets need a regression task (a class label is one id)",
            ));
        }
        if self.precision != Precision::F32 && !self.use_gpu {
            return Err(SpecError::new(
                "precision",
                "bf16 compute runs on the GPU only: set `use_gpu`, or leave `precision` at f32",
            ));
        }
        if self.checkpoint.keep_last == 0 {
            return Err(SpecError::new("checkpoint.keep_last", "must be at least 1"));
        }
        if let Some(dataset) = &self.rows_from {
            if self.holds_rows {
                return Err(SpecError::new(
                    "rows_from",
                    "a job that holds rows for others reads no other job's rows",
                ));
            }
            crate::descriptor::check_job_id(dataset)
                .map_err(|e| SpecError::new("rows_from", e.to_string()))?;
        }
        if let Some(pretrained) = &self.init_from {
            pretrained.check()?;
        }
        if let Some(split) = &self.eval_split {
            split.check()?;
        }
        training::check(self)
    }

    /// Width of the model's output layer.
    pub fn output_dim(&self) -> usize {
        match self.task {
            Task::Classification { num_classes } => num_classes,
            Task::Regression => self.targets,
        }
    }
}

/// Builds a [`JobSpec`], validating in [`build`](JobSpecBuilder::build).
#[derive(Clone, Debug)]
pub struct JobSpecBuilder {
    spec: JobSpec,
    loss_set: bool,
}

impl Default for JobSpecBuilder {
    fn default() -> Self {
        JobSpecBuilder {
            spec: JobSpec {
                model: ModelSpec::Linear,
                task: Task::Regression,
                loss: Loss::Mse,
                optimizer: OptimizerSpec::adam(1e-3),
                epochs: 1,
                batch_size: 64,
                num_slots: 1,
                use_gpu: false,
                precision: Precision::F32,
                seed: 0,
                features: Vec::new(),
                label: String::new(),
                checkpoint: CheckpointPolicy::default(),
                shuffle: true,
                inputs: BTreeMap::new(),
                targets: 1,
                gradient_compression: GradientCompression::None,
                no_weight_decay: Vec::new(),
                schedule: Schedule::default(),
                clip: None,
                accumulate: 1,
                early_stopping: None,
                class_weights: None,
                sample_weight: None,
                top_k: 5,
                rows_from: None,
                holds_rows: false,
                init_from: None,
                eval_split: None,
            },
            loss_set: false,
        }
    }
}

impl JobSpecBuilder {
    /// Sets the model.
    pub fn model(mut self, model: ModelSpec) -> Self {
        self.spec.model = model;
        self
    }
    /// Sets the task; the loss follows it unless set explicitly.
    pub fn task(mut self, task: Task) -> Self {
        self.spec.task = task;
        self
    }
    /// Sets the loss explicitly.
    pub fn loss(mut self, loss: Loss) -> Self {
        self.spec.loss = loss;
        self.loss_set = true;
        self
    }
    /// Sets the optimizer.
    pub fn optimizer(mut self, optimizer: OptimizerSpec) -> Self {
        self.spec.optimizer = optimizer;
        self
    }
    /// Records where the initial weights come from (see [`Pretrained`]).
    pub fn init_from(mut self, pretrained: Pretrained) -> Self {
        self.spec.init_from = Some(pretrained);
        self
    }
    /// Sets the number of epochs.
    pub fn epochs(mut self, epochs: u32) -> Self {
        self.spec.epochs = epochs;
        self
    }
    /// Sets the per-rank batch size.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.spec.batch_size = batch_size;
        self
    }
    /// Sets the number of slots (ranks).
    pub fn num_slots(mut self, num_slots: u32) -> Self {
        self.spec.num_slots = num_slots;
        self
    }
    /// Trains on the GPU.
    pub fn use_gpu(mut self, use_gpu: bool) -> Self {
        self.spec.use_gpu = use_gpu;
        self
    }
    /// Sets the compute precision (`Precision::Bf16` needs `use_gpu`).
    pub fn precision(mut self, precision: Precision) -> Self {
        self.spec.precision = precision;
        self
    }
    /// Sets the seed (see [`JobSpec::seed`]).
    pub fn seed(mut self, seed: u64) -> Self {
        self.spec.seed = seed;
        self
    }
    /// Sets the feature columns.
    pub fn features<I, S>(mut self, features: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spec.features = features.into_iter().map(Into::into).collect();
        self
    }
    /// Sets the label column.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.spec.label = label.into();
        self
    }
    /// Sends the gradients' all-reduce in `compression`.
    pub fn gradient_compression(mut self, compression: GradientCompression) -> Self {
        self.spec.gradient_compression = compression;
        self
    }
    /// Sets the checkpoint policy.
    pub fn checkpoint(mut self, policy: CheckpointPolicy) -> Self {
        self.spec.checkpoint = policy;
        self
    }
    /// Shuffles batch order every epoch (default on).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.spec.shuffle = shuffle;
        self
    }
    /// Declares feature column `column` categorical: integer ids in
    /// `0..vocabulary` (an `Int32` or `Int64` column), for an embedding.
    pub fn categorical(mut self, column: impl Into<String>, vocabulary: usize) -> Self {
        self.spec
            .inputs
            .insert(column.into(), InputType::Categorical { vocabulary });
        self
    }
    /// Declares feature column `column` a sequence of ids in `0..vocabulary`
    /// (a `List<Int32|Int64>` column) of at most `max_len` ids per row.
    pub fn sequence(mut self, column: impl Into<String>, vocabulary: usize, max_len: usize) -> Self {
        self.spec
            .inputs
            .insert(column.into(), InputType::Sequence { vocabulary, max_len });
        self
    }
    /// Regression with `targets` values per label (a `FixedSizeList<Float32>`
    /// label of that length when more than 1).
    pub fn targets(mut self, targets: usize) -> Self {
        self.spec.targets = targets;
        self
    }
    /// Exempts parameters matching these path patterns from weight decay
    /// (e.g. `["bias", "*norm*", "*embedding*"]`; see [`path_matches`]).
    pub fn no_weight_decay<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spec.no_weight_decay = patterns.into_iter().map(Into::into).collect();
        self
    }
    /// Sets the learning-rate schedule.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.spec.schedule = schedule;
        self
    }
    /// Clips the all-reduced gradient.
    pub fn clip(mut self, clip: GradientClip) -> Self {
        self.spec.clip = Some(clip);
        self
    }
    /// Sums `micro_batches` batches per rank before each optimizer step.
    pub fn accumulate(mut self, micro_batches: u32) -> Self {
        self.spec.accumulate = micro_batches;
        self
    }
    /// Stops early (and keeps the best epoch) when a metric stops improving.
    pub fn early_stopping(mut self, stopping: EarlyStopping) -> Self {
        self.spec.early_stopping = Some(stopping);
        self
    }
    /// Weights each class's rows in the loss (one weight per class).
    pub fn class_weights(mut self, weights: impl Into<Vec<f64>>) -> Self {
        self.spec.class_weights = Some(weights.into());
        self
    }
    /// Weights each row by the value of `column` in the loss and metrics.
    pub fn sample_weight(mut self, column: impl Into<String>) -> Self {
        self.spec.sample_weight = Some(column.into());
        self
    }
    /// `k` of the eval split's top-k accuracy.
    pub fn top_k(mut self, k: u32) -> Self {
        self.spec.top_k = k;
        self
    }
    /// Records the eval split by a column the client draws.
    pub fn eval_split(mut self, split: EvalSplit) -> Self {
        self.spec.eval_split = Some(split);
        self
    }
    /// Validates and returns the spec.
    pub fn build(mut self) -> Result<JobSpec, SpecError> {
        if !self.loss_set {
            self.spec.loss = match self.spec.task {
                Task::Classification { .. } => Loss::CrossEntropy,
                Task::Regression => Loss::Mse,
            };
        }
        self.spec.validate()?;
        Ok(self.spec)
    }
}

#[cfg(test)]
mod tests;
