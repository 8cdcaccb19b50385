//! [`RendezvousError`]: what the state machine (and so the server) refuses a
//! request with; `server.rs` maps it to a `tonic::Status` in one place.
//! (What the client returns, `ClientError`, is the protocol's: it lives in
//! `kindling_schemas::rendezvous`.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Why the rendezvous refused or aborted a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RendezvousError {
    /// The request is malformed: empty id, zero slots, rank out of range, …
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An all-gather payload is larger than the configured maximum.
    #[error("payload of {size} bytes exceeds the maximum of {max} bytes")]
    PayloadTooLarge { size: usize, max: usize },

    /// No job with this id (never created, or garbage-collected).
    #[error("job `{job_id}` not found")]
    JobNotFound { job_id: String },

    /// The agent is not registered, or its lease lapsed.
    #[error("agent `{agent_id}` is not registered (or its lease lapsed); register again")]
    AgentNotRegistered { agent_id: String },

    /// `CreateJob` named an existing job with different parameters, or a finished one.
    #[error("job `{job_id}` already exists: {detail}")]
    JobExists { job_id: String, detail: String },

    /// The call names an attempt that is not the job's current one (fencing).
    #[error("job `{job_id}`: attempt {given} is not the current attempt (current attempt is {current})")]
    StaleAttempt {
        job_id: String,
        current: u32,
        given: u32,
    },

    /// The call is valid but the job or attempt is in the wrong state for it.
    #[error("job `{job_id}`: {detail}")]
    WrongState { job_id: String, detail: String },

    /// The job was cancelled (woken calls, and calls arriving afterwards).
    #[error("job `{job_id}` was cancelled: {reason}")]
    JobCancelled { job_id: String, reason: String },

    /// Not every member joined the attempt within the gang timeout.
    #[error(
        "gang timeout: job `{job_id}` attempt {attempt}: {joined} of {expected} members joined within {timeout:?}; {}",
        next_step(.next_attempt)
    )]
    GangTimeout {
        job_id: String,
        attempt: u32,
        joined: usize,
        expected: usize,
        timeout: Duration,
        next_attempt: Option<u32>,
    },

    /// Not every member reached an all-gather/barrier within the barrier timeout.
    #[error(
        "barrier timeout: job `{job_id}` attempt {attempt} collective {seq}: {arrived} of {expected} members arrived within {timeout:?}; {}",
        next_step(.next_attempt)
    )]
    BarrierTimeout {
        job_id: String,
        attempt: u32,
        seq: u64,
        arrived: usize,
        expected: usize,
        timeout: Duration,
        next_attempt: Option<u32>,
    },

    /// The attempt failed (a member's lease lapsed, a member reported failure,
    /// a timeout) while this call was blocked in it.
    #[error("job `{job_id}` attempt {attempt} failed: {cause}; {}", next_step(.next_attempt))]
    AttemptFailed {
        job_id: String,
        attempt: u32,
        cause: String,
        next_attempt: Option<u32>,
    },

    /// The same member called again for the same step; the older call gives way.
    #[error("superseded by a newer call from the same member")]
    Superseded,

    /// The server is shutting down.
    #[error("the rendezvous server is shutting down")]
    ShuttingDown,

    /// The state could not be written (the change was not acknowledged)
    /// or read at start-up: `place` is the state file's path, or etcd's key
    /// and endpoints.
    #[error("rendezvous state {place}: {source}")]
    Storage {
        place: String,
        #[source]
        source: StorageError,
    },

    /// Binding or serving the gRPC endpoint failed.
    #[error("rendezvous transport error: {context}")]
    Transport {
        context: String,
        #[source]
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
}

fn next_step(next_attempt: &Option<u32>) -> String {
    match *next_attempt {
        Some(n) => format!("members re-join attempt {n}"),
        None => "no attempts left, the job failed".to_owned(),
    }
}

impl RendezvousError {
    /// Whether trying again (usually at the next attempt) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            RendezvousError::GangTimeout { next_attempt, .. }
            | RendezvousError::BarrierTimeout { next_attempt, .. }
            | RendezvousError::AttemptFailed { next_attempt, .. } => next_attempt.is_some(),
            RendezvousError::StaleAttempt { .. }
            | RendezvousError::ShuttingDown
            | RendezvousError::Storage { .. }
            | RendezvousError::Transport { .. } => true,
            _ => false,
        }
    }

    /// The attempt members should now join, when the error implies one.
    pub fn current_attempt(&self) -> Option<u32> {
        match self {
            RendezvousError::GangTimeout { next_attempt, .. }
            | RendezvousError::BarrierTimeout { next_attempt, .. }
            | RendezvousError::AttemptFailed { next_attempt, .. } => *next_attempt,
            RendezvousError::StaleAttempt { current, .. } => Some(*current),
            _ => None,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        RendezvousError::InvalidArgument(msg.into())
    }

    pub(crate) fn transport(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        RendezvousError::Transport {
            context: context.into(),
            source: std::sync::Arc::new(source),
        }
    }
}

/// What went wrong with the state directory (`RendezvousError::Storage`).
/// Cloneable, as the rendezvous's errors are: the I/O errors are shared.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    #[error("cannot create the directory: {0}")]
    CreateDir(#[source] Arc<std::io::Error>),
    #[error("cannot open the lock file {}: {source}", .path.display())]
    OpenLock {
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error(
        "the state directory is in use by another rendezvous ({holder}): one process per state directory"
    )]
    InUse { holder: String },
    #[error("cannot lock {}: {source}", .path.display())]
    Lock {
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("cannot write the lock file {}: {source}", .path.display())]
    WriteLock {
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("cannot remove the stale temporary file: {0}")]
    RemoveTemporary(#[source] Arc<std::io::Error>),
    #[error("cannot read it: {0}")]
    Read(#[source] Arc<std::io::Error>),
    #[error("not a rendezvous state snapshot ({bytes} bytes): {source}")]
    NotASnapshot {
        bytes: usize,
        source: prost::DecodeError,
    },
    #[error("written in format {found}, this rendezvous reads format {reads}")]
    Format { found: u32, reads: u32 },
    #[error("cannot write {bytes} bytes: {source}")]
    Write {
        bytes: usize,
        source: Arc<std::io::Error>,
    },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("the change that decided this call is not written yet; retry")]
    Unsaved,
    #[error("etcd did not answer: {0}")]
    Etcd(Arc<etcd_client::Error>),
    #[error("etcd did not answer within {0:?}")]
    EtcdTimeout(std::time::Duration),
    #[error(
        "this replica is no longer the leader (its etcd lease lapsed or another replica was elected): nothing was written"
    )]
    Deposed,
}

/// A job record in the state file that no rendezvous writes: refused at
/// start-up rather than restored as a job that never runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("a job record without its config")]
    NoConfig,
    #[error("a job record without its status")]
    NoStatus,
    #[error("a job record with an unknown state {0}")]
    UnknownState(i32),
    #[error("a job record without a job id")]
    NoJobId,
    #[error("job `{0}`: num_slots 0")]
    NoSlots(String),
    #[error("job `{job_id}`: attempt {attempt} outside 1..={max_attempts} (max_attempts)")]
    Attempt {
        job_id: String,
        attempt: u32,
        max_attempts: u32,
    },
}

/// `--store etcd://…` settings a replica cannot run on
/// ([`EtcdSettings`](crate::etcd::EtcdSettings)): refused at start-up,
/// naming the flag's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdSettingsError {
    #[error("`{store}`: an etcd store is etcd://host:port[,host:port…][/prefix]")]
    NotEtcd { store: String },
    #[error("`{store}` names no etcd endpoint (etcd://host:port[,host:port…])")]
    NoEndpoint { store: String },
    #[error("`{store}`: the key prefix after the hosts is empty")]
    EmptyPrefix { store: String },
    #[error("the etcd lease must be a whole number of seconds, at least 1 (got {0:?})")]
    Lease(Duration),
    #[error("an etcd store needs this replica's URL for clients (--advertise)")]
    NoAdvertise,
    /// Plaintext to members off loopback (`hosts`, comma-separated), not allowed.
    #[error(
        "plaintext to etcd at {hosts} (off loopback): whoever reaches it could rewrite the rendezvous' state; \
         give --etcd-ca (and --etcd-cert/--etcd-key), or --allow-plaintext-etcd on a network private by other means"
    )]
    Plaintext { hosts: String },
}
