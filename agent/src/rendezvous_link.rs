//! The agent's side of the rendezvous: registration with heartbeats, joining
//! a job's gang, watching the attempt, and reporting its end.

use std::time::Duration;

use futures::StreamExt;
use kindling_schemas::action::AgentJobState;
use kindling_schemas::auth::{BearerAttach, Token};
use kindling_schemas::pb::rendezvous::rendezvous_client::RendezvousClient;
use kindling_schemas::pb::rendezvous::{
    AgentInfo, CompleteJobRequest, HeartbeatRequest, JobState, JobStatusRequest, JoinRequest,
    RegisterAgentRequest, ReportFailureRequest, WatchRequest,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::error::AgentError;
use crate::rendezvous::ClientError;

type Client = RendezvousClient<InterceptedService<Channel, BearerAttach>>;

/// The gang this agent is in for one attempt.
#[derive(Debug, Clone)]
pub struct AttemptMembership {
    /// The attempt.
    pub attempt: u32,
    /// This agent's rank.
    pub rank: u32,
    /// Collective addresses of all members, in rank order.
    pub peers: Vec<String>,
}

/// A connection to the rendezvous.
#[derive(Debug, Clone)]
pub struct RendezvousLink {
    url: String,
    client: Client,
}

/// A failed call `op` to the rendezvous at `url`.
fn rv_error<'a>(url: &'a str, op: &'static str) -> impl FnOnce(tonic::Status) -> AgentError + 'a {
    move |s| AgentError::rendezvous(url, ClientError::rpc(op)(s))
}

impl RendezvousLink {
    /// Connects lazily to `url`.
    pub fn connect(url: &str, token: Option<&Token>) -> Result<Self, AgentError> {
        let channel = Endpoint::from_shared(url.to_owned())
            .map_err(|source| {
                AgentError::rendezvous(
                    url,
                    ClientError::InvalidEndpoint {
                        url: url.to_owned(),
                        source,
                    },
                )
            })?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect_lazy();
        let attach = BearerAttach::new(token)?;
        Ok(RendezvousLink {
            url: url.to_owned(),
            client: RendezvousClient::with_interceptor(channel, attach),
        })
    }

    /// Registers the agent and keeps its lease alive until `cancel` fires.
    pub async fn register(
        &self,
        info: AgentInfo,
        cancel: CancellationToken,
    ) -> Result<JoinHandle<()>, AgentError> {
        let mut client = self.client.clone();
        let lease = client
            .register_agent(RegisterAgentRequest {
                agent: Some(info.clone()),
            })
            .await
            .map_err(rv_error(&self.url, "register_agent"))?
            .into_inner()
            .lease_ms;
        let url = self.url.clone();
        Ok(tokio::spawn(async move {
            let mut period = Duration::from_millis((lease / 3).max(10));
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                match client
                    .heartbeat(HeartbeatRequest {
                        agent_id: info.agent_id.clone(),
                    })
                    .await
                {
                    Ok(r) => period = Duration::from_millis((r.into_inner().lease_ms / 3).max(10)),
                    Err(s) if s.code() == Code::NotFound => {
                        // The lease lapsed (e.g. a long pause): register again.
                        let _ = client
                            .register_agent(RegisterAgentRequest {
                                agent: Some(info.clone()),
                            })
                            .await;
                    }
                    Err(s) => tracing::warn!(rendezvous = %url, error = %s, "heartbeat failed"),
                }
            }
        }))
    }

    /// Joins the job's current attempt and waits for the gang. `None` when the
    /// job has ended at the rendezvous.
    pub async fn join(
        &self,
        job_id: &str,
        agent_id: &str,
        cancel: &CancellationToken,
    ) -> Result<Option<AttemptMembership>, AgentError> {
        let mut client = self.client.clone();
        loop {
            let status = client
                .job_status(JobStatusRequest {
                    job_id: job_id.to_owned(),
                })
                .await
                .map_err(rv_error(&self.url, "job_status"))?
                .into_inner();
            match JobState::try_from(status.state).unwrap_or(JobState::Unspecified) {
                JobState::Succeeded | JobState::Failed | JobState::Cancelled => return Ok(None),
                _ => {}
            }
            let req = JoinRequest {
                job_id: job_id.to_owned(),
                attempt: status.attempt,
                agent_id: agent_id.to_owned(),
            };
            let joined = tokio::select! {
                r = client.join(req) => r,
                _ = cancel.cancelled() => return Err(AgentError::Cancelled("while joining".into())),
            };
            match joined {
                Ok(r) => {
                    let r = r.into_inner();
                    return Ok(Some(AttemptMembership {
                        attempt: r.attempt,
                        rank: r.rank,
                        peers: r.peers.into_iter().map(|p| p.collective_address).collect(),
                    }));
                }
                // The attempt moved on (stale) or failed while ganging: look again.
                Err(s)
                    if matches!(
                        s.code(),
                        Code::FailedPrecondition | Code::Aborted | Code::DeadlineExceeded
                    ) =>
                {
                    tracing::info!(job = job_id, error = %s, "re-joining");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                        _ = cancel.cancelled() => return Err(AgentError::Cancelled("while joining".into())),
                    }
                    continue;
                }
                Err(s) if s.code() == Code::Cancelled => return Ok(None),
                Err(s) => return Err(rv_error(&self.url, "join")(s)),
            }
        }
    }

    /// Cancels `cancel` as soon as the rendezvous reports that `attempt` is over
    /// (failed, superseded, cancelled) or the watch breaks.
    pub fn watch_attempt(&self, job_id: &str, attempt: u32, cancel: CancellationToken) -> JoinHandle<()> {
        let mut client = self.client.clone();
        let job_id = job_id.to_owned();
        tokio::spawn(async move {
            let stream = tokio::select! {
                r = client.watch(WatchRequest { job_id: job_id.clone() }) => r,
                _ = cancel.cancelled() => return,
            };
            let mut stream = match stream {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    tracing::warn!(job = %job_id, error = %e, "cannot watch the attempt");
                    cancel.cancel();
                    return;
                }
            };
            // The job succeeded when the first rank reported completion; the other
            // ranks are still finishing this attempt and must not be cancelled
            // when the rendezvous then ends the watch stream.
            let mut succeeded = false;
            loop {
                let event = tokio::select! {
                    e = stream.next() => e,
                    _ = cancel.cancelled() => return,
                };
                let Some(Ok(event)) = event else {
                    if !succeeded {
                        cancel.cancel();
                    }
                    return;
                };
                let Some(status) = event.status else { continue };
                let state = JobState::try_from(status.state).unwrap_or(JobState::Unspecified);
                succeeded = state == JobState::Succeeded && status.attempt == attempt;
                let over =
                    status.attempt > attempt || matches!(state, JobState::Failed | JobState::Cancelled);
                if over {
                    tracing::info!(job = %job_id, attempt, "attempt over at the rendezvous");
                    cancel.cancel();
                    return;
                }
            }
        })
    }

    /// Reports that `attempt` finished training.
    pub async fn complete(&self, job_id: &str, attempt: u32) -> Result<(), AgentError> {
        self.client
            .clone()
            .complete_job(CompleteJobRequest {
                job_id: job_id.to_owned(),
                attempt,
            })
            .await
            .map_err(rv_error(&self.url, "complete_job"))?;
        Ok(())
    }

    /// Reports this member's failure of `attempt`.
    pub async fn report_failure(
        &self,
        job_id: &str,
        attempt: u32,
        agent_id: &str,
        cause: &str,
    ) -> Result<(), AgentError> {
        self.client
            .clone()
            .report_failure(ReportFailureRequest {
                job_id: job_id.to_owned(),
                attempt,
                agent_id: agent_id.to_owned(),
                cause: cause.to_owned(),
            })
            .await
            .map_err(rv_error(&self.url, "report_failure"))?;
        Ok(())
    }

    /// How the job ended at the rendezvous, with the first failure's cause.
    pub async fn job_outcome(&self, job_id: &str) -> Result<(AgentJobState, String), AgentError> {
        let s = self
            .client
            .clone()
            .job_status(JobStatusRequest {
                job_id: job_id.to_owned(),
            })
            .await
            .map_err(rv_error(&self.url, "job_status"))?
            .into_inner();
        let cause = s.failures.first().map(|f| f.cause.clone()).unwrap_or_default();
        let state = match JobState::try_from(s.state).unwrap_or(JobState::Unspecified) {
            JobState::Succeeded => AgentJobState::Succeeded,
            JobState::Cancelled => AgentJobState::Cancelled,
            JobState::Failed => AgentJobState::Failed,
            _ => AgentJobState::Ganging,
        };
        Ok((state, cause))
    }
}
