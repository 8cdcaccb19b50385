//! The collective service between agents and the ring operations built on it:
//! all-reduce (reduce-scatter + all-gather) of `f32` buffers, and broadcast of bytes.
//!
//! Every agent serves [`CollectiveService`], which drops incoming chunks into
//! the shared [`Inbox`]. A [`Ring`] (one per job attempt) only ever pushes to
//! the next rank and waits on its inbox for the previous one, so a ring of `W`
//! ranks moves `2(W-1)/W` of the buffer per rank, whatever `W`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kindling_schemas::auth::{BearerAttach, BearerCheck, Token};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::credential::Role;
use kindling_schemas::pb::collective::collective_client::CollectiveClient;
use kindling_schemas::pb::collective::collective_server::{Collective, CollectiveServer};
use kindling_schemas::pb::collective::{Chunk, PushAck};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::error::AgentError;

/// Largest chunk pushed in one message; larger segments travel in parts,
/// [`PARTS_IN_FLIGHT`] at a time, so the receiver reduces one part while the
/// next is on the wire. Every rank must use the same value.
pub const PART_BYTES: usize = 1 << 20;
/// Parts queued ahead of the wire on a ring's stream to its next rank.
pub const PARTS_IN_FLIGHT: usize = 4;
/// Largest message the collective server accepts.
pub const MAX_MESSAGE_BYTES: usize = (4 << 20) + (64 << 10);
/// HTTP/2 flow-control window per stream for agent servers and peer
/// channels: a whole part fits, so a push never stalls on window updates.
pub const STREAM_WINDOW_BYTES: u32 = 2 << 20;
/// Largest HTTP/2 frame agent servers accept (the protocol's ceiling is
/// 16 MiB - 1; the default 16 KiB cuts a part into 64 frames).
pub const MAX_FRAME_BYTES: u32 = 1 << 20;
/// HTTP/2 flow-control window per connection: all parts in flight fit.
pub const CONNECTION_WINDOW_BYTES: u32 = 16 << 20;
/// Most bytes of chunks held for jobs this agent is not in (yet): a peer's
/// gang may form, and push, before this agent enters the attempt, so such
/// chunks are kept — up to this many bytes over all such jobs, and for at
/// most [`UNJOINED_CHUNK_TTL`]. A chunk past the cap is refused with
/// RESOURCE_EXHAUSTED naming it.
pub const UNJOINED_CHUNK_BYTES: usize = 64 << 20;
/// How long chunks for a job this agent is not in are kept.
pub const UNJOINED_CHUNK_TTL: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    job_id: String,
    attempt: u32,
    op: u64,
    step: u32,
    from_rank: u32,
    part: u32,
}

#[derive(Debug)]
enum Slot {
    Waiting(oneshot::Sender<Bytes>),
    Arrived(Bytes),
}

/// Chunks that arrived, or receivers waiting for them, per job attempt.
#[derive(Debug, Default)]
pub struct Inbox {
    inner: Mutex<InboxState>,
    /// Cancelled when the agent stops serving: open chunk streams end.
    closed: CancellationToken,
}

#[derive(Debug, Default)]
struct InboxState {
    slots: HashMap<Key, Slot>,
    /// The attempt each job is on; older attempts are fenced.
    attempts: HashMap<String, u32>,
    /// Chunks held for jobs not in `attempts`: bytes, and when the first came.
    unjoined: HashMap<String, (usize, Instant)>,
}

impl InboxState {
    /// Drops the chunks of jobs not joined within [`UNJOINED_CHUNK_TTL`].
    fn expire_unjoined(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .unjoined
            .iter()
            .filter(|(_, (_, first))| now.duration_since(*first) >= UNJOINED_CHUNK_TTL)
            .map(|(job, _)| job.clone())
            .collect();
        for job in expired {
            tracing::debug!(%job, "dropping chunks of a job this agent never joined");
            self.unjoined.remove(&job);
            self.slots.retain(|k, _| k.job_id != job);
        }
    }
}

impl Inbox {
    /// A new, empty inbox.
    pub fn new() -> Arc<Self> {
        Arc::new(Inbox::default())
    }

    /// Moves `job_id` to `attempt`: chunks and waiters of older attempts are dropped.
    pub fn enter_attempt(&self, job_id: &str, attempt: u32) {
        let mut s = self.lock();
        s.attempts.insert(job_id.to_owned(), attempt);
        s.unjoined.remove(job_id);
        s.slots.retain(|k, _| k.job_id != job_id || k.attempt >= attempt);
    }

    /// Ends every open chunk stream into this inbox (with UNAVAILABLE, so
    /// the senders' rings fail at once) and refuses new ones: the agent is
    /// shutting down, and a peer's long-lived stream must not hold the
    /// server's graceful shutdown open.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Forgets a job.
    pub fn forget(&self, job_id: &str) {
        let mut s = self.lock();
        s.attempts.remove(job_id);
        s.unjoined.remove(job_id);
        s.slots.retain(|k, _| k.job_id != job_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InboxState> {
        // A poisoned lock only means another thread panicked mid-update of a map
        // that stays structurally valid.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, key: Key, data: Bytes) -> Result<(), Status> {
        let mut s = self.lock();
        match s.attempts.get(&key.job_id) {
            Some(&current) if key.attempt < current => {
                return Err(Status::failed_precondition(format!(
                    "chunk for attempt {} of job `{}` refused: the job is on attempt {current}",
                    key.attempt, key.job_id
                )));
            }
            Some(_) => {}
            None => {
                s.expire_unjoined(Instant::now());
                let held: usize = s.unjoined.values().map(|(bytes, _)| bytes).sum();
                if held + data.len() > UNJOINED_CHUNK_BYTES {
                    return Err(Status::resource_exhausted(format!(
                        "chunk for job `{}` refused: this agent is not in that job and already holds {held} \
                         bytes of chunks for jobs it is not in (the cap is {UNJOINED_CHUNK_BYTES} bytes, each \
                         job's kept for {UNJOINED_CHUNK_TTL:?})",
                        key.job_id
                    )));
                }
            }
        }
        match s.slots.remove(&key) {
            Some(Slot::Waiting(tx)) => {
                // The receiver may have given up (timeout / cancel); nothing to keep then.
                let _ = tx.send(data);
            }
            Some(Slot::Arrived(_)) => {
                return Err(Status::already_exists(format!(
                    "duplicate chunk op {} step {} part {} from rank {}",
                    key.op, key.step, key.part, key.from_rank
                )));
            }
            None => {
                if !s.attempts.contains_key(&key.job_id) {
                    let entry = s
                        .unjoined
                        .entry(key.job_id.clone())
                        .or_insert((0, Instant::now()));
                    entry.0 += data.len();
                }
                s.slots.insert(key, Slot::Arrived(data));
            }
        }
        Ok(())
    }

    fn take_or_wait(&self, key: Key) -> Result<Bytes, oneshot::Receiver<Bytes>> {
        let mut s = self.lock();
        match s.slots.remove(&key) {
            Some(Slot::Arrived(data)) => Ok(data),
            _ => {
                let (tx, rx) = oneshot::channel();
                s.slots.insert(key, Slot::Waiting(tx));
                Err(rx)
            }
        }
    }
}

/// The gRPC face of the inbox.
#[derive(Debug, Clone)]
pub struct CollectiveService {
    inbox: Arc<Inbox>,
}

#[tonic::async_trait]
impl Collective for CollectiveService {
    async fn push_stream(&self, request: Request<Streaming<Chunk>>) -> Result<Response<PushAck>, Status> {
        let caller = kindling_schemas::auth::Caller::of(&request);
        let mut chunks = request.into_inner();
        loop {
            let chunk = tokio::select! {
                chunk = chunks.message() => chunk?,
                _ = self.inbox.closed.cancelled() => {
                    return Err(Status::unavailable("the receiving agent is shutting down"));
                }
            };
            let Some(c) = chunk else {
                return Ok(Response::new(PushAck {}));
            };
            caller.allow(&c.job_id, &[Role::Peer], "send collective traffic")?;
            let key = Key {
                job_id: c.job_id,
                attempt: c.attempt,
                op: c.op,
                step: c.step,
                from_rank: c.from_rank,
                part: c.part,
            };
            self.inbox.deliver(key, c.data)?;
        }
    }
}

/// The collective gRPC service over `inbox`, authenticated by `check`, with
/// message limits sized for [`MAX_PART_BYTES`] chunks.
pub fn grpc_service(
    inbox: Arc<Inbox>,
    check: BearerCheck,
) -> InterceptedService<CollectiveServer<CollectiveService>, BearerCheck> {
    let server = CollectiveServer::new(CollectiveService { inbox })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    InterceptedService::new(server, check)
}

type Client = CollectiveClient<InterceptedService<Channel, BearerAttach>>;

/// One rank's view of a ring for one job attempt.
#[derive(Debug)]
pub struct Ring {
    job_id: String,
    attempt: u32,
    rank: u32,
    world: u32,
    next: Option<(String, Client)>,
    /// The stream of chunks to the next rank (opened on the first send).
    link: std::sync::OnceLock<mpsc::Sender<Chunk>>,
    /// Why the stream to the next rank ended, once it has.
    link_broken: watch::Sender<Option<String>>,
    inbox: Arc<Inbox>,
    op: u64,
    timeout: Duration,
    cancel: CancellationToken,
}

/// How to reach the ring's peers.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// The job.
    pub job_id: String,
    /// The attempt.
    pub attempt: u32,
    /// This rank.
    pub rank: u32,
    /// Collective addresses of all ranks, in rank order.
    pub peers: Vec<String>,
    /// Bearer token for the peers.
    pub token: Option<Token>,
    /// How long to wait for a peer's chunk before failing.
    pub timeout: Duration,
    /// Keepalive of the connection to the next rank: a rank that goes silent
    /// without closing it fails the ring within its detection bound.
    pub channel: ChannelConfig,
}

impl Ring {
    /// Connects (lazily) to the next rank.
    pub fn new(config: RingConfig, inbox: Arc<Inbox>, cancel: CancellationToken) -> Result<Ring, AgentError> {
        let world = config.peers.len() as u32;
        if world == 0 || config.rank >= world {
            return Err(AgentError::RankOutsideWorld {
                rank: config.rank,
                world,
            });
        }
        let next = if world > 1 {
            let addr = config.peers[((config.rank + 1) % world) as usize].clone();
            let channel = config
                .channel
                .dial(&addr, config.token.is_some())
                .map_err(|e| AgentError::PeerUnavailable {
                    peer: addr.clone(),
                    reason: e.to_string(),
                })?
                // No per-call timeout: the chunk stream lives as long as the
                // ring; every wait on a peer is bounded by `config.timeout`,
                // and a silent connection by the keepalive.
                .tune(|e| {
                    e.initial_stream_window_size(STREAM_WINDOW_BYTES)
                        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                })
                .connect_lazy();
            let attach = BearerAttach::new(config.token.as_ref())?;
            let client = CollectiveClient::with_interceptor(channel, attach)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            Some((addr, client))
        } else {
            None
        };
        Ok(Ring {
            job_id: config.job_id,
            attempt: config.attempt,
            rank: config.rank,
            world,
            next,
            link: std::sync::OnceLock::new(),
            link_broken: watch::Sender::new(None),
            inbox,
            op: 0,
            timeout: config.timeout,
            cancel,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Sums `buf` element-wise across all ranks, in place; every rank ends with
    /// bitwise-identical values.
    ///
    /// Each ring step sends one segment in parts of [`PART_BYTES`] (a few in
    /// flight at once) while the segment from the previous rank is reduced
    /// part by part as it lands, straight into `buf`. Two ranks exchange their
    /// whole buffers in a single step.
    pub async fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), AgentError> {
        let w = self.world as usize;
        self.op += 1;
        if w == 1 {
            return Ok(());
        }
        if w == 2 {
            // Two ranks: swap whole buffers in one step instead of a two-step
            // ring (the same bytes each way, half the round trips). Each rank
            // adds the other's values to its own: a + b and b + a are the
            // same float, so both end bitwise identical.
            let mine = encode_f32(buf);
            return tokio::try_join!(self.send(0, mine), self.recv_into(0, buf, Combine::Add)).map(|_| ());
        }
        let r = self.rank as usize;
        let bounds: Vec<usize> = (0..=w).map(|i| buf.len() * i / w).collect();
        let seg = |i: usize| bounds[i % w]..bounds[i % w + 1];
        // Reduce-scatter: after step s, segment (r - s - 1) holds s + 2 contributions.
        for s in 0..w - 1 {
            let (send, recv) = two_segments(buf, seg(r + w - s), seg(r + w - s - 1));
            tokio::try_join!(
                self.send_f32(s as u32, send),
                self.recv_into(s as u32, recv, Combine::Add)
            )?;
        }
        // All-gather: rank r now owns the full sum of segment r + 1; pass them round.
        for s in 0..w - 1 {
            let step = (w - 1 + s) as u32;
            let (send, recv) = two_segments(buf, seg(r + 1 + w - s), seg(r + w - s));
            tokio::try_join!(
                self.send_f32(step, send),
                self.recv_into(step, recv, Combine::Replace)
            )?;
        }
        Ok(())
    }

    /// Sends `bytes` from `root` to every rank; returns them on every rank.
    pub async fn broadcast(&mut self, root: u32, bytes: Option<Vec<u8>>) -> Result<Vec<u8>, AgentError> {
        self.op += 1;
        if self.world == 1 {
            return bytes.ok_or(AgentError::BroadcastWithoutPayload);
        }
        let last = (root + self.world - 1) % self.world;
        let data = if self.rank == root {
            bytes.ok_or(AgentError::BroadcastWithoutPayload)?
        } else {
            // Length first (8 bytes), then the payload, both relayed along the ring.
            let len_bytes = self.recv(0, 8).await?;
            let len = u64::from_le_bytes(len_bytes[..8].try_into().unwrap_or([0; 8])) as usize;
            let got = self.recv(1, len).await?;
            got.to_vec()
        };
        if self.rank != last {
            self.send(0, Bytes::copy_from_slice(&(data.len() as u64).to_le_bytes()))
                .await?;
            self.send(1, Bytes::from(data.clone())).await?;
        }
        Ok(data)
    }

    async fn send(&self, step: u32, payload: Bytes) -> Result<(), AgentError> {
        let parts = payload.len().div_ceil(PART_BYTES).max(1);
        self.send_parts(step, parts, |part| {
            payload.slice(part * PART_BYTES..((part + 1) * PART_BYTES).min(payload.len()))
        })
        .await
    }

    /// Sends `values` as little-endian bytes, encoding each part just before it
    /// goes on the wire (no copy of the whole segment up front).
    async fn send_f32(&self, step: u32, values: &[f32]) -> Result<(), AgentError> {
        let per_part = PART_BYTES / 4;
        let parts = values.len().div_ceil(per_part).max(1);
        self.send_parts(step, parts, |part| {
            encode_f32(
                &values[(part * per_part).min(values.len())..((part + 1) * per_part).min(values.len())],
            )
        })
        .await
    }

    /// Queues `parts` parts on the stream to the next rank; returns once all
    /// are queued (at most [`PARTS_IN_FLIGHT`] wait ahead of the wire).
    async fn send_parts(
        &self,
        step: u32,
        parts: usize,
        part_data: impl Fn(usize) -> Bytes,
    ) -> Result<(), AgentError> {
        let Some((addr, client)) = &self.next else {
            return Ok(());
        };
        let link = self.link.get_or_init(|| self.open_link(client.clone()));
        for part in 0..parts {
            let chunk = Chunk {
                job_id: self.job_id.clone(),
                attempt: self.attempt,
                op: self.op,
                step,
                from_rank: self.rank,
                part: part as u32,
                data: part_data(part),
            };
            tokio::select! {
                r = tokio::time::timeout(self.timeout, link.send(chunk)) => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => {
                        // The call ended; its task publishes why right after.
                        let mut broken = self.link_broken.subscribe();
                        let cause = tokio::time::timeout(Duration::from_secs(1), broken.wait_for(Option::is_some))
                            .await
                            .ok()
                            .and_then(|r| r.ok().and_then(|c| c.clone()));
                        return Err(self.link_error(cause));
                    }
                    Err(_) => {
                        return Err(AgentError::PeerUnavailable {
                            peer: addr.clone(),
                            reason: format!("took no data within {:?} (op {}, step {step})", self.timeout, self.op),
                        });
                    }
                },
                _ = self.cancel.cancelled() => return Err(self.cancelled()),
            }
        }
        Ok(())
    }

    /// Opens the chunk stream to the next rank. The call runs as a task for
    /// the ring's life; when it ends other than by the ring closing it, the
    /// cause is published on `link_broken` for every waiter.
    fn open_link(&self, mut client: Client) -> mpsc::Sender<Chunk> {
        let (tx, rx) = mpsc::channel(PARTS_IN_FLIGHT);
        let broken = self.link_broken.clone();
        tokio::spawn(async move {
            let outcome = client
                .push_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await;
            let cause = match outcome {
                Ok(_) => "the stream to it was closed".to_owned(),
                Err(s) => format!("{}: {}", s.code(), s.message()),
            };
            broken.send_replace(Some(cause));
        });
        tx
    }

    /// The error for a ring whose stream to the next rank ended with `cause`.
    fn link_error(&self, cause: Option<String>) -> AgentError {
        AgentError::PeerUnavailable {
            peer: self.next.as_ref().map(|(a, _)| a.clone()).unwrap_or_default(),
            reason: cause.unwrap_or_else(|| "the stream to it ended".to_owned()),
        }
    }

    /// Waits for part `part` of `step` from the previous rank.
    async fn recv_part(&self, step: u32, part: u32) -> Result<Bytes, AgentError> {
        let from = (self.rank + self.world - 1) % self.world;
        let key = Key {
            job_id: self.job_id.clone(),
            attempt: self.attempt,
            op: self.op,
            step,
            from_rank: from,
            part,
        };
        let mut broken = self.link_broken.subscribe();
        match self.inbox.take_or_wait(key) {
            Ok(d) => Ok(d),
            Err(rx) => tokio::select! {
                // The stream to the next rank failed: the ring is broken.
                Ok(cause) = broken.wait_for(Option::is_some) => Err(self.link_error(cause.clone())),
                r = tokio::time::timeout(self.timeout, rx) => match r {
                    Ok(Ok(d)) => Ok(d),
                    Ok(Err(_)) => Err(self.cancelled()),
                    Err(_) => Err(AgentError::PeerUnavailable {
                        peer: format!("rank {from}"),
                        reason: format!("no data within {:?} (op {}, step {step})", self.timeout, self.op),
                    }),
                },
                _ = self.cancel.cancelled() => Err(self.cancelled()),
            },
        }
    }

    /// Receives `dst.len()` floats of `step` from the previous rank and adds
    /// them to (or writes them over) `dst`, one part at a time as parts land.
    async fn recv_into(&self, step: u32, dst: &mut [f32], combine: Combine) -> Result<(), AgentError> {
        if dst.is_empty() {
            // An empty segment still travels as one empty part.
            let data = self.recv_part(step, 0).await?;
            return self.check_part_len(step, 0, &data, 0);
        }
        for (part, dst) in dst.chunks_mut(PART_BYTES / 4).enumerate() {
            let data = self.recv_part(step, part as u32).await?;
            self.check_part_len(step, part, &data, dst.len() * 4)?;
            combine.apply(dst, &data);
        }
        Ok(())
    }

    fn check_part_len(&self, step: u32, part: usize, data: &[u8], expected: usize) -> Result<(), AgentError> {
        if data.len() == expected {
            return Ok(());
        }
        Err(AgentError::PeerUnavailable {
            peer: format!("rank {}", (self.rank + self.world - 1) % self.world),
            reason: format!(
                "part {part} of op {} step {step} has {} bytes, expected {expected}",
                self.op,
                data.len()
            ),
        })
    }

    /// Receives `len` bytes of `step` from the previous rank.
    async fn recv(&self, step: u32, len: usize) -> Result<Bytes, AgentError> {
        let parts = len.div_ceil(PART_BYTES).max(1);
        if parts == 1 {
            return self.recv_part(step, 0).await;
        }
        let mut out = Vec::with_capacity(len);
        for part in 0..parts {
            out.extend_from_slice(&self.recv_part(step, part as u32).await?);
        }
        Ok(Bytes::from(out))
    }

    fn cancelled(&self) -> AgentError {
        AgentError::AttemptFailed {
            job_id: self.job_id.clone(),
            attempt: self.attempt,
            cause: "collective operation aborted".into(),
        }
    }
}

/// `(&buf[send], &mut buf[recv])` for two disjoint ranges.
fn two_segments(
    buf: &mut [f32],
    send: std::ops::Range<usize>,
    recv: std::ops::Range<usize>,
) -> (&[f32], &mut [f32]) {
    if send.start >= recv.end {
        let (low, high) = buf.split_at_mut(send.start);
        (&high[..send.len()], &mut low[recv])
    } else {
        let (low, high) = buf.split_at_mut(recv.start);
        (&low[send], &mut high[..recv.len()])
    }
}

/// How a received part lands in the buffer.
#[derive(Debug, Clone, Copy)]
enum Combine {
    Add,
    Replace,
}

impl Combine {
    fn apply(self, dst: &mut [f32], bytes: &[u8]) {
        let src = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        match self {
            Combine::Add => dst.iter_mut().zip(src).for_each(|(d, v)| *d += v),
            Combine::Replace => dst.iter_mut().zip(src).for_each(|(d, v)| *d = v),
        }
    }
}

/// Little-endian bytes of `values` (one bulk copy on little-endian machines).
fn encode_f32(values: &[f32]) -> Bytes {
    if cfg!(target_endian = "little") {
        Bytes::from(arrow::buffer::Buffer::from_slice_ref(values))
    } else {
        values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into()
    }
}

/// A tonic server builder with the flow-control windows the collective
/// service (and bulk `DoPut` ingest) need to keep a loopback or LAN link busy.
pub fn server_builder(channel: &ChannelConfig) -> tonic::transport::Server {
    channel
        .server()
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(job: &str, part: u32) -> Key {
        Key {
            job_id: job.to_owned(),
            attempt: 1,
            op: 0,
            step: 0,
            from_rank: 0,
            part,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn chunks_for_jobs_not_joined_are_capped_and_expire() {
        let inbox = Inbox::new();
        let part = Bytes::from(vec![0u8; 1 << 20]);
        let fit = UNJOINED_CHUNK_BYTES / part.len();
        for p in 0..fit {
            inbox.deliver(key("early", p as u32), part.clone()).unwrap();
        }
        let refused = inbox.deliver(key("other", 0), part.clone()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("the cap is 67108864 bytes"),
            "{refused}"
        );
        // A job this agent is in takes chunks whatever the others hold.
        inbox.enter_attempt("mine", 1);
        inbox.deliver(key("mine", 0), part.clone()).unwrap();
        // Joining the early job keeps its chunks and frees the cap.
        inbox.enter_attempt("early", 1);
        assert!(inbox.take_or_wait(key("early", 0)).is_ok());
        inbox.deliver(key("other", 0), part.clone()).unwrap();
        // Chunks of a job never joined go after the TTL, and free the cap.
        for p in 1..fit {
            inbox.deliver(key("other", p as u32), part.clone()).unwrap();
        }
        assert!(inbox.deliver(key("third", 0), part.clone()).is_err());
        tokio::time::advance(UNJOINED_CHUNK_TTL).await;
        inbox.deliver(key("third", 0), part.clone()).unwrap();
        assert!(inbox.lock().slots.keys().all(|k| k.job_id != "other"));
    }
}
