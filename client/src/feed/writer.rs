//! One producer's rows to one agent: [`ShardWriter`] (one `DoPut` with
//! bounded bytes in flight) and [`CommittingWriter`] (consecutive `DoPut`s of
//! about `commit_bytes`), each checking what the agent committed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, SchemaAsIpc};
use futures::StreamExt;
use kindling_schemas::auth::BearerAttach;
use kindling_schemas::descriptor::DataPath;
use kindling_schemas::metadata::{BatchMetadata, PutAck};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::FeedError;

/// An agent's Flight service, the bearer token attached to every call.
pub(super) type FlightClient = FlightServiceClient<InterceptedService<Channel, BearerAttach>>;

/// What a writer needs of an agent: its address (named in errors) and its
/// Flight service (for `DoPut`) — no more of the agent's client.
#[derive(Debug, Clone)]
pub(super) struct PutTarget {
    agent: String,
    flight: FlightClient,
}

impl PutTarget {
    pub(super) fn new(agent: &str, flight: FlightClient) -> Self {
        PutTarget {
            agent: agent.to_owned(),
            flight,
        }
    }

    fn url(&self) -> &str {
        &self.agent
    }

    fn status_error(&self, s: tonic::Status) -> FeedError {
        FeedError::Agent {
            agent: self.agent.clone(),
            status: Box::new(s),
        }
    }
}

/// What an agent committed for one producer's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShardReceipt {
    /// Rows the agent holds for the producer after the commit.
    pub rows_committed: u64,
    /// Rows this stream sent.
    pub rows_sent: u64,
    /// Batches the agent already had (re-sent after a retry).
    pub duplicate_batches: u64,
    /// The whole stream was a duplicate of one committed earlier.
    pub duplicate_stream: bool,
    /// Arrow IPC bytes this stream sent.
    pub bytes_sent: u64,
}

/// What the final ack said: (rows committed, duplicate batches, duplicate stream).
type Commit = (u64, u64, bool);

/// One producer's `DoPut` to one agent, with at most `window` bytes unacknowledged.
#[derive(Debug)]
pub struct ShardWriter {
    agent: String,
    producer: String,
    tx: Option<mpsc::Sender<FlightData>>,
    window: Arc<Semaphore>,
    window_kib: u32,
    charged: Arc<Mutex<VecDeque<u32>>>,
    acks: JoinHandle<Result<Option<Commit>, FeedError>>,
    seq: u64,
    rows_sent: u64,
    bytes_sent: u64,
    generator: IpcDataGenerator,
    tracker: DictionaryTracker,
    options: IpcWriteOptions,
}

impl ShardWriter {
    pub(super) async fn open(
        client: PutTarget,
        path: &DataPath,
        producer: String,
        schema: &Schema,
        window_bytes: usize,
        first_seq: u64,
    ) -> Result<Self, FeedError> {
        let options = IpcWriteOptions::default();
        let mut schema_msg: FlightData = SchemaAsIpc::new(schema, &options).into();
        schema_msg.flight_descriptor = Some(path.descriptor());
        let (tx, rx) = mpsc::channel::<FlightData>(4);
        tx.send(schema_msg).await.map_err(|_| FeedError::Protocol {
            agent: client.url().to_owned(),
            reason: "request stream closed before it started".into(),
        })?;
        let window_kib = (window_bytes / 1024).clamp(1, u32::MAX as usize >> 4) as u32;
        let window = Arc::new(Semaphore::new(window_kib as usize));
        let charged = Arc::new(Mutex::new(VecDeque::new()));
        let agent = client.url().to_owned();
        let acks = {
            let window = window.clone();
            let charged = charged.clone();
            let producer = producer.clone();
            tokio::spawn(async move {
                let result = read_acks(&client, rx, &producer, &window, &charged).await;
                // Wake a writer blocked on the window: the stream is over.
                window.close();
                result
            })
        };
        Ok(ShardWriter {
            agent,
            producer,
            tx: Some(tx),
            window,
            window_kib,
            charged,
            acks,
            seq: first_seq,
            rows_sent: 0,
            bytes_sent: 0,
            generator: IpcDataGenerator::default(),
            tracker: DictionaryTracker::new(false),
            options,
        })
    }

    /// Sends one batch, waiting while the window is full.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<(), FeedError> {
        let (dicts, encoded) =
            self.generator
                .encode(batch, &mut self.tracker, &self.options, &mut Default::default())?;
        if !dicts.is_empty() {
            return Err(FeedError::Protocol {
                agent: self.agent.clone(),
                reason: "dictionary-encoded columns are not part of the contract; cast them first".into(),
            });
        }
        let bytes = encoded.arrow_data.len() + encoded.ipc_message.len();
        let kib = ((bytes / 1024).max(1) as u32).min(self.window_kib);
        let permit = self.window.clone().acquire_many_owned(kib).await;
        let Ok(permit) = permit else {
            return Err(self.stream_error().await);
        };
        permit.forget();
        self.charged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(kib);
        let meta = BatchMetadata {
            producer: self.producer.clone(),
            seq: self.seq,
            attempt: 0,
        };
        let mut msg: FlightData = encoded.into();
        msg.app_metadata = meta.encode().into();
        let sent = match &self.tx {
            Some(tx) => tx.send(msg).await.is_ok(),
            None => false,
        };
        if !sent {
            return Err(self.stream_error().await);
        }
        self.seq += 1;
        self.rows_sent += batch.num_rows() as u64;
        self.bytes_sent += bytes as u64;
        Ok(())
    }

    async fn stream_error(&mut self) -> FeedError {
        self.tx = None;
        match (&mut self.acks).await {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => FeedError::Protocol {
                agent: self.agent.clone(),
                reason: "stream ended early".into(),
            },
            Err(e) => FeedError::Protocol {
                agent: self.agent.clone(),
                reason: format!("ack reader failed: {e}"),
            },
        }
    }

    /// Closes the stream and waits for the agent's commit.
    pub async fn finish(mut self) -> Result<ShardReceipt, FeedError> {
        self.tx = None;
        let (rows_committed, duplicate_batches, duplicate_stream) = match (&mut self.acks).await {
            Ok(r) => match r? {
                Some(c) => c,
                None if self.seq == 0 => (0, 0, false),
                None => {
                    return Err(FeedError::Protocol {
                        agent: self.agent.clone(),
                        reason: "the stream ended without a commit acknowledgement".into(),
                    });
                }
            },
            Err(e) => {
                return Err(FeedError::Protocol {
                    agent: self.agent.clone(),
                    reason: format!("ack reader failed: {e}"),
                });
            }
        };
        Ok(ShardReceipt {
            rows_committed,
            rows_sent: self.rows_sent,
            duplicate_batches,
            duplicate_stream,
            bytes_sent: self.bytes_sent,
        })
    }

    /// Rows sent so far.
    pub fn rows_sent(&self) -> u64 {
        self.rows_sent
    }
}

/// One producer's rows to one agent as consecutive `DoPut` streams of about
/// `commit_bytes` each, sequence numbers continuing across them. A stream
/// commits when it closes, so the agent can train on the rows while the rest
/// arrive; the next stream opens once the previous commit is acknowledged
/// (waited for only when this producer writes again).
#[derive(Debug)]
pub struct CommittingWriter {
    client: PutTarget,
    path: DataPath,
    producer: String,
    schema: SchemaRef,
    window_bytes: usize,
    commit_bytes: u64,
    current: Option<ShardWriter>,
    closing: Option<JoinHandle<Result<ShardReceipt, FeedError>>>,
    seq: u64,
    rows_sent: u64,
    bytes_sent: u64,
    streams: u64,
}

impl CommittingWriter {
    pub(super) fn new(
        client: PutTarget,
        path: &DataPath,
        producer: String,
        schema: SchemaRef,
        window_bytes: usize,
        commit_bytes: usize,
    ) -> Self {
        CommittingWriter {
            client,
            path: path.clone(),
            producer,
            schema,
            window_bytes,
            commit_bytes: commit_bytes as u64,
            current: None,
            closing: None,
            seq: 0,
            rows_sent: 0,
            bytes_sent: 0,
            streams: 0,
        }
    }

    /// Sends one batch, opening the next stream if needed and closing the
    /// current one once it carried `commit_bytes`.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<(), FeedError> {
        let mut writer = match self.current.take() {
            Some(w) => w,
            None => {
                self.settle().await?;
                self.open_stream().await?
            }
        };
        let (rows_before, bytes_before) = (writer.rows_sent, writer.bytes_sent);
        writer.write(batch).await?;
        self.seq = writer.seq;
        self.rows_sent += writer.rows_sent - rows_before;
        self.bytes_sent += writer.bytes_sent - bytes_before;
        if writer.bytes_sent >= self.commit_bytes {
            self.closing = Some(tokio::spawn(writer.finish()));
        } else {
            self.current = Some(writer);
        }
        Ok(())
    }

    /// Opens the next stream, its sequence numbers continuing this producer's.
    async fn open_stream(&mut self) -> Result<ShardWriter, FeedError> {
        self.streams += 1;
        ShardWriter::open(
            self.client.clone(),
            &self.path,
            self.producer.clone(),
            &self.schema,
            self.window_bytes,
            self.seq,
        )
        .await
    }

    /// Waits for the commit of the stream closed last and checks it: the
    /// agent must now hold exactly the rows this producer sent.
    async fn settle(&mut self) -> Result<(), FeedError> {
        let Some(closing) = self.closing.take() else {
            return Ok(());
        };
        let receipt = closing.await.map_err(|e| FeedError::Protocol {
            agent: self.client.url().to_owned(),
            reason: format!("commit waiter failed: {e}"),
        })??;
        if receipt.rows_committed != self.rows_sent || receipt.duplicate_stream {
            return Err(FeedError::Protocol {
                agent: self.client.url().to_owned(),
                reason: format!(
                    "producer `{}`: the agent committed {} rows after {} were sent{}",
                    self.producer,
                    receipt.rows_committed,
                    self.rows_sent,
                    if receipt.duplicate_stream {
                        " (it took the stream for a duplicate)"
                    } else {
                        ""
                    }
                ),
            });
        }
        Ok(())
    }

    /// Closes the last stream and waits for every commit. The receipt counts
    /// all streams (`rows_committed` is the agent's total for the producer).
    pub async fn finish(mut self) -> Result<ShardReceipt, FeedError> {
        if let Some(w) = self.current.take() {
            self.closing = Some(tokio::spawn(w.finish()));
        }
        self.settle().await?;
        if self.streams == 0 {
            // Nothing was written: one empty stream still tells the agent the
            // schema (and so the layout) of this shard.
            self.open_stream().await?.finish().await?;
        }
        Ok(ShardReceipt {
            rows_committed: self.rows_sent,
            rows_sent: self.rows_sent,
            duplicate_batches: 0,
            duplicate_stream: false,
            bytes_sent: self.bytes_sent,
        })
    }

    /// Rows sent so far.
    pub fn rows_sent(&self) -> u64 {
        self.rows_sent
    }
}

async fn read_acks(
    client: &PutTarget,
    rx: mpsc::Receiver<FlightData>,
    producer: &str,
    window: &Semaphore,
    charged: &Mutex<VecDeque<u32>>,
) -> Result<Option<Commit>, FeedError> {
    let mut results = client
        .flight
        .clone()
        .do_put(ReceiverStream::new(rx))
        .await
        .map_err(|s| client.status_error(s))?
        .into_inner();
    let mut duplicates = 0;
    let mut committed = None;
    while let Some(r) = results.next().await {
        let r = r.map_err(|s| client.status_error(s))?;
        let ack = PutAck::decode(&r.app_metadata).map_err(|e| FeedError::Protocol {
            agent: client.url().to_owned(),
            reason: e.to_string(),
        })?;
        if ack.producer != producer {
            continue;
        }
        if ack.committed {
            committed = Some((ack.rows, ack.duplicate));
            continue;
        }
        if ack.duplicate {
            duplicates += 1;
        }
        if let Some(kib) = charged.lock().unwrap_or_else(|p| p.into_inner()).pop_front() {
            window.add_permits(kib as usize);
        }
    }
    // A stream that sent no batch has nothing to commit and gets no final ack.
    Ok(committed.map(|(rows, dup)| (rows, duplicates, dup)))
}
