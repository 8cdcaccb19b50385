//! The result of `fit`: metrics, the trained weights, save/load, and
//! prediction over DataFrames (streamed, and back into Spark).

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::{Stream, StreamExt};
use kindling_agent::model::Net;
use kindling_agent::{params, predict, trainer};
use kindling_schemas::action::EpochMetrics;
use kindling_schemas::schema::{self, StreamKind};
use kindling_schemas::spec::JobSpec;
use serde::{Deserialize, Serialize};

use super::JobError;
use super::slices::{self, SparkRows};
use crate::spark::{DataFrame, SparkSession};

/// A stream of prediction batches.
pub type PredictionStream = Pin<Box<dyn Stream<Item = Result<RecordBatch, JobError>> + Send>>;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ModelMeta {
    job_id: String,
    input_dim: usize,
    history: Vec<EpochMetrics>,
}

/// A trained model.
#[derive(Debug, Clone)]
pub struct TrainedModel {
    spec: JobSpec,
    meta: ModelMeta,
    net: Arc<Net>,
}

impl TrainedModel {
    pub(crate) fn from_weights(
        spec: JobSpec,
        job_id: String,
        input_dim: usize,
        history: Vec<EpochMetrics>,
        weights: &RecordBatch,
    ) -> Result<Self, JobError> {
        let device = trainer::device_for(&JobSpec {
            use_gpu: false,
            ..spec.clone()
        })?;
        let net = params::from_arrow(Net::new(&spec, input_dim, &device), weights)?;
        Ok(TrainedModel {
            spec,
            meta: ModelMeta {
                job_id,
                input_dim,
                history,
            },
            net: Arc::new(net),
        })
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

    /// The weights as an Arrow table (`name`, `shape`, `values`).
    pub fn weights(&self) -> Result<RecordBatch, JobError> {
        Ok(params::to_arrow(&self.net)?)
    }

    /// Saves to `dir`: `spec.json`, `model.json` (metrics, input width),
    /// `model.bpk` (burn record) and `weights.arrow` (Arrow IPC file, for other languages).
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
        std::fs::write(dir.join("model.bpk"), params::to_record_bytes(&self.net)?)
            .map_err(|e| io("write model.bpk", e))?;
        let table = self.weights()?;
        let file =
            std::fs::File::create(dir.join("weights.arrow")).map_err(|e| io("create weights.arrow", e))?;
        let mut w = arrow::ipc::writer::FileWriter::try_new(file, &table.schema())
            .map_err(|e| io("write weights.arrow", std::io::Error::other(e)))?;
        w.write(&table)
            .map_err(|e| io("write weights.arrow", std::io::Error::other(e)))?;
        w.finish()
            .map_err(|e| io("write weights.arrow", std::io::Error::other(e)))?;
        Ok(())
    }

    /// Loads a model saved with [`save`](Self::save).
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, JobError> {
        let dir = dir.as_ref();
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
        let device = trainer::device_for(&JobSpec {
            use_gpu: false,
            ..spec.clone()
        })?;
        let net = params::from_record_bytes(Net::new(&spec, meta.input_dim, &device), read("model.bpk")?)?;
        Ok(TrainedModel {
            spec,
            meta,
            net: Arc::new(net),
        })
    }

    /// Predicts one batch: the batch's columns plus `prediction` (and
    /// `probabilities` for classification).
    pub fn predict_batch(&self, batch: &RecordBatch) -> Result<RecordBatch, JobError> {
        let layout = schema::validate(&batch.schema(), &self.spec, StreamKind::Predict)?;
        if layout.input_dim != self.meta.input_dim {
            return Err(JobError::Config(format!(
                "the features give an input of width {}, the model was trained on {}",
                layout.input_dim, self.meta.input_dim
            )));
        }
        let spec = JobSpec {
            use_gpu: false,
            ..self.spec.clone()
        };
        Ok(predict::predict_batch(&self.net, &spec, &layout, batch)?)
    }

    /// Streams predictions over a DataFrame, batch by batch (on a blocking
    /// thread). A persisted DataFrame is read in slices the Spark Connect
    /// server can hold (as `fit` relays it); an unpersisted one in one query.
    pub async fn predict(&self, df: &DataFrame) -> Result<PredictionStream, JobError> {
        let level = df.storage_level().await?;
        let rows = if level.use_memory || level.use_disk {
            let schema = df.schema().await?;
            slices::plan(df.clone(), &schema, slices::DEFAULT_SLICE_BYTES).await?
        } else {
            SparkRows::whole(df.clone())
        };
        let (schema, stream) = rows.open().await?;
        schema::validate(&schema, &self.spec, StreamKind::Predict)?;
        let model = self.clone();
        let out = stream.then(move |batch| {
            let model = model.clone();
            async move {
                let batch = batch?;
                tokio::task::spawn_blocking(move || model.predict_batch(&batch))
                    .await
                    .map_err(|e| JobError::Config(format!("prediction thread failed: {e}")))?
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
            None => return Err(JobError::Config("the DataFrame to predict is empty".into())),
        };
        let schema: SchemaRef = first.schema();
        let rest = stream.map(|r| r.map_err(|e| crate::spark::Error::InvalidArgument(e.to_string())));
        let all = futures::stream::iter([Ok(first)]).chain(rest);
        Ok(session.create_dataframe_from_stream(schema, all).await?)
    }
}
