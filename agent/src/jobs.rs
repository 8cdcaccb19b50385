//! The jobs an agent knows, and starting their lifecycle tasks. Rooms,
//! lowest first: `splits` (a job's rows per split) · `job` (one job's
//! data, state and lifecycle) · `ingest` (exactly-once ingest) · `kept`
//! (a detached job's rows kept across restarts) · this file (the agent's
//! table of jobs).

pub(crate) mod ingest;
pub(crate) mod job;
pub(crate) mod kept;
pub(crate) mod splits;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kindling_schemas::action::{
    CreateJob, CreateJobResponse, CredentialResponse, IssueCredential, KeepRowsResponse, StartJob,
};
use kindling_schemas::credential::Claims;
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::JobKind;
use kindling_schemas::trace::TraceContext;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::error::{AgentError, JobStateError, LimitError, RendezvousError};
use crate::jobs::job::{Job, JobEnv};

/// Streams one job credential may have open on an agent at once (a Spark
/// node's tasks push one stream each into their node's agent).
pub const MAX_STREAMS_PER_CREDENTIAL: usize = 128;

type StreamKey = (String, String, Option<u64>);
type OpenStreams = Arc<Mutex<HashMap<StreamKey, usize>>>;

/// One open stream of a job credential ([`JobRegistry::stream_slot`]);
/// dropping it frees the slot.
#[derive(Debug)]
pub struct StreamSlot(Option<(OpenStreams, StreamKey)>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some((open, key)) = self.0.take() {
            let mut open = open.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = open.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    open.remove(&key);
                }
            }
        }
    }
}

/// Every job on one agent.
#[derive(Debug)]
pub struct JobRegistry {
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    streams: OpenStreams,
    env: JobEnv,
    tracker: TaskTracker,
    cancel: CancellationToken,
    served: crate::serving::served::ServedModels,
    /// Held while a job's rows are being kept (`keep_rows`).
    keeping: tokio::sync::Mutex<()>,
}

impl JobRegistry {
    /// An empty registry whose job tasks are tracked by `tracker` and end with `cancel`.
    pub fn new(env: JobEnv, tracker: TaskTracker, cancel: CancellationToken) -> Arc<Self> {
        Arc::new(JobRegistry {
            jobs: Mutex::new(HashMap::new()),
            streams: Arc::default(),
            env,
            tracker,
            cancel,
            served: Default::default(),
            keeping: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The models this agent serves (`serve_model`).
    pub fn served(&self) -> &crate::serving::served::ServedModels {
        &self.served
    }

    /// What streams may stage, and how long they may stay quiet or open.
    pub fn staging(&self) -> crate::cache::StagingLimits {
        self.env.staging
    }

    /// Most model reads in flight at once (`--max-reads`).
    pub fn max_reads(&self) -> usize {
        self.env.max_reads
    }

    /// This agent's id.
    pub fn agent_id(&self) -> &str {
        &self.env.agent_id
    }

    /// Root of the checkpoint directories.
    pub fn checkpoint_dir(&self) -> &Path {
        &self.env.checkpoint_dir
    }

    /// A client of the rendezvous at `url` with this agent's token, channel
    /// settings and outage bound (connected on first use).
    fn rendezvous_at(&self, url: &str) -> Result<RendezvousClient, AgentError> {
        Ok(
            RendezvousClient::connect_lazy_with(url, self.env.token.as_ref(), &self.env.channel)
                .map_err(|e| AgentError::rendezvous(url, e))?
                .with_outage_bound(self.env.rendezvous_outage),
        )
    }

    /// `create_job`: creates the job at the rendezvous `create` names, or
    /// this agent's own, with this agent's credentials.
    pub async fn create_at_rendezvous(&self, create: CreateJob) -> Result<CreateJobResponse, AgentError> {
        let url = create
            .rendezvous
            .or_else(|| self.env.rendezvous.clone())
            .ok_or(RendezvousError::NoRendezvous)?;
        let rendezvous = self.rendezvous_at(&url)?;
        let mut config =
            JobConfig::new(create.job_id.clone(), create.num_slots).with_max_attempts(create.max_attempts);
        config.gang_timeout = create.gang_timeout_ms.map(std::time::Duration::from_millis);
        let attempt = rendezvous
            .create_job(&config)
            .await
            .map_err(|e| AgentError::rendezvous(&url, e))?;
        Ok(CreateJobResponse {
            job_id: create.job_id,
            attempt,
            rendezvous: url,
        })
    }

    /// The models jobs on this agent can name.
    pub fn models(&self) -> &crate::models::kindling_model::ModelRegistry {
        &self.env.models
    }

    /// Starts a job (idempotent for the same spec while it runs; a finished
    /// job with the same id is replaced). A job the rendezvous does not know
    /// is refused at once (NOT_FOUND), before anything runs here.
    pub async fn start(&self, start: StartJob) -> Result<Arc<Job>, AgentError> {
        if let Some(running) = self.running(&start)? {
            return Ok(running);
        }
        let (device, initial) = self.runnable(&start)?;
        let rendezvous = self.rendezvous_at(&start.rendezvous)?;
        let at_rendezvous = match rendezvous.status(&start.job_id).await {
            Ok(status) => status,
            Err(e) if e.code() == Some(tonic::Code::NotFound) => {
                return Err(RendezvousError::NotAtRendezvous {
                    job_id: start.job_id,
                    rendezvous: start.rendezvous,
                }
                .into());
            }
            Err(e) => return Err(AgentError::rendezvous(&start.rendezvous, e)),
        };
        check_world(&start, &at_rendezvous)?;
        let mut jobs = self.lock();
        // Another start of the same job may have won while we asked.
        if let Some(running) = Self::running_in(&jobs, &start)? {
            return Ok(running);
        }
        let active = jobs.values().filter(|j| !j.lock().state.is_terminal()).count();
        if active >= self.env.max_jobs {
            return Err(LimitError::TooManyJobs {
                agent_id: self.env.agent_id.clone(),
                active,
                cap: self.env.max_jobs,
            }
            .into());
        }
        let rows = match start.spec.kind() {
            JobKind::Trial { dataset } => Some(self.dataset_for(&jobs, &start, dataset)?),
            JobKind::Train | JobKind::Dataset => None,
        };
        let job = Job::new(
            start.job_id,
            start.spec,
            start.rendezvous,
            at_rendezvous.incarnation(),
            device,
            self.env.clone(),
            self.cancel.child_token(),
        )
        .reading(rows)
        .starting_from(initial);
        Ok(self.launch(&mut jobs, job, at_rendezvous.attempt, rendezvous))
    }

    /// What this agent runs `start` with — its device's label and the
    /// initial weights — or why it cannot, before the job gangs: a GPU it
    /// lacks, a model it does not have or a config it refuses, initial
    /// weights that are not a weights table (whether they fit the model is
    /// known once the first batch gives the layout).
    fn runnable(&self, start: &StartJob) -> Result<(String, Option<arrow::array::RecordBatch>), AgentError> {
        let device = crate::models::backend::label(&start.spec)?;
        self.env.models.check(&start.spec)?;
        let initial = start.initial_table().map_err(|e| {
            AgentError::from(crate::error::ModelError::Table(format!("initial_weights: {e}")))
        })?;
        Ok((device, initial))
    }

    /// Puts `job` in the agent's table and runs its lifecycle task, which
    /// joins its gang (from `attempt`, the rendezvous' current one).
    fn launch(
        &self,
        jobs: &mut HashMap<String, Arc<Job>>,
        job: Job,
        attempt: u32,
        rendezvous: RendezvousClient,
    ) -> Arc<Job> {
        self.env.inbox.set_incarnation(&job.job_id, job.incarnation);
        let job = Arc::new(job);
        Job::lend_rows(&job);
        // Until it joins, the job reports the attempt it will join (from 1).
        job.lock().attempt = attempt.max(1);
        jobs.insert(job.job_id.clone(), job.clone());
        // All of the job's work logs under its span, with the trace id of
        // the `fit` that started it; its calls to the rendezvous carry it on.
        let span =
            tracing::info_span!(parent: None, "job", job = %job.job_id, trace_id = tracing::field::Empty);
        let run = job.clone().run(rendezvous).instrument(span.clone());
        match TraceContext::current() {
            Some(trace) => {
                span.record("trace_id", trace.trace_id());
                self.tracker.spawn(trace.scope(run));
            }
            None => {
                self.tracker.spawn(run);
            }
        }
        job
    }

    /// `keep_rows`: writes the job's rows to this agent's disk once both
    /// splits ended (a detached job's, so the agent restarted on its node
    /// takes its place again). Idempotent: a job kept already answers what
    /// it kept, until a split is reopened (rows handed over to an agent
    /// that joined the job): the next call writes the copy again.
    pub async fn keep_rows(&self, job_id: &str) -> Result<KeepRowsResponse, AgentError> {
        let job = self.get(job_id)?;
        // One copy at a time: a repeated call waits for the first's.
        let _one = self.keeping.lock().await;
        if let Some(k) = job.kept.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            return Ok(k.answer.clone());
        }
        let snap = kept::snapshot(&job)?;
        let (root, disk) = (self.env.kept_dir.clone(), self.env.disk.clone());
        let k = tokio::task::spawn_blocking(move || kept::write(&root, snap, &disk))
            .await
            .map_err(AgentError::panicked("keep_rows"))??;
        let response = k.answer.clone();
        tracing::info!(job = %job_id, rows = response.rows, bytes = response.bytes, "rows kept on disk");
        *job.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(k);
        Ok(response)
    }

    /// Takes back the detached jobs whose rows this agent kept before it
    /// restarted: each still running at its rendezvous (the same
    /// incarnation) starts again here from its kept rows and joins its
    /// next attempt; the attempt the agent was in when its process ended is
    /// reported failed first, so its members re-join at once. A job that
    /// ended meanwhile, or a copy that does not read back whole, is removed.
    pub async fn restore_kept(self: Arc<Self>) {
        let mut pending = kept::list(&self.env.kept_dir);
        let mut backoff = Duration::from_secs(1);
        while !pending.is_empty() {
            let mut again = Vec::new();
            for (dir, read) in pending {
                let outcome = match read {
                    Ok(record) => match self.restore(&dir, &record).await {
                        // Its rendezvous did not answer: the copy stays, asked again.
                        Err(e) if e.is_retryable() => {
                            tracing::warn!(dir = %dir.display(), error = %e, retry_in = ?backoff, "kept rows not taken back yet");
                            again.push((dir, Ok(record)));
                            continue;
                        }
                        outcome => outcome,
                    },
                    Err(e) => Err(e.into()),
                };
                match outcome {
                    Ok(Some(job_id)) => {
                        tracing::info!(job = %job_id, "detached job taken back from its kept rows")
                    }
                    Ok(None) => {
                        tracing::info!(dir = %dir.display(), "kept rows of a job that ended removed");
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "kept rows not taken back: removed");
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                }
            }
            pending = again;
            if !pending.is_empty() {
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }

    /// Starts the kept job `record` (its rows in `dir`) again if it still
    /// runs at its rendezvous; `None` if it ended there.
    async fn restore(&self, dir: &Path, record: &kept::KeptRecord) -> Result<Option<String>, AgentError> {
        let start = &record.start;
        let rendezvous = self.rendezvous_at(&start.rendezvous)?;
        let status = match rendezvous.status(&start.job_id).await {
            Ok(status) => status,
            Err(e) if e.code() == Some(tonic::Code::NotFound) => return Ok(None),
            Err(e) => return Err(AgentError::rendezvous(&start.rendezvous, e)),
        };
        if status.state.is_terminal() || status.incarnation() != record.incarnation {
            return Ok(None);
        }
        if self.lock().contains_key(&start.job_id) {
            // Started again from outside meanwhile: that one stands.
            return Ok(Some(start.job_id.clone()));
        }
        // Every call that can fail comes first: a job built on the kept
        // files removes them when it is dropped.
        let (device, initial) = self.runnable(start)?;
        let agent_id = &self.env.agent_id;
        if status.state == kindling_schemas::rendezvous::JobState::Running
            && status.members.contains(agent_id)
        {
            // Its peers wait on the process that ended until its lease lapses or
            // their ring times out: said now instead.
            let cause = format!("agent `{agent_id}` restarted: its process ended");
            rendezvous
                .report_failure(&start.job_id, status.attempt, agent_id, &cause)
                .await
                .map_err(|e| AgentError::rendezvous(&start.rendezvous, e))?;
        }
        let mut job = Job::new(
            start.job_id.clone(),
            start.spec.clone(),
            start.rendezvous.clone(),
            record.incarnation,
            device,
            self.env.clone(),
            self.cancel.child_token(),
        )
        .starting_from(initial);
        kept::restore_into(&mut job, dir, record, &self.env.disk)?;
        *job.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept::Kept::restored(record));
        let mut jobs = self.lock();
        Ok(Some(
            self.launch(&mut jobs, job, status.attempt, rendezvous)
                .job_id
                .clone(),
        ))
    }

    /// The dataset job `start` reads its rows from: on this agent, holding
    /// rows, not ended, and carrying the columns the job's spec names.
    fn dataset_for(
        &self,
        jobs: &HashMap<String, Arc<Job>>,
        start: &StartJob,
        dataset: &str,
    ) -> Result<Arc<Job>, AgentError> {
        let refuse = |reason: String| {
            AgentError::from(JobStateError::Dataset {
                job_id: start.job_id.clone(),
                dataset: dataset.to_owned(),
                reason,
            })
        };
        let Some(held) = jobs.get(dataset) else {
            return Err(JobStateError::NoDataset {
                job_id: start.job_id.clone(),
                dataset: dataset.to_owned(),
                agent_id: self.env.agent_id.clone(),
            }
            .into());
        };
        if held.spec.kind() != JobKind::Dataset {
            return Err(refuse(
                "that job trains; only a job started with `holds_rows` lends its rows".into(),
            ));
        }
        let state = held.lock().state;
        if state.is_terminal() {
            return Err(refuse(format!(
                "the dataset's job is {} on this agent: its rows are gone",
                format!("{state:?}").to_lowercase()
            )));
        }
        let (want, have) = (start.spec.columns(), held.spec.columns());
        if want != have {
            return Err(refuse(format!(
                "the job's columns {want:?} are not the dataset's {have:?}"
            )));
        }
        if start.spec.inputs != held.spec.inputs {
            return Err(refuse(
                "the job declares its inputs' types unlike the dataset".into(),
            ));
        }
        Ok(held.clone())
    }

    /// The job `start` names if it runs already with the same spec and
    /// rendezvous; an error if it runs with others.
    fn running(&self, start: &StartJob) -> Result<Option<Arc<Job>>, AgentError> {
        Self::running_in(&self.lock(), start)
    }

    fn running_in(
        jobs: &HashMap<String, Arc<Job>>,
        start: &StartJob,
    ) -> Result<Option<Arc<Job>>, AgentError> {
        let Some(existing) = jobs.get(&start.job_id) else {
            return Ok(None);
        };
        let state = existing.lock().state;
        if state.is_terminal() {
            return Ok(None);
        }
        if existing.spec == start.spec && existing.rendezvous == start.rendezvous {
            return Ok(Some(existing.clone()));
        }
        Err(JobStateError::WrongState {
            job_id: start.job_id.clone(),
            state: format!("{state:?}").to_lowercase(),
            reason: "it is running with a different spec or rendezvous; cancel it first".into(),
        }
        .into())
    }

    /// A job by id.
    pub fn get(&self, job_id: &str) -> Result<Arc<Job>, AgentError> {
        self.lock()
            .get(job_id)
            .cloned()
            .ok_or_else(|| JobStateError::UnknownJob(job_id.to_owned()).into())
    }

    /// Removes the jobs that have been finished or cancelled for longer than
    /// the retention: their status, cached rows, spill files and
    /// checkpoints. `ended` remembers when each was first seen ended (a job
    /// started again under the same id starts afresh). Returns the removed ids.
    pub fn reap_finished(&self, ended: &mut HashMap<String, (Arc<Job>, Instant)>) -> Vec<String> {
        let now = Instant::now();
        let mut removed = Vec::new();
        let mut trash = Vec::new();
        {
            let mut jobs = self.lock();
            ended.retain(|id, (job, _)| jobs.get(id).is_some_and(|j| Arc::ptr_eq(j, job)));
            for (id, job) in jobs.iter() {
                if job.lock().state.is_terminal() {
                    ended.entry(id.clone()).or_insert_with(|| (job.clone(), now));
                }
            }
            ended.retain(|id, (job, since)| {
                if now.duration_since(*since) < self.env.finished_retention {
                    return true;
                }
                jobs.remove(id);
                self.env.inbox.drop_incarnation(id, job.incarnation);
                job.lock().ingest.clear();
                // Moved aside while the id is still held: once the job is
                // unknown its files are gone from their place, and a job
                // started again under the id cannot lose its own to this.
                let kept = self.env.kept_dir.join(id);
                for dir in [
                    self.env.checkpoint_dir.join(id),
                    self.env.spill_dir.join(id),
                    kept,
                ] {
                    let aside = dir.with_file_name(format!(".removing-{id}-{}", uuid::Uuid::new_v4()));
                    match std::fs::rename(&dir, &aside) {
                        Ok(()) => trash.push((id.clone(), aside)),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        // Removed in place below (which says why if it cannot be).
                        Err(_) => trash.push((id.clone(), dir)),
                    }
                }
                removed.push(id.clone());
                false
            });
        }
        for (id, dir) in trash {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(job = %id, dir = %dir.display(), error = %e, "could not remove a finished job's files");
            }
        }
        for id in &removed {
            tracing::info!(job = %id, "finished job removed after its retention");
        }
        removed
    }

    /// Runs [`reap_finished`](Self::reap_finished) until `stop` fires.
    pub async fn reap_finished_until(self: Arc<Self>, stop: CancellationToken) {
        let every =
            (self.env.finished_retention / 4).clamp(Duration::from_millis(50), Duration::from_secs(60));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ended = HashMap::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => { self.reap_finished(&mut ended); }
            }
        }
    }

    /// `issue_credential`: a credential signed with this agent's key, for
    /// the job's current incarnation (the job on this agent, else at this
    /// agent's rendezvous; a served model's reader names its version).
    pub async fn issue_credential(&self, i: &IssueCredential) -> Result<CredentialResponse, AgentError> {
        let keys = self
            .env
            .credentials
            .as_ref()
            .ok_or_else(|| JobStateError::NoCredentialKey {
                agent_id: self.env.agent_id.clone(),
            })?;
        let mut claims = Claims::expiring(&i.job_id, i.role, Duration::from_secs(i.ttl_secs));
        claims.incarnation = Some(self.incarnation(&i.job_id).await?);
        Ok(CredentialResponse {
            credential: keys.sign(&claims),
            job_id: claims.job_id,
            role: claims.role,
            expires: claims.expires,
        })
    }

    /// The incarnation a credential for `job_id` must name: the job's on
    /// this agent, else the version of the model this agent serves under
    /// that id, else the rendezvous' (a job not started here yet).
    async fn incarnation(&self, job_id: &str) -> Result<u64, AgentError> {
        if let Ok(job) = self.get(job_id) {
            return Ok(job.incarnation);
        }
        if let Some(served) = self.served.get(job_id) {
            return Ok(served.incarnation);
        }
        let url = self
            .env
            .rendezvous
            .clone()
            .ok_or_else(|| JobStateError::UnknownJob(job_id.to_owned()))?;
        let status = self
            .rendezvous_at(&url)?
            .status(job_id)
            .await
            .map_err(|e| AgentError::rendezvous(&url, e))?;
        Ok(status.incarnation())
    }

    /// A slot for one more `DoPut` or `DoExchange` stream of `caller`, held
    /// until the slot is dropped: a job credential has at most
    /// [`MAX_STREAMS_PER_CREDENTIAL`] open on this agent (the operator no cap
    /// but each connection's).
    pub fn stream_slot(&self, caller: &kindling_schemas::auth::Caller) -> Result<StreamSlot, AgentError> {
        let kindling_schemas::auth::Caller::Job(claims) = caller else {
            return Ok(StreamSlot(None));
        };
        let key = (claims.job_id.clone(), claims.role.to_string(), claims.incarnation);
        let mut open = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(key.clone()).or_default();
        if *count >= MAX_STREAMS_PER_CREDENTIAL {
            return Err(LimitError::TooManyStreams {
                job_id: claims.job_id.clone(),
                role: claims.role,
                cap: MAX_STREAMS_PER_CREDENTIAL,
            }
            .into());
        }
        *count += 1;
        Ok(StreamSlot(Some((self.streams.clone(), key))))
    }

    /// Every job.
    pub fn all(&self) -> Vec<Arc<Job>> {
        self.lock().values().cloned().collect()
    }
}

/// A job's incarnation: when the rendezvous created it, in Unix milliseconds.
/// The spec's world must be the job's: the same `num_slots`, or another
/// for a job the client resized after an attempt ended (its spec keeps the
/// size it was created with; a job shrinks only after a failed attempt, and
/// a growth ends the running one).
fn check_world(start: &StartJob, job: &kindling_schemas::rendezvous::JobStatus) -> Result<(), AgentError> {
    let (spec, at) = (start.spec.num_slots, job.num_slots);
    let resized = !job.failures.is_empty();
    if spec == at || resized {
        return Ok(());
    }
    Err(RendezvousError::WorldMismatch {
        job_id: start.job_id.clone(),
        spec,
        job: at,
        hint: " and has not been resized (no attempt ended)",
    }
    .into())
}
