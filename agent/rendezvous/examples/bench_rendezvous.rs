//! Rendezvous benchmark: gang formation of many in-process clients against one
//! server, and barrier latency at a given world size, with in-run baselines (a
//! no-op unary RPC, and `tokio::sync::Barrier` without gRPC) — once with the
//! state in memory and once with a state dir (every change written before it
//! is acknowledged), so the cost of durability is measured in the same run.
//! Then restarts: a `kindling-rendezvous` process with a state dir, serving
//! a formed gang, is SIGKILLed and started again on the same address after
//! `--outage-ms`, `--restarts` times; measured from the new process's spawn
//! to every member's barrier, called during the outage, released (so it
//! includes the process start, reading the state back, and the members'
//! retry backoff).
//!
//! With `--etcd host:port,…` (a cluster such as `deploy/local/etcd.sh start`
//! makes), also: the same suite with the state in etcd (one replica, which
//! campaigns and leads), and failovers: three replica processes on that
//! etcd, a formed gang following them; the leader is SIGKILLed
//! `--failovers` times (and started again as a follower), measured from the
//! SIGKILL to every member's barrier, called right after it, released.
//!
//! ```text
//! export CARGO_TARGET_DIR=$HOME/.cache/kindling/target
//! cargo build --release -p kindling-rendezvous --bins --example bench_rendezvous
//! $CARGO_TARGET_DIR/release/examples/bench_rendezvous \
//!   --gang-members 1000 --barrier-members 256 --rounds 200 --channels 16 \
//!   --etcd "$(deploy/local/etcd.sh start)"
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::path::Path;

use clap::Parser;
use kindling_rendezvous::etcd::EtcdSettings;
use kindling_rendezvous::{RendezvousConfig, ServerConfig, serve};
use kindling_schemas::auth::Token;
use kindling_schemas::rendezvous::{AgentInfo, JobConfig, RendezvousClient};
use tokio_util::sync::CancellationToken;

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
    /// Restarts to time.
    #[arg(long, default_value_t = 12)]
    restarts: usize,
    /// Members of the gang whose rendezvous restarts.
    #[arg(long, default_value_t = 8)]
    restart_members: usize,
    /// How long the rendezvous is down each time (ms).
    #[arg(long, default_value_t = 500)]
    outage_ms: u64,
    /// The `kindling-rendezvous` binary restarted (default: beside this
    /// example's directory, as cargo lays out a target dir).
    #[arg(long)]
    rendezvous_bin: Option<std::path::PathBuf>,
    /// An etcd cluster (`host:port,…`): also measure the state in etcd and
    /// leader failovers.
    #[arg(long)]
    etcd: Option<String>,
    /// Leader SIGKILLs to time (with --etcd).
    #[arg(long, default_value_t = 12)]
    failovers: usize,
}

/// Where a suite's server keeps its state.
enum Store<'a> {
    Memory,
    Dir(&'a Path),
    Etcd(EtcdSettings),
}

/// A key prefix no earlier run used.
fn fresh_prefix(what: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!("/kindling-bench/{what}-{}-{now}", std::process::id())
}

/// A rendezvous served on `listener` until the returned token is cancelled
/// (graceful) or the task aborted (a crash).
fn start_server(
    listener: tokio::net::TcpListener,
    token: &Token,
    store: &Store<'_>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let config = RendezvousConfig::default()
        .with_lease(Duration::from_secs(60))
        .with_gang_timeout(Duration::from_secs(60))
        .with_barrier_timeout(Duration::from_secs(60));
    let (state_dir, etcd) = match store {
        Store::Memory => (None, None),
        Store::Dir(dir) => (Some(dir.to_path_buf()), None),
        Store::Etcd(settings) => (None, Some(settings.clone())),
    };
    let config = ServerConfig {
        state_dir,
        etcd,
        ..ServerConfig::new(config, Some(token.clone()))
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(listener, config, stop.clone()));
    let handle = tokio::spawn(async move {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("rendezvous: {e}"),
            Err(e) if e.is_cancelled() => {}
            Err(e) => eprintln!("rendezvous task: {e}"),
        }
    });
    (stop, handle)
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
                Ok::<_, kindling_schemas::rendezvous::ClientError>(times)
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

type BoxError = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let mut rows = Vec::new();
    suite(&args, &Store::Memory, "", &mut rows).await?;
    let dir = tempfile::tempdir()?;
    suite(&args, &Store::Dir(dir.path()), " [state dir]", &mut rows).await?;
    if let Some(hosts) = &args.etcd {
        let store = format!("etcd://{hosts}{}", fresh_prefix("suite"));
        let settings = EtcdSettings::parse(&store, Duration::from_secs(2), "http://127.0.0.1:0")?;
        suite(&args, &Store::Etcd(settings), " [etcd]", &mut rows).await?;
    }
    restarts(&args, &mut rows).await?;
    if let Some(hosts) = &args.etcd {
        failovers(&args, hosts, &mut rows).await?;
    }
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
    Ok(())
}

type Gang = Arc<kindling_schemas::rendezvous::GangMember>;

/// `n` agents registered (their leases) and the gang of a new job `job_id`.
async fn formed_gang(
    client: &RendezvousClient,
    job_id: &str,
    n: usize,
) -> Result<(Vec<kindling_schemas::rendezvous::AgentLease>, Vec<Gang>), BoxError> {
    let mut leases = Vec::new();
    for i in 0..n {
        leases.push(client.register(agent(i)).await?);
    }
    client.create_job(&JobConfig::new(job_id, n as u32)).await?;
    let joins = (0..n).map(|i| {
        let c = client.clone();
        async move { c.join(job_id, 1, &agent(i).agent_id).await }
    });
    let gangs = futures::future::try_join_all(joins).await?;
    Ok((leases, gangs.into_iter().map(Arc::new).collect()))
}

type Released = tokio::task::JoinHandle<Result<Instant, kindling_schemas::rendezvous::ClientError>>;

/// Every member's next barrier, called now; each task ends when it is released.
fn barriers(gangs: &[Gang]) -> Vec<Released> {
    gangs
        .iter()
        .map(|g| {
            let g = g.clone();
            tokio::spawn(async move { g.barrier().await.map(|()| Instant::now()) })
        })
        .collect()
}

/// How long after `from` the last of `barriers` was released.
async fn released_after(barriers: Vec<Released>, from: Instant) -> Result<Duration, BoxError> {
    let mut last = from;
    for b in barriers {
        last = last.max(b.await??);
    }
    Ok(last - from)
}

/// A `kindling-rendezvous` process, SIGKILLed when dropped.
struct RendezvousProcess(std::process::Child);

impl RendezvousProcess {
    /// Starts one on `addr` keeping its state in `dir`.
    fn spawn(bin: &Path, addr: std::net::SocketAddr, dir: &Path) -> std::io::Result<Self> {
        Self::spawn_with(bin, addr, &["--state-dir".as_ref(), dir.as_os_str()])
    }

    /// Starts one on `addr` with `store_args` saying where its state is.
    fn spawn_with(
        bin: &Path,
        addr: std::net::SocketAddr,
        store_args: &[&std::ffi::OsStr],
    ) -> std::io::Result<Self> {
        std::process::Command::new(bin)
            .args(["--listen", &addr.to_string(), "--health-listen", "127.0.0.1:0"])
            .args(["--lease-ms", "60000", "--gang-timeout-ms", "60000"])
            .env("KINDLING_TOKEN", "bench")
            .args(store_args)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(RendezvousProcess)
    }

    /// SIGKILL, and reaps it.
    fn kill(&mut self) -> std::io::Result<()> {
        self.0.kill()?;
        self.0.wait().map(|_| ())
    }
}

impl Drop for RendezvousProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Restart to resumed: a formed gang's members call a barrier while the
/// rendezvous process is down (SIGKILLed); timed from the new process's
/// spawn to all released.
/// The `kindling-rendezvous` binary the process rows run.
fn rendezvous_bin(args: &Args) -> Result<std::path::PathBuf, BoxError> {
    let bin = match &args.rendezvous_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .ok_or("no target dir above this example")?
            .join("kindling-rendezvous"),
    };
    if !bin.exists() {
        return Err(format!(
            "{} not found: build it (cargo build --release -p kindling-rendezvous) \
             or pass --rendezvous-bin",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

async fn restarts(args: &Args, rows: &mut Vec<Row>) -> Result<(), BoxError> {
    let bin = rendezvous_bin(args)?;
    let token = Token::new("bench");
    let dir = tempfile::tempdir()?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut server = RendezvousProcess::spawn(&bin, addr, dir.path())?;
    // The process binds its port after it starts: connect once it listens.
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        match RendezvousClient::connect(format!("http://{addr}"), Some(&token)).await {
            Ok(client) => break client,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let n = args.restart_members;
    let (leases, gangs) = formed_gang(&client, "restarts", n).await?;
    let mut resumed = Vec::new();
    for _ in 0..args.restarts {
        server.kill()?; // SIGKILL
        let barriers = barriers(&gangs);
        tokio::time::sleep(Duration::from_millis(args.outage_ms)).await;
        let started = Instant::now();
        server = RendezvousProcess::spawn(&bin, addr, dir.path())?;
        resumed.push(released_after(barriers, started).await?);
    }
    let status = client.status("restarts").await?;
    assert_eq!(status.attempt, 1, "the restarts cost no attempt: {status:?}");
    rows.push(Row::new(
        format!(
            "SIGKILL, {} ms down, restart → every member's barrier released [state dir]",
            args.outage_ms
        ),
        n,
        resumed,
    ));
    for l in leases {
        l.stop().await;
    }
    server.kill()?;
    Ok(())
}

/// Gang formation and collectives against a fresh server, its state in
/// `store`; rows labelled with `label`.
async fn suite(args: &Args, store: &Store<'_>, label: &str, rows: &mut Vec<Row>) -> Result<(), BoxError> {
    let token = Token::new("bench");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, server) = start_server(listener, &token, store);
    let mut clients = Vec::new();
    for _ in 0..args.channels.max(1) {
        clients.push(RendezvousClient::connect(url.clone(), Some(&token)).await?);
    }

    // Baseline 1: a no-op unary RPC round trip.
    let probe = &clients[0];
    probe.register(agent(usize::MAX / 2)).await?.stop().await;
    let mut rtt = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        probe.heartbeat(&agent(usize::MAX / 2).agent_id).await?;
        rtt.push(t.elapsed());
    }
    rows.push(Row::new(
        format!("{}{label}", "baseline: unary RPC round trip"),
        1,
        rtt,
    ));

    // Registration of every agent (leases kept alive in the background).
    let n = args.gang_members.max(args.barrier_members);
    let t = Instant::now();
    let leases = futures::future::join_all((0..n).map(|i| clients[i % clients.len()].register(agent(i))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    rows.push(Row::new(
        format!("{}{label}", "register agents (all, concurrent)"),
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
        format!("{}{label}", "gang formation (first join → all released)"),
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
        format!("{}{label}", "barrier: last entry → all released"),
        args.barrier_members,
        release,
    ));
    rows.push(Row::new(
        format!("{}{label}", "barrier: first entry → all released"),
        args.barrier_members,
        round,
    ));
    clients[0]
        .create_job(&JobConfig::new("barrier-unary", args.barrier_members as u32))
        .await?;
    let (release, _) =
        collective_rounds(&clients, "barrier-unary", members, args.rounds, 0, Calls::Unary).await;
    rows.push(Row::new(
        format!(
            "{}{label}",
            "baseline: barrier as unary RPCs, last entry → all released"
        ),
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
        format!(
            "all-gather {} B: last entry → all released{label}",
            args.gather_bytes
        ),
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
        format!("{}{label}", "baseline: tokio Barrier, last entry → all released"),
        args.barrier_members,
        local,
    ));

    for l in leases {
        l.stop().await;
    }
    stop.cancel();
    server.await?;
    Ok(())
}

/// Leader failovers: three replica processes on the etcd at `hosts`, a
/// formed gang following them; the leader is SIGKILLed and every member's
/// barrier, called right after, timed until released; the killed replica
/// is started again (a follower now) before the next round.
async fn failovers(args: &Args, hosts: &str, rows: &mut Vec<Row>) -> Result<(), BoxError> {
    let bin = rendezvous_bin(args)?;
    let token = Token::new("bench");
    let store = format!("etcd://{hosts}{}", fresh_prefix("failover"));
    let mut addrs = Vec::new();
    for _ in 0..3 {
        addrs.push(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?);
    }
    let spawn = |addr: std::net::SocketAddr| {
        let advertise = format!("http://{addr}");
        RendezvousProcess::spawn_with(
            &bin,
            addr,
            &[
                "--store".as_ref(),
                store.as_ref(),
                "--advertise".as_ref(),
                advertise.as_ref(),
            ],
        )
    };
    let mut replicas = addrs
        .iter()
        .map(|a| spawn(*a))
        .collect::<std::io::Result<Vec<_>>>()?;
    let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    let client = RendezvousClient::connect_lazy(&urls.join(","), Some(&token))?;
    let n = args.restart_members;
    let (leases, gangs) = formed_gang(&client, "failovers", n).await?;
    let mut released = Vec::new();
    for _ in 0..args.failovers {
        // The leader: the replica a one-try call is answered by.
        let mut leader = None;
        while leader.is_none() {
            for (i, url) in urls.iter().enumerate() {
                let one =
                    RendezvousClient::connect_lazy(url, Some(&token))?.with_outage_bound(Duration::ZERO);
                if one.list_jobs().await.is_ok() {
                    leader = Some(i);
                    break;
                }
            }
        }
        let leader = leader.ok_or("no leader")?;
        replicas[leader].kill()?; // SIGKILL
        let killed = Instant::now();
        let barriers = barriers(&gangs);
        released.push(released_after(barriers, killed).await?);
        replicas[leader] = spawn(addrs[leader])?;
    }
    let status = client.status("failovers").await?;
    assert_eq!(status.attempt, 1, "the failovers cost no attempt: {status:?}");
    rows.push(Row::new(
        "leader SIGKILL → every member's barrier released [etcd, 3 replicas, 2 s lease]",
        n,
        released,
    ));
    for l in leases {
        l.stop().await;
    }
    Ok(())
}
