//! What building, feeding or loading a model fails with: [`ModelError`],
//! carried whole in the agent's error (`AgentError::Model`). A model's own
//! code (`KindlingModel`) returns the agent's error, into which this converts.

/// Why a model could not be built, read its inputs, or take its weights.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The job names a model this agent has not registered.
    #[error("invalid input: model `{name}` is not registered on this agent; it has: {available}")]
    Unregistered {
        /// The model the job names.
        name: String,
        /// The registered names, comma-separated.
        available: String,
    },
    /// The model's config failed to parse or the model's own validation.
    #[error("invalid input: model `{model}`: config `{field}`: {reason}")]
    Config {
        /// The model.
        model: String,
        /// The config field (`<json>` when the JSON itself does not parse).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The model reads a column as a kind of input the job does not give it.
    #[error(
        "invalid input: the model reads column `{column}` as {wanted}, but the job's input has it as {found}"
    )]
    InputKind {
        /// Column.
        column: String,
        /// What the model asked for (`float`, `categorical ids`, `an id sequence`).
        wanted: &'static str,
        /// What the job's input has (or `no such feature column`).
        found: String,
    },
    /// A model table (weights as Arrow) that does not fit the model.
    #[error("invalid input: model table: {0}")]
    Table(String),
    /// A batch lacks a column the job needs.
    #[error("invalid input: column `{0}` is missing from the batch")]
    MissingColumn(String),
    /// A model over the agent's parameter cap (nothing was allocated).
    #[error(
        "model `{model}` has {params} parameters, over this agent's cap of {cap} \
         (--max-model-params, KINDLING_MAX_MODEL_PARAMS): make the model smaller or raise the cap"
    )]
    TooLarge {
        /// The model's registered name.
        model: String,
        /// Its parameters.
        params: usize,
        /// The cap.
        cap: usize,
    },
    /// Tensor data of an unexpected type.
    #[error("tensor data: {0}")]
    TensorData(#[source] burn::tensor::DataError),
    /// A burn model record could not be encoded, decoded or loaded.
    #[error("model record: {0}")]
    Record(#[source] burn::store::RecordError),
}

impl ModelError {
    /// Its gRPC code: the job's model or input, a model over the cap, or
    /// the agent's own failure with tensors and records.
    pub fn code(&self) -> tonic::Code {
        match self {
            ModelError::TooLarge { .. } => tonic::Code::ResourceExhausted,
            ModelError::TensorData(_) | ModelError::Record(_) => tonic::Code::Internal,
            _ => tonic::Code::InvalidArgument,
        }
    }

    /// The job's input or config is at fault (the job cannot succeed as asked).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            ModelError::Config { .. } | ModelError::Unregistered { .. } | ModelError::InputKind { .. }
        )
    }
}
