//! The agent's Arrow Flight adapter: decodes `DoPut` ingest (bookkeeping in
//! [`crate::jobs::ingest`]), actions, the trained model through `DoGet`, and
//! `DoExchange` prediction (inference in [`crate::serving::predict`]); every error
//! leaves through [`AgentError`]'s one mapping to `Status`.

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::decode::DecodedPayload;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action as FlightAction, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint,
    FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use futures::{Stream, StreamExt, TryStreamExt};
use kindling_schemas::action::{Action, ActionKind, EndOfDataResponse, JobList, StartJobResponse};
use kindling_schemas::auth::Caller;
use kindling_schemas::credential::Role;
use kindling_schemas::descriptor::DataPath;
use kindling_schemas::metadata::{BatchMetadata, PutAck};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{AgentError, IngestError, InternalError, JobStateError, LimitError, RequestError};
use crate::jobs::JobRegistry;
use crate::jobs::ingest::{self, PutStream};
use crate::models::kindling_model::{AnyModel, ModelRegistry};
use crate::models::params;
use crate::process::reads::{Encoded, EncodedModels, ModelVersion, ReadSlots};
use crate::serving::predict;
use crate::training::trainer;

mod rows;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The Flight service of one agent.
#[derive(Debug, Clone)]
pub struct AgentFlightService {
    jobs: Arc<JobRegistry>,
    actions: Arc<crate::process::metrics::ActionCounts>,
    reads: Arc<ReadSlots>,
    encoded: Arc<EncodedModels>,
}

impl AgentFlightService {
    /// A job credential must name the incarnation of the job `job_id` is
    /// on this agent (a job created again under an old id refuses the old
    /// job's credentials), or the version of the model this agent serves
    /// under it. An id this agent does not know passes here and is refused
    /// by the lookup after.
    fn check_incarnation(&self, caller: &Caller, job_id: &str) -> Result<(), Status> {
        if !matches!(caller, Caller::Job(_)) {
            return Ok(());
        }
        match self.jobs.get(job_id) {
            Ok(job) => caller.allow_incarnation(job.incarnation),
            Err(_) => match self.jobs.served().get(job_id) {
                Some(served) => caller.allow_incarnation(served.incarnation),
                None => Ok(()),
            },
        }
    }

    /// Serves the jobs in `jobs`, counting the actions it answers in
    /// `actions`, with at most the registry's `max_reads` model reads in flight.
    pub fn new(jobs: Arc<JobRegistry>, actions: Arc<crate::process::metrics::ActionCounts>) -> Self {
        AgentFlightService {
            reads: Arc::new(ReadSlots::new(jobs.max_reads())),
            jobs,
            actions,
            encoded: Arc::default(),
        }
    }
}

fn ok_json<T: serde::Serialize>(value: &T) -> Result<Response<BoxStream<arrow_flight::Result>>, Status> {
    let body = serde_json::to_vec(value).map_err(InternalError::ResponseJson)?;
    let stream = futures::stream::once(async move { Ok(arrow_flight::Result { body: body.into() }) });
    Ok(Response::new(Box::pin(stream)))
}

fn flight_status(e: FlightError) -> Status {
    AgentError::from(e).into()
}

/// A status from decoding the caller's stream; a message over the server's
/// size limit is said to be over this agent's cap, with its name.
fn inbound(status: Status) -> Status {
    if status.code() == tonic::Code::OutOfRange && status.message().contains("message length too large") {
        return LimitError::MessageTooLarge {
            message: status.message().to_owned(),
        }
        .into();
    }
    status
}

/// The first message of a `DoPut` or `DoExchange` and the path its
/// descriptor names; a caller that sends none within the idle bound holds
/// its stream slot no longer.
async fn open_stream(
    call: &'static str,
    input: &mut Streaming<FlightData>,
    limits: &crate::cache::StagingLimits,
) -> Result<(FlightData, DataPath), AgentError> {
    let too_old = tokio::time::Instant::now() + limits.stream_max_age;
    let first = in_time(call, input.message(), limits, too_old)
        .await?
        .map_err(|s| AgentError::caller_stream(&inbound(s)))?
        .ok_or(RequestError::EmptyStream { call })?;
    let descriptor = first
        .flight_descriptor
        .as_ref()
        .ok_or(RequestError::NoDescriptor { call })?;
    let path = DataPath::from_descriptor(descriptor)?;
    Ok((first, path))
}

fn put_result(ack: &PutAck) -> PutResult {
    PutResult {
        app_metadata: ack.encode().into(),
    }
}

#[tonic::async_trait]
impl FlightService for AgentFlightService {
    type HandshakeStream = BoxStream<HandshakeResponse>;
    type ListFlightsStream = BoxStream<FlightInfo>;
    type DoGetStream = BoxStream<FlightData>;
    type DoPutStream = BoxStream<PutResult>;
    type DoExchangeStream = BoxStream<FlightData>;
    type DoActionStream = BoxStream<arrow_flight::Result>;
    type ListActionsStream = BoxStream<ActionType>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(
            RequestError::Unsupported("no handshake: send `authorization: Bearer <token>` on every call")
                .into(),
        )
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Caller::of(&request).operator_only("list every job's models")?;
        let mut infos = Vec::new();
        for job in self.jobs.all() {
            if job.model.lock().ok().is_some_and(|m| m.is_some()) {
                let path = DataPath::Model {
                    job_id: job.job_id.clone(),
                };
                let _slot = self.reads.take(&Caller::Operator).map_err(AgentError::from)?;
                infos.push(Ok(model_info(&path, &*self.encoded_model(&path).await?)?));
            }
        }
        Ok(Response::new(Box::pin(futures::stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let path = DataPath::from_descriptor(request.get_ref()).map_err(AgentError::from)?;
        let caller = Caller::of(&request);
        caller.allow(path.job_id(), &[Role::Reader], "read a model")?;
        self.check_incarnation(&caller, path.job_id())?;
        let _slot = self.reads.take(&caller).map_err(AgentError::from)?;
        let encoded = self.encoded_model(&path).await?;
        Ok(Response::new(model_info(&path, &encoded)?))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(RequestError::Unsupported("poll_flight_info: use get_flight_info").into())
    }

    async fn get_schema(&self, request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        let path = DataPath::from_descriptor(request.get_ref()).map_err(AgentError::from)?;
        match path {
            DataPath::Model { .. } | DataPath::Checkpoint { .. } => {
                let schema = params::model_schema();
                let result: SchemaResult = SchemaAsIpc::new(&schema, &Default::default())
                    .try_into()
                    .map_err(AgentError::arrow)?;
                Ok(Response::new(result))
            }
            other => Err(RequestError::NoSchema(other.segments()).into()),
        }
    }

    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let path = DataPath::from_ticket(request.get_ref()).map_err(AgentError::from)?;
        let caller = Caller::of(&request);
        if let DataPath::Rows {
            job_id,
            split,
            producer,
        } = &path
        {
            return self.get_rows(&caller, (job_id, *split, producer));
        }
        caller.allow(path.job_id(), &[Role::Reader], "read a model")?;
        self.check_incarnation(&caller, path.job_id())?;
        // A slot for as long as the read; a caller that stops reading is
        // ended after the idle bound (the error queued after what it has
        // not read).
        let slot = self.reads.take(&caller).map_err(AgentError::from)?;
        let encoded = self.encoded_model(&path).await?;
        let messages =
            futures::stream::iter((0..encoded.messages.len()).map(move |i| Ok(encoded.messages[i].clone())));
        let body = sent_in_time("DoGet", messages, self.jobs.staging(), ());
        // The slot lives as long as the response: what the client has not
        // read yet is held for it until it reads, resets the call or goes.
        Ok(Response::new(Box::pin(body.map(move |m| {
            let _read = &slot;
            m
        }))))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let caller = Caller::of(&request);
        // A credential is checked before any message is read (a message may
        // be as large as the decoding limit): it must be a producer's, for a
        // job on this agent, of its current incarnation.
        if let Caller::Job(claims) = &caller {
            caller.allow(&claims.job_id, &[Role::Producer], "put rows")?;
            self.jobs.get(&claims.job_id)?;
            self.check_incarnation(&caller, &claims.job_id)?;
        }
        let slot = self.jobs.stream_slot(&caller)?;
        let mut input = request.into_inner();
        let (first, path) = open_stream("DoPut", &mut input, &self.jobs.staging()).await?;
        let DataPath::Data { job_id, split } = path else {
            return Err(RequestError::WrongPath {
                call: "DoPut",
                expected: "[job_id, train|eval]",
                got: path.segments(),
            }
            .into());
        };
        caller.allow(&job_id, &[Role::Producer], "put rows")?;
        let job = self.jobs.get(&job_id)?;
        let counted = job.clone();
        let (tx, rx) = mpsc::channel(64);
        let messages = futures::stream::once(async move { Ok(first) })
            .chain(input.map_err(|s| FlightError::Tonic(Box::new(inbound(s)))))
            .and_then(|m| futures::future::ready(kindling_schemas::ipc::no_dictionary(m)));
        let decoder = kindling_schemas::ipc::decode(messages);
        tokio::spawn(async move {
            let _slot = slot;
            let mut stream = PutStream::open(job, split);
            let committed = match receive_put(&mut stream, decoder, &tx).await {
                Ok(()) => stream.commit(),
                Err(e) => {
                    stream.abort();
                    Err(e)
                }
            };
            match committed {
                Ok(acks) => {
                    for ack in acks {
                        if tx.send(Ok(put_result(&ack))).await.is_err() {
                            break;
                        }
                    }
                }
                Err(e) => {
                    let status = Status::from(e);
                    *counted
                        .refused_puts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(format!("{:?}", status.code()))
                        .or_default() += 1;
                    let _ = tx.send(Err(status)).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        let caller = Caller::of(&request);
        // As for DoPut, a credential is checked before any message is read:
        // a reader's, of a job or served model here, of its current
        // incarnation, within its streams.
        if let Caller::Job(claims) = &caller {
            caller.allow(&claims.job_id, &[Role::Reader], "predict")?;
            if self.jobs.get(&claims.job_id).is_err() && self.jobs.served().get(&claims.job_id).is_none() {
                return Err(JobStateError::UnknownModel {
                    agent_id: self.jobs.agent_id().to_owned(),
                    model_id: claims.job_id.clone(),
                }
                .into());
            }
            self.check_incarnation(&caller, &claims.job_id)?;
        }
        let slot = self.jobs.stream_slot(&caller)?;
        let mut input = request.into_inner();
        let (first, path) = open_stream("DoExchange", &mut input, &self.jobs.staging()).await?;
        let DataPath::Predict { job_id } = &path else {
            return Err(RequestError::WrongPath {
                call: "DoExchange",
                expected: "[job_id, predict]",
                got: path.segments(),
            }
            .into());
        };
        caller.allow(job_id, &[Role::Reader], "predict")?;
        self.check_incarnation(&caller, job_id)?;
        // A job's own model, else a model served under that id.
        let (model, spec, served) = match self.jobs.get(job_id) {
            Ok(job) => {
                let model = self
                    .model_for(&DataPath::Model {
                        job_id: job_id.clone(),
                    })
                    .await?;
                (model, job.spec.clone(), None)
            }
            Err(_) => {
                let served = self
                    .jobs
                    .served()
                    .get(job_id)
                    .ok_or_else(|| JobStateError::UnknownModel {
                        agent_id: self.jobs.agent_id().to_owned(),
                        model_id: job_id.clone(),
                    })?;
                served.stream_opened();
                (served.model.clone(), served.spec.clone(), Some(served))
            }
        };
        // Arrow C++ (pyarrow) and Java clients open DoExchange with a message that
        // carries only the descriptor; it has no IPC header for the decoder.
        let first = (!first.data_header.is_empty()).then_some(first);
        let messages = futures::stream::iter(first.map(Ok))
            .chain(input.map_err(|s| FlightError::Tonic(Box::new(inbound(s)))))
            .try_filter(|m| futures::future::ready(!(m.data_header.is_empty() && m.data_body.is_empty())))
            .and_then(|m| futures::future::ready(kindling_schemas::ipc::no_dictionary(m)));
        let batches = predict::predict_stream(kindling_schemas::ipc::decode(messages), model, spec)
            .inspect_ok(move |b| {
                if let Some(s) = &served {
                    s.predicted(b.num_rows());
                }
            });
        let answers = FlightDataEncoderBuilder::new()
            .build(batches)
            .map_err(flight_status);
        // The credential's slot is held as long as the exchange.
        Ok(Response::new(sent_in_time(
            "DoExchange",
            answers,
            self.jobs.staging(),
            slot,
        )))
    }

    async fn do_action(
        &self,
        request: Request<FlightAction>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let caller = Caller::of(&request);
        let a = request.into_inner();
        let action = Action::parse(&a.r#type, &a.body).map_err(AgentError::from)?;
        self.actions.count(action.kind());
        match &action {
            // A producer or reader may follow its own job; nothing else.
            Action::JobStatus(r) => {
                caller.allow(&r.job_id, &[Role::Producer, Role::Reader], "read a job's status")?;
                self.check_incarnation(&caller, &r.job_id)?;
            }
            other => caller.operator_only(&format!("call `{}`", other.kind().name()))?,
        }
        match action {
            Action::CreateJob(create) => ok_json(&self.jobs.create_at_rendezvous(create).await?),
            Action::StartJob(start) => {
                self.jobs.start(start.clone()).await?;
                ok_json(&StartJobResponse {
                    job_id: start.job_id,
                    agent_id: self.jobs.agent_id().to_owned(),
                })
            }
            Action::JobStatus(r) => ok_json(&self.jobs.get(&r.job_id)?.status()),
            Action::CancelJob(c) => {
                let job = self.jobs.get(&c.job_id)?;
                job.cancel(&c.reason);
                ok_json(&job.status())
            }
            Action::EndOfData(e) => {
                let job = self.jobs.get(&e.job_id)?;
                let rows = ingest::end_of_data(&job, e.split, e.expected_rows)?;
                ok_json(&EndOfDataResponse {
                    job_id: e.job_id,
                    split: e.split,
                    rows,
                })
            }
            Action::ReopenSplit(r) => {
                let job = self.jobs.get(&r.job_id)?;
                let rows = ingest::reopen_split(&job, r.split, &r.drop_producers)?;
                ok_json(&EndOfDataResponse {
                    job_id: r.job_id,
                    split: r.split,
                    rows,
                })
            }
            Action::KeepRows(r) => ok_json(&self.jobs.keep_rows(&r.job_id).await?),
            Action::ListJobs => ok_json(&JobList {
                jobs: self.jobs.all().iter().map(|j| j.status()).collect(),
            }),
            Action::IssueCredential(i) => ok_json(&self.jobs.issue_credential(&i).await?),
            Action::ServeModel(serve) => {
                let jobs = self.jobs.clone();
                let answer = tokio::task::spawn_blocking(move || {
                    jobs.served().serve(jobs.agent_id(), jobs.models(), &serve)
                })
                .await
                .map_err(AgentError::panicked("loading a served model"))??;
                ok_json(&answer)
            }
            Action::DropModel(d) => {
                self.jobs.served().drop_model(self.jobs.agent_id(), &d.model_id)?;
                ok_json(&self.served_list())
            }
            Action::ServedModels => ok_json(&self.served_list()),
        }
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = ActionKind::ALL
            .iter()
            .map(|k| {
                Ok(ActionType {
                    r#type: k.name().into(),
                    description: k.description().into(),
                })
            })
            .collect::<Vec<_>>();
        Ok(Response::new(Box::pin(futures::stream::iter(actions))))
    }
}

impl AgentFlightService {
    fn served_list(&self) -> kindling_schemas::model_serving::ServedList {
        kindling_schemas::model_serving::ServedList {
            agent_id: self.jobs.agent_id().to_owned(),
            models: self.jobs.served().list(),
        }
    }

    /// The weights table of the model `path` names, encoded once per
    /// version of it: the trained model while the job keeps it, or the
    /// latest checkpoint's (read, decoded and encoded on the blocking pool
    /// by its first read only).
    async fn encoded_model(&self, path: &DataPath) -> Result<Arc<Encoded>, AgentError> {
        let job = self.jobs.get(path.job_id())?;
        let version = match path {
            DataPath::Model { .. } => ModelVersion::Trained(self.model_for(path).await?),
            DataPath::Checkpoint { .. } => {
                let store = crate::training::checkpoint::CheckpointStore::new(
                    self.jobs.checkpoint_dir(),
                    &job.job_id,
                    job.spec.checkpoint.keep_last,
                );
                let latest = tokio::task::spawn_blocking(move || store.list().pop())
                    .await
                    .map_err(AgentError::panicked("listing checkpoints"))?;
                let (at, attempt, _) =
                    latest.ok_or_else(|| JobStateError::NoCheckpoint(job.job_id.clone()))?;
                ModelVersion::Checkpoint {
                    incarnation: job.incarnation,
                    attempt,
                    at,
                }
            }
            other => return Err(RequestError::NotAModel(other.segments()).into()),
        };
        let checkpoint = matches!(version, ModelVersion::Checkpoint { .. });
        let encode = async {
            let model = match &version {
                ModelVersion::Trained(model) => model.clone(),
                ModelVersion::Checkpoint { .. } => self.model_for(path).await?,
            };
            let card = self.card_json(path.job_id())?;
            tokio::task::spawn_blocking(move || Encoded::of(model.as_ref(), card))
                .await
                .map_err(AgentError::panicked("encoding a model"))?
        };
        self.encoded
            .get_or_encode(&job, checkpoint, version.clone(), encode)
            .await
    }

    /// The job's [`ModelCard`](kindling_schemas::model_serving::ModelCard)
    /// as JSON, for its weights table's metadata (none for a job without
    /// data yet).
    fn card_json(&self, job_id: &str) -> Result<Option<String>, AgentError> {
        use kindling_schemas::model_serving::{ModelCard, model_inputs};
        let Ok(job) = self.jobs.get(job_id) else {
            return Ok(None);
        };
        let Some(layout) = job.lock().layout.clone() else {
            return Ok(None);
        };
        let card = ModelCard {
            job_id: job.job_id.clone(),
            spec: job.spec.clone(),
            input_dim: layout.input_dim,
            inputs: model_inputs(&layout),
        };
        Ok(Some(
            serde_json::to_string(&card).map_err(InternalError::ResponseJson)?,
        ))
    }

    /// The model `path` names: the trained one (in memory), or the latest
    /// checkpoint's, read and decoded on the blocking pool.
    async fn model_for(&self, path: &DataPath) -> Result<Arc<dyn AnyModel>, AgentError> {
        let job = self.jobs.get(path.job_id())?;
        match path {
            DataPath::Model { .. } => job.model.lock().ok().and_then(|m| m.clone()).ok_or_else(|| {
                AgentError::wrong_state(
                    &job.job_id,
                    job.status().state,
                    "the model is available once training succeeded",
                )
            }),
            DataPath::Checkpoint { .. } => {
                let dir = self.jobs.checkpoint_dir().to_owned();
                let models = self.jobs.models().clone();
                tokio::task::spawn_blocking(move || checkpoint_model(&dir, &models, &job))
                    .await
                    .map_err(AgentError::panicked("loading a checkpoint"))?
            }
            other => Err(RequestError::NotAModel(other.segments()).into()),
        }
    }
}

/// The model of `job`'s latest checkpoint under `dir` (file I/O and decoding).
fn checkpoint_model(
    dir: &std::path::Path,
    models: &ModelRegistry,
    job: &crate::jobs::job::Job,
) -> Result<Arc<dyn AnyModel>, AgentError> {
    let store =
        crate::training::checkpoint::CheckpointStore::new(dir, &job.job_id, job.spec.checkpoint.keep_last);
    let ckpt = store
        .load_latest()?
        .ok_or_else(|| JobStateError::NoCheckpoint(job.job_id.clone()))?;
    let layout = job.lock().layout.clone().ok_or(JobStateError::UnknownLayout)?;
    let device = trainer::device_for(&job.spec)?;
    let model = models.build(&job.spec, &layout, &device)?;
    Ok(Arc::from(model.from_record_bytes(ckpt.weights)?))
}

fn model_info(path: &DataPath, encoded: &Encoded) -> Result<FlightInfo, AgentError> {
    let info = FlightInfo::new()
        .try_with_schema(&params::model_schema())
        .map_err(AgentError::arrow)?
        .with_descriptor(path.descriptor())
        .with_endpoint(FlightEndpoint::new().with_ticket(path.ticket()))
        .with_total_records(encoded.rows)
        .with_total_bytes(encoded.bytes);
    Ok(info)
}

/// Feeds a decoded `DoPut` stream to `stream`, acknowledging each batch.
async fn receive_put(
    stream: &mut PutStream,
    mut decoder: kindling_schemas::ipc::Decoded,
    tx: &mpsc::Sender<Result<PutResult, Status>>,
) -> Result<(), AgentError> {
    // A stream that goes quiet, or stays open too long, is ended: what it
    // staged is nobody's until it commits, so it must not be held forever.
    let limits = stream.staging();
    let too_old = tokio::time::Instant::now() + limits.stream_max_age;
    loop {
        let Some(msg) = in_time("DoPut", decoder.next(), &limits, too_old).await? else {
            return Ok(());
        };
        let msg = msg.map_err(|e| match e {
            FlightError::Tonic(s) => IngestError::PutStreamBroke(s),
            other => IngestError::MalformedFlight(other),
        })?;
        match msg.payload {
            DecodedPayload::None => {}
            DecodedPayload::Schema(schema) => stream.accept_schema(&schema)?,
            DecodedPayload::RecordBatch(batch) => {
                let meta = BatchMetadata::decode(&msg.inner.app_metadata)?;
                let ack = stream.accept_batch(meta, batch).await?;
                // A producer that stops reading its acks is as quiet as one
                // that stops sending.
                in_time("DoPut", tx.send(Ok(put_result(&ack))), &limits, too_old)
                    .await?
                    .map_err(|_| IngestError::ProducerGone)?;
            }
        }
    }
}

/// `work`'s outcome, unless the `call`'s stream stays quiet for the idle
/// bound or reaches `too_old` first.
async fn in_time<T>(
    call: &'static str,
    work: impl std::future::Future<Output = T>,
    limits: &crate::cache::StagingLimits,
    too_old: tokio::time::Instant,
) -> Result<T, AgentError> {
    let quiet = tokio::time::Instant::now() + limits.stream_idle;
    let dropped = if call == "DoPut" {
        " and its staged rows dropped"
    } else {
        ""
    };
    tokio::time::timeout_at(quiet.min(too_old), work)
        .await
        .map_err(|_| {
            if quiet < too_old {
                LimitError::StreamIdle {
                    call,
                    idle: limits.stream_idle,
                    dropped,
                }
            } else {
                LimitError::StreamTooOld {
                    call,
                    max_age: limits.stream_max_age,
                    dropped,
                }
            }
            .into()
        })
}

/// The response stream of a `DoExchange`'s answers, or a `DoGet`'s
/// messages, fed by a task while the client keeps sending and reading: a
/// stream quiet for the idle bound (sending nothing, or reading no answer)
/// or open past its age is ended, and the caller's slot goes with it. The
/// client reads the error after what was already queued for it, never a
/// stream cut short that looks whole.
fn sent_in_time(
    call: &'static str,
    answers: impl Stream<Item = Result<FlightData, Status>> + Send + 'static,
    limits: crate::cache::StagingLimits,
    slot: impl Send + 'static,
) -> BoxStream<FlightData> {
    let (tx, rx) = mpsc::channel(2);
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _slot = slot;
        if let Err(e) = send_in_time(call, answers, tx, limits).await {
            tracing::info!(call, error = %e, "stream ended");
            let _ = ended_tx.send(Status::from(e));
        }
    });
    let ended = futures::stream::once(ended_rx).filter_map(|r| futures::future::ready(r.ok().map(Err)));
    Box::pin(ReceiverStream::new(rx).chain(ended))
}

/// Sends `answers` into `tx` within the idle and age bounds; `Ok` once
/// they are all sent or the client went away.
async fn send_in_time(
    call: &'static str,
    answers: impl Stream<Item = Result<FlightData, Status>>,
    tx: mpsc::Sender<Result<FlightData, Status>>,
    limits: crate::cache::StagingLimits,
) -> Result<(), AgentError> {
    let too_old = tokio::time::Instant::now() + limits.stream_max_age;
    let mut answers = std::pin::pin!(answers);
    while let Some(next) = in_time(call, answers.next(), &limits, too_old).await? {
        if in_time(call, tx.send(next), &limits, too_old).await?.is_err() {
            // The client is gone.
            return Ok(());
        }
    }
    Ok(())
}
