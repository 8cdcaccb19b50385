//! Models of one's own (feature `local`): the trait a burn model
//! implements, what it reads, the types its calls take and return, and the
//! registry that names it, so that a crate with a model needs no Kindling
//! crate but this one (`docs/models.md`, §0).

/// burn at the version the agents train with.
pub use kindling_agent::burn;
pub use kindling_agent::models::kindling_model::{
    DEFAULT_MAX_PARAMS, task_loss, task_predictions, weighted_task_loss,
};
pub use kindling_agent::{
    AgentError, Batch, ConfigError, Inputs, KindlingModel, ModelError, ModelRegistry, Sequence, Targets,
};
/// What [`Inputs::layout`] returns: every feature column with its kind.
pub use kindling_schemas::schema::{FeatureColumn, FeatureKind, FeatureLayout};
