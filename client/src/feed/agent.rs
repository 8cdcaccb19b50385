//! [`AgentClient`]: the typed Flight client of one agent — its actions
//! (`start_job`, `job_status`, `end_of_data`, `cancel_job`), `DoPut` writers,
//! the trained model table (`DoGet`) and predictions (`DoExchange`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::{Stream, StreamExt, TryStreamExt};
use kindling_schemas::action::{
    Action, AgentJobStatus, CancelJob, CreateJob, CreateJobResponse, CredentialResponse, EndOfData,
    EndOfDataResponse, IssueCredential, JobRef, KeepRowsResponse, ReopenSplit, StartJob, StartJobResponse,
};
use kindling_schemas::auth::{BearerAttach, Token};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::credential::Role;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::spec::JobSpec;
use serde::de::DeserializeOwned;

use super::FeedError;
use super::writer::{CommittingWriter, FlightClient, PutTarget, ShardWriter};

/// Largest message exchanged with an agent.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

type Inner = FlightClient;

/// A Flight client for one agent, with the bearer token attached to every call.
#[derive(Debug, Clone)]
pub struct AgentClient {
    url: String,
    inner: Inner,
    call_timeout: Duration,
}

impl AgentClient {
    /// Connects lazily to the agent at `url` (`http://host:port`) with the
    /// default [`ChannelConfig`].
    pub fn connect(url: &str, token: Option<&Token>) -> Result<Self, FeedError> {
        Self::connect_with(url, token, &ChannelConfig::default())
    }

    /// Connects lazily to the agent at `url` with the channel settings
    /// `channel`: an agent that goes silent fails a data stream within the
    /// keepalive's detection bound and an action at the call timeout
    /// (`DEADLINE_EXCEEDED`, naming the agent).
    pub fn connect_with(
        url: &str,
        token: Option<&Token>,
        channel: &ChannelConfig,
    ) -> Result<Self, FeedError> {
        let addr_err = |reason: String| FeedError::Address {
            addr: url.to_owned(),
            reason,
        };
        let connection = channel
            .dial(url, token.is_some())
            .map_err(|e| addr_err(e.to_string()))?
            .connect_lazy();
        let attach = BearerAttach::new(token).map_err(|e| addr_err(e.to_string()))?;
        let inner = FlightServiceClient::with_interceptor(connection, attach)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(AgentClient {
            url: url.to_owned(),
            inner,
            call_timeout: channel.call_timeout,
        })
    }

    /// The agent's address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The raw Flight client.
    pub fn flight(&self) -> Inner {
        self.inner.clone()
    }

    /// What a writer of this agent's `DoPut`s needs.
    fn put_target(&self) -> PutTarget {
        PutTarget::new(&self.url, self.inner.clone())
    }

    pub(crate) fn status_error(&self, s: tonic::Status) -> FeedError {
        FeedError::Agent {
            agent: self.url.clone(),
            status: Box::new(s),
        }
    }

    /// Runs an action and decodes its JSON answer; an agent that does not
    /// answer within the call timeout fails it with `DEADLINE_EXCEEDED`.
    pub async fn action<T: DeserializeOwned>(&self, action: &Action) -> Result<T, FeedError> {
        let limit = self.call_timeout;
        tokio::time::timeout(limit, self.action_unbounded(action))
            .await
            .unwrap_or_else(|_| {
                Err(self.status_error(tonic::Status::deadline_exceeded(format!(
                    "action `{}`: no answer within {limit:?}",
                    action.kind().name()
                ))))
            })
    }

    async fn action_unbounded<T: DeserializeOwned>(&self, action: &Action) -> Result<T, FeedError> {
        let mut results = self
            .inner
            .clone()
            .do_action(action.to_flight())
            .await
            .map_err(|s| self.status_error(s))?
            .into_inner();
        let first = results
            .next()
            .await
            .ok_or_else(|| FeedError::Protocol {
                agent: self.url.clone(),
                reason: "empty action result".into(),
            })?
            .map_err(|s| self.status_error(s))?;
        serde_json::from_slice(&first.body).map_err(|e| FeedError::Protocol {
            agent: self.url.clone(),
            reason: format!("action `{}` answered malformed JSON: {e}", action.kind().name()),
        })
    }

    /// Opens a `DoPut` of one producer's batches to `path`.
    pub async fn put(
        &self,
        path: &DataPath,
        producer: impl Into<String>,
        schema: &Schema,
        window_bytes: usize,
    ) -> Result<ShardWriter, FeedError> {
        ShardWriter::open(self.put_target(), path, producer.into(), schema, window_bytes, 0).await
    }

    /// A producer's rows to `path` as consecutive `DoPut` streams of about
    /// `commit_bytes` each (see [`CommittingWriter`]).
    pub fn put_committing(
        &self,
        path: &DataPath,
        producer: impl Into<String>,
        schema: SchemaRef,
        window_bytes: usize,
        commit_bytes: usize,
    ) -> CommittingWriter {
        CommittingWriter::new(
            self.put_target(),
            path,
            producer.into(),
            schema,
            window_bytes,
            commit_bytes,
        )
    }

    /// Creates `job_id` for `num_slots` agents at the rendezvous this agent
    /// is registered with (the `create_job` action, for Flight-only clients).
    pub async fn create_job(&self, job_id: &str, num_slots: u32) -> Result<CreateJobResponse, FeedError> {
        self.action(&Action::CreateJob(CreateJob {
            job_id: job_id.into(),
            num_slots,
            max_attempts: 0,
            gang_timeout_ms: None,
            rendezvous: None,
        }))
        .await
    }

    /// Starts `job_id` on this agent (the job exists at the rendezvous).
    pub async fn start_job(
        &self,
        job_id: &str,
        spec: &JobSpec,
        rendezvous: &str,
    ) -> Result<StartJobResponse, FeedError> {
        self.start_job_from(job_id, spec, rendezvous, None).await
    }

    /// [`start_job`](Self::start_job) starting from `initial` weights (a
    /// weights table encoded by `model_serving::encode_weights`) when the
    /// spec has `init_from`.
    pub async fn start_job_from(
        &self,
        job_id: &str,
        spec: &JobSpec,
        rendezvous: &str,
        initial: Option<&str>,
    ) -> Result<StartJobResponse, FeedError> {
        self.action(&Action::StartJob(StartJob {
            job_id: job_id.into(),
            spec: spec.clone(),
            rendezvous: rendezvous.into(),
            initial_weights: initial.map(str::to_owned),
        }))
        .await
    }

    /// A signed credential for `role` in `job_id` (a job, or a served
    /// model's id) living `ttl_secs`, for callers that must not hold the
    /// operator token (executors); `None` when the agent has no credential
    /// key and so issues none.
    pub async fn issue_credential(
        &self,
        job_id: &str,
        role: Role,
        ttl_secs: u64,
    ) -> Result<Option<String>, FeedError> {
        let issue = Action::IssueCredential(IssueCredential {
            job_id: job_id.to_owned(),
            role,
            ttl_secs,
        });
        match self.action::<CredentialResponse>(&issue).await {
            Ok(r) => Ok(Some(r.credential)),
            Err(e) if e.code() == Some(tonic::Code::FailedPrecondition) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The agent's status of `job_id`.
    pub async fn job_status(&self, job_id: &str) -> Result<AgentJobStatus, FeedError> {
        self.action(&Action::JobStatus(JobRef {
            job_id: job_id.into(),
        }))
        .await
    }

    /// Says `split` of `job_id` is complete on this agent; with
    /// `expected_rows`, the agent checks it holds exactly that many.
    pub async fn end_of_data(
        &self,
        job_id: &str,
        split: Split,
        expected_rows: Option<u64>,
    ) -> Result<EndOfDataResponse, FeedError> {
        self.action(&Action::EndOfData(EndOfData {
            job_id: job_id.into(),
            split,
            expected_rows,
        }))
        .await
    }

    /// Lets `split` of `job_id`, which ended, take rows again on this agent
    /// until its next `end_of_data` (for shards fed to it again).
    pub async fn reopen_split(&self, job_id: &str, split: Split) -> Result<EndOfDataResponse, FeedError> {
        self.drop_rows(job_id, split, &[]).await
    }

    /// [`reopen_split`](Self::reopen_split), dropping the rows `producers`
    /// committed here (handed over to another agent, which committed them).
    pub async fn drop_rows(
        &self,
        job_id: &str,
        split: Split,
        producers: &[String],
    ) -> Result<EndOfDataResponse, FeedError> {
        self.action(&Action::ReopenSplit(ReopenSplit {
            job_id: job_id.into(),
            split,
            drop_producers: producers.to_vec(),
        }))
        .await
    }

    /// Writes `job_id`'s rows to this agent's disk (both splits ended), so
    /// the agent restarted on its node takes its place in the job again.
    pub async fn keep_rows(&self, job_id: &str) -> Result<KeepRowsResponse, FeedError> {
        self.action(&Action::KeepRows(JobRef {
            job_id: job_id.into(),
        }))
        .await
    }

    /// Cancels `job_id` on this agent.
    pub async fn cancel_job(&self, job_id: &str, reason: &str) -> Result<(), FeedError> {
        let _: serde_json::Value = self
            .action(&Action::CancelJob(CancelJob {
                job_id: job_id.into(),
                reason: reason.into(),
            }))
            .await?;
        Ok(())
    }

    /// The trained model of `job_id` as one Arrow table (`name`, `shape`,
    /// `values`), without the agent's model card.
    pub async fn fetch_model(&self, job_id: &str) -> Result<RecordBatch, FeedError> {
        let table = self.fetch_model_with_card(job_id).await?;
        let schema = table
            .schema()
            .as_ref()
            .clone()
            .with_metadata(arrow::datatypes::Metadata::default());
        Ok(RecordBatch::try_new(
            std::sync::Arc::new(schema),
            table.columns().to_vec(),
        )?)
    }

    /// As [`Self::fetch_model`], the agent's model card (a job's spec and
    /// inputs) kept in the schema's metadata.
    pub async fn fetch_model_with_card(&self, job_id: &str) -> Result<RecordBatch, FeedError> {
        let model = DataPath::Model {
            job_id: job_id.into(),
        };
        let batches: Vec<RecordBatch> = self.get(model).await?.try_collect().await?;
        let schema = batches
            .first()
            .map(|b| b.schema())
            .ok_or_else(|| FeedError::Protocol {
                agent: self.url.clone(),
                reason: "empty model".into(),
            })?;
        Ok(arrow::compute::concat_batches(&schema, &batches)?)
    }

    /// The rows `producer` committed to `split` of `job_id` on this agent,
    /// in its sequence order, as they are read (a growing gang's hand-over
    /// to an agent that joined; the operator only).
    pub async fn rows_of(
        &self,
        job_id: &str,
        split: Split,
        producer: &str,
    ) -> Result<impl Stream<Item = Result<RecordBatch, FeedError>> + Send + 'static, FeedError> {
        let rows = DataPath::Rows {
            job_id: job_id.into(),
            split,
            producer: producer.into(),
        };
        self.get(rows).await
    }

    /// `DoGet` of `path`: its batches as they are read.
    async fn get(
        &self,
        path: DataPath,
    ) -> Result<impl Stream<Item = Result<RecordBatch, FeedError>> + Send + 'static, FeedError> {
        let stream = self
            .inner
            .clone()
            .do_get(path.ticket())
            .await
            .map_err(|s| self.status_error(s))?
            .into_inner();
        Ok(self.decode(stream.map_err(|s| FlightError::Tonic(Box::new(s)))))
    }

    /// Predicts `batches` (with `schema`: the job's feature columns) with the
    /// trained model of `job_id` on the agent, through `DoExchange`: a stream
    /// of the input columns plus the predictions, batch by batch.
    pub async fn predict<S>(
        &self,
        job_id: &str,
        schema: SchemaRef,
        batches: S,
    ) -> Result<impl Stream<Item = Result<RecordBatch, FeedError>> + Send + 'static, FeedError>
    where
        S: Stream<Item = RecordBatch> + Send + 'static,
    {
        let path = DataPath::Predict {
            job_id: job_id.into(),
        };
        // An encoding error ends the request stream and is reported after
        // the agent's answer ends (the agent sees a truncated exchange).
        let failed = Arc::new(Mutex::new(None::<FlightError>));
        let slot = failed.clone();
        let input = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .with_flight_descriptor(Some(path.descriptor()))
            .build(batches.map(Ok))
            .scan((), move |_, r| {
                let next = r.map_err(|e| slot.lock().map(|mut s| *s = Some(e))).ok();
                futures::future::ready(next)
            });
        let output = self
            .inner
            .clone()
            .do_exchange(input)
            .await
            .map_err(|s| self.status_error(s))?
            .into_inner();
        let agent = self.url.clone();
        let encode_error = futures::stream::once(async move {
            let e = failed.lock().ok().and_then(|mut s| s.take());
            e.map(|e| FeedError::Protocol {
                agent,
                reason: format!("could not encode the batches to predict: {e}"),
            })
        })
        .filter_map(|e| futures::future::ready(e.map(Err)));
        Ok(self
            .decode(output.map_err(|s| FlightError::Tonic(Box::new(s))))
            .chain(encode_error))
    }

    /// Decodes a Flight data stream from this agent into record batches.
    fn decode<S>(&self, stream: S) -> impl Stream<Item = Result<RecordBatch, FeedError>> + Send + 'static
    where
        S: Stream<Item = Result<arrow_flight::FlightData, FlightError>> + Send + 'static,
    {
        let agent = self.url.clone();
        FlightRecordBatchStream::new_from_flight_data(stream).map_err(move |e| match e {
            FlightError::Tonic(status) => FeedError::Agent {
                agent: agent.clone(),
                status,
            },
            other => FeedError::Protocol {
                agent: agent.clone(),
                reason: other.to_string(),
            },
        })
    }
}
