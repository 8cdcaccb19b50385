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

use super::progress::{Reporter, TrainingEvent};
use super::{JobError, TrainedModel, TrainingJob};
use crate::feed::AgentClient;
use crate::local::{LocalCluster, LocalClusterConfig};
use crate::spark::{DataFrame, RecordBatchStream};

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
    /// A Spark query, executed as a stream (again for a re-feed).
    Spark(DataFrame),
    /// Arrow batches from anywhere (files, another service), opened per feed.
    Arrow { schema: SchemaRef, open: &'a OpenFn<'a> },
}

impl Rows<'_> {
    async fn open(&self) -> Result<(SchemaRef, RecordBatchStream), JobError> {
        match self {
            Rows::Spark(df) => {
                let stream = df.execute_stream().await?;
                Ok((stream.schema(), stream.into_inner()))
            }
            Rows::Arrow { schema, open } => Ok((schema.clone(), open().await?)),
        }
    }

    async fn unpersist(&self) {
        if let Rows::Spark(df) = self {
            let _ = df.unpersist(false).await;
        }
    }
}

impl TrainingJob {
    /// Trains on `df`: in local mode on a rendezvous and `num_slots` agents
    /// started in this process, otherwise on the cluster's agents.
    pub async fn fit(&self, df: &DataFrame) -> Result<TrainedModel, JobError> {
        self.fit_rows(Rows::Spark(df.clone())).await
    }

    /// Trains on Arrow batches that do not come from a Spark query (files read
    /// by the application, another service): `open` is called once per feed
    /// and again if a lost agent's shard must be re-sent, so it must yield the
    /// same rows each time. The batches must have exactly the feature and label
    /// columns, with `schema`. The evaluation split must be 0 (there is no
    /// query to split); hold out data yourself and score it with
    /// [`TrainedModel::predict_batch`].
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
        self.run(Target::Local(cluster), Rows::Spark(df.clone())).await
    }

    async fn run(&self, target: Target<'_>, rows: Rows<'_>) -> Result<TrainedModel, JobError> {
        let spec = &self.spec;
        let n = spec.num_slots as usize;
        let mut reporter = Reporter::new(self.progress, self.events.clone());
        let job_id = self
            .job_id
            .clone()
            .unwrap_or_else(|| format!("kindling-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]));

        // The data, checked before anything starts on the agents.
        let (train_rows, eval_rows, layout) = match rows {
            Rows::Spark(df) => {
                let columns: Vec<String> = spec.features.iter().chain([&spec.label]).cloned().collect();
                let data = df.select(columns.iter().map(String::as_str));
                let (mut train_df, mut eval_df) = if self.eval_fraction > 0.0 {
                    let mut parts =
                        data.random_split(&[1.0 - self.eval_fraction, self.eval_fraction], spec.seed as i64)?;
                    let eval = parts.pop();
                    (parts.pop().unwrap_or(data), eval)
                } else {
                    (data, None)
                };
                let schema = train_df.schema().await?;
                let layout = schema::validate(&schema, spec, StreamKind::Train)?;
                if self.persist {
                    train_df = train_df.persist(crate::spark::memory_and_disk()).await?;
                    if let Some(e) = &eval_df {
                        eval_df = Some(e.persist(crate::spark::memory_and_disk()).await?);
                    }
                }
                (Rows::Spark(train_df), eval_df.map(Rows::Spark), layout)
            }
            Rows::Arrow { schema, open } => {
                if self.eval_fraction > 0.0 {
                    return Err(JobError::Config(
                        "fit_arrow has no query to split: set eval_fraction(0.0) and hold out data yourself"
                            .into(),
                    ));
                }
                let layout = schema::validate(&schema, spec, StreamKind::Train)?;
                (Rows::Arrow { schema, open }, None, layout)
            }
        };

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
        for a in &chosen {
            let c = AgentClient::connect(&a.flight_address, token.as_ref())?;
            start_on(&c, &job_id, spec, &target.rendezvous()).await?;
            clients.push(c);
        }
        guard.clients = clients.clone();
        reporter.emit(TrainingEvent::Started {
            job_id: job_id.clone(),
            agents: clients.iter().map(|c| c.url().to_owned()).collect(),
        });

        if let Some(eval) = &eval_rows {
            self.feed_and_end(eval, Split::Eval, &job_id, &clients, None, &mut reporter)
                .await?;
        }
        self.feed_and_end(&train_rows, Split::Train, &job_id, &clients, None, &mut reporter)
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
                }
                guard.clients = clients.clone();
                if let Some(eval) = &eval_rows {
                    self.feed_and_end(eval, Split::Eval, &job_id, &clients, Some(&dead), &mut reporter)
                        .await?;
                }
                self.feed_and_end(
                    &train_rows,
                    Split::Train,
                    &job_id,
                    &clients,
                    Some(&dead),
                    &mut reporter,
                )
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
        if self.persist {
            train_rows.unpersist().await;
            if let Some(e) = &eval_rows {
                e.unpersist().await;
            }
        }
        Ok(model)
    }

    /// Streams one split into its shards and signals the end of data, checking
    /// every shard's committed rows. `only`: re-send just these shards.
    async fn feed_and_end(
        &self,
        data: &Rows<'_>,
        split: Split,
        job_id: &str,
        clients: &[AgentClient],
        only: Option<&[usize]>,
        reporter: &mut Reporter,
    ) -> Result<Vec<u64>, JobError> {
        let rows = self.feed(data, split, job_id, clients, only, reporter).await?;
        for (s, c) in clients.iter().enumerate() {
            if only.is_some_and(|o| !o.contains(&s)) {
                continue;
            }
            let end = Action::EndOfData(EndOfData {
                job_id: job_id.into(),
                split,
                expected_rows: Some(rows[s]),
            });
            let _: EndOfDataResponse = c.action(&end).await?;
        }
        reporter.emit(TrainingEvent::Fed {
            split: split.as_str(),
            rows_per_shard: rows.clone(),
        });
        Ok(rows)
    }

    async fn feed(
        &self,
        data: &Rows<'_>,
        split: Split,
        job_id: &str,
        clients: &[AgentClient],
        only: Option<&[usize]>,
        reporter: &mut Reporter,
    ) -> Result<Vec<u64>, JobError> {
        let n = clients.len();
        let (schema, mut stream) = data.open().await?;
        schema::validate(&schema, &self.spec, StreamKind::Train)?;
        let path = DataPath::data(job_id, split);
        let mut writers = Vec::with_capacity(n);
        for (s, c) in clients.iter().enumerate() {
            writers.push(match only {
                Some(o) if !o.contains(&s) => None,
                _ => Some(
                    c.put(&path, format!("shard-{s}"), &schema, self.window_bytes)
                        .await?,
                ),
            });
        }
        let started = Instant::now();
        let mut last_report = Instant::now();
        let mut rows = vec![0u64; n];
        let mut index = 0usize;
        while let Some(batch) = stream.try_next().await? {
            if batch.num_rows() == 0 {
                continue;
            }
            schema::validate_batch(&batch, &self.spec)?;
            for piece in slice_large(&batch) {
                let s = index % n;
                index += 1;
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
        for (s, w) in writers.into_iter().enumerate() {
            let Some(w) = w else { continue };
            let receipt = w.finish().await?;
            if receipt.rows_committed != rows[s] {
                return Err(JobError::RowMismatch {
                    shard: s,
                    agent: clients[s].url().to_owned(),
                    sent: rows[s],
                    committed: receipt.rows_committed,
                });
            }
        }
        Ok(rows)
    }
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

/// Slices a batch so no piece exceeds [`MAX_BATCH_BYTES`].
fn slice_large(batch: &RecordBatch) -> Vec<RecordBatch> {
    let bytes = batch.get_array_memory_size();
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
