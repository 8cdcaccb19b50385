//! What a ring operation fails with: [`RingError`], cloneable, so a broken
//! ring answers every later operation with its first failure whole (its
//! kind, peer and cause), and converted at the job's edge into the agent's
//! error with the same kind and message.

use crate::error::AgentError;

/// Why a ring operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// A ring rank outside the world.
    #[error("invalid input: rank {rank} outside a world of {world}")]
    RankOutsideWorld {
        /// The rank.
        rank: u32,
        /// The world size.
        world: u32,
    },
    /// The root of a broadcast has nothing to send.
    #[error("invalid input: broadcast root has no payload")]
    BroadcastWithoutPayload,
    /// The attempt the ring serves ended (cancelled, superseded, shutting down).
    #[error("attempt {attempt} of job `{job_id}` failed: {cause}")]
    AttemptFailed {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// Why.
        cause: String,
    },
    /// A peer could not be reached, broke the ring, or timed out.
    #[error("peer {peer} unavailable: {reason}")]
    PeerUnavailable {
        /// Address.
        peer: String,
        /// What happened.
        reason: String,
    },
}

/// The agent's error of the same kind and message (its one `Status` map
/// and retry rule apply).
impl From<RingError> for AgentError {
    fn from(e: RingError) -> Self {
        match e {
            RingError::RankOutsideWorld { rank, world } => AgentError::RankOutsideWorld { rank, world },
            RingError::BroadcastWithoutPayload => AgentError::BroadcastWithoutPayload,
            RingError::AttemptFailed {
                job_id,
                attempt,
                cause,
            } => AgentError::AttemptFailed {
                job_id,
                attempt,
                cause,
            },
            RingError::PeerUnavailable { peer, reason } => AgentError::PeerUnavailable { peer, reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ring_error_becomes_the_agent_error_of_its_kind_with_its_message() {
        let cases = [
            RingError::RankOutsideWorld { rank: 3, world: 2 },
            RingError::BroadcastWithoutPayload,
            RingError::AttemptFailed {
                job_id: "j".into(),
                attempt: 2,
                cause: "cancelled".into(),
            },
            RingError::PeerUnavailable {
                peer: "http://10.0.0.2:50051".into(),
                reason: "connection reset".into(),
            },
        ];
        for ring in cases {
            let agent = AgentError::from(ring.clone());
            assert_eq!(agent.to_string(), ring.to_string());
            let retryable = matches!(
                ring,
                RingError::AttemptFailed { .. } | RingError::PeerUnavailable { .. }
            );
            assert_eq!(agent.is_retryable(), retryable, "{ring}");
        }
        let cancelled = RingError::AttemptFailed {
            job_id: "j".into(),
            attempt: 1,
            cause: "cancelled".into(),
        };
        assert!(AgentError::from(cancelled).is_cancellation());
    }
}
