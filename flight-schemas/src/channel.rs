//! How every Kindling client holds its gRPC channels (to agents, between
//! agents, to the rendezvous) and every Kindling server answers them: connect
//! timeout, HTTP/2 keepalive, and the deadline of a call that should answer
//! at once. A peer that stops answering without closing its connection (a
//! partitioned node, a frozen process) is found by the keepalive within
//! [`ChannelConfig::detection_bound`], and a call waiting on it fails then,
//! or at its deadline, instead of hanging.

use std::time::Duration;

use tonic::transport::{Endpoint, Server};

/// Channel settings. The defaults suit a cluster network; tests shorten them.
///
/// ```
/// use std::time::Duration;
/// use kindling_schemas::channel::ChannelConfig;
/// let c = ChannelConfig::default();
/// assert_eq!(c.detection_bound(), Duration::from_secs(20));
/// let fast = c.with_keepalive(Duration::from_millis(500), Duration::from_millis(500));
/// assert_eq!(fast.detection_bound(), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// How long opening a connection may take.
    pub connect_timeout: Duration,
    /// How often an HTTP/2 PING is sent on a connection (also while no call
    /// is open on it).
    pub keepalive_interval: Duration,
    /// How long a PING may stay unanswered before the connection is closed
    /// and every call on it fails (`UNAVAILABLE`).
    pub keepalive_timeout: Duration,
    /// The deadline of a call that should answer at once (an agent's
    /// actions, a rendezvous status): `DEADLINE_EXCEEDED` after it. Calls that
    /// wait by design (a join, a barrier, a data stream) have no deadline of
    /// their own; the keepalive bounds them.
    pub call_timeout: Duration,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            connect_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
        }
    }
}

impl ChannelConfig {
    /// Sets the keepalive interval and timeout.
    pub fn with_keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_timeout = timeout;
        self
    }

    /// Sets the deadline of calls that should answer at once.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The longest a silent peer goes unnoticed on an open connection: one
    /// keepalive interval until the next PING, plus its timeout.
    pub fn detection_bound(&self) -> Duration {
        self.keepalive_interval + self.keepalive_timeout
    }

    /// An endpoint for `url` with these settings (and `TCP_NODELAY`).
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, tonic::transport::Error> {
        Ok(Endpoint::from_shared(url.to_owned())?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.keepalive_interval)
            .keep_alive_timeout(self.keepalive_timeout)
            .keep_alive_while_idle(true))
    }

    /// A server builder that PINGs its clients with these settings, so a
    /// client that vanished without closing its connection frees the calls
    /// (and the streams' state) it held.
    pub fn server(&self) -> Server {
        Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
    }
}
