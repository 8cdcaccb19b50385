//! The agent's Arrow Flight service: `DoPut` ingest with exactly-once
//! acknowledgements, actions, the trained model through `DoGet`, and
//! prediction through `DoExchange`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Int64Array, ListArray, RecordBatch};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action as FlightAction, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint,
    FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use burn::tensor::activation::softmax;
use futures::{Stream, StreamExt, TryStreamExt};
use kindling_schemas::action::{Action, ActionKind, EndOfDataResponse, JobList, StartJobResponse};
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::metadata::{BatchMetadata, PutAck};
use kindling_schemas::schema::{self, FeatureLayout, StreamKind};
use kindling_schemas::spec::{JobSpec, Task};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::AgentError;
use crate::job::Job;
use crate::model::Net;
use crate::registry::JobRegistry;
use crate::{params, tensorize, trainer};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The Flight service of one agent.
#[derive(Debug, Clone)]
pub struct AgentFlightService {
    jobs: Arc<JobRegistry>,
}

impl AgentFlightService {
    /// Serves the jobs in `jobs`.
    pub fn new(jobs: Arc<JobRegistry>) -> Self {
        AgentFlightService { jobs }
    }
}

fn ok_json<T: serde::Serialize>(value: &T) -> Result<Response<BoxStream<arrow_flight::Result>>, Status> {
    let body = serde_json::to_vec(value).map_err(|e| Status::internal(e.to_string()))?;
    let stream = futures::stream::once(async move { Ok(arrow_flight::Result { body: body.into() }) });
    Ok(Response::new(Box::pin(stream)))
}

fn flight_err(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(s) => *s,
        other => Status::invalid_argument(format!("malformed Flight stream: {other}")),
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
        Err(Status::unimplemented(
            "no handshake: send `authorization: Bearer <token>` on every call",
        ))
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let mut infos = Vec::new();
        for job in self.jobs.all() {
            if let Some(model) = job.model.lock().ok().and_then(|m| m.clone()) {
                infos.push(Ok(model_info(
                    &DataPath::Model {
                        job_id: job.job_id.clone(),
                    },
                    &model,
                )?));
            }
        }
        Ok(Response::new(Box::pin(futures::stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let path = DataPath::from_descriptor(request.get_ref()).map_err(AgentError::from)?;
        let model = self.model_for(&path)?;
        Ok(Response::new(model_info(&path, &model)?))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info: use get_flight_info"))
    }

    async fn get_schema(&self, request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        let path = DataPath::from_descriptor(request.get_ref()).map_err(AgentError::from)?;
        match path {
            DataPath::Model { .. } | DataPath::Checkpoint { .. } => {
                let schema = params::model_schema();
                let result: SchemaResult = SchemaAsIpc::new(&schema, &Default::default())
                    .try_into()
                    .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
                Ok(Response::new(result))
            }
            other => Err(Status::invalid_argument(format!(
                "no schema for {:?}",
                other.segments()
            ))),
        }
    }

    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let path = DataPath::from_ticket(request.get_ref()).map_err(AgentError::from)?;
        let model = self.model_for(&path)?;
        let table = params::to_arrow(&model)?;
        let stream = FlightDataEncoderBuilder::new()
            .build(futures::stream::once(async move { Ok(table) }))
            .map_err(flight_err);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let mut input = request.into_inner();
        let first = input.message().await?.ok_or_else(|| {
            Status::invalid_argument("empty DoPut: the first message must carry the descriptor")
        })?;
        let descriptor = first
            .flight_descriptor
            .clone()
            .ok_or_else(|| Status::invalid_argument("the first DoPut message has no flight descriptor"))?;
        let path = DataPath::from_descriptor(&descriptor).map_err(AgentError::from)?;
        let DataPath::Data { job_id, split } = path else {
            return Err(Status::invalid_argument(format!(
                "DoPut takes [job_id, train|eval], not {:?}",
                path.segments()
            )));
        };
        let job = self.jobs.get(&job_id)?;
        let (tx, rx) = mpsc::channel(64);
        let messages = futures::stream::once(async move { Ok(first) })
            .chain(input.map_err(|s| FlightError::Tonic(Box::new(s))));
        let decoder = FlightDataDecoder::new(messages);
        tokio::spawn(async move {
            let mut ingest = Ingest::new(job.clone(), split);
            let result = ingest.run(decoder, &tx).await;
            match result {
                Ok(()) => {
                    for ack in ingest.commit() {
                        if tx
                            .send(Ok(PutResult {
                                app_metadata: ack.encode().into(),
                            }))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
                Err(e) => {
                    ingest.abort();
                    let _ = tx.send(Err(e.into())).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        let mut input = request.into_inner();
        let first = input.message().await?.ok_or_else(|| {
            Status::invalid_argument("empty DoExchange: the first message must carry the descriptor")
        })?;
        let descriptor = first.flight_descriptor.clone().ok_or_else(|| {
            Status::invalid_argument("the first DoExchange message has no flight descriptor")
        })?;
        let path = DataPath::from_descriptor(&descriptor).map_err(AgentError::from)?;
        let DataPath::Predict { job_id } = &path else {
            return Err(Status::invalid_argument(format!(
                "DoExchange takes [job_id, predict], not {:?}",
                path.segments()
            )));
        };
        let model = self.model_for(&DataPath::Model {
            job_id: job_id.clone(),
        })?;
        let spec = self.jobs.get(job_id)?.spec.clone();
        // Arrow C++ (pyarrow) and Java clients open DoExchange with a message that
        // carries only the descriptor; it has no IPC header for the decoder.
        let first = (!first.data_header.is_empty()).then_some(first);
        let messages = futures::stream::iter(first.map(Ok))
            .chain(input.map_err(|s| FlightError::Tonic(Box::new(s))))
            .try_filter(|m| futures::future::ready(!(m.data_header.is_empty() && m.data_body.is_empty())));
        let batches = predict_stream(FlightDataDecoder::new(messages), model, spec);
        let out = FlightDataEncoderBuilder::new().build(batches).map_err(flight_err);
        Ok(Response::new(Box::pin(out)))
    }

    async fn do_action(
        &self,
        request: Request<FlightAction>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let a = request.into_inner();
        let action =
            Action::parse(&a.r#type, &a.body).map_err(|e| AgentError::InvalidInput(e.to_string()))?;
        match action {
            Action::StartJob(start) => {
                self.jobs.start(start.clone())?;
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
                let rows = {
                    let mut d = job.lock();
                    if d.state.is_terminal() {
                        return Err(AgentError::WrongState {
                            job_id: e.job_id,
                            state: format!("{:?}", d.state).to_lowercase(),
                            reason: "it takes no more data".into(),
                        }
                        .into());
                    }
                    let rows = match e.split {
                        Split::Train => d.train.committed_rows(),
                        Split::Eval => d.eval.committed_rows(),
                    };
                    if let Some(expected) = e.expected_rows
                        && expected != rows
                    {
                        return Err(Status::failed_precondition(format!(
                            "end_of_data for {} of job `{}`: {rows} rows committed here, the producer expected {expected}",
                            e.split.as_str(),
                            e.job_id
                        )));
                    }
                    d.end_of_data.insert(e.split, true);
                    rows
                };
                job.notify_data();
                ok_json(&EndOfDataResponse {
                    job_id: e.job_id,
                    split: e.split,
                    rows,
                })
            }
            Action::ListJobs => ok_json(&JobList {
                jobs: self.jobs.all().iter().map(|j| j.status()).collect(),
            }),
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
    fn model_for(&self, path: &DataPath) -> Result<Arc<Net>, Status> {
        let job = self.jobs.get(path.job_id())?;
        match path {
            DataPath::Model { .. } => job.model.lock().ok().and_then(|m| m.clone()).ok_or_else(|| {
                let state = job.status().state;
                AgentError::WrongState {
                    job_id: job.job_id.clone(),
                    state: format!("{state:?}").to_lowercase(),
                    reason: "the model is available once training succeeded".into(),
                }
                .into()
            }),
            DataPath::Checkpoint { .. } => {
                let store = crate::checkpoint::CheckpointStore::new(
                    self.jobs.checkpoint_dir(),
                    &job.job_id,
                    job.spec.checkpoint.keep_last,
                );
                let ckpt = store.load_latest()?.ok_or_else(|| {
                    Status::not_found(format!(
                        "job `{}` has no checkpoint on this agent yet",
                        job.job_id
                    ))
                })?;
                let layout = job.lock().layout.clone().ok_or_else(|| {
                    Status::failed_precondition("the checkpoint's input layout is unknown: no data arrived")
                })?;
                let device = trainer::device_for(&job.spec)?;
                let net = Net::new(&job.spec, layout.input_dim, &device);
                Ok(Arc::new(params::from_record_bytes(net, ckpt.weights)?))
            }
            other => Err(Status::invalid_argument(format!(
                "{:?} is not a model: use [job_id, model] or [job_id, checkpoint]",
                other.segments()
            ))),
        }
    }
}

fn model_info(path: &DataPath, model: &Net) -> Result<FlightInfo, Status> {
    let table = params::to_arrow(model)?;
    let info = FlightInfo::new()
        .try_with_schema(&params::model_schema())
        .map_err(|e| Status::internal(e.to_string()))?
        .with_descriptor(path.descriptor())
        .with_endpoint(FlightEndpoint::new().with_ticket(path.ticket()))
        .with_total_records(table.num_rows() as i64)
        .with_total_bytes(table.get_array_memory_size() as i64);
    Ok(info)
}

/// What one stream staged for one producer.
#[derive(Debug, Clone, Copy)]
struct Staged {
    /// The producer's committed position when the stream started staging.
    first: u64,
    /// Next expected sequence number.
    next: u64,
    /// Rows staged.
    rows: u64,
}

/// The state of one `DoPut` stream.
struct Ingest {
    job: Arc<Job>,
    split: Split,
    stream: u64,
    /// Per producer, what this stream staged.
    staged: HashMap<String, Staged>,
    /// Producers whose batches in this stream were all already committed.
    duplicates_only: std::collections::HashSet<String>,
    schema_seen: bool,
}

impl Ingest {
    fn new(job: Arc<Job>, split: Split) -> Self {
        let stream = {
            let mut d = job.lock();
            d.next_stream += 1;
            d.next_stream
        };
        Ingest {
            job,
            split,
            stream,
            staged: HashMap::new(),
            duplicates_only: Default::default(),
            schema_seen: false,
        }
    }

    async fn run(
        &mut self,
        mut decoder: FlightDataDecoder,
        tx: &mpsc::Sender<Result<PutResult, Status>>,
    ) -> Result<(), AgentError> {
        while let Some(msg) = decoder.next().await {
            let msg = msg.map_err(|e| match e {
                FlightError::Tonic(s) => {
                    AgentError::InvalidInput(format!("DoPut stream broke: {}", s.message()))
                }
                other => AgentError::InvalidInput(format!("malformed Flight data: {other}")),
            })?;
            match msg.payload {
                DecodedPayload::None => {}
                DecodedPayload::Schema(schema) => self.accept_schema(&schema)?,
                DecodedPayload::RecordBatch(batch) => {
                    if !self.schema_seen {
                        return Err(AgentError::InvalidInput("record batch before schema".into()));
                    }
                    let meta = BatchMetadata::decode(&msg.inner.app_metadata)
                        .map_err(|e| AgentError::InvalidInput(e.to_string()))?;
                    let ack = self.accept_batch(meta, batch)?;
                    if tx
                        .send(Ok(PutResult {
                            app_metadata: ack.encode().into(),
                        }))
                        .await
                        .is_err()
                    {
                        return Err(AgentError::InvalidInput(
                            "the producer went away before the end of its stream".into(),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn accept_schema(&mut self, schema: &Schema) -> Result<(), AgentError> {
        let layout = schema::validate(schema, &self.job.spec, StreamKind::Train)?;
        let mut d = self.job.lock();
        if d.state.is_terminal() {
            return Err(AgentError::WrongState {
                job_id: self.job.job_id.clone(),
                state: format!("{:?}", d.state).to_lowercase(),
                reason: "it takes no more data".into(),
            });
        }
        match &d.layout {
            Some(existing) if !same_layout(existing, &layout) => {
                return Err(AgentError::InvalidInput(format!(
                    "stream layout {:?} differs from the job's earlier streams {:?}",
                    layout.features, existing.features
                )));
            }
            Some(_) => {}
            None => d.layout = Some(layout),
        }
        self.schema_seen = true;
        Ok(())
    }

    fn accept_batch(&mut self, meta: BatchMetadata, batch: RecordBatch) -> Result<PutAck, AgentError> {
        schema::validate_batch(&batch, &self.job.spec)?;
        let rows = batch.num_rows() as u64;
        let mut d = self.job.lock();
        let committed = d
            .producers
            .get(&(self.split, meta.producer.clone()))
            .copied()
            .unwrap_or_default();
        if meta.seq < committed.next_seq && !self.staged.contains_key(&meta.producer) {
            self.duplicates_only.insert(meta.producer.clone());
            let bytes = schema::batch_bytes(&batch);
            return Ok(PutAck {
                producer: meta.producer,
                seq: meta.seq,
                rows,
                duplicate: true,
                committed: false,
                bytes,
            });
        }
        let staged = self.staged.entry(meta.producer.clone()).or_insert(Staged {
            first: committed.next_seq,
            next: committed.next_seq,
            rows: 0,
        });
        if meta.seq != staged.next {
            return Err(AgentError::InvalidInput(format!(
                "producer `{}` sent seq {} but {} is the next expected (gap or reorder)",
                meta.producer, meta.seq, staged.next
            )));
        }
        let cache = match self.split {
            Split::Train => &mut d.train,
            Split::Eval => &mut d.eval,
        };
        let bytes = cache.append(self.stream, batch)?;
        staged.next += 1;
        staged.rows += rows;
        Ok(PutAck {
            producer: meta.producer,
            seq: meta.seq,
            rows,
            duplicate: false,
            committed: false,
            bytes,
        })
    }

    /// Makes the stream's rows part of the shard, all or nothing: if another
    /// stream of the same producer committed first (a retried or speculative
    /// task), this stream's rows are dropped and reported as duplicates. One
    /// final ack per producer.
    fn commit(&mut self) -> Vec<PutAck> {
        let mut acks = Vec::new();
        {
            let mut d = self.job.lock();
            let split = self.split;
            let still_next = self.staged.iter().all(|(producer, st)| {
                d.producers
                    .get(&(split, producer.clone()))
                    .copied()
                    .unwrap_or_default()
                    .next_seq
                    == st.first
            });
            match (split, still_next) {
                (Split::Train, true) => d.train.commit(self.stream),
                (Split::Eval, true) => d.eval.commit(self.stream),
                (Split::Train, false) => d.train.abort(self.stream),
                (Split::Eval, false) => d.eval.abort(self.stream),
            }
            for (producer, st) in self.staged.drain() {
                let pos = d.producers.entry((split, producer.clone())).or_default();
                if still_next {
                    pos.next_seq = st.next;
                    pos.rows += st.rows;
                }
                acks.push(PutAck {
                    producer,
                    seq: st.next.saturating_sub(1),
                    rows: pos.rows,
                    duplicate: !still_next,
                    committed: true,
                    bytes: 0,
                });
            }
            for producer in self.duplicates_only.drain() {
                if acks.iter().any(|a| a.producer == producer) {
                    continue;
                }
                let pos = d
                    .producers
                    .get(&(split, producer.clone()))
                    .copied()
                    .unwrap_or_default();
                acks.push(PutAck {
                    producer,
                    seq: pos.next_seq.saturating_sub(1),
                    rows: pos.rows,
                    duplicate: true,
                    committed: true,
                    bytes: 0,
                });
            }
        }
        self.job.notify_data();
        acks
    }

    fn abort(&mut self) {
        let mut d = self.job.lock();
        match self.split {
            Split::Train => d.train.abort(self.stream),
            Split::Eval => d.eval.abort(self.stream),
        }
    }
}

fn same_layout(a: &FeatureLayout, b: &FeatureLayout) -> bool {
    a.input_dim == b.input_dim
        && a.features
            .iter()
            .map(|f| &f.name)
            .eq(b.features.iter().map(|f| &f.name))
}

/// Streams predictions for decoded feature batches.
fn predict_stream(
    decoder: FlightDataDecoder,
    model: Arc<Net>,
    spec: JobSpec,
) -> impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static {
    let mut layout: Option<FeatureLayout> = None;
    decoder.filter_map(move |msg| {
        let model = model.clone();
        let spec = spec.clone();
        let result = match msg {
            Err(e) => Some(Err(e)),
            Ok(m) => match m.payload {
                DecodedPayload::None => None,
                DecodedPayload::Schema(schema) => match schema::validate(&schema, &spec, StreamKind::Predict)
                {
                    Ok(l) => {
                        layout = Some(l);
                        None
                    }
                    Err(e) => Some(Err(FlightError::Tonic(Box::new(Status::invalid_argument(
                        e.to_string(),
                    ))))),
                },
                DecodedPayload::RecordBatch(batch) => Some(match &layout {
                    None => Err(FlightError::protocol("record batch before schema")),
                    Some(l) => predict_batch(&model, &spec, l, &batch)
                        .map_err(|e| FlightError::Tonic(Box::new(Status::from(e)))),
                }),
            },
        };
        futures::future::ready(result)
    })
}

/// Appends prediction columns to `batch`: `prediction` (class or value) and,
/// for classification, `probabilities` (`List<Float32>`, one per class).
pub fn predict_batch(
    model: &Net,
    spec: &JobSpec,
    layout: &FeatureLayout,
    batch: &RecordBatch,
) -> Result<RecordBatch, AgentError> {
    let features_only = {
        let s = batch.schema();
        let cols: Vec<usize> = layout
            .features
            .iter()
            .filter_map(|f| s.index_of(&f.name).ok())
            .collect();
        batch.project(&cols).map_err(AgentError::arrow)?
    };
    let label_free = JobSpec {
        label: String::new(),
        ..spec.clone()
    };
    schema::validate_batch(&features_only, &label_free)?;
    let device = trainer::device_for(spec)?;
    let out = model.forward(tensorize::features(&features_only, layout, &device)?);
    let n = batch.num_rows();
    let mut fields: Vec<Arc<Field>> = batch.schema().fields().iter().cloned().collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    match spec.task {
        Task::Classification { num_classes } => {
            let probs = softmax(out, 1);
            let classes = probs.clone().argmax(1).into_data().convert::<i64>();
            let classes = classes
                .as_slice::<i64>()
                .map_err(|e| AgentError::Training(format!("{e:?}")))?
                .to_vec();
            let p = probs.into_data().convert::<f32>();
            let p = p
                .as_slice::<f32>()
                .map_err(|e| AgentError::Training(format!("{e:?}")))?
                .to_vec();
            // A variable-size list: Spark has no FixedSizeList type, and predictions
            // often go straight back into Spark.
            let item = Arc::new(Field::new("item", DataType::Float32, false));
            let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(num_classes, n));
            let list = ListArray::new(item.clone(), offsets, Arc::new(Float32Array::from(p)), None);
            fields.push(Arc::new(Field::new("prediction", DataType::Int64, false)));
            fields.push(Arc::new(Field::new("probabilities", DataType::List(item), false)));
            columns.push(Arc::new(Int64Array::from(classes)));
            columns.push(Arc::new(list));
        }
        Task::Regression => {
            let v = out.reshape([n]).into_data().convert::<f32>();
            let v = v
                .as_slice::<f32>()
                .map_err(|e| AgentError::Training(format!("{e:?}")))?
                .to_vec();
            fields.push(Arc::new(Field::new("prediction", DataType::Float32, false)));
            columns.push(Arc::new(Float32Array::from(v)));
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(AgentError::arrow)
}
