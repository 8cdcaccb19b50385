//! What a call that does not follow the Flight contract is refused with:
//! [`RequestError`] (its path, descriptor, action or body), carried whole in
//! the agent's error (`AgentError::Request`).

use kindling_schemas::action::ActionError;
use kindling_schemas::auth::InvalidToken;
use kindling_schemas::descriptor::PathError;
use kindling_schemas::model_serving::WeightsError;
use tonic::Code;

/// Why a call was refused before any job looked at it.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// A `DoPut` or `DoExchange` whose stream ended before its first message.
    #[error("empty {call}: the first message must carry the descriptor")]
    EmptyStream {
        /// The Flight call.
        call: &'static str,
    },
    /// The first message of a `DoPut` or `DoExchange` has no descriptor.
    #[error("the first {call} message has no flight descriptor")]
    NoDescriptor {
        /// The Flight call.
        call: &'static str,
    },
    /// A Flight path that does not follow the contract.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A valid path the call does not take.
    #[error("{call} takes {expected}, not {got:?}")]
    WrongPath {
        /// The Flight call.
        call: &'static str,
        /// The paths it takes.
        expected: &'static str,
        /// The path's segments.
        got: Vec<String>,
    },
    /// A model was asked for at a path that names no model.
    #[error("{0:?} is not a model: use [job_id, model] or [job_id, checkpoint]")]
    NotAModel(Vec<String>),
    /// A `serve_model` body whose model cannot be built (id, weights, inputs).
    #[error("invalid input: serve_model: {0}")]
    BadServedModel(#[from] WeightsError),
    /// A `serve_model` body whose `model_id` is not its content's.
    #[error(
        "invalid input: serve_model: model_id `{given}` is not its content's id `{content}` \
         (kindling_schemas::model_serving::model_id; or send an empty model_id)"
    )]
    ServedModelId {
        /// The id the body names.
        given: String,
        /// The id of its spec, inputs and weights.
        content: String,
    },
    /// `GetSchema` for a path that has no fixed schema.
    #[error("no schema for {0:?}")]
    NoSchema(Vec<String>),
    /// An action with an unknown name or a malformed body.
    #[error("invalid input: {0}")]
    Action(#[from] ActionError),
    /// The bearer token cannot be sent as a header.
    #[error("invalid input: {0}")]
    Token(#[from] InvalidToken),
    /// A Flight call the agent does not offer; says what to use instead.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The caller's own stream failed (a message over this agent's cap, a
    /// broken connection): its gRPC code and message, answered as they are.
    #[error("{message}")]
    CallerStream {
        /// The stream's status code.
        code: Code,
        /// Its message.
        message: String,
    },
}

impl RequestError {
    /// Its gRPC code: the caller's input, an unoffered call, or the code the
    /// caller's own stream failed with.
    pub fn code(&self) -> Code {
        match self {
            RequestError::Unsupported(_) => Code::Unimplemented,
            RequestError::CallerStream { code, .. } => *code,
            _ => Code::InvalidArgument,
        }
    }
}
