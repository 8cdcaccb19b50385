//! Your own burn model in Kindling: the [`KindlingModel`] trait, the
//! [`Batch`] a model reads its inputs from, and the [`ModelRegistry`] that
//! maps the names job specs use to model types.
//!
//! Everything around a model — feeding, flat gradients and the ring
//! all-reduce, the optimizers, checkpoints and resume, rank 0's broadcast,
//! `DoExchange` prediction, the model as an Arrow table — works on any
//! implementor, through the object-safe [`AnyModel`] every registered model
//! is erased to. The built-in networks (`crate::models::builtin`) are implementors
//! like any other.
//!
//! ```ignore
//! #[derive(Config, Debug)]
//! pub struct TabularConfig { #[config(default = 8)] pub embedding: usize }
//!
//! #[derive(Module, Debug)]
//! pub struct Tabular { city: Embedding, head: Linear }
//!
//! impl KindlingModel for Tabular {
//!     type Config = TabularConfig;
//!     fn init(config: &TabularConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
//!         let cities = inputs.vocabulary("city")?;
//!         Ok(Tabular {
//!             city: EmbeddingConfig::new(cities, config.embedding).init(device),
//!             head: LinearConfig::new(config.embedding + inputs.float_width(), inputs.outputs()).init(device),
//!         })
//!     }
//!     fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
//!         let city = self.city.forward(batch.ids("city")?.unsqueeze_dim(1)).squeeze_dim(1);
//!         Ok(self.head.forward(Tensor::cat(vec![city, batch.features()?], 1)))
//!     }
//! }
//!
//! kindling_agent::run(ModelRegistry::builtin().with::<Tabular>("tabular"))
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Int64Array, ListArray, RecordBatch};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, FieldRef};
use burn::module::Module;
use burn::nn::loss::{CrossEntropyLossConfig, MseLoss, Reduction};
use burn::optim::GradientsParams;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, Device, Int, Tensor};
use kindling_schemas::schema::{FeatureKind, FeatureLayout};
use kindling_schemas::spec::{JobSpec, Precision, Task, valid_model_name};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{AgentError, ModelError};
use crate::models::interchange::{self, WeightsFileError};
use crate::models::params;
pub use crate::models::tensorize::{Sequence, Targets};
use crate::optim::DeviceOptimizer;

/// A model's config field failed the model's own validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The field, e.g. `embedding` or `towers[1]`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A burn model Kindling can train, checkpoint and serve.
///
/// Implement it for your `#[derive(Module)]` type and register the type in a
/// [`ModelRegistry`] under a name; a job spec names it with
/// `ModelSpec::Custom { name, config }`, where `config` is the JSON of
/// [`Config`](KindlingModel::Config) (derive burn's `Config` for it).
pub trait KindlingModel: Module + Sync + 'static {
    /// The model's hyper-parameters, carried in the job spec as JSON, checked
    /// by [`validate`](KindlingModel::validate) before any row moves, and
    /// saved with every checkpoint (in the spec).
    type Config: Serialize + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static;

    /// Checks `config` against the job before anything starts: the error
    /// names the field. Inputs are only known once the data's schema is, so
    /// [`init`](KindlingModel::init) checks those (the default accepts all).
    fn validate(config: &Self::Config, spec: &JobSpec) -> Result<(), ConfigError> {
        let _ = (config, spec);
        Ok(())
    }

    /// A model with fresh weights for the job's `inputs` on `device`.
    fn init(config: &Self::Config, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError>;

    /// The model's raw outputs for a batch: class logits `[n, classes]` or
    /// values `[n, targets]`.
    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError>;

    /// The mean loss of `output` over the batch. The default is the task's:
    /// softmax cross-entropy for classes, mean squared error for values,
    /// each row weighted by [`Batch::weights`] when the job weights rows.
    fn loss(&self, output: Tensor<2>, batch: &Batch<'_>) -> Result<Tensor<1>, AgentError> {
        Ok(weighted_task_loss(
            batch.task(),
            output,
            batch.targets()?,
            batch.weights()?,
            batch.device(),
        ))
    }

    /// Names of metrics of the model's own, reported every epoch on the
    /// eval split as `eval_<name>` (lower-case words and `_`).
    const METRICS: &'static [&'static str] = &[];

    /// This eval batch's `(sum, count)` for each of
    /// [`METRICS`](KindlingModel::METRICS), in order. Kindling adds them
    /// over every rank's eval rows and reports `Σ sum / Σ count`.
    fn metric_sums(&self, output: &Tensor<2>, batch: &Batch<'_>) -> Result<Vec<(f64, f64)>, AgentError> {
        let _ = (output, batch);
        Ok(Vec::new())
    }

    /// Prediction columns for `output` (appended to the input's columns).
    /// The default: `prediction` (class id, value, or a list of values) and,
    /// for classification, `probabilities`.
    fn predictions(&self, output: Tensor<2>, task: Task) -> Result<Vec<(FieldRef, ArrayRef)>, AgentError> {
        task_predictions(output, task)
    }
}

/// What a model is built for: the job's feature columns (their kind and
/// width) and the width of its output.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    layout: &'a FeatureLayout,
}

impl<'a> Inputs<'a> {
    /// The inputs of `layout`.
    pub fn new(layout: &'a FeatureLayout) -> Self {
        Inputs { layout }
    }

    /// The layout (every feature column, in spec order).
    pub fn layout(&self) -> &'a FeatureLayout {
        self.layout
    }

    /// Width of the float input: the float columns concatenated, as
    /// [`Batch::features`] gives them.
    pub fn float_width(&self) -> usize {
        self.layout.input_dim
    }

    /// Width of the output: classes, or regression targets.
    pub fn outputs(&self) -> usize {
        self.layout.outputs
    }

    fn kind(&self, column: &str) -> Result<&'a FeatureKind, AgentError> {
        self.layout
            .column(column)
            .map(|c| &c.kind)
            .ok_or_else(|| not_a_feature(column))
    }

    /// Width of float column `column` (1 for a scalar).
    pub fn float(&self, column: &str) -> Result<usize, AgentError> {
        match self.kind(column)? {
            k @ (FeatureKind::Scalar(_) | FeatureKind::Vector { .. }) => Ok(k.float_width()),
            other => Err(wrong_kind(column, "float", other)),
        }
    }

    /// Vocabulary of categorical column `column`.
    pub fn vocabulary(&self, column: &str) -> Result<usize, AgentError> {
        match self.kind(column)? {
            FeatureKind::Categorical { vocabulary } => Ok(*vocabulary),
            other => Err(wrong_kind(column, "categorical ids", other)),
        }
    }

    /// `(vocabulary, max_len)` of sequence column `column`.
    pub fn sequence(&self, column: &str) -> Result<(usize, usize), AgentError> {
        match self.kind(column)? {
            FeatureKind::Sequence { vocabulary, max_len } => Ok((*vocabulary, *max_len)),
            other => Err(wrong_kind(column, "an id sequence", other)),
        }
    }
}

fn not_a_feature(column: &str) -> AgentError {
    AgentError::from(ModelError::InputKind {
        column: column.to_owned(),
        wanted: "an input",
        found: "no such feature column".into(),
    })
}

fn wrong_kind(column: &str, wanted: &'static str, found: &FeatureKind) -> AgentError {
    AgentError::from(ModelError::InputKind {
        column: column.to_owned(),
        wanted,
        found: crate::models::tensorize::describe(found),
    })
}

/// One batch of rows, read column by column into the tensors a model asks for.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    records: &'a RecordBatch,
    layout: &'a FeatureLayout,
    spec: &'a JobSpec,
    device: &'a Device,
    /// The inputs made ahead of the step ([`staged::Pipeline`]).
    staged: Option<&'a staged::Staged>,
    /// Where the inputs the model reads are recorded, for the next batch's staging.
    log: Option<&'a staged::AskLog>,
}

impl<'a> Batch<'a> {
    /// `records` (validated against `layout`) for `spec`'s model on `device`.
    pub fn new(
        records: &'a RecordBatch,
        layout: &'a FeatureLayout,
        spec: &'a JobSpec,
        device: &'a Device,
    ) -> Self {
        Batch {
            records,
            layout,
            spec,
            device,
            staged: None,
            log: None,
        }
    }

    /// This batch with inputs made ahead (`staged`), recording what the model
    /// reads into `log`.
    pub(crate) fn with_staged(self, staged: Option<&'a staged::Staged>, log: &'a staged::AskLog) -> Self {
        Batch {
            staged,
            log: Some(log),
            ..self
        }
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.records.num_rows()
    }

    /// The device tensors are made on.
    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// The job's task.
    pub fn task(&self) -> Task {
        self.spec.task
    }

    /// The Arrow rows themselves.
    pub fn records(&self) -> &'a RecordBatch {
        self.records
    }

    /// Every float column concatenated in spec order `[n, float_width]`,
    /// in the dtype the model computes in ([`float_dtype`](Self::float_dtype)).
    pub fn features(&self) -> Result<Tensor<2>, AgentError> {
        if let Some(log) = self.log {
            log.features();
        }
        if let Some(x) = self.staged.and_then(|s| s.features.clone()) {
            return Ok(x);
        }
        let x = crate::models::tensorize::features(self.records, self.layout, self.device)?;
        self.in_compute_dtype(x)
    }

    /// One float column `[n, width]`, in the dtype the model computes in.
    pub fn float(&self, column: &str) -> Result<Tensor<2>, AgentError> {
        if let Some(log) = self.log {
            log.float(column);
        }
        if let Some(x) = self.staged.and_then(|s| s.float(column)) {
            return Ok(x);
        }
        let feature = self.layout.column(column).ok_or_else(|| not_a_feature(column))?;
        let x = crate::models::tensorize::float_column(self.records, feature, self.device)?;
        self.in_compute_dtype(x)
    }

    /// The float dtype the job's model computes in: `f32`, or for a
    /// mixed-precision job (`precision: bf16`) on the GPU `bf16` (`f16`
    /// where the adapter has no `bf16`). A model that makes float tensors of
    /// its own makes them in this dtype.
    pub fn float_dtype(&self) -> Result<DType, AgentError> {
        // Every batch of every job asks: an f32 job answers before looking at the device.
        if self.spec.precision == Precision::F32 || !crate::models::backend::is_gpu(self.device) {
            return Ok(DType::F32);
        }
        Ok(crate::models::backend::compute_dtype(self.spec)?.unwrap_or(DType::F32))
    }

    fn in_compute_dtype(&self, x: Tensor<2>) -> Result<Tensor<2>, AgentError> {
        match self.float_dtype()? {
            DType::F32 => Ok(x),
            dtype => Ok(x.cast(dtype)),
        }
    }

    /// A categorical column's ids `[n]`.
    pub fn ids(&self, column: &str) -> Result<Tensor<1, Int>, AgentError> {
        Inputs::new(self.layout).vocabulary(column)?;
        crate::models::tensorize::ids(self.records, column, self.device)
    }

    /// A sequence column, padded to its `max_len`, with mask and lengths.
    pub fn sequence(&self, column: &str) -> Result<Sequence, AgentError> {
        let (_, max_len) = Inputs::new(self.layout).sequence(column)?;
        crate::models::tensorize::sequence(self.records, column, max_len, self.device)
    }

    /// The labels (training and eval batches only).
    pub fn targets(&self) -> Result<Targets, AgentError> {
        if let Some(log) = self.log {
            log.targets();
        }
        if let Some(y) = self.staged.and_then(|s| s.targets.clone()) {
            return Ok(y);
        }
        crate::models::tensorize::targets(self.records, &self.spec.label, self.spec.task, self.device)
    }

    /// Each row's weight `[n]` (the spec's `sample_weight` column times
    /// its `class_weights`), or `None` when the job weights no rows. A
    /// model that overrides [`KindlingModel::loss`] weights its rows' losses
    /// by these and divides by their sum, as [`weighted_task_loss`] does.
    pub fn weights(&self) -> Result<Option<Tensor<1>>, AgentError> {
        Ok(self.row_weights()?.map(|w| {
            let n = w.len();
            Tensor::from_data(burn::tensor::TensorData::new(w, [n]), self.device)
        }))
    }

    /// [`weights`](Self::weights) on the host.
    pub(crate) fn row_weights(&self) -> Result<Option<Vec<f32>>, AgentError> {
        crate::models::tensorize::row_weights(self.records, self.spec)
    }
}

/// The task's loss with each row's loss weighted: `Σ wᵢ·lᵢ / Σ wᵢ`
/// (`torch`'s weighted `CrossEntropyLoss`; for several regression targets
/// each row's squared error is averaged over its targets first). Without
/// weights, [`task_loss`].
pub fn weighted_task_loss(
    task: Task,
    output: Tensor<2>,
    targets: Targets,
    weights: Option<Tensor<1>>,
    device: &Device,
) -> Tensor<1> {
    let Some(w) = weights else {
        return task_loss(task, output, targets, device);
    };
    let per_row: Tensor<1> = match (task, targets) {
        (Task::Classification { .. }, Targets::Classes(t)) => {
            let log_p = burn::tensor::activation::log_softmax(output, 1);
            log_p.gather(1, t.unsqueeze_dim(1)).squeeze_dim::<1>(1).neg()
        }
        (_, Targets::Values(t)) => (output - t).powf_scalar(2.0).mean_dim(1).squeeze_dim::<1>(1),
        (Task::Regression, Targets::Classes(t)) => {
            let values: Tensor<2> = t.float().unsqueeze_dim(1);
            (output - values).powf_scalar(2.0).mean_dim(1).squeeze_dim::<1>(1)
        }
    };
    (per_row * w.clone()).sum() / w.sum()
}

/// Mean loss of `output` against `targets` for `task`.
pub fn task_loss(task: Task, output: Tensor<2>, targets: Targets, device: &Device) -> Tensor<1> {
    match (task, targets) {
        (Task::Classification { .. }, Targets::Classes(t)) => {
            CrossEntropyLossConfig::new().init(device).forward(output, t)
        }
        (_, Targets::Values(t)) => MseLoss::new().forward(output, t, Reduction::Mean),
        (Task::Regression, Targets::Classes(t)) => {
            let values: Tensor<2> = t.float().unsqueeze_dim(1);
            MseLoss::new().forward(output, values, Reduction::Mean)
        }
    }
}

/// The task's prediction columns for `output`: `prediction` (class id, value,
/// or a list of values for several targets) and, for classification,
/// `probabilities` (a list, as Spark has no fixed-size lists).
pub fn task_predictions(output: Tensor<2>, task: Task) -> Result<Vec<(FieldRef, ArrayRef)>, AgentError> {
    let [n, width] = output.dims();
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let list = |values: Vec<f32>| {
        let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(width, n));
        Arc::new(ListArray::new(
            item.clone(),
            offsets,
            Arc::new(Float32Array::from(values)),
            None,
        )) as ArrayRef
    };
    let floats = |t: Tensor<2>| -> Result<Vec<f32>, AgentError> {
        let d = t.into_data().convert::<f32>();
        Ok(d.as_slice::<f32>().map_err(ModelError::TensorData)?.to_vec())
    };
    Ok(match task {
        Task::Classification { .. } => {
            let probs = softmax(output, 1);
            let classes = probs.clone().argmax(1).into_data().convert::<i64>();
            let classes = classes
                .as_slice::<i64>()
                .map_err(ModelError::TensorData)?
                .to_vec();
            vec![
                (
                    Arc::new(Field::new("prediction", DataType::Int64, false)),
                    Arc::new(Int64Array::from(classes)) as ArrayRef,
                ),
                (
                    Arc::new(Field::new("probabilities", DataType::List(item.clone()), false)),
                    list(floats(probs)?),
                ),
            ]
        }
        Task::Regression if width == 1 => vec![(
            Arc::new(Field::new("prediction", DataType::Float32, false)),
            Arc::new(Float32Array::from(floats(output)?)) as ArrayRef,
        )],
        Task::Regression => vec![(
            Arc::new(Field::new("prediction", DataType::List(item.clone()), false)),
            list(floats(output)?),
        )],
    })
}

/// A registered model with its type erased: what the trainer, the
/// checkpoints and prediction work with. Every method is the generic code
/// of `params`/the trainer instantiated for the model's type.
pub trait AnyModel: Send + Sync + fmt::Debug {
    /// Number of trainable values.
    fn num_params(&self) -> usize;
    /// [`KindlingModel::forward`].
    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError>;
    /// [`KindlingModel::loss`].
    fn loss(&self, output: Tensor<2>, batch: &Batch<'_>) -> Result<Tensor<1>, AgentError>;
    /// [`KindlingModel::predictions`].
    fn predictions(&self, output: Tensor<2>, task: Task) -> Result<Vec<(FieldRef, ArrayRef)>, AgentError>;
    /// [`KindlingModel::METRICS`].
    fn metric_names(&self) -> &'static [&'static str];
    /// [`KindlingModel::metric_sums`].
    fn metric_sums(&self, output: &Tensor<2>, batch: &Batch<'_>) -> Result<Vec<(f64, f64)>, AgentError>;
    /// Forward and backward of one batch: the flat buffer of gradient *sums*
    /// over its rows (module visit order), then `[rows, weight, loss sum]`
    /// (the weight is the rows' total weight, or the rows unweighted).
    fn gradients(&self, batch: &Batch<'_>) -> Result<Vec<f32>, StepError>;
    /// [`gradients`](Self::gradients) kept on the device: the sums added to
    /// `opt`'s, the weighted loss left there too (read after the step).
    fn device_gradients(
        &self,
        batch: &Batch<'_>,
        opt: &mut DeviceOptimizer,
    ) -> Result<DeviceShare, StepError>;
    /// One step of `opt` on the sums gathered, on the device.
    fn device_step(self: Box<Self>, opt: &mut DeviceOptimizer, scale: f32) -> Box<dyn AnyModel>;
    /// Zero gradients laid out like [`gradients`](AnyModel::gradients)' (no trailer).
    fn zero_grads(&self) -> Vec<f32>;
    /// The weights in one buffer, laid out like the gradients.
    fn flat_weights(&self) -> Vec<f32>;
    /// Each parameter's path and size, in the flat buffers' order.
    fn param_layout(&self) -> Vec<(String, usize)>;
    /// The model with `values` (laid out like [`flat_weights`](AnyModel::flat_weights)) as weights.
    fn load_flat(self: Box<Self>, values: &[f32]) -> Box<dyn AnyModel>;
    /// The weights as an Arrow table (`name`, `shape`, `values`).
    fn to_arrow(&self) -> Result<RecordBatch, AgentError>;
    /// The model with the weights of a table from [`to_arrow`](AnyModel::to_arrow).
    fn from_arrow(self: Box<Self>, table: &RecordBatch) -> Result<Box<dyn AnyModel>, AgentError>;
    /// burn record bytes (broadcast, checkpoints).
    fn to_record_bytes(&self) -> Result<Vec<u8>, AgentError>;
    /// The model with the weights of record bytes.
    fn from_record_bytes(self: Box<Self>, bytes: Vec<u8>) -> Result<Box<dyn AnyModel>, AgentError>;
    /// Writes the weights to `path` as safetensors with PyTorch's names and
    /// layouts ([`interchange::save_safetensors`]).
    fn save_safetensors(
        &self,
        path: &Path,
        metadata: &BTreeMap<String, String>,
    ) -> Result<(), WeightsFileError>;
    /// Each tensor's PyTorch name and shape, as the safetensors file has them.
    fn pytorch_tensors(&self) -> Vec<(String, Vec<usize>)>;
    /// The model with the weights of a safetensors or PyTorch file, every tensor matched
    /// by name, shape and dtype ([`interchange::load_weights`]).
    fn load_weights(self: Box<Self>, path: &Path) -> Result<Box<dyn AnyModel>, WeightsFileError>;
    /// The model for inference (no gradient tracking).
    fn valid(&self) -> Box<dyn AnyModel>;
    /// The model with its float weights in `dtype` (mixed precision); every
    /// later load of weights keeps it.
    fn with_dtype(self: Box<Self>, dtype: DType) -> Box<dyn AnyModel>;
}

#[derive(Debug, Clone)]
struct Erased<M>(M);

impl<M: KindlingModel> AnyModel for Erased<M> {
    fn num_params(&self) -> usize {
        self.0.num_params()
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        Ok(in_f32(self.0.forward(batch)?))
    }

    fn loss(&self, output: Tensor<2>, batch: &Batch<'_>) -> Result<Tensor<1>, AgentError> {
        self.0.loss(output, batch)
    }

    fn predictions(&self, output: Tensor<2>, task: Task) -> Result<Vec<(FieldRef, ArrayRef)>, AgentError> {
        self.0.predictions(output, task)
    }

    fn metric_names(&self) -> &'static [&'static str] {
        M::METRICS
    }

    fn metric_sums(&self, output: &Tensor<2>, batch: &Batch<'_>) -> Result<Vec<(f64, f64)>, AgentError> {
        self.0.metric_sums(output, batch)
    }

    fn gradients(&self, batch: &Batch<'_>) -> Result<Vec<f32>, StepError> {
        let n = batch.rows();
        let weight = batch_weight(batch)?;
        if weight == 0.0 {
            // Rows that all weigh nothing move nothing (and their weighted
            // mean loss would be 0/0).
            let mut buf = self.zero_grads();
            buf.extend([n as f32, 0.0, 0.0]);
            return Ok(buf);
        }
        // In f32 whatever the model computes in: the loss is taken in f32.
        let output = AnyModel::forward(self, batch)?;
        let loss = self.0.loss(output, batch)?;
        let sum_loss: Tensor<1> = loss.clone().mul_scalar(weight as f32);
        let grads = GradientsParams::from_grads(sum_loss.backward(), &self.0);
        // The loss comes back with the gradients, in one read back (on a GPU,
        // the step's only wait for the device).
        let mut buf = params::flatten_grads_and(&self.0, &grads, loss);
        let loss_value = buf.pop().unwrap_or(f32::NAN) as f64;
        if !loss_value.is_finite() {
            return Err(StepError::NonFinite(loss_value));
        }
        buf.push(n as f32);
        buf.push(weight as f32);
        buf.push((loss_value * weight) as f32);
        Ok(buf)
    }

    fn device_gradients(
        &self,
        batch: &Batch<'_>,
        opt: &mut DeviceOptimizer,
    ) -> Result<DeviceShare, StepError> {
        let (rows, weight) = (batch.rows() as u64, batch_weight(batch)?);
        if weight == 0.0 {
            return Ok(DeviceShare {
                rows,
                weight,
                loss_sum: None,
            });
        }
        let output = AnyModel::forward(self, batch)?;
        let loss = self.0.loss(output, batch)?.mul_scalar(weight as f32);
        crate::optim::on_device::gather(
            &self.0,
            &GradientsParams::from_grads(loss.backward(), &self.0),
            opt,
        );
        let loss_sum = Some(loss.inner());
        Ok(DeviceShare {
            rows,
            weight,
            loss_sum,
        })
    }

    fn device_step(self: Box<Self>, opt: &mut DeviceOptimizer, scale: f32) -> Box<dyn AnyModel> {
        Box::new(Erased(crate::optim::on_device::step(self.0, opt, scale)))
    }

    fn zero_grads(&self) -> Vec<f32> {
        params::zero_grads(&self.0)
    }

    fn flat_weights(&self) -> Vec<f32> {
        params::flat_weights(&self.0)
    }

    fn param_layout(&self) -> Vec<(String, usize)> {
        params::layout(&self.0)
    }

    fn load_flat(self: Box<Self>, values: &[f32]) -> Box<dyn AnyModel> {
        Box::new(Erased(params::load_flat(self.0, values)))
    }

    fn to_arrow(&self) -> Result<RecordBatch, AgentError> {
        params::to_arrow(&self.0)
    }

    fn from_arrow(self: Box<Self>, table: &RecordBatch) -> Result<Box<dyn AnyModel>, AgentError> {
        let dtype = params::float_dtype(&self.0);
        Ok(Box::new(Erased(params::cast(
            params::from_arrow(self.0, table)?,
            dtype,
        ))))
    }

    fn to_record_bytes(&self) -> Result<Vec<u8>, AgentError> {
        params::to_record_bytes(&self.0)
    }

    fn from_record_bytes(self: Box<Self>, bytes: Vec<u8>) -> Result<Box<dyn AnyModel>, AgentError> {
        let dtype = params::float_dtype(&self.0);
        Ok(Box::new(Erased(params::cast(
            params::from_record_bytes(self.0, bytes)?,
            dtype,
        ))))
    }

    fn with_dtype(self: Box<Self>, dtype: DType) -> Box<dyn AnyModel> {
        Box::new(Erased(params::cast(self.0, dtype)))
    }

    fn save_safetensors(
        &self,
        path: &Path,
        metadata: &BTreeMap<String, String>,
    ) -> Result<(), WeightsFileError> {
        interchange::save_safetensors(&self.0, path, metadata)
    }

    fn pytorch_tensors(&self) -> Vec<(String, Vec<usize>)> {
        interchange::pytorch_tensors(&self.0)
    }

    fn load_weights(self: Box<Self>, path: &Path) -> Result<Box<dyn AnyModel>, WeightsFileError> {
        let dtype = params::float_dtype(&self.0);
        let loaded = interchange::load_weights(self.0, path)?;
        Ok(Box::new(Erased(params::cast(loaded, dtype))))
    }

    fn valid(&self) -> Box<dyn AnyModel> {
        Box::new(Erased(self.0.valid()))
    }
}

mod registry;
mod step;
pub use registry::{DEFAULT_MAX_PARAMS, ModelRegistry};
pub use step::{DeviceShare, StepError};
use step::{batch_weight, in_f32};
pub mod staged;

#[cfg(test)]
mod tests;
