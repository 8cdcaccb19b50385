//! The tonic `Rendezvous` service over [`RendezvousState`], the one mapping
//! from [`RendezvousError`] to `tonic::Status`, and [`serve`], which the
//! binary and the embedded mode both run.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use kindling_ops::web::probes::Readiness;
use kindling_schemas::auth::{BearerCheck, Token};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::pb::rendezvous as pb;
use kindling_schemas::pb::rendezvous::rendezvous_server::{Rendezvous, RendezvousServer};
use kindling_schemas::rendezvous::{CURRENT_ATTEMPT_METADATA, JobConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::error::RendezvousError;
use crate::etcd::{Candidate, EtcdSettings, Hint};
use crate::gate::{Gate, PageGate};
use crate::state::RendezvousState;
use crate::types::RendezvousConfig;

impl From<RendezvousError> for Status {
    fn from(err: RendezvousError) -> Status {
        use RendezvousError as E;
        let message = err.to_string();
        let mut status = match &err {
            E::InvalidArgument(_) | E::PayloadTooLarge { .. } => Status::invalid_argument(message),
            E::JobNotFound { .. } | E::AgentNotRegistered { .. } => Status::not_found(message),
            E::JobExists { .. } => Status::already_exists(message),
            E::StaleAttempt { .. } | E::WrongState { .. } => Status::failed_precondition(message),
            E::JobCancelled { .. } => Status::cancelled(message),
            E::GangTimeout { .. } | E::BarrierTimeout { .. } => Status::deadline_exceeded(message),
            E::AttemptFailed { .. } | E::Superseded => Status::aborted(message),
            E::ShuttingDown | E::Storage { .. } | E::Transport { .. } => Status::unavailable(message),
        };
        if let Some(attempt) = err.current_attempt()
            && let Ok(value) = attempt.to_string().parse()
        {
            status.metadata_mut().insert(CURRENT_ATTEMPT_METADATA, value);
        }
        status
    }
}

/// The rendezvous service's name in the gRPC health service.
pub const RENDEZVOUS_SERVICE: &str = "kindling.rendezvous.v1.Rendezvous";

/// Everything [`serve`] needs besides the listener.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub rendezvous: RendezvousConfig,
    /// Bearer token every call must present; `None` disables auth (loopback only).
    pub token: Option<Token>,
    /// HTTP/2 concurrent streams per connection: every blocked join/all-gather
    /// holds one, so this bounds the members one client connection can carry.
    pub max_concurrent_streams: u32,
    /// Where the state is kept across restarts; `None`: in memory only, a
    /// restart loses every job (see [`RendezvousState::open`]).
    pub state_dir: Option<std::path::PathBuf>,
    /// TLS (and, with client-certificate verification, mutual TLS); `None`:
    /// plaintext.
    pub tls: Option<kindling_schemas::tls::Tls>,
    /// A token that reads the status page and `/metrics` and nothing else.
    pub viewer_token: Option<Token>,
    /// Replicas on etcd: the state in etcd, one leader among the replicas
    /// (`state_dir` is then unused); `None`: one node.
    pub etcd: Option<EtcdSettings>,
}

impl ServerConfig {
    /// Defaults with this token.
    pub fn new(rendezvous: RendezvousConfig, token: Option<Token>) -> Self {
        ServerConfig {
            rendezvous,
            token,
            max_concurrent_streams: 16_384,
            state_dir: None,
            tls: None,
            viewer_token: None,
            etcd: None,
        }
    }
}

/// Serves the rendezvous on `listener` until `shutdown` is cancelled, then
/// wakes every blocked call (UNAVAILABLE), ends watch streams, drains
/// in-flight calls and stops the reaper.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: CancellationToken,
) -> Result<(), RendezvousError> {
    serve_ready(listener, config, shutdown, &Readiness::new()).await
}

/// [`serve`], marking `ready` once the state is restored from the state
/// directory (a rendezvous is not ready while it would answer from an empty
/// state) and the listener is about to be served. On etcd (`config.etcd`),
/// ready once the replica answers (a follower names the leader), and it
/// leads in terms: campaign, restore the state from etcd, answer from it
/// until the lease could lapse, then campaign again (see [`crate::etcd`]).
pub async fn serve_ready(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: CancellationToken,
    ready: &Readiness,
) -> Result<(), RendezvousError> {
    let candidate = config.etcd.clone().map(Candidate::new);
    // The single-node state is read before anything answers.
    let single = match &candidate {
        None => Some(RendezvousState::open(
            config.rendezvous.clone(),
            config.state_dir.as_deref(),
        )?),
        Some(_) => None,
    };
    let hint = candidate.as_ref().map_or_else(
        || watch::Sender::new(Hint::default()).subscribe(),
        Candidate::hint,
    );
    let (front, mut server) = Front::start(listener, &config, hint, shutdown.clone()).await?;
    ready.set(true);
    let terms = async {
        match (single, &candidate) {
            (Some(state), _) => {
                front.lead(state, &config, shutdown.clone()).await;
                Ok(())
            }
            (None, Some(candidate)) => lead_on_etcd(candidate, &front, &config, &shutdown).await,
            (None, None) => Ok(()),
        }
    };
    let result = tokio::select! {
        r = terms => r,
        r = &mut server => r.unwrap_or_else(|e| Err(RendezvousError::transport("the rendezvous task", e))),
    };
    shutdown.cancel();
    if !server.is_finished() {
        let _ = server.await;
    }
    front.tasks.close();
    front.tasks.wait().await;
    result
}

/// Campaigns and leads, term after term, until `shutdown`.
async fn lead_on_etcd(
    candidate: &Candidate,
    front: &Front,
    config: &ServerConfig,
    shutdown: &CancellationToken,
) -> Result<(), RendezvousError> {
    while let Some(mut leader) = candidate.campaign(shutdown).await {
        let opened = leader.open_store().await.and_then(|(store, snapshot)| {
            RendezvousState::with_store(config.rendezvous.clone(), Box::new(store), snapshot)
        });
        match opened {
            Ok(state) => front.lead(state, config, leader.lost().clone()).await,
            Err(e) => {
                tracing::error!(error = %e, "elected, but the state in etcd cannot be read: stepping down")
            }
        }
        if shutdown.is_cancelled() {
            leader.resign().await;
            break;
        }
        tracing::warn!("this replica no longer leads the rendezvous: campaigning again");
        leader.resign().await;
    }
    Ok(())
}

type Guarded = InterceptedService<RendezvousServer<RendezvousService>, BearerCheck>;

/// What answers on the listener across terms: the gRPC server (health,
/// reflection, the gated rendezvous service) and the gated pages.
struct Front {
    gate: Gate<Guarded>,
    pages: PageGate,
    health: tonic_health::server::HealthReporter,
    check: BearerCheck,
    tasks: TaskTracker,
}

type ServerTask = tokio::task::JoinHandle<Result<(), RendezvousError>>;

impl Front {
    async fn start(
        listener: TcpListener,
        config: &ServerConfig,
        hint: watch::Receiver<Hint>,
        shutdown: CancellationToken,
    ) -> Result<(Front, ServerTask), RendezvousError> {
        let gate = Gate::new(hint.clone());
        let pages = PageGate::new(hint);
        let tasks = TaskTracker::new();
        let check = BearerCheck::new(config.token.clone());
        let routed = kindling_ops::listen::incoming_routed(listener, config.tls.clone());
        let auth = kindling_ops::web::HttpAuth::new(
            check.clone(),
            config.viewer_token.clone(),
            config.tls.is_some(),
        );
        tasks.spawn(kindling_ops::web::serve(
            routed.http,
            auth,
            shutdown.clone(),
            kindling_ops::web::cached(pages.pages(), kindling_ops::web::RENDER_TTL),
        ));
        // No ring here: its connections are dropped.
        drop(routed.ring);
        // The standard gRPC health service: its `Check` open like the probes
        // (`grpc_health_probe` and Kubernetes' gRPC probes ask it, with no
        // token); `Watch`, reflection and any other path need the token
        // (`TokenLayer`). The rendezvous service is SERVING while this
        // replica leads.
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(RENDEZVOUS_SERVICE, tonic_health::ServingStatus::NotServing)
            .await;
        // Server reflection: `grpcurl -H 'authorization: Bearer …' list` finds every service.
        let (reflection, reflection_alpha) =
            kindling_ops::grpc::reflection(kindling_schemas::pb::rendezvous::FILE_DESCRIPTOR_SET)
                .map_err(|e| RendezvousError::transport("building gRPC reflection", e))?;
        let router = ChannelConfig::default()
            .server()
            .max_concurrent_streams(config.max_concurrent_streams)
            .layer(kindling_ops::grpc::TraceLayer)
            .layer(kindling_ops::grpc::TokenLayer::new(check.clone()))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_alpha)
            .add_service(gate.clone());
        let server = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(routed.grpc, shutdown.cancelled_owned())
                .await
                .map_err(|e| RendezvousError::transport("serving the rendezvous", e))
        });
        let front = Front {
            gate,
            pages,
            health,
            check,
            tasks,
        };
        Ok((front, server))
    }

    /// Answers from `state` until `term` ends, then wakes every blocked
    /// call (UNAVAILABLE), ends watch streams and stops the reaper.
    async fn lead(&self, state: RendezvousState, config: &ServerConfig, term: CancellationToken) {
        let reaper = tokio::spawn(run_reaper(state.clone(), term.clone()));
        let max_payload = config.rendezvous.max_payload_bytes;
        let reports = crate::page::Reports::default();
        let service = RendezvousService {
            state: state.clone(),
            shutdown: term.clone(),
            reports: reports.clone(),
        };
        let server = RendezvousServer::new(service)
            // Room for the largest payload plus the request's other fields, so
            // our own PayloadTooLarge check answers rather than the codec.
            .max_decoding_message_size(max_payload.saturating_add(64 << 10))
            .max_encoding_message_size(usize::MAX);
        self.gate
            .open(InterceptedService::new(server, self.check.clone()));
        self.pages.set(Some(crate::page::pages(state.clone(), reports)));
        self.health
            .set_service_status(RENDEZVOUS_SERVICE, tonic_health::ServingStatus::Serving)
            .await;
        term.cancelled().await;
        self.gate.close();
        self.pages.set(None);
        self.health
            .set_service_status(RENDEZVOUS_SERVICE, tonic_health::ServingStatus::NotServing)
            .await;
        state.close();
        let _ = reaper.await;
    }
}

/// Least time between two events of a watch with reports that a report
/// alone woke (agents report up to every 200 ms each).
const REPORT_EVERY: Duration = Duration::from_millis(100);

async fn run_reaper(state: RendezvousState, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(state.config().reap_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => { state.reap(); }
        }
    }
}

/// The gRPC service; handlers validate, call the state machine, convert.
#[derive(Debug, Clone)]
pub struct RendezvousService {
    state: RendezvousState,
    shutdown: CancellationToken,
    reports: crate::page::Reports,
}

impl RendezvousService {
    /// A service over `state`; `shutdown` ends its watch streams.
    pub fn new(state: RendezvousState, shutdown: CancellationToken) -> Self {
        RendezvousService {
            state,
            shutdown,
            reports: Default::default(),
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::JobEvent, Status>> + Send>>;
type GatherStream = Pin<Box<dyn Stream<Item = Result<pb::AllGatherResponse, Status>> + Send>>;

/// The reply to one all-gather: the payloads in rank order, or none at all
/// for a plain barrier (every payload empty).
fn gather_reply(payloads: &[Bytes]) -> pb::AllGatherResponse {
    let payloads = if payloads.iter().all(Bytes::is_empty) {
        Vec::new()
    } else {
        payloads.to_vec()
    };
    pb::AllGatherResponse { payloads }
}

impl RendezvousService {
    /// One all-gather of a request, unary or streamed.
    async fn gather(&self, r: pb::AllGatherRequest) -> Result<pb::AllGatherResponse, Status> {
        let payloads = self
            .state
            .all_gather(&r.job_id, r.attempt, r.rank, r.seq, r.payload)
            .await?;
        Ok(gather_reply(&payloads))
    }
}

#[tonic::async_trait]
impl Rendezvous for RendezvousService {
    async fn register_agent(
        &self,
        request: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        let agent = request
            .into_inner()
            .agent
            .ok_or_else(|| RendezvousError::invalid("agent must be set"))?;
        let lease = self.state.register_agent(agent)?;
        Ok(Response::new(pb::RegisterAgentResponse {
            lease_ms: duration_ms(lease),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let request = request.into_inner();
        let reply = self.state.heartbeat(&request.agent_id)?;
        // A bad report costs the page its update, never the agent its lease.
        if let Err(e) = self.reports.store(&request.agent_id, &request.report) {
            tracing::warn!(agent = %request.agent_id, error = %e, "heartbeat report dropped");
        }
        Ok(Response::new(pb::HeartbeatResponse {
            lease_ms: duration_ms(reply.lease),
            failed_attempts: reply.failed_attempts,
        }))
    }

    async fn deregister_agent(
        &self,
        request: Request<pb::DeregisterAgentRequest>,
    ) -> Result<Response<pb::DeregisterAgentResponse>, Status> {
        self.state.deregister_agent(&request.into_inner().agent_id)?;
        Ok(Response::new(pb::DeregisterAgentResponse {}))
    }

    async fn list_agents(
        &self,
        _request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let agents = self.state.durable(self.state.list_agents())?;
        Ok(Response::new(pb::ListAgentsResponse { agents }))
    }

    async fn create_job(
        &self,
        request: Request<pb::CreateJobRequest>,
    ) -> Result<Response<pb::CreateJobResponse>, Status> {
        let attempt = self.state.create_job(JobConfig::from(request.into_inner()))?;
        Ok(Response::new(pb::CreateJobResponse { attempt }))
    }

    async fn renew_job_lease(
        &self,
        request: Request<pb::RenewJobLeaseRequest>,
    ) -> Result<Response<pb::RenewJobLeaseResponse>, Status> {
        let lease = self.state.renew_job_lease(&request.into_inner().job_id)?;
        Ok(Response::new(pb::RenewJobLeaseResponse {
            lease_ms: lease.map_or(0, duration_ms),
        }))
    }

    async fn detach_job(
        &self,
        request: Request<pb::DetachJobRequest>,
    ) -> Result<Response<pb::DetachJobResponse>, Status> {
        self.state.detach_job(&request.into_inner().job_id)?;
        Ok(Response::new(pb::DetachJobResponse {}))
    }

    async fn join(&self, request: Request<pb::JoinRequest>) -> Result<Response<pb::JoinResponse>, Status> {
        let r = request.into_inner();
        let m = self.state.join(&r.job_id, r.attempt, &r.agent_id).await?;
        Ok(Response::new(pb::JoinResponse {
            attempt: m.attempt,
            rank: m.rank,
            world_size: m.world_size,
            peers: m.peers.to_vec(),
        }))
    }

    async fn all_gather(
        &self,
        request: Request<pb::AllGatherRequest>,
    ) -> Result<Response<pb::AllGatherResponse>, Status> {
        Ok(Response::new(self.gather(request.into_inner()).await?))
    }

    type AllGatherStreamStream = GatherStream;

    async fn all_gather_stream(
        &self,
        request: Request<Streaming<pb::AllGatherRequest>>,
    ) -> Result<Response<Self::AllGatherStreamStream>, Status> {
        // One reply per request, in order; the first error ends the stream.
        // Ends when the member closes its side, or on shutdown (blocked
        // calls are woken by the state closing).
        let replies = futures::stream::try_unfold(
            (self.clone(), request.into_inner()),
            |(service, mut requests)| async move {
                let next = tokio::select! {
                    _ = service.shutdown.cancelled() => return Ok(None),
                    next = requests.message() => next?,
                };
                let Some(r) = next else { return Ok(None) };
                let reply = service.gather(r).await?;
                Ok(Some((reply, (service, requests))))
            },
        );
        Ok(Response::new(Box::pin(replies)))
    }

    async fn report_failure(
        &self,
        request: Request<pb::ReportFailureRequest>,
    ) -> Result<Response<pb::ReportFailureResponse>, Status> {
        let r = request.into_inner();
        let next = self
            .state
            .report_failure_with(&r.job_id, r.attempt, &r.agent_id, &r.cause, r.r#final)?;
        Ok(Response::new(pb::ReportFailureResponse {
            next_attempt: next.unwrap_or(0),
        }))
    }

    async fn resize_job(
        &self,
        request: Request<pb::ResizeJobRequest>,
    ) -> Result<Response<pb::ResizeJobResponse>, Status> {
        let r = request.into_inner();
        let num_slots = self.state.resize_job(&r.job_id, r.attempt, r.num_slots)?;
        Ok(Response::new(pb::ResizeJobResponse { num_slots }))
    }

    async fn complete_job(
        &self,
        request: Request<pb::CompleteJobRequest>,
    ) -> Result<Response<pb::CompleteJobResponse>, Status> {
        let r = request.into_inner();
        self.state.complete_job(&r.job_id, r.attempt)?;
        Ok(Response::new(pb::CompleteJobResponse {}))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        let r = request.into_inner();
        self.state.cancel_job(&r.job_id, &r.reason)?;
        Ok(Response::new(pb::CancelJobResponse {}))
    }

    async fn job_status(
        &self,
        request: Request<pb::JobStatusRequest>,
    ) -> Result<Response<pb::JobStatusResponse>, Status> {
        let status = self
            .state
            .durable(self.state.job_status(&request.into_inner().job_id))?;
        Ok(Response::new(pb::JobStatusResponse::from(&status)))
    }

    async fn list_jobs(
        &self,
        _request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let jobs = self.state.durable(self.state.list_jobs())?;
        Ok(Response::new(pb::ListJobsResponse {
            jobs: jobs.iter().map(pb::JobStatusResponse::from).collect(),
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let request = request.into_inner();
        let rx = self.state.watch(&request.job_id)?;
        // With reports, a report kept wakes the stream too (at most every
        // REPORT_EVERY); without, it never does.
        let reports = request
            .with_reports
            .then(|| (self.reports.clone(), self.reports.subscribe()));
        let job_id = request.job_id;
        // Pulled by the transport: each item is the latest state (a slow
        // watcher skips intermediate states, it never blocks the service).
        // Ends after a terminal state, when the job is collected, or on shutdown.
        let stream = futures::stream::unfold(
            (rx, reports, self.shutdown.clone(), None, false),
            move |(mut rx, mut reports, shutdown, mut sent, done)| {
                let job_id = job_id.clone();
                async move {
                    if done {
                        return None;
                    }
                    loop {
                        if sent.is_some() {
                            let report_changed = async {
                                match reports.as_mut() {
                                    Some((_, version)) => {
                                        tokio::time::sleep(REPORT_EVERY).await;
                                        version.changed().await
                                    }
                                    None => std::future::pending().await,
                                }
                            };
                            tokio::select! {
                                _ = shutdown.cancelled() => return None,
                                changed = rx.changed() => changed.ok()?,
                                changed = report_changed => changed.ok()?,
                            }
                        }
                        let status = pb::JobStatusResponse::from(&*rx.borrow_and_update());
                        let terminal = rx.borrow().state.is_terminal();
                        let of_job = match reports.as_mut() {
                            Some((store, version)) => {
                                version.borrow_and_update();
                                store.of_job(&job_id)
                            }
                            None => Vec::new(),
                        };
                        // Another job's report woke it: nothing to send.
                        let same = |(s, r): &(pb::JobStatusResponse, Vec<pb::MemberReport>)| {
                            *s == status
                                && r.len() == of_job.len()
                                && r.iter()
                                    .zip(&of_job)
                                    .all(|(a, b)| a.agent_id == b.agent_id && a.status_json == b.status_json)
                        };
                        if sent.as_ref().is_some_and(same) {
                            continue;
                        }
                        sent = Some((status.clone(), of_job.clone()));
                        let event = pb::JobEvent {
                            status: Some(status),
                            reports: of_job,
                        };
                        return Some((Ok(event), (rx, reports, shutdown, sent, terminal)));
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
