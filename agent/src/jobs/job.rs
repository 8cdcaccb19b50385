//! One job on one agent: its data (shard caches and producer positions), its
//! state, and the task that gangs with the other agents, trains, and re-joins
//! the next attempt when the rendezvous fails the current one.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kindling_schemas::action::{AgentJobState, AgentJobStatus, EventLevel};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::credential::Role;
use kindling_schemas::descriptor::Split;
use kindling_schemas::rendezvous::{GangMember, JobState, RendezvousClient};
use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::{JobKind, JobSpec};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::cache::MemoryBudget;
use crate::collective::{Inbox, Ring, RingConfig};
use crate::error::{AgentError, JobStateError, TrainingError};
use crate::jobs::splits::IngestState;
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
    /// Root of the directories of detached jobs' kept rows.
    pub kept_dir: PathBuf,
    /// The agent's cache budget.
    pub budget: Arc<MemoryBudget>,
    /// The agent's disk watermark, over all jobs' spill files.
    pub disk: Arc<crate::cache::DiskBudget>,
    /// Inbox of the collective service.
    pub inbox: Arc<Inbox>,
    /// Token for peers and the rendezvous.
    pub token: Option<Token>,
    /// How long a ring operation waits for a peer.
    pub collective_timeout: Duration,
    /// How a GPU job uses the device.
    pub gpu: crate::training::trainer::GpuSettings,
    /// How long rendezvous calls retry an unreachable rendezvous.
    pub rendezvous_outage: Duration,
    /// Threads each job's trainer computes on (0: one per core), in a pool
    /// of its own: jobs training at once on the same agents (a search's
    /// trials) never wait for one another's threads, so no two agents can
    /// each hold a thread for a different job's step that waits on the other.
    pub train_threads: usize,
    /// The models jobs can name.
    pub models: ModelRegistry,
    /// The rendezvous this agent registered with (`create_job`'s default).
    pub rendezvous: Option<String>,
    /// Keepalive and deadlines of the agent's outgoing channels.
    pub channel: ChannelConfig,
    /// Most jobs held at once (not finished).
    pub max_jobs: usize,
    /// Most model reads in flight at once (the Flight service's to keep).
    pub max_reads: usize,
    /// How long a finished or cancelled job keeps its status, rows, spill
    /// files and checkpoints here before they are removed.
    pub finished_retention: Duration,
    /// Signs and checks job credentials; `None`: only the operator token.
    pub credentials: Option<kindling_schemas::credential::CredentialKeys>,
    /// What a job's streams may stage before they commit, and for how long.
    pub staging: crate::cache::StagingLimits,
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
    /// Where the job trains, from [`crate::models::backend::label`].
    pub device: String,
    /// Its rings' all-reduces, across attempts.
    pub ring_stats: Arc<crate::collective::RingStats>,
    /// `DoPut` streams refused, by status code.
    pub refused_puts: Mutex<std::collections::BTreeMap<String, u64>>,
    data_changed: watch::Sender<u64>,
    env: JobEnv,
    /// The dataset job whose rows this job trains on (`rows_from`).
    rows: Option<Arc<Job>>,
    /// The jobs training on this job's rows (it holds rows for others).
    borrowers: Mutex<Borrowers>,
    /// The weights to start from (`init_from`), as a weights table.
    initial: Option<arrow::array::RecordBatch>,
    /// Its rows as kept on this agent's disk (`keep_rows`), if they are.
    pub kept: Mutex<Option<crate::jobs::kept::Kept>>,
    /// The kept files its batches are, restored from a copy, with their
    /// digests as the copy's record gave them (none unless restored).
    pub kept_files: crate::jobs::kept::KeptFiles,
}

/// The jobs reading a dataset's rows, and whether the rows went (then no
/// job may borrow them any more).
#[derive(Debug, Default)]
struct Borrowers {
    jobs: Vec<std::sync::Weak<Job>>,
    ended: bool,
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
    ) -> Job {
        let spill = env.spill_dir.join(&job_id);
        let data = JobData {
            state: AgentJobState::Ganging,
            attempt: 0,
            rank: None,
            world_size: spec.num_slots,
            error: None,
            ingest: IngestState::new(&spill, env.budget.clone(), env.disk.clone()),
            layout: None,
            log: Default::default(),
        };
        Job {
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
            rows: None,
            borrowers: Mutex::default(),
            initial: None,
            kept: Mutex::default(),
            kept_files: Default::default(),
        }
    }

    /// The job, starting from the weights of `table` (`init_from`) instead
    /// of seeded ones unless it resumes from a checkpoint.
    pub fn starting_from(self, table: Option<arrow::array::RecordBatch>) -> Job {
        Job {
            initial: table,
            ..self
        }
    }

    /// Where its rows are kept on this agent's disk (`keep_rows`).
    pub fn kept_place(&self) -> PathBuf {
        self.env.kept_dir.join(&self.job_id)
    }

    /// The job, training on the rows of `dataset` (a job holding rows on
    /// this agent) rather than its own; [`Job::lend_rows`] registers it
    /// with the dataset once it is shared.
    pub fn reading(self, dataset: Option<Arc<Job>>) -> Job {
        Job {
            rows: dataset,
            ..self
        }
    }

    /// Registers `job` with the dataset it reads (if any), which cancels
    /// it when its rows go. Called on the `Arc` the agent keeps: the
    /// dataset holds a weak reference to exactly that one.
    /// A dataset that ended meanwhile cancels `job` at once.
    pub fn lend_rows(job: &Arc<Job>) {
        let Some(d) = &job.rows else { return };
        let ended = {
            let mut b = d.borrowers.lock().unwrap_or_else(|p| p.into_inner());
            if !b.ended {
                b.jobs.retain(|j| j.strong_count() > 0);
                b.jobs.push(Arc::downgrade(job));
            }
            b.ended
        };
        if ended {
            job.cancel(&format!("its dataset `{}` ended", d.job_id));
        }
    }

    /// The weights it starts from (`init_from`), if any.
    pub fn initial_table(&self) -> Option<&arrow::array::RecordBatch> {
        self.initial.as_ref()
    }

    /// The job whose rows this job trains on: its dataset, or itself.
    pub fn source(&self) -> &Job {
        self.rows.as_deref().unwrap_or(self)
    }

    /// The source as an `Arc` (`self` when the job holds its own rows).
    fn source_arc(self: &Arc<Self>) -> Arc<Job> {
        self.rows.clone().unwrap_or_else(|| self.clone())
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
        // The rows it trains on: its own, or its dataset's (read before
        // its own lock is taken: the source may be the job itself).
        let (rows_train, rows_eval) = {
            let s = self.source().lock();
            (
                s.ingest.split(Split::Train).committed_rows(),
                s.ingest.split(Split::Eval).committed_rows(),
            )
        };
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
            rows_train,
            rows_eval,
            rows_trained_per_epoch: p.rows_trained_per_epoch.clone(),
            samples_per_sec: p.samples_per_sec,
            cache_bytes_memory: memory,
            cache_bytes_disk: disk,
            history: p.history.clone(),
            resumed_from_epoch: p.resumed_from_epoch,
            resumed_from_step: p.resumed_from_step,
            error: d.error.clone(),
            device: self.device.clone(),
            failed_attempts: d.log.failed_attempts(),
            step_losses: p.step_losses.points().to_vec(),
            events: d.log.events(),
            best_epoch: p.best_epoch,
            stopped_early: p.stopped_early,
        }
    }

    /// Cancels the jobs training on this job's rows, which are going.
    fn end_borrowers(&self, why: &str) {
        let borrowers = {
            let mut b = self.borrowers.lock().unwrap_or_else(|p| p.into_inner());
            b.ended = true;
            std::mem::take(&mut b.jobs)
        };
        for b in borrowers.iter().filter_map(std::sync::Weak::upgrade) {
            b.cancel(&format!("its dataset `{}` ended: {why}", self.job_id));
        }
    }

    /// Cancels the job and drops its data.
    pub fn cancel(&self, reason: &str) {
        self.end_borrowers(reason);
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
        self.end_borrowers(&cause);
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
        let failing = {
            let mut d = self.lock();
            let failing = !d.state.is_terminal();
            if failing {
                d.state = AgentJobState::Failed;
                d.error = Some(cause.clone());
            }
            failing
        };
        if failing {
            self.end_borrowers(&cause);
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
        let source = self.source();
        let mut rx = source.data_changed.subscribe();
        loop {
            {
                let d = source.lock();
                if self.rows.is_some() && d.state.is_terminal() {
                    return Err(JobStateError::Dataset {
                        job_id: self.job_id.clone(),
                        dataset: source.job_id.clone(),
                        reason: "the dataset's job ended on this agent: its rows are gone".into(),
                    }
                    .into());
                }
                if d.layout.is_some() || d.ingest.split(Split::Train).ended() {
                    return Ok(());
                }
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return Err(JobStateError::Cancelled("agent shutting down".into()).into()) },
                _ = cancel.cancelled() => return Err(JobStateError::Cancelled("while waiting for data".into()).into()),
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
                _ = self.cancel.cancelled() => Err(JobStateError::Cancelled("while joining".into()).into()),
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
            let mut cancelled_outside = false;
            let result = tokio::select! {
                result = &mut work => result,
                over = gang.attempt_over() => {
                    ended_from_outside = true;
                    cancelled_outside = matches!(&over, Ok(s) if s.state == JobState::Cancelled);
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
                    // The job cancelled at the rendezvous (a search's stopped
                    // trial): its ring operations were aborted, no error.
                    let cancelled = cancelled_outside && e.is_ring_abort();
                    if ended_from_outside && (e.is_cancellation() || cancelled) {
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
        if self.spec.kind() == JobKind::Dataset {
            // A dataset trains nothing: it lends its rows until it ends.
            cancel.cancelled().await;
            return Err(JobStateError::Cancelled("the dataset's attempt ended".into()).into());
        }
        let source = self.source_arc();
        let layout = source.lock().layout.clone().ok_or(TrainingError::NoData)?;
        let data = Arc::new(JobShards {
            changes: std::sync::Mutex::new(source.data_changed.subscribe()),
            job: source,
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
            gpu: self.env.gpu,
            report: trainer::Report(Arc::new({
                let job = self.clone();
                move |level, message: &str| job.report(level, message)
            })),
            initial: self.initial.clone(),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.env.train_threads)
            .thread_name({
                let id = self.job_id.clone();
                move |i| format!("train-{i}-{id}")
            })
            .build()
            .map_err(|e| {
                AgentError::io(
                    "start the trainer thread pool",
                    std::io::Error::other(e.to_string()),
                )
            })?;
        // The trainer (on the training pool's thread) logs under the attempt's span.
        let span = tracing::Span::current();
        let outcome =
            tokio::task::spawn_blocking(move || pool.install(|| span.in_scope(|| trainer::train(ctx))))
                .await
                .map_err(AgentError::panicked("the trainer thread"))??;
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

    fn train_origins(&self, n: usize) -> Vec<Option<crate::cache::Origin>> {
        self.job.lock().ingest.split(Split::Train).cache.origins(n)
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
