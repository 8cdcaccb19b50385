//! The one place the rendezvous's value types meet their protobuf messages:
//! [`JobState`] ↔ `pb::JobState`, [`JobStatus`] ↔ `pb::JobStatusResponse`,
//! [`AttemptFailure`] ↔ `pb::Failure` and [`JobConfig`] ↔ `pb::CreateJobRequest`.
//! The server converts outgoing replies here, the client incoming ones.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::types::{AttemptFailure, JobConfig, JobState, JobStatus};
use crate::pb::rendezvous as pb;

/// A job state on the wire that is unspecified or unknown to this build.
///
/// ```
/// use kindling_schemas::pb::rendezvous as pb;
/// use kindling_schemas::rendezvous::{JobState, UnknownJobState};
/// assert_eq!(JobState::try_from(pb::JobState::Running), Ok(JobState::Running));
/// assert_eq!(JobState::try_from(pb::JobState::Unspecified), Err(UnknownJobState(0)));
/// assert_eq!(pb::JobState::from(JobState::Failed), pb::JobState::Failed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown job state {0}")]
pub struct UnknownJobState(pub i32);

impl From<JobState> for pb::JobState {
    fn from(state: JobState) -> Self {
        match state {
            JobState::Ganging => pb::JobState::Ganging,
            JobState::Running => pb::JobState::Running,
            JobState::Succeeded => pb::JobState::Succeeded,
            JobState::Failed => pb::JobState::Failed,
            JobState::Cancelled => pb::JobState::Cancelled,
        }
    }
}

impl TryFrom<pb::JobState> for JobState {
    type Error = UnknownJobState;

    fn try_from(state: pb::JobState) -> Result<Self, UnknownJobState> {
        Ok(match state {
            pb::JobState::Unspecified => return Err(UnknownJobState(state as i32)),
            pb::JobState::Ganging => JobState::Ganging,
            pb::JobState::Running => JobState::Running,
            pb::JobState::Succeeded => JobState::Succeeded,
            pb::JobState::Failed => JobState::Failed,
            pb::JobState::Cancelled => JobState::Cancelled,
        })
    }
}

impl TryFrom<i32> for JobState {
    type Error = UnknownJobState;

    /// The `state` field of a wire message.
    fn try_from(state: i32) -> Result<Self, UnknownJobState> {
        pb::JobState::try_from(state)
            .map_err(|_| UnknownJobState(state))
            .and_then(JobState::try_from)
    }
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time `ms` milliseconds after the Unix epoch.
pub fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl From<&AttemptFailure> for pb::Failure {
    fn from(f: &AttemptFailure) -> Self {
        pb::Failure {
            attempt: f.attempt,
            agent_id: f.agent_id.clone(),
            cause: f.cause.clone(),
            at_unix_ms: unix_ms(f.at),
        }
    }
}

impl From<pb::Failure> for AttemptFailure {
    fn from(f: pb::Failure) -> Self {
        AttemptFailure {
            attempt: f.attempt,
            agent_id: f.agent_id,
            cause: f.cause,
            at: from_unix_ms(f.at_unix_ms),
        }
    }
}

impl From<&JobStatus> for pb::JobStatusResponse {
    fn from(s: &JobStatus) -> Self {
        pb::JobStatusResponse {
            job_id: s.job_id.clone(),
            state: pb::JobState::from(s.state) as i32,
            attempt: s.attempt,
            max_attempts: s.max_attempts,
            num_slots: s.num_slots,
            members: s.members.clone(),
            failures: s.failures.iter().map(pb::Failure::from).collect(),
            spec_summary: s.spec_summary.clone(),
            created_unix_ms: unix_ms(s.created),
            updated_unix_ms: unix_ms(s.updated),
            cancel_reason: s.cancel_reason.clone().unwrap_or_default(),
            incarnation: s.incarnation,
            detached: s.detached,
        }
    }
}

impl TryFrom<pb::JobStatusResponse> for JobStatus {
    type Error = UnknownJobState;

    fn try_from(s: pb::JobStatusResponse) -> Result<Self, UnknownJobState> {
        Ok(JobStatus {
            job_id: s.job_id,
            state: JobState::try_from(s.state)?,
            attempt: s.attempt,
            max_attempts: s.max_attempts,
            num_slots: s.num_slots,
            members: s.members,
            failures: s.failures.into_iter().map(AttemptFailure::from).collect(),
            spec_summary: s.spec_summary,
            created: from_unix_ms(s.created_unix_ms),
            updated: from_unix_ms(s.updated_unix_ms),
            cancel_reason: (!s.cancel_reason.is_empty()).then_some(s.cancel_reason),
            incarnation: s.incarnation,
            detached: s.detached,
        })
    }
}

impl From<&JobConfig> for pb::CreateJobRequest {
    /// Unset timeouts (and ones too long for the wire) travel as 0, the
    /// server default.
    fn from(job: &JobConfig) -> Self {
        let ms = |d: Option<Duration>| d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
        pb::CreateJobRequest {
            job_id: job.job_id.clone(),
            num_slots: job.num_slots,
            max_attempts: job.max_attempts,
            spec_summary: job.spec_summary.clone(),
            gang_timeout_ms: ms(job.gang_timeout),
            barrier_timeout_ms: ms(job.barrier_timeout),
            client_lease_ms: ms(job.client_lease),
        }
    }
}

impl From<pb::CreateJobRequest> for JobConfig {
    /// A 0 timeout is unset (the server default).
    fn from(r: pb::CreateJobRequest) -> Self {
        let millis = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        JobConfig {
            job_id: r.job_id,
            num_slots: r.num_slots,
            max_attempts: r.max_attempts,
            spec_summary: r.spec_summary,
            gang_timeout: millis(r.gang_timeout_ms),
            barrier_timeout: millis(r.barrier_timeout_ms),
            client_lease: millis(r.client_lease_ms),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_job_state_survives_the_wire() {
        use JobState::*;
        for state in [Ganging, Running, Succeeded, Failed, Cancelled] {
            let wire = pb::JobState::from(state) as i32;
            assert_eq!(JobState::try_from(wire), Ok(state));
        }
        assert_eq!(JobState::try_from(99), Err(UnknownJobState(99)));
    }

    #[test]
    fn status_round_trips_at_millisecond_precision() {
        let at = from_unix_ms(1_700_000_000_123);
        let status = JobStatus {
            job_id: "j".to_owned(),
            state: JobState::Failed,
            attempt: 2,
            max_attempts: 2,
            num_slots: 3,
            members: vec!["a".to_owned()],
            failures: vec![AttemptFailure {
                attempt: 1,
                agent_id: "a".to_owned(),
                cause: "boom".to_owned(),
                at,
            }],
            spec_summary: "{}".to_owned(),
            created: at,
            updated: at,
            cancel_reason: None,
            incarnation: 0x1234_5678_9abc_def0,
            detached: true,
        };
        let back = JobStatus::try_from(pb::JobStatusResponse::from(&status)).unwrap();
        assert_eq!(back, status);
    }

    #[test]
    fn job_config_timeouts_default_to_zero_on_the_wire() {
        let job = JobConfig::new("j", 2)
            .with_gang_timeout(Duration::from_secs(3))
            .with_client_lease(Duration::from_millis(1500));
        let wire = pb::CreateJobRequest::from(&job);
        assert_eq!(
            (
                wire.gang_timeout_ms,
                wire.barrier_timeout_ms,
                wire.client_lease_ms
            ),
            (3000, 0, 1500)
        );
        assert_eq!(JobConfig::from(wire), job);
    }
}
