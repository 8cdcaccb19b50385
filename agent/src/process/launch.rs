//! The agent process: its command line and `main` ([`run`]), so a crate
//! with models of its own builds its own agent binary in one line.
//! Flight ingest + collective on one port, probes on another; SIGTERM leaves
//! the cluster cleanly (running attempts reported failed, then deregistered).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use kindling_schemas::channel::ChannelConfig;
use tokio_util::sync::CancellationToken;

use crate::models::kindling_model::ModelRegistry;
use crate::process::server::AgentConfig;
use kindling_ops::cli::{TlsArgs, TokenArgs};
use kindling_ops::web::probes::{HealthServer, Readiness};

/// Kindling training agent: receives Arrow shards over Flight and trains with
/// its gang (ring all-reduce), ganged by the rendezvous.
#[derive(Debug, Parser)]
#[command(name = "kindling-agent", version, long_version = LONG_VERSION)]
struct Cli {
    /// Print the GPU adapter `use_gpu` jobs would train on — its kernels
    /// (SPIR-V or WGSL), memory, tensor cores, subgroups, bf16 and f16 — and
    /// exit (status 1, with the reason, when the agent was built without a GPU
    /// feature or has no adapter it can train on).
    #[arg(long)]
    check_gpu: bool,
    /// Unique agent id (default: the node name).
    #[arg(long, env = "KINDLING_AGENT_ID")]
    agent_id: Option<String>,
    /// Address the Flight + collective gRPC server listens on.
    #[arg(long, env = "KINDLING_LISTEN", default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Host peers and clients use to reach this agent, e.g. the pod IP
    /// (default: the listen IP, which is useless when it is 0.0.0.0).
    #[arg(long, env = "KINDLING_ADVERTISE_HOST")]
    advertise_host: Option<String>,
    /// Kubernetes node (or machine) name (default: the hostname).
    #[arg(long, env = "KINDLING_NODE_NAME")]
    node_name: Option<String>,
    /// Job slots this agent advertises to the rendezvous (informational:
    /// `--max-jobs` is what the agent enforces).
    #[arg(long, env = "KINDLING_CAPACITY", default_value_t = 1)]
    capacity: u32,
    /// Most jobs this agent holds at once (not finished); a start past it is
    /// refused with RESOURCE_EXHAUSTED naming this cap.
    #[arg(long, env = "KINDLING_MAX_JOBS", default_value_t = crate::process::server::DEFAULT_MAX_JOBS)]
    max_jobs: usize,
    /// Most model reads (DoGet, GetFlightInfo) in flight at once, all
    /// callers; a job credential's at most half: a read past it is refused
    /// with RESOURCE_EXHAUSTED naming this cap. A read that stops reading
    /// is ended after --stream-idle-secs.
    #[arg(long, env = "KINDLING_MAX_READS", default_value_t = crate::process::reads::DEFAULT_MAX_READS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_reads: usize,
    /// Most parameters a job's model may have; a bigger one fails its job
    /// with RESOURCE_EXHAUSTED naming this cap, before any weight is allocated.
    #[arg(long, env = "KINDLING_MAX_MODEL_PARAMS", default_value_t = crate::models::kindling_model::DEFAULT_MAX_PARAMS)]
    max_model_params: usize,
    /// How long a finished or cancelled job keeps its status, rows, spill
    /// files and checkpoints on this agent before they are removed (s).
    #[arg(long, env = "KINDLING_FINISHED_RETENTION_SECS", default_value_t = 3600)]
    finished_retention_secs: u64,
    /// File with the cluster's job-credential keys, one per line (32+ bytes
    /// each, e.g. `openssl rand -hex 32`): the first signs, every line is
    /// accepted, and the file is re-read when it changes, so a key rotates
    /// without a restart (prepend the new key; after the longest credential
    /// lifetime, drop the old line). The agent issues and takes signed,
    /// expiring job credentials (producer, peer, reader). Not the operator
    /// token: rotating the token leaves running jobs' credentials valid.
    #[arg(long, env = "KINDLING_CREDENTIAL_KEY_FILE")]
    credential_key_file: Option<PathBuf>,
    /// Rendezvous URL, e.g. http://kindling-rendezvous:7070 (required: an
    /// agent trains only in a gang the rendezvous forms).
    #[arg(long, env = "KINDLING_RENDEZVOUS")]
    rendezvous: Option<String>,
    #[command(flatten)]
    auth: TokenArgs,
    #[command(flatten)]
    tls: TlsArgs,
    /// Node-local directory for spill files and checkpoints.
    #[arg(long, env = "KINDLING_WORK_DIR", default_value = "/var/lib/kindling")]
    work_dir: PathBuf,
    /// Cached batches kept in memory before spilling, e.g. `4GiB`, `512MiB`, `1000000`.
    #[arg(long, env = "KINDLING_MEMORY_BUDGET", default_value = "1GiB", value_parser = parse_bytes)]
    memory_budget: u64,
    /// Most bytes one job's `DoPut` streams hold before they commit (in
    /// memory and spilled together; default 16GiB): a batch past it is
    /// refused. Staged bytes past half --memory-budget always spill.
    #[arg(long, env = "KINDLING_MAX_STAGED_BYTES", value_parser = parse_bytes)]
    max_staged_bytes: Option<u64>,
    /// Most bytes the streams of all job credentials together may pin while
    /// their messages are received (each open stream holds its largest
    /// message until it ends; one credential at most half; default half of
    /// --memory-budget, at least 128MiB): a message past it ends its stream.
    #[arg(long, env = "KINDLING_MAX_RECEIVING_BYTES", value_parser = parse_bytes)]
    max_receiving_bytes: Option<u64>,
    /// Most bytes one job's rows hold on this agent, committed and staged,
    /// in memory and spilled (default 32GiB): a batch past it is refused
    /// and its stream with it, so a producer cannot fill the work volume.
    #[arg(long, env = "KINDLING_MAX_JOB_BYTES", value_parser = parse_bytes)]
    max_job_bytes: Option<u64>,
    /// Most bytes all jobs' spill files hold in --work-dir together
    /// (default 40GiB; keep it below the work volume's size limit, leaving
    /// room for checkpoints): a batch that would spill past it is refused.
    #[arg(long, env = "KINDLING_DISK_WATERMARK", value_parser = parse_bytes)]
    disk_watermark: Option<u64>,
    /// Free space a spill leaves on --work-dir's file system at least
    /// (default 1GiB): a batch that would leave less is refused.
    #[arg(long, env = "KINDLING_MIN_FREE_DISK", value_parser = parse_bytes)]
    min_free_disk: Option<u64>,
    /// A `DoPut` stream that sends nothing (or reads no ack) for this long is
    /// ended and what it staged dropped; a `DoExchange` that sends nothing or
    /// reads no prediction, likewise (s).
    #[arg(long, env = "KINDLING_STREAM_IDLE_SECS", default_value_t = 300)]
    stream_idle_secs: u64,
    /// A `DoPut` or `DoExchange` stream open longer than this is ended likewise (s).
    #[arg(long, env = "KINDLING_STREAM_MAX_AGE_SECS", default_value_t = 6 * 3600)]
    stream_max_age_secs: u64,
    /// Threads the trainer computes on (0 = one per core). Leave cores for the
    /// Spark executors on the node: e.g. the CPU request of the agent's pod.
    #[arg(long, env = "KINDLING_TRAIN_THREADS", default_value_t = 0)]
    train_threads: usize,
    /// How long a collective step waits for a peer (ms).
    #[arg(long, env = "KINDLING_COLLECTIVE_TIMEOUT_MS", default_value_t = 60_000)]
    collective_timeout_ms: u64,
    /// A GPU job keeps its optimizer, its state and the master weights on
    /// the device: one agent reads back only its losses (on an H200 1.1–1.3×
    /// the host round trip at batch 4096: docs/benchmarks.md#gpu), a
    /// data-parallel rank only its gradient sums, bucket by bucket, for the
    /// all-reduce; `=false` keeps the step on the host.
    #[arg(long, env = "KINDLING_GPU_STEP_ON_DEVICE", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    gpu_step_on_device: bool,
    /// Gradient values per all-reduce bucket of a data-parallel GPU step kept
    /// on the device (whole parameters; a larger one is a bucket of its own):
    /// bucket k + 1 is read back while bucket k is on the ring.
    #[arg(long, env = "KINDLING_GPU_BUCKET_VALUES", default_value_t = crate::training::gradients::DEVICE_BUCKET_VALUES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    gpu_bucket_values: usize,
    /// Device memory a GPU job keeps its rows' inputs in (each cached batch
    /// whole): the epochs after the first gather their batches there
    /// instead of uploading them (`8GiB`, `512MiB`, bytes; `0` uploads every
    /// batch every epoch); a quarter of the adapter's memory when unset
    /// (`--check-gpu` prints it). Agent processes sharing a GPU each keep up
    /// to this much.
    #[arg(long, env = "KINDLING_GPU_KEPT_BYTES", value_parser = parse_bytes)]
    gpu_kept_bytes: Option<u64>,
    /// How long calls to the rendezvous ride out its outage (a restart) —
    /// retrying with jittered backoff — before a job gives up on it (s).
    #[arg(long, env = "KINDLING_RENDEZVOUS_OUTAGE_SECS", default_value_t = 60)]
    rendezvous_outage_secs: u64,
    /// HTTP/2 keepalive on every connection to and from this agent (ms): a
    /// PING this often, and a peer that leaves one unanswered this long is
    /// dropped (a silent peer is found within twice this).
    #[arg(long, env = "KINDLING_KEEPALIVE_MS", default_value_t = 10_000)]
    keepalive_ms: u64,
    /// Deadline of calls to the rendezvous that should answer at once (ms).
    #[arg(long, env = "KINDLING_CALL_TIMEOUT_MS", default_value_t = 30_000)]
    call_timeout_ms: u64,
    /// Largest incoming gRPC message, e.g. `64MiB`.
    #[arg(long, env = "KINDLING_MAX_MESSAGE_BYTES", default_value = "64MiB", value_parser = parse_bytes)]
    max_message_bytes: u64,
    /// Address of the `/healthz` and `/readyz` HTTP probes.
    #[arg(long, env = "KINDLING_HEALTH_LISTEN", default_value = "0.0.0.0:8080")]
    health_listen: SocketAddr,
    /// Log filter (`info`, `debug`, `kindling_agent=debug,info`, …); RUST_LOG wins when set.
    #[arg(long, env = "KINDLING_LOG", default_value = "info")]
    log_level: String,
    #[command(flatten)]
    log: kindling_ops::cli::LogArgs,
}

const LONG_VERSION: &str = if crate::models::backend::GPU_COMPILED {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (GPU backend: burn's wgpu runtime, SPIR-V on Vulkan; `gpu` feature)"
    )
} else {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (CPU only: built without the `gpu` feature)"
    )
};

/// `--check-gpu`: the adapter and what it can do, or why there is none.
fn check_gpu() -> anyhow::Result<()> {
    match crate::models::backend::gpu() {
        Ok((_, info)) => {
            println!("{}", info.report());
            Ok(())
        }
        Err(e) => bail!("no GPU for `use_gpu` jobs: {e}"),
    }
}

/// A size flag's value that is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum SizeError {
    #[error("`{0}` is not a size: expected e.g. 4GiB, 512MiB or a byte count")]
    NotASize(String),
    #[error("unknown size unit `{unit}` in `{input}`: expected B, KB, KiB, MB, MiB, GB, GiB, TB or TiB")]
    UnknownUnit { unit: String, input: String },
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// `4GiB`, `512MiB`, `64KiB`, `2GB`, `1000` → bytes.
fn parse_bytes(s: &str) -> Result<u64, SizeError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| SizeError::NotASize(s.to_owned()))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "ki" | "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mi" | "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gi" | "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "ti" | "tib" => 1 << 40,
        other => {
            return Err(SizeError::UnknownUnit {
                unit: other.to_owned(),
                input: s.to_owned(),
            });
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| SizeError::TooLarge(s.to_owned()))
}

fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

impl TryFrom<&Cli> for AgentConfig {
    type Error = anyhow::Error;

    fn try_from(cli: &Cli) -> anyhow::Result<Self> {
        let token = cli.auth.read()?;
        let viewer_token = cli.auth.read_viewer(token.as_ref())?;
        let node_name = cli
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(hostname)
            .context("no node name: set KINDLING_NODE_NAME (spec.nodeName in Kubernetes)")?;
        let agent_id = cli
            .agent_id
            .clone()
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| node_name.clone());
        if cli.max_jobs == 0 {
            bail!("--max-jobs must be at least 1");
        }
        if cli.capacity == 0 {
            bail!("--capacity must be at least 1");
        }
        let rendezvous = cli.rendezvous.clone().filter(|r| !r.is_empty()).context(
            "no rendezvous: set --rendezvous (KINDLING_RENDEZVOUS), e.g. http://kindling-rendezvous:7070; \
             an agent trains only in a gang the rendezvous forms",
        )?;
        if cli.listen.ip().is_unspecified() && cli.advertise_host.is_none() {
            bail!(
                "listening on {} needs --advertise-host (KINDLING_ADVERTISE_HOST, the pod IP) \
                 so peers can reach this agent",
                cli.listen
            );
        }
        if !(rendezvous.starts_with("http://") || rendezvous.starts_with("https://")) {
            bail!("--rendezvous must be an http:// or https:// URL, got `{rendezvous}`");
        }
        let tls = cli.tls.load()?;
        cli.tls
            .check_plaintext(cli.listen, token.is_some(), tls.as_ref())?;
        let credentials = cli
            .credential_key_file
            .as_deref()
            .map(kindling_schemas::credential::CredentialKeys::from_file)
            .transpose()?;
        let max_message_bytes =
            usize::try_from(cli.max_message_bytes).context("--max-message-bytes does not fit in memory")?;
        Ok(AgentConfig {
            agent_id,
            listen: cli.listen,
            advertise_host: cli.advertise_host.clone().filter(|h| !h.is_empty()),
            node_name,
            capacity: cli.capacity,
            token,
            viewer_token,
            rendezvous: Some(rendezvous),
            work_dir: cli.work_dir.clone(),
            memory_budget: cli.memory_budget,
            collective_timeout: Duration::from_millis(cli.collective_timeout_ms),
            gpu_step_on_device: cli.gpu_step_on_device,
            gpu_bucket_values: cli.gpu_bucket_values,
            gpu_kept_bytes: cli.gpu_kept_bytes,
            rendezvous_outage: Duration::from_secs(cli.rendezvous_outage_secs),
            channel: ChannelConfig::default()
                .with_keepalive(
                    Duration::from_millis(cli.keepalive_ms.max(1)),
                    Duration::from_millis(cli.keepalive_ms.max(1)),
                )
                .with_call_timeout(Duration::from_millis(cli.call_timeout_ms.max(1)))
                .with_tls(tls)
                .with_plaintext_token(cli.tls.allow_plaintext_token),
            max_message_bytes,
            max_jobs: cli.max_jobs,
            max_reads: cli.max_reads,
            finished_retention: Duration::from_secs(cli.finished_retention_secs),
            credentials,
            staging: crate::cache::StagingLimits {
                max_staged_bytes: cli.max_staged_bytes,
                stream_idle: Duration::from_secs(cli.stream_idle_secs.max(1)),
                stream_max_age: Duration::from_secs(cli.stream_max_age_secs.max(1)),
                max_receiving_bytes: cli.max_receiving_bytes,
                max_job_bytes: cli.max_job_bytes,
                disk_watermark: cli.disk_watermark,
                min_free_disk: cli.min_free_disk,
            },
            train_threads: cli.train_threads,
            models: ModelRegistry::builtin(),
        })
    }
}

/// Fires on SIGTERM (kubelet) or ctrl-c.
fn shutdown_on_signal() -> anyhow::Result<CancellationToken> {
    let token = CancellationToken::new();
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let fire = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("ctrl-c"),
            _ = term.recv() => tracing::info!("SIGTERM"),
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        fire.cancel();
    });
    Ok(token)
}

/// Runs an agent process with `models`: parses the command line (the
/// `kindling-agent` flags and `KINDLING_*` variables), serves until SIGTERM,
/// then leaves the cluster cleanly. A crate with models of its own builds its
/// agent binary with this:
///
/// ```no_run
/// use kindling_agent::ModelRegistry;
/// fn main() -> anyhow::Result<()> {
///     kindling_agent::run(ModelRegistry::builtin() /* .with::<MyNet>("my-net") */)
/// }
/// ```
pub fn run(models: ModelRegistry) -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.check_gpu {
        return check_gpu();
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(serve(cli, models))
}

async fn serve(cli: Cli, models: ModelRegistry) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log_level))
        .context("invalid --log-level")?;
    // Logs go to stderr; stdout stays free.
    kindling_ops::cli::init_logging(filter, cli.log.log_format);
    let config = AgentConfig {
        models: models.with_max_params(cli.max_model_params),
        ..AgentConfig::try_from(&cli)?
    };
    tracing::info!(models = ?config.models, "models this agent trains");
    if config.token.is_none() {
        tracing::warn!("authentication disabled (--allow-unauthenticated)");
    }
    let shutdown = shutdown_on_signal()?;

    // Probes come up first: liveness holds while the rendezvous is unreachable.
    let ready = Readiness::new();
    let health_listener = tokio::net::TcpListener::bind(cli.health_listen)
        .await
        .with_context(|| format!("binding the health listener {}", cli.health_listen))?;
    let health = HealthServer::start(health_listener, ready.clone(), CancellationToken::new())
        .context("starting the health server")?;
    tracing::info!(addr = %health.addr(), "health probes listening");

    // Registration is retried: in a fresh cluster agents often start before the rendezvous.
    let mut backoff = Duration::from_millis(250);
    let agent = loop {
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => {
                health.shutdown().await;
                return Ok(());
            }
            r = crate::process::server::start(config.clone()) => r,
        };
        match attempt {
            Ok(agent) => break agent,
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, retry_in = ?backoff, "not registered with the rendezvous yet");
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        health.shutdown().await;
                        return Ok(());
                    }
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e).context("starting the agent"),
        }
    };
    tracing::info!(agent = %agent.agent_id(), url = %agent.url(), "agent ready");
    if let Err(e) = ready_while_serving(&agent, &shutdown, &ready).await {
        health.shutdown().await;
        return Err(e);
    }
    tracing::info!("leaving: failing running attempts at the rendezvous, deregistering");
    let departure = agent
        .leave_and_shutdown("the agent process is shutting down")
        .await;
    tracing::info!(
        reported = ?departure.reported,
        unreported = ?departure.unreported,
        deregistered = departure.deregistered,
        "agent stopped"
    );
    health.shutdown().await;
    Ok(())
}

/// Keeps `/readyz` at 200 while the agent's gRPC server serves, until
/// `shutdown`; a server that stops on its own makes the process unready at
/// once and is an error (the process then exits, and Kubernetes restarts it).
pub async fn ready_while_serving(
    agent: &crate::process::server::AgentHandle,
    shutdown: &CancellationToken,
    ready: &Readiness,
) -> anyhow::Result<()> {
    let stopped = agent.server_stopped();
    ready.set(true);
    let outcome = tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        _ = stopped => Err(anyhow::anyhow!("the agent's gRPC server stopped serving")),
    };
    ready.set(false);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("lots"), Err(SizeError::NotASize("lots".into())));
        assert_eq!(
            parse_bytes("4XB"),
            Err(SizeError::UnknownUnit {
                unit: "xb".into(),
                input: "4XB".into()
            })
        );
        assert_eq!(
            parse_bytes("99999999TiB"),
            Err(SizeError::TooLarge("99999999TiB".into()))
        );
    }

    #[test]
    fn refuses_to_start_without_a_token() {
        let cli = Cli::parse_from([
            "kindling-agent",
            "--node-name",
            "n1",
            "--listen",
            "127.0.0.1:0",
            "--rendezvous=http://rv:7070",
        ]);
        let err = AgentConfig::try_from(&cli).expect_err("no token");
        assert!(err.to_string().contains("no token"), "{err}");
        let cli = Cli::parse_from([
            "kindling-agent",
            "--node-name",
            "n1",
            "--listen",
            "127.0.0.1:0",
            "--allow-unauthenticated",
            "--rendezvous=http://rv:7070",
        ]);
        let config = AgentConfig::try_from(&cli).expect("config");
        assert_eq!(config.agent_id, "n1", "the agent id defaults to the node name");
    }

    /// `--gpu-kept-bytes` takes a size; unset, the agent keeps a quarter of
    /// the adapter's memory (`None`).
    #[test]
    fn the_device_memory_kept_for_batches_is_a_size_or_the_adapters_quarter() {
        let agent = |more: &[&str]| {
            let base = [
                "kindling-agent",
                "--node-name=n1",
                "--listen=127.0.0.1:0",
                "--token=t",
                "--rendezvous=http://rv:7070",
            ];
            let cli = Cli::try_parse_from(base.iter().chain(more))?;
            Ok::<_, clap::Error>(AgentConfig::try_from(&cli).expect("config").gpu_kept_bytes)
        };
        assert_eq!(agent(&[]).expect("parses"), None);
        assert_eq!(agent(&["--gpu-kept-bytes=8GiB"]).expect("parses"), Some(8 << 30));
        assert_eq!(agent(&["--gpu-kept-bytes", "0"]).expect("parses"), Some(0));
        let err = agent(&["--gpu-kept-bytes=lots"]).expect_err("not a size");
        assert!(err.to_string().contains("--gpu-kept-bytes"), "{err}");
    }

    #[test]
    fn an_unspecified_listen_address_needs_an_advertised_host() {
        let cli = Cli::parse_from([
            "kindling-agent",
            "--node-name=n1",
            "--token=t",
            "--rendezvous=http://rv:7070",
        ]);
        let err = AgentConfig::try_from(&cli).expect_err("0.0.0.0 without advertise host");
        assert!(err.to_string().contains("--advertise-host"), "{err}");
    }

    #[test]
    fn an_agent_needs_a_rendezvous() {
        let cli = Cli::parse_from([
            "kindling-agent",
            "--node-name=n1",
            "--listen=127.0.0.1:0",
            "--token=t",
        ]);
        let err = AgentConfig::try_from(&cli).expect_err("no rendezvous");
        assert!(
            err.to_string().contains("no rendezvous: set --rendezvous"),
            "{err}"
        );
        let cli = Cli::parse_from([
            "kindling-agent",
            "--node-name=n1",
            "--listen=127.0.0.1:0",
            "--token=t",
            "--rendezvous=rv:7070",
        ]);
        let err = AgentConfig::try_from(&cli).expect_err("not a URL");
        assert!(err.to_string().contains("http://"), "{err}");
    }

    /// A gRPC server that dies on its own takes `/readyz` down with it.
    #[cfg(feature = "test-hooks")]
    #[tokio::test]
    async fn readyz_goes_unready_when_the_grpc_server_dies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent = crate::process::server::start(AgentConfig::local("a0", dir.path()))
            .await
            .expect("agent");
        let ready = Readiness::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let health = HealthServer::start(listener, ready.clone(), CancellationToken::new()).expect("health");
        let readyz = || async {
            let url = format!("http://{}/readyz", health.addr());
            let mut s = tokio::net::TcpStream::connect(health.addr())
                .await
                .expect("connect");
            tokio::io::AsyncWriteExt::write_all(&mut s, b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .expect("write");
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out)
                .await
                .expect("read");
            (url, out)
        };
        let shutdown = CancellationToken::new();
        let agent = std::sync::Arc::new(agent);
        let serving = {
            let (agent, shutdown, ready) = (agent.clone(), shutdown.clone(), ready.clone());
            tokio::spawn(async move { ready_while_serving(&agent, &shutdown, &ready).await })
        };
        // Ready once the watch is up (the flag is set before it waits).
        while !ready.is_ready() {
            tokio::task::yield_now().await;
        }
        assert!(readyz().await.1.starts_with("HTTP/1.1 200"));
        agent.abort_server();
        let err = serving
            .await
            .expect("task")
            .expect_err("a dead server is an error");
        assert!(err.to_string().contains("stopped serving"), "{err}");
        let (url, answer) = readyz().await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{url}: {answer}");
        health.shutdown().await;
    }
}
