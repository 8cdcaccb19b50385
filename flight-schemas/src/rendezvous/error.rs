//! [`ClientError`], what a [`RendezvousClient`](super::RendezvousClient) call
//! fails with, and the status metadata the server attaches for it to read.

use crate::auth::InvalidToken;

/// Metadata key on error statuses naming the attempt members should join now.
pub const CURRENT_ATTEMPT_METADATA: &str = "kindling-current-attempt";

/// Metadata key on a follower replica's UNAVAILABLE answer: the URL of the
/// replica that leads (clients follow it only when it is one of theirs).
pub const LEADER_METADATA: &str = "kindling-leader";

/// What a [`RendezvousClient`](super::RendezvousClient) call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL cannot be dialled (not a URL, https without a CA, a token
    /// that would cross the network in plaintext).
    #[error("rendezvous endpoint `{url}`: {source}")]
    InvalidEndpoint {
        url: String,
        #[source]
        source: crate::channel::DialError,
    },

    /// The TCP/HTTP2 connection could not be established.
    #[error("cannot connect to the rendezvous at `{url}`")]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },

    /// The token cannot be sent as a header.
    #[error(transparent)]
    InvalidToken(#[from] InvalidToken),

    /// The server answered the call with an error status.
    #[error("rendezvous {op} failed ({:?}): {}", .source.code(), .source.message())]
    Rpc {
        op: &'static str,
        #[source]
        source: tonic::Status,
    },

    /// The rendezvous did not answer for longer than the client's outage
    /// bound (retrying all along).
    #[error("rendezvous {op}: unreachable for the whole outage bound of {bound:?}; last error: {source}")]
    Unreachable {
        op: &'static str,
        bound: std::time::Duration,
        #[source]
        source: Box<ClientError>,
    },

    /// The server's reply is missing a field or carries an unknown value.
    #[error("rendezvous {op} returned a malformed reply: {detail}")]
    Malformed { op: &'static str, detail: String },
}

impl ClientError {
    /// Wraps the status a rendezvous call `op` failed with (for `map_err`).
    pub fn rpc(op: &'static str) -> impl FnOnce(tonic::Status) -> ClientError {
        move |source| ClientError::Rpc { op, source }
    }

    /// The gRPC status code, when the server answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Rpc { source, .. } => Some(source.code()),
            _ => None,
        }
    }

    /// Whether trying again may succeed: the server was unavailable, or the
    /// attempt failed/timed out and the group should re-join the next attempt
    /// (see [`current_attempt`](Self::current_attempt)).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::Unreachable { .. } => true,
            ClientError::Rpc { source, .. } => match source.code() {
                tonic::Code::Unavailable => true,
                tonic::Code::Aborted | tonic::Code::DeadlineExceeded | tonic::Code::FailedPrecondition => {
                    self.current_attempt().is_some()
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether the rendezvous did not answer at all — no connection,
    /// UNAVAILABLE (also its answer while shutting down), or a transport
    /// failure (UNKNOWN: the server itself never answers UNKNOWN; CANCELLED
    /// with a transport error: the connection closed under the call) — so the
    /// same call may succeed once it is back. Calls retry these themselves
    /// within the outage bound (see [`super::retry`]).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Connect { .. } => true,
            ClientError::Rpc { source, .. } => match source.code() {
                tonic::Code::Unavailable | tonic::Code::Unknown => true,
                // The connection closed under the call (a SIGKILLed server):
                // CANCELLED from the transport, not the server's own answer
                // (a cancelled job), which carries no transport error.
                tonic::Code::Cancelled => std::error::Error::source(source)
                    .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some()),
                _ => false,
            },
            _ => false,
        }
    }

    /// The leader a follower replica named in its refusal (the last one,
    /// after an outage), if any.
    pub fn leader_hint(&self) -> Option<&str> {
        match self {
            ClientError::Rpc { source, .. } => source
                .metadata()
                .get(LEADER_METADATA)
                .and_then(|v| v.to_str().ok()),
            ClientError::Unreachable { source, .. } => source.leader_hint(),
            _ => None,
        }
    }

    /// The attempt the server says members should join now (from fencing,
    /// failed-attempt and timeout errors), if any.
    pub fn current_attempt(&self) -> Option<u32> {
        match self {
            ClientError::Rpc { source, .. } => source
                .metadata()
                .get(CURRENT_ATTEMPT_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            _ => None,
        }
    }
}
