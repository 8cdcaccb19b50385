//! Typed async client of the rendezvous, used by agents and the TrainingJob:
//! registration with a background heartbeat ([`AgentLease`]), jobs, joins
//! (into a [`GangMember`]), failure reports, watch streams and status.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::agent_lease::{AgentLease, ReportFn};
use super::error::ClientError;
use super::gang::{GangMember, gather_request};
use super::job_lease::JobLease;
use super::replicas::{Replicas, split};
use super::retry::{Backoff, DEFAULT_OUTAGE_BOUND};
use super::types::{AgentInfo, HeartbeatReply, JobConfig, JobStatus, Membership};
use crate::auth::{BearerAttach, Token};
use crate::channel::{ChannelConfig, Dial};
use crate::pb::rendezvous as pb;
use crate::pb::rendezvous::rendezvous_client::RendezvousClient as GrpcClient;

type Result<T, E = ClientError> = std::result::Result<T, E>;
pub(crate) type Inner = GrpcClient<InterceptedService<Channel, BearerAttach>>;

/// How long [`RendezvousClient::join_current`] waits before looking for the
/// current attempt again after the one it tried moved on.
const REJOIN_DELAY: Duration = Duration::from_millis(50);

/// Client of the rendezvous service. Cheap to clone (shares the connection).
///
/// Each blocked join/all-gather holds one HTTP/2 stream; for thousands of
/// members in one process spread them over several channels
/// ([`with_channel`](Self::with_channel)).
///
/// ```no_run
/// # async fn demo() -> Result<(), kindling_schemas::rendezvous::ClientError> {
/// use kindling_schemas::auth::Token;
/// use kindling_schemas::rendezvous::{AgentInfo, JobConfig, RendezvousClient};
/// let token = Token::new("secret");
/// let client = RendezvousClient::connect("http://rendezvous:7070", Some(&token)).await?;
/// let lease = client.register(AgentInfo { agent_id: "a0".into(), ..Default::default() }).await?;
/// let attempt = client.create_job(&JobConfig::new("job-1", 1)).await?;
/// let gang = client.join("job-1", attempt, lease.agent_id()).await?;
/// gang.barrier().await?;
/// gang.complete().await?;
/// # Ok(()) }
/// ```
///
/// Every call rides out a rendezvous restart: transient failures are retried
/// with bounded, jittered backoff for up to the outage bound (see
/// [`super::retry`]); only the heartbeat, which its lease task repeats
/// anyway, and `deregister` are tried once.
///
/// A comma-separated list of URLs names the replicas of a rendezvous on
/// etcd: calls go to the one leading, and follow the leadership when it
/// moves (see [`super::replicas`]).
#[derive(Clone, Debug)]
pub struct RendezvousClient {
    replicas: Arc<Replicas<Inner>>,
    outage: Duration,
    call_timeout: Duration,
}

impl RendezvousClient {
    /// Connects to `url` (e.g. `http://rendezvous:7070`) with a bearer token
    /// and the default [`ChannelConfig`].
    pub async fn connect(url: impl Into<String>, token: Option<&Token>) -> Result<Self> {
        Self::connect_with(url, token, &ChannelConfig::default()).await
    }

    /// Connects to `url` with the channel settings `channel` (keepalive,
    /// connect timeout, the deadline of each try of a call that should
    /// answer at once). With several URLs (replicas), to the first that
    /// accepts a connection; the others are connected to when needed.
    pub async fn connect_with(
        url: impl Into<String>,
        token: Option<&Token>,
        channel: &ChannelConfig,
    ) -> Result<Self> {
        let urls = split(&url.into());
        let mut first_error = None;
        for (i, url) in urls.iter().enumerate() {
            match dial(url, channel, token.is_some())?.connect().await {
                Ok(connection) => {
                    let mut clients = Vec::with_capacity(urls.len());
                    for (j, other) in urls.iter().enumerate() {
                        clients.push(match j == i {
                            true => Self::grpc_client(connection.clone(), token)?,
                            false => Self::grpc_client(
                                dial(other, channel, token.is_some())?.connect_lazy(),
                                token,
                            )?,
                        });
                    }
                    return Ok(Self::over(
                        Replicas::new(urls.clone(), clients, i),
                        channel.call_timeout,
                    ));
                }
                Err(source) => {
                    first_error.get_or_insert(ClientError::Connect {
                        url: url.clone(),
                        source,
                    });
                }
            }
        }
        Err(first_error.unwrap_or_else(|| ClientError::Malformed {
            op: "connect",
            detail: "no rendezvous URL given".to_owned(),
        }))
    }

    /// A client that connects to `url` on its first call (and again after a
    /// broken connection), with the default [`ChannelConfig`].
    pub fn connect_lazy(url: &str, token: Option<&Token>) -> Result<Self> {
        Self::connect_lazy_with(url, token, &ChannelConfig::default())
    }

    /// [`connect_lazy`](Self::connect_lazy) with the channel settings `channel`.
    pub fn connect_lazy_with(url: &str, token: Option<&Token>, channel: &ChannelConfig) -> Result<Self> {
        let urls = split(url);
        if urls.is_empty() {
            return Err(ClientError::Malformed {
                op: "connect",
                detail: "no rendezvous URL given".to_owned(),
            });
        }
        let clients = urls
            .iter()
            .map(|u| Self::grpc_client(dial(u, channel, token.is_some())?.connect_lazy(), token))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::over(Replicas::new(urls, clients, 0), channel.call_timeout))
    }

    /// A client over an existing channel.
    pub fn with_channel(channel: Channel, token: Option<&Token>) -> Result<Self> {
        let inner = Self::grpc_client(channel, token)?;
        Ok(Self::over(
            Replicas::new(vec!["(channel)".to_owned()], vec![inner], 0),
            ChannelConfig::default().call_timeout,
        ))
    }

    fn grpc_client(channel: Channel, token: Option<&Token>) -> Result<Inner> {
        Ok(GrpcClient::with_interceptor(channel, BearerAttach::new(token)?)
            // All-gather replies carry world × payload bytes; the server is trusted.
            .max_decoding_message_size(usize::MAX))
    }

    fn over(replicas: Replicas<Inner>, call_timeout: Duration) -> Self {
        RendezvousClient {
            replicas: Arc::new(replicas),
            outage: DEFAULT_OUTAGE_BOUND,
            call_timeout,
        }
    }

    /// The URL calls go to now (the leader, as far as this client knows).
    pub fn current_url(&self) -> &str {
        self.replicas.current_url()
    }

    /// How long one try of a call that should answer at once (everything
    /// but a join and an all-gather, which wait by design) may take; a try
    /// past it counts as the rendezvous not answering and is retried within
    /// the outage bound.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How long calls keep retrying a rendezvous that does not answer before
    /// failing with [`ClientError::Unreachable`] (default
    /// [`DEFAULT_OUTAGE_BOUND`]; zero: one try).
    pub fn with_outage_bound(mut self, bound: Duration) -> Self {
        self.outage = bound;
        self
    }

    /// The outage bound.
    pub fn outage_bound(&self) -> Duration {
        self.outage
    }

    pub(super) fn backoff(&self) -> Backoff {
        Backoff::following(self.outage, self.replicas.clone())
    }

    /// A call tried once: its error moves the client on among replicas.
    pub(super) fn once<T>(&self, outcome: Result<T>) -> Result<T> {
        if let Err(e) = &outcome {
            self.replicas.follow(e);
        }
        outcome
    }

    /// Runs `call` until it succeeds, fails with an answer, or the
    /// rendezvous stayed unreachable past the outage bound; each try has the
    /// call timeout.
    pub(super) async fn retrying<T, F>(&self, op: &'static str, call: impl FnMut(Inner) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.retry_tries(op, Some(self.call_timeout), call).await
    }

    /// [`retrying`](Self::retrying) for a call that waits by design (a join,
    /// an all-gather): no deadline of its own. The server's gang and barrier
    /// timeouts bound it, and the keepalive a server that went silent.
    async fn retrying_blocking<T, F>(&self, op: &'static str, call: impl FnMut(Inner) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.retry_tries(op, None, call).await
    }

    async fn retry_tries<T, F>(
        &self,
        op: &'static str,
        deadline: Option<Duration>,
        mut call: impl FnMut(Inner) -> F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff = self.backoff();
        loop {
            let attempt = call(self.grpc());
            let outcome = match deadline {
                Some(limit) => tokio::time::timeout(limit, attempt).await.unwrap_or_else(|_| {
                    Err(tonic::Status::unavailable(format!(
                        "the rendezvous did not answer within {limit:?}"
                    )))
                }),
                None => attempt.await,
            };
            match outcome {
                Ok(reply) => return Ok(reply.into_inner()),
                Err(source) => backoff.wait(op, ClientError::Rpc { op, source }).await?,
            }
        }
    }

    pub(super) fn grpc(&self) -> Inner {
        self.replicas.current()
    }

    // ---- agents -------------------------------------------------------------

    /// Registers an agent and keeps its lease alive with a background
    /// heartbeat (every lease / 3) until the returned [`AgentLease`] is
    /// stopped or dropped. If the server forgot the agent (its lease lapsed)
    /// the heartbeat registers it again.
    pub async fn register(&self, agent: AgentInfo) -> Result<AgentLease> {
        self.register_reporting(agent, None).await
    }

    /// [`register`](Self::register), each heartbeat carrying what `report`
    /// returns then ([`AgentReport`](super::AgentReport) JSON, for the
    /// rendezvous' status page).
    pub async fn register_reporting(&self, agent: AgentInfo, report: Option<ReportFn>) -> Result<AgentLease> {
        let lease = self.register_once(agent.clone()).await?;
        Ok(AgentLease::start(self.clone(), agent, lease, report))
    }

    pub(super) async fn register_once(&self, agent: AgentInfo) -> Result<Duration> {
        let reply = self
            .retrying("register", |mut g| {
                let agent = agent.clone();
                async move {
                    g.register_agent(pb::RegisterAgentRequest { agent: Some(agent) })
                        .await
                }
            })
            .await?;
        Ok(Duration::from_millis(reply.lease_ms.max(1)))
    }

    /// One heartbeat (the [`AgentLease`] sends them for you).
    pub async fn heartbeat(&self, agent_id: &str) -> Result<HeartbeatReply> {
        self.heartbeat_reporting(agent_id, Vec::new()).await
    }

    /// One heartbeat carrying a report (see [`register_reporting`](Self::register_reporting)).
    pub async fn heartbeat_reporting(&self, agent_id: &str, report: Vec<u8>) -> Result<HeartbeatReply> {
        let reply = self
            .once(
                self.grpc()
                    .heartbeat(pb::HeartbeatRequest {
                        agent_id: agent_id.to_owned(),
                        report,
                    })
                    .await
                    .map_err(ClientError::rpc("heartbeat")),
            )?
            .into_inner();
        Ok(HeartbeatReply {
            lease: Duration::from_millis(reply.lease_ms),
            failed_attempts: reply.failed_attempts,
        })
    }

    /// Removes the agent now (its running attempts fail).
    pub async fn deregister(&self, agent_id: &str) -> Result<()> {
        self.once(
            self.grpc()
                .deregister_agent(pb::DeregisterAgentRequest {
                    agent_id: agent_id.to_owned(),
                })
                .await
                .map_err(ClientError::rpc("deregister")),
        )?;
        Ok(())
    }

    /// Agents with a live lease, by agent id.
    pub async fn list_agents(&self) -> Result<Vec<AgentInfo>> {
        Ok(self
            .retrying("list_agents", |mut g| async move {
                g.list_agents(pb::ListAgentsRequest {}).await
            })
            .await?
            .agents)
    }

    // ---- jobs ---------------------------------------------------------------

    /// Creates a job; returns the attempt to join. Idempotent for an active
    /// job with identical parameters; otherwise ALREADY_EXISTS.
    pub async fn create_job(&self, job: &JobConfig) -> Result<u32> {
        let request = pb::CreateJobRequest::from(job);
        Ok(self
            .retrying("create_job", |mut g| {
                let request = request.clone();
                async move { g.create_job(request).await }
            })
            .await?
            .attempt)
    }

    /// Renews the job's client lease once; returns the lease (`None`: the
    /// job has none). A job that ended answers with its error. Tried once:
    /// [`keep_job_leased`](Self::keep_job_leased) repeats it.
    pub async fn renew_job_lease(&self, job_id: &str) -> Result<Option<Duration>> {
        let reply = self
            .once(
                self.grpc()
                    .renew_job_lease(pb::RenewJobLeaseRequest {
                        job_id: job_id.to_owned(),
                    })
                    .await
                    .map_err(ClientError::rpc("renew_job_lease")),
            )?
            .into_inner();
        Ok((reply.lease_ms > 0).then(|| Duration::from_millis(reply.lease_ms)))
    }

    /// Lets the job go: the rendezvous drops its client lease, so the job
    /// runs to its end without this client (it is then `detached` in its
    /// status). Idempotent; a job that ended answers with its error.
    pub async fn detach_job(&self, job_id: &str) -> Result<()> {
        let request = pb::DetachJobRequest {
            job_id: job_id.to_owned(),
        };
        self.retrying("detach_job", |mut g| {
            let request = request.clone();
            async move { g.detach_job(request).await }
        })
        .await?;
        Ok(())
    }

    /// Renews the client lease of `job_id` (created with
    /// [`JobConfig::with_client_lease`] of `lease`) every lease / 3 in a
    /// background task until the returned [`JobLease`] is dropped or the job
    /// ends. A process that dies stops renewing, and the rendezvous cancels
    /// the job within the lease.
    pub fn keep_job_leased(&self, job_id: &str, lease: Duration) -> JobLease {
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(super::job_lease::renew_loop(
            self.clone(),
            job_id.to_owned(),
            lease,
            cancel.clone(),
        ));
        tasks.close();
        JobLease::new(cancel, tasks)
    }

    /// Joins `agent_id` to `attempt` and waits for the whole gang. Fails with
    /// DEADLINE_EXCEEDED ("k of n members joined") after the gang timeout,
    /// ABORTED if the attempt fails meanwhile, CANCELLED if the job is cancelled.
    pub async fn join(&self, job_id: &str, attempt: u32, agent_id: &str) -> Result<GangMember> {
        let request = pb::JoinRequest {
            job_id: job_id.to_owned(),
            attempt,
            agent_id: agent_id.to_owned(),
        };
        // A retried join replaces this member's earlier one at the server.
        let reply = self
            .retrying_blocking("join", |mut g| {
                let request = request.clone();
                async move { g.join(request).await }
            })
            .await?;
        if reply.rank >= reply.world_size || reply.peers.len() != reply.world_size as usize {
            return Err(ClientError::Malformed {
                op: "join",
                detail: format!(
                    "rank {} / world {} with {} peers",
                    reply.rank,
                    reply.world_size,
                    reply.peers.len()
                ),
            });
        }
        let membership = Membership {
            job_id: job_id.to_owned(),
            attempt: reply.attempt,
            rank: reply.rank,
            world_size: reply.world_size,
            peers: reply.peers.into(),
        };
        Ok(GangMember::new(self.clone(), agent_id.to_owned(), membership))
    }

    /// Joins the job's current attempt, whichever it is, and waits for the
    /// gang: what a member that may arrive at any time does. When the
    /// attempt moves on meanwhile (a later one started, or it failed or
    /// timed out while ganging) it looks up the current one and joins again.
    /// `None` when the job has ended or is cancelled.
    pub async fn join_current(&self, job_id: &str, agent_id: &str) -> Result<Option<GangMember>> {
        use tonic::Code;
        loop {
            let status = self.status(job_id).await?;
            if status.state.is_terminal() {
                return Ok(None);
            }
            match self.join(job_id, status.attempt, agent_id).await {
                Ok(gang) => return Ok(Some(gang)),
                Err(e)
                    if matches!(
                        e.code(),
                        Some(Code::FailedPrecondition | Code::Aborted | Code::DeadlineExceeded)
                    ) =>
                {
                    tracing::info!(job = job_id, error = %e, "re-joining");
                    tokio::time::sleep(REJOIN_DELAY).await;
                }
                Err(e) if e.code() == Some(Code::Cancelled) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// Low-level all-gather: every member's payload in rank order once all
    /// members called with this `seq` — or an empty list when every payload
    /// was empty (a barrier). One unary call; [`GangMember::all_gather`] keeps one
    /// stream open instead, which is cheaper per call.
    pub async fn all_gather(
        &self,
        job_id: &str,
        attempt: u32,
        rank: u32,
        seq: u64,
        payload: impl Into<Bytes>,
    ) -> Result<Vec<Bytes>> {
        let request = gather_request(job_id, attempt, rank, seq, payload.into());
        let reply = self
            .retrying_blocking("all_gather", |mut g| {
                let request = request.clone();
                async move { g.all_gather(request).await }
            })
            .await?;
        Ok(reply.payloads)
    }

    /// Reports the attempt failed. Returns the attempt to re-join, or `None`
    /// when the job ran out of attempts.
    pub async fn report_failure(
        &self,
        job_id: &str,
        attempt: u32,
        agent_id: &str,
        cause: &str,
    ) -> Result<Option<u32>> {
        self.report(job_id, attempt, agent_id, cause, false).await
    }

    /// [`report_failure`](Self::report_failure); a `final` failure (the
    /// job's own input or spec) fails the job for good.
    pub(crate) async fn report(
        &self,
        job_id: &str,
        attempt: u32,
        agent_id: &str,
        cause: &str,
        r#final: bool,
    ) -> Result<Option<u32>> {
        let request = pb::ReportFailureRequest {
            job_id: job_id.to_owned(),
            attempt,
            agent_id: agent_id.to_owned(),
            cause: cause.to_owned(),
            r#final,
        };
        let next = self
            .retrying("report_failure", |mut g| {
                let request = request.clone();
                async move { g.report_failure(request).await }
            })
            .await?
            .next_attempt;
        Ok((next > 0).then_some(next))
    }

    /// Elastic resize. Shrink: `attempt` (the current one, still ganging)
    /// and every later attempt form with `num_slots` members; the gang forms
    /// at once when that many already joined. Growth: a running `attempt`
    /// ends and the next forms with `num_slots` members (the ended attempt
    /// is not counted against `max_attempts`). Returns the job's new size.
    pub async fn resize_job(&self, job_id: &str, attempt: u32, num_slots: u32) -> Result<u32> {
        let request = pb::ResizeJobRequest {
            job_id: job_id.to_owned(),
            attempt,
            num_slots,
        };
        let reply = self
            .retrying("resize_job", |mut g| {
                let request = request.clone();
                async move { g.resize_job(request).await }
            })
            .await?;
        Ok(reply.num_slots)
    }

    /// Marks the job succeeded (idempotent for the completing attempt).
    pub async fn complete(&self, job_id: &str, attempt: u32) -> Result<()> {
        let request = pb::CompleteJobRequest {
            job_id: job_id.to_owned(),
            attempt,
        };
        self.retrying("complete", |mut g| {
            let request = request.clone();
            async move { g.complete_job(request).await }
        })
        .await?;
        Ok(())
    }

    /// Cancels the job; every blocked call of it returns CANCELLED.
    pub async fn cancel(&self, job_id: &str, reason: &str) -> Result<()> {
        let request = pb::CancelJobRequest {
            job_id: job_id.to_owned(),
            reason: reason.to_owned(),
        };
        self.retrying("cancel", |mut g| {
            let request = request.clone();
            async move { g.cancel_job(request).await }
        })
        .await?;
        Ok(())
    }

    /// The job's status.
    pub async fn status(&self, job_id: &str) -> Result<JobStatus> {
        let request = pb::JobStatusRequest {
            job_id: job_id.to_owned(),
        };
        let reply = self
            .retrying("status", |mut g| {
                let request = request.clone();
                async move { g.job_status(request).await }
            })
            .await?;
        status_from_pb("status", reply)
    }

    /// Every job the server still knows.
    pub async fn list_jobs(&self) -> Result<Vec<JobStatus>> {
        self.retrying("list_jobs", |mut g| async move {
            g.list_jobs(pb::ListJobsRequest {}).await
        })
        .await?
        .jobs
        .into_iter()
        .map(|s| status_from_pb("list_jobs", s))
        .collect()
    }
}

fn dial(url: &str, channel: &ChannelConfig, sends_token: bool) -> Result<Dial> {
    channel
        .dial(url, sends_token)
        .map_err(|source| ClientError::InvalidEndpoint {
            url: url.to_owned(),
            source,
        })
}

pub(super) fn status_from_pb(op: &'static str, s: pb::JobStatusResponse) -> Result<JobStatus> {
    JobStatus::try_from(s).map_err(|e| ClientError::Malformed {
        op,
        detail: e.to_string(),
    })
}
