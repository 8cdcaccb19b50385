//! Agent benchmarks, each against a baseline measured in the same run:
//!
//! 1. Ring all-reduce of `--mb` MB per rank across `--ranks` in-process
//!    collective servers on loopback, reported as bus bandwidth
//!    (2(W-1)/W × bytes / time), against a raw loopback TCP copy of the same bytes.
//! 2. `DoPut` ingest into one agent (schema check, per-batch validation,
//!    caching, acks) against a `pyarrow.flight` server that stores the same
//!    batches (`--python`, default `$HOME/.cache/kindling/venv/bin/python`).
//!
//! 3. Small all-reduce latency: 2 ranks all-reduce a `--floats`-long buffer
//!    (default 610, the gradients of the pipeline benchmark's 16-32-2 MLP plus
//!    rows and loss) `--reps` times back to back, as the trainer does once per
//!    step, against two tasks swapping the same bytes over one loopback TCP
//!    connection. Then the same all-reduce the way the trainer calls it: from
//!    two OS threads that each compute for `--compute-us` µs (busy work on
//!    the CPU, as a step's forward and backward) and then block on the ring
//!    through a runtime handle; reported is the time each step waits for the
//!    all-reduce, against the tight loop's.
//!
//! 4. What watching costs (`--only metrics`, not run by default): `DoPut`
//!    ingest with the agent's `/metrics` read 20 times a second against the
//!    same ingest unread, then training (`--train-mb` MB of rows, 3 epochs)
//!    with `/metrics` and the rendezvous' `/api/status` read 20 times a
//!    second against the same training unread; turns alternate on one agent.
//!
//! 5. What checkpoints inside an epoch cost (`--only checkpoint`, not run
//!    by default): training with a checkpoint every `--every-steps` steps
//!    against the same training with none inside an epoch.
//!
//! 6. What a job credential's caps cost (`--only caps`, not run by
//!    default): `DoPut` ingest under a producer credential (metered,
//!    capped) against the operator token's, `--turns` each, then training
//!    steps on the rows each put (epochs 2 and 3 of 3, `--train-mb` MB,
//!    `--step-turns` each).
//!
//! `cargo run --release -p kindling-agent --example bench_agent -- --ranks 4 --mb 64 --ingest-mb 512`
//! (`--only allreduce`, `--only ingest`, `--only latency`, `--only metrics`,
//! `--only checkpoint` or `--only caps` runs one of them).

use std::time::{Duration, Instant};

use arrow_flight::FlightData;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::StreamExt;
use kindling_agent::collective::Precision;
use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig};
use kindling_schemas::action::{Action, StartJob};
use kindling_schemas::auth::Token;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::{CheckpointPolicy, JobSpec, Task};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

mod common;
use common::{arg, collective_servers, cpu_seconds, encode, ingest_batches, ring};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let ranks = arg("--ranks", 4);
    let mb = arg("--mb", 64);
    let ingest_mb = arg("--ingest-mb", 512);
    println!("| benchmark | kindling | baseline | ratio |");
    println!("|---|---:|---:|---:|");
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if run("allreduce") {
        allreduce(ranks, mb).await?;
    }
    if run("ingest") {
        ingest(ingest_mb).await?;
    }
    if only.as_deref() == Some("caps") {
        caps_cost(ingest_mb).await?;
        caps_step_cost(arg("--train-mb", 16), arg("--step-turns", 9)).await?;
    }
    if only.as_deref() == Some("checkpoint") {
        checkpoint_cost(arg("--train-mb", 16), arg("--every-steps", 100) as u64).await?;
    }
    if only.as_deref() == Some("metrics") {
        metrics_cost(ingest_mb).await?;
        train_metrics_cost(arg("--train-mb", 16)).await?;
    }
    if run("latency") {
        let floats = arg("--floats", 610);
        let reps = arg("--reps", 2000);
        let tight = latency(floats, reps).await?;
        latency_between_steps(floats, reps, arg("--compute-us", 300) as u64, tight).await?;
    }
    Ok(())
}

/// Returns the all-reduce's time in µs.
async fn latency(floats: usize, reps: usize) -> anyhow::Result<f64> {
    let token = Token::new("bench");
    let stop = CancellationToken::new();
    let (urls, inboxes) = collective_servers(2, &token, None, &stop).await?;
    let mut tasks = Vec::new();
    for (rank, inbox) in inboxes.iter().enumerate() {
        let mut ring = ring("latency", rank, &urls, &token, inbox)?;
        tasks.push(tokio::spawn(async move {
            let mut buf = vec![rank as f32; floats];
            let t = Instant::now();
            for _ in 0..reps {
                ring.all_reduce_sum(&mut buf).await?;
            }
            anyhow::Ok(t.elapsed())
        }));
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        slowest = slowest.max(t.await??);
    }
    stop.cancel();
    let ours = slowest.as_secs_f64() * 1e6 / reps as f64;

    // Baseline: the same bytes swapped both ways over one loopback TCP connection.
    let bytes = floats * 4;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let swap = move |mut s: TcpStream| async move {
        let (mine, mut theirs) = (vec![1u8; bytes], vec![0u8; bytes]);
        s.set_nodelay(true)?;
        let t = Instant::now();
        for _ in 0..reps {
            let (mut r, mut w) = s.split();
            tokio::try_join!(w.write_all(&mine), r.read_exact(&mut theirs))?;
        }
        anyhow::Ok(t.elapsed())
    };
    let server = tokio::spawn(async move { swap(listener.accept().await?.0).await });
    let client = swap(TcpStream::connect(addr).await?).await?;
    let tcp = client.max(server.await??).as_secs_f64() * 1e6 / reps as f64;
    println!(
        "| all-reduce latency, 2 ranks × {floats} floats | {ours:.0} µs | {tcp:.0} µs (swap over loopback TCP) | {:.2}× the time |",
        ours / tcp
    );
    Ok(ours)
}

/// Keeps this thread busy for `compute`, as a trainer's step would.
fn compute_for(compute: Duration) {
    let step = Instant::now();
    let mut x = 0u64;
    while step.elapsed() < compute {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

/// The all-reduce as a trainer calls it: each rank a thread of its own
/// (`spawn_blocking`, as the agent runs its trainer) that computes for
/// `compute_us` µs, then blocks on the ring through a runtime handle.
async fn latency_between_steps(
    floats: usize,
    reps: usize,
    compute_us: u64,
    tight: f64,
) -> anyhow::Result<()> {
    let token = Token::new("bench");
    let stop = CancellationToken::new();
    let (urls, inboxes) = collective_servers(2, &token, None, &stop).await?;
    let compute = Duration::from_micros(compute_us);
    let mut ranks = Vec::new();
    for (rank, inbox) in inboxes.iter().enumerate() {
        let mut ring = ring("steps", rank, &urls, &token, inbox)?;
        let handle = tokio::runtime::Handle::current();
        ranks.push(tokio::task::spawn_blocking(move || {
            let mut buf = vec![rank as f32; floats];
            let mut waited = Duration::ZERO;
            for _ in 0..reps {
                compute_for(compute);
                let t = Instant::now();
                handle.block_on(ring.all_reduce_sum(&mut buf))?;
                waited += t.elapsed();
            }
            anyhow::Ok(waited)
        }));
    }
    let mut waited = Duration::ZERO;
    for r in ranks {
        waited = waited.max(r.await??);
    }
    stop.cancel();
    let ours = waited.as_secs_f64() * 1e6 / reps as f64;
    println!(
        "| all-reduce wait per step, 2 trainer threads computing {compute_us} µs per step | {ours:.0} µs | {tight:.0} µs (the same all-reduce back to back, above) | {:.2}× the time |",
        ours / tight
    );
    // Baseline: the same threads swapping the same bytes over one loopback
    // TCP connection between the same compute steps.
    let bytes = floats * 4;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let ends = [TcpStream::connect(addr).await?, listener.accept().await?.0];
    let mut ranks = Vec::new();
    for mut s in ends {
        s.set_nodelay(true)?;
        let handle = tokio::runtime::Handle::current();
        ranks.push(tokio::task::spawn_blocking(move || {
            let (mine, mut theirs) = (vec![1u8; bytes], vec![0u8; bytes]);
            let mut waited = Duration::ZERO;
            for _ in 0..reps {
                compute_for(compute);
                let t = Instant::now();
                handle.block_on(async {
                    let (mut r, mut w) = s.split();
                    tokio::try_join!(w.write_all(&mine), r.read_exact(&mut theirs))
                })?;
                waited += t.elapsed();
            }
            anyhow::Ok(waited)
        }));
    }
    let mut tcp = Duration::ZERO;
    for r in ranks {
        tcp = tcp.max(r.await??);
    }
    let tcp = tcp.as_secs_f64() * 1e6 / reps as f64;
    println!(
        "| all-reduce wait per step, 2 trainer threads computing {compute_us} µs per step | {ours:.0} µs | {tcp:.0} µs (swap over loopback TCP between the same steps) | {:.2}× the time |",
        ours / tcp
    );
    Ok(())
}

/// The best of 3 rounds of `world` in-process ranks all-reducing `len`
/// values in `precision`, and the CPU seconds one round took.
async fn ring_rounds(world: usize, len: usize, precision: Precision) -> anyhow::Result<(Duration, f64)> {
    let token = Token::new("bench");
    let stop = CancellationToken::new();
    let (urls, inboxes) = collective_servers(world, &token, None, &stop).await?;
    // Non-zero and touched before the clock starts: a zeroed buffer would
    // fault its pages in during the run, which no raw TCP stream pays.
    let mut bufs: Vec<Vec<f32>> = (0..world).map(|rank| vec![rank as f32 + 1.0; len]).collect();
    let mut best = Duration::MAX;
    let cpu_start = cpu_seconds();
    let rounds = 3;
    for round in 0..rounds {
        let job = format!("bench-{round}");
        let mut tasks = Vec::new();
        for (rank, inbox) in inboxes.iter().enumerate() {
            let mut ring = ring(&job, rank, &urls, &token, inbox)?;
            let mut buf = std::mem::take(&mut bufs[rank]);
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                ring.all_reduce(&mut buf, precision)
                    .await
                    .map(|_| (t.elapsed(), buf))
            }));
        }
        let mut slowest = Duration::ZERO;
        for (rank, t) in tasks.into_iter().enumerate() {
            let (took, buf) = t.await??;
            slowest = slowest.max(took);
            bufs[rank] = buf;
        }
        best = best.min(slowest);
    }
    stop.cancel();
    Ok((best, (cpu_seconds() - cpu_start) / rounds as f64))
}

async fn allreduce(world: usize, mb: usize) -> anyhow::Result<()> {
    let len = mb * (1 << 20) / 4;
    let (best, ring_cpu) = ring_rounds(world, len, Precision::F32).await?;
    let bytes = (len * 4) as f64;
    let bus = 2.0 * (world as f64 - 1.0) / world as f64 * bytes / best.as_secs_f64() / 1e9;
    // Baseline: one loopback TCP stream copying the bytes each rank moves.
    let moved = (2.0 * (world as f64 - 1.0) / world as f64 * bytes) as usize;
    let tcp = loopback_copy(moved).await?;
    println!(
        "| ring all-reduce, {world} ranks × {mb} MB, bus bandwidth | {bus:.2} GB/s | {tcp:.2} GB/s (one loopback TCP stream) | {:.2}× |",
        bus / tcp
    );
    // Baseline 2: the same ring of W concurrent raw TCP streams in this process
    // (what W ranks sharing this machine's cores can move at best).
    let cpu_start = cpu_seconds();
    let tcp_ring = loopback_ring(world, moved).await?;
    let tcp_cpu = cpu_seconds() - cpu_start;
    let gb = world as f64 * moved as f64 / 1e9;
    println!(
        "| ring all-reduce, {world} ranks × {mb} MB, CPU seconds per GB moved (all ranks) | {:.2} s | {:.2} s ({world} loopback TCP streams) | {:.2}× |",
        ring_cpu / gb,
        tcp_cpu / gb,
        ring_cpu / tcp_cpu
    );
    println!(
        "| ring all-reduce, {world} ranks × {mb} MB, bus bandwidth | {bus:.2} GB/s | {tcp_ring:.2} GB/s ({world} concurrent loopback TCP streams in a ring) | {:.2}× |",
        bus / tcp_ring
    );
    // bf16 on the wire: half the bytes; reported as f32 bytes reduced per second.
    let (bf16, _) = ring_rounds(world, len, Precision::Bf16).await?;
    let bf16_bus = 2.0 * (world as f64 - 1.0) / world as f64 * bytes / bf16.as_secs_f64() / 1e9;
    println!(
        "| ring all-reduce in bf16, {world} ranks × {mb} MB of f32, f32 bus bandwidth | {bf16_bus:.2} GB/s | {bus:.2} GB/s (the same in f32, above) | {:.2}× |",
        bf16_bus / bus
    );
    Ok(())
}

async fn loopback_copy(bytes: usize) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < bytes {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        anyhow::Ok(got)
    });
    let mut s = TcpStream::connect(addr).await?;
    let chunk = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0;
    while sent < bytes {
        let n = chunk.len().min(bytes - sent);
        s.write_all(&chunk[..n]).await?;
        sent += n;
    }
    s.shutdown().await?;
    reader.await??;
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e9)
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat`.
/// `world` raw TCP streams at once, each rank writing `bytes` to the next and
/// reading as many from the previous one; GB/s per rank of the slowest.
async fn loopback_ring(world: usize, bytes: usize) -> anyhow::Result<f64> {
    let mut listeners = Vec::new();
    for _ in 0..world {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let addrs: Vec<_> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let mut outs = Vec::new();
    for addr in addrs.iter().cycle().skip(1).take(world) {
        outs.push(TcpStream::connect(addr).await?);
    }
    let mut ins = Vec::new();
    for l in &listeners {
        ins.push(l.accept().await?.0);
    }
    let t = Instant::now();
    let mut tasks = Vec::new();
    for (mut out, mut inp) in outs.into_iter().zip(ins) {
        tasks.push(tokio::spawn(async move {
            let writer = async {
                let chunk = vec![7u8; 1 << 20];
                let mut sent = 0;
                while sent < bytes {
                    let n = chunk.len().min(bytes - sent);
                    out.write_all(&chunk[..n]).await?;
                    sent += n;
                }
                anyhow::Ok(())
            };
            let reader = async {
                let mut buf = vec![0u8; 1 << 20];
                let mut got = 0;
                while got < bytes {
                    let n = inp.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                anyhow::Ok(())
            };
            tokio::try_join!(writer, reader)?;
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e9)
}

async fn put_all(url: &str, token: Option<&str>, messages: Vec<FlightData>) -> anyhow::Result<Duration> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())?
        .connect()
        .await?;
    let header = token.map(|t| format!("Bearer {t}"));
    let mut client = FlightServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
        if let Some(h) = &header {
            r.metadata_mut()
                .insert("authorization", h.parse().expect("ascii"));
        }
        Ok(r)
    })
    .max_decoding_message_size(64 << 20)
    .max_encoding_message_size(64 << 20);
    let t = Instant::now();
    let mut acks = client.do_put(futures::stream::iter(messages)).await?.into_inner();
    while let Some(a) = acks.next().await {
        a?;
    }
    Ok(t.elapsed())
}

/// An agent (with its rendezvous) for the ingest benchmarks, keeping up to
/// `budget` bytes of rows in memory.
async fn ingest_agent(
    token: &Token,
    budget: u64,
) -> anyhow::Result<(
    EmbeddedRendezvous,
    kindling_agent::AgentHandle,
    std::path::PathBuf,
)> {
    agent_with(token, budget, false).await
}

/// An embedded rendezvous and one agent with `budget` bytes of memory, both
/// taking `token`; with `credentials`, the agent also issues and checks job
/// credentials (a generated key).
async fn agent_with(
    token: &Token,
    budget: u64,
    credentials: bool,
) -> anyhow::Result<(
    EmbeddedRendezvous,
    kindling_agent::AgentHandle,
    std::path::PathBuf,
)> {
    let rv = EmbeddedRendezvous::start(RendezvousConfig::default(), Some(token.clone())).await?;
    let dir = tempfile_dir();
    let mut config = kindling_agent::AgentConfig::local("bench-agent", &dir);
    config.token = Some(token.clone());
    config.rendezvous = Some(rv.url());
    config.memory_budget = budget;
    if credentials {
        config.credentials = Some(kindling_schemas::credential::CredentialKey::generate().into());
    }
    let agent = kindling_agent::start(config).await?;
    Ok((rv, agent, dir))
}

/// A producer credential for `job` (10 minutes), issued by `agent`.
async fn producer_credential(agent: &str, token: &Token, job: &str) -> anyhow::Result<String> {
    let issue = Action::IssueCredential(kindling_schemas::action::IssueCredential {
        job_id: job.into(),
        role: kindling_schemas::credential::Role::Producer,
        ttl_secs: 600,
    });
    let answer = kindling_agent_action(agent, token, issue).await?;
    let credential: kindling_schemas::action::CredentialResponse = serde_json::from_slice(&answer)?;
    Ok(credential.credential)
}

/// Creates and starts `job` (16 float features, a class label) on `agent`.
async fn start_ingest_job(
    rv: &EmbeddedRendezvous,
    agent: &str,
    token: &Token,
    job: &str,
    epochs: u32,
) -> anyhow::Result<()> {
    start_ingest_job_with(rv, agent, token, job, epochs, CheckpointPolicy::default()).await
}

async fn start_ingest_job_with(
    rv: &EmbeddedRendezvous,
    agent: &str,
    token: &Token,
    job: &str,
    epochs: u32,
    checkpoint: CheckpointPolicy,
) -> anyhow::Result<()> {
    let spec = JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .epochs(epochs)
        .features((0..16).map(|i| format!("f{i}")))
        .label("y")
        .checkpoint(checkpoint)
        .build()?;
    RendezvousClient::connect(rv.url(), Some(token))
        .await?
        .create_job(&JobConfig::new(job, 1))
        .await?;
    let start = Action::StartJob(StartJob {
        job_id: job.into(),
        spec,
        rendezvous: rv.url(),
        initial_weights: None,
    });
    kindling_agent_action(agent, token, start).await.map(drop)
}

async fn ingest(total_mb: usize) -> anyhow::Result<()> {
    let (schema, batches) = ingest_batches(total_mb);
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    let token = Token::new("bench");
    let (rv, agent, dir) = ingest_agent(&token, 8 << 30).await?;
    start_ingest_job(&rv, agent.url(), &token, "ingest", 1).await?;
    let messages = encode(&schema, &batches, &DataPath::data("ingest", Split::Train));
    let kindling = put_all(agent.url(), Some(token.expose()), messages.clone()).await?;
    agent.shutdown_and_wait().await;

    // Baseline: a pyarrow.flight server that keeps every batch it is sent.
    let python = std::env::var("KINDLING_PYTHON_BIN").unwrap_or_else(|_| {
        format!(
            "{}/.cache/kindling/venv/bin/python",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    let mut child = std::process::Command::new(python)
        .arg("-c")
        .arg(PYARROW_SERVER)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let port: u16 = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
    })
    .await??
    .trim()
    .parse()?;
    let baseline = put_all(&format!("http://127.0.0.1:{port}"), None, messages).await?;
    child.kill()?;
    child.wait()?;
    let gbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    println!(
        "| DoPut ingest, {} MB in {} batches | {:.2} GB/s | {:.2} GB/s (pyarrow.flight server) | {:.2}× |",
        bytes >> 20,
        batches.len(),
        gbps(kindling),
        gbps(baseline),
        gbps(kindling) / gbps(baseline)
    );
    let _ = rv.shutdown_and_wait().await;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// What a job credential's caps and accounting cost ingest: the same
/// `DoPut`s into one agent, in turns, sent with a producer credential (the
/// credential checked, its stream slot taken, every message's length charged
/// against its share of the receive buffers) and with the operator token
/// (none of these); medians of `--turns` turns each (default 15).
async fn caps_cost(total_mb: usize) -> anyhow::Result<()> {
    let turns = arg("--turns", 15);
    let (schema, batches) = ingest_batches(total_mb);
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    let token = Token::new("bench");
    let (rv, agent, dir) = agent_with(&token, 16 << 30, true).await?;
    let (mut metered, mut operator) = (Vec::new(), Vec::new());
    for turn in 0..2 * turns {
        let job = format!("caps-{turn}");
        start_ingest_job(&rv, agent.url(), &token, &job, 1).await?;
        let messages = encode(&schema, &batches, &DataPath::data(&job, Split::Train));
        if turn % 2 == 0 {
            let credential = producer_credential(agent.url(), &token, &job).await?;
            metered.push(put_all(agent.url(), Some(&credential), messages).await?);
        } else {
            operator.push(put_all(agent.url(), Some(token.expose()), messages).await?);
        }
        // Its rows go: every turn starts from the same empty cache.
        let cancel = Action::CancelJob(kindling_schemas::action::CancelJob {
            job_id: job.clone(),
            reason: "measured".into(),
        });
        kindling_agent_action(agent.url(), &token, cancel).await?;
    }
    agent.shutdown_and_wait().await;
    let _ = rv.shutdown_and_wait().await;
    let _ = std::fs::remove_dir_all(dir);
    let (on, off) = (median_gbps(bytes, metered), median_gbps(bytes, operator));
    println!(
        "| DoPut ingest with a producer credential (metered, capped), {} MB, median of {turns} | {on:.2} GB/s | {off:.2} GB/s (operator token, same agent, turns alternating) | {:.3}× |",
        bytes >> 20,
        on / off
    );
    accounting_cost(&schema, &batches, bytes, off, turns)
}

/// What the cache's accounting costs, which both arms above pay: each
/// batch decoded from its Flight message as the agent decodes it, then
/// charged what it holds (`cache::charge`: its buffers' memory, the body it
/// slices, copied if padded) against what the accounting did before (its
/// values' bytes only), timed over every batch of the ingest, medians of
/// `turns`; the difference as a share of the ingest's own time.
fn accounting_cost(
    schema: &arrow::datatypes::Schema,
    batches: &[arrow::array::RecordBatch],
    bytes: usize,
    ingest_gbps: f64,
    turns: usize,
) -> anyhow::Result<()> {
    let messages = encode(schema, batches, &DataPath::data("accounting", Split::Train));
    let decoded = arrow_flight::utils::flight_data_to_batches(&messages)?;
    let (mut now, mut before) = (Vec::new(), Vec::new());
    for _ in 0..turns {
        let started = Instant::now();
        for b in &decoded {
            std::hint::black_box(kindling_agent::cache::charge(std::hint::black_box(b.clone())));
        }
        now.push(started.elapsed());
        let started = Instant::now();
        for b in &decoded {
            std::hint::black_box(kindling_schemas::schema::batch_bytes(std::hint::black_box(b)));
        }
        before.push(started.elapsed());
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (now, before) = (median(now), median(before));
    let ingest = Duration::from_secs_f64(bytes as f64 / (ingest_gbps * 1e9));
    let added = now.saturating_sub(before);
    println!(
        "| the cache's accounting over the {} batches (what each holds) | {now:?} | {before:?} (values' bytes only, as before) | +{:.3} % of the ingest's {ingest:?} |",
        decoded.len(),
        100.0 * added.as_secs_f64() / ingest.as_secs_f64()
    );
    Ok(())
}

/// `bytes` over the median of `turns`, in GB/s.
fn median_gbps(bytes: usize, mut turns: Vec<Duration>) -> f64 {
    turns.sort();
    bytes as f64 / turns[turns.len() / 2].as_secs_f64() / 1e9
}

/// What `/metrics` costs ingest: the same `DoPut`s into one agent, in turns,
/// with a scraper reading the agent's `/metrics` 20 times a second (a
/// Prometheus scrapes every 15–30 s) and without; medians of 3 turns each.
async fn metrics_cost(total_mb: usize) -> anyhow::Result<()> {
    let (schema, batches) = ingest_batches(total_mb);
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    let token = Token::new("bench");
    let (rv, agent, dir) = ingest_agent(&token, 16 << 30).await?;
    let addr = agent.url().trim_start_matches("http://").to_owned();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut scrapes = 0;
    for turn in 0..6 {
        let job = format!("metrics-{turn}");
        start_ingest_job(&rv, agent.url(), &token, &job, 1).await?;
        let messages = encode(&schema, &batches, &DataPath::data(&job, Split::Train));
        let stop = CancellationToken::new();
        let reader = (turn % 2 == 0).then(|| {
            scraper(
                vec![(addr.clone(), "/metrics")],
                token.expose().to_owned(),
                stop.clone(),
            )
        });
        let took = put_all(agent.url(), Some(token.expose()), messages).await?;
        stop.cancel();
        match reader {
            Some(s) => {
                scrapes += s.await??;
                with.push(took);
            }
            None => without.push(took),
        }
    }
    agent.shutdown_and_wait().await;
    let _ = rv.shutdown_and_wait().await;
    let _ = std::fs::remove_dir_all(dir);
    let (on, off) = (median_gbps(bytes, with), median_gbps(bytes, without));
    println!(
        "| DoPut ingest while /metrics is scraped 20×/s ({scrapes} scrapes), {} MB | {on:.2} GB/s | {off:.2} GB/s (not scraped, same agent, turns alternating) | {:.3}× |",
        bytes >> 20,
        on / off
    );
    Ok(())
}

/// Reads every `(addr, path)` of `targets` 20 times a second with `token`
/// until `stop`; returns how many reads it made.
fn scraper(
    targets: Vec<(String, &'static str)>,
    token: String,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<anyhow::Result<u64>> {
    tokio::spawn(async move {
        let mut n = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        while !stop.is_cancelled() {
            tick.tick().await;
            for (addr, path) in &targets {
                let mut s = TcpStream::connect(addr).await?;
                s.write_all(
                    format!("GET {path} HTTP/1.1\r\nauthorization: Bearer {token}\r\n\r\n").as_bytes(),
                )
                .await?;
                let mut page = Vec::new();
                s.read_to_end(&mut page).await?;
                anyhow::ensure!(page.starts_with(b"HTTP/1.1 200"), "read of {path} refused");
                n += 1;
            }
        }
        anyhow::Ok(n)
    })
}

/// What watching costs training: the same job trained on one agent, in
/// turns, while the agent's `/metrics` and the rendezvous' `/api/status`
/// (the status page's data) are each read 20 times a second, and while
/// nothing reads them; samples/s is the mean of the job's epochs, medians
/// of 3 turns each.
async fn train_metrics_cost(train_mb: usize) -> anyhow::Result<()> {
    let (schema, batches) = ingest_batches(train_mb);
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let token = Token::new("bench");
    let (rv, agent, dir) = ingest_agent(&token, 16 << 30).await?;
    let agent_addr = agent.url().trim_start_matches("http://").to_owned();
    let rv_addr = rv.url().trim_start_matches("http://").to_owned();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut reads = 0;
    for turn in 0..6 {
        let job = format!("train-{turn}");
        start_ingest_job(&rv, agent.url(), &token, &job, 3).await?;
        let stop = CancellationToken::new();
        let reader = (turn % 2 == 0).then(|| {
            let targets = vec![(agent_addr.clone(), "/metrics"), (rv_addr.clone(), "/api/status")];
            scraper(targets, token.expose().to_owned(), stop.clone())
        });
        let trained = train_turn((agent.url(), &token), &job, (&schema, &batches), token.expose()).await;
        stop.cancel();
        let status = trained?;
        let rate =
            status.history.iter().map(|h| h.samples_per_sec).sum::<f64>() / status.history.len() as f64;
        match reader {
            Some(r) => {
                reads += r.await??;
                with.push(rate);
            }
            None => without.push(rate),
        }
    }
    agent.shutdown_and_wait().await;
    let _ = rv.shutdown_and_wait().await;
    let _ = std::fs::remove_dir_all(dir);
    let (on, off) = (median(with), median(without));
    println!(
        "| training ({rows} rows, MLP, 1 agent) while /metrics and /api/status are each read 20×/s ({reads} reads) | {on:.0} samples/s | {off:.0} samples/s (not read, same agent, turns alternating) | {:.3}× |",
        on / off
    );
    Ok(())
}

/// One training turn of a started `job` on `agent`: puts `batches` with
/// `put_token` (the operator's or a job credential), ends the split and
/// waits for the job; returns its status, refusing a job that did not
/// succeed.
async fn train_turn(
    (agent, token): (&str, &Token),
    job: &str,
    (schema, batches): (&arrow::datatypes::SchemaRef, &[arrow::array::RecordBatch]),
    put_token: &str,
) -> anyhow::Result<kindling_schemas::action::AgentJobStatus> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    put_all(
        agent,
        Some(put_token),
        encode(schema, batches, &DataPath::data(job, Split::Train)),
    )
    .await?;
    let end = Action::EndOfData(kindling_schemas::action::EndOfData {
        job_id: job.into(),
        split: Split::Train,
        expected_rows: Some(rows as u64),
    });
    kindling_agent_action(agent, token, end).await?;
    let status = loop {
        let ask = Action::JobStatus(kindling_schemas::action::JobRef { job_id: job.into() });
        let body = kindling_agent_action(agent, token, ask).await?;
        let status: kindling_schemas::action::AgentJobStatus = serde_json::from_slice(&body)?;
        if status.state.is_terminal() {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    anyhow::ensure!(
        status.state == kindling_schemas::action::AgentJobState::Succeeded,
        "job {job}: {:?} {:?}",
        status.state,
        status.error
    );
    Ok(status)
}

/// Seconds epochs 2 and 3 of a finished job took.
fn later_epochs_secs(status: &kindling_schemas::action::AgentJobStatus) -> f64 {
    status.history[1..].iter().filter_map(|h| h.wall_secs).sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What checkpoints inside an epoch cost: one agent trains `train_mb` MB
/// of rows for 3 epochs with a checkpoint every `every_steps` steps (epochs
/// 2 and 3 take them) against the same job with none inside an epoch,
/// turns alternating; reported per checkpoint and as a share of training
/// at that interval and at the default's ten minutes.
async fn checkpoint_cost(train_mb: usize, every_steps: u64) -> anyhow::Result<()> {
    let (schema, batches) = ingest_batches(train_mb);
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let token = Token::new("bench");
    let (rv, agent, dir) = ingest_agent(&token, 16 << 30).await?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut taken = 0;
    for turn in 0..6 {
        let inside = turn % 2 == 0;
        let policy = CheckpointPolicy {
            every_steps: if inside { every_steps } else { 0 },
            every_secs: 0,
            ..Default::default()
        };
        let job = format!("ckpt-{turn}");
        start_ingest_job_with(&rv, agent.url(), &token, &job, 3, policy).await?;
        let on = (agent.url(), &token);
        let status = train_turn(on, &job, (&schema, &batches), token.expose()).await?;
        if inside {
            taken = 2 * (status.steps_per_epoch.saturating_sub(1) / every_steps);
            with.push(later_epochs_secs(&status));
        } else {
            without.push(later_epochs_secs(&status));
        }
    }
    agent.shutdown_and_wait().await;
    let _ = rv.shutdown_and_wait().await;
    let _ = std::fs::remove_dir_all(dir);
    let (on, off) = (median(with), median(without));
    let each = (on - off).max(0.0) / taken.max(1) as f64;
    println!(
        "| epochs 2-3 ({rows} rows each, MLP, 1 agent) with a checkpoint every {every_steps} steps ({taken} checkpoints) | {on:.3} s | {off:.3} s (none inside an epoch, same agent, turns alternating) | {:.3}× |",
        on / off
    );
    println!(
        "| one checkpoint inside an epoch | {:.2} ms | — | {:.4} % of training at the default's 600 s |",
        each * 1e3,
        each / CheckpointPolicy::EVERY_SECS as f64 * 100.0
    );
    Ok(())
}

/// What the caps cost a training step: one agent with a credential key
/// trains rows a producer credential put (metered and capped) against the
/// same rows the operator token put, 3 epochs each, turns alternating;
/// epochs 2 and 3 (the cached rows, no ingest) compared.
async fn caps_step_cost(train_mb: usize, turns: usize) -> anyhow::Result<()> {
    let (schema, batches) = ingest_batches(train_mb);
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let token = Token::new("bench");
    let (rv, agent, dir) = agent_with(&token, 16 << 30, true).await?;
    let (mut metered, mut operator) = (Vec::new(), Vec::new());
    for turn in 0..2 * turns {
        let job = format!("caps-step-{turn}");
        start_ingest_job(&rv, agent.url(), &token, &job, 3).await?;
        let on = (agent.url(), &token);
        if turn % 2 == 0 {
            let credential = producer_credential(agent.url(), &token, &job).await?;
            let status = train_turn(on, &job, (&schema, &batches), &credential).await?;
            metered.push(later_epochs_secs(&status));
        } else {
            let status = train_turn(on, &job, (&schema, &batches), token.expose()).await?;
            operator.push(later_epochs_secs(&status));
        }
    }
    agent.shutdown_and_wait().await;
    let _ = rv.shutdown_and_wait().await;
    let _ = std::fs::remove_dir_all(dir);
    let (capped, open) = (median(metered), median(operator));
    println!(
        "| training steps (epochs 2-3, {rows} rows, MLP, 1 agent) on rows a producer credential put (metered, capped) | {capped:.3} s | {open:.3} s (the operator token's rows, same agent, turns alternating) | {:.3}× |",
        open / capped
    );
    Ok(())
}

async fn kindling_agent_action(url: &str, token: &Token, action: Action) -> anyhow::Result<Vec<u8>> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())?
        .connect()
        .await?;
    let header = token.header_value();
    let mut client = FlightServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
        r.metadata_mut()
            .insert("authorization", header.parse().expect("ascii"));
        Ok(r)
    });
    let mut results = client.do_action(action.to_flight()).await?.into_inner();
    let mut body = Vec::new();
    while let Some(r) = results.next().await {
        body = r?.body.to_vec();
    }
    Ok(body)
}

fn tempfile_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("kindling-bench-{}", std::process::id()))
}

const PYARROW_SERVER: &str = r#"
import pyarrow.flight as fl
class Server(fl.FlightServerBase):
    def __init__(self):
        super().__init__("grpc://127.0.0.1:0")
        self.batches = []
    def do_put(self, context, descriptor, reader, writer):
        for chunk in reader:
            self.batches.append(chunk.data)
            writer.write(chunk.app_metadata or b"{}")
s = Server()
print(s.port, flush=True)
s.serve()
"#;
