//! The rendezvous's value types, shared by its server and its clients: what a
//! job is created with, its lifecycle and status, and a member's place in a gang.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use crate::pb::rendezvous::{AgentInfo, AttemptRef};

/// The failure source recorded for timeouts detected by the rendezvous itself
/// (the `agent_id` of such an [`AttemptFailure`]).
pub const RENDEZVOUS_REPORTER: &str = "rendezvous";

/// What `create_job` registers.
///
/// ```
/// use kindling_schemas::rendezvous::JobConfig;
/// let job = JobConfig::new("job-1", 4).with_max_attempts(2).with_spec_summary("{}");
/// assert_eq!(job.num_slots, 4);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobConfig {
    pub job_id: String,
    pub num_slots: u32,
    /// 0 = the server default.
    pub max_attempts: u32,
    /// Opaque (JSON) summary of the job spec, echoed in status.
    pub spec_summary: String,
    /// `None` = the server default.
    pub gang_timeout: Option<Duration>,
    /// `None` = the server default.
    pub barrier_timeout: Option<Duration>,
    /// The client's lease: unless renewed within this long
    /// ([`RendezvousClient::keep_job_leased`](super::RendezvousClient::keep_job_leased)),
    /// the job is cancelled. `None`: the job lives until it ends or is cancelled.
    pub client_lease: Option<Duration>,
}

impl JobConfig {
    /// A job of `num_slots` members with server defaults for everything else.
    pub fn new(job_id: impl Into<String>, num_slots: u32) -> Self {
        JobConfig {
            job_id: job_id.into(),
            num_slots,
            max_attempts: 0,
            spec_summary: String::new(),
            gang_timeout: None,
            barrier_timeout: None,
            client_lease: None,
        }
    }
    /// Sets the number of attempts (0 = server default).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }
    /// Sets the spec summary.
    pub fn with_spec_summary(mut self, summary: impl Into<String>) -> Self {
        self.spec_summary = summary.into();
        self
    }
    /// Sets the gang timeout.
    pub fn with_gang_timeout(mut self, timeout: Duration) -> Self {
        self.gang_timeout = Some(timeout);
        self
    }
    /// Sets the barrier timeout.
    pub fn with_barrier_timeout(mut self, timeout: Duration) -> Self {
        self.barrier_timeout = Some(timeout);
        self
    }
    /// Sets the client lease.
    pub fn with_client_lease(mut self, lease: Duration) -> Self {
        self.client_lease = Some(lease);
        self
    }
}

/// Lifecycle of a job at the rendezvous: its gang across every member and
/// attempt. The one job-state type the code uses; the wire's
/// `pb::rendezvous::JobState` is converted at the edges (see
/// [`wire`](super::wire)). Not to be confused with
/// [`AgentJobState`](crate::action::AgentJobState), one agent's progress
/// through its share of a job (ingesting, training, recovering, …).
///
/// ```
/// use kindling_schemas::rendezvous::JobState;
/// assert!(JobState::Cancelled.is_terminal());
/// assert!(!JobState::Ganging.is_terminal());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for the members of the current attempt to join.
    Ganging,
    /// All members joined; the attempt is running.
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    /// The state's name in lower case (`ganging`, `running`, ...), as
    /// metrics labels and the status page spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Ganging => "ganging",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Succeeded, failed or cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }
}

/// One failed attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptFailure {
    pub attempt: u32,
    /// The agent whose lease lapsed or who reported, or
    /// [`RENDEZVOUS_REPORTER`] for timeouts.
    pub agent_id: String,
    pub cause: String,
    pub at: SystemTime,
}

/// A job's state as seen by `status`, `list_jobs` and `watch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStatus {
    pub job_id: String,
    pub state: JobState,
    pub attempt: u32,
    pub max_attempts: u32,
    pub num_slots: u32,
    /// Current attempt's members in rank order (join order while ganging).
    pub members: Vec<String>,
    /// Every failed attempt, oldest first: `failures[0]` is the first cause.
    pub failures: Vec<AttemptFailure>,
    pub spec_summary: String,
    pub created: SystemTime,
    pub updated: SystemTime,
    pub cancel_reason: Option<String>,
    /// Which job of this id this is: random, drawn when the rendezvous
    /// created it (job credentials name it). 0 from a rendezvous that
    /// predates it: see [`JobStatus::incarnation`].
    pub incarnation: u64,
    /// The job's client let it go ([`RendezvousClient::detach_job`](super::RendezvousClient::detach_job)):
    /// it has no client lease and runs to its end without its client.
    pub detached: bool,
}

impl JobStatus {
    /// The incarnation job credentials for this job name: the one the
    /// rendezvous drew, or (from a rendezvous that predates it) the creation
    /// time in Unix milliseconds.
    pub fn incarnation(&self) -> u64 {
        if self.incarnation != 0 {
            return self.incarnation;
        }
        self.created
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// The first failure's cause, which a failed job reports.
    pub fn first_cause(&self) -> Option<&str> {
        self.failures.first().map(|f| f.cause.as_str())
    }
}

/// What a successful join returns: this member's place in the gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    pub job_id: String,
    pub attempt: u32,
    /// Index in `peers`; ranks are assigned by ascending agent id.
    pub rank: u32,
    pub world_size: u32,
    /// Every member in rank order.
    pub peers: Arc<[AgentInfo]>,
}

/// Heartbeat answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatReply {
    pub lease: Duration,
    /// Attempts this agent joined that failed (latest per job).
    pub failed_attempts: Vec<AttemptRef>,
}

/// What an agent tells the rendezvous with each heartbeat, for the status
/// page: its cache and its jobs as it sees them. JSON in the heartbeat's
/// `report` field, at most [`MAX_REPORT_BYTES`]; the rendezvous keeps the
/// latest per agent, in memory only.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentReport {
    /// The agent's cache budget.
    pub cache_budget_bytes: u64,
    /// Cached Arrow bytes in memory, every job.
    pub cache_bytes_memory: u64,
    /// Cached Arrow bytes spilled to disk, every job.
    pub cache_bytes_disk: u64,
    /// Every job the agent holds.
    pub jobs: Vec<crate::action::AgentJobStatus>,
}

/// One agent's latest report of one job, as
/// [`RendezvousClient::watch_reports`](super::RendezvousClient::watch_reports)
/// carries it: the job's entry of the agent's [`AgentReport`].
#[derive(Clone, Debug, PartialEq)]
pub struct MemberReport {
    pub agent_id: String,
    pub status: crate::action::AgentJobStatus,
    /// How long before the event the agent sent it.
    pub age: Duration,
}

/// Largest heartbeat report the rendezvous keeps; a larger one is dropped
/// (the heartbeat itself still renews the lease).
pub const MAX_REPORT_BYTES: usize = 1 << 20;
