//! The ring data plane: how agents move a collective operation's bytes.
//!
//! Control (jobs, gangs, attempts) is gRPC; the bulk traffic of a ring
//! all-reduce or broadcast is not. Each rank of a job attempt opens one
//! long-lived connection to the next rank's agent, on the agent's Flight
//! port, and sends every part of every operation on it in order:
//!
//! 1. **Routing.** Plaintext: the connection starts with [`MAGIC`]. TLS: the
//!    client offers the ALPN protocol [`ALPN`] (and only it), then sends
//!    [`MAGIC`]. Anything else on the port is gRPC.
//! 2. **Hello.** After the magic, a little-endian `u32` length and that many
//!    bytes of JSON [`Hello`] (at most [`MAX_HELLO_BYTES`]): job, attempt,
//!    sender and receiver rank, the bearer credential (the operator token or
//!    a `peer` credential of the job) and how often the receiver should
//!    send heartbeats back.
//! 3. **Reply.** One byte, the gRPC status code (`0`: accepted), a `u32`
//!    length and a UTF-8 message. The receiver answers only after checking
//!    the credential, the job and the attempt, so a stale attempt, a wrong
//!    job or a missing token is refused before any value is read.
//! 4. **Frames** from the sender: a [`FrameHeader`] of [`HEADER_BYTES`]
//!    (`op: u64, step: u32, part: u32, kind: u32, len: u32`, little-endian)
//!    then `len` bytes: `f32` or `bf16` values, little-endian, or raw
//!    bytes. The receiver knows which `(op, step, part)` comes next; any
//!    other (a duplicate, a gap) ends the connection with the ring failed.
//!    A sender whose ring failed sends, between frames, one of kind
//!    [`Kind::Abort`] with the failure in UTF-8 and closes: the cause goes
//!    round the ring, so every rank fails with the peer that was lost.
//! 5. **Heartbeats** from the receiver: one byte, [`HEARTBEAT`], every
//!    `heartbeat_ms`. The sender's agent reads them in the background; a
//!    connection silent for its keepalive bound fails the ring at once,
//!    whether or not an operation is running. A receiver that ends the
//!    connection for a reason (the job moved to a newer attempt, the agent
//!    is stopping) first sends [`CLOSING`], a `u32` length and the reason
//!    in UTF-8, which the sender's ring fails with.
//!
//! Either side closes the connection to end it; a closed or reset connection
//! fails every wait on it with the peer named.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tonic::{Code, Status};

/// First bytes of a ring connection.
pub const MAGIC: [u8; 8] = *b"KNDLRNG1";
/// The ALPN protocol a TLS ring connection negotiates.
pub const ALPN: &[u8] = b"kindling-ring/1";
/// Largest hello a receiver reads.
pub const MAX_HELLO_BYTES: usize = 16 << 10;
/// Largest reply message a sender reads.
pub const MAX_REPLY_BYTES: usize = 16 << 10;
/// Size of a [`FrameHeader`] on the wire.
pub const HEADER_BYTES: usize = 24;
/// The byte a receiver sends back as a heartbeat.
pub const HEARTBEAT: u8 = b'H';
/// The byte that starts a receiver's reason for closing.
pub const CLOSING: u8 = b'C';

/// What a sender says before its first frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The job.
    pub job_id: String,
    /// The attempt; the receiver refuses one older than the job's.
    pub attempt: u32,
    /// The sender's rank.
    pub from_rank: u32,
    /// The receiver's rank.
    pub to_rank: u32,
    /// The bearer token or job credential (`None` when the receiver takes
    /// unauthenticated peers: loopback development only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// How often the receiver sends a heartbeat back, in milliseconds.
    pub heartbeat_ms: u64,
}

/// What a frame's payload holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// Little-endian `f32` values.
    F32 = 1,
    /// Little-endian `bf16` values (the top half of an `f32`).
    Bf16 = 2,
    /// Raw bytes (a broadcast).
    Bytes = 3,
    /// The sender's ring failed: the payload says why (UTF-8).
    Abort = 4,
}

impl Kind {
    /// Bytes per value.
    pub fn width(self) -> usize {
        match self {
            Kind::F32 => 4,
            Kind::Bf16 => 2,
            Kind::Bytes | Kind::Abort => 1,
        }
    }
}

/// The header before each frame's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Operation number within the attempt (from 1).
    pub op: u64,
    /// Ring step: `0..W-1` reduce-scatter, `W-1..2(W-1)` all-gather.
    pub step: u32,
    /// Part of the step's segment.
    pub part: u32,
    /// What the payload holds.
    pub kind: Kind,
    /// Payload bytes.
    pub len: u32,
}

impl FrameHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..8].copy_from_slice(&self.op.to_le_bytes());
        out[8..12].copy_from_slice(&self.step.to_le_bytes());
        out[12..16].copy_from_slice(&self.part.to_le_bytes());
        out[16..20].copy_from_slice(&(self.kind as u32).to_le_bytes());
        out[20..24].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Reads a header from its bytes; an unknown kind is an error naming it.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<FrameHeader, UnknownFrameKind> {
        let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let mut op = [0u8; 8];
        op.copy_from_slice(&bytes[0..8]);
        let kind = match u32_at(16) {
            1 => Kind::F32,
            2 => Kind::Bf16,
            3 => Kind::Bytes,
            4 => Kind::Abort,
            other => return Err(UnknownFrameKind(other)),
        };
        Ok(FrameHeader {
            op: u64::from_le_bytes(op),
            step: u32_at(8),
            part: u32_at(12),
            kind,
            len: u32_at(20),
        })
    }
}

/// A frame header whose kind is none of [`Kind`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown frame kind {0}")]
pub struct UnknownFrameKind(pub u32);

/// Writes the magic and `hello`.
pub async fn write_hello<W: AsyncWrite + Unpin>(w: &mut W, hello: &Hello) -> std::io::Result<()> {
    let body = serde_json::to_vec(hello).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    w.write_all(&out).await?;
    w.flush().await
}

/// Reads the magic and a hello; a wrong magic, an oversized or malformed
/// hello is `INVALID_ARGUMENT` naming what is wrong.
pub async fn read_hello<R: AsyncRead + Unpin>(r: &mut R) -> Result<Hello, Status> {
    let io = |e: std::io::Error| Status::invalid_argument(format!("ring hello: {e}"));
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).await.map_err(io)?;
    if magic != MAGIC {
        return Err(Status::invalid_argument(format!(
            "ring hello: expected the magic {:?}, got {magic:?}",
            String::from_utf8_lossy(&MAGIC)
        )));
    }
    let len = r.read_u32_le().await.map_err(io)? as usize;
    if len > MAX_HELLO_BYTES {
        return Err(Status::invalid_argument(format!(
            "ring hello of {len} bytes refused (at most {MAX_HELLO_BYTES})"
        )));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.map_err(io)?;
    serde_json::from_slice(&body).map_err(|e| Status::invalid_argument(format!("ring hello: {e}")))
}

/// Writes the receiver's answer to a hello.
pub async fn write_reply<W: AsyncWrite + Unpin>(
    w: &mut W,
    answer: &Result<(), Status>,
) -> std::io::Result<()> {
    let (code, message) = match answer {
        Ok(()) => (Code::Ok, ""),
        Err(s) => (s.code(), s.message()),
    };
    let message = &message.as_bytes()[..message.len().min(MAX_REPLY_BYTES)];
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(code as i32 as u8);
    out.extend_from_slice(&(message.len() as u32).to_le_bytes());
    out.extend_from_slice(message);
    w.write_all(&out).await?;
    w.flush().await
}

/// Reads the receiver's answer: `Ok` when accepted, else its status.
pub async fn read_reply<R: AsyncRead + Unpin>(r: &mut R) -> Result<Result<(), Status>, std::io::Error> {
    let code = r.read_u8().await?;
    let len = r.read_u32_le().await? as usize;
    if len > MAX_REPLY_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("ring reply of {len} bytes (at most {MAX_REPLY_BYTES})"),
        ));
    }
    let mut message = vec![0u8; len];
    r.read_exact(&mut message).await?;
    Ok(match Code::from_i32(code as i32) {
        Code::Ok => Ok(()),
        code => Err(Status::new(code, String::from_utf8_lossy(&message).into_owned())),
    })
}

/// `reason` cut to [`MAX_REPLY_BYTES`] at a character boundary: the most
/// of a goodbye's or an abort frame's reason a reader takes.
pub fn bounded_reason(reason: &str) -> &str {
    &reason[..reason.floor_char_boundary(MAX_REPLY_BYTES)]
}

/// A receiver's goodbye: [`CLOSING`], a little-endian `u32` length and the
/// reason in UTF-8 ([`bounded_reason`]).
pub fn closing(reason: &str) -> Vec<u8> {
    let reason = bounded_reason(reason).as_bytes();
    let mut out = Vec::with_capacity(5 + reason.len());
    out.push(CLOSING);
    out.extend_from_slice(&(reason.len() as u32).to_le_bytes());
    out.extend_from_slice(reason);
    out
}

/// Reads a goodbye's reason, after its [`CLOSING`] byte: its length, then
/// the reason ([`read_reason`]).
pub async fn read_closing<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<String> {
    let len = r.read_u32_le().await?;
    read_reason(r, len).await
}

/// Reads a reason the peer says is `len` bytes long (a goodbye's, an
/// abort frame's payload): at most [`MAX_REPLY_BYTES`] of it, whatever
/// `len` claims (the rest is left unread), as UTF-8 with any invalid
/// sequence replaced.
pub async fn read_reason<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> std::io::Result<String> {
    let mut reason = vec![0u8; usize::try_from(len).map_or(MAX_REPLY_BYTES, |n| n.min(MAX_REPLY_BYTES))];
    r.read_exact(&mut reason).await?;
    Ok(String::from_utf8_lossy(&reason).into_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_unknown_kinds_are_named() {
        let h = FrameHeader {
            op: 1 << 40,
            step: 3,
            part: 9,
            kind: Kind::Bf16,
            len: 1 << 20,
        };
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[16] = 7;
        let err = FrameHeader::decode(&bad).unwrap_err();
        assert_eq!(err, UnknownFrameKind(7));
        assert_eq!(err.to_string(), "unknown frame kind 7");
    }

    #[tokio::test]
    async fn hello_and_reply_round_trip_and_bad_hellos_are_refused() {
        let hello = Hello {
            job_id: "j".into(),
            attempt: 2,
            from_rank: 0,
            to_rank: 1,
            token: Some("t".into()),
            heartbeat_ms: 500,
        };
        let mut buf = Vec::new();
        write_hello(&mut buf, &hello).await.unwrap();
        assert_eq!(read_hello(&mut buf.as_slice()).await.unwrap(), hello);
        let mut big = MAGIC.to_vec();
        big.extend_from_slice(&(1u32 << 30).to_le_bytes());
        let e = read_hello(&mut big.as_slice()).await.unwrap_err();
        assert!(e.message().contains("1073741824 bytes refused"), "{e}");
        let e = read_hello(&mut &b"PRI * HTTP/2.0"[..]).await.unwrap_err();
        assert!(e.message().contains("expected the magic"), "{e}");

        let mut out = Vec::new();
        write_reply(&mut out, &Err(Status::failed_precondition("stale")))
            .await
            .unwrap();
        let got = read_reply(&mut out.as_slice()).await.unwrap().unwrap_err();
        assert_eq!((got.code(), got.message()), (Code::FailedPrecondition, "stale"));
        let mut ok = Vec::new();
        write_reply(&mut ok, &Ok(())).await.unwrap();
        assert!(read_reply(&mut ok.as_slice()).await.unwrap().is_ok());
    }
}
