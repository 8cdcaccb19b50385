//! The result of `fit`: metrics, the trained weights as an Arrow table,
//! save/load, and — with the `local` feature, which links burn — prediction
//! in this process over DataFrames (streamed, and back into Spark).

use std::path::Path;
#[cfg(feature = "local")]
use std::pin::Pin;
#[cfg(feature = "local")]
use std::sync::Arc;

use arrow::array::RecordBatch;
#[cfg(feature = "local")]
use arrow::datatypes::SchemaRef;
#[cfg(feature = "local")]
use futures::{Stream, StreamExt};
#[cfg(feature = "local")]
use kindling_agent::models::kindling_model::{AnyModel, ModelRegistry};
#[cfg(feature = "local")]
use kindling_agent::serving::predict;
#[cfg(feature = "local")]
use kindling_agent::training::trainer;
use kindling_schemas::action::EpochMetrics;
#[cfg(feature = "local")]
use kindling_schemas::model_serving::model_layout;
use kindling_schemas::model_serving::{ModelInput, model_inputs};
use kindling_schemas::schema::{self, FeatureLayout, StreamKind};
use kindling_schemas::spec::JobSpec;
use serde::{Deserialize, Serialize};

use super::JobError;
#[cfg(feature = "local")]
use crate::feed::relay::{self, SparkRows};
#[cfg(feature = "local")]
use crate::spark::{DataFrame, SparkSession};

/// A stream of prediction batches.
#[cfg(feature = "local")]
pub type PredictionStream = Pin<Box<dyn Stream<Item = Result<RecordBatch, JobError>> + Send>>;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ModelMeta {
    job_id: String,
    pub(super) input_dim: usize,
    history: Vec<EpochMetrics>,
    /// The feature columns the model was trained on.
    #[serde(default)]
    pub(super) inputs: Vec<ModelInput>,
    /// The epoch whose weights these are, when early stopping restored
    /// the best one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) best_epoch: Option<u32>,
}

/// A trained model: its spec, metrics and weights; with the `local` feature
/// also the burn model, to predict in this process, when this process has
/// the model registered (the built-ins always are; see
/// [`TrainingJobBuilder::models`](super::TrainingJobBuilder::models)).
#[derive(Debug, Clone)]
pub struct TrainedModel {
    pub(super) spec: JobSpec,
    pub(super) meta: ModelMeta,
    pub(super) weights: RecordBatch,
    #[cfg(feature = "local")]
    pub(super) net: Option<Arc<dyn AnyModel>>,
    /// The cluster that serves it for `transform`.
    pub(super) serving: Option<super::target::ServingCluster>,
}

impl TrainedModel {
    pub(crate) fn from_weights(
        spec: JobSpec,
        job_id: String,
        layout: &FeatureLayout,
        history: Vec<EpochMetrics>,
        weights: RecordBatch,
        #[cfg(feature = "local")] models: &ModelRegistry,
    ) -> Result<Self, JobError> {
        let meta = ModelMeta {
            job_id,
            input_dim: layout.input_dim,
            history,
            inputs: model_inputs(layout),
            best_epoch: None,
        };
        #[cfg(feature = "local")]
        let net = match models.contains(spec.model.name()) {
            true => Some(Arc::from(empty_net(models, &spec, layout)?.from_arrow(&weights)?)),
            false => None,
        };
        Ok(TrainedModel {
            spec,
            meta,
            weights,
            #[cfg(feature = "local")]
            net,
            serving: None,
        })
    }

    /// The layout of prediction input with `schema`, checked against the
    /// spec and the inputs the model was trained on.
    pub(super) fn check_input(&self, schema: &arrow::datatypes::Schema) -> Result<FeatureLayout, JobError> {
        let layout = schema::validate(schema, &self.spec, StreamKind::Predict)?;
        if layout.input_dim != self.meta.input_dim {
            return Err(JobError::InputWidth {
                features: layout.input_dim,
                model: self.meta.input_dim,
            });
        }
        let given = model_inputs(&layout);
        if !self.meta.inputs.is_empty() && given != self.meta.inputs {
            return Err(JobError::InputMismatch {
                features: format!("{given:?}"),
                model: format!("{:?}", self.meta.inputs),
            });
        }
        Ok(layout)
    }

    /// The spec it was trained with.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// The job that trained it.
    pub fn job_id(&self) -> &str {
        &self.meta.job_id
    }

    /// Metrics of every epoch.
    pub fn history(&self) -> &[EpochMetrics] {
        &self.meta.history
    }

    /// The epoch whose weights the model holds when early stopping kept
    /// the best epoch (`None`: the last epoch's).
    pub fn best_epoch(&self) -> Option<u32> {
        self.meta.best_epoch
    }

    /// The weights as an Arrow table (`name`, `shape`, `values`).
    pub fn weights(&self) -> Result<RecordBatch, JobError> {
        Ok(self.weights.clone())
    }

    /// Saves to `dir`: `spec.json`, `model.json` (metrics, input width),
    /// `weights.arrow` (Arrow IPC file, for other languages) and, with the
    /// `local` feature, `model.bpk` (burn record).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), JobError> {
        let dir = dir.as_ref();
        let io = |what: &str, e| JobError::Io {
            context: format!("{what} in {}", dir.display()),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(|e| io("create model dir", e))?;
        std::fs::write(dir.join("spec.json"), self.spec.to_json()).map_err(|e| io("write spec.json", e))?;
        let meta = serde_json::to_vec_pretty(&self.meta).map_err(|e| io("encode model.json", e.into()))?;
        std::fs::write(dir.join("model.json"), meta).map_err(|e| io("write model.json", e))?;
        #[cfg(feature = "local")]
        if let Some(net) = &self.net {
            std::fs::write(dir.join("model.bpk"), net.to_record_bytes()?)
                .map_err(|e| io("write model.bpk", e))?;
        }
        let table = &self.weights;
        let file =
            std::fs::File::create(dir.join("weights.arrow")).map_err(|e| io("create weights.arrow", e))?;
        let mut w = arrow::ipc::writer::FileWriter::try_new(file, &table.schema())
            .map_err(|e| io("write weights.arrow", std::io::Error::other(e)))?;
        w.write(table)
            .map_err(|e| io("write weights.arrow", std::io::Error::other(e)))?;
        w.finish()
            .map_err(|e| io("write weights.arrow", std::io::Error::other(e)))?;
        Ok(())
    }

    /// Loads a model saved with [`save`](Self::save): a built-in network, or
    /// (without the `local` feature) any model's weights table.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, JobError> {
        #[cfg(feature = "local")]
        return Self::load_with(dir, &ModelRegistry::builtin());
        #[cfg(not(feature = "local"))]
        Self::load_from(dir.as_ref())
    }

    /// Loads a model saved with [`save`](Self::save) whose model `models`
    /// has registered (your own, or a built-in), ready to predict here.
    #[cfg(feature = "local")]
    pub fn load_with(dir: impl AsRef<Path>, models: &ModelRegistry) -> Result<Self, JobError> {
        Self::load_from(dir.as_ref(), models)
    }

    fn load_from(dir: &Path, #[cfg(feature = "local")] models: &ModelRegistry) -> Result<Self, JobError> {
        let read = |name: &str| {
            std::fs::read(dir.join(name)).map_err(|e| JobError::Io {
                context: format!("read {} in {}", name, dir.display()),
                source: e,
            })
        };
        let spec = JobSpec::from_json(&String::from_utf8_lossy(&read("spec.json")?))?;
        let meta: ModelMeta = serde_json::from_slice(&read("model.json")?).map_err(|e| JobError::Io {
            context: format!("parse model.json in {}", dir.display()),
            source: e.into(),
        })?;
        #[cfg(feature = "local")]
        if models.contains(spec.model.name()) {
            let bytes = read("model.bpk")?;
            let net = empty_net(models, &spec, &model_layout(&spec, &meta.inputs, meta.input_dim))?
                .from_record_bytes(bytes)?;
            let weights = net.to_arrow()?;
            return Ok(TrainedModel {
                spec,
                meta,
                weights,
                net: Some(Arc::from(net)),
                serving: None,
            });
        }
        let weights = read_weights(&dir.join("weights.arrow"))?;
        Ok(TrainedModel {
            spec,
            meta,
            weights,
            #[cfg(feature = "local")]
            net: None,
            serving: None,
        })
    }
}

/// The model with fresh weights, on the CPU, to load weights into.
#[cfg(feature = "local")]
pub(super) fn empty_net(
    models: &ModelRegistry,
    spec: &JobSpec,
    layout: &FeatureLayout,
) -> Result<Box<dyn AnyModel>, JobError> {
    let device = trainer::device_for(&JobSpec {
        use_gpu: false,
        ..spec.clone()
    })?;
    Ok(models.build(spec, layout, &device)?)
}

/// The weights table of an Arrow IPC file written by [`TrainedModel::save`].
fn read_weights(path: &Path) -> Result<RecordBatch, JobError> {
    let io = |e: std::io::Error| JobError::Io {
        context: format!("read {}", path.display()),
        source: e,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let reader =
        arrow::ipc::reader::FileReader::try_new(file, None).map_err(|e| io(std::io::Error::other(e)))?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io(std::io::Error::other(e)))?;
    arrow::compute::concat_batches(&schema, &batches).map_err(|e| io(std::io::Error::other(e)))
}

/// Prediction in this process (the `local` feature: burn on this machine's CPU).
#[cfg(feature = "local")]
impl TrainedModel {
    /// Predicts one batch: the batch's columns plus `prediction` (and
    /// `probabilities` for classification).
    pub fn predict_batch(&self, batch: &RecordBatch) -> Result<RecordBatch, JobError> {
        let layout = self.check_input(&batch.schema())?;
        self.predict_checked(&layout, batch)
    }

    /// Predicts a batch whose schema [`check_input`](Self::check_input) gave `layout`.
    fn predict_checked(
        &self,
        layout: &schema::FeatureLayout,
        batch: &RecordBatch,
    ) -> Result<RecordBatch, JobError> {
        let spec = JobSpec {
            use_gpu: false,
            ..self.spec.clone()
        };
        let net = self.net.as_ref().ok_or_else(|| JobError::ModelNotLinked {
            model: self.spec.model.name().to_owned(),
        })?;
        Ok(predict::predict_batch(net.as_ref(), &spec, layout, batch)?)
    }

    /// Streams predictions over a DataFrame, batch by batch (on a blocking
    /// thread). A persisted DataFrame is read in slices the Spark Connect
    /// server can hold (as `fit` relays it); an unpersisted one in one query.
    pub async fn predict(&self, df: &DataFrame) -> Result<PredictionStream, JobError> {
        let level = df.storage_level().await?;
        let rows = if level.use_memory || level.use_disk {
            let schema = df.schema().await?;
            relay::plan(df.clone(), &schema, relay::DEFAULT_SLICE_BYTES).await?
        } else {
            SparkRows::whole(df.clone())
        };
        let (schema, stream) = rows.open().await?;
        let layout = Arc::new(self.check_input(&schema)?);
        let model = self.clone();
        let out = stream.then(move |batch| {
            let (model, layout) = (model.clone(), layout.clone());
            async move {
                let batch = batch?;
                tokio::task::spawn_blocking(move || model.predict_checked(&layout, &batch))
                    .await
                    .map_err(JobError::PredictionThread)?
            }
        });
        Ok(Box::pin(out))
    }

    /// Predicts over `df` and hands the result back to Spark as a DataFrame
    /// (an Arrow local relation; no files).
    pub async fn predict_into_spark(
        &self,
        session: &SparkSession,
        df: &DataFrame,
    ) -> Result<DataFrame, JobError> {
        let mut stream = self.predict(df).await?;
        let first = match stream.next().await {
            Some(b) => b?,
            None => {
                return Err(JobError::EmptyInput {
                    what: "the DataFrame to predict",
                });
            }
        };
        let schema: SchemaRef = first.schema();
        let rest = stream.map(|r| r.map_err(|e| crate::spark::Error::InvalidArgument(e.to_string())));
        let all = futures::stream::iter([Ok(first)]).chain(rest);
        Ok(session.create_dataframe_from_stream(schema, all).await?)
    }
}
