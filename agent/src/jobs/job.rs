//! One job on one agent: its data (shard caches and producer positions), its
//! state, and the task that gangs with the other agents, trains, and re-joins
//! the next attempt when the rendezvous fails the current one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kindling_schemas::action::{AgentJobState, AgentJobStatus, EventLevel};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::credential::Role;
use kindling_schemas::descriptor::Split;
use kindling_schemas::rendezvous::{GangMember, JobState, RendezvousClient};
use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::JobSpec;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::cache::{MemoryBudget, ShardCache};
use crate::collective::{Inbox, Ring, RingConfig};
use crate::error::AgentError;
use crate::models::kindling_model::{AnyModel, ModelRegistry};
use crate::training::checkpoint::CheckpointStore;
use crate::training::trainer::{self, Progress, TrainContext};

/// Agent-wide settings a job needs.
#[derive(Debug, Clone)]
pub struct JobEnv {
    /// This agent's id.
    pub agent_id: String,
    /// Root of spill directories.
    pub spill_dir: PathBuf,
    /// Root of checkpoint directories.
    pub checkpoint_dir: PathBuf,
    /// The agent's cache budget.
    pub budget: Arc<MemoryBudget>,
    /// Inbox of the collective service.
    pub inbox: Arc<Inbox>,
    /// Token for peers and the rendezvous.
    pub token: Option<Token>,
    /// How long a ring operation waits for a peer.
    pub collective_timeout: Duration,
    /// A GPU job of one agent keeps its step on the device.
    pub gpu_step_on_device: bool,
    /// How long rendezvous calls retry an unreachable rendezvous.
    pub rendezvous_outage: Duration,
    /// The threads trainers compute on.
    pub train_pool: Arc<rayon::ThreadPool>,
    /// The models jobs can name.
    pub models: ModelRegistry,
    /// The rendezvous this agent registered with (`create_job`'s default).
    pub rendezvous: Option<String>,
    /// Keepalive and deadlines of the agent's outgoing channels.
    pub channel: ChannelConfig,
    /// Most jobs held at once (not finished).
    pub max_jobs: usize,
    /// How long a finished or cancelled job keeps its status, rows, spill
    /// files and checkpoints here before they are removed.
    pub finished_retention: Duration,
    /// Signs and checks job credentials; `None`: only the operator token.
    pub credentials: Option<kindling_schemas::credential::CredentialKeys>,
    /// What a job's streams may stage before they commit, and for how long.
    pub staging: crate::cache::StagingLimits,
}

/// A producer's committed position in one split.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProducerPosition {
    /// The next sequence number not yet committed.
    pub next_seq: u64,
    /// Rows committed.
    pub rows: u64,
}

/// One split of a job on this agent: its rows, who committed them, and
/// whether its producers said they are done.
#[derive(Debug)]
pub struct SplitIngest {
    /// The split's batches.
    pub cache: ShardCache,
    producers: HashMap<String, ProducerPosition>,
    ended: bool,
}

impl SplitIngest {
    fn new(cache: ShardCache) -> Self {
        SplitIngest {
            cache,
            producers: HashMap::new(),
            ended: false,
        }
    }

    /// The producer's committed position (zero before its first commit).
    pub fn position(&self, producer: &str) -> ProducerPosition {
        self.producers.get(producer).copied().unwrap_or_default()
    }

    /// Whether the split's producers said they are done.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Committed rows.
    pub fn committed_rows(&self) -> u64 {
        self.cache.committed_rows()
    }

    /// Records that the split's producers are done.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// Moves `producer`'s committed position to `next_seq`, `rows` more rows on.
    pub fn advance(&mut self, producer: &str, next_seq: u64, rows: u64) {
        let pos = self.producers.entry(producer.to_owned()).or_default();
        pos.next_seq = next_seq;
        pos.rows += rows;
    }
}

/// Both splits of a job and the numbering of its `DoPut` streams.
#[derive(Debug)]
pub struct IngestState {
    train: SplitIngest,
    eval: SplitIngest,
    next_stream: u64,
}

impl IngestState {
    /// Empty splits spilling under `spill_dir` (`train/`, `eval/`), in memory
    /// up to `budget`.
    pub fn new(spill_dir: &Path, budget: Arc<MemoryBudget>) -> Self {
        IngestState {
            train: SplitIngest::new(ShardCache::new(spill_dir.join("train"), budget.clone())),
            eval: SplitIngest::new(ShardCache::new(spill_dir.join("eval"), budget)),
            next_stream: 0,
        }
    }

    /// One split.
    pub fn split(&self, split: Split) -> &SplitIngest {
        match split {
            Split::Train => &self.train,
            Split::Eval => &self.eval,
        }
    }

    /// One split, to change.
    pub fn split_mut(&mut self, split: Split) -> &mut SplitIngest {
        match split {
            Split::Train => &mut self.train,
            Split::Eval => &mut self.eval,
        }
    }

    /// `(bytes in memory, bytes on disk)` of both splits.
    pub fn bytes(&self) -> (u64, u64) {
        let (m1, d1) = self.train.cache.bytes();
        let (m2, d2) = self.eval.cache.bytes();
        (m1 + m2, d1 + d2)
    }

    /// Numbers a new `DoPut` stream.
    pub fn open_stream(&mut self) -> u64 {
        self.next_stream += 1;
        self.next_stream
    }

    /// Drops every cached batch of both splits.
    pub fn clear(&mut self) {
        self.train.cache.clear();
        self.eval.cache.clear();
    }

    /// Bytes the job's uncommitted streams hold, both splits.
    pub fn staged_bytes(&self) -> u64 {
        self.train.cache.staged_bytes() + self.eval.cache.staged_bytes()
    }
}

/// How long a ring's peer credential lives (one attempt's ring; a new
/// attempt gets a new one).
const PEER_CREDENTIAL_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Mutable state of a job, behind one lock.
#[derive(Debug)]
pub struct JobData {
    /// Lifecycle state.
    pub state: AgentJobState,
    /// Current attempt (from 1; before the first join, the one it will join).
    pub attempt: u32,
    /// Rank in the current attempt.
    pub rank: Option<u32>,
    /// World size of the current attempt.
    pub world_size: u32,
    /// The failure or cancellation cause.
    pub error: Option<String>,
    /// The train and eval splits: rows, producer positions, end of data.
    pub ingest: IngestState,
    /// Layout agreed by the first accepted stream of each split.
    pub layout: Option<FeatureLayout>,
    /// Its warnings, errors and failed attempts.
    pub log: crate::training::joblog::JobLog,
}

/// A job on this agent.
#[derive(Debug)]
pub struct Job {
    /// The job id.
    pub job_id: String,
    /// What to train.
    pub spec: JobSpec,
    /// Rendezvous URL.
    pub rendezvous: String,
    /// Which job under this id: when the rendezvous created it (Unix ms).
    /// Credentials name it, so a later job under the same id refuses them.
    pub incarnation: u64,
    /// Mutable state.
    pub data: Mutex<JobData>,
    /// Live training numbers.
    pub progress: Arc<Mutex<Progress>>,
    /// Cancels the whole job.
    pub cancel: CancellationToken,
    /// The trained model, once the job succeeded.
    pub model: Mutex<Option<Arc<dyn AnyModel>>>,
    /// Where the job trains, from [`crate::models::device::label`].
    pub device: String,
    /// Its rings' all-reduces, across attempts.
    pub ring_stats: Arc<crate::collective::RingStats>,
    /// `DoPut` streams refused, by status code.
    pub refused_puts: Mutex<std::collections::BTreeMap<String, u64>>,
    data_changed: watch::Sender<u64>,
    env: JobEnv,
}

impl Job {
    /// A new job with empty caches, training on `device` (a label), for
    /// `incarnation` of `job_id` at `rendezvous`.
    pub fn new(
        job_id: String,
        spec: JobSpec,
        rendezvous: String,
        incarnation: u64,
        device: String,
        env: JobEnv,
        cancel: CancellationToken,
    ) -> Arc<Job> {
        let spill = env.spill_dir.join(&job_id);
        let data = JobData {
            state: AgentJobState::Ganging,
            attempt: 0,
            rank: None,
            world_size: spec.num_slots,
            error: None,
            ingest: IngestState::new(&spill, env.budget.clone()),
            layout: None,
            log: Default::default(),
        };
        Arc::new(Job {
            job_id,
            spec,
            rendezvous,
            incarnation,
            data: Mutex::new(data),
            progress: Arc::new(Mutex::new(Progress::default())),
            cancel,
            model: Mutex::new(None),
            device,
            ring_stats: Arc::default(),
            refused_puts: Mutex::default(),
            data_changed: watch::channel(0).0,
            env,
        })
    }

    /// What the job's streams may stage, and for how long.
    pub fn staging(&self) -> crate::cache::StagingLimits {
        self.env.staging
    }

    /// The agent's memory budget, in bytes.
    pub fn budget_limit(&self) -> u64 {
        self.env.budget.limit()
    }

    /// Locks the mutable state.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, JobData> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes whoever waits for data (called after commits and end-of-data).
    pub fn notify_data(&self) {
        self.data_changed.send_modify(|v| *v += 1);
    }

    /// Logs a warning or an error of this job, with its job, rank and
    /// attempt as fields, and keeps it in the job's log: `job_status`, the
    /// rendezvous' status page and the client that started the job show it.
    pub fn report(&self, level: EventLevel, message: &str) {
        let (rank, attempt) = {
            let mut d = self.lock();
            let (rank, attempt) = (d.rank, d.attempt);
            d.log.push(level, &self.env.agent_id, rank, attempt, message);
            (rank, attempt)
        };
        match level {
            EventLevel::Warn => tracing::warn!(job = %self.job_id, rank, attempt, "{message}"),
            EventLevel::Error => tracing::error!(job = %self.job_id, rank, attempt, "{message}"),
        }
    }

    fn set_state(&self, state: AgentJobState) {
        let mut d = self.lock();
        if !d.state.is_terminal() {
            d.state = state;
        }
    }

    /// The job's status on this agent.
    pub fn status(&self) -> AgentJobStatus {
        let d = self.lock();
        let p = self.progress.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (memory, disk) = d.ingest.bytes();
        AgentJobStatus {
            job_id: self.job_id.clone(),
            agent_id: self.env.agent_id.clone(),
            state: d.state,
            attempt: d.attempt,
            rank: d.rank,
            world_size: d.world_size,
            epoch: p.epoch,
            epochs: self.spec.epochs,
            step: p.step,
            steps_per_epoch: p.steps_per_epoch,
            loss: p.loss,
            rows_train: d.ingest.split(Split::Train).committed_rows(),
            rows_eval: d.ingest.split(Split::Eval).committed_rows(),
            rows_trained_per_epoch: p.rows_trained_per_epoch.clone(),
            samples_per_sec: p.samples_per_sec,
            cache_bytes_memory: memory,
            cache_bytes_disk: disk,
            history: p.history.clone(),
            resumed_from_epoch: p.resumed_from_epoch,
            error: d.error.clone(),
            device: self.device.clone(),
            failed_attempts: d.log.failed_attempts(),
            step_losses: p.step_losses.points().to_vec(),
            events: d.log.events(),
            best_epoch: p.best_epoch,
            stopped_early: p.stopped_early,
        }
    }

    /// Cancels the job and drops its data.
    pub fn cancel(&self, reason: &str) {
        {
            let mut d = self.lock();
            if !d.state.is_terminal() {
                d.state = AgentJobState::Cancelled;
                d.error = Some(format!("cancelled: {reason}"));
            }
            d.ingest.clear();
        }
        self.cancel.cancel();
        self.env.inbox.forget(&self.job_id);
        self.notify_data();
    }

    /// Fails the job on this agent for good (its spill disk is full): its
    /// rows, cache and spill files are dropped and its tasks end; the agent's
    /// other jobs go on. The producer sees the cause on its stream; the Rust
    /// client then cancels the job everywhere.
    pub fn fail_and_drop_data(&self, cause: String) {
        {
            let mut d = self.lock();
            if !d.state.is_terminal() {
                d.state = AgentJobState::Failed;
                d.error = Some(cause);
            }
            d.ingest.clear();
        }
        self.cancel.cancel();
        self.env.inbox.forget(&self.job_id);
        self.notify_data();
    }

    /// Fails the job without an event: its cause reaches the caller as the
    /// job's error.
    /// Returns whether it failed the job (it had not ended yet).
    fn fail_quietly(&self, cause: String) -> bool {
        let mut d = self.lock();
        let failing = !d.state.is_terminal();
        if failing {
            d.state = AgentJobState::Failed;
            d.error = Some(cause);
        }
        failing
    }

    fn fail(&self, cause: String) {
        if self.fail_quietly(cause.clone()) {
            self.report(EventLevel::Error, &format!("the job failed: {cause}"));
        }
    }

    /// Waits until the data's layout is known (a stream's schema was
    /// accepted) or the train split has ended (or the token fires).
    async fn wait_for_data(&self, cancel: &CancellationToken) -> Result<(), AgentError> {
        let mut rx = self.data_changed.subscribe();
        loop {
            {
                let d = self.lock();
                if d.layout.is_some() || d.ingest.split(Split::Train).ended() {
                    return Ok(());
                }
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return Err(AgentError::Cancelled("agent shutting down".into())) },
                _ = cancel.cancelled() => return Err(AgentError::Cancelled("while waiting for data".into())),
            }
        }
    }

    /// Runs the job to the end: gang, wait for data, train; on a failed
    /// attempt, re-join the next one and resume from the latest checkpoint.
    pub async fn run(self: Arc<Self>, rendezvous: RendezvousClient) {
        let rv_error = |e| AgentError::rendezvous(&self.rendezvous, e);
        loop {
            if self.cancel.is_cancelled() {
                return;
            }
            self.set_state(AgentJobState::Ganging);
            let joined = tokio::select! {
                joined = rendezvous.join_current(&self.job_id, &self.env.agent_id) => joined.map_err(rv_error),
                _ = self.cancel.cancelled() => Err(AgentError::Cancelled("while joining".into())),
            };
            let gang = match joined {
                Ok(Some(gang)) => gang,
                Ok(None) => {
                    // The job ended at the rendezvous (failed for good, cancelled or done).
                    match rendezvous.status(&self.job_id).await {
                        Ok(status) => {
                            let cause = status.first_cause().unwrap_or_default();
                            match status.state {
                                JobState::Succeeded
                                    if self.model.lock().map(|m| m.is_some()).unwrap_or(false) => {}
                                JobState::Cancelled => {
                                    self.cancel(status.cancel_reason.as_deref().unwrap_or(cause))
                                }
                                _ => self.fail(cause.to_owned()),
                            }
                        }
                        Err(e) => self.fail(rv_error(e).to_string()),
                    }
                    return;
                }
                Err(e) => {
                    self.fail(format!("could not join the gang: {e}"));
                    return;
                }
            };
            let attempt = gang.attempt();
            {
                let mut d = self.lock();
                d.attempt = attempt;
                d.rank = Some(gang.rank());
                d.world_size = gang.world_size();
            }
            self.env.inbox.enter_attempt(&self.job_id, attempt);
            let attempt_cancel = self.cancel.child_token();
            let span = tracing::info_span!("attempt", attempt, rank = gang.rank());
            let work = self
                .clone()
                .run_attempt(&gang, attempt_cancel.clone())
                .instrument(span);
            tokio::pin!(work);
            let mut ended_from_outside = false;
            let result = tokio::select! {
                result = &mut work => result,
                over = gang.attempt_over() => {
                    ended_from_outside = true;
                    match over {
                        Ok(_) => tracing::info!(job = %self.job_id, attempt, "attempt over at the rendezvous"),
                        Err(e) => self.report(EventLevel::Warn, &format!("lost the watch of the attempt: {e}")),
                    }
                    attempt_cancel.cancel();
                    work.await
                }
            };
            attempt_cancel.cancel();
            match result {
                Ok(model) => {
                    *self.model.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::from(model));
                    if let Err(e) = gang.complete().await {
                        self.report(
                            EventLevel::Warn,
                            &format!("could not report completion: {}", rv_error(e)),
                        );
                    }
                    self.set_state(AgentJobState::Succeeded);
                    return;
                }
                Err(e) => {
                    if self.cancel.is_cancelled() {
                        return;
                    }
                    if e.is_final() {
                        // The job's own input or spec: every attempt would fail the same way.
                        self.lock().log.attempt_failed(attempt, &e.to_string());
                        if let Err(re) = gang.report_final_failure(&e.to_string()).await {
                            tracing::debug!(job = %self.job_id, error = %rv_error(re), "failure report not taken");
                        }
                        // The caller gets it as the job's error: no event
                        // repeats it on every agent's log.
                        tracing::info!(job = %self.job_id, attempt, error = %e, "the job's input or spec failed it");
                        self.fail_quietly(e.to_string());
                        return;
                    }
                    self.lock().log.attempt_failed(attempt, &e.to_string());
                    if ended_from_outside && e.is_cancellation() {
                        // Another member failed, or the job was cancelled: the
                        // rendezvous has the cause; this is no error of ours.
                        tracing::info!(job = %self.job_id, attempt, error = %e, "attempt ended by the rendezvous");
                    } else {
                        self.report(EventLevel::Error, &format!("attempt {attempt} failed: {e}"));
                    }
                    self.set_state(AgentJobState::Recovering);
                    // Tell the rendezvous unless it told us (then this is a no-op there).
                    if let Err(re) = gang.report_failure(&e.to_string()).await {
                        tracing::debug!(job = %self.job_id, error = %rv_error(re), "failure report not taken");
                    }
                }
            }
        }
    }

    /// One attempt: starts training as soon as the data's layout is known;
    /// the first epoch trains the train split as it arrives.
    async fn run_attempt(
        self: Arc<Self>,
        gang: &GangMember,
        cancel: CancellationToken,
    ) -> Result<Box<dyn AnyModel>, AgentError> {
        self.set_state(AgentJobState::Ingesting);
        self.wait_for_data(&cancel).await?;
        self.set_state(AgentJobState::Training);
        let layout = self.lock().layout.clone().ok_or(AgentError::NoData)?;
        let data = Arc::new(JobShards {
            changes: std::sync::Mutex::new(self.data_changed.subscribe()),
            job: self.clone(),
            runtime: tokio::runtime::Handle::current(),
        });
        let ring = Ring::new(
            RingConfig {
                job_id: self.job_id.clone(),
                attempt: gang.attempt(),
                rank: gang.rank(),
                peers: gang
                    .peers()
                    .iter()
                    .map(|p| p.collective_address.clone())
                    .collect(),
                // With a credential key the ring speaks with a peer
                // credential for this job only, not the operator token.
                token: match &self.env.credentials {
                    Some(keys) => Some(Token::new(keys.issue(
                        &self.job_id,
                        Role::Peer,
                        PEER_CREDENTIAL_TTL,
                        self.incarnation,
                    ))),
                    None => self.env.token.clone(),
                },
                timeout: self.env.collective_timeout,
                channel: self.env.channel.clone(),
            },
            self.env.inbox.clone(),
            cancel.clone(),
        )?
        .with_stats(self.ring_stats.clone());
        let ctx = TrainContext {
            job_id: self.job_id.clone(),
            attempt: gang.attempt(),
            spec: self.spec.clone(),
            models: self.env.models.clone(),
            layout,
            data,
            ring,
            runtime: tokio::runtime::Handle::current(),
            checkpoints: CheckpointStore::new(
                &self.env.checkpoint_dir,
                &self.job_id,
                self.spec.checkpoint.keep_last,
            ),
            progress: self.progress.clone(),
            cancel,
            shuffle: self.spec.shuffle,
            step_on_device: self.env.gpu_step_on_device,
        };
        let pool = self.env.train_pool.clone();
        // The trainer (on the training pool's thread) logs under the attempt's span.
        let span = tracing::Span::current();
        let outcome =
            tokio::task::spawn_blocking(move || pool.install(|| span.in_scope(|| trainer::train(ctx))))
                .await
                .map_err(|source| AgentError::Panicked {
                    task: "the trainer thread",
                    source,
                })??;
        Ok(outcome.model)
    }
}

/// The job's caches as the trainer reads them (see [`trainer::ShardSource`]).
#[derive(Debug)]
struct JobShards {
    job: Arc<Job>,
    changes: Mutex<watch::Receiver<u64>>,
    runtime: tokio::runtime::Handle,
}

impl trainer::ShardSource for JobShards {
    fn train_since(&self, from: usize) -> (Vec<Arc<crate::cache::CachedBatch>>, bool) {
        // Mark the changes seen before reading, so `wait` wakes for any later one.
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .borrow_and_update();
        let d = self.job.lock();
        let train = d.ingest.split(Split::Train);
        (train.cache.committed_since(from), train.ended())
    }

    fn eval(&self) -> Vec<Arc<crate::cache::CachedBatch>> {
        self.job.lock().ingest.split(Split::Eval).cache.snapshot()
    }

    fn wait(&self, timeout: Duration) {
        let mut rx = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .runtime
            .block_on(async { tokio::time::timeout(timeout, rx.changed()).await });
    }
}
