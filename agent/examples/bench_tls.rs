//! What TLS costs, each figure against plaintext measured in the same run
//! (rounds interleaved, best of `--rounds`):
//!
//! 1. `DoPut` ingest of `--ingest-mb` MB of 17-column Arrow batches into an
//!    agent serving plaintext and into one serving mutual TLS.
//! 2. Ring all-reduce of `--mb` MB per rank across `--ranks` in-process
//!    collective servers on loopback, plaintext and mutual TLS: bus
//!    bandwidth and CPU seconds per GB moved.
//! 3. A new connection: dial, handshake and one `list_jobs` action, median
//!    of `--connections`.
//!
//! Certificates: a test CA and ECDSA P-256 certificates (what the
//! cert-manager overlay issues), made at start.
//!
//! `cargo run --release -p kindling-agent --example bench_tls -- --ranks 4 --mb 64 --ingest-mb 256`

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kindling_agent::collective::{Inbox, Ring, RingConfig};
use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig};
use kindling_schemas::action::{Action, CancelJob, StartJob};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::{JobSpec, Task};
use tokio_util::sync::CancellationToken;

mod common;
use common::{Pki, act, arg, collective_servers, cpu_seconds, encode, flight, ingest_batches, pki};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let pki = pki()?;
    let rounds = arg("--rounds", 3);
    println!("| benchmark | mutual TLS | plaintext (same run) | TLS / plaintext |");
    println!("|---|---:|---:|---:|");
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if run("ingest") {
        ingest(&pki, arg("--ingest-mb", 256), rounds).await?;
    }
    if run("allreduce") {
        allreduce(&pki, arg("--ranks", 4), arg("--mb", 64), rounds).await?;
    }
    if run("connect") {
        connections(&pki, arg("--connections", 200)).await?;
    }
    Ok(())
}

async fn ingest(pki: &Pki, total_mb: usize, rounds: usize) -> anyhow::Result<()> {
    let (schema, batches) = ingest_batches(total_mb);
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    let token = Token::new("bench");
    let rv = EmbeddedRendezvous::start(RendezvousConfig::default(), Some(token.clone())).await?;
    let dir = tempfile::tempdir()?;
    let mut agents = Vec::new();
    for (name, tls) in [("plain", None), ("tls", Some(pki.server.clone()))] {
        let mut config = kindling_agent::AgentConfig::local(format!("bench-{name}"), dir.path());
        config.token = Some(token.clone());
        config.rendezvous = Some(rv.url());
        config.memory_budget = 8 << 30;
        config.channel = config.channel.with_tls(tls);
        agents.push(kindling_agent::start(config).await?);
    }
    let spec = JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .features((0..16).map(|i| format!("f{i}")))
        .label("y")
        .build()?;
    let rendezvous = RendezvousClient::connect(rv.url(), Some(&token)).await?;
    let channels = [
        ChannelConfig::default(),
        ChannelConfig::default().with_tls(Some(pki.client.clone())),
    ];
    let mut best = [Duration::MAX; 2];
    for round in 0..rounds {
        for (i, agent) in agents.iter().enumerate() {
            let job_id = format!("ingest-{i}-{round}");
            rendezvous.create_job(&JobConfig::new(&job_id, 1)).await?;
            let mut client = flight(agent.url(), &token, &channels[i]).await?;
            act(
                &mut client,
                Action::StartJob(StartJob {
                    job_id: job_id.clone(),
                    spec: spec.clone(),
                    rendezvous: rv.url(),
                    initial_weights: None,
                }),
            )
            .await?;
            let messages = encode(&schema, &batches, &DataPath::data(&job_id, Split::Train));
            let t = Instant::now();
            let mut acks = client.do_put(futures::stream::iter(messages)).await?.into_inner();
            while let Some(a) = acks.next().await {
                a?;
            }
            best[i] = best[i].min(t.elapsed());
            act(
                &mut client,
                Action::CancelJob(CancelJob {
                    job_id,
                    reason: "measured".into(),
                }),
            )
            .await?;
        }
    }
    let gbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    let (plain, tls) = (gbps(best[0]), gbps(best[1]));
    println!(
        "| DoPut ingest, {} MB in {} batches, best of {rounds} | {tls:.2} GB/s | {plain:.2} GB/s | {:.2}× |",
        bytes >> 20,
        batches.len(),
        tls / plain
    );
    for a in agents {
        a.shutdown_and_wait().await;
    }
    let _ = rv.shutdown_and_wait().await;
    Ok(())
}

/// One all-reduce of `len` floats on every rank; the slowest rank's time.
async fn all_reduce_once(
    job: &str,
    urls: &[String],
    inboxes: &[Arc<Inbox>],
    token: &Token,
    channel: &ChannelConfig,
    len: usize,
) -> anyhow::Result<Duration> {
    let mut tasks = Vec::new();
    for (rank, inbox) in inboxes.iter().enumerate() {
        inbox.enter_attempt(job, 1);
        let mut ring = Ring::new(
            RingConfig {
                job_id: job.to_owned(),
                attempt: 1,
                rank: rank as u32,
                peers: urls.to_vec(),
                token: Some(token.clone()),
                timeout: Duration::from_secs(120),
                channel: channel.clone(),
            },
            inbox.clone(),
            CancellationToken::new(),
        )?;
        let mut buf = vec![rank as f32; len];
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            ring.all_reduce_sum(&mut buf).await.map(|_| t.elapsed())
        }));
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        slowest = slowest.max(t.await??);
    }
    Ok(slowest)
}

async fn allreduce(pki: &Pki, world: usize, mb: usize, rounds: usize) -> anyhow::Result<()> {
    let token = Token::new("bench");
    let len = mb * (1 << 20) / 4;
    let stop = CancellationToken::new();
    let plain = collective_servers(world, &token, None, &stop).await?;
    let tls = collective_servers(world, &token, Some(pki.server.clone()), &stop).await?;
    let setups = [
        (plain, ChannelConfig::default()),
        (tls, ChannelConfig::default().with_tls(Some(pki.client.clone()))),
    ];
    let mut best = [Duration::MAX; 2];
    let mut cpu = [0.0; 2];
    for round in 0..rounds {
        for (i, ((urls, inboxes), channel)) in setups.iter().enumerate() {
            let before = cpu_seconds();
            let took =
                all_reduce_once(&format!("bench-{i}-{round}"), urls, inboxes, &token, channel, len).await?;
            cpu[i] += cpu_seconds() - before;
            best[i] = best[i].min(took);
        }
    }
    stop.cancel();
    let bytes = (len * 4) as f64;
    let factor = 2.0 * (world as f64 - 1.0) / world as f64;
    let bus = |d: Duration| factor * bytes / d.as_secs_f64() / 1e9;
    println!(
        "| ring all-reduce, {world} ranks × {mb} MB, bus bandwidth, best of {rounds} | {:.2} GB/s | {:.2} GB/s | {:.2}× |",
        bus(best[1]),
        bus(best[0]),
        bus(best[1]) / bus(best[0])
    );
    let gb = rounds as f64 * world as f64 * factor * bytes / 1e9;
    println!(
        "| ring all-reduce, CPU seconds per GB moved (all ranks) | {:.2} s | {:.2} s | {:.2}× |",
        cpu[1] / gb,
        cpu[0] / gb,
        cpu[1] / cpu[0]
    );
    Ok(())
}

async fn connections(pki: &Pki, n: usize) -> anyhow::Result<()> {
    let token = Token::new("bench");
    let rv = EmbeddedRendezvous::start(RendezvousConfig::default(), Some(token.clone())).await?;
    let dir = tempfile::tempdir()?;
    let mut config = kindling_agent::AgentConfig::local("bench-connect", dir.path());
    config.token = Some(token.clone());
    config.rendezvous = Some(rv.url());
    config.channel = config.channel.with_tls(Some(pki.server.clone()));
    let tls_agent = kindling_agent::start(config).await?;
    let mut config = kindling_agent::AgentConfig::local("bench-connect-plain", dir.path());
    config.token = Some(token.clone());
    config.rendezvous = Some(rv.url());
    let plain_agent = kindling_agent::start(config).await?;
    let targets = [
        (plain_agent.url().to_owned(), ChannelConfig::default()),
        (
            tls_agent.url().to_owned(),
            ChannelConfig::default().with_tls(Some(pki.client.clone())),
        ),
    ];
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..n {
        for (i, (url, channel)) in targets.iter().enumerate() {
            let t = Instant::now();
            let mut client = flight(url, &token, channel).await?;
            act(&mut client, Action::ListJobs).await?;
            times[i].push(t.elapsed());
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let (plain, tls) = (median(&mut times[0]), median(&mut times[1]));
    println!(
        "| new connection + one action, median of {n} | {tls:.2} ms | {plain:.2} ms | {:.2}× |",
        tls / plain
    );
    tls_agent.shutdown_and_wait().await;
    plain_agent.shutdown_and_wait().await;
    let _ = rv.shutdown_and_wait().await;
    Ok(())
}
