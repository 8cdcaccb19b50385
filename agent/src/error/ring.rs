//! What a ring operation fails with: [`RingError`], cloneable, so a broken
//! ring answers every later operation with its first failure whole (its
//! kind, peer and cause); the agent's error carries it as it is
//! (`AgentError::Ring`), where the one `Status` map and retry rule read it.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::AgentError;

    #[test]
    fn each_ring_error_keeps_its_message_code_and_retry_rule_in_the_agent_error() {
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
            let code = match ring {
                RingError::RankOutsideWorld { .. } | RingError::BroadcastWithoutPayload => {
                    tonic::Code::InvalidArgument
                }
                RingError::AttemptFailed { .. } => tonic::Code::Aborted,
                RingError::PeerUnavailable { .. } => tonic::Code::Unavailable,
            };
            assert_eq!(tonic::Status::from(agent).code(), code, "{ring}");
        }
        let cancelled = RingError::AttemptFailed {
            job_id: "j".into(),
            attempt: 1,
            cause: "cancelled".into(),
        };
        assert!(AgentError::from(cancelled).is_cancellation());
    }
}
