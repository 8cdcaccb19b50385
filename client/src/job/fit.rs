//! `fit`: gang the agents, stream the DataFrame into them exactly once, follow
//! training, replace lost agents, and fetch the model.

use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::TryStreamExt;
use futures::future::BoxFuture;
use kindling_agent::rendezvous::{AgentInfo, JobConfig, JobState, RendezvousClient};
use kindling_schemas::action::{
    Action, AgentJobState, AgentJobStatus, CancelJob, EndOfData, EndOfDataResponse, JobRef, StartJob,
    StartJobResponse,
};
use kindling_schemas::auth::Token;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::schema::{self, StreamKind};

use super::progress::{PushedPartition, Reporter, TrainingEvent};
use super::slices::{self, SparkRows};
use super::{ExecutorPush, Feed, JobError, TrainedModel, TrainingJob};
use crate::feed::AgentClient;
use crate::local::{LocalCluster, LocalClusterConfig};
use crate::spark::{DataFrame, MapInArrowUdf, RecordBatchStream};

/// The executor-push module, shipped to the executors as a session Python file.
const KINDLING_PUSH_PY: &str = include_str!("../../../deploy/python/kindling_push.py");
/// `kindling_push.SUMMARY_DDL`: one row per pushed partition.
pub(crate) const PUSH_SUMMARY_DDL: &str = "partition_id int, attempt int, agent string, agent_id string, \
     producer string, batches long, rows long, committed_rows long, duplicate boolean";

/// Where each pushed partition's rows are held: (split, partition, shard, rows).
type Placements = Vec<(Split, u32, usize, u64)>;

/// Batches larger than this are sliced before they are sent.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// How often training status is polled.
const POLL: Duration = Duration::from_millis(200);

/// Where the job runs.
enum Target<'a> {
    Local(&'a LocalCluster),
    Remote { url: String, token: Option<Token> },
}

impl Target<'_> {
    fn rendezvous(&self) -> String {
        match self {
            Target::Local(c) => c.rendezvous_url(),
            Target::Remote { url, .. } => url.clone(),
        }
    }

    fn is_local(&self) -> bool {
        matches!(self, Target::Local(_))
    }

    fn token(&self) -> Option<Token> {
        match self {
            Target::Local(c) => c.token().cloned(),
            Target::Remote { token, .. } => token.clone(),
        }
    }
}

fn rv_err(e: impl std::fmt::Display) -> JobError {
    JobError::Rendezvous(e.to_string())
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
            let _ = rv.cancel(&job_id, "the client stopped").await;
            for c in clients {
                let cancel = Action::CancelJob(CancelJob {
                    job_id: job_id.clone(),
                    reason: "the client stopped".into(),
                });
                let _ = c.action::<serde_json::Value>(&cancel).await;
            }
        });
    }
}

/// Opens the rows of an Arrow source once more (a feed, or a re-feed of lost shards).
type OpenFn<'a> =
    dyn Fn() -> BoxFuture<'static, Result<RecordBatchStream, crate::spark::Error>> + Send + Sync + 'a;

/// Where `fit` reads its rows from.
enum Rows<'a> {
    /// A Spark query, executed as a stream (again for a re-feed), whole or in slices.
    Spark(SparkRows),
    /// Arrow batches from anywhere (files, another service), opened per feed.
    Arrow { schema: SchemaRef, open: &'a OpenFn<'a> },
}

impl Rows<'_> {
    async fn open(&self) -> Result<(SchemaRef, RecordBatchStream), JobError> {
        match self {
            Rows::Spark(rows) => Ok(rows.open().await?),
            Rows::Arrow { schema, open } => Ok((schema.clone(), open().await?)),
        }
    }

    /// Bytes this client exchanged with Spark so far (0 for other sources).
    fn spark_bytes(&self) -> u64 {
        match self {
            Rows::Spark(rows) => {
                let b = rows.df().session().data_bytes();
                b.received + b.sent
            }
            Rows::Arrow { .. } => 0,
        }
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
        if self.local_mode {
            let dir = self.work_dir.join(uuid::Uuid::new_v4().simple().to_string());
            let mut config = LocalClusterConfig::new(&dir);
            if let Some(t) = &self.token {
                config.token = Some(t.clone());
            }
            config.gang_timeout = self.gang_timeout;
            let cluster = LocalCluster::start(self.spec.num_slots as usize, config).await?;
            let result = self.run(Target::Local(&cluster), rows).await;
            cluster.shutdown().await;
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::debug!(dir = %dir.display(), error = %e, "could not remove the local work dir");
            }
            result
        } else {
            let url = self.rendezvous.clone().unwrap_or_default();
            self.run(
                Target::Remote {
                    url,
                    token: self.token.clone(),
                },
                rows,
            )
            .await
        }
    }

    /// Trains on an existing local cluster (its spare agents replace lost
    /// ones, and it grows when it has none). Lets tests inject faults.
    pub async fn fit_on(&self, cluster: &LocalCluster, df: &DataFrame) -> Result<TrainedModel, JobError> {
        self.run(Target::Local(cluster), Rows::Spark(SparkRows::whole(df.clone())))
            .await
    }

    async fn run(&self, target: Target<'_>, rows: Rows<'_>) -> Result<TrainedModel, JobError> {
        let spec = &self.spec;
        let reporter = Reporter::new(self.progress, self.events.clone());
        let job_id = self
            .job_id
            .clone()
            .unwrap_or_else(|| format!("kindling-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]));

        // The data, checked before anything starts on the agents. A persisted
        // query is released at the end, whatever fails after it was persisted.
        let (rows, layout, cached) = match rows {
            Rows::Spark(rows) => {
                let columns: Vec<String> = spec.features.iter().chain([&spec.label]).cloned().collect();
                let data = rows.df().select(columns.iter().map(String::as_str));
                let schema = data.schema().await?;
                let layout = schema::validate(&schema, spec, StreamKind::Train)?;
                let cached = match self.persist {
                    true => Some(data.persist(crate::spark::memory_and_disk()).await?),
                    false => None,
                };
                let splits = self
                    .split_and_plan(cached.clone().unwrap_or(data), &schema, cached.is_some())
                    .await
                    .map(|(train, eval)| (Rows::Spark(train), eval.map(Rows::Spark)));
                (splits, layout, cached)
            }
            Rows::Arrow { schema, open } => {
                if self.eval_fraction > 0.0 {
                    return Err(JobError::Config(
                        "fit_arrow has no query to split: set eval_fraction(0.0) and hold out data yourself"
                            .into(),
                    ));
                }
                if matches!(self.feed, Feed::ExecutorPush(_)) {
                    return Err(JobError::Config(
                        "fit_arrow feeds from this process: executor push needs a DataFrame (use fit)".into(),
                    ));
                }
                let layout = schema::validate(&schema, spec, StreamKind::Train)?;
                (Ok((Rows::Arrow { schema, open }, None)), layout, None)
            }
        };
        let result = match rows {
            Ok((train_df, eval_df)) => {
                self.train(target, &train_df, eval_df.as_ref(), layout, job_id, reporter)
                    .await
            }
            Err(e) => Err(e),
        };
        // The cached rows go on success and on failure alike.
        if let Some(df) = cached {
            let _ = df.unpersist(false).await;
        }
        result
    }

    /// The training rows and the eval split of `data` (with `schema`), each
    /// relayed in slices the Spark Connect server can hold when `data` is
    /// persisted and fed by the driver relay (executor push sends no rows
    /// through the server).
    async fn split_and_plan(
        &self,
        data: DataFrame,
        schema: &arrow::datatypes::Schema,
        persisted: bool,
    ) -> Result<(SparkRows, Option<SparkRows>), JobError> {
        let (train_df, eval_df) = if self.eval_fraction > 0.0 {
            let weights = [1.0 - self.eval_fraction, self.eval_fraction];
            let seed = self.spec.seed as i64;
            // Persisted, the rows' partitioning and order are fixed, so the
            // split can keep their order (Spark's sorted split would hand each
            // shard its rows ordered by the first column).
            let mut parts = match persisted {
                true => data.random_split_in_order(&weights, seed)?,
                false => data.random_split(&weights, seed)?,
            };
            let eval = parts.pop();
            (parts.pop().unwrap_or(data), eval)
        } else {
            (data, None)
        };
        let sliced = persisted && matches!(self.feed, Feed::DriverRelay);
        let relay = async |df: DataFrame| match sliced {
            true => slices::plan(df, schema, self.relay_slice_bytes).await,
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
    async fn train(
        &self,
        target: Target<'_>,
        train_df: &Rows<'_>,
        eval_df: Option<&Rows<'_>>,
        layout: schema::FeatureLayout,
        job_id: String,
        mut reporter: Reporter,
    ) -> Result<TrainedModel, JobError> {
        let spec = &self.spec;
        let n = spec.num_slots as usize;

        let token = target.token();
        let rv = RendezvousClient::connect(target.rendezvous(), token.as_ref())
            .await
            .map_err(rv_err)?;
        let config = JobConfig {
            spec_summary: spec.to_json(),
            gang_timeout: Some(self.gang_timeout),
            ..JobConfig::new(job_id.clone(), spec.num_slots).with_max_attempts(self.max_attempts)
        };
        rv.create_job(&config).await.map_err(rv_err)?;
        let mut guard = CancelGuard {
            rv: rv.clone(),
            job_id: job_id.clone(),
            clients: Vec::new(),
            armed: true,
        };
        let chosen = pick_agents(&rv, &target, n, &[]).await?;
        let mut clients = Vec::with_capacity(n);
        let mut agent_ids: Vec<String> = chosen.iter().map(|a| a.agent_id.clone()).collect();
        for a in &chosen {
            let c = AgentClient::connect(&a.flight_address, token.as_ref())?;
            start_on(&c, &job_id, spec, &target.rendezvous()).await?;
            clients.push(c);
        }
        let mut placed = Placements::new();
        let feed = FeedCtx {
            job_id: &job_id,
            token: token.as_ref(),
            local: target.is_local(),
        };
        guard.clients = clients.clone();
        reporter.emit(TrainingEvent::Started {
            job_id: job_id.clone(),
            agents: clients.iter().map(|c| c.url().to_owned()).collect(),
        });

        let shards = Shards {
            clients: &clients,
            agent_ids: &agent_ids,
            only: None,
        };
        if let Some(eval) = &eval_df {
            self.feed_and_end(&feed, eval, Split::Eval, shards, &mut placed, &mut reporter)
                .await?;
        }
        self.feed_and_end(&feed, train_df, Split::Train, shards, &mut placed, &mut reporter)
            .await?;

        // Follow training; replace agents that die.
        let mut seen_epochs = 0;
        let mut last_attempt = 1;
        let winner = loop {
            tokio::time::sleep(POLL).await;
            let mut statuses = Vec::with_capacity(n);
            let mut dead = Vec::new();
            for (s, c) in clients.iter().enumerate() {
                match c
                    .action::<AgentJobStatus>(&Action::JobStatus(JobRef {
                        job_id: job_id.clone(),
                    }))
                    .await
                {
                    Ok(st) => statuses.push(Some(st)),
                    Err(e) if e.is_retryable() || e.code() == Some(tonic::Code::NotFound) => {
                        tracing::warn!(shard = s, agent = c.url(), error = %e, "agent lost");
                        dead.push(s);
                        statuses.push(None);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let rv_status = rv.status(&job_id).await.map_err(rv_err)?;
            if matches!(rv_status.state, JobState::Failed | JobState::Cancelled) {
                let cause = rv_status
                    .failures
                    .first()
                    .map(|f| f.cause.clone())
                    .unwrap_or_else(|| "cancelled".into());
                return Err(JobError::TrainingFailed { job_id, cause });
            }
            for st in statuses.iter().flatten() {
                if matches!(st.state, AgentJobState::Failed | AgentJobState::Cancelled) {
                    let cause = st.error.clone().unwrap_or_else(|| format!("{:?}", st.state));
                    return Err(JobError::TrainingFailed { job_id, cause });
                }
            }
            if let Some(lead) = statuses
                .iter()
                .flatten()
                .find(|s| s.rank == Some(0))
                .or(statuses.iter().flatten().next())
            {
                while seen_epochs < lead.history.len() {
                    reporter.emit(TrainingEvent::Epoch(lead.history[seen_epochs].clone()));
                    seen_epochs += 1;
                }
                if lead.state == AgentJobState::Training {
                    let total: f64 = statuses.iter().flatten().map(|s| s.samples_per_sec).sum();
                    reporter.emit(TrainingEvent::Step {
                        epoch: lead.epoch,
                        step: lead.step,
                        steps: lead.steps_per_epoch,
                        loss: lead.loss,
                        samples_per_sec: total,
                    });
                }
            }
            if !dead.is_empty() {
                let spare = pick_agents(&rv, &target, dead.len(), &clients_urls(&clients)).await?;
                for (&s, a) in dead.iter().zip(&spare) {
                    let c = AgentClient::connect(&a.flight_address, token.as_ref())?;
                    start_on(&c, &job_id, spec, &target.rendezvous()).await?;
                    clients[s] = c;
                    agent_ids[s] = a.agent_id.clone();
                }
                guard.clients = clients.clone();
                let shards = Shards {
                    clients: &clients,
                    agent_ids: &agent_ids,
                    only: Some(&dead),
                };
                if let Some(eval) = &eval_df {
                    self.feed_and_end(&feed, eval, Split::Eval, shards, &mut placed, &mut reporter)
                        .await?;
                }
                self.feed_and_end(&feed, train_df, Split::Train, shards, &mut placed, &mut reporter)
                    .await?;
                last_attempt += 1;
                reporter.emit(TrainingEvent::Recovering {
                    attempt: last_attempt,
                    resent_shards: dead.clone(),
                });
                continue;
            }
            if statuses.iter().flatten().count() == n
                && statuses
                    .iter()
                    .flatten()
                    .all(|s| s.state == AgentJobState::Succeeded)
            {
                break statuses.into_iter().flatten().next();
            }
        };
        let Some(final_status) = winner else {
            return Err(JobError::TrainingFailed {
                job_id,
                cause: "no agent reported the result".into(),
            });
        };
        while seen_epochs < final_status.history.len() {
            reporter.emit(TrainingEvent::Epoch(final_status.history[seen_epochs].clone()));
            seen_epochs += 1;
        }
        let weights = fetch_model(&clients[0], &job_id).await?;
        let model = TrainedModel::from_weights(
            spec.clone(),
            job_id.clone(),
            layout.input_dim,
            final_status.history.clone(),
            &weights,
        )?;
        guard.armed = false;
        reporter.emit(TrainingEvent::Finished {
            job_id: job_id.clone(),
        });
        Ok(model)
    }

    /// Streams one split into its shards and signals the end of data, checking
    /// every shard's committed rows. `shards.only`: re-send just these shards.
    async fn feed_and_end(
        &self,
        ctx: &FeedCtx<'_>,
        data: &Rows<'_>,
        split: Split,
        shards: Shards<'_>,
        placed: &mut Placements,
        reporter: &mut Reporter,
    ) -> Result<Vec<u64>, JobError> {
        let spark_before = data.spark_bytes();
        let started = Instant::now();
        let (rows, agent_bytes, partitions) = match (&self.feed, data) {
            (Feed::DriverRelay, _) => {
                let (rows, bytes) = self.relay(ctx, data, split, shards, reporter).await?;
                (rows, bytes, Vec::new())
            }
            (Feed::ExecutorPush(push), Rows::Spark(rows)) => {
                let (rows, partitions) = self.push(ctx, push, rows.df(), split, shards, placed).await?;
                (rows, 0, partitions)
            }
            (Feed::ExecutorPush(_), Rows::Arrow { .. }) => {
                return Err(JobError::Config(
                    "executor push needs a DataFrame; Arrow sources are relayed".into(),
                ));
            }
        };
        for (s, c) in shards.clients.iter().enumerate() {
            if shards.only.is_some_and(|o| !o.contains(&s)) {
                continue;
            }
            let end = Action::EndOfData(EndOfData {
                job_id: ctx.job_id.into(),
                split,
                expected_rows: Some(rows[s]),
            });
            let _: EndOfDataResponse = c.action(&end).await?;
        }
        let spark_bytes = data.spark_bytes() - spark_before;
        reporter.emit(TrainingEvent::Fed {
            split: split.as_str(),
            rows_per_shard: rows.clone(),
            feed: match self.feed {
                Feed::DriverRelay => "driver-relay",
                Feed::ExecutorPush(_) => "executor-push",
            },
            client_bytes: spark_bytes + agent_bytes,
            seconds: started.elapsed().as_secs_f64(),
            queries: match data {
                Rows::Spark(rows) => rows.queries(),
                Rows::Arrow { .. } => 1,
            },
            partitions,
        });
        Ok(rows)
    }

    /// Driver relay: stream the rows through this process (executing the
    /// DataFrame, or opening the Arrow source) and deal every batch's rows out
    /// to the shards ([`Dealer`]). Returns rows per shard and the bytes sent to
    /// agents.
    async fn relay(
        &self,
        ctx: &FeedCtx<'_>,
        data: &Rows<'_>,
        split: Split,
        shards: Shards<'_>,
        reporter: &mut Reporter,
    ) -> Result<(Vec<u64>, u64), JobError> {
        let clients = shards.clients;
        let only = shards.only;
        let n = clients.len();
        let (schema, mut stream) = data.open().await?;
        schema::validate(&schema, &self.spec, StreamKind::Train)?;
        let path = DataPath::data(ctx.job_id, split);
        let mut writers = Vec::with_capacity(n);
        for (s, c) in clients.iter().enumerate() {
            writers.push(match only {
                Some(o) if !o.contains(&s) => None,
                _ => Some(c.put_committing(
                    &path,
                    format!("shard-{s}"),
                    schema.clone(),
                    self.window_bytes,
                    self.commit_bytes,
                )),
            });
        }
        let started = Instant::now();
        let mut last_report = Instant::now();
        let mut rows = vec![0u64; n];
        let mut dealer = Dealer::new(n);
        while let Some(batch) = stream.try_next().await? {
            if batch.num_rows() == 0 {
                continue;
            }
            schema::validate_batch(&batch, &self.spec)?;
            for (s, piece) in dealer.deal(&batch) {
                if let Some(w) = writers[s].as_mut() {
                    w.write(&piece).await?;
                }
                rows[s] += piece.num_rows() as u64;
                if last_report.elapsed() >= Duration::from_millis(250) {
                    last_report = Instant::now();
                    let secs = started.elapsed().as_secs_f64().max(1e-9);
                    reporter.emit(TrainingEvent::Streamed {
                        split: split.as_str(),
                        shard: s,
                        rows: rows[s],
                        rows_per_sec: rows.iter().sum::<u64>() as f64 / secs,
                    });
                }
            }
        }
        let mut bytes = 0;
        for (s, w) in writers.into_iter().enumerate() {
            let Some(w) = w else { continue };
            let receipt = w.finish().await?;
            bytes += receipt.bytes_sent;
            if receipt.rows_committed != rows[s] {
                return Err(JobError::RowMismatch {
                    shard: s,
                    agent: clients[s].url().to_owned(),
                    sent: rows[s],
                    committed: receipt.rows_committed,
                });
            }
        }
        Ok((rows, bytes))
    }

    /// Executor push: every Spark task pushes its partition to its agent
    /// (`kindling_push.udf_command` through a `mapInArrow` relation); only one
    /// summary row per partition comes back here. Checks the summaries against
    /// the DataFrame's count and every shard's rows against its agent.
    async fn push(
        &self,
        ctx: &FeedCtx<'_>,
        opts: &ExecutorPush,
        df: &DataFrame,
        split: Split,
        shards: Shards<'_>,
        placed: &mut Placements,
    ) -> Result<(Vec<u64>, Vec<PushedPartition>), JobError> {
        let clients = shards.clients;
        let n = clients.len();
        let schema = df.schema().await?;
        schema::validate(&schema, &self.spec, StreamKind::Train)?;
        let session = df.session();
        session
            .add_python_file("kindling_push.py", KINDLING_PUSH_PY)
            .await?;
        let agents: Vec<String> = clients.iter().map(|c| c.url().to_owned()).collect();
        let mut config = serde_json::json!({
            "job_id": ctx.job_id,
            "split": split.as_str(),
            "agents": agents,
            "timeout": opts.timeout.as_secs_f64(),
            "node_local": opts.node_local && !ctx.local,
        });
        if opts.token_in_plan.unwrap_or(ctx.local)
            && let Some(t) = ctx.token
        {
            config["token"] = t.expose().into();
        }
        if let Some(only) = shards.only {
            let routes: serde_json::Map<String, serde_json::Value> = placed
                .iter()
                .filter(|(sp, _, shard, _)| *sp == split && only.contains(shard))
                .map(|(_, p, shard, _)| (p.to_string(), agents[*shard].clone().into()))
                .collect();
            config["routes"] = routes.into();
        }
        if let Some((partition, after)) = opts.fail_task {
            config["fail"] =
                serde_json::json!({"partition": partition, "attempt": 0, "after_batches": after});
        }
        let udf = MapInArrowUdf::new("kindling_push", "udf_command", PUSH_SUMMARY_DDL, opts.python())
            .arg(config.to_string());
        let summaries = df
            .map_in_arrow(&udf)?
            .collect()
            .await
            .map_err(|e| python_version_hint(e, opts.python()))?;
        let summary = parse_summaries(&summaries)?;

        let mut rows = vec![0u64; n];
        let mut seen = std::collections::BTreeSet::new();
        let mut pushed = 0u64;
        let mut placements = Vec::new();
        let mut report = Vec::with_capacity(summary.len());
        for s in &summary {
            if !seen.insert(s.partition) {
                return Err(JobError::Config(format!(
                    "executor push: partition {} was summarised twice (Spark returned two attempts)",
                    s.partition
                )));
            }
            pushed += s.rows;
            let mut line = PushedPartition {
                partition: s.partition,
                attempt: s.attempt,
                shard: None,
                rows: s.rows,
                committed_rows: s.committed_rows,
                duplicate: s.duplicate,
            };
            let Some(holder) = &s.agent_id else {
                report.push(line); // an empty partition: nothing was sent
                continue;
            };
            let shard = shards.agent_ids.iter().position(|a| a == holder).ok_or_else(|| {
                JobError::PushedElsewhere {
                    partition: s.partition,
                    agent_id: holder.clone(),
                    address: s.agent.clone(),
                    job_agents: shards.agent_ids.to_vec(),
                }
            })?;
            rows[shard] += s.rows;
            placements.push((split, s.partition, shard, s.rows));
            line.shard = Some(shard);
            report.push(line);
        }
        report.sort_by_key(|p| p.partition);
        match shards.only {
            None => {
                let counted = df.count().await? as u64;
                if counted != pushed {
                    return Err(JobError::PushedRows {
                        split: split.as_str(),
                        counted,
                        pushed,
                        partitions: summary.len(),
                    });
                }
            }
            Some(only) => {
                // Re-sent shards must hold what they held before.
                let before: u64 = placed
                    .iter()
                    .filter(|(sp, _, shard, _)| *sp == split && only.contains(shard))
                    .map(|(_, _, _, r)| r)
                    .sum();
                if before != pushed {
                    return Err(JobError::PushedRows {
                        split: split.as_str(),
                        counted: before,
                        pushed,
                        partitions: summary.len(),
                    });
                }
                placed.retain(|(sp, _, shard, _)| !(*sp == split && only.contains(shard)));
            }
        }
        placed.extend(placements);
        // What the agents hold must be what the partitions report, shard by shard.
        for (s, c) in clients.iter().enumerate() {
            if shards.only.is_some_and(|o| !o.contains(&s)) {
                continue;
            }
            let st: AgentJobStatus = c
                .action(&Action::JobStatus(JobRef {
                    job_id: ctx.job_id.into(),
                }))
                .await?;
            let held = match split {
                Split::Train => st.rows_train,
                Split::Eval => st.rows_eval,
            };
            if held != rows[s] {
                return Err(JobError::RowMismatch {
                    shard: s,
                    agent: c.url().to_owned(),
                    sent: rows[s],
                    committed: held,
                });
            }
        }
        Ok((rows, report))
    }
}

/// The job-wide facts a feed needs.
struct FeedCtx<'a> {
    job_id: &'a str,
    token: Option<&'a Token>,
    local: bool,
}

/// The job's shards: agent clients and ids by shard, optionally only some.
#[derive(Clone, Copy)]
struct Shards<'a> {
    clients: &'a [AgentClient],
    agent_ids: &'a [String],
    only: Option<&'a [usize]>,
}

/// One partition's summary row from `kindling_push`.
#[derive(Debug)]
struct PushSummary {
    partition: u32,
    attempt: u32,
    agent: String,
    agent_id: Option<String>,
    rows: u64,
    committed_rows: u64,
    duplicate: bool,
}

fn parse_summaries(batches: &[RecordBatch]) -> Result<Vec<PushSummary>, JobError> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{DataType, Int64Type};
    let bad = |what: String| JobError::Config(format!("executor push: malformed summary: {what}"));
    let mut out = Vec::new();
    for batch in batches {
        let column = |name: &str, ty: &DataType| {
            let c = batch
                .column_by_name(name)
                .ok_or_else(|| bad(format!("no column `{name}`")))?;
            arrow::compute::cast(c, ty).map_err(|e| bad(format!("`{name}`: {e}")))
        };
        let partition = column("partition_id", &DataType::Int64)?;
        let agent = column("agent", &DataType::Utf8)?;
        let agent_id = column("agent_id", &DataType::Utf8)?;
        let attempt = column("attempt", &DataType::Int64)?;
        let rows = column("rows", &DataType::Int64)?;
        let committed = column("committed_rows", &DataType::Int64)?;
        let duplicate = column("duplicate", &DataType::Boolean)?;
        let (partition, attempt, rows, committed) = (
            partition.as_primitive::<Int64Type>(),
            attempt.as_primitive::<Int64Type>(),
            rows.as_primitive::<Int64Type>(),
            committed.as_primitive::<Int64Type>(),
        );
        let duplicate = duplicate.as_boolean();
        let (agent, agent_id) = (agent.as_string::<i32>(), agent_id.as_string::<i32>());
        for i in 0..batch.num_rows() {
            out.push(PushSummary {
                partition: u32::try_from(partition.value(i)).map_err(|e| bad(e.to_string()))?,
                agent: agent.value(i).to_owned(),
                attempt: u32::try_from(attempt.value(i)).map_err(|e| bad(e.to_string()))?,
                agent_id: agent_id.is_valid(i).then(|| agent_id.value(i).to_owned()),
                rows: u64::try_from(rows.value(i)).map_err(|e| bad(e.to_string()))?,
                committed_rows: u64::try_from(committed.value(i)).map_err(|e| bad(e.to_string()))?,
                duplicate: duplicate.value(i),
            });
        }
    }
    Ok(out)
}

/// Names the setting to change when the executors run another Python.
fn python_version_hint(e: crate::spark::Error, configured: &str) -> JobError {
    let text = e.to_string();
    if text.contains("PYTHON_VERSION_MISMATCH") || text.contains("has different version") {
        let worker = text
            .split("different version: ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(|v| v.trim_end_matches(',').to_owned());
        return JobError::Config(match worker {
            Some(v) => format!(
                "executor push: the executors run Python {v} but the job is set for {configured}; \
                 set ExecutorPush::python_version(\"{v}\") ({text})"
            ),
            None => format!(
                "executor push: the executors' Python is not {configured}; set \
                 ExecutorPush::python_version to theirs ({text})"
            ),
        });
    }
    JobError::Spark(e)
}

fn clients_urls(clients: &[AgentClient]) -> Vec<String> {
    clients.iter().map(|c| c.url().to_owned()).collect()
}

/// Picks `count` live agents not in `exclude`, in a stable order. In local
/// mode a missing agent is started; on a cluster too few is an error.
async fn pick_agents(
    rv: &RendezvousClient,
    target: &Target<'_>,
    count: usize,
    exclude: &[String],
) -> Result<Vec<AgentInfo>, JobError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut live: Vec<AgentInfo> = rv
            .list_agents()
            .await
            .map_err(rv_err)?
            .into_iter()
            .filter(|a| !exclude.contains(&a.flight_address))
            .collect();
        live.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        if live.len() >= count {
            live.truncate(count);
            return Ok(live);
        }
        match target {
            Target::Local(cluster) => {
                for _ in live.len()..count {
                    cluster.add_agent().await?;
                }
            }
            Target::Remote { url, .. } => {
                return Err(JobError::NotEnoughAgents {
                    needed: count as u32,
                    live: live.len(),
                    rendezvous: url.clone(),
                });
            }
        }
        if Instant::now() > deadline {
            return Err(JobError::NotEnoughAgents {
                needed: count as u32,
                live: live.len(),
                rendezvous: target.rendezvous(),
            });
        }
    }
}

async fn start_on(
    c: &AgentClient,
    job_id: &str,
    spec: &kindling_schemas::JobSpec,
    rendezvous: &str,
) -> Result<(), JobError> {
    let start = Action::StartJob(StartJob {
        job_id: job_id.into(),
        spec: spec.clone(),
        rendezvous: rendezvous.into(),
    });
    let _: StartJobResponse = c.action(&start).await?;
    Ok(())
}

/// Deals the rows of a stream of batches out to `n` shards, deterministically
/// and evenly: each batch is cut into `n` contiguous slices whose sizes differ
/// by at most one row, and the shard that takes the first of the larger
/// slices rotates, so after any prefix of the stream the shards' row counts
/// differ by at most one. (Routing whole batches round-robin would put a
/// one-batch result, or a result of few large batches, on few shards.)
/// Slices are further cut to at most [`MAX_BATCH_BYTES`].
struct Dealer {
    n: usize,
    next: usize,
}

impl Dealer {
    fn new(n: usize) -> Self {
        Self { n: n.max(1), next: 0 }
    }

    /// `(shard, slice)` pairs covering `batch` in row order; empty slices are left out.
    fn deal(&mut self, batch: &RecordBatch) -> Vec<(usize, RecordBatch)> {
        let rows = batch.num_rows();
        let (base, extra) = (rows / self.n, rows % self.n);
        let mut out = Vec::with_capacity(self.n);
        let mut start = 0;
        for k in 0..self.n {
            let len = base + usize::from(k < extra);
            if len == 0 {
                break;
            }
            let shard = (self.next + k) % self.n;
            for piece in slice_large(&batch.slice(start, len)) {
                out.push((shard, piece));
            }
            start += len;
        }
        self.next = (self.next + extra) % self.n;
        out
    }
}

/// Slices a batch so no piece exceeds [`MAX_BATCH_BYTES`].
fn slice_large(batch: &RecordBatch) -> Vec<RecordBatch> {
    let bytes = schema::batch_bytes(batch) as usize;
    if bytes <= MAX_BATCH_BYTES || batch.num_rows() < 2 {
        return vec![batch.clone()];
    }
    let pieces = bytes.div_ceil(MAX_BATCH_BYTES);
    let per = batch.num_rows().div_ceil(pieces);
    (0..batch.num_rows())
        .step_by(per)
        .map(|start| batch.slice(start, per.min(batch.num_rows() - start)))
        .collect()
}

/// Reads the trained model table from an agent.
async fn fetch_model(client: &AgentClient, job_id: &str) -> Result<RecordBatch, JobError> {
    let ticket = DataPath::Model {
        job_id: job_id.into(),
    }
    .ticket();
    let stream = client
        .flight()
        .do_get(ticket)
        .await
        .map_err(|s| crate::feed::FeedError::Agent {
            agent: client.url().into(),
            status: Box::new(s),
        })?
        .into_inner();
    let batches: Vec<RecordBatch> = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
        stream.map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s))),
    )
    .try_collect()
    .await
    .map_err(|e| crate::feed::FeedError::Protocol {
        agent: client.url().into(),
        reason: e.to_string(),
    })?;
    let schema = batches
        .first()
        .map(|b| b.schema())
        .ok_or_else(|| crate::feed::FeedError::Protocol {
            agent: client.url().into(),
            reason: "empty model".into(),
        })?;
    Ok(arrow::compute::concat_batches(&schema, &batches).map_err(crate::feed::FeedError::Arrow)?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::Dealer;

    fn batch(from: i64, rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let ids = Int64Array::from_iter_values(from..from + rows as i64);
        RecordBatch::try_new(schema, vec![Arc::new(ids)]).expect("batch")
    }

    #[test]
    fn dealt_rows_stay_within_one_of_each_other_and_keep_their_order() {
        for n in 1..=4 {
            let mut dealer = Dealer::new(n);
            let mut per_shard: Vec<Vec<i64>> = vec![Vec::new(); n];
            let mut from = 0i64;
            for rows in [1usize, 3001, 7, 2, 1, 1, 10_000, 5] {
                for (s, piece) in dealer.deal(&batch(from, rows)) {
                    per_shard[s].extend(piece.column(0).as_primitive::<Int64Type>().values());
                }
                from += rows as i64;
                let counts: Vec<usize> = per_shard.iter().map(Vec::len).collect();
                let (lo, hi) = (counts.iter().min().copied(), counts.iter().max().copied());
                assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "n={n}: {counts:?}");
            }
            // Every row lands exactly once, each shard's rows in stream order.
            let mut all: Vec<i64> = per_shard.iter().flatten().copied().collect();
            for ids in &per_shard {
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "n={n}: order");
            }
            all.sort_unstable();
            assert_eq!(all, (0..from).collect::<Vec<_>>(), "n={n}");
        }
    }
}
