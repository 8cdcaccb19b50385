//! The client half of the barrier rendezvous: its value types, their one
//! conversion to and from the protobuf messages, and the typed async client
//! — beside the protocol, as arrow-flight keeps its `FlightClient`.
//!
//! The server (state machine, tonic service, embedded mode) lives in
//! the `kindling-rendezvous` crate; this module needs neither it nor the agent.
//!
//! - [`types`]: [`JobConfig`], [`JobState`], [`JobStatus`], [`Membership`], … (plain values).
//! - [`wire`]: the one place those values meet their `pb` messages.
//! - [`client`]: [`RendezvousClient`], the typed client (one URL, or the replicas of a rendezvous on etcd).
//! - [`agent_lease`]: [`AgentLease`], an agent's registration kept alive (its heartbeats carry the agent's report).
//! - [`watch`]: following a job: [`JobWatch`], and [`ReportWatch`] with its agents' reports.
//! - [`job_lease`]: [`JobLease`], a job's client lease kept alive.
//! - [`gang`]: [`GangMember`], a member's collectives and the watch on its attempt.
//! - [`retry`]: riding out an outage: transient errors, bounded jittered backoff.
//! - [`replicas`]: following the leader among several rendezvous replicas.
//! - [`error`]: [`ClientError`] and the status metadata the server attaches.

pub mod agent_lease;
pub mod client;
pub mod error;
pub mod gang;
pub mod job_lease;
pub mod replicas;
pub mod retry;
pub mod types;
pub mod watch;
pub mod wire;

pub use agent_lease::{AgentLease, ReportFn};
pub use client::RendezvousClient;
pub use error::{CURRENT_ATTEMPT_METADATA, ClientError, LEADER_METADATA};
pub use gang::GangMember;
pub use job_lease::JobLease;
pub use retry::DEFAULT_OUTAGE_BOUND;
pub use types::{
    AgentInfo, AgentReport, AttemptFailure, AttemptRef, HeartbeatReply, JobConfig, JobState, JobStatus,
    MAX_REPORT_BYTES, MemberReport, Membership, RENDEZVOUS_REPORTER,
};
pub use watch::{JobWatch, ReportWatch};
pub use wire::UnknownJobState;
