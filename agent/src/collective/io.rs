//! One ring operation's reads and writes, and how each fails: with the
//! peer it waited on named and the cause it saw.

use std::sync::Arc;
use std::time::Duration;

use kindling_schemas::ring::{FrameHeader, Kind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{CAUSE_WAIT, link};
use crate::error::RingError;

/// What one operation's reads and writes need to fail well.
pub(super) struct Io {
    pub(super) op: u64,
    pub(super) job_id: Arc<str>,
    pub(super) attempt: u32,
    pub(super) next: Arc<str>,
    pub(super) prev: Arc<str>,
    pub(super) timeout: Duration,
    pub(super) cancel: CancellationToken,
    pub(super) closed: CancellationToken,
    pub(super) broken: Option<watch::Receiver<Option<String>>>,
    /// The incoming connection's attempt was fenced by this agent.
    pub(super) fence: Option<CancellationToken>,
}

#[derive(Clone, Copy)]
pub(super) enum Side {
    /// The next rank (this rank writes to it).
    Next,
    /// The previous rank (this rank reads from it).
    Prev,
}

impl Io {
    pub(super) fn header(&self, step: usize, part: usize, kind: Kind, len: usize) -> FrameHeader {
        FrameHeader {
            op: self.op,
            step: step as u32,
            part: part as u32,
            kind,
            len: len as u32,
        }
    }

    pub(super) fn peer(&self, side: Side) -> String {
        match side {
            Side::Next => self.next.to_string(),
            Side::Prev => self.prev.to_string(),
        }
    }

    /// Runs one read or write, failing it with its cause: the connection to
    /// the next rank broke (its monitor says why), no progress within the
    /// collective timeout, the job was cancelled or the agent is stopping.
    pub(super) async fn guard<T>(
        &self,
        side: Side,
        step: usize,
        io: impl Future<Output = std::io::Result<T>>,
    ) -> Result<T, RingError> {
        let mut broken = self.broken.clone();
        let next_broke = async {
            match broken.as_mut() {
                Some(b) => link::broke(b).await,
                None => std::future::pending().await,
            }
        };
        let fenced = async {
            match &self.fence {
                Some(f) => f.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let what = match side {
            Side::Next => "writing",
            Side::Prev => "reading",
        };
        let at = || format!("op {} step {step}", self.op);
        tokio::select! {
            biased;
            _ = self.closed.cancelled() => Err(self.shutting_down()),
            _ = self.cancel.cancelled() => Err(self.cancelled()),
            _ = fenced => Err(RingError::AttemptFailed {
                job_id: self.job_id.to_string(),
                attempt: self.attempt,
                cause: "this agent fenced the attempt: the job is on a newer one".into(),
            }),
            r = tokio::time::timeout(self.timeout, io) => match r {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => {
                    // A broken connection to the next rank: its monitor is
                    // about to read why (the next rank's goodbye), if it sent one.
                    let known = match self.broken.clone() {
                        Some(mut b) if matches!(side, Side::Next) => {
                            tokio::time::timeout(CAUSE_WAIT, link::broke(&mut b))
                                .await
                                .ok()
                                .flatten()
                        }
                        Some(b) => b.borrow().clone(),
                        None => None,
                    };
                    Err(match known {
                        Some(cause) => RingError::PeerUnavailable { peer: self.next.to_string(), reason: cause },
                        None => RingError::PeerUnavailable {
                            peer: self.peer(side),
                            reason: if e.kind() == std::io::ErrorKind::UnexpectedEof {
                                format!("it closed the connection ({what} {})", at())
                            } else {
                                format!("{what} {}: {e}", at())
                            },
                        },
                    })
                }
                Err(_) => Err(RingError::PeerUnavailable {
                    peer: self.peer(side),
                    reason: format!("no data within {:?} ({what} {})", self.timeout, at()),
                }),
            },
            Some(cause) = next_broke => Err(RingError::PeerUnavailable { peer: self.next.to_string(), reason: cause }),
        }
    }

    /// Reads the frame `(op, step, part)` of `kind` and `len` bytes into `buf`.
    pub(super) async fn read_frame(
        &self,
        read: &mut tokio::io::ReadHalf<kindling_schemas::tls::Conn>,
        step: usize,
        part: usize,
        kind: Kind,
        len: usize,
        buf: &mut [u8],
    ) -> Result<(), RingError> {
        let header = self.guard(Side::Prev, step, link::read_header(read)).await?;
        let expected = self.header(step, part, kind, len);
        match header {
            Ok(h) if h == expected => {}
            Ok(h) if h.kind == Kind::Abort => {
                let reason = self
                    .guard(Side::Prev, step, kindling_schemas::ring::read_reason(read, h.len))
                    .await
                    .unwrap_or_default();
                return Err(RingError::PeerUnavailable {
                    peer: self.prev.to_string(),
                    reason: format!("its ring failed: {reason}"),
                });
            }
            got => {
                return Err(RingError::PeerUnavailable {
                    peer: self.prev.to_string(),
                    reason: format!(
                        "sent {} where {expected:?} was next (a duplicate, out-of-order or malformed frame); \
                         the ring is broken",
                        match got {
                            Ok(h) => format!("{h:?}"),
                            Err(e) => e.to_string(),
                        }
                    ),
                });
            }
        }
        self.guard(Side::Prev, step, link::read_payload(read, &mut buf[..len]))
            .await
    }

    pub(super) fn broken_ring(&self) -> RingError {
        RingError::PeerUnavailable {
            peer: self.next.to_string(),
            reason: "the ring's connections are closed".into(),
        }
    }

    pub(super) fn cancelled(&self) -> RingError {
        RingError::AttemptFailed {
            job_id: self.job_id.to_string(),
            attempt: self.attempt,
            cause: crate::error::RING_ABORTED.into(),
        }
    }

    pub(super) fn shutting_down(&self) -> RingError {
        RingError::AttemptFailed {
            job_id: self.job_id.to_string(),
            attempt: self.attempt,
            cause: "this agent is shutting down".into(),
        }
    }
}
