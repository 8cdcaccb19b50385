//! Starting and stopping one agent process: the Flight and collective
//! services on one listener, registration with the rendezvous, shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use kindling_schemas::auth::{BearerCheck, Token};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::rendezvous::{AgentInfo, RendezvousClient};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;

use crate::cache::MemoryBudget;
use crate::collective::{self, Inbox};
use crate::error::{AgentError, RendezvousError};
use crate::jobs::JobRegistry;
use crate::jobs::job::JobEnv;
use crate::models::kindling_model::ModelRegistry;
use crate::process::flight::AgentFlightService;

/// Largest Flight message an agent accepts (one record batch).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Default of [`AgentConfig::max_jobs`].
pub const DEFAULT_MAX_JOBS: usize = 64;
/// Default of [`AgentConfig::finished_retention`]: an hour.
pub const DEFAULT_FINISHED_RETENTION: Duration = Duration::from_secs(3600);

/// How an agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Unique id, e.g. the node name.
    pub agent_id: String,
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Host other processes use to reach this agent (default: the listen IP).
    pub advertise_host: Option<String>,
    /// Kubernetes node (or machine) name.
    pub node_name: String,
    /// Job slots offered.
    pub capacity: u32,
    /// Bearer token required from callers and sent to peers.
    pub token: Option<Token>,
    /// A token that reads `/metrics` and nothing else (for Prometheus).
    pub viewer_token: Option<Token>,
    /// Rendezvous to register with (none: not registered, only reachable directly).
    pub rendezvous: Option<String>,
    /// Node-local directory for spill files and checkpoints.
    pub work_dir: PathBuf,
    /// Bytes of cached batches kept in memory before spilling.
    pub memory_budget: u64,
    /// How long a collective step waits for a peer.
    pub collective_timeout: Duration,
    /// A GPU job keeps its optimizer step on the device
    /// ([`crate::optim::DeviceOptimizer`]); on by default.
    pub gpu_step_on_device: bool,
    /// Gradient values per all-reduce bucket of a data-parallel step kept on
    /// the device ([`DEVICE_BUCKET_VALUES`](crate::training::gradients::DEVICE_BUCKET_VALUES)
    /// by default).
    pub gpu_bucket_values: usize,
    /// Device bytes a GPU job keeps its rows' inputs in (each cached batch
    /// whole) for the epochs after the first; `None` (the default): a
    /// quarter of the adapter's memory.
    pub gpu_kept_bytes: Option<u64>,
    /// How long rendezvous calls ride out an unreachable rendezvous (a
    /// restart) before failing; see `kindling_schemas::rendezvous::retry`.
    pub rendezvous_outage: Duration,
    /// Keepalive and deadlines of this agent's connections: its server (the
    /// clients' and peers' calls), its ring to the next rank, the rendezvous.
    pub channel: ChannelConfig,
    /// Largest incoming message.
    pub max_message_bytes: usize,
    /// Most jobs this agent holds at once (not finished); a `start_job`
    /// past it is refused with RESOURCE_EXHAUSTED naming the cap.
    pub max_jobs: usize,
    /// Most model reads (`DoGet`, `GetFlightInfo`) in flight at once, all
    /// callers; a job credential's at most half
    /// ([`DEFAULT_MAX_READS`](crate::process::reads::DEFAULT_MAX_READS) by default).
    pub max_reads: usize,
    /// How long a finished or cancelled job keeps its status, rows, spill
    /// files and checkpoints on this agent before they are removed.
    pub finished_retention: Duration,
    /// The cluster's job-credential key: with it the agent issues and takes
    /// job credentials (`issue_credential`) and its rings use peer credentials.
    /// A key file's keys are re-read when the file changes (a rotation).
    pub credentials: Option<kindling_schemas::credential::CredentialKeys>,
    /// What a job's `DoPut` streams may stage before they commit, and for how long.
    pub staging: crate::cache::StagingLimits,
    /// Threads the trainer computes on (burn's CPU kernels); 0 = one per core.
    /// Agents sharing a machine (local mode) each take their share.
    pub train_threads: usize,
    /// The models jobs can name (advertised to the rendezvous).
    pub models: ModelRegistry,
}

impl AgentConfig {
    /// A loopback agent with a 1 GiB cache budget working in `work_dir`.
    ///
    /// ```
    /// let c = kindling_agent::AgentConfig::local("agent-0", "/var/tmp/kindling");
    /// assert_eq!(c.listen.ip().to_string(), "127.0.0.1");
    /// ```
    pub fn local(agent_id: impl Into<String>, work_dir: impl Into<PathBuf>) -> Self {
        let agent_id = agent_id.into();
        AgentConfig {
            node_name: agent_id.clone(),
            agent_id,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_host: None,
            capacity: 1,
            token: None,
            viewer_token: None,
            rendezvous: None,
            work_dir: work_dir.into(),
            memory_budget: 1 << 30,
            collective_timeout: Duration::from_secs(60),
            gpu_step_on_device: true,
            gpu_bucket_values: crate::training::gradients::DEVICE_BUCKET_VALUES,
            gpu_kept_bytes: None,
            rendezvous_outage: kindling_schemas::rendezvous::DEFAULT_OUTAGE_BOUND,
            channel: ChannelConfig::default(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_jobs: DEFAULT_MAX_JOBS,
            max_reads: crate::process::reads::DEFAULT_MAX_READS,
            finished_retention: DEFAULT_FINISHED_RETENTION,
            credentials: None,
            staging: crate::cache::StagingLimits::default(),
            train_threads: 0,
            models: ModelRegistry::builtin(),
        }
    }
}

/// A running agent.
#[derive(Debug)]
pub struct AgentHandle {
    addr: SocketAddr,
    url: String,
    agent_id: String,
    jobs: Arc<JobRegistry>,
    cancel: CancellationToken,
    /// Child of `cancel`: stops the jobs only.
    jobs_cancel: CancellationToken,
    tracker: TaskTracker,
    server: Option<JoinHandle<()>>,
    /// Cancelled when the gRPC server's task ends, for whatever reason.
    server_ended: CancellationToken,
    /// The rendezvous the agent registered with, and its URL.
    rendezvous: Option<(String, RendezvousClient)>,
    token: Option<Token>,
    channel: ChannelConfig,
}

/// What [`AgentHandle::leave_and_shutdown`] told the rendezvous.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Departure {
    /// `(job_id, attempt)` of every running attempt reported failed.
    pub reported: Vec<(String, u32)>,
    /// Running jobs whose failure report was not taken (their lease lapses instead).
    pub unreported: Vec<String>,
    /// The agent was removed from the rendezvous' live agents.
    pub deregistered: bool,
}

/// How long each call to the rendezvous may take while leaving.
/// The Flight service's name in the gRPC health service.
pub const FLIGHT_SERVICE: &str = "arrow.flight.protocol.FlightService";
const LEAVE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long open streams may keep the server up while leaving.
const LEAVE_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

impl AgentHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://host:port` of the Flight (and collective) endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The agent id.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The agent's jobs (for status and tests).
    pub fn jobs(&self) -> &Arc<JobRegistry> {
        &self.jobs
    }

    /// Resolves once the gRPC server has stopped serving (a shutdown, or on
    /// its own: the process is then no longer ready).
    pub fn server_stopped(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.server_ended.clone().cancelled_owned()
    }

    /// Stops serving, cancels every job, and waits for all tasks to end.
    pub async fn shutdown_and_wait(mut self) {
        self.cancel.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Leaves the cluster cleanly (what SIGTERM does): stops every job, reports
    /// each running job's current attempt as failed with `cause` so the gang
    /// re-forms at once instead of after a lease, stops serving, deregisters
    /// from the rendezvous, and waits for all tasks.
    ///
    /// The order matters. Jobs stop first, so this agent never re-joins the
    /// next attempt; the server keeps answering until the reports are in, so
    /// peers see "agent left" as the cause rather than a broken connection;
    /// heartbeats stop before deregistering, so none re-registers the agent.
    /// Rendezvous errors are logged, never fatal: the lease lapsing is the fallback.
    pub async fn leave_and_shutdown(mut self, cause: &str) -> Departure {
        let running: Vec<(String, String, u32)> = self
            .jobs
            .all()
            .into_iter()
            .filter_map(|job| {
                let d = job.lock();
                // No rank: the job never formed a gang, there is nothing to fail.
                (!d.state.is_terminal() && d.rank.is_some())
                    .then(|| (job.job_id.clone(), job.rendezvous.clone(), d.attempt))
            })
            .collect();
        self.jobs_cancel.cancel();
        let cause = format!("agent {} left: {cause}", self.agent_id);
        let mut departure = Departure::default();
        for (job_id, rendezvous, attempt) in running {
            let reported =
                match RendezvousClient::connect_lazy_with(&rendezvous, self.token.as_ref(), &self.channel) {
                    Ok(client) => tokio::time::timeout(
                        LEAVE_CALL_TIMEOUT,
                        client.report_failure(&job_id, attempt, &self.agent_id, &cause),
                    )
                    .await
                    .map_err(|_| RendezvousError::Timeout {
                        url: rendezvous.clone(),
                    })
                    .and_then(|r| r.map_err(|e| RendezvousError::call(&rendezvous, e))),
                    Err(e) => Err(RendezvousError::call(&rendezvous, e)),
                };
            match reported {
                Ok(_) => departure.reported.push((job_id, attempt)),
                Err(e) => {
                    tracing::warn!(job = %job_id, attempt, error = %e, "could not report leaving");
                    departure.unreported.push(job_id);
                }
            }
        }
        self.cancel.cancel();
        if let Some(server) = self.server.take() {
            let abort = server.abort_handle();
            if tokio::time::timeout(LEAVE_DRAIN_TIMEOUT, server).await.is_err() {
                tracing::warn!("open streams outlived the drain timeout: closing them");
                abort.abort();
            }
        }
        self.tracker.close();
        self.tracker.wait().await;
        if let Some((url, client)) = &self.rendezvous {
            let deregistered =
                tokio::time::timeout(LEAVE_CALL_TIMEOUT, client.deregister(&self.agent_id)).await;
            match deregistered {
                Ok(Ok(())) => departure.deregistered = true,
                Ok(Err(e)) => tracing::warn!(rendezvous = %url, error = %e, "could not deregister"),
                Err(_) => tracing::warn!(rendezvous = %url, "deregistering timed out"),
            }
        }
        departure
    }

    /// **Test hook** (feature `test-hooks`): the gRPC server's task dies on
    /// its own (as an accept loop that fails for good would), everything
    /// else keeps running.
    #[cfg(feature = "test-hooks")]
    pub fn abort_server(&self) {
        if let Some(server) = &self.server {
            server.abort();
        }
    }

    /// **Test hook** (feature `test-hooks`): simulates a crash — connections
    /// drop at once, heartbeats stop, nothing is reported to the rendezvous
    /// (its lease lapses).
    #[cfg(feature = "test-hooks")]
    pub fn kill(mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        self.cancel.cancel();
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// How often the credential key file is checked for a rotation (a Secret
/// volume itself takes up to a minute to show a change).
const KEY_RELOAD_EVERY: Duration = Duration::from_secs(2);

/// Re-reads the credential key file whenever it changed, until `stop`.
async fn reload_keys(keys: kindling_schemas::credential::CredentialKeys, stop: CancellationToken) {
    let mut tick = tokio::time::interval(KEY_RELOAD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match keys.reload() {
            Ok(true) => tracing::info!(key_ids = ?keys.ids(), "credential keys reloaded; the first signs"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "credential key file not reloaded; the keys in use stay"),
        }
    }
}

/// Whether `use_gpu` jobs can run here: built with the `gpu` feature and a
/// wgpu adapter found (probed once, off the async threads). Logged either way.
async fn gpu_backend() -> bool {
    if !crate::models::backend::GPU_COMPILED {
        tracing::info!("GPU backend: none (built without the `gpu` feature); `use_gpu` jobs are refused");
        return false;
    }
    match tokio::task::spawn_blocking(crate::models::backend::gpu).await {
        Ok(Ok((_, info))) => {
            tracing::info!(adapter = %info, "GPU backend: wgpu");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "GPU backend: wgpu without an adapter; `use_gpu` jobs are refused");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "GPU backend: probing the wgpu adapter panicked");
            false
        }
    }
}

/// Who a metered request's streams are charged to.
type CallerKey = fn(&tonic::codegen::http::Request<tonic::body::Body>) -> Option<String>;

/// The job credential a call came with (job, role and incarnation: what
/// one credential can name), or `None` for the operator token.
fn job_caller(request: &tonic::codegen::http::Request<tonic::body::Body>) -> Option<String> {
    match request.extensions().get::<kindling_schemas::auth::Caller>() {
        Some(kindling_schemas::auth::Caller::Job(claims)) => Some(format!(
            "{}/{}/{:?}",
            claims.job_id, claims.role, claims.incarnation
        )),
        _ => None,
    }
}

/// Starts an agent: binds, serves, and registers with the rendezvous if one is configured.
pub async fn start(config: AgentConfig) -> Result<AgentHandle, AgentError> {
    let (listener, addr, url) = bind(&config).await?;
    let tls = config.channel.tls.clone().filter(|t| t.serves());
    let secure = tls.is_some();
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let inbox = Inbox::new();
    let env_budget = MemoryBudget::new(config.memory_budget);
    let env = job_env(&config, inbox.clone(), env_budget.clone())?;
    let jobs_cancel = cancel.child_token();
    let jobs = JobRegistry::new(env, tracker.clone(), jobs_cancel.clone());
    tracker.spawn(jobs.clone().reap_finished_until(cancel.clone()));
    if let Some(keys) = config.credentials.clone() {
        tracker.spawn(reload_keys(keys, cancel.clone()));
    }
    let check = BearerCheck::new(config.token.clone()).with_credentials(config.credentials.clone());
    let actions = Arc::new(crate::process::metrics::ActionCounts::default());
    let flight = FlightServiceServer::new(AgentFlightService::new(jobs.clone(), actions.clone()))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    // Each job credential's streams pin at most their share of the receive
    // buffers (the operator's are not metered); checked after the token,
    // whose caller it reads.
    let receiving = config.staging.receiving(config.memory_budget);
    let flight = kindling_ops::receiving::Metered::new(flight, receiving, job_caller as CallerKey);
    let flight = InterceptedService::new(flight, check.clone());
    let (reflection, reflection_alpha) =
        kindling_ops::grpc::reflection(kindling_schemas::pb::FLIGHT_FILE_DESCRIPTOR_SET)
            .map_err(|e| AgentError::io("building gRPC reflection", std::io::Error::other(e)))?;
    let shutdown = cancel.clone();
    let server_builder = collective::server_builder(&config.channel);
    // One port: gRPC (Flight) and the ring data plane, told apart by their
    // first bytes (or TLS ALPN).
    let routed = kindling_ops::listen::incoming_routed(listener, tls);
    let incoming = routed.grpc;
    let peers = ring_peers(&config, &url)?;
    tokio::spawn(collective::serve(
        inbox.clone(),
        check.clone(),
        peers,
        routed.ring,
    ));
    let token_layer = kindling_ops::grpc::TokenLayer::new(check.clone());
    let auth = kindling_ops::web::HttpAuth::new(check, config.viewer_token.clone(), secure);
    let pages = metrics_page(jobs.clone(), env_budget.clone(), actions);
    tokio::spawn(kindling_ops::web::serve(routed.http, auth, cancel.clone(), pages));
    let server_ended = CancellationToken::new();
    let ended_guard = server_ended.clone().drop_guard();
    let server = tokio::spawn(async move {
        // Dropped however the task ends (an error, a panic, an abort).
        let _ended = ended_guard;
        // Stopping closes the inbox first: ring connections live as long as
        // their rings, and their peers must see them end at once.
        let stopping = async move {
            shutdown.cancelled().await;
            inbox.close();
        };
        // The standard gRPC health service: its `Check` open like the
        // probes, everything else (`Watch`, reflection, Flight, a path no
        // service serves) behind the token.
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(FLIGHT_SERVICE, tonic_health::ServingStatus::Serving)
            .await;
        let result = server_builder
            .layer(kindling_ops::grpc::TraceLayer)
            .layer(token_layer)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_alpha)
            .add_service(flight)
            .serve_with_incoming_shutdown(incoming, stopping)
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "agent server stopped");
        }
    });
    let has_gpu = gpu_backend().await;
    let mut rendezvous = None;
    if let Some(rv) = &config.rendezvous {
        let info = agent_info(&config, &url, has_gpu);
        let (client, lease) = match register(&config, rv, info, &jobs, &env_budget).await {
            Ok(registered) => registered,
            Err(e) => {
                // Free the port so the caller can retry `start`.
                cancel.cancel();
                let _ = server.await;
                return Err(AgentError::rendezvous(rv, e));
            }
        };
        // The heartbeats stop with the agent (a crash, too: the lease lapses).
        let stop = cancel.clone();
        tracker.spawn(async move {
            stop.cancelled().await;
            lease.stop().await;
        });
        rendezvous = Some((rv.clone(), client));
    }
    // A detached job whose rows this agent kept before it restarted takes
    // it back, once the agent serves (its peers dial it).
    tracker.spawn(jobs.clone().restore_kept());
    tracing::info!(agent = %config.agent_id, %url, "agent serving");
    Ok(AgentHandle {
        addr,
        url,
        agent_id: config.agent_id,
        jobs,
        cancel,
        jobs_cancel,
        tracker,
        server: Some(server),
        server_ended,
        rendezvous,
        token: config.token,
        channel: config.channel,
    })
}

/// What the agent tells the rendezvous about itself, advertising `url`.
fn agent_info(config: &AgentConfig, url: &str, has_gpu: bool) -> AgentInfo {
    AgentInfo {
        agent_id: config.agent_id.clone(),
        flight_address: url.to_owned(),
        collective_address: url.to_owned(),
        node_name: config.node_name.clone(),
        capacity: config.capacity,
        has_gpu,
        models: config.models.names(),
    }
}

/// Who may open ring connections: over mutual TLS only the agents, whose
/// certificates are valid for the name agents dial each other by
/// (`--tls-server-name`, else the host in this agent's advertised `url`).
fn ring_peers(config: &AgentConfig, url: &str) -> Result<collective::RingPeers, AgentError> {
    let Some(tls) = config
        .channel
        .tls
        .as_ref()
        .filter(|t| t.serves() && t.files().client_auth)
    else {
        return Ok(collective::RingPeers::anyone());
    };
    let name = match &tls.files().server_name {
        Some(name) => name.clone(),
        None => {
            let host = url.rsplit_once(':').map_or(url, |(h, _)| h);
            let host = host.trim_start_matches("https://");
            host.trim_start_matches('[').trim_end_matches(']').to_owned()
        }
    };
    collective::RingPeers::agents_named(&name).map_err(|e| {
        AgentError::io(
            format!("the agents' name `{name}` for ring connections"),
            std::io::Error::other(e),
        )
    })
}

/// The agent's port, its address, and the URL it advertises (`https` when
/// it serves TLS).
async fn bind(config: &AgentConfig) -> Result<(TcpListener, std::net::SocketAddr, String), AgentError> {
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| AgentError::io(format!("bind {}", config.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| AgentError::io("local address", e))?;
    let host = config
        .advertise_host
        .clone()
        .unwrap_or_else(|| addr.ip().to_string());
    let serves_tls = config.channel.tls.as_ref().is_some_and(|t| t.serves());
    let scheme = if serves_tls { "https" } else { "http" };
    Ok((listener, addr, format!("{scheme}://{host}:{}", addr.port())))
}

/// What every job on the agent shares: its trainers' thread count, the
/// cache budget, the spill and checkpoint folders (cleaned after a crash),
/// the folder of detached jobs' kept rows (kept across restarts).
fn job_env(config: &AgentConfig, inbox: Arc<Inbox>, budget: Arc<MemoryBudget>) -> Result<JobEnv, AgentError> {
    let spill_dir = config.work_dir.join("spill").join(&config.agent_id);
    let checkpoint_dir = config.work_dir.join("checkpoints").join(&config.agent_id);
    crate::training::checkpoint::clean_after_crash(&spill_dir, &checkpoint_dir);
    Ok(JobEnv {
        train_threads: config.train_threads,
        agent_id: config.agent_id.clone(),
        spill_dir,
        checkpoint_dir,
        kept_dir: config.work_dir.join("kept").join(&config.agent_id),
        budget,
        disk: config.staging.disk(),
        inbox,
        token: config.token.clone(),
        collective_timeout: config.collective_timeout,
        gpu: crate::training::trainer::GpuSettings {
            step_on_device: config.gpu_step_on_device,
            bucket_values: config.gpu_bucket_values.max(1),
            kept_bytes: config.gpu_kept_bytes,
        },
        rendezvous_outage: config.rendezvous_outage,
        models: config.models.clone(),
        rendezvous: config.rendezvous.clone(),
        channel: config.channel.clone(),
        max_jobs: config.max_jobs,
        max_reads: config.max_reads,
        finished_retention: config.finished_retention,
        credentials: config.credentials.clone(),
        staging: config.staging,
    })
}

/// The agent's HTTP pages: `/metrics`, rendered at most once per
/// [`RENDER_TTL`](kindling_ops::web::RENDER_TTL).
fn metrics_page(
    jobs: Arc<JobRegistry>,
    budget: Arc<MemoryBudget>,
    actions: Arc<crate::process::metrics::ActionCounts>,
) -> kindling_ops::web::Pages {
    let registry = kindling_ops::exposition::registry(
        "agent",
        crate::process::metrics::AgentCollector::new(jobs, budget, actions),
    );
    let pages: kindling_ops::web::Pages = Arc::new(move |path: &str| {
        (path == "/metrics").then(|| kindling_ops::web::Page {
            content_type: kindling_ops::exposition::CONTENT_TYPE,
            body: kindling_ops::exposition::encode(&registry).into(),
        })
    });
    kindling_ops::web::cached(pages, kindling_ops::web::RENDER_TTL)
}

/// Registers `info` with the rendezvous at `rv`, its heartbeats carrying the
/// agent's report: the client and the lease.
async fn register(
    config: &AgentConfig,
    rv: &str,
    info: AgentInfo,
    jobs: &Arc<JobRegistry>,
    budget: &Arc<MemoryBudget>,
) -> Result<
    (RendezvousClient, kindling_schemas::rendezvous::AgentLease),
    kindling_schemas::rendezvous::ClientError,
> {
    let client = RendezvousClient::connect_lazy_with(rv, config.token.as_ref(), &config.channel)?
        .with_outage_bound(config.rendezvous_outage);
    let report: kindling_schemas::rendezvous::ReportFn = {
        let (jobs, budget) = (jobs.clone(), budget.clone());
        Arc::new(move || crate::process::metrics::report(&jobs, &budget))
    };
    let lease = client.register_reporting(info, Some(report)).await?;
    Ok((client, lease))
}
