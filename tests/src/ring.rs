//! Speaking the ring data plane by hand: a hello and its answer, as a peer
//! (or an attacker) would send them.

use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::ring::{self, Hello};
use kindling_schemas::tls::Conn;

/// A hello from `from_rank` for `job_id`'s `attempt`, with `token`.
pub fn hello(job_id: &str, attempt: u32, from_rank: u32, token: Option<&str>) -> Hello {
    Hello {
        job_id: job_id.into(),
        attempt,
        from_rank,
        to_rank: from_rank + 1,
        token: token.map(str::to_owned),
        heartbeat_ms: 500,
    }
}

/// Opens a ring connection to the agent at `url`, says `hello` and returns
/// the agent's answer, with the connection (open only when accepted).
pub async fn say_hello(url: &str, hello: &Hello) -> (Result<(), tonic::Status>, Conn) {
    let channel = ChannelConfig::default().with_plaintext_token(true);
    let mut conn = channel
        .connect_ring(url, hello.token.is_some())
        .await
        .expect("connect");
    ring::write_hello(&mut conn, hello).await.expect("hello");
    let answer = ring::read_reply(&mut conn).await.expect("a reply");
    (answer, conn)
}
