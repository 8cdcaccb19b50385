//! `fit`: gang the agents, stream the DataFrame into them exactly once, follow
//! training, replace lost agents, and fetch the model.

use std::time::Instant;

use arrow::datatypes::SchemaRef;
use futures::future::BoxFuture;
use kindling_schemas::action::{AgentJobState, AgentJobStatus};
use kindling_schemas::descriptor::Split;
use kindling_schemas::rendezvous::{AgentInfo, JobConfig, JobState, RendezvousClient};
use kindling_schemas::schema::{self, StreamKind};
use kindling_schemas::trace::TraceContext;
use tracing::Instrument as _;

use super::progress::{Reporter, TrainingEvent};
use super::recover::{Follow, Holders};
use super::split;
use super::target::{Target, pick_agents};
use super::tracking::{Tracker, TrackerHandle};
use super::watched::{QUIET, Watched};
use super::{Feed, JobError, TrainedModel, TrainingJob};
use crate::feed::push::{self, Placements, PushCtx};
use crate::feed::relay::{self, Rows, SparkRows, Window};
use crate::feed::{AgentClient, PushedPartition};
#[cfg(feature = "local")]
use crate::local::{LocalCluster, LocalClusterConfig};
use crate::spark::{DataFrame, RecordBatchStream};

/// What [`TrainingJob::prepare`] gives: the splits (or why they cannot be
/// planned), the layout, the persisted query.
pub(super) type Prepared<'a> = (
    Result<(Rows<'a>, Option<Rows<'a>>), JobError>,
    schema::FeatureLayout,
    Option<DataFrame>,
);

/// Where a job's rows come from.
#[derive(Clone, Copy)]
pub(super) enum Source<'r, 'a> {
    /// Fed to the job: the train rows, and the eval rows if any.
    Fed(&'r Rows<'a>, Option<&'r Rows<'a>>),
    /// A dataset held on the agents (a search's trial).
    Held(&'r super::search::Held),
}

/// Cancels the job at the rendezvous and on its agents unless disarmed, so a
/// client that goes away (error, cancelled future) leaves nothing running.
struct CancelGuard {
    rv: RendezvousClient,
    job_id: String,
    clients: Vec<AgentClient>,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rv = self.rv.clone();
        let job_id = self.job_id.clone();
        let clients = std::mem::take(&mut self.clients);
        handle.spawn(async move {
            const REASON: &str = "the client stopped";
            let _ = rv.cancel(&job_id, REASON).await;
            for c in clients {
                let _ = c.cancel_job(&job_id, REASON).await;
            }
        });
    }
}

impl TrainingJob {
    /// Trains on `df`: in local mode on a rendezvous and `num_slots` agents
    /// started in this process, otherwise on the cluster's agents.
    pub async fn fit(&self, df: &DataFrame) -> Result<TrainedModel, JobError> {
        self.fit_rows(Rows::Spark(SparkRows::whole(df.clone()))).await
    }

    /// Trains on Arrow batches that do not come from a Spark query (files read
    /// by the application, another service): `open` is called once per feed
    /// and again if a lost agent's shard must be re-sent, so it must yield the
    /// same rows each time. The batches must have exactly the feature and label
    /// columns, with `schema`. The evaluation split must be 0 (there is no
    /// query to split); hold out data yourself and score it with
    /// [`TrainedModel::predict_batch`]. Only the driver-relay feed applies.
    ///
    /// ```no_run
    /// # async fn demo(job: kindling::job::TrainingJob, batches: Vec<arrow::array::RecordBatch>)
    /// # -> Result<(), kindling::job::JobError> {
    /// use futures::FutureExt;
    /// let schema = batches[0].schema();
    /// let model = job
    ///     .fit_arrow(schema, || {
    ///         let batches = batches.clone();
    ///         async move {
    ///             let rows: kindling::spark::RecordBatchStream =
    ///                 Box::pin(futures::stream::iter(batches.into_iter().map(Ok)));
    ///             Ok(rows)
    ///         }
    ///         .boxed()
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn fit_arrow<F>(&self, schema: SchemaRef, open: F) -> Result<TrainedModel, JobError>
    where
        F: Fn() -> BoxFuture<'static, Result<RecordBatchStream, crate::spark::Error>> + Send + Sync,
    {
        self.fit_rows(Rows::Arrow { schema, open: &open }).await
    }

    async fn fit_rows(&self, rows: Rows<'_>) -> Result<TrainedModel, JobError> {
        #[cfg(feature = "local")]
        if self.placement.local_mode {
            let (cluster, dir) = self.start_local().await?;
            // The cluster ends here: nothing is left to serve the model.
            let result = self.run(Target::Local(&cluster), rows).await.map(|mut m| {
                m.serving = None;
                m
            });
            stop_local(cluster, &dir).await;
            return result;
        }
        self.run(self.remote(), rows).await
    }

    /// The cluster behind the job's rendezvous.
    pub(super) fn remote(&self) -> Target<'_> {
        Target::Remote {
            url: self.placement.rendezvous.as_deref().unwrap_or_default(),
            token: self.placement.token.clone(),
        }
    }

    /// A rendezvous and `num_slots` agents in this process, in a work dir
    /// of their own (local mode).
    #[cfg(feature = "local")]
    pub(super) async fn start_local(&self) -> Result<(LocalCluster, std::path::PathBuf), JobError> {
        let dir = self
            .placement
            .work_dir
            .join(uuid::Uuid::new_v4().simple().to_string());
        let mut config = LocalClusterConfig::new(&dir);
        // Without a token of the job's, the cluster keeps its generated one.
        if let Some(t) = &self.placement.token {
            config.token = Some(t.clone());
        }
        config.gang_timeout = self.recovery.gang_timeout;
        config.models = self.placement.models.clone();
        config.rendezvous_addr = self.placement.status_addr;
        let cluster = LocalCluster::start(self.spec.num_slots as usize, config).await?;
        Ok((cluster, dir))
    }

    /// Trains on an existing local cluster (its spare agents replace lost
    /// ones, and it grows when it has none). Lets tests inject faults.
    #[cfg(feature = "local")]
    pub async fn fit_on(&self, cluster: &LocalCluster, df: &DataFrame) -> Result<TrainedModel, JobError> {
        self.run(Target::Local(cluster), Rows::Spark(SparkRows::whole(df.clone())))
            .await
    }

    /// Runs the job, logged to MLflow when the job asks for it.
    async fn run(&self, target: Target<'_>, rows: Rows<'_>) -> Result<TrainedModel, JobError> {
        let tracker = match &self.reporting.mlflow {
            Some(m) => Some(Tracker::start(m, &self.spec)?),
            None => None,
        };
        // One trace per run: every call made in it carries the trace context,
        // so the agents' and the rendezvous' log lines of this job share its id.
        let trace = TraceContext::new_root();
        let span = tracing::info_span!("fit", trace_id = %trace.trace_id());
        let result = trace
            .scope(
                self.run_tracked(target, rows, tracker.as_ref().map(Tracker::handle))
                    .instrument(span),
            )
            .await;
        if let Some(tracker) = tracker {
            tracker.finish(&result).await;
        }
        result
    }

    async fn run_tracked(
        &self,
        target: Target<'_>,
        rows: Rows<'_>,
        tracking: Option<TrackerHandle>,
    ) -> Result<TrainedModel, JobError> {
        let mut reporter =
            Reporter::new(self.reporting.progress, self.reporting.events.clone()).tracked(tracking);
        // In local mode the in-process rendezvous serves the status page on
        // loopback; its link carries this run's own viewer token.
        #[cfg(feature = "local")]
        if let Target::Local(cluster) = &target {
            // The link with its token goes to a file of the user's, never to
            // the terminal or a log.
            let link = match cluster.status_page_link() {
                Ok(Some(path)) => format!(
                    " (open the link in {}: it holds the viewer token)",
                    path.display()
                ),
                Ok(None) => String::new(),
                Err(e) => format!(" (the link with its token could not be written: {e})"),
            };
            reporter.note(&format!("status page: {}/{link}", cluster.rendezvous_url()));
        }
        let job_id = self
            .job_id
            .clone()
            .unwrap_or_else(|| format!("kindling-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]));
        if let Some(trace) = TraceContext::current() {
            reporter.note(&format!(
                "trace id {} (on the agents' and the rendezvous' log lines of this job)",
                trace.trace_id()
            ));
        }

        // The data, checked before anything starts on the agents. A persisted
        // query is released at the end, whatever fails after it was persisted.
        let (rows, layout, cached) = self.prepare(rows).await?;
        let result = match rows {
            Ok((train_df, eval_df)) => {
                let source = Source::Fed(&train_df, eval_df.as_ref());
                self.train(target, source, layout, job_id, reporter).await
            }
            Err(e) => Err(e),
        };
        // The cached rows go on success and on failure alike.
        if let Some(df) = cached {
            let _ = df.unpersist(false).await;
        }
        result
    }

    /// The rows to feed, checked against the spec before anything starts
    /// on the agents: the train split and the eval split (or why they cannot
    /// be planned), the layout, and the persisted query to release at the
    /// end (whatever fails after it was persisted).
    pub(super) async fn prepare<'a>(&self, rows: Rows<'a>) -> Result<Prepared<'a>, JobError> {
        let spec = &self.spec;
        Ok(match rows {
            Rows::Spark(rows) => {
                let data = rows.df().select(spec.columns());
                let schema = data.schema().await?;
                let layout = schema::validate(&schema, spec, StreamKind::Train)?;
                // Split by a column, each row's eval mark is persisted with
                // it (the column itself need not be a feature).
                let data = match &spec.eval_split {
                    Some(split) => split::marked(rows.df(), spec, split).await?,
                    None => data,
                };
                let cached = match self.feeding.persist {
                    true => Some(data.persist(crate::spark::memory_and_disk()).await?),
                    false => None,
                };
                let data = cached.clone().unwrap_or(data);
                let splits = async {
                    if let Some(split) = &spec.eval_split {
                        split::check_marks(&data, split).await?;
                    }
                    self.split_and_plan(data, &schema, cached.is_some()).await
                }
                .await
                .map(|(train, eval)| (Rows::Spark(train), eval.map(Rows::Spark)));
                (splits, layout, cached)
            }
            Rows::Arrow { schema, open } => {
                if self.feeding.eval_fraction > 0.0 {
                    return Err(JobError::Setting {
                        setting: "eval_fraction",
                        reason: "fit_arrow has no query to split: set eval_fraction(0.0) and hold out data \
                                 yourself"
                            .into(),
                    });
                }
                if matches!(self.feeding.feed, Feed::ExecutorPush(_)) {
                    return Err(arrow_source_pushed());
                }
                let layout = schema::validate(&schema, spec, StreamKind::Train)?;
                (Ok((Rows::Arrow { schema, open }, None)), layout, None)
            }
        })
    }

    /// The training rows and the eval split of `data` (with `schema`; the
    /// eval marks too with a split column), each relayed in slices the Spark
    /// Connect server can hold when `data` is persisted and fed by the
    /// driver relay (executor push sends no rows through the server).
    async fn split_and_plan(
        &self,
        data: DataFrame,
        schema: &arrow::datatypes::Schema,
        persisted: bool,
    ) -> Result<(SparkRows, Option<SparkRows>), JobError> {
        let fraction = self.feeding.eval_fraction;
        let (train_df, eval_df) = match &self.spec.eval_split {
            Some(_) => {
                let (train, eval) = split::by_mark(&data, &self.spec);
                (train, Some(eval))
            }
            None if fraction > 0.0 => {
                let (train, eval) = split::random(data, fraction, self.spec.seed, persisted)?;
                (train, Some(eval))
            }
            None => (data, None),
        };
        let sliced = persisted && matches!(self.feeding.feed, Feed::DriverRelay);
        let relay = async |df: DataFrame| match sliced {
            true => relay::plan(df, schema, self.feeding.relay_slice_bytes).await,
            false => Ok(SparkRows::whole(df)),
        };
        let train = relay(train_df).await?;
        let eval = match eval_df {
            Some(df) => Some(relay(df).await?),
            None => None,
        };
        if train.queries() > 1 {
            tracing::info!(queries = train.queries(), "relaying the DataFrame in slices");
        }
        Ok((train, eval))
    }

    /// Everything after the data is checked: agents, feed, training, model.
    pub(super) async fn train(
        &self,
        target: Target<'_>,
        source: Source<'_, '_>,
        layout: schema::FeatureLayout,
        job_id: String,
        mut reporter: Reporter,
    ) -> Result<TrainedModel, JobError> {
        let spec = &self.spec;
        let n = spec.num_slots as usize;
        // Pretrained weights are checked against the model before anything
        // starts, so a file that does not fit trains nothing.
        let initial = self.initial_weights(&layout)?;
        let token = target.token();
        let rv = RendezvousClient::connect_with(target.rendezvous(), token.as_ref(), &self.placement.channel)
            .await?;
        let config = JobConfig {
            spec_summary: spec.summary(),
            // Survivors wait in the gang while a replacement is awaited.
            gang_timeout: Some(self.recovery.gang_timeout + self.recovery.replacement_wait),
            client_lease: Some(self.recovery.client_lease),
            ..JobConfig::new(job_id.clone(), spec.num_slots).with_max_attempts(self.recovery.max_attempts)
        };
        rv.create_job(&config).await?;
        // Renewed while this call runs; if the process dies, the job is
        // cancelled when the lease lapses (the guard below cannot run then).
        let _lease = rv.keep_job_leased(&job_id, self.recovery.client_lease);
        let mut guard = CancelGuard {
            rv: rv.clone(),
            job_id: job_id.clone(),
            clients: Vec::new(),
            armed: true,
        };
        // A trial trains where its dataset's rows are.
        let chosen = match source {
            Source::Fed(..) => pick_agents(&rv, &target, n, &[], spec.model.name()).await?,
            Source::Held(held) => held.agents(&rv).await?,
        };
        let mut holders = self.start_on(chosen, &job_id, &target, initial).await?;
        let mut placed = Placements::new();
        let feed = PushCtx {
            job_id: &job_id,
            token: token.as_ref(),
            local: target.is_local(),
        };
        guard.clients = holders.member_clients();
        reporter.emit(TrainingEvent::Started {
            job_id: job_id.clone(),
            agents: holders.clients.iter().map(|c| c.url().to_owned()).collect(),
        });
        let fed = match source {
            Source::Fed(train_df, eval_df) => {
                self.feed_splits(
                    &feed,
                    train_df,
                    eval_df,
                    &mut holders,
                    None,
                    &mut placed,
                    &mut reporter,
                )
                .await
            }
            Source::Held(_) => Ok(()),
        };
        if let Err(e) = fed {
            // Agents that refused more rows because the job failed (its spec
            // or input, found as training started) name the real cause at
            // the rendezvous.
            return Err(failed_at_rendezvous(&rv, &job_id).await.unwrap_or(e));
        }

        let mut seen_epochs = 0;
        let final_status = self
            .follow(
                &rv,
                &target,
                &feed,
                source,
                &mut holders,
                &mut guard,
                &mut placed,
                &mut reporter,
                &mut seen_epochs,
            )
            .await?;
        while seen_epochs < final_status.history.len() {
            reporter.emit(TrainingEvent::Epoch(final_status.history[seen_epochs].clone()));
            seen_epochs += 1;
        }
        let weights = holders.clients[0].fetch_model(&job_id).await?;
        let mut model = TrainedModel::from_weights(
            spec.clone(),
            job_id.clone(),
            &layout,
            final_status.history.clone(),
            weights,
            #[cfg(feature = "local")]
            &self.placement.models,
        )?;
        // With restore_best the agents returned the best epoch's weights.
        model.meta.best_epoch = final_status
            .best_epoch
            .filter(|_| spec.early_stopping.is_some_and(|s| s.restore_best));
        if let Some(epoch) = final_status.stopped_early {
            reporter.emit(TrainingEvent::EarlyStopped {
                epoch,
                best_epoch: final_status.best_epoch,
            });
        }
        model.serving = Some(target.serving(&self.placement.channel));
        guard.armed = false;
        reporter.emit(TrainingEvent::Finished {
            job_id: job_id.clone(),
        });
        Ok(model)
    }

    /// Starts the job on the `chosen` agents, each from the `initial`
    /// weights when the job has them.
    async fn start_on(
        &self,
        chosen: Vec<AgentInfo>,
        job_id: &str,
        target: &Target<'_>,
        initial: Option<std::sync::Arc<str>>,
    ) -> Result<Holders, JobError> {
        let token = target.token();
        let mut clients = Vec::with_capacity(chosen.len());
        for a in &chosen {
            let c = AgentClient::connect_with(&a.flight_address, token.as_ref(), &self.placement.channel)?;
            c.start_job_from(job_id, &self.spec, &target.rendezvous(), initial.as_deref())
                .await?;
            clients.push(c);
        }
        let ids = chosen.into_iter().map(|a| a.agent_id).collect();
        Ok(Holders::new(clients, ids).starting_from(initial))
    }

    /// Follows training to its end from the rendezvous's watch of the job,
    /// which carries what its agents report of it in their heartbeats: the
    /// agents' progress and logs as they change; an agent asked directly
    /// only when an attempt failed, when it has not been heard from for
    /// [`QUIET`], or once the job succeeded (for its final status). Lost
    /// agents are replaced (their shards fed again, or the gang shrunk).
    /// Returns the status of an agent that finished.
    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        rv: &RendezvousClient,
        target: &Target<'_>,
        feed: &PushCtx<'_>,
        source: Source<'_, '_>,
        holders: &mut Holders,
        guard: &mut CancelGuard,
        placed: &mut Placements,
        reporter: &mut Reporter,
        seen_epochs: &mut usize,
    ) -> Result<AgentJobStatus, JobError> {
        let job_id = feed.job_id.to_owned();
        let mut follow = Follow::new(rv.clone(), &job_id);
        let mut watch = Watched::new(&job_id);
        let mut check = tokio::time::interval(QUIET / 4);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ask = tokio::select! {
                event = follow.next() => {
                    let (status, reports) = event?;
                    watch.on_event(reporter, holders, &status, &reports, seen_epochs)?
                }
                _ = check.tick() => watch.quiet(holders),
            };
            if ask.is_empty() {
                continue;
            }
            let mut statuses = Vec::with_capacity(ask.len());
            let mut lost = Vec::new();
            for s in ask {
                let c = &holders.clients[s];
                match c.job_status(&job_id).await {
                    Ok(st) => statuses.push(st),
                    Err(e) if e.is_retryable() || e.code() == Some(tonic::Code::NotFound) => {
                        tracing::warn!(shard = s, agent = c.url(), error = %e, "agent lost");
                        lost.push(holders.agent_ids[s].clone());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            for st in &statuses {
                watch.heard_from(reporter, st)?;
            }
            if !lost.is_empty() {
                let recovery = self.reassign(rv, target, &job_id, holders, &lost).await?;
                guard.clients = holders.member_clients();
                let only = Some(recovery.resent.as_slice());
                match source {
                    Source::Fed(train_df, eval_df) => {
                        self.feed_splits(feed, train_df, eval_df, holders, only, placed, reporter)
                            .await?
                    }
                    // The dataset's own follower re-feeds its lost shards.
                    Source::Held(held) => held.recovered(&lost, self.recovery.replacement_wait).await?,
                }
                let attempt = match recovery.shrunk_to {
                    Some(world) => {
                        let attempt = self.shrink(rv, &job_id, world).await?;
                        reporter.emit(TrainingEvent::Shrunk {
                            lost: lost.clone(),
                            world_size: world,
                        });
                        attempt
                    }
                    None => rv.status(&job_id).await?.attempt,
                };
                reporter.emit(TrainingEvent::Recovering {
                    attempt,
                    resent_shards: recovery.resent,
                    lost: lost.clone(),
                });
                continue;
            }
            let members = holders.members().len();
            if statuses.len() == members && statuses.iter().all(|s| s.state == AgentJobState::Succeeded) {
                return Ok(statuses.into_iter().next().expect("a member"));
            }
        }
    }

    /// Feeds the eval split (if any), then the train split: every shard, or
    /// just those in `only`.
    #[allow(clippy::too_many_arguments)]
    async fn feed_splits(
        &self,
        ctx: &PushCtx<'_>,
        train: &Rows<'_>,
        eval: Option<&Rows<'_>>,
        holders: &mut Holders,
        only: Option<&[usize]>,
        placed: &mut Placements,
        reporter: &mut Reporter,
    ) -> Result<(), JobError> {
        if let Some(eval) = eval {
            self.feed_and_end(ctx, eval, Split::Eval, holders, only, placed, reporter)
                .await?;
        }
        self.feed_and_end(ctx, train, Split::Train, holders, only, placed, reporter)
            .await
    }

    /// Streams one split into its shards and signals the end of data, checking
    /// every shard's committed rows. `shards.only`: re-send just these shards.
    #[allow(clippy::too_many_arguments)]
    async fn feed_and_end(
        &self,
        ctx: &PushCtx<'_>,
        data: &Rows<'_>,
        split: Split,
        holders: &mut Holders,
        only: Option<&[usize]>,
        placed: &mut Placements,
        reporter: &mut Reporter,
    ) -> Result<(), JobError> {
        let shards = holders.shards(only);
        let spark_before = data.spark_bytes();
        let started = Instant::now();
        let (rows, agent_bytes, partitions) = match (&self.feeding.feed, data) {
            (Feed::DriverRelay, _) => {
                let window = Window {
                    window_bytes: self.feeding.window_bytes,
                    commit_bytes: self.feeding.commit_bytes,
                };
                let progress = |shard, rows, rows_per_sec| {
                    reporter.emit(TrainingEvent::Streamed {
                        split: split.as_str(),
                        shard,
                        rows,
                        rows_per_sec,
                    })
                };
                let (rows, bytes) =
                    relay::relay(ctx.job_id, &self.spec, data, split, shards, window, progress).await?;
                (rows, bytes, Vec::<PushedPartition>::new())
            }
            (Feed::ExecutorPush(opts), Rows::Spark(rows)) => {
                let (rows, partitions) = push::push(ctx, opts, rows.df(), split, shards, placed).await?;
                (rows, 0, partitions)
            }
            (Feed::ExecutorPush(_), Rows::Arrow { .. }) => return Err(arrow_source_pushed()),
        };
        // Each agent fed now ends the split holding the rows of all its shards.
        let fed = |s: usize| only.is_none_or(|o| o.contains(&s));
        holders.record(split, &rows, fed);
        for s in holders.members() {
            if holders.shards_of(&holders.agent_ids[s]).into_iter().any(fed) {
                let expected = holders.agent_rows(split, s);
                holders.clients[s]
                    .end_of_data(ctx.job_id, split, Some(expected))
                    .await?;
            }
        }
        let spark_bytes = data.spark_bytes() - spark_before;
        reporter.emit(TrainingEvent::Fed {
            split: split.as_str(),
            rows_per_shard: rows,
            feed: match self.feeding.feed {
                Feed::DriverRelay => "driver-relay",
                Feed::ExecutorPush(_) => "executor-push",
            },
            client_bytes: spark_bytes + agent_bytes,
            seconds: started.elapsed().as_secs_f64(),
            queries: data.queries(),
            partitions,
        });
        Ok(())
    }
}

/// Stops a local-mode cluster and removes its work dir.
#[cfg(feature = "local")]
pub(super) async fn stop_local(cluster: LocalCluster, dir: &std::path::Path) {
    cluster.shutdown().await;
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::debug!(dir = %dir.display(), error = %e, "could not remove the local work dir");
    }
}

/// `fit_arrow` with executor push: there is no DataFrame for the executors to push.
/// The job's failure as the rendezvous recorded it, if it failed there.
async fn failed_at_rendezvous(rv: &RendezvousClient, job_id: &str) -> Option<JobError> {
    let status = rv.status(job_id).await.ok()?;
    (status.state == JobState::Failed).then(|| JobError::TrainingFailed {
        job_id: job_id.to_owned(),
        cause: status.first_cause().unwrap_or("failed").to_owned(),
    })
}

fn arrow_source_pushed() -> JobError {
    JobError::Setting {
        setting: "feed",
        reason: "fit_arrow feeds from this process: executor push needs a DataFrame (use fit)".into(),
    }
}
