//! Local mode: the rendezvous and a set of agents inside this process on
//! 127.0.0.1, speaking the same protocols as a cluster.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use kindling_agent::{AgentConfig, AgentError, AgentHandle};
use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig, RendezvousError, ServerConfig};
use kindling_schemas::auth::Token;

/// Settings of a local cluster.
#[derive(Clone, Debug)]
pub struct LocalClusterConfig {
    /// Token for every service (a random one by default).
    pub token: Option<Token>,
    /// Where agents spill and checkpoint.
    pub work_dir: PathBuf,
    /// Per-agent cache budget.
    pub memory_budget: u64,
    /// Agent lease at the rendezvous.
    pub lease: Duration,
    /// How long a join waits for the whole gang.
    pub gang_timeout: Duration,
    /// How long an agent's ring step waits for a peer.
    pub collective_timeout: Duration,
    /// Threads each agent's trainer computes on; 0 (the default) divides the
    /// machine's cores among the agents started together, at least one each,
    /// so local agents do not compete for the same cores.
    pub train_threads: usize,
    /// The models the agents can train (the built-ins by default).
    pub models: kindling_agent::ModelRegistry,
    /// Most unfinished jobs each agent holds at once.
    pub max_jobs: usize,
    /// TLS of the rendezvous and the agents (their certificate, the CA of
    /// their peers, client-certificate verification); `None`: plaintext on
    /// loopback.
    pub tls: Option<kindling_schemas::tls::Tls>,
    /// How long each agent keeps a finished job's status, rows, spill files
    /// and checkpoints.
    pub finished_retention: Duration,
    /// The agents' job-credential key (a random one by default): executor
    /// push then hands the executors a producer credential, not the token.
    pub credentials: Option<kindling_schemas::credential::CredentialKeys>,
    /// What a job's `DoPut` streams may stage before they commit, and for how long.
    pub staging: kindling_agent::cache::StagingLimits,
    /// A token that reads the rendezvous' status page and every `/metrics`
    /// and nothing else (a random one by default: the status page's link
    /// carries it, and a page's address takes no operator token); `None`:
    /// only the operator token reads them, in the `authorization` header.
    pub viewer_token: Option<Token>,
    /// Where the rendezvous listens — its gRPC, status page and `/metrics`
    /// (`None`: a free port on 127.0.0.1). Without TLS it must be a loopback
    /// address: the page's token would otherwise cross the network in the clear.
    pub rendezvous_addr: Option<std::net::SocketAddr>,
    /// A rendezvous running elsewhere — its URL, or its replicas' URLs
    /// comma-separated — that the agents register with instead of one
    /// started in-process (`None`, the default).
    pub external_rendezvous: Option<String>,
}

impl LocalClusterConfig {
    /// Defaults working in `work_dir`.
    ///
    /// ```
    /// let c = kindling::local::LocalClusterConfig::new("/var/tmp/kindling-local");
    /// assert!(c.token.is_some());
    /// ```
    pub fn new(work_dir: impl Into<PathBuf>) -> Self {
        LocalClusterConfig {
            token: Some(Token::new(uuid::Uuid::new_v4().simple().to_string())),
            work_dir: work_dir.into(),
            memory_budget: 1 << 30,
            lease: Duration::from_secs(3),
            gang_timeout: Duration::from_secs(60),
            collective_timeout: Duration::from_secs(60),
            train_threads: 0,
            models: kindling_agent::ModelRegistry::builtin(),
            max_jobs: kindling_agent::process::server::DEFAULT_MAX_JOBS,
            tls: None,
            finished_retention: kindling_agent::process::server::DEFAULT_FINISHED_RETENTION,
            staging: kindling_agent::cache::StagingLimits::default(),
            credentials: Some(kindling_schemas::credential::CredentialKey::generate().into()),
            viewer_token: Some(Token::new(uuid::Uuid::new_v4().simple().to_string())),
            rendezvous_addr: None,
            external_rendezvous: None,
        }
    }
}

/// An in-process rendezvous plus agents. Shareable: every method takes
/// `&self`, so a test can kill an agent while a job trains on the cluster.
#[derive(Debug)]
pub struct LocalCluster {
    config: LocalClusterConfig,
    rendezvous: Mutex<Option<EmbeddedRendezvous>>,
    rendezvous_url: String,
    agents: Mutex<Vec<Option<AgentHandle>>>,
}

/// Local mode failed to start.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The rendezvous did not start.
    #[error("local rendezvous: {0}")]
    Rendezvous(#[from] RendezvousError),
    /// An agent did not start.
    #[error("local agent: {0}")]
    Agent(#[from] AgentError),
    /// The rendezvous was asked to listen off loopback without TLS.
    #[error(
        "local rendezvous address {0} is not a loopback address: without TLS the status page's \
         token would cross the network in the clear; use 127.0.0.1:<port> (and an SSH tunnel)"
    )]
    NotLoopback(std::net::SocketAddr),
}

impl LocalCluster {
    /// Starts the rendezvous and `agents` agents.
    pub async fn start(agents: usize, mut config: LocalClusterConfig) -> Result<Self, LocalError> {
        if config.train_threads == 0 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            config.train_threads = (cores / agents.max(1)).max(1);
        }
        let rv_config = RendezvousConfig {
            lease: config.lease,
            gang_timeout: config.gang_timeout,
            // Ended jobs leave the rendezvous when they leave the agents.
            retention: config.finished_retention,
            ..RendezvousConfig::default()
        };
        if let Some(url) = config.external_rendezvous.clone() {
            let cluster = LocalCluster {
                config,
                rendezvous_url: url,
                rendezvous: Mutex::new(None),
                agents: Mutex::new(Vec::new()),
            };
            for _ in 0..agents {
                cluster.add_agent().await?;
            }
            return Ok(cluster);
        }
        let addr = config
            .rendezvous_addr
            .unwrap_or((std::net::Ipv4Addr::LOCALHOST, 0).into());
        if !addr.ip().is_loopback() && config.tls.is_none() {
            return Err(LocalError::NotLoopback(addr));
        }
        let rendezvous = EmbeddedRendezvous::start_on(
            addr,
            ServerConfig {
                tls: config.tls.clone(),
                viewer_token: config.viewer_token.clone(),
                ..ServerConfig::new(rv_config, config.token.clone())
            },
        )
        .await?;
        let cluster = LocalCluster {
            config,
            rendezvous_url: rendezvous.url(),
            rendezvous: Mutex::new(Some(rendezvous)),
            agents: Mutex::new(Vec::new()),
        };
        for _ in 0..agents {
            cluster.add_agent().await?;
        }
        Ok(cluster)
    }

    fn agents_lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<AgentHandle>>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rendezvous URL.
    pub fn rendezvous_url(&self) -> String {
        self.rendezvous_url.clone()
    }

    /// The shared token.
    pub fn token(&self) -> Option<&Token> {
        self.config.token.as_ref()
    }

    /// Writes the status page's link with the viewer token to
    /// `status-page.url` in the work directory, readable by its owner only,
    /// and returns that file: the token never goes to the terminal or a log.
    /// `None` for a cluster without a viewer token (a page's address takes
    /// no operator token: the browser's history would keep it).
    pub fn status_page_link(&self) -> std::io::Result<Option<PathBuf>> {
        let Some(token) = self.config.viewer_token.as_ref() else {
            return Ok(None);
        };
        let path = self.config.work_dir.join("status-page.url");
        std::fs::create_dir_all(&self.config.work_dir)?;
        // A stale link (a file we may not own) is replaced, not written through.
        let _ = std::fs::remove_file(&path);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path)?;
        std::io::Write::write_all(
            &mut file,
            format!("{}/?token={}\n", self.rendezvous_url, token.expose()).as_bytes(),
        )?;
        Ok(Some(path))
    }

    /// Channel settings that reach this cluster (its TLS, if it has any:
    /// the agents' own certificate then serves as a client certificate).
    pub fn channel(&self) -> kindling_schemas::channel::ChannelConfig {
        kindling_schemas::channel::ChannelConfig::default().with_tls(self.config.tls.clone())
    }

    /// Starts one more agent; returns its index.
    pub async fn add_agent(&self) -> Result<usize, LocalError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let mut c = AgentConfig::local(format!("local-agent-{}", &id[..8]), self.config.work_dir.clone());
        c.token = self.config.token.clone();
        c.viewer_token = self.config.viewer_token.clone();
        c.rendezvous = Some(self.rendezvous_url());
        c.memory_budget = self.config.memory_budget;
        c.collective_timeout = self.config.collective_timeout;
        c.train_threads = self.config.train_threads;
        c.max_jobs = self.config.max_jobs;
        c.finished_retention = self.config.finished_retention;
        c.credentials = self.config.credentials.clone();
        c.staging = self.config.staging;
        c.models = self.config.models.clone();
        c.channel = c.channel.with_tls(self.config.tls.clone());
        let handle = kindling_agent::start(c).await?;
        let mut agents = self.agents_lock();
        agents.push(Some(handle));
        Ok(agents.len() - 1)
    }

    /// Flight URL of agent `index`, if it is running.
    pub fn agent_url(&self, index: usize) -> Option<String> {
        self.agents_lock()
            .get(index)
            .and_then(Option::as_ref)
            .map(|a| a.url().to_owned())
    }

    /// Index of the running agent serving `url`.
    pub fn index_of(&self, url: &str) -> Option<usize> {
        self.agents_lock()
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.url() == url))
    }

    /// Flight URLs of the running agents.
    pub fn agent_urls(&self) -> Vec<String> {
        self.agents_lock()
            .iter()
            .flatten()
            .map(|a| a.url().to_owned())
            .collect()
    }

    /// **Test hook** (feature `test-hooks`): kills agent `index` as a crash
    /// would (no goodbye to the rendezvous).
    #[cfg(feature = "test-hooks")]
    pub fn kill_agent(&self, index: usize) {
        let killed = self.agents_lock().get_mut(index).and_then(Option::take);
        if let Some(a) = killed {
            a.kill();
        }
    }

    /// Stops every agent and the rendezvous.
    pub async fn shutdown(self) {
        let agents: Vec<AgentHandle> = self.agents_lock().drain(..).flatten().collect();
        for a in agents {
            a.shutdown_and_wait().await;
        }
        let rv = self.rendezvous.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(r) = rv {
            let _ = r.shutdown_and_wait().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_status_page_link_is_written_for_its_owner_only() {
        let dir = tempfile::tempdir().expect("dir");
        let cluster = LocalCluster::start(0, LocalClusterConfig::new(dir.path()))
            .await
            .expect("start");
        let operator = cluster.token().expect("a token").expose().to_owned();
        let viewer = cluster
            .config
            .viewer_token
            .as_ref()
            .expect("a viewer token")
            .expose()
            .to_owned();
        assert_ne!(viewer, operator);
        let path = cluster.status_page_link().expect("written").expect("a link");
        let link = std::fs::read_to_string(&path).expect("read");
        // The viewer token: a page's address takes no operator token.
        assert_eq!(
            link.trim(),
            format!("{}/?token={viewer}", cluster.rendezvous_url())
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }
        // Written again, it replaces the file.
        assert_eq!(cluster.status_page_link().expect("again"), Some(path));
        cluster.shutdown().await;
    }
}
