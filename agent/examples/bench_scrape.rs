//! What a Prometheus scrape of an agent over mutual TLS costs, each figure
//! against its baseline in the same run:
//!
//! 1. `--scrapes` (100) scrapes of `/metrics` by a client that keeps its
//!    connection while the server lets it (as Prometheus does), against one
//!    that dials and handshakes for every scrape: TLS handshakes made and
//!    milliseconds per scrape. A server that closes after each response
//!    makes the first client handshake every time too.
//! 2. The CPU the process spends while `/metrics` is scraped 20 times a
//!    second (server and client together), against the same window idle.
//! 3. `DoPut` ingest of `--ingest-mb` MB into the same agent with nobody
//!    scraping, and with `/metrics` scraped 20 times a second throughout:
//!    `--rounds` interleaved rounds (alternating which goes first), medians.
//!
//! `cargo run --release -p kindling-agent --example bench_scrape -- --scrapes 100 --ingest-mb 256 --rounds 5`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig};
use kindling_schemas::action::{Action, CancelJob, StartJob};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::{JobSpec, Task};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

mod common;
use common::{act, arg, cpu_seconds, encode, flight, ingest_batches, pki};

/// An HTTP/1.1 client of one TLS port that reads `/metrics`, keeping its
/// connection when `keep` and the server allow, and counts its handshakes.
struct Scraper {
    addr: String,
    token: String,
    connector: tokio_rustls::TlsConnector,
    keep: bool,
    conn: Option<TlsStream<TcpStream>>,
    handshakes: Arc<AtomicU64>,
}

impl Scraper {
    fn new(addr: &str, token: &Token, tls: &kindling_schemas::tls::Tls, keep: bool) -> anyhow::Result<Self> {
        let mut config = (*tls
            .client_config()
            .ok_or_else(|| anyhow::anyhow!("no client TLS"))?)
        .clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Scraper {
            addr: addr.to_owned(),
            token: token.expose().to_owned(),
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            keep,
            conn: None,
            handshakes: Arc::default(),
        })
    }

    /// One scrape: the page's length.
    async fn scrape(&mut self) -> anyhow::Result<usize> {
        // A kept connection the server has closed since fails at once: dial again.
        for _ in 0..2 {
            if self.conn.is_none() {
                let tcp = TcpStream::connect(&self.addr).await?;
                let name = rustls_pki_types::ServerName::try_from("127.0.0.1")?;
                self.conn = Some(self.connector.connect(name, tcp).await?);
                self.handshakes.fetch_add(1, Ordering::Relaxed);
            }
            match self.request().await {
                Ok((len, open)) => {
                    if !(open && self.keep) {
                        self.conn = None;
                    }
                    return Ok(len);
                }
                Err(_) => self.conn = None,
            }
        }
        anyhow::bail!("the scrape failed twice")
    }

    /// Sends one request and reads its response: (body length, whether the
    /// server keeps the connection).
    async fn request(&mut self) -> anyhow::Result<(usize, bool)> {
        let conn = self.conn.as_mut().expect("connected");
        let close = if self.keep { "" } else { "connection: close\r\n" };
        let request = format!(
            "GET /metrics HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n{close}\r\n",
            self.addr, self.token
        );
        conn.write_all(request.as_bytes()).await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if conn.read(&mut byte).await? == 0 {
                anyhow::bail!("closed before a response");
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_lowercase();
        anyhow::ensure!(head.starts_with("http/1.1 200"), "not 200: {head}");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no content-length: {head}"))?;
        let mut body = vec![0u8; len];
        conn.read_exact(&mut body).await?;
        Ok((len, !head.contains("connection: close")))
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let pki = pki()?;
    let token = Token::new("bench");
    let rv = EmbeddedRendezvous::start(RendezvousConfig::default(), Some(token.clone())).await?;
    let dir = tempfile::tempdir()?;
    let mut config = kindling_agent::AgentConfig::local("bench-scrape", dir.path());
    config.token = Some(token.clone());
    config.rendezvous = Some(rv.url());
    config.memory_budget = 8 << 30;
    config.channel = config.channel.with_tls(Some(pki.server.clone()));
    let agent = kindling_agent::start(config).await?;
    let addr = agent.url().trim_start_matches("https://").to_owned();

    println!("| benchmark | measured | baseline (same run) |");
    println!("|---|---:|---:|");
    let scrapes = arg("--scrapes", 100);
    let mut rows = Vec::new();
    for keep in [true, false] {
        // The agent's first page, rendered cold, by a scraper of its own.
        Scraper::new(&addr, &token, &pki.client, false)?.scrape().await?;
        // Every handshake of these scrapes counts, the first one's too.
        let mut s = Scraper::new(&addr, &token, &pki.client, keep)?;
        let t = Instant::now();
        for _ in 0..scrapes {
            s.scrape().await?;
        }
        rows.push((s.handshakes.load(Ordering::Relaxed), t.elapsed() / scrapes as u32));
    }
    println!(
        "| {scrapes} scrapes over mutual TLS: handshakes (keep-alive client / a new connection each) | {} | {} |",
        rows[0].0, rows[1].0
    );
    println!(
        "| ms per scrape (keep-alive client / a new connection each) | {:.3} | {:.3} |",
        rows[0].1.as_secs_f64() * 1e3,
        rows[1].1.as_secs_f64() * 1e3
    );
    scrape_cpu(&addr, &token, &pki).await?;
    ingest(&agent, &rv, &token, &pki, &addr).await?;
    agent.shutdown_and_wait().await;
    let _ = rv.shutdown_and_wait().await;
    Ok(())
}

/// The CPU that 20 scrapes a second take (server and client together, so
/// an upper bound on the agent's share), against the same window idle.
async fn scrape_cpu(addr: &str, token: &Token, pki: &common::Pki) -> anyhow::Result<()> {
    let window = Duration::from_secs(arg("--cpu-window-secs", 4) as u64);
    let idle = {
        let c = cpu_seconds();
        tokio::time::sleep(window).await;
        cpu_seconds() - c
    };
    let mut s = Scraper::new(addr, token, &pki.client, true)?;
    let mut every = tokio::time::interval(Duration::from_millis(50));
    let (c, t) = (cpu_seconds(), Instant::now());
    while t.elapsed() < window {
        every.tick().await;
        s.scrape().await?;
    }
    let busy = cpu_seconds() - c;
    let share = |cpu: f64| 100.0 * cpu / window.as_secs_f64();
    println!(
        "| CPU while scraped 20×/s for {} s, % of one core (server and client) / idle | {:.2} % | {:.2} % |",
        window.as_secs(),
        share(busy),
        share(idle)
    );
    Ok(())
}

/// Ingest unscraped against ingest scraped 20×/s, interleaved rounds (each
/// round in the other order than the one before).
async fn ingest(
    agent: &kindling_agent::AgentHandle,
    rv: &EmbeddedRendezvous,
    token: &Token,
    pki: &common::Pki,
    addr: &str,
) -> anyhow::Result<()> {
    let (schema, batches) = ingest_batches(arg("--ingest-mb", 256));
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    let rounds = arg("--rounds", 5);
    let spec = JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .features((0..16).map(|i| format!("f{i}")))
        .label("y")
        .build()?;
    let rendezvous = RendezvousClient::connect(rv.url(), Some(token)).await?;
    let channel = ChannelConfig::default().with_tls(Some(pki.client.clone()));
    let mut rates: [Vec<f64>; 2] = Default::default();
    let mut scrapes_done = 0u64;
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for scraped in order {
            let job_id = format!("ingest-{round}-{scraped}");
            rendezvous.create_job(&JobConfig::new(&job_id, 1)).await?;
            let mut client = flight(agent.url(), token, &channel).await?;
            let start = StartJob {
                job_id: job_id.clone(),
                spec: spec.clone(),
                rendezvous: rv.url(),
                initial_weights: None,
            };
            act(&mut client, Action::StartJob(start)).await?;
            let stop = CancellationToken::new();
            let scraper = scraped.then(|| {
                let mut s = Scraper::new(addr, token, &pki.client, true).expect("scraper");
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_millis(50));
                    let mut n = 0u64;
                    while !stop.is_cancelled() {
                        every.tick().await;
                        s.scrape().await.expect("scrape");
                        n += 1;
                    }
                    n
                })
            });
            let messages = encode(&schema, &batches, &DataPath::data(&job_id, Split::Train));
            let t = Instant::now();
            let mut acks = client.do_put(futures::stream::iter(messages)).await?.into_inner();
            while let Some(a) = futures::StreamExt::next(&mut acks).await {
                a?;
            }
            rates[scraped as usize].push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
            stop.cancel();
            if let Some(s) = scraper {
                scrapes_done += s.await?;
            }
            let cancel = CancelJob {
                job_id,
                reason: "measured".into(),
            };
            act(&mut client, Action::CancelJob(cancel)).await?;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (plain, scraped) = (median(&mut rates[0]), median(&mut rates[1]));
    println!(
        "| DoPut ingest over mutual TLS, {} MB, median of {rounds}: scraped 20×/s ({scrapes_done} scrapes) / unscraped | {scraped:.2} GB/s ({:.3}×) | {plain:.2} GB/s |",
        bytes >> 20,
        scraped / plain
    );
    Ok(())
}
