//! The server side of every Kindling port (the agent's Flight and ring
//! port, the rendezvous): connections accepted under caps (in all and per
//! peer address), handshaken with the certificate current at that moment
//! ([`Tls`]), and routed by what they speak — gRPC, the ring data plane or
//! HTTP/1.1 — to the server that serves it. The contract
//! (`kindling_schemas::tls`) keeps what both ends of a connection need: the
//! certificates, dialling, [`Conn`].
//!
//! Counted by hand: tower's and tokio's limits are global, not per peer,
//! and no library routes one port's connections by ALPN or first bytes.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use kindling_schemas::tls::{Conn, Tls};
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;

mod open;
mod peers;
mod sniff;

pub use open::{GrpcConn, MAX_GRPC_CONNECTIONS, MAX_GRPC_PER_PEER};
pub use peers::{PeerSlot, PeerSlots};
pub use sniff::Route;

/// How long a connection may take for its TLS handshake (or, plaintext,
/// to send its first bytes) before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections a server on `listener` serves (`TCP_NODELAY` set):
/// with `tls` each is handshaken first, with the certificate current at
/// that moment, on a task of its own (a slow client holds up no other); a
/// failed or timed-out handshake is dropped and logged. For tonic's
/// `serve_with_incoming`. Ring connections ([`kindling_schemas::ring`]) are dropped:
/// a server that takes them uses [`incoming_routed`].
pub fn incoming(listener: TcpListener, tls: Option<Tls>) -> ReceiverStream<io::Result<GrpcConn>> {
    route(listener, tls, None)
}

/// What a server on one port serves besides gRPC, by connection.
#[derive(Debug)]
pub struct Routed {
    /// gRPC connections, for tonic's `serve_with_incoming`.
    pub grpc: ReceiverStream<io::Result<GrpcConn>>,
    /// Ring data-plane connections: a plaintext connection that starts with
    /// [`kindling_schemas::ring::MAGIC`], a TLS one that negotiated [`kindling_schemas::ring::ALPN`].
    pub ring: tokio::sync::mpsc::Receiver<Conn>,
    /// HTTP/1.1 connections (`/metrics`, the status page): a plaintext one
    /// that starts with `GET ` or `HEAD `, a TLS one that negotiated `http/1.1`.
    pub http: tokio::sync::mpsc::Receiver<Conn>,
}

/// As [`incoming`], with ring and HTTP/1.1 connections handed to streams of
/// their own ([`Routed`]).
pub fn incoming_routed(listener: TcpListener, tls: Option<Tls>) -> Routed {
    let (ring_tx, ring) = tokio::sync::mpsc::channel(64);
    let (http_tx, http) = tokio::sync::mpsc::channel(64);
    Routed {
        grpc: route(listener, tls, Some((ring_tx, http_tx))),
        ring,
        http,
    }
}

/// Connections a listener holds before it knows what they are for (the TLS
/// handshake, or the first bytes of a plaintext one; each at most
/// [`HANDSHAKE_TIMEOUT`]); one more is closed at once, so a flood of silent
/// or slow handshakes holds no more than this many tasks and descriptors.
pub const MAX_PENDING_CONNECTIONS: usize = 256;

/// Of [`MAX_PENDING_CONNECTIONS`], the most one peer address holds: a flood
/// of silent handshakes from one pod leaves the others' room to connect.
pub const MAX_PENDING_PER_PEER: usize = 32;

fn route(
    listener: TcpListener,
    tls: Option<Tls>,
    others: Option<(tokio::sync::mpsc::Sender<Conn>, tokio::sync::mpsc::Sender<Conn>)>,
) -> ReceiverStream<io::Result<GrpcConn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let pending = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_CONNECTIONS));
    let peers = PeerSlots::new(MAX_PENDING_PER_PEER);
    let open = (
        Arc::new(tokio::sync::Semaphore::new(MAX_GRPC_CONNECTIONS)),
        PeerSlots::new(MAX_GRPC_PER_PEER),
    );
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: wait, then go on.
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = pending.clone().try_acquire_owned() else {
                tracing::debug!(%peer, cap = MAX_PENDING_CONNECTIONS, "connection refused: too many handshakes at once");
                continue;
            };
            let Some(peer_slot) = peers.take(peer.ip()) else {
                tracing::debug!(%peer, cap = MAX_PENDING_PER_PEER, "connection refused: too many handshakes from one address");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let config = tls.as_ref().and_then(Tls::server_config);
            let (tx, others, open) = (tx.clone(), others.clone(), open.clone());
            tokio::spawn(async move {
                let (conn, route) = match config {
                    None if others.is_none() => (Conn::Plain(tcp), Route::Grpc),
                    // Look at the first bytes without taking them.
                    None => match tokio::time::timeout(HANDSHAKE_TIMEOUT, sniff::sniff(&tcp)).await {
                        Ok(Ok(route)) => (Conn::Plain(tcp), route),
                        Ok(Err(e)) => {
                            return tracing::debug!(%peer, error = %e, "reading a connection's first bytes");
                        }
                        Err(_) => return tracing::info!(%peer, "a connection sent nothing in time"),
                    },
                    Some(config) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config);
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                let route = Route::of_alpn(stream.get_ref().1.alpn_protocol());
                                (Conn::Tls(Box::new(stream)), route)
                            }
                            Ok(Err(e)) => return tracing::info!(%peer, error = %e, "TLS handshake refused"),
                            Err(_) => return tracing::info!(%peer, "TLS handshake timed out"),
                        }
                    }
                };
                drop((slot, peer_slot));
                match (route, others) {
                    (Route::Grpc, _) => {
                        let Ok(total) = open.0.try_acquire_owned() else {
                            return tracing::info!(%peer, cap = MAX_GRPC_CONNECTIONS, "gRPC connection closed: the listener holds its cap");
                        };
                        let Some(mine) = open.1.take(peer.ip()) else {
                            return tracing::info!(%peer, cap = MAX_GRPC_PER_PEER, "gRPC connection closed: its address holds its cap");
                        };
                        let conn = GrpcConn::new(conn, total, mine);
                        let _ = tx.send(Ok(conn)).await;
                    }
                    (Route::Ring, Some((ring, _))) => {
                        let _ = ring.send(conn).await;
                    }
                    (Route::Http, Some((_, http))) => {
                        let _ = http.send(conn).await;
                    }
                    (_, None) => tracing::debug!(%peer, "a ring or HTTP connection to a gRPC-only server"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
