//! `kindling-rendezvous`: the barrier rendezvous service as a process
//! (Kubernetes Deployment + Service). Same `serve` as the embedded mode.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kindling_ops::cli::{LogArgs, TlsArgs, TokenArgs};
use kindling_ops::web::probes::{HealthServer, Readiness};
use kindling_rendezvous::etcd::{EtcdSettings, EtcdTls};
use kindling_rendezvous::{RendezvousConfig, ServerConfig, serve_ready};
use tokio_util::sync::CancellationToken;

/// Gang start, barrier / all-gather and whole-group retry for Kindling agents.
#[derive(Debug, Parser)]
#[command(name = "kindling-rendezvous", version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, env = "KINDLING_RENDEZVOUS_LISTEN", default_value = "0.0.0.0:7070")]
    listen: SocketAddr,
    #[command(flatten)]
    auth: TokenArgs,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    log: LogArgs,
    /// Agent lease: heartbeats must arrive at least this often (ms).
    #[arg(long, env = "KINDLING_RENDEZVOUS_LEASE_MS", default_value_t = 10_000)]
    lease_ms: u64,
    /// Default time a join waits for the whole gang (ms).
    #[arg(long, env = "KINDLING_RENDEZVOUS_GANG_TIMEOUT_MS", default_value_t = 60_000)]
    gang_timeout_ms: u64,
    /// Default time an all-gather/barrier waits for every member (ms).
    #[arg(
        long,
        env = "KINDLING_RENDEZVOUS_BARRIER_TIMEOUT_MS",
        default_value_t = 300_000
    )]
    barrier_timeout_ms: u64,
    /// How long finished jobs stay queryable (s).
    #[arg(long, env = "KINDLING_RENDEZVOUS_RETENTION_SECS", default_value_t = 3_600)]
    retention_secs: u64,
    /// Largest all-gather payload per member (bytes).
    #[arg(long, env = "KINDLING_RENDEZVOUS_MAX_PAYLOAD_BYTES", default_value_t = 4 << 20)]
    max_payload_bytes: usize,
    /// Attempts of jobs created with max_attempts = 0.
    #[arg(long, env = "KINDLING_RENDEZVOUS_DEFAULT_MAX_ATTEMPTS", default_value_t = 3)]
    default_max_attempts: u32,
    /// Directory of the state file: jobs, attempts, failures, formed gangs and
    /// registrations survive a crash or restart (write-before-acknowledge;
    /// docs/rendezvous.md, "Restarts"). Unset: in memory only, and a restart
    /// loses every job.
    #[arg(long, env = "KINDLING_RENDEZVOUS_STATE_DIR", conflicts_with = "store")]
    state_dir: Option<std::path::PathBuf>,
    /// Replicas on etcd: `etcd://host:2379[,host:2379…][/prefix]` keeps the
    /// state in etcd (write-before-acknowledge, as the state file) and elects
    /// one leader among every replica started with the same store; the
    /// others answer UNAVAILABLE naming the leader, and take over within
    /// the lease once it is gone (docs/rendezvous.md, "Replicas on etcd").
    #[arg(long, env = "KINDLING_RENDEZVOUS_STORE")]
    store: Option<String>,
    /// The leader's etcd lease (whole seconds): a dead leader is replaced
    /// this long after its last renewal.
    #[arg(long, env = "KINDLING_RENDEZVOUS_ETCD_LEASE_SECS", default_value_t = 2)]
    etcd_lease_secs: u64,
    /// The URL clients reach this replica at, which the other replicas name
    /// when it leads (default: http[s]://<--listen>, unless that is 0.0.0.0).
    #[arg(long, env = "KINDLING_RENDEZVOUS_ADVERTISE")]
    advertise: Option<String>,
    /// CA (PEM) of etcd's member certificates: TLS to etcd.
    #[arg(long, env = "KINDLING_RENDEZVOUS_ETCD_CA", requires = "store")]
    etcd_ca: Option<std::path::PathBuf>,
    /// This replica's client certificate (PEM) for etcd's --client-cert-auth.
    #[arg(long, env = "KINDLING_RENDEZVOUS_ETCD_CERT", requires_all = ["etcd_ca", "etcd_key"])]
    etcd_cert: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "KINDLING_RENDEZVOUS_ETCD_KEY", requires = "etcd_cert")]
    etcd_key: Option<std::path::PathBuf>,
    /// Plaintext to an etcd off loopback (refused by default: whoever reaches
    /// it could rewrite the state), for a network private by other means.
    #[arg(long, env = "KINDLING_RENDEZVOUS_ALLOW_PLAINTEXT_ETCD")]
    allow_plaintext_etcd: bool,
    /// Address of the `/healthz` and `/readyz` HTTP probes (ready once serving).
    #[arg(
        long,
        env = "KINDLING_RENDEZVOUS_HEALTH_LISTEN",
        default_value = "0.0.0.0:8081"
    )]
    health_listen: SocketAddr,
}

impl TryFrom<&Cli> for ServerConfig {
    type Error = anyhow::Error;

    fn try_from(cli: &Cli) -> anyhow::Result<Self> {
        let token = cli.auth.read()?;
        let viewer_token = cli.auth.read_viewer(token.as_ref())?;
        let rendezvous = RendezvousConfig {
            lease: Duration::from_millis(cli.lease_ms),
            gang_timeout: Duration::from_millis(cli.gang_timeout_ms),
            barrier_timeout: Duration::from_millis(cli.barrier_timeout_ms),
            retention: Duration::from_secs(cli.retention_secs),
            max_payload_bytes: cli.max_payload_bytes,
            default_max_attempts: cli.default_max_attempts,
            ..RendezvousConfig::default()
        };
        rendezvous.validate().context("invalid rendezvous settings")?;
        let tls = cli.tls.load()?;
        cli.tls
            .check_plaintext(cli.listen, token.is_some(), tls.as_ref())?;
        let etcd = match &cli.store {
            None => None,
            Some(store) => {
                let advertise = match (&cli.advertise, cli.listen.ip().is_unspecified()) {
                    (Some(url), _) => url.clone(),
                    (None, false) => {
                        let scheme = if tls.is_some() { "https" } else { "http" };
                        format!("{scheme}://{}", cli.listen)
                    }
                    (None, true) => anyhow::bail!(
                        "--store {store}: replicas name the leader by its URL; set --advertise (listening on {} says nothing)",
                        cli.listen
                    ),
                };
                let lease = Duration::from_secs(cli.etcd_lease_secs);
                let mut settings = EtcdSettings::parse(store, lease, &advertise)?;
                if let Some(ca) = &cli.etcd_ca {
                    let read = |p: &std::path::Path| {
                        std::fs::read(p).with_context(|| format!("reading {}", p.display()))
                    };
                    let identity = match (&cli.etcd_cert, &cli.etcd_key) {
                        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
                        _ => None,
                    };
                    settings = settings.with_tls(EtcdTls {
                        ca: read(ca)?,
                        identity,
                    });
                }
                settings.check_plaintext(cli.allow_plaintext_etcd)?;
                Some(settings)
            }
        };
        Ok(ServerConfig {
            state_dir: cli.state_dir.clone(),
            etcd,
            tls,
            viewer_token,
            ..ServerConfig::new(rendezvous, token)
        })
    }
}

async fn shutdown_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await.context("waiting for ctrl-c")?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Logs go to stderr, like the agent's; stdout stays free.
    kindling_ops::cli::init_logging(filter, cli.log.log_format);
    let config = ServerConfig::try_from(&cli)?;
    match (&config.etcd, &config.state_dir) {
        (Some(etcd), _) => {
            tracing::info!(store = %etcd.place(), advertise = %etcd.advertise, "state in etcd; one leader among the replicas")
        }
        (None, Some(dir)) => tracing::info!(dir = %dir.display(), "state kept across restarts"),
        (None, None) => {
            tracing::warn!("no --state-dir: the state is in memory only, a restart loses every job")
        }
    }
    if config.token.is_none() {
        tracing::warn!("authentication disabled (--allow-unauthenticated)");
    }
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    tracing::info!(addr = %listener.local_addr()?, config = ?config.rendezvous, "rendezvous listening");

    let shutdown = CancellationToken::new();
    let ready = Readiness::new();
    let health_listener = tokio::net::TcpListener::bind(cli.health_listen)
        .await
        .with_context(|| format!("binding the health listener {}", cli.health_listen))?;
    let health = HealthServer::start(health_listener, ready.clone(), shutdown.child_token())
        .context("starting the health server")?;
    tracing::info!(addr = %health.addr(), "health probes listening");
    // Ready once the state is restored (`serve_ready`): connections queue on
    // the bound listener until then.
    let mut server = {
        let ready = ready.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { serve_ready(listener, config, shutdown, &ready).await })
    };
    // A server that stops on its own (a state dir another rendezvous holds,
    // a failed accept loop) ends the process with its error: never ready
    // while nothing serves.
    let ended = tokio::select! {
        r = shutdown_signal() => {
            r?;
            tracing::info!("shutting down: waking blocked calls and draining");
            shutdown.cancel();
            None
        }
        _ = shutdown.cancelled() => None,
        done = &mut server => Some(done),
    };
    ready.set(false);
    health.shutdown().await;
    let done = match ended {
        Some(done) => done,
        None => server.await,
    };
    done.context("the rendezvous task panicked")?
        .context("serving the rendezvous")?;
    tracing::info!("rendezvous stopped");
    Ok(())
}
