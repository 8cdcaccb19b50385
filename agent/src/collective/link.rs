//! The sending side of a ring connection, and reading and writing frames.

use std::io::IoSlice;
use std::time::Duration;

use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::ring::{self, CLOSING, FrameHeader, HEADER_BYTES, HEARTBEAT, Hello};
use kindling_schemas::tls::Conn;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{oneshot, watch};

use crate::error::RingError;

/// A ring connection to the next rank. A background task reads the
/// receiver's heartbeats; when the connection closes, resets or stays
/// silent past the keepalive bound, it publishes why on `broken`.
#[derive(Debug)]
pub(super) struct Outbound {
    /// Where frames go (taken on drop, to close it gracefully).
    write: Option<WriteHalf<Conn>>,
    /// Hands the write half to the monitor on drop.
    closing: Option<oneshot::Sender<WriteHalf<Conn>>>,
    /// Bytes of the frame being written that are not written yet (a
    /// failure can cut a frame off).
    pub(super) unwritten: usize,
    pub(super) broken: watch::Receiver<Option<String>>,
}

/// Connects to the next rank at `url`, says `hello` and waits for the answer.
pub(super) async fn connect(
    channel: &ChannelConfig,
    url: &str,
    hello: &Hello,
    silent_after: Duration,
) -> Result<Outbound, RingError> {
    let unavailable = |reason: String| RingError::PeerUnavailable {
        peer: url.to_owned(),
        reason,
    };
    let mut conn = channel
        .connect_ring(url, hello.token.is_some())
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let answered = tokio::time::timeout(channel.connect_timeout.max(silent_after), async {
        ring::write_hello(&mut conn, hello).await?;
        ring::read_reply(&mut conn).await
    })
    .await
    .map_err(|_| unavailable(format!("no answer to the ring hello within {silent_after:?}")))?
    .map_err(|e| unavailable(format!("ring hello: {e}")))?;
    if let Err(status) = answered {
        return Err(unavailable(format!(
            "refused the ring connection: {:?}: {}",
            status.code(),
            status.message()
        )));
    }
    let (read, write) = tokio::io::split(conn);
    let (tx, broken) = watch::channel(None);
    let (closing, closed) = oneshot::channel();
    tokio::spawn(monitor(read, tx, silent_after, closed));
    Ok(Outbound {
        write: Some(write),
        closing: Some(closing),
        unwritten: 0,
        broken,
    })
}

/// Awaits `wait` unless the connection to the next rank at `url` breaks
/// first (its agent stopped or died after answering the hello).
pub(super) async fn unless_broken<T>(
    out: &Outbound,
    url: &str,
    wait: impl Future<Output = Result<T, RingError>>,
) -> Result<T, RingError> {
    let mut broken = out.broken.clone();
    tokio::select! {
        r = wait => r,
        cause = broke(&mut broken) => Err(RingError::PeerUnavailable {
            peer: url.to_owned(),
            reason: cause.unwrap_or_else(|| "it closed the connection".to_owned()),
        }),
    }
}

/// Why the connection to the next rank broke, once its monitor says; `None`
/// if the monitor ended without a cause (the next rank closed it).
pub(super) async fn broke(broken: &mut watch::Receiver<Option<String>>) -> Option<String> {
    broken
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|cause| cause.clone())
}

impl Outbound {
    fn write(&mut self) -> std::io::Result<&mut WriteHalf<Conn>> {
        self.write
            .as_mut()
            .ok_or_else(|| std::io::ErrorKind::NotConnected.into())
    }
}

impl Drop for Outbound {
    /// Closes the connection gracefully: the monitor sends FIN and reads
    /// to the receiver's end, so no unread heartbeat turns the close into a
    /// reset that would destroy frames the receiver has not read yet.
    fn drop(&mut self) {
        if let (Some(write), Some(closing)) = (self.write.take(), self.closing.take()) {
            let _ = closing.send(write);
        }
    }
}

/// Reads heartbeats until the connection breaks or the ring closes it.
async fn monitor(
    mut read: ReadHalf<Conn>,
    broken: watch::Sender<Option<String>>,
    silent_after: Duration,
    mut closing: oneshot::Receiver<WriteHalf<Conn>>,
) {
    let cause = loop {
        tokio::select! {
            write = &mut closing => {
                if let Ok(mut write) = write {
                    let _ = tokio::time::timeout(silent_after, write.shutdown()).await;
                    let mut sink = [0u8; 256];
                    let drain = async { while read.read(&mut sink).await.is_ok_and(|n| n > 0) {} };
                    let _ = tokio::time::timeout(silent_after, drain).await;
                }
                return;
            }
            r = tokio::time::timeout(silent_after, read.read_u8()) => match r {
                Ok(Ok(HEARTBEAT)) => continue,
                Ok(Ok(CLOSING)) => break closing_reason(&mut read).await,
                Ok(Ok(other)) => break format!("it sent {other:#04x} where a heartbeat was due"),
                // A close with no reason: the next rank's ring ended. If it
                // failed, its abort comes round the ring to this rank's reads.
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return,
                Ok(Err(e)) => break format!("the connection failed: {e}"),
                Err(_) => break format!("sent no heartbeat for {silent_after:?} (keepalive)"),
            },
        }
    };
    broken.send_replace(Some(cause));
}

/// The reason after a [`CLOSING`] byte (bounded; best effort).
async fn closing_reason(read: &mut ReadHalf<Conn>) -> String {
    match tokio::time::timeout(Duration::from_secs(1), ring::read_closing(read)).await {
        Ok(Ok(reason)) => reason,
        _ => "it closed the connection".to_owned(),
    }
}

/// Writes one frame: the header, then `payload` straight from where it lies.
pub(super) async fn write_frame(
    out: &mut Outbound,
    header: FrameHeader,
    payload: &[u8],
) -> std::io::Result<()> {
    let head = header.encode();
    let total = HEADER_BYTES + payload.len();
    let mut written = 0;
    while written < total {
        out.unwritten = total - written;
        let w = out.write()?;
        let n = if written < HEADER_BYTES {
            let bufs = [IoSlice::new(&head[written..]), IoSlice::new(payload)];
            w.write_vectored(&bufs).await?
        } else {
            w.write(&payload[written - HEADER_BYTES..]).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        written += n;
    }
    out.unwritten = 0;
    out.write()?.flush().await
}

/// Tells the next rank why this ring failed (completing, with zeros, a
/// frame a failure cut off), within a moment; then the caller closes it.
pub(super) async fn abort(out: &mut Outbound, op: u64, reason: &str) {
    let reason = ring::bounded_reason(reason).as_bytes();
    let header = FrameHeader {
        op,
        step: 0,
        part: 0,
        kind: ring::Kind::Abort,
        len: reason.len() as u32,
    };
    let mut frame = vec![0u8; out.unwritten];
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(reason);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        out.write()?.write_all(&frame).await?;
        out.write()?.flush().await
    })
    .await;
}

/// Reads one frame's header.
pub(super) async fn read_header(
    read: &mut ReadHalf<Conn>,
) -> std::io::Result<Result<FrameHeader, kindling_schemas::ring::UnknownFrameKind>> {
    let mut h = [0u8; HEADER_BYTES];
    read.read_exact(&mut h).await?;
    Ok(FrameHeader::decode(&h))
}

/// Reads exactly `buf.len()` bytes of payload.
pub(super) async fn read_payload(read: &mut ReadHalf<Conn>, buf: &mut [u8]) -> std::io::Result<()> {
    read.read_exact(buf).await.map(|_| ())
}
