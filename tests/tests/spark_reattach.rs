//! Reattach after a dropped connection: a loopback TCP proxy between the client and
//! the real Spark Connect server cuts the connection once, mid-stream (a real server
//! cannot drop a connection on demand, so this is the one fake). The stream must
//! resume with `ReattachExecute` and deliver every row exactly once; with the server
//! gone for good it must end in a connection error, not hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use futures::TryStreamExt;
use kindling::spark::functions::col;
use kindling::spark::{Error, SparkSession};
use kindling_tests::spark::spark_remote;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// What the proxy does after it cut the connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AfterCut {
    /// Keep accepting: the client reconnects to the same server.
    Reconnect,
    /// Stop listening first: every later connection attempt is refused.
    ServerGone,
}

/// Counters the proxy exposes to the test.
#[derive(Default)]
struct ProxyStats {
    connections: AtomicUsize,
    cuts: AtomicUsize,
    server_bytes: AtomicU64,
    /// Server bytes the first connection had forwarded when it was cut.
    bytes_at_cut: AtomicU64,
}

/// A loopback proxy to `upstream` that cuts the first connection once it has
/// forwarded `cut_after` bytes from the server to the client.
struct CutProxy {
    address: String,
    stats: Arc<ProxyStats>,
}

impl CutProxy {
    async fn start(upstream: String, cut_after: u64, after_cut: AfterCut) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let address = listener.local_addr().expect("proxy address").to_string();
        let stats = Arc::new(ProxyStats::default());
        let armed = Arc::new(AtomicBool::new(true));
        // A cutting connection asks the accept loop to stop listening and waits
        // until it has, so no reconnect can slip in before the cut.
        let (close_tx, mut close_rx) = mpsc::channel::<oneshot::Sender<()>>(1);
        let accept_stats = stats.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { return };
                        accept_stats.connections.fetch_add(1, Ordering::SeqCst);
                        let upstream = upstream.clone();
                        let (stats, armed, close_tx) = (accept_stats.clone(), armed.clone(), close_tx.clone());
                        tokio::spawn(async move {
                            let Ok(server) = TcpStream::connect(&upstream).await else { return };
                            let close = (after_cut == AfterCut::ServerGone).then_some(close_tx);
                            relay(client, server, cut_after, &stats, &armed, close).await;
                        });
                    }
                    Some(done) = close_rx.recv() => {
                        drop(listener);
                        let _ = done.send(());
                        return;
                    }
                }
            }
        });
        Self { address, stats }
    }

    fn remote(&self) -> String {
        format!("sc://{}", self.address)
    }
}

/// Copies both ways; the first connection to pass `cut_after` server bytes while
/// the proxy is armed is reset in both directions.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    cut_after: u64,
    stats: &ProxyStats,
    armed: &AtomicBool,
    close_listener: Option<mpsc::Sender<oneshot::Sender<()>>>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upload = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    };
    let download = async {
        let mut forwarded = 0u64;
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if forwarded + n as u64 >= cut_after
                && armed
                    .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                stats.bytes_at_cut.store(forwarded, Ordering::SeqCst);
                stats.cuts.fetch_add(1, Ordering::SeqCst);
                if let Some(close) = &close_listener {
                    let (done_tx, done_rx) = oneshot::channel();
                    if close.send(done_tx).await.is_ok() {
                        let _ = done_rx.await;
                    }
                }
                return; // drops every half: both connections close mid-message
            }
            if client_write.write_all(&buffer[..n]).await.is_err() {
                return;
            }
            forwarded += n as u64;
            stats.server_bytes.fetch_add(n as u64, Ordering::SeqCst);
        }
    };
    // Whichever side ends first ends the connection (the cut ends `download`).
    tokio::select! {
        () = upload => {}
        () = download => {}
    }
}

/// `host:port` of the real server behind `sc://host:port[/;...]`.
fn upstream_address() -> String {
    let remote = spark_remote();
    let rest = remote.trim_start_matches("sc://");
    rest.split('/').next().unwrap_or(rest).to_string()
}

#[tokio::test]
async fn stream_survives_a_dropped_connection_and_delivers_every_row_once() -> Result<(), Error> {
    // Make sure the server is up (and started by the fixture if it was not).
    SparkSession::connect(&spark_remote()).await?.version().await?;
    let (n, partitions): (i64, i32) = (4_000_000, 4);
    // Two 8-byte columns: ~64 MB of Arrow; cut well before the end.
    let cut_after = 12 << 20;
    let proxy = CutProxy::start(upstream_address(), cut_after, AfterCut::Reconnect).await;
    let spark = SparkSession::connect(&proxy.remote()).await?;
    let df = spark
        .range_partitions(0, n, 1, Some(partitions))
        .with_column("twice", col("id") * 2);

    let mut stream = df.execute_stream().await?;
    let (mut rows, mut id_sum, mut id_square_sum, mut twice_sum) = (0i64, 0i128, 0i128, 0i128);
    while let Some(batch) = tokio::time::timeout(Duration::from_secs(120), stream.try_next())
        .await
        .expect("the stream stalled after the cut")?
    {
        rows += batch.num_rows() as i64;
        for &id in batch.column(0).as_primitive::<Int64Type>().values() {
            id_sum += id as i128;
            id_square_sum += (id as i128) * (id as i128);
        }
        twice_sum += batch
            .column(1)
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|&v| v as i128)
            .sum::<i128>();
    }

    let stats = &proxy.stats;
    assert_eq!(
        stats.cuts.load(Ordering::SeqCst),
        1,
        "the proxy never cut the connection"
    );
    assert!(
        stats.connections.load(Ordering::SeqCst) >= 2,
        "the client did not reconnect after the cut"
    );
    assert!(
        stats.bytes_at_cut.load(Ordering::SeqCst) < stats.server_bytes.load(Ordering::SeqCst) / 2,
        "the cut came too late to matter ({} of {} bytes)",
        stats.bytes_at_cut.load(Ordering::SeqCst),
        stats.server_bytes.load(Ordering::SeqCst)
    );
    // Every id of [0, n) exactly once: count, sum and sum of squares all match.
    let big_n = n as i128;
    assert_eq!(rows, n);
    assert_eq!(id_sum, big_n * (big_n - 1) / 2);
    assert_eq!(id_square_sum, (big_n - 1) * big_n * (2 * big_n - 1) / 6);
    assert_eq!(twice_sum, big_n * (big_n - 1));
    Ok(())
}

#[tokio::test]
async fn dropped_connection_with_the_server_gone_ends_in_a_connection_error() -> Result<(), Error> {
    SparkSession::connect(&spark_remote()).await?.version().await?;
    let n: i64 = 4_000_000;
    let proxy = CutProxy::start(upstream_address(), 4 << 20, AfterCut::ServerGone).await;
    let spark = SparkSession::connect(&proxy.remote()).await?;
    let df = spark
        .range_partitions(0, n, 1, Some(4))
        .with_column("twice", col("id") * 2);

    // Guard against a hang only; the error must come from the client's bounded retries.
    let outcome = tokio::time::timeout(Duration::from_secs(120), async {
        let mut stream = df.execute_stream().await?;
        let mut rows = 0usize;
        while let Some(batch) = stream.try_next().await? {
            rows += batch.num_rows();
        }
        Ok::<usize, Error>(rows)
    })
    .await
    .expect("the client hung after the server went away");

    assert_eq!(
        proxy.stats.cuts.load(Ordering::SeqCst),
        1,
        "the proxy never cut the connection"
    );
    match outcome {
        Err(e @ Error::Connection { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains(&proxy.address),
                "error does not name the address: {message}"
            );
            assert!(e.is_retryable());
        }
        other => panic!(
            "expected a connection error naming {}, got {other:?}",
            proxy.address
        ),
    }
    Ok(())
}
