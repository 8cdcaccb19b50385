//! Executing a plan: a pulled stream of Arrow batches with reattach and ReleaseExecute.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::reader::StreamDecoder;
use futures::Stream;
use spark_connect_core::{ExecutePlanResponseReattachableIterator, RetryPolicyState};
use spark_connect_proto::execute_plan_response::ResponseType;
use spark_connect_proto::{ExecutePlanRequest, ExecutePlanResponse, Plan, ReleaseExecuteRequest};
use tonic::Streaming;

use crate::error::{Result, is_transport_failure};
use crate::transport::Transport;
use crate::types::spark_to_arrow_schema;

/// A boxed, `Send + 'static` stream of record batches.
///
/// ```no_run
/// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
/// use futures::StreamExt;
/// let mut batches: kindling_spark::RecordBatchStream = Box::pin(df.execute_stream().await?);
/// while let Some(batch) = batches.next().await { println!("{}", batch?.num_rows()); }
/// # Ok(()) }
/// ```
pub type RecordBatchStream = Pin<Box<dyn Stream<Item = Result<RecordBatch>> + Send + 'static>>;

/// The result of a Spark query as it arrives: one item per Arrow batch Spark sends,
/// never concatenated, so memory stays flat whatever the result size.
///
/// A dropped connection is resumed with `ReattachExecute` from the last response
/// received; the server's buffers are released as batches are consumed, and the
/// whole operation is released (and interrupted, if still running) when the stream
/// finishes or is dropped.
///
/// ```no_run
/// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
/// use futures::TryStreamExt;
/// let mut stream = spark.range(0, 10_000_000, 1).execute_stream().await?;
/// println!("schema: {}", stream.schema());
/// let mut rows = 0;
/// while let Some(batch) = stream.try_next().await? { rows += batch.num_rows(); }
/// assert_eq!(rows, 10_000_000);
/// # Ok(()) }
/// ```
pub struct SparkStream {
    schema: SchemaRef,
    inner: RecordBatchStream,
}

impl fmt::Debug for SparkStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SparkStream")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl SparkStream {
    /// The result schema: the first batch's, or the schema Spark announced for an
    /// empty result.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let stream = df.execute_stream().await?;
    /// for field in stream.schema().fields() { println!("{}", field.name()); }
    /// # Ok(()) }
    /// ```
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The plain boxed stream, dropping the schema handle.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let boxed: kindling_spark::RecordBatchStream = df.execute_stream().await?.into_inner();
    /// # Ok(()) }
    /// ```
    pub fn into_inner(self) -> RecordBatchStream {
        self.inner
    }
}

impl Stream for SparkStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// Starts `plan` and waits for its first batch (or its end) to learn the schema.
pub(crate) async fn execute(transport: &Transport, plan: Plan) -> Result<SparkStream> {
    let mut execution = Execution::start(transport, plan).await?;
    let first = execution.next_batch().await?;
    let schema = match (&first, execution.decoder.announced_schema()) {
        (Some(batch), _) => batch.schema(),
        (None, Some(schema)) => schema,
        (None, None) => Arc::new(Schema::empty()),
    };
    let rest = futures::stream::unfold(Some(execution), |state| async move {
        let mut execution = state?;
        match execution.next_batch().await {
            Ok(Some(batch)) => Some((Ok(batch), Some(execution))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    });
    let inner: RecordBatchStream = match first {
        Some(batch) => Box::pin(futures::StreamExt::chain(
            futures::stream::iter([Ok(batch)]),
            rest,
        )),
        None => Box::pin(rest),
    };
    Ok(SparkStream { schema, inner })
}

/// Runs a command plan to completion and returns its non-batch responses.
pub(crate) async fn execute_command(transport: &Transport, plan: Plan) -> Result<Vec<ExecutePlanResponse>> {
    let mut execution = Execution::start(transport, plan).await?;
    let mut responses = Vec::new();
    while let Some(response) = execution.next_response().await? {
        responses.push(response);
    }
    Ok(responses)
}

/// One reattachable ExecutePlan operation, pulled one response at a time.
struct Execution {
    transport: Transport,
    tracker: ExecutePlanResponseReattachableIterator,
    responses: Streaming<ExecutePlanResponse>,
    retry: RetryPolicyState,
    decoder: ResponseDecoder,
    complete: bool,
    unreleased: usize,
    /// Whether the retry budget was used since the last response (it is
    /// restored by the next response, so every drop gets the full budget).
    retried: bool,
    guard: ReleaseGuard,
}

/// Arrow responses between two ReleaseExecute(until) calls.
const RELEASE_EVERY: usize = 16;

impl Execution {
    async fn start(transport: &Transport, plan: Plan) -> Result<Self> {
        let request = ExecutePlanRequest {
            session_id: transport.session_id().to_string(),
            user_context: Some(transport.user_context()),
            client_type: Some(transport.client_type().to_string()),
            plan: Some(plan),
            ..Default::default()
        };
        let tracker = ExecutePlanResponseReattachableIterator::new(request);
        let request = tracker.request().clone();
        let responses = transport
            .retrying(|mut stub| {
                let request = request.clone();
                async move { stub.execute_plan(request).await }
            })
            .await?;
        let guard = ReleaseGuard {
            transport: Some(transport.clone()),
            request: tracker.create_release_request(true).await,
        };
        Ok(Self {
            transport: transport.clone(),
            tracker,
            responses,
            retry: RetryPolicyState::new(transport.retry_policy().clone()),
            decoder: ResponseDecoder::default(),
            complete: false,
            unreleased: 0,
            retried: false,
            guard,
        })
    }

    /// The next record batch with at least one row, or `None` when Spark is done.
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(batch) = self.decoder.next_batch() {
                return Ok(Some(batch));
            }
            let Some(response) = self.next_response().await? else {
                return Ok(None);
            };
            let arrow_bytes = match &response.response_type {
                Some(ResponseType::ArrowBatch(batch)) => Some(batch.data.len()),
                _ => None,
            };
            if let Some(n) = arrow_bytes {
                self.transport
                    .bytes_in
                    .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
            self.decoder.read(response)?;
            if arrow_bytes.is_some() {
                self.unreleased += 1;
                // Releasing every response would cost the server one RPC per
                // batch; every few is enough to bound its buffer.
                if self.unreleased >= RELEASE_EVERY {
                    self.unreleased = 0;
                    self.release_consumed().await;
                }
            }
        }
    }

    /// The next response, reattaching when the connection drops or the server
    /// ends the stream before `ResultComplete` (it does after a size/time budget).
    async fn next_response(&mut self) -> Result<Option<ExecutePlanResponse>> {
        loop {
            if self.complete {
                return Ok(None);
            }
            match self.responses.message().await {
                Ok(Some(response)) => {
                    if self.retried {
                        self.retried = false;
                        self.retry = RetryPolicyState::new(self.transport.retry_policy().clone());
                    }
                    self.tracker.set_last_response_id(&response).await;
                    if matches!(response.response_type, Some(ResponseType::ResultComplete(_))) {
                        self.complete = true;
                        self.guard.release_now();
                    }
                    return Ok(Some(response));
                }
                Ok(None) => self.reattach(None).await?,
                Err(status) => self.reattach(Some(status)).await?,
            }
        }
    }

    async fn reattach(&mut self, cause: Option<tonic::Status>) -> Result<()> {
        if let Some(status) = cause {
            // A broken connection surfaces mid-stream as a locally made status
            // (UNKNOWN "h2 protocol error", INTERNAL, ...) rather than UNAVAILABLE.
            if !(is_transport_failure(&status) || self.transport.retry_policy().can_retry(&status)) {
                return Err(self.transport.error(status));
            }
            tracing::debug!(%status, "Spark result stream broke; reattaching");
            self.backoff(status).await?;
        }
        loop {
            let request = self.tracker.create_reattach_request().await;
            tracing::debug!(operation = %request.operation_id, "reattaching to Spark execution");
            match self.transport.stub().reattach_execute(request).await {
                Ok(response) => {
                    self.responses = response.into_inner();
                    return Ok(());
                }
                Err(status) if self.transport.retry_policy().can_retry(&status) => {
                    self.backoff(status).await?;
                }
                Err(status) => return Err(self.transport.error(status)),
            }
        }
    }

    async fn backoff(&mut self, status: tonic::Status) -> Result<()> {
        self.retried = true;
        match self.retry.next_attempt(None) {
            Some(wait_ms) => {
                tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                Ok(())
            }
            None => Err(self.transport.error(status)),
        }
    }

    /// Lets the server drop responses we already hold (ReleaseUntil), off the hot path.
    async fn release_consumed(&self) {
        let request = self.tracker.create_release_request(false).await;
        if request.release.is_some() {
            spawn_release(self.transport.clone(), request);
        }
    }
}

/// What a result stream makes of Spark's `ExecutePlanResponse`s, one at a
/// time: the batches with rows of each Arrow batch, and the result's schema
/// as Spark announced it. Public so that any response can be given to it
/// (`tests/fuzz.rs`): a malformed one is an error of the call, never a panic.
#[derive(Debug, Default)]
pub struct ResponseDecoder {
    pending: VecDeque<RecordBatch>,
    announced_schema: Option<SchemaRef>,
}

impl ResponseDecoder {
    /// Reads one response: an Arrow batch (a complete IPC stream, schema
    /// and batches) queues its batches with rows and keeps its schema; any
    /// other response keeps the schema it announces, if it does.
    pub fn read(&mut self, response: ExecutePlanResponse) -> Result<()> {
        match response.response_type {
            Some(ResponseType::ArrowBatch(batch)) => {
                let decoded = decode_ipc_stream(batch.data)?;
                self.pending.extend(decoded.batches);
                if let Some(schema) = decoded.empty_batch_schema {
                    self.announced_schema = Some(schema);
                }
                if self.announced_schema.is_none() {
                    self.announced_schema = decoded.stream_schema;
                }
            }
            _ => {
                if let Some(schema) = response.schema {
                    self.announced_schema = Some(Arc::new(spark_to_arrow_schema(&schema)?));
                }
            }
        }
        Ok(())
    }

    /// The next batch read, in order.
    pub fn next_batch(&mut self) -> Option<RecordBatch> {
        self.pending.pop_front()
    }

    /// The result's schema as announced: by a schema response, an Arrow
    /// batch without rows, or the first Arrow batch's stream.
    pub fn announced_schema(&self) -> Option<SchemaRef> {
        self.announced_schema.clone()
    }
}

/// Releases (and so interrupts, if unfinished) the operation when dropped.
struct ReleaseGuard {
    transport: Option<Transport>,
    request: ReleaseExecuteRequest,
}

impl ReleaseGuard {
    fn release_now(&mut self) {
        if let Some(transport) = self.transport.take() {
            spawn_release(transport, self.request.clone());
        }
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        self.release_now();
    }
}

/// What one `arrow_batch.data` held.
#[derive(Debug)]
struct DecodedIpc {
    /// Its batches with at least one row.
    batches: Vec<RecordBatch>,
    /// The schema of its last batch without rows, if any.
    empty_batch_schema: Option<SchemaRef>,
    /// The schema its stream announced.
    stream_schema: Option<SchemaRef>,
}

/// Decodes one complete IPC stream without copying the message bytes.
/// arrow's IPC reader panics on some malformed messages (a buffer that
/// claims more bytes than the message body has: `kindling_schemas::ipc`);
/// such a panic becomes [`Error::Protocol`], failing this stream, not the
/// application's task that reads it.
fn decode_ipc_stream(data: bytes::Bytes) -> Result<DecodedIpc> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_ipc_unchecked(data))).unwrap_or_else(
        |panic| {
            let said = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("the decoder panicked");
            Err(crate::error::Error::Protocol(format!(
                "malformed Arrow IPC message: {said}"
            )))
        },
    )
}

/// [`decode_ipc_stream`], where arrow may panic.
fn decode_ipc_unchecked(data: bytes::Bytes) -> Result<DecodedIpc> {
    let mut decoder = StreamDecoder::new();
    let mut buffer = Buffer::from(data);
    let mut decoded = DecodedIpc {
        batches: Vec::new(),
        empty_batch_schema: None,
        stream_schema: None,
    };
    while !buffer.is_empty() {
        match decoder.decode(&mut buffer)? {
            Some(batch) if batch.num_rows() > 0 => decoded.batches.push(batch),
            Some(batch) => decoded.empty_batch_schema = Some(batch.schema()),
            None => {}
        }
    }
    decoder.finish()?;
    decoded.stream_schema = decoder.schema();
    Ok(decoded)
}

/// ReleaseExecute is best effort: the server also expires abandoned operations.
fn spawn_release(transport: Transport, request: ReleaseExecuteRequest) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        if let Err(status) = transport.stub().release_execute(request).await {
            tracing::debug!(%status, "ReleaseExecute failed");
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::ipc::writer::StreamWriter;

    use super::*;
    use crate::error::Error;

    fn ipc_stream() -> Vec<u8> {
        let batch = RecordBatch::try_from_iter([
            ("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
            ("s", Arc::new(StringArray::from(vec!["a", "bc", "def"])) as _),
        ])
        .unwrap();
        let mut writer = StreamWriter::try_new(Vec::new(), &batch.schema()).unwrap();
        writer.write(&batch).unwrap();
        writer.into_inner().unwrap()
    }

    /// Every one-byte change of a valid stream decodes or is an error of
    /// the call, and some of them make arrow's own decoder panic (so the
    /// test does reach the case it is for).
    #[test]
    fn a_malformed_arrow_message_from_spark_is_an_error_not_a_panic() {
        let good = ipc_stream();
        let decoded = decode_ipc_stream(bytes::Bytes::from(good.clone())).unwrap();
        assert_eq!(decoded.batches[0].num_rows(), 3);
        let mut panics = 0;
        for i in 0..good.len() {
            for value in [0x7f, 0xff, 0x40] {
                let mut bad = good.clone();
                bad[i] = value;
                let arrow_panics =
                    std::panic::catch_unwind(|| decode_ipc_unchecked(bytes::Bytes::from(bad.clone())))
                        .is_err();
                let ours = std::panic::catch_unwind(|| decode_ipc_stream(bytes::Bytes::from(bad)))
                    .unwrap_or_else(|_| panic!("decoding panicked at byte {i} = {value:#x}"));
                if arrow_panics {
                    panics += 1;
                    let err = ours.unwrap_err();
                    assert!(matches!(err, Error::Protocol(_)), "{err}");
                    assert!(err.to_string().contains("malformed Arrow IPC message"), "{err}");
                }
            }
        }
        assert!(
            panics > 0,
            "no change made arrow's decoder panic: the test reaches nothing"
        );
    }
}
