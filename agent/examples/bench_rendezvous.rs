//! Rendezvous benchmark: gang formation of many in-process clients against one
//! embedded server, and barrier latency at a given world size, with in-run
//! baselines (a no-op unary RPC, and `tokio::sync::Barrier` without gRPC).
//!
//! ```text
//! CARGO_TARGET_DIR=$HOME/.cache/kindling/target \
//!   cargo run --release -p kindling-agent --example bench_rendezvous -- \
//!   --gang-members 1000 --barrier-members 256 --rounds 200 --channels 16
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kindling_agent::rendezvous::{
    AgentInfo, EmbeddedRendezvous, JobConfig, RendezvousClient, RendezvousConfig, ServerConfig,
};
use kindling_schemas::auth::Token;

#[derive(Debug, Parser)]
struct Args {
    /// Members of the gang-formation benchmark.
    #[arg(long, default_value_t = 1000)]
    gang_members: usize,
    /// Gang formations to time.
    #[arg(long, default_value_t = 5)]
    gang_repeats: usize,
    /// Members of the barrier benchmark.
    #[arg(long, default_value_t = 256)]
    barrier_members: usize,
    /// Barrier rounds to time.
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// HTTP/2 connections the clients are spread over.
    #[arg(long, default_value_t = 16)]
    channels: usize,
    /// Payload of the all-gather rounds (bytes).
    #[arg(long, default_value_t = 1024)]
    gather_bytes: usize,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

struct Row {
    what: String,
    n: usize,
    samples: Vec<Duration>,
}

impl Row {
    fn new(what: impl Into<String>, n: usize, mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Row {
            what: what.into(),
            n,
            samples,
        }
    }
}

fn agent(i: usize) -> AgentInfo {
    let id = format!("bench-agent-{i:05}");
    AgentInfo {
        flight_address: format!("http://10.0.{}.{}:50051", i / 250, i % 250),
        collective_address: format!("http://10.0.{}.{}:50052", i / 250, i % 250),
        node_name: format!("node-{}", i / 8),
        capacity: 1,
        has_gpu: false,
        models: vec!["linear".into(), "mlp".into()],
        agent_id: id,
    }
}

/// How members call the collectives.
#[derive(Clone, Copy, PartialEq)]
enum Calls {
    /// `Gang::all_gather`: one stream per member.
    Stream,
    /// `RendezvousClient::all_gather`: one unary RPC per call.
    Unary,
}

/// Runs `rounds` collectives with every member; returns per-round
/// (release latency = last exit − last entry, round time = last exit − first entry).
async fn collective_rounds(
    clients: &[RendezvousClient],
    job: &str,
    members: &[String],
    rounds: usize,
    payload: usize,
    calls: Calls,
) -> (Vec<Duration>, Vec<Duration>) {
    let joins: Vec<_> = members
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let c = clients[i % clients.len()].clone();
            let (job, id) = (job.to_owned(), id.clone());
            tokio::spawn(async move { c.join(&job, 1, &id).await })
        })
        .collect();
    let mut gangs = Vec::with_capacity(joins.len());
    for j in joins {
        gangs.push(j.await.expect("join task"));
    }
    let tasks: Vec<_> = gangs
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let client = clients[i % clients.len()].clone();
            tokio::spawn(async move {
                let gang = g?;
                let m = gang.membership().clone();
                let mut times = Vec::with_capacity(rounds);
                for seq in 0..rounds as u64 {
                    let enter = Instant::now();
                    match calls {
                        Calls::Stream => gang.all_gather(vec![7u8; payload]).await?,
                        Calls::Unary => {
                            client
                                .all_gather(&m.job_id, m.attempt, m.rank, seq, vec![7u8; payload])
                                .await?
                        }
                    };
                    times.push((enter, Instant::now()));
                }
                Ok::<_, kindling_agent::rendezvous::ClientError>(times)
            })
        })
        .collect();
    let mut per_member = Vec::new();
    for t in tasks {
        per_member.push(t.await.expect("task").expect("collective"));
    }
    let mut release = Vec::new();
    let mut round_time = Vec::new();
    for r in 0..rounds {
        let last_enter = per_member.iter().map(|m| m[r].0).max().expect("members");
        let first_enter = per_member.iter().map(|m| m[r].0).min().expect("members");
        let last_exit = per_member.iter().map(|m| m[r].1).max().expect("members");
        release.push(last_exit.saturating_duration_since(last_enter));
        round_time.push(last_exit.saturating_duration_since(first_enter));
    }
    (release, round_time)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let token = Token::new("bench");
    let config = RendezvousConfig::default()
        .with_lease(Duration::from_secs(60))
        .with_gang_timeout(Duration::from_secs(60))
        .with_barrier_timeout(Duration::from_secs(60));
    let server = EmbeddedRendezvous::start_with(ServerConfig::new(config, Some(token.clone()))).await?;
    let mut clients = Vec::new();
    for _ in 0..args.channels.max(1) {
        clients.push(RendezvousClient::connect(server.url(), Some(&token)).await?);
    }
    let mut rows = Vec::new();

    // Baseline 1: a no-op unary RPC round trip.
    let probe = &clients[0];
    probe.register(agent(usize::MAX / 2)).await?.stop().await;
    let mut rtt = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        probe.heartbeat(&agent(usize::MAX / 2).agent_id).await?;
        rtt.push(t.elapsed());
    }
    rows.push(Row::new("baseline: unary RPC round trip", 1, rtt));

    // Registration of every agent (leases kept alive in the background).
    let n = args.gang_members.max(args.barrier_members);
    let t = Instant::now();
    let leases = futures::future::join_all((0..n).map(|i| clients[i % clients.len()].register(agent(i))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    rows.push(Row::new(
        "register agents (all, concurrent)",
        n,
        vec![t.elapsed()],
    ));
    let ids: Vec<String> = leases.iter().map(|l| l.agent_id().to_owned()).collect();

    // Gang formation: from the first join call to every join returned.
    let mut gang_times = Vec::new();
    for rep in 0..args.gang_repeats {
        let job = format!("gang-{rep}");
        clients[0]
            .create_job(&JobConfig::new(&job, args.gang_members as u32))
            .await?;
        let t = Instant::now();
        // One task per member, as members are separate processes in reality.
        let joins: Vec<_> = ids[..args.gang_members]
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let c = clients[i % clients.len()].clone();
                let (job, id) = (job.clone(), id.clone());
                tokio::spawn(async move { c.join(&job, 1, &id).await })
            })
            .collect();
        let mut joined = Vec::with_capacity(joins.len());
        for j in joins {
            joined.push(j.await?);
        }
        gang_times.push(t.elapsed());
        for g in joined {
            g?;
        }
        clients[0].complete(&job, 1).await?;
    }
    rows.push(Row::new(
        "gang formation (first join → all released)",
        args.gang_members,
        gang_times,
    ));

    // Barrier and all-gather at the barrier world size.
    let members = &ids[..args.barrier_members];
    clients[0]
        .create_job(&JobConfig::new("barrier", args.barrier_members as u32))
        .await?;
    let (release, round) =
        collective_rounds(&clients, "barrier", members, args.rounds, 0, Calls::Stream).await;
    rows.push(Row::new(
        "barrier: last entry → all released",
        args.barrier_members,
        release,
    ));
    rows.push(Row::new(
        "barrier: first entry → all released",
        args.barrier_members,
        round,
    ));
    clients[0]
        .create_job(&JobConfig::new("barrier-unary", args.barrier_members as u32))
        .await?;
    let (release, _) =
        collective_rounds(&clients, "barrier-unary", members, args.rounds, 0, Calls::Unary).await;
    rows.push(Row::new(
        "baseline: barrier as unary RPCs, last entry → all released",
        args.barrier_members,
        release,
    ));
    clients[0]
        .create_job(&JobConfig::new("gather", args.barrier_members as u32))
        .await?;
    let (release, _) = collective_rounds(
        &clients,
        "gather",
        members,
        args.rounds,
        args.gather_bytes,
        Calls::Stream,
    )
    .await;
    rows.push(Row::new(
        format!("all-gather {} B: last entry → all released", args.gather_bytes),
        args.barrier_members,
        release,
    ));

    // Baseline 2: the same rounds through tokio::sync::Barrier (no gRPC).
    let barrier = Arc::new(tokio::sync::Barrier::new(args.barrier_members));
    let tasks: Vec<_> = (0..args.barrier_members)
        .map(|_| {
            let b = barrier.clone();
            let rounds = args.rounds;
            tokio::spawn(async move {
                let mut times = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    let enter = Instant::now();
                    b.wait().await;
                    times.push((enter, Instant::now()));
                }
                times
            })
        })
        .collect();
    let mut per_member = Vec::new();
    for t in tasks {
        per_member.push(t.await?);
    }
    let local: Vec<Duration> = (0..args.rounds)
        .map(|r| {
            let last_enter = per_member
                .iter()
                .map(|m| m[r].0)
                .max()
                .unwrap_or_else(Instant::now);
            let last_exit = per_member.iter().map(|m| m[r].1).max().unwrap_or(last_enter);
            last_exit.saturating_duration_since(last_enter)
        })
        .collect();
    rows.push(Row::new(
        "baseline: tokio Barrier, last entry → all released",
        args.barrier_members,
        local,
    ));

    println!(
        "\n| measurement | members | samples | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|"
    );
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.what,
            r.n,
            r.samples.len(),
            ms(pct(&r.samples, 0.5)),
            ms(pct(&r.samples, 0.99)),
            ms(r.samples.last().copied().unwrap_or_default()),
        );
    }
    for l in leases {
        l.stop().await;
    }
    server.shutdown_and_wait().await?;
    Ok(())
}
