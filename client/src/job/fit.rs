//! `fit`: check the DataFrame against the spec, plan its splits, and run
//! the job on its agents (a [`Run`]: gang, feed exactly once, follow,
//! recover, fetch the model) — in local mode on a cluster of its own.

use arrow::datatypes::SchemaRef;
use futures::future::BoxFuture;
use kindling_schemas::schema::{self, StreamKind};
use kindling_schemas::trace::TraceContext;
use tracing::Instrument as _;

use super::progress::Reporter;
use super::run::Run;
use super::source::{Source, arrow_source_pushed};
use super::split;
use super::target::Target;
#[cfg(feature = "local")]
use super::target::stop_local;
use super::tracking::{Tracker, TrackerHandle};
use super::{Feed, JobError, TrainedModel, TrainingJob};
use crate::feed::relay::{self, Rows, SparkRows};
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

    /// The job's id: the one it was built with, else a fresh `kindling-…`.
    pub(super) fn new_job_id(&self) -> String {
        self.job_id
            .clone()
            .unwrap_or_else(|| format!("kindling-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]))
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
        let job_id = self.new_job_id();
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

    /// Everything after the data is checked: agents, feed, training, model
    /// — one [`Run`].
    pub(super) async fn train(
        &self,
        target: Target<'_>,
        source: Source<'_, '_>,
        layout: schema::FeatureLayout,
        job_id: String,
        reporter: Reporter,
    ) -> Result<TrainedModel, JobError> {
        // Pretrained weights are checked against the model before anything
        // starts, so a file that does not fit trains nothing.
        let initial = self.initial_weights(&layout)?;
        let mut run = Run::start(self, target, source, job_id, reporter, initial).await?;
        run.feed_all().await?;
        let last = run.follow().await?;
        run.finish(last, &layout).await
    }
}
