//! Serving a trained model on agents that may not have trained it: the
//! `serve_model` action's body (the spec, the inputs the model was built for
//! and its weights table), the id of a model version, and what an agent
//! reports of the models it serves (`served_models`).
//!
//! A served model answers `DoExchange` on `[model_id, predict]` like a
//! trained job's model does on `[job_id, predict]`: one agent loads a
//! version once and every stream (a Spark task of `transform`, a Flight
//! client) predicts with it.

use arrow::array::RecordBatch;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::schema::{FeatureColumn, FeatureKind, FeatureLayout};
use crate::spec::JobSpec;

/// Most models one agent serves at once; `serve_model` past it is
/// `RESOURCE_EXHAUSTED` until `drop_model` frees one.
pub const MAX_SERVED_MODELS: usize = 16;

/// Largest `serve_model` body an agent decodes (the weights, base64 inside
/// JSON, are ~4/3 of the Arrow table): 64 MiB, the agents' largest message.
pub const MAX_SERVE_BODY_BYTES: usize = 64 << 20;

/// A feature column as the model saw it (no Arrow types: a float column of
/// any numeric type is the same input). Saved with a model (`model.json`)
/// and sent with it to the agents that serve it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelInput {
    /// Float input of `width` values (a scalar column or a fixed-size vector).
    Float {
        /// Column name.
        name: String,
        /// Values per row.
        width: usize,
    },
    /// Category ids below `vocabulary`.
    Categorical {
        /// Column name.
        name: String,
        /// Number of categories.
        vocabulary: usize,
    },
    /// Token ids below `vocabulary`, at most `max_len` per row.
    Sequence {
        /// Column name.
        name: String,
        /// Number of tokens.
        vocabulary: usize,
        /// Longest sequence.
        max_len: usize,
    },
}

/// The schema metadata key of a job's weights table from `DoGet [job_id,
/// model]` (and `[job_id, checkpoint]`): its [`ModelCard`] as JSON, so a
/// client that did not start the job (a detached one, fetched later) can
/// build the model.
pub const MODEL_CARD_METADATA: &str = "kindling.model_card";

/// What a job's weights table needs to become a model elsewhere: the job,
/// its spec and the inputs the model was built for (as in [`ServeModel`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The job that trained it.
    pub job_id: String,
    /// The spec it was trained with.
    pub spec: JobSpec,
    /// Width of its float input.
    pub input_dim: usize,
    /// The feature columns it was built for.
    pub inputs: Vec<ModelInput>,
}

impl ModelCard {
    /// The card in the metadata of a weights table's `schema`, if it has one.
    pub fn from_schema(schema: &arrow::datatypes::Schema) -> Option<Result<Self, serde_json::Error>> {
        schema
            .metadata()
            .get(MODEL_CARD_METADATA)
            .map(|json| serde_json::from_str(json))
    }
}

/// The inputs of a layout.
pub fn model_inputs(layout: &FeatureLayout) -> Vec<ModelInput> {
    layout
        .features
        .iter()
        .map(|f| {
            let name = f.name.clone();
            match f.kind {
                FeatureKind::Categorical { vocabulary } => ModelInput::Categorical { name, vocabulary },
                FeatureKind::Sequence { vocabulary, max_len } => ModelInput::Sequence {
                    name,
                    vocabulary,
                    max_len,
                },
                ref float => ModelInput::Float {
                    name,
                    width: float.float_width(),
                },
            }
        })
        .collect()
}

/// The layout a model was built for, from its inputs (no label).
pub fn model_layout(spec: &JobSpec, inputs: &[ModelInput], input_dim: usize) -> FeatureLayout {
    let mut offset = 0;
    let features = inputs
        .iter()
        .map(|input| {
            let (name, kind) = match input {
                ModelInput::Float { name, width: 1 } => {
                    (name, FeatureKind::Scalar(arrow::datatypes::DataType::Float32))
                }
                ModelInput::Float { name, width } => (name, FeatureKind::Vector { len: *width }),
                ModelInput::Categorical { name, vocabulary } => (
                    name,
                    FeatureKind::Categorical {
                        vocabulary: *vocabulary,
                    },
                ),
                ModelInput::Sequence {
                    name,
                    vocabulary,
                    max_len,
                } => (
                    name,
                    FeatureKind::Sequence {
                        vocabulary: *vocabulary,
                        max_len: *max_len,
                    },
                ),
            };
            let column = FeatureColumn {
                name: name.clone(),
                offset,
                kind,
            };
            offset += column.kind.float_width();
            column
        })
        .collect();
    FeatureLayout {
        features,
        input_dim,
        label: None,
        outputs: spec.output_dim(),
    }
}

/// `serve_model`: load a model on this agent under `model_id`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServeModel {
    /// The version's id ([`model_id`]; empty: the agent computes it and
    /// answers it); `DoExchange` on `[model_id, predict]`.
    #[serde(default)]
    pub model_id: String,
    /// The spec it was trained with (model, task, features).
    pub spec: JobSpec,
    /// Width of its float input.
    pub input_dim: usize,
    /// The feature columns it was built for.
    pub inputs: Vec<ModelInput>,
    /// Its weights table (`DoGet [job_id, model]`'s schema) as an Arrow IPC
    /// stream, base64 (standard alphabet, padded).
    pub weights: String,
}

impl ServeModel {
    /// The body for `model`: its id is [`model_id`] of the same parts.
    pub fn new(
        spec: JobSpec,
        input_dim: usize,
        inputs: Vec<ModelInput>,
        weights: &RecordBatch,
    ) -> Result<Self, WeightsError> {
        let ipc = ipc_stream(weights)?;
        let mut serve = ServeModel {
            model_id: String::new(),
            spec,
            input_dim,
            inputs,
            weights: base64::engine::general_purpose::STANDARD.encode(&ipc),
        };
        serve.model_id = version_id(&serve, &ipc);
        Ok(serve)
    }

    /// The weights table, decoded; an error names what is wrong.
    pub fn weights_table(&self) -> Result<RecordBatch, WeightsError> {
        decode_weights(&self.weights)
    }

    /// The layout its model is built for.
    pub fn layout(&self) -> FeatureLayout {
        model_layout(&self.spec, &self.inputs, self.input_dim)
    }
}

/// The id of a model version: `<model name>-<16 hex digits>` of a SHA-256
/// over its spec, inputs and weights — the same model gets the same id from
/// any client (the weights count as this crate encodes the decoded table,
/// whichever Arrow library wrote them), a retrained one another.
pub fn model_id(serve: &ServeModel) -> Result<String, WeightsError> {
    model_id_of(serve, &serve.weights_table()?)
}

/// [`model_id`] of `serve` whose weights were decoded already (`weights`).
pub fn model_id_of(serve: &ServeModel, weights: &RecordBatch) -> Result<String, WeightsError> {
    Ok(version_id(serve, &ipc_stream(weights)?))
}

/// What a reader credential of the served model `model_id` names as its
/// incarnation: the version's 64 bits of SHA-256 (the id's 16 hex digits),
/// so every agent serving that version takes it, and no other version
/// (nor a job of that id) does.
pub fn model_incarnation(model_id: &str) -> u64 {
    let digits = model_id.rsplit('-').next().unwrap_or_default();
    u64::from_str_radix(digits, 16).unwrap_or(0).max(1)
}

fn version_id(serve: &ServeModel, weights_ipc: &[u8]) -> String {
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    digest.update(serve.spec.to_json().as_bytes());
    digest.update(
        serde_json::to_string(&serve.inputs)
            .unwrap_or_default()
            .as_bytes(),
    );
    digest.update(&(serve.input_dim as u64).to_le_bytes());
    digest.update(weights_ipc);
    let hash = digest.finish();
    format!(
        "{}-{}",
        serve.spec.model.name(),
        crate::credential::hex(&hash.as_ref()[..8])
    )
}

/// Why a model's weights table cannot be carried in a `serve_model` body or
/// read back from one.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// `weights` is not base64 (standard alphabet, padded).
    #[error("`weights` is not base64: {0}")]
    NotBase64(#[from] base64::DecodeError),
    /// `weights` decodes to bytes that are not one Arrow IPC stream of one
    /// schema.
    #[error("`weights` is not an Arrow IPC stream: {0}")]
    NotIpc(#[source] arrow::error::ArrowError),
    /// The table cannot be written as an Arrow IPC stream.
    #[error("the weights table cannot be written as an Arrow IPC stream: {0}")]
    Encode(#[source] arrow::error::ArrowError),
}

/// A weights table as `serve_model` and `start_job` carry it: an Arrow
/// IPC stream, base64 (standard alphabet, padded).
pub fn encode_weights(table: &RecordBatch) -> Result<String, WeightsError> {
    Ok(base64::engine::general_purpose::STANDARD.encode(ipc_stream(table)?))
}

/// The weights table of [`encode_weights`]' text; an error names what is wrong.
pub fn decode_weights(text: &str) -> Result<RecordBatch, WeightsError> {
    let ipc = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(WeightsError::NotBase64)?;
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)
        .map_err(WeightsError::NotIpc)?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(WeightsError::NotIpc)?;
    arrow::compute::concat_batches(&schema, &batches).map_err(WeightsError::NotIpc)
}

/// `table` as an Arrow IPC stream.
fn ipc_stream(table: &RecordBatch) -> Result<Vec<u8>, WeightsError> {
    let encode = |table: &RecordBatch| {
        let mut ipc = Vec::new();
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut ipc, &table.schema())?;
        w.write(table)?;
        w.finish()?;
        drop(w);
        Ok(ipc)
    };
    encode(table).map_err(WeightsError::Encode)
}

/// Answer to `serve_model`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeModelResponse {
    /// The id it is served under.
    pub model_id: String,
    /// The agent.
    pub agent_id: String,
    /// `false` when this agent already served this version (nothing loaded).
    pub loaded: bool,
}

/// `drop_model`: stop serving a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropModel {
    /// The id it is served under.
    pub model_id: String,
}

/// One model an agent serves, as `served_models` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedModel {
    /// The id.
    pub model_id: String,
    /// The model's registered name.
    pub model: String,
    /// When it was loaded (Unix ms).
    pub loaded_at_ms: u64,
    /// How many times this agent built it from its weights (1 unless it was
    /// dropped and served again).
    pub loads: u64,
    /// Prediction streams it answered (one per Spark task of `transform`).
    pub streams: u64,
    /// Rows it predicted.
    pub rows: u64,
}

/// Answer to `served_models`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedList {
    /// The agent.
    pub agent_id: String,
    /// Every model it serves.
    pub models: Vec<ServedModel>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::spec::{ModelSpec, Task};
    use arrow::array::{Float32Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn spec() -> JobSpec {
        JobSpec::builder()
            .model(ModelSpec::Linear)
            .task(Task::Classification { num_classes: 2 })
            .features(["a", "b"])
            .label("y")
            .build()
            .expect("spec")
    }

    fn weights(v: f32) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("value", DataType::Float32, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["w"])),
                Arc::new(Float32Array::from(vec![v])),
            ],
        )
        .expect("batch")
    }

    fn inputs() -> Vec<ModelInput> {
        vec![
            ModelInput::Float {
                name: "a".into(),
                width: 1,
            },
            ModelInput::Float {
                name: "b".into(),
                width: 1,
            },
        ]
    }

    #[test]
    fn a_version_round_trips_and_its_id_follows_its_weights() {
        let serve = ServeModel::new(spec(), 2, inputs(), &weights(0.5)).expect("serve");
        assert!(serve.model_id.starts_with("linear-"), "{}", serve.model_id);
        assert_eq!(serve.model_id.len(), "linear-".len() + 16);
        let json = serde_json::to_vec(&serve).expect("json");
        let back: ServeModel = serde_json::from_slice(&json).expect("parse");
        assert_eq!(back, serve);
        assert_eq!(back.weights_table().expect("weights"), weights(0.5));
        assert_eq!(model_id(&back).expect("id"), serve.model_id);
        let again = ServeModel::new(spec(), 2, inputs(), &weights(0.5)).expect("serve");
        assert_eq!(again.model_id, serve.model_id, "the same model, the same id");
        let other = ServeModel::new(spec(), 2, inputs(), &weights(0.25)).expect("serve");
        assert_ne!(other.model_id, serve.model_id, "other weights, another id");
        let layout = serve.layout();
        assert_eq!(layout.input_dim, 2);
        assert_eq!(layout.features[1].offset, 1);
        assert_eq!(model_inputs(&layout), inputs());
    }

    #[test]
    fn bad_weights_are_named() {
        let mut serve = ServeModel::new(spec(), 2, inputs(), &weights(0.5)).expect("serve");
        serve.weights = "not base64!".into();
        let err = serve.weights_table().expect_err("bad weights");
        assert!(matches!(err, WeightsError::NotBase64(_)), "{err}");
        assert!(err.to_string().contains("not base64"), "{err}");
        serve.weights = base64::engine::general_purpose::STANDARD.encode(b"abc");
        let err = serve.weights_table().expect_err("bad weights");
        assert!(matches!(err, WeightsError::NotIpc(_)), "{err}");
        assert!(err.to_string().contains("not an Arrow IPC stream"), "{err}");
    }
}
