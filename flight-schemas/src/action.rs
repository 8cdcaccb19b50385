//! Flight actions: names and JSON request/response bodies.
//!
//! | action | request | response |
//! |---|---|---|
//! | `create_job` | [`CreateJob`] | [`CreateJobResponse`] |
//! | `start_job` | [`StartJob`] | [`StartJobResponse`] |
//! | `job_status` | [`JobRef`] | [`AgentJobStatus`] |
//! | `cancel_job` | [`CancelJob`] | [`AgentJobStatus`] |
//! | `end_of_data` | [`EndOfData`] | [`EndOfDataResponse`] |
//! | `reopen_split` | [`ReopenSplit`] | [`EndOfDataResponse`] |
//! | `keep_rows` | [`JobRef`] | [`KeepRowsResponse`] |
//! | `list_jobs` | `{}` | [`JobList`] |
//! | `issue_credential` | [`IssueCredential`] | [`CredentialResponse`] |
//! | `serve_model` | [`ServeModel`] | [`ServeModelResponse`](crate::model_serving::ServeModelResponse) |
//! | `drop_model` | [`DropModel`] | [`ServedList`](crate::model_serving::ServedList) |
//! | `served_models` | `{}` | [`ServedList`](crate::model_serving::ServedList) |
//!
//! Each `DoAction` returns exactly one `Result` whose body is the response JSON.

use serde::{Deserialize, Serialize};

use crate::descriptor::Split;
use crate::model_serving::{DropModel, ServeModel};
use crate::spec::JobSpec;
pub use crate::status::*;

/// The known action names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActionKind {
    /// Create a job at the rendezvous (so a Flight-only client needs no gRPC stubs).
    CreateJob,
    /// Start (or re-start) training a job on this agent.
    StartJob,
    /// The agent's view of a job.
    JobStatus,
    /// Stop a job and drop its data.
    CancelJob,
    /// No more rows will come for a split.
    EndOfData,
    /// A split that ended takes rows again until its next `end_of_data`
    /// (a client re-feeding lost shards).
    ReopenSplit,
    /// Write a fed job's rows to the agent's disk, so the agent restarted
    /// on its node takes its place in the job again (a detached job).
    KeepRows,
    /// Every job the agent knows.
    ListJobs,
    /// A signed, expiring credential for one role in one job (operator only).
    IssueCredential,
    /// Load a trained model to predict with (operator only).
    ServeModel,
    /// Stop serving a model (operator only).
    DropModel,
    /// The models this agent serves.
    ServedModels,
}

impl ActionKind {
    /// Every action, for `ListActions`.
    pub const ALL: [ActionKind; 12] = [
        ActionKind::CreateJob,
        ActionKind::StartJob,
        ActionKind::JobStatus,
        ActionKind::CancelJob,
        ActionKind::EndOfData,
        ActionKind::ReopenSplit,
        ActionKind::KeepRows,
        ActionKind::ListJobs,
        ActionKind::IssueCredential,
        ActionKind::ServeModel,
        ActionKind::DropModel,
        ActionKind::ServedModels,
    ];

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            ActionKind::CreateJob => "create_job",
            ActionKind::StartJob => "start_job",
            ActionKind::JobStatus => "job_status",
            ActionKind::CancelJob => "cancel_job",
            ActionKind::EndOfData => "end_of_data",
            ActionKind::ReopenSplit => "reopen_split",
            ActionKind::KeepRows => "keep_rows",
            ActionKind::ListJobs => "list_jobs",
            ActionKind::IssueCredential => "issue_credential",
            ActionKind::ServeModel => "serve_model",
            ActionKind::DropModel => "drop_model",
            ActionKind::ServedModels => "served_models",
        }
    }

    /// One-line description, for `ListActions`.
    pub fn description(self) -> &'static str {
        match self {
            ActionKind::CreateJob => {
                "Create a job at the rendezvous: {job_id, num_slots, max_attempts?, gang_timeout_ms?, \
                 rendezvous?}."
            }
            ActionKind::StartJob => {
                "Start a job: {job_id, spec, rendezvous, initial_weights?}. The agent joins the job's gang."
            }
            ActionKind::JobStatus => "A job's state on this agent: {job_id}.",
            ActionKind::CancelJob => "Cancel a job and drop its data: {job_id, reason}.",
            ActionKind::EndOfData => "No more rows for a split: {job_id, split, expected_rows?}.",
            ActionKind::ReopenSplit => {
                "A split that ended takes rows again until its next end_of_data (operator only): \
                 {job_id, split}."
            }
            ActionKind::KeepRows => {
                "Write a job's rows to this agent's disk once both splits ended, so the agent restarted \
                 on its node takes its place in the job again (operator only): {job_id}."
            }
            ActionKind::ListJobs => "Every job this agent knows: {}.",
            ActionKind::IssueCredential => {
                "A job credential (operator only): {job_id, role: producer|peer|reader, ttl_secs}."
            }
            ActionKind::ServeModel => {
                "Serve a trained model (operator only): {model_id, spec, input_dim, inputs, weights}; \
                 DoExchange [model_id, predict] then predicts with it."
            }
            ActionKind::DropModel => "Stop serving a model (operator only): {model_id}.",
            ActionKind::ServedModels => "The models this agent serves: {}.",
        }
    }

    /// Looks a name up.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A parsed action.
// One is parsed per call and lives for that call: the job spec inline in
// `StartJob` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// `create_job`.
    CreateJob(CreateJob),
    /// `start_job`.
    StartJob(StartJob),
    /// `job_status`.
    JobStatus(JobRef),
    /// `cancel_job`.
    CancelJob(CancelJob),
    /// `end_of_data`.
    EndOfData(EndOfData),
    /// `reopen_split`.
    ReopenSplit(ReopenSplit),
    /// `keep_rows`.
    KeepRows(JobRef),
    /// `list_jobs`.
    ListJobs,
    /// `issue_credential`.
    IssueCredential(IssueCredential),
    /// `serve_model`.
    ServeModel(ServeModel),
    /// `drop_model`.
    DropModel(DropModel),
    /// `served_models`.
    ServedModels,
}

/// An action that does not follow the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// Unknown action name.
    #[error(
        "unknown action `{0}`; known: create_job, start_job, job_status, cancel_job, end_of_data, reopen_split, keep_rows, list_jobs, issue_credential, serve_model, drop_model, served_models"
    )]
    Unknown(String),
    /// The body is not the expected JSON.
    #[error("malformed body for action `{action}`: {reason}")]
    MalformedBody {
        /// Action name.
        action: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl Action {
    /// Parses an action from its name and body; validates the embedded spec and job id.
    pub fn parse(name: &str, body: &[u8]) -> Result<Action, ActionError> {
        let kind = ActionKind::from_name(name).ok_or_else(|| ActionError::Unknown(name.to_owned()))?;
        let bad = |reason: String| ActionError::MalformedBody {
            action: kind.name(),
            reason,
        };
        /// The body as `T`, or the action's malformed-body error.
        fn json<T: for<'de> Deserialize<'de>>(kind: ActionKind, body: &[u8]) -> Result<T, ActionError> {
            serde_json::from_slice(body).map_err(|e| ActionError::MalformedBody {
                action: kind.name(),
                reason: e.to_string(),
            })
        }
        let check = |job_id: &str| crate::descriptor::check_job_id(job_id).map_err(|e| bad(e.to_string()));
        Ok(match kind {
            ActionKind::CreateJob => {
                let a: CreateJob = json(kind, body)?;
                check(&a.job_id)?;
                if !(1..=crate::spec::MAX_SLOTS).contains(&a.num_slots) {
                    return Err(bad(format!(
                        "num_slots: must be in 1..={}",
                        crate::spec::MAX_SLOTS
                    )));
                }
                Action::CreateJob(a)
            }
            ActionKind::StartJob => {
                if body.len() > crate::model_serving::MAX_SERVE_BODY_BYTES {
                    return Err(bad(format!(
                        "{} bytes: the largest start_job body (with its initial weights) is {} bytes",
                        body.len(),
                        crate::model_serving::MAX_SERVE_BODY_BYTES
                    )));
                }
                let a: StartJob = json(kind, body)?;
                check(&a.job_id)?;
                a.spec.validate().map_err(|e| bad(e.to_string()))?;
                match (&a.spec.init_from, &a.initial_weights) {
                    (Some(_), None) => {
                        return Err(bad(
                            "the spec's `init_from` names initial weights but `initial_weights` is absent"
                                .into(),
                        ));
                    }
                    (None, Some(_)) => {
                        return Err(bad(
                            "`initial_weights` given but the spec has no `init_from` saying where they came from"
                                .into(),
                        ));
                    }
                    _ => {}
                }
                Action::StartJob(a)
            }
            ActionKind::JobStatus => {
                let a: JobRef = json(kind, body)?;
                check(&a.job_id)?;
                Action::JobStatus(a)
            }
            ActionKind::CancelJob => {
                let a: CancelJob = json(kind, body)?;
                check(&a.job_id)?;
                Action::CancelJob(a)
            }
            ActionKind::EndOfData => {
                let a: EndOfData = json(kind, body)?;
                check(&a.job_id)?;
                Action::EndOfData(a)
            }
            ActionKind::ReopenSplit => {
                let a: ReopenSplit = json(kind, body)?;
                check(&a.job_id)?;
                Action::ReopenSplit(a)
            }
            ActionKind::KeepRows => {
                let a: JobRef = json(kind, body)?;
                check(&a.job_id)?;
                Action::KeepRows(a)
            }
            ActionKind::ListJobs => Action::ListJobs,
            ActionKind::IssueCredential => {
                let a: IssueCredential = json(kind, body)?;
                check(&a.job_id)?;
                if !(1..=MAX_CREDENTIAL_TTL_SECS).contains(&a.ttl_secs) {
                    return Err(bad(format!("ttl_secs: must be in 1..={MAX_CREDENTIAL_TTL_SECS}")));
                }
                Action::IssueCredential(a)
            }
            ActionKind::ServeModel => {
                if body.len() > crate::model_serving::MAX_SERVE_BODY_BYTES {
                    return Err(bad(format!(
                        "{} bytes: the largest model body is {} bytes",
                        body.len(),
                        crate::model_serving::MAX_SERVE_BODY_BYTES
                    )));
                }
                let a: ServeModel = json(kind, body)?;
                if !a.model_id.is_empty() {
                    check(&a.model_id)?;
                }
                a.spec.validate().map_err(|e| bad(e.to_string()))?;
                Action::ServeModel(a)
            }
            ActionKind::DropModel => {
                let a: DropModel = json(kind, body)?;
                check(&a.model_id)?;
                Action::DropModel(a)
            }
            ActionKind::ServedModels => Action::ServedModels,
        })
    }

    /// The action's kind.
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::CreateJob(_) => ActionKind::CreateJob,
            Action::StartJob(_) => ActionKind::StartJob,
            Action::JobStatus(_) => ActionKind::JobStatus,
            Action::CancelJob(_) => ActionKind::CancelJob,
            Action::EndOfData(_) => ActionKind::EndOfData,
            Action::ReopenSplit(_) => ActionKind::ReopenSplit,
            Action::KeepRows(_) => ActionKind::KeepRows,
            Action::ListJobs => ActionKind::ListJobs,
            Action::IssueCredential(_) => ActionKind::IssueCredential,
            Action::ServeModel(_) => ActionKind::ServeModel,
            Action::DropModel(_) => ActionKind::DropModel,
            Action::ServedModels => ActionKind::ServedModels,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        let v = match self {
            Action::CreateJob(a) => serde_json::to_vec(a),
            Action::StartJob(a) => serde_json::to_vec(a),
            Action::JobStatus(a) => serde_json::to_vec(a),
            Action::CancelJob(a) => serde_json::to_vec(a),
            Action::EndOfData(a) => serde_json::to_vec(a),
            Action::ReopenSplit(a) => serde_json::to_vec(a),
            Action::KeepRows(a) => serde_json::to_vec(a),
            Action::ListJobs => Ok(b"{}".to_vec()),
            Action::IssueCredential(a) => serde_json::to_vec(a),
            Action::ServeModel(a) => serde_json::to_vec(a),
            Action::DropModel(a) => serde_json::to_vec(a),
            Action::ServedModels => Ok(b"{}".to_vec()),
        };
        v.unwrap_or_default()
    }

    /// As an `arrow_flight::Action`.
    pub fn to_flight(&self) -> arrow_flight::Action {
        arrow_flight::Action::new(self.kind().name(), self.body())
    }
}

/// Longest a credential may live: 7 days.
pub const MAX_CREDENTIAL_TTL_SECS: u64 = 7 * 24 * 3600;

/// `issue_credential`: a credential for `role` in `job_id`, valid `ttl_secs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssueCredential {
    /// The job.
    pub job_id: String,
    /// What it allows.
    pub role: crate::credential::Role,
    /// Seconds it lives (1 to [`MAX_CREDENTIAL_TTL_SECS`]).
    pub ttl_secs: u64,
}

/// Reply to `issue_credential`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialResponse {
    /// The job.
    pub job_id: String,
    /// What it allows.
    pub role: crate::credential::Role,
    /// The credential: send it as `authorization: Bearer <credential>`.
    pub credential: String,
    /// Unix seconds after which it is refused.
    pub expires: u64,
}

/// `create_job`: the agent creates the job at a rendezvous for the caller
/// (what `CreateJob` of the rendezvous' gRPC service does), so a client with
/// only a Flight library can run a job. Idempotent for the same parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateJob {
    /// The job.
    pub job_id: String,
    /// Agents (ranks) that train it together.
    pub num_slots: u32,
    /// Attempts before the job fails (0: the rendezvous' default).
    #[serde(default)]
    pub max_attempts: u32,
    /// How long a gang may take to assemble, in ms (none: the default).
    #[serde(default)]
    pub gang_timeout_ms: Option<u64>,
    /// The rendezvous (none: the one this agent is registered with).
    #[serde(default)]
    pub rendezvous: Option<String>,
}

/// The reply to `create_job`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateJobResponse {
    /// The job.
    pub job_id: String,
    /// Its current attempt (1 for a new job).
    pub attempt: u32,
    /// The rendezvous it was created at: pass it to `start_job`.
    pub rendezvous: String,
}

/// `start_job`: train `spec` as a member of `job_id`'s gang at `rendezvous`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StartJob {
    /// The job.
    pub job_id: String,
    /// What to train.
    pub spec: JobSpec,
    /// Rendezvous URL, e.g. `http://127.0.0.1:7070`.
    pub rendezvous: String,
    /// The weights to start from when the spec has `init_from`: a weights
    /// table (`DoGet [job_id, model]`'s schema) as an Arrow IPC stream,
    /// base64 (standard alphabet, padded), as `serve_model`'s `weights`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_weights: Option<String>,
}

impl StartJob {
    /// The initial weights table, decoded (`None` without `init_from`).
    pub fn initial_table(
        &self,
    ) -> Result<Option<arrow::array::RecordBatch>, crate::model_serving::WeightsError> {
        self.initial_weights
            .as_deref()
            .map(crate::model_serving::decode_weights)
            .transpose()
    }
}

/// Names a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRef {
    /// The job.
    pub job_id: String,
}

/// `cancel_job`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelJob {
    /// The job.
    pub job_id: String,
    /// Why; shown in status.
    #[serde(default)]
    pub reason: String,
}

/// `end_of_data`: the producer(s) of a split are done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndOfData {
    /// The job.
    pub job_id: String,
    /// Which split.
    pub split: Split,
    /// If set, the agent checks its committed rows equal this and fails otherwise.
    #[serde(default)]
    pub expected_rows: Option<u64>,
}

/// `reopen_split`: rows may come into a split that ended again, until its
/// next `end_of_data` — the client's re-feed of a lost agent's shards to
/// the agents that take them over. Only the operator reopens; a producer's
/// rows into an ended split are refused. With `drop_producers`, the rows
/// those producers committed here go (a growing gang's hand-over, once the
/// agent that takes them committed them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReopenSplit {
    /// The job.
    pub job_id: String,
    /// Which split.
    pub split: Split,
    /// Producers whose rows leave this agent's split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_producers: Vec<String>,
}

/// Answer to `keep_rows`: what the agent wrote to its disk (both splits),
/// each split's rows by producer, and the job's start as the agent took it
/// — what a follower of the detached job needs to hand shards to an agent
/// that joins it (the producers are the shards; the start starts the
/// newcomer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeepRowsResponse {
    /// The job.
    pub job_id: String,
    /// Rows kept, both splits.
    pub rows: u64,
    /// Bytes the kept files take.
    pub bytes: u64,
    /// The train split's rows by producer.
    #[serde(default)]
    pub train: KeptSplitRows,
    /// The eval split's rows by producer.
    #[serde(default)]
    pub eval: KeptSplitRows,
    /// The job's start (spec, rendezvous, initial weights).
    pub start: StartJob,
}

/// One split's kept rows: committed rows by producer, and whether the split
/// ended (a job fed no eval split never ends it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptSplitRows {
    /// Rows each producer committed.
    pub producers: std::collections::BTreeMap<String, u64>,
    /// Whether the split ended.
    pub ended: bool,
}

/// Answer to `start_job`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartJobResponse {
    /// The job.
    pub job_id: String,
    /// The agent that accepted it.
    pub agent_id: String,
}

/// Answer to `end_of_data`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndOfDataResponse {
    /// The job.
    pub job_id: String,
    /// Which split.
    pub split: Split,
    /// Rows committed for the split on this agent.
    pub rows: u64,
}

#[cfg(test)]
mod tests;
