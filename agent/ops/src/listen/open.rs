//! An open gRPC connection counted against its listener's caps until it
//! closes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::peers::PeerSlot;
use kindling_schemas::tls::Conn;

/// gRPC connections a listener keeps open at once (handshake done: an idle
/// HTTP/2 connection that answers keepalive pings stays open for good); one
/// more is closed at once.
pub const MAX_GRPC_CONNECTIONS: usize = 1024;

/// Of [`MAX_GRPC_CONNECTIONS`], the most one peer address keeps open (room
/// for a node's executors, each task with a client of its own).
pub const MAX_GRPC_PER_PEER: usize = 256;

/// An open gRPC connection: a [`Conn`] holding its place among the
/// listener's [`MAX_GRPC_CONNECTIONS`] and its address's
/// [`MAX_GRPC_PER_PEER`] until it closes.
#[derive(Debug)]
pub struct GrpcConn {
    conn: Conn,
    _held: (OwnedSemaphorePermit, PeerSlot),
}

impl GrpcConn {
    pub(super) fn new(conn: Conn, total: OwnedSemaphorePermit, mine: PeerSlot) -> Self {
        GrpcConn {
            conn,
            _held: (total, mine),
        }
    }
}

impl Connected for GrpcConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.conn.connect_info()
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_shutdown(cx)
    }
}
