//! The ring itself: its settings and statistics, how it forms over the
//! links of a job attempt, and its all-reduce and broadcast.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kindling_schemas::auth::{BearerCheck, Token};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::ring::{Hello, Kind};
use kindling_schemas::tls::Tls;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::inbox::{Inbox, RingPeers, serve};
use super::io::{Io, Side};
use super::plan::{Combine, Step, bf16_to_f32, byte_parts, combine, encode_bf16, f32_to_bf16, pieces, plan};
use super::{Links, link};
use crate::error::RingError;
#[cfg(target_endian = "big")]
compile_error!("the ring data plane sends values in the machine's byte order, which must be little-endian");

/// Largest part of a ring step's segment sent in one frame (in `f32` values,
/// whatever the wire precision); larger segments travel in parts, so the
/// receiver reduces one part while the next is on the wire. Every rank must
/// use the same value.
pub const PART_VALUES: usize = 1 << 18;
/// Largest broadcast part, in bytes.
pub const PART_BYTES: usize = PART_VALUES * 4;
/// How long a failed write waits for the next rank's reason to arrive.
pub(super) const CAUSE_WAIT: Duration = Duration::from_millis(200);
/// HTTP/2 flow-control window per stream for agent servers (bulk `DoPut`).
pub const STREAM_WINDOW_BYTES: u32 = 2 << 20;
/// Largest HTTP/2 frame agent servers accept (the protocol's ceiling is
/// 16 MiB - 1; the default 16 KiB cuts a 1 MiB batch into 64 frames).
pub const MAX_FRAME_BYTES: u32 = 1 << 20;
/// HTTP/2 flow-control window per connection.
pub const CONNECTION_WINDOW_BYTES: u32 = 16 << 20;

/// The values' precision on the wire. Sums are always accumulated in `f32`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// `f32`: results are the exact ring sum.
    #[default]
    F32,
    /// `bf16` on the wire, half the bytes: each hop rounds its partial sum
    /// to `bf16` (round to nearest even); the owner of a segment rounds the
    /// full sum before passing it round, so every rank ends identical.
    Bf16,
}

impl Precision {
    /// The frame kind values travel as.
    pub fn kind(self) -> Kind {
        match self {
            Precision::F32 => Kind::F32,
            Precision::Bf16 => Kind::Bf16,
        }
    }

    /// Bytes per value on the wire.
    pub fn width(self) -> usize {
        self.kind().width()
    }
}

/// Upper bounds (seconds) of the all-reduce time histogram's buckets.
pub const ALL_REDUCE_SECONDS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// What a job's rings did: all-reduces, their bytes and how long they took
/// (the agent's `/metrics`). Shared by the job's rings across attempts.
#[derive(Debug, Default)]
pub struct RingStats {
    /// All-reduces done.
    pub ops: AtomicU64,
    /// Bytes of the buffers all-reduced, as sent.
    pub bytes: AtomicU64,
    /// Their total time, in microseconds.
    pub micros: AtomicU64,
    /// How many took at most each of [`ALL_REDUCE_SECONDS`] (not cumulative).
    pub buckets: [AtomicU64; ALL_REDUCE_SECONDS.len()],
}

impl RingStats {
    fn record(&self, bytes: usize, took: Duration) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        if let Some(i) = ALL_REDUCE_SECONDS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }
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
    /// Agent addresses of all ranks, in rank order.
    pub peers: Vec<String>,
    /// Bearer token (or peer credential) for the peers.
    pub token: Option<Token>,
    /// How long to wait for a peer's data before failing.
    pub timeout: Duration,
    /// Dial rules (TLS, plaintext token), and the keepalive: a next rank
    /// whose heartbeats stop for its detection bound fails the ring.
    pub channel: ChannelConfig,
}

/// One rank's view of a ring for one job attempt.
#[derive(Debug)]
pub struct Ring {
    config: RingConfig,
    world: u32,
    inbox: Arc<Inbox>,
    op: u64,
    cancel: CancellationToken,
    /// The connections to the next and from the previous rank (opened on
    /// the first operation).
    links: Option<Links>,
    /// Why an earlier operation failed: the ring is broken for good.
    failed: Option<RingError>,
    /// The job, the next and the previous rank's addresses, for errors.
    names: (Arc<str>, Arc<str>, Arc<str>),
    /// Where its all-reduces are counted.
    stats: Arc<RingStats>,
    /// A `bf16` part being written.
    send_buf: Vec<f32>,
    /// A part being read.
    recv_buf: Vec<f32>,
}

impl Ring {
    /// A ring for `config`; connects on its first operation.
    pub fn new(config: RingConfig, inbox: Arc<Inbox>, cancel: CancellationToken) -> Result<Ring, RingError> {
        let world = config.peers.len() as u32;
        if world == 0 || config.rank >= world {
            return Err(RingError::RankOutsideWorld {
                rank: config.rank,
                world,
            });
        }
        let (rank, w) = (config.rank as usize, world as usize);
        let names = (
            Arc::from(config.job_id.as_str()),
            Arc::from(config.peers[(rank + 1) % w].as_str()),
            Arc::from(config.peers[(rank + w - 1) % w].as_str()),
        );
        Ok(Ring {
            names,
            config,
            world,
            inbox,
            op: 0,
            cancel,
            links: None,
            failed: None,
            stats: Arc::default(),
            send_buf: Vec::new(),
            recv_buf: Vec::new(),
        })
    }

    /// Counts this ring's all-reduces in `stats` (a job's, across attempts).
    pub fn with_stats(mut self, stats: Arc<RingStats>) -> Ring {
        self.stats = stats;
        self
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.config.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Sums `buf` element-wise across all ranks, in place, in `f32`; every
    /// rank ends with bitwise-identical values.
    pub async fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), RingError> {
        self.all_reduce(buf, Precision::F32).await
    }

    /// Sums `buf` element-wise across all ranks, in place, sending values
    /// in `precision`; every rank ends with bitwise-identical values.
    ///
    /// Two ranks swap their whole buffers in one step (a + b and b + a are
    /// the same float); more run reduce-scatter then all-gather, each step
    /// in parts of [`PART_VALUES`], a part forwarded as soon as it is reduced.
    pub async fn all_reduce(&mut self, buf: &mut [f32], precision: Precision) -> Result<(), RingError> {
        self.op += 1;
        if self.world == 1 {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let result = match self.ready().await {
            Ok(()) => self.ring_all_reduce(buf, precision).await,
            Err(e) => Err(e),
        };
        if result.is_ok() {
            self.stats
                .record(buf.len() * precision.width(), started.elapsed());
        }
        self.settle(result).await
    }

    /// Sends `bytes` from `root` to every rank; returns them on every rank.
    /// Parts are relayed along the ring as they arrive.
    pub async fn broadcast(&mut self, root: u32, bytes: Option<Vec<u8>>) -> Result<Vec<u8>, RingError> {
        self.op += 1;
        if self.world == 1 {
            return bytes.ok_or(RingError::BroadcastWithoutPayload);
        }
        if self.config.rank == root && bytes.is_none() {
            return Err(RingError::BroadcastWithoutPayload);
        }
        let result = match self.ready().await {
            Ok(()) => self.relay(root, bytes).await,
            Err(e) => Err(e),
        };
        self.settle(result).await
    }

    /// Keeps the first failure: the ring is broken after it. The next rank
    /// is told why and its connections close at once, so the failure goes
    /// round the ring with its cause.
    async fn settle<T>(&mut self, result: Result<T, RingError>) -> Result<T, RingError> {
        if let Err(e) = &result {
            // Cancelled here: the connections stay (see `Drop`).
            if self.cancel.is_cancelled() {
                if self.failed.is_none() {
                    self.failed = Some(e.clone());
                }
                return result;
            }
            if let Some((out, inn)) = self.links.as_mut() {
                let who = &self.config.peers[self.config.rank as usize];
                let why = format!("rank {} ({who}): {e}", self.config.rank);
                *lock(&inn.goodbye) = Some(why.clone());
                link::abort(out, self.op, &why).await;
            }
            self.links = None;
            if self.failed.is_none() {
                self.failed = Some(e.clone());
            }
        }
        result
    }

    /// Fails with the ring's earlier failure, or opens its connections.
    async fn ready(&mut self) -> Result<(), RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.links.is_some() {
            return Ok(());
        }
        let (rank, world) = (self.config.rank, self.world);
        let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
        let hello = Hello {
            job_id: self.config.job_id.clone(),
            attempt: self.config.attempt,
            from_rank: rank,
            to_rank: next,
            token: self.config.token.as_ref().map(|t| t.expose().to_owned()),
            heartbeat_ms: self.config.channel.keepalive_interval.as_millis() as u64,
        };
        let next_url = &self.config.peers[next as usize];
        let connect = link::connect(
            &self.config.channel,
            next_url,
            &hello,
            self.config.channel.detection_bound(),
        );
        let prev_url = &self.config.peers[prev as usize];
        let accept = async {
            match self
                .inbox
                .take_or_wait(&self.config.job_id, self.config.attempt, prev)
            {
                Ok(inbound) => Ok(inbound),
                Err(rx) => match tokio::time::timeout(self.config.timeout, rx).await {
                    Ok(Ok(inbound)) => Ok(inbound),
                    Ok(Err(_)) => Err(self.shutting_down()),
                    Err(_) => Err(RingError::PeerUnavailable {
                        peer: prev_url.clone(),
                        reason: format!("rank {prev} did not connect within {:?}", self.config.timeout),
                    }),
                },
            }
        };
        // Once the next rank has answered, it going away fails the wait for
        // the previous one at once, naming it (not after the timeout).
        let opened = async {
            let (mut connect, mut accept) = (std::pin::pin!(connect), std::pin::pin!(accept));
            let out = tokio::select! {
                out = &mut connect => out?,
                inn = &mut accept => {
                    let inn = inn?;
                    return Ok::<_, RingError>((connect.await?, inn));
                }
            };
            let inn = link::unless_broken(&out, next_url, accept).await?;
            Ok((out, inn))
        };
        let links = tokio::select! {
            r = opened => r?,
            _ = self.cancel.cancelled() => return Err(self.cancelled()),
            _ = self.inbox.closed().cancelled() => return Err(self.shutting_down()),
        };
        self.links = Some(links);
        if self.send_buf.is_empty() {
            self.send_buf = vec![0.0; PART_VALUES];
            self.recv_buf = vec![0.0; PART_VALUES];
        }
        Ok(())
    }

    async fn ring_all_reduce(&mut self, buf: &mut [f32], precision: Precision) -> Result<(), RingError> {
        let (w, r) = (self.world as usize, self.config.rank as usize);
        let kind = precision.kind();
        let steps = plan(w, r);
        // The buffer cut into its segments' parts, each lockable on its own:
        // the writer sends one part straight from the buffer while the
        // reader reduces another into it.
        let pieces = pieces(buf, if w == 2 { 1 } else { w });
        // Parts before each step, for the writer's and the reader's counters.
        let offsets = |side: fn(&Step) -> usize| -> Vec<usize> {
            let mut acc = vec![0];
            for s in &steps {
                acc.push(acc[acc.len() - 1] + pieces[side(s)].len());
            }
            acc
        };
        let (woff, roff) = (offsets(|s| s.send), offsets(|s| s.recv));
        // The step whose sent values the sender rounds in place first, so
        // that it keeps what every other rank receives.
        let round_at = (kind == Kind::Bf16).then_some(if w == 2 { 0 } else { w - 1 });
        let io = self.io();
        let Some((out, inn)) = self.links.as_mut() else {
            return Err(io.broken_ring());
        };
        let (send_buf, recv_buf) = (&mut self.send_buf, &mut self.recv_buf);
        let (sent_tx, sent) = watch::channel(0usize);
        let (reduced_tx, reduced) = watch::channel(0usize);
        let writer = async {
            let mut reduced = reduced.clone();
            for (s, step) in steps.iter().enumerate() {
                for (p, part) in pieces[step.send].iter().enumerate() {
                    if s > 0 {
                        // This part is the one received (and reduced) in the step before.
                        let _ = reduced.wait_for(|&n| n > roff[s - 1] + p).await;
                    }
                    let mut values = part.values.lock().await;
                    if round_at == Some(s) {
                        values.iter_mut().for_each(|v| *v = bf16_to_f32(f32_to_bf16(*v)));
                    }
                    let header = io.header(s, p, kind, values.len() * kind.width());
                    let written = match kind {
                        Kind::F32 => link::write_frame(out, header, bytemuck::cast_slice(&values[..])),
                        _ => {
                            encode_bf16(&values, send_buf);
                            let payload = &bytemuck::cast_slice::<f32, u8>(send_buf)[..header.len as usize];
                            link::write_frame(out, header, payload)
                        }
                    };
                    io.guard(Side::Next, s, written).await?;
                    drop(values);
                    sent_tx.send_replace(woff[s] + p + 1);
                }
            }
            Ok::<(), RingError>(())
        };
        let reader = async {
            let mut sent = sent.clone();
            for (s, step) in steps.iter().enumerate() {
                for (p, part) in pieces[step.recv].iter().enumerate() {
                    let len = part.len * kind.width();
                    // Before changing values the writer still has to send:
                    // two ranks swap the same part; all-gather overwrites
                    // parts the reduce-scatter sent.
                    let need = if w == 2 {
                        woff[0] + p + 1
                    } else if s >= w - 1 {
                        woff[w - 1]
                    } else {
                        0
                    };
                    if step.combine == Combine::Replace && kind == Kind::F32 {
                        let _ = sent.wait_for(|&n| n >= need).await;
                        let mut values = part.values.lock().await;
                        let into = bytemuck::cast_slice_mut::<f32, u8>(&mut values[..]);
                        io.read_frame(&mut inn.read, s, p, kind, len, into).await?;
                    } else {
                        let into = &mut bytemuck::cast_slice_mut::<f32, u8>(recv_buf)[..len];
                        io.read_frame(&mut inn.read, s, p, kind, len, into).await?;
                        let _ = sent.wait_for(|&n| n >= need).await;
                        let mut values = part.values.lock().await;
                        combine(step.combine, kind, &mut values, recv_buf);
                    }
                    reduced_tx.send_replace(roff[s] + p + 1);
                }
            }
            Ok::<(), RingError>(())
        };
        tokio::try_join!(writer, reader).map(|_| ())
    }

    async fn relay(&mut self, root: u32, bytes: Option<Vec<u8>>) -> Result<Vec<u8>, RingError> {
        let rank = self.config.rank;
        let last = (root + self.world - 1) % self.world;
        let io = self.io();
        let Some((out, inn)) = self.links.as_mut() else {
            return Err(io.broken_ring());
        };
        let recv_buf = bytemuck::cast_slice_mut::<f32, u8>(&mut self.recv_buf);
        let mut send = async |step: usize, part: usize, payload: &[u8]| {
            let header = io.header(step, part, Kind::Bytes, payload.len());
            io.guard(Side::Next, step, link::write_frame(out, header, payload))
                .await
        };
        if rank == root {
            let data = bytes.ok_or(RingError::BroadcastWithoutPayload)?;
            send(0, 0, &(data.len() as u64).to_le_bytes()).await?;
            for (p, chunk) in byte_parts(&data).enumerate() {
                send(1, p, chunk).await?;
            }
            return Ok(data);
        }
        io.read_frame(&mut inn.read, 0, 0, Kind::Bytes, 8, &mut recv_buf[..8])
            .await?;
        let len_bytes: [u8; 8] = recv_buf[..8].try_into().unwrap_or([0; 8]);
        let len = u64::from_le_bytes(len_bytes) as usize;
        if rank != last {
            send(0, 0, &len_bytes).await?;
        }
        let mut data = Vec::with_capacity(len.min(64 << 20));
        let part_count = len.div_ceil(PART_BYTES).max(1);
        for p in 0..part_count {
            let n = (len - p * PART_BYTES).min(PART_BYTES);
            io.read_frame(&mut inn.read, 1, p, Kind::Bytes, n, &mut recv_buf[..n])
                .await?;
            let got = &recv_buf[..n];
            if rank != last {
                send(1, p, got).await?;
            }
            data.extend_from_slice(got);
        }
        Ok(data)
    }

    fn io(&self) -> Io {
        Io {
            op: self.op,
            job_id: self.names.0.clone(),
            attempt: self.config.attempt,
            next: self.names.1.clone(),
            prev: self.names.2.clone(),
            timeout: self.config.timeout,
            cancel: self.cancel.clone(),
            closed: self.inbox.closed().clone(),
            broken: self.links.as_ref().map(|(out, _)| out.broken.clone()),
            fence: self.links.as_ref().map(|(_, inn)| inn.fence.clone()),
        }
    }

    fn cancelled(&self) -> RingError {
        self.io().cancelled()
    }

    fn shutting_down(&self) -> RingError {
        self.io().shutting_down()
    }
}

impl Drop for Ring {
    /// A ring this agent cancelled parks its connections in the inbox
    /// (`Inbox::park`); any other closes them now.
    fn drop(&mut self) {
        if self.cancel.is_cancelled()
            && let Some(links) = self.links.take()
        {
            self.inbox.park(&self.config.job_id, self.config.attempt, links);
        }
    }
}

fn lock<'a, T>(m: &'a Mutex<T>) -> std::sync::MutexGuard<'a, T> {
    // Held only to set or take a goodbye: a poisoned lock still holds a
    // whole `Option<String>`.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves only the ring data plane on `listener` into `inbox` (an agent
/// serves it on its Flight port instead; for in-process rings in tests and
/// benchmarks). Stops when `stop` is cancelled, closing the inbox.
pub fn listen(
    listener: TcpListener,
    tls: Option<Tls>,
    inbox: Arc<Inbox>,
    check: BearerCheck,
    stop: CancellationToken,
) {
    let routed = kindling_ops::listen::incoming_routed(listener, tls);
    let closing = inbox.clone();
    tokio::spawn(async move {
        // Keep the other receivers alive (and unused) while serving.
        let _unused = (routed.grpc, routed.http);
        stop.cancelled().await;
        closing.close();
    });
    tokio::spawn(serve(inbox, check, RingPeers::anyone(), routed.ring));
}

/// A tonic server builder with the flow-control windows bulk `DoPut`
/// ingest needs to keep a loopback or LAN link busy.
pub fn server_builder(channel: &ChannelConfig) -> tonic::transport::Server {
    channel
        .server()
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}
