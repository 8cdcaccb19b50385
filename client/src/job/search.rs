//! `TrainingJob::search`: the rows fed once into a dataset job on the
//! agents, then many trials — ordinary jobs, each with its own options,
//! attempts and checkpoints — that train on those rows, several at once,
//! the weak ones stopped at rungs by ASHA. Rooms: `space` (the options and
//! their values) · `asha` (the scheduler) · `results` (what a search
//! returns) · this file (running a search); the dataset as the client
//! follows it is `super::source`'s.

mod asha;
mod results;
mod space;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use futures::StreamExt as _;
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::{JobKind, JobSpec, Metric};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

pub use asha::Decision;
use results::TrialRun;
pub use results::{SearchResult, TrialOutcome, TrialResult};
pub use space::{ALIASES as SPACE_ALIASES, Dimension, SearchSpace, Values as SpaceValues};

use super::event::TrainingEvent;
use super::progress::{ProgressMode, Reporter};
use super::source::{Held, HeldState, Source, follow_dataset};
use super::target::Target;
#[cfg(feature = "local")]
use super::target::stop_local;
use super::tracking::{RunId, Tracker};
use super::{JobError, TrainingJob};
use crate::feed::AgentClient;
use crate::feed::relay::{Rows, SparkRows};
#[cfg(feature = "local")]
use crate::local::LocalCluster;
use crate::spark::DataFrame;

/// How a search schedules its trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    /// Every trial trains all its epochs.
    RunAll,
    /// Asynchronous successive halving: at rungs of `grace_epochs · reductionᵏ`
    /// epochs a trial goes on only if its metric is in the best
    /// `1/reduction` of what earlier trials recorded there.
    Asha {
        /// The first rung (epochs every trial trains).
        grace_epochs: u32,
        /// η: the share kept at each rung is 1/η (at least 2).
        reduction: u32,
    },
}

/// A search over a job's options ([`TrainingJob::search`]).
///
/// ```
/// use kindling::job::{Scheduler, Search, SearchSpace};
/// let search = Search::new(SearchSpace::new().log_uniform("lr", 1e-4, 1e-1).choice("batch_size", [32, 64]))
///     .trials(8)
///     .asha(1, 3)
///     .parallel(4);
/// assert_eq!(search.scheduler, Scheduler::Asha { grace_epochs: 1, reduction: 3 });
/// ```
#[derive(Debug, Clone)]
pub struct Search {
    /// The options searched.
    pub space: SearchSpace,
    /// Trials drawn at random; `None`: every combination of a grid.
    pub count: Option<usize>,
    /// Seed of the random draws.
    pub seed: u64,
    /// All to the end, or ASHA.
    pub scheduler: Scheduler,
    /// The metric that ranks trials (default: early stopping's, else
    /// `eval_loss` with an eval split, else `train_loss`).
    pub metric: Option<Metric>,
    /// Trials training at once (each on every agent of the dataset).
    pub parallel: usize,
}

impl Search {
    /// A grid over `space`, every trial to the end, two at once.
    pub fn new(space: SearchSpace) -> Self {
        Search {
            space,
            count: None,
            seed: 0,
            scheduler: Scheduler::RunAll,
            metric: None,
            parallel: 2,
        }
    }

    /// Draws `n` trials at random instead of a grid.
    pub fn trials(mut self, n: usize) -> Self {
        self.count = Some(n);
        self
    }

    /// The seed of the draws.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// ASHA with its first rung at `grace_epochs` and reduction `eta`.
    pub fn asha(mut self, grace_epochs: u32, eta: u32) -> Self {
        self.scheduler = Scheduler::Asha {
            grace_epochs,
            reduction: eta,
        };
        self
    }

    /// The metric that ranks trials.
    pub fn metric(mut self, metric: Metric) -> Self {
        self.metric = Some(metric);
        self
    }

    /// Trials training at once.
    pub fn parallel(mut self, n: usize) -> Self {
        self.parallel = n;
        self
    }
}

/// A search checked before anything is fed: each trial's options and spec.
struct Plan {
    trials: Vec<(BTreeMap<String, Value>, JobSpec)>,
    metric: Metric,
    scheduler: Scheduler,
    parallel: usize,
}

impl Plan {
    fn asha(&self) -> Option<asha::Asha> {
        let Scheduler::Asha {
            grace_epochs,
            reduction,
        } = self.scheduler
        else {
            return None;
        };
        let longest = self.trials.iter().map(|(_, s)| s.epochs).max().unwrap_or(1);
        Some(asha::Asha::new(
            grace_epochs,
            reduction,
            longest,
            self.metric.higher_is_better(),
        ))
    }
}

/// What every trial of a search shares.
struct TrialCtx<'a> {
    target: &'a Target<'a>,
    /// The search's one client of the rendezvous (trials stopped, the
    /// dataset's world asked and its job cancelled through it).
    rv: &'a RendezvousClient,
    held: &'a Held,
    layout: &'a FeatureLayout,
    metric: Metric,
    asha: Mutex<Option<asha::Asha>>,
    /// The search's MLflow run, once created.
    parent: Option<RunId>,
}

impl TrainingJob {
    /// Searches `search`'s space on `df`: the query runs once, its rows are
    /// fed once into a dataset on the agents (counted once against their
    /// memory), and every trial — this job with its options set — trains on
    /// them, `search.parallel` at once. A trial that fails does not stop the
    /// others; dropping the returned future cancels every trial and frees
    /// the dataset (a client that dies frees it when its lease lapses). A
    /// space that cannot work is refused before anything is fed.
    ///
    /// ```no_run
    /// # async fn demo(job: kindling::job::TrainingJob, df: kindling::DataFrame) -> Result<(), kindling::job::JobError> {
    /// use kindling::job::{Search, SearchSpace};
    /// let space = SearchSpace::new().log_uniform("lr", 1e-4, 1e-1).choice("hidden", [[32], [128]]);
    /// let result = job.search(&df, &Search::new(space).trials(8).asha(1, 3)).await?;
    /// println!("{}", result.table());
    /// let model = result.best_model().expect("a trial finished");
    /// # Ok(()) }
    /// ```
    pub async fn search(&self, df: &DataFrame, search: &Search) -> Result<SearchResult, JobError> {
        self.search_rows_of(Rows::Spark(SparkRows::whole(df.clone())), search)
            .await
    }

    /// [`search`](Self::search) on Arrow batches that do not come from a
    /// Spark query, as [`fit_arrow`](Self::fit_arrow) takes them: `open` is
    /// called once for the feed and again if a lost agent's shard must be
    /// fed again. With no query to split, the eval split must be 0, so the
    /// search ranks trials by `train_loss` unless told otherwise.
    pub async fn search_arrow<F>(
        &self,
        schema: arrow::datatypes::SchemaRef,
        open: F,
        search: &Search,
    ) -> Result<SearchResult, JobError>
    where
        F: Fn() -> futures::future::BoxFuture<
                'static,
                Result<crate::spark::RecordBatchStream, crate::spark::Error>,
            > + Send
            + Sync,
    {
        self.search_rows_of(Rows::Arrow { schema, open: &open }, search)
            .await
    }

    async fn search_rows_of(&self, rows: Rows<'_>, search: &Search) -> Result<SearchResult, JobError> {
        let plan = self.plan(search)?;
        #[cfg(feature = "local")]
        if self.placement.local_mode {
            let (cluster, dir) = self.start_local().await?;
            let result = self
                .run_search(Target::Local(&cluster), rows, plan)
                .await
                .map(|mut r| {
                    // The cluster ends here: nothing is left to serve the models.
                    let models = r.trials.iter_mut().filter_map(|t| t.model.as_mut());
                    models.for_each(|m| m.serving = None);
                    r
                });
            stop_local(cluster, &dir).await;
            return result;
        }
        self.run_search(self.remote(), rows, plan).await
    }

    /// [`search`](Self::search) on an existing local cluster (tests kill
    /// its agents).
    #[cfg(feature = "local")]
    pub async fn search_on(
        &self,
        cluster: &LocalCluster,
        df: &DataFrame,
        search: &Search,
    ) -> Result<SearchResult, JobError> {
        let plan = self.plan(search)?;
        let rows = Rows::Spark(SparkRows::whole(df.clone()));
        self.run_search(Target::Local(cluster), rows, plan).await
    }

    /// Checks `search` against this job as [`search`](Self::search) does
    /// first: every trial's options make a valid spec, the metric fits.
    pub fn check_search(&self, search: &Search) -> Result<(), JobError> {
        self.plan(search).map(|_| ())
    }

    /// Every trial's spec, checked; the metric; nothing fed yet.
    fn plan(&self, search: &Search) -> Result<Plan, JobError> {
        let setting = |setting, reason: String| JobError::Setting { setting, reason };
        if self.spec.kind() != JobKind::Train {
            return Err(setting(
                "search",
                "the job to search must train on its own rows".into(),
            ));
        }
        let eval = self.feeding.eval_fraction > 0.0;
        let metric = search
            .metric
            .or(self.spec.early_stopping.map(|e| e.monitor))
            .unwrap_or(if eval { Metric::EvalLoss } else { Metric::TrainLoss });
        if metric.needs_eval() && !eval {
            return Err(setting(
                "search metric",
                format!("{} needs an eval split: set eval_fraction above 0", metric.name()),
            ));
        }
        if search.parallel == 0 {
            return Err(setting(
                "search parallel",
                "at least 1 trial must train at a time".into(),
            ));
        }
        if let Scheduler::Asha { reduction, .. } = search.scheduler
            && reduction < 2
        {
            return Err(setting(
                "search asha",
                format!("reduction {reduction}: must be at least 2"),
            ));
        }
        let options = search.space.trials(search.count, search.seed)?;
        let trials = options
            .into_iter()
            .map(|o| search.space.apply(&self.spec, &o).map(|spec| (o, spec)))
            .collect::<Result<Vec<_>, _>>()?;
        search.space.check_taken(&trials)?;
        Ok(Plan {
            trials,
            metric,
            scheduler: search.scheduler,
            parallel: search.parallel,
        })
    }

    /// Prepares the rows, runs the search, releases the persisted query.
    async fn run_search(
        &self,
        target: Target<'_>,
        rows: Rows<'_>,
        plan: Plan,
    ) -> Result<SearchResult, JobError> {
        let search_id = self.job_id.clone().unwrap_or_else(|| {
            format!(
                "kindling-search-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            )
        });
        // MLflow: a run for the search, its trials' runs its children.
        let tracker = match &self.reporting.mlflow {
            Some(m) => Some(Tracker::start(m, &self.spec)?),
            None => None,
        };
        if let Some(t) = &tracker {
            t.handle().observe(&TrainingEvent::Started {
                job_id: search_id.clone(),
                agents: Vec::new(),
            });
        }
        let parent = tracker.as_ref().map(Tracker::run_id);
        let (rows, layout, cached) = self.prepare(rows).await?;
        let result = match rows {
            Ok((train, eval)) => {
                let rows = Source::Fed(&train, eval.as_ref());
                self.search_rows(target, rows, layout, (&search_id, parent), plan)
                    .await
            }
            Err(e) => Err(e),
        };
        if let Some(df) = cached {
            let _ = df.unpersist(false).await;
        }
        if let Some(t) = tracker {
            if let Ok(r) = &result {
                t.handle().tags(r.tags());
            }
            let best = result.as_ref().ok().and_then(SearchResult::best_model);
            t.finish_with(best, result.is_err()).await;
        }
        result
    }

    /// Feeds the dataset job and follows it while the trials train.
    async fn search_rows(
        &self,
        target: Target<'_>,
        rows: Source<'_, '_>,
        layout: FeatureLayout,
        (search_id, parent): (&str, Option<RunId>),
        plan: Plan,
    ) -> Result<SearchResult, JobError> {
        let started = Instant::now();
        let data_id = format!("{search_id}-data");
        let token = target.token();
        let rv =
            RendezvousClient::connect_with(&target.rendezvous(), token.as_ref(), &self.placement.channel)
                .await?;
        let mut holder = self.clone();
        holder.spec.set_kind(JobKind::Dataset);
        holder.job_id = Some(data_id.clone());
        holder.reporting.events = None;
        let (events, received) = mpsc::channel(1024);
        let (state_tx, state) = watch::channel(HeldState::default());
        let held = Held {
            job_id: data_id.clone(),
            state,
        };
        let reporter = Reporter::new(self.reporting.progress, Some(events));
        let hold = holder.train(target.clone(), rows, layout.clone(), data_id.clone(), reporter);
        // Ends when the dataset's follower (`hold`) drops its reporter.
        tokio::spawn(follow_dataset(received, state_tx, self.reporting.events.clone()));
        tokio::pin!(hold);
        let mut ready = held.state.clone();
        let trials = async {
            if ready.wait_for(|s| s.fed).await.is_err() {
                return None;
            }
            self.say(&format!(
                "dataset {data_id} fed; {} trial(s), {} at a time",
                plan.trials.len(),
                plan.parallel
            ));
            let ctx = TrialCtx {
                target: &target,
                rv: &rv,
                held: &held,
                layout: &layout,
                metric: plan.metric,
                asha: Mutex::new(plan.asha()),
                parent: parent.clone(),
            };
            Some(self.run_trials(&ctx, search_id, &plan).await)
        };
        let ended = |r: Result<super::TrainedModel, JobError>| match r {
            Err(e) => e,
            Ok(_) => JobError::TrainingFailed {
                job_id: data_id.clone(),
                cause: "the dataset's job ended before the search".into(),
            },
        };
        let trials = tokio::select! {
            r = &mut hold => return Err(ended(r)),
            t = trials => t,
        };
        // The dataset goes now, not when this future is dropped.
        self.drop_dataset(&target, &rv, &held).await;
        let trials = trials.ok_or_else(|| JobError::TrainingFailed {
            job_id: data_id.clone(),
            cause: "the dataset's follower ended before it was fed".into(),
        })?;
        let rungs = plan.asha().map(|a| a.rungs()).unwrap_or_default();
        Ok(SearchResult::new(plan.metric, trials, started.elapsed(), rungs))
    }

    /// Cancels the dataset's job at the rendezvous and on its agents.
    async fn drop_dataset(&self, target: &Target<'_>, rv: &RendezvousClient, held: &Held) {
        const REASON: &str = "the search ended";
        let token = target.token();
        let agents = held.agents(rv).await.unwrap_or_default();
        let _ = rv.cancel(&held.job_id, REASON).await;
        for a in agents {
            if let Ok(c) =
                AgentClient::connect_with(&a.flight_address, token.as_ref(), &self.placement.channel)
            {
                let _ = c.cancel_job(&held.job_id, REASON).await;
            }
        }
    }

    /// Runs every trial, `plan.parallel` at once; results in trial order.
    async fn run_trials(&self, ctx: &TrialCtx<'_>, search_id: &str, plan: &Plan) -> Vec<TrialResult> {
        let width = plan.trials.len().to_string().len().max(2);
        // The futures made first (not in a stream's closure), so a search
        // stays `Send` for `tokio::spawn`.
        let mut trials = Vec::with_capacity(plan.trials.len());
        for (i, (options, spec)) in plan.trials.iter().enumerate() {
            let job_id = format!("{search_id}-t{i:0width$}");
            let trial = (i, job_id);
            trials.push(self.run_trial(ctx, trial, options, spec));
        }
        let mut results: Vec<TrialResult> = futures::stream::iter(trials)
            .buffer_unordered(plan.parallel)
            .collect()
            .await;
        results.sort_by_key(|t| t.trial);
        results
    }

    /// One trial: this job with `options`, on the dataset's rows; its epochs
    /// go to the scheduler, which may stop it at a rung.
    async fn run_trial(
        &self,
        ctx: &TrialCtx<'_>,
        (trial, job_id): (usize, String),
        options: &BTreeMap<String, Value>,
        spec: &JobSpec,
    ) -> TrialResult {
        let TrialCtx {
            target,
            held,
            layout,
            metric,
            ref asha,
            ..
        } = *ctx;
        let started = Instant::now();
        let mut job = self.clone();
        job.spec = spec.clone();
        job.spec.set_kind(JobKind::Trial {
            dataset: &held.job_id,
        });
        job.job_id = Some(job_id.clone());
        job.reporting.events = None;
        // A dataset that shrank (no replacement for a lost agent) holds its
        // rows on fewer agents: a trial started since trains on those.
        if let Ok(dataset) = ctx.rv.status(&held.job_id).await
            && dataset.num_slots < job.spec.num_slots
        {
            job.spec.num_slots = dataset.num_slots;
        }
        let (events, mut received) = mpsc::channel(256);
        let tracker = self
            .reporting
            .mlflow
            .as_ref()
            .and_then(|m| Tracker::start_child(m, &job.spec, ctx.parent.clone()).ok());
        let reporter =
            Reporter::new(ProgressMode::Silent, Some(events)).tracked(tracker.as_ref().map(Tracker::handle));
        let shown = space::show(options);
        self.say(&format!("trial {trial} {shown}: started as {job_id}"));
        let training = job.train(
            target.clone(),
            Source::Held(held),
            layout.clone(),
            job_id.clone(),
            reporter,
        );
        tokio::pin!(training);
        let mut history = Vec::new();
        let mut stopped = None;
        let result = loop {
            tokio::select! {
                r = &mut training => break r,
                Some(event) = received.recv() => {
                    let TrainingEvent::Epoch(m) = event else { continue };
                    let value = m.get(metric);
                    history.push(m);
                    let (Some(value), None) = (value, stopped) else { continue };
                    let epoch = history.len() as u32;
                    let decision = asha
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_mut()
                        .map_or(Decision::Continue, |a| a.on_epoch(epoch, value));
                    self.say(&format!("trial {trial}: epoch {epoch} {} {value:.6}", metric.name()));
                    if let Decision::Stop { epoch, cutoff } = decision {
                        stopped = Some(epoch);
                        let why = format!(
                            "stopped by ASHA at epoch {epoch}: {} {value:.6} is not in the rung's best (cut {cutoff:.6})",
                            metric.name()
                        );
                        self.say(&format!("trial {trial}: {why}"));
                        self.stop_trial(ctx.rv, &job_id, &why).await;
                    }
                }
            }
        };
        let (model, error) = match result {
            Ok(model) => {
                history = model.history().to_vec();
                (Some(model), None)
            }
            Err(e) => (None, Some(e.to_string())),
        };
        let outcome = match (stopped, &model) {
            (Some(at_epoch), _) => TrialOutcome::Stopped { at_epoch },
            (None, Some(_)) => TrialOutcome::Finished,
            (None, None) => TrialOutcome::Failed,
        };
        if let Some(at) = stopped {
            history.truncate(at as usize);
        }
        let run = TrialRun {
            trial,
            job_id,
            options: options.clone(),
            outcome,
            error,
            history,
            elapsed: started.elapsed(),
            // A stopped trial's model is not the search's to offer.
            model: model.filter(|_| stopped.is_none()),
        };
        let result = TrialResult::new(run, metric);
        self.say(&format!("trial {trial} {shown}: {}", result.summary(metric)));
        if let Some(t) = tracker {
            if let TrialOutcome::Stopped { at_epoch } = result.outcome {
                t.handle()
                    .tags(vec![("kindling.stopped_at_epoch".into(), at_epoch.to_string())]);
            }
            t.finish_with(result.model.as_ref(), result.outcome == TrialOutcome::Failed)
                .await;
        }
        result
    }

    /// Cancels a trial at the rendezvous (its `train` then ends, and its
    /// agents drop it).
    async fn stop_trial(&self, rv: &RendezvousClient, job_id: &str, why: &str) {
        if let Err(e) = rv.cancel(job_id, why).await {
            tracing::warn!(job = job_id, error = %e, "could not stop the trial");
        }
    }

    /// A line of the search's progress, unless silent.
    fn say(&self, line: &str) {
        if self.reporting.progress != ProgressMode::Silent {
            eprintln!("[kindling] {line}");
        }
    }
}
