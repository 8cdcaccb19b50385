//! A job that outlives its client: [`TrainingJob::submit`] feeds every
//! shard, then detaches the job at the rendezvous (which drops its client
//! lease) and returns a [`JobHandle`]; the job trains on without the client.
//! A `JobHandle` made from the job's id, on any machine with the cluster's
//! credentials, follows it to its end ([`JobHandle::wait`]) and fetches its
//! model from the agents ([`JobHandle::fetch`]); while it follows, the job
//! grows by agents that join (`grow`).

mod grow;

use arrow::array::RecordBatch;
use kindling_schemas::action::{AgentJobState, AgentJobStatus};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::model_serving::{ModelCard, model_layout};
use kindling_schemas::rendezvous::{AgentInfo, JobState, JobStatus, RendezvousClient};
use kindling_schemas::trace::TraceContext;
use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::event::TrainingEvent;
use super::progress::Reporter;
use super::run::{Holders, Run, Seen, Watcher};
use super::source::Source;
use super::{JobError, ProgressMode, ServingCluster, TrainedModel, TrainingJob};
use crate::feed::AgentClient;
use crate::feed::relay::{Rows, SparkRows};
use crate::spark::DataFrame;

impl TrainingJob {
    /// Starts the job on the cluster's agents, feeds them `df`'s rows and
    /// returns once every shard is committed, leaving the job to train on
    /// without this process: the rendezvous no longer cancels it when the
    /// client goes away (it still does while the rows are being fed). The
    /// handle (or one made later from the job's id, anywhere) waits for the
    /// job and fetches its model.
    ///
    /// Before it detaches, every agent keeps its rows on its disk
    /// (`keep_rows`): an agent restarted on its node (its process killed,
    /// its container restarted) takes them back and its place in the job,
    /// which resumes from its last checkpoint. An agent lost for good (its
    /// node gone) fails the job once its attempts are spent: no client
    /// feeds its shard to another.
    ///
    /// A job that may grow (`max_slots` above `num_slots`) grows while a
    /// follower waits on it ([`JobHandle::wait`], `kindling wait`): at an
    /// epoch's end, an agent that registered meanwhile takes shards from
    /// the members, as under `fit`. With no follower it trains on as it is.
    /// Local mode (the agents live in this process) and MLflow tracking
    /// (which follows the job from its client) are refused.
    ///
    /// ```no_run
    /// # async fn demo(job: kindling::job::TrainingJob, df: kindling::DataFrame)
    /// # -> Result<(), kindling::job::JobError> {
    /// let handle = job.submit(&df).await?;
    /// println!("submitted {}", handle.job_id());
    /// // Later, from any process with the cluster's token:
    /// let handle = kindling::job::JobHandle::new(handle.job_id(), handle.rendezvous());
    /// handle.wait().await?;
    /// handle.fetch().await?.save("model")?;
    /// # Ok(()) }
    /// ```
    pub async fn submit(&self, df: &DataFrame) -> Result<JobHandle, JobError> {
        if self.placement.local_mode {
            return Err(JobError::Setting {
                setting: "local_mode",
                reason: "a detached job needs a cluster whose agents outlive this process: set \
                         rendezvous(..) (kindling train --rendezvous)"
                    .into(),
            });
        }
        if self.reporting.mlflow.is_some() {
            return Err(JobError::Setting {
                setting: "mlflow",
                reason: "MLflow tracking follows the job from its client: track with fit".into(),
            });
        }
        let trace = TraceContext::new_root();
        let span = tracing::info_span!("submit", trace_id = %trace.trace_id());
        trace.scope(self.submit_rows(df).instrument(span)).await
    }

    async fn submit_rows(&self, df: &DataFrame) -> Result<JobHandle, JobError> {
        let reporter = Reporter::new(self.reporting.progress, self.reporting.events.clone());
        let job_id = self.new_job_id();
        let (rows, layout, cached) = self.prepare(Rows::Spark(SparkRows::whole(df.clone()))).await?;
        let result = async {
            let (train, eval) = rows?;
            let initial = self.initial_weights(&layout)?;
            let source = Source::Fed(&train, eval.as_ref());
            let mut run = Run::start(self, self.remote(), source, job_id, reporter, initial).await?;
            run.feed_all().await?;
            run.detach().await
        }
        .await;
        // Every row is on the agents (or the job failed): Spark's copy goes.
        if let Some(df) = cached {
            let _ = df.unpersist(false).await;
        }
        result
    }

    /// A handle on `job_id` with this job's cluster, credentials and reporting.
    pub(super) fn handle(&self, job_id: String) -> JobHandle {
        JobHandle {
            job_id,
            rendezvous: self.placement.rendezvous.clone().unwrap_or_default(),
            token: self.placement.token.clone(),
            channel: self.placement.channel.clone(),
            progress: self.reporting.progress,
            events: self.reporting.events.clone(),
            #[cfg(feature = "local")]
            models: self.placement.models.clone(),
        }
    }
}

/// A job on a cluster, found by its id: what [`TrainingJob::submit`]
/// returns, or made with [`JobHandle::new`] from the id in another process
/// (the cluster's operator token suffices, as for `kindling status`).
///
/// ```no_run
/// # async fn demo(token: kindling_schemas::auth::Token) -> Result<(), kindling::job::JobError> {
/// use kindling::job::JobHandle;
/// let job = JobHandle::new("nightly-1", "https://rendezvous:7070").token(token);
/// let last = job.wait().await?;
/// println!("{} epochs", last.history.len());
/// job.fetch().await?.save("nightly-1")?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct JobHandle {
    job_id: String,
    rendezvous: String,
    token: Option<Token>,
    channel: ChannelConfig,
    progress: ProgressMode,
    events: Option<mpsc::Sender<TrainingEvent>>,
    #[cfg(feature = "local")]
    models: kindling_agent::ModelRegistry,
}

impl JobHandle {
    /// The job `job_id` at the rendezvous `rendezvous`; no call is made yet.
    pub fn new(job_id: impl Into<String>, rendezvous: impl Into<String>) -> Self {
        JobHandle {
            job_id: job_id.into(),
            rendezvous: rendezvous.into(),
            token: None,
            channel: ChannelConfig::default(),
            progress: ProgressMode::Auto,
            events: None,
            #[cfg(feature = "local")]
            models: kindling_agent::ModelRegistry::builtin(),
        }
    }

    /// The cluster's operator token.
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// TLS and timeouts of the calls to the rendezvous and the agents.
    pub fn channel(mut self, channel: ChannelConfig) -> Self {
        self.channel = channel;
        self
    }

    /// How [`wait`](Self::wait) shows progress.
    pub fn progress(mut self, mode: ProgressMode) -> Self {
        self.progress = mode;
        self
    }

    /// [`wait`](Self::wait) also sends its progress here.
    pub fn events(mut self, tx: mpsc::Sender<TrainingEvent>) -> Self {
        self.events = Some(tx);
        self
    }

    /// The models this process can build (a job of your own model: your
    /// registry), for [`fetch`](Self::fetch)'s model to predict here.
    #[cfg(feature = "local")]
    pub fn models(mut self, models: kindling_agent::ModelRegistry) -> Self {
        self.models = models;
        self
    }

    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The rendezvous of the job's cluster.
    pub fn rendezvous(&self) -> &str {
        &self.rendezvous
    }

    async fn connect(&self) -> Result<RendezvousClient, JobError> {
        Ok(
            RendezvousClient::connect_with(self.rendezvous.clone(), self.token.as_ref(), &self.channel)
                .await?,
        )
    }

    /// The job's state at the rendezvous.
    pub async fn status(&self) -> Result<JobStatus, JobError> {
        Ok(self.connect().await?.status(&self.job_id).await?)
    }

    /// Follows the job to its end, showing its progress as `fit` does, and
    /// returns the final status of one of its agents (every epoch's
    /// metrics), or the job's error when it failed or was cancelled.
    /// A job submitted with `max_slots` above `num_slots` grows meanwhile:
    /// at an epoch's end, an agent that registered since takes shards from
    /// the members (the job's rows move between agents; no query runs),
    /// and every member keeps its rows again. Dropping the future leaves
    /// the job running (between two calls of a move, the move is left
    /// half done: the job then fails once its gang times out).
    pub async fn wait(&self) -> Result<AgentJobStatus, JobError> {
        let rv = self.connect().await?;
        let mut reporter = Reporter::new(self.progress, self.events.clone());
        let mut watcher = Watcher::new(rv.clone(), &self.job_id);
        // The members the rendezvous names (in which attempt: a member
        // restarted on its node may serve at another address), and those
        // of them that are live.
        let mut named: (u32, Vec<String>) = (0, Vec::new());
        let mut members: Option<Holders> = None;
        let mut succeeded = false;
        let mut seen_epochs = 0;
        // Until the job is found unable to grow (as many shards as members).
        let mut may_grow = true;
        loop {
            let epochs = seen_epochs;
            let ask = match watcher.next().await? {
                Seen::Event(status, reports) => {
                    if matches!(status.state, JobState::Failed | JobState::Cancelled) {
                        return Err(self.failed(&status));
                    }
                    succeeded = status.state == JobState::Succeeded;
                    if !status.members.is_empty() && (status.attempt, &status.members) != (named.0, &named.1)
                    {
                        named = (status.attempt, status.members.clone());
                        members = self.live_members(&rv.list_agents().await?, &named.1)?;
                    }
                    match &members {
                        Some(h) => {
                            watcher
                                .watched
                                .on_event(&mut reporter, h, &status, &reports, &mut seen_epochs)?
                        }
                        None => Vec::new(),
                    }
                }
                Seen::Check => members
                    .as_ref()
                    .map(|h| watcher.watched.quiet(h))
                    .unwrap_or_default(),
            };
            // An epoch ended: an agent that joined meanwhile joins now.
            if may_grow && ask.is_empty() && seen_epochs > epochs && !succeeded {
                may_grow = self
                    .grow_if_joined(&rv, &named.1, &mut reporter, seen_epochs)
                    .await?;
            }
            let Some(holders) = &members else { continue };
            for s in ask {
                let c = &holders.clients[s];
                match c.job_status(&self.job_id).await {
                    Ok(st) => {
                        watcher.watched.heard_from(&mut reporter, &st)?;
                        if succeeded && st.state == AgentJobState::Succeeded {
                            for m in st.history.iter().skip(seen_epochs) {
                                reporter.emit(TrainingEvent::Epoch(m.clone()));
                            }
                            reporter.emit(TrainingEvent::Finished {
                                job_id: self.job_id.clone(),
                            });
                            return Ok(st);
                        }
                    }
                    // The rendezvous' state decides whether the job goes on.
                    Err(e) => tracing::debug!(agent = c.url(), error = %e, "a member did not answer"),
                }
            }
        }
    }

    /// The trained model, from one of the job's agents (which keep it for
    /// their finished-job retention), as `fit` returns it: its spec, every
    /// epoch's metrics, its weights; served by the job's cluster for
    /// `transform`. The job must have succeeded.
    pub async fn fetch(&self) -> Result<TrainedModel, JobError> {
        let rv = self.connect().await?;
        let status = rv.status(&self.job_id).await?;
        match status.state {
            JobState::Succeeded => {}
            JobState::Failed | JobState::Cancelled => return Err(self.failed(&status)),
            state => {
                return Err(JobError::NotFinished {
                    job_id: self.job_id.clone(),
                    state: state.as_str(),
                });
            }
        }
        let agents = rv.list_agents().await?;
        let mut answers = Vec::new();
        for id in &status.members {
            let Some(agent) = agents.iter().find(|a| &a.agent_id == id) else {
                answers.push(format!("{id}: not live"));
                continue;
            };
            match self.fetch_from(agent).await {
                Ok(model) => return Ok(model),
                Err(e) => answers.push(format!("{id}: {e}")),
            }
        }
        Err(JobError::ModelGone {
            job_id: self.job_id.clone(),
            reason: answers.join("; "),
        })
    }

    /// The model from `agent`: its final status, its weights with the card
    /// that makes them a model here.
    async fn fetch_from(&self, agent: &AgentInfo) -> Result<TrainedModel, JobError> {
        let c = AgentClient::connect_with(&agent.flight_address, self.token.as_ref(), &self.channel)?;
        let last = c.job_status(&self.job_id).await?;
        let table = c.fetch_model_with_card(&self.job_id).await?;
        let card = match ModelCard::from_schema(&table.schema()) {
            Some(Ok(card)) => card,
            Some(Err(e)) => return Err(self.no_card(agent, format!("its model card is not valid JSON: {e}"))),
            None => return Err(self.no_card(agent, "its weights came without a model card".into())),
        };
        if card.job_id != self.job_id {
            return Err(self.no_card(agent, format!("its model card names job `{}`", card.job_id)));
        }
        // The weights as `fit` gets them: the card is not part of the table.
        let schema = table
            .schema()
            .as_ref()
            .clone()
            .with_metadata(arrow::datatypes::Metadata::default());
        let weights = RecordBatch::try_new(std::sync::Arc::new(schema), table.columns().to_vec())
            .map_err(|e| self.no_card(agent, e.to_string()))?;
        let layout = model_layout(&card.spec, &card.inputs, card.input_dim);
        let restore_best = card.spec.early_stopping.is_some_and(|s| s.restore_best);
        let mut model = TrainedModel::from_weights(
            card.spec,
            self.job_id.clone(),
            &layout,
            last.history,
            weights,
            #[cfg(feature = "local")]
            &self.models,
        )?;
        model.meta.best_epoch = last.best_epoch.filter(|_| restore_best);
        model.serving = Some(ServingCluster {
            rendezvous: self.rendezvous.clone(),
            token: self.token.clone(),
            channel: self.channel.clone(),
            local: false,
        });
        Ok(model)
    }

    /// The job's members (`ids`) that are live among `agents`, as a run's
    /// holders; `None` when none is.
    fn live_members(&self, agents: &[AgentInfo], ids: &[String]) -> Result<Option<Holders>, JobError> {
        let mut clients = Vec::new();
        let mut live = Vec::new();
        for id in ids {
            if let Some(a) = agents.iter().find(|a| &a.agent_id == id) {
                clients.push(AgentClient::connect_with(
                    &a.flight_address,
                    self.token.as_ref(),
                    &self.channel,
                )?);
                live.push(id.clone());
            }
        }
        Ok((!live.is_empty()).then(|| Holders::new(clients, live)))
    }

    fn failed(&self, status: &JobStatus) -> JobError {
        let cause = status.first_cause().or(status.cancel_reason.as_deref());
        JobError::TrainingFailed {
            job_id: self.job_id.clone(),
            cause: cause.unwrap_or("cancelled").to_owned(),
        }
    }

    fn no_card(&self, agent: &AgentInfo, reason: String) -> JobError {
        JobError::ModelCard {
            job_id: self.job_id.clone(),
            agent: agent.agent_id.clone(),
            reason,
        }
    }
}
