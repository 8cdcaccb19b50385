//! A real `kindling-rendezvous` and real `kindling-agent` processes on
//! loopback, each on free ports, sharing a token: what fault tests SIGKILL.

use std::path::{Path, PathBuf};
use std::process::Command;

use kindling_schemas::auth::Token;

use crate::netns::{Proc, binary, free_ports};

/// The token every process of a [`ProcCluster`] takes.
pub const TOKEN: &str = "proc-cluster-token-0123456789";

/// A rendezvous and agents as processes (binaries from [`binary`]), logs and
/// work dirs under `dir`; every process is SIGKILLed when dropped.
#[derive(Debug)]
pub struct ProcCluster {
    /// `None` when the agents follow a rendezvous started elsewhere
    /// ([`ProcCluster::on`]: replicas).
    pub rendezvous: Option<Proc>,
    /// `None` once killed.
    pub agents: Vec<Option<Proc>>,
    /// `http://127.0.0.1:<port>` (comma-separated replicas for [`ProcCluster::on`]).
    pub rendezvous_url: String,
    /// `http://127.0.0.1:<port>` of each agent.
    pub agent_urls: Vec<String>,
    /// A file holding [`TOKEN`].
    pub token_file: PathBuf,
}

impl ProcCluster {
    /// Starts the rendezvous (agent lease `lease_ms`) and `n` agents; returns
    /// once every agent is ready (registered).
    pub async fn start(n: usize, dir: &Path, lease_ms: u64) -> ProcCluster {
        let token_file = dir.join("token");
        std::fs::write(&token_file, TOKEN).expect("token file");
        let [port, health] = free_ports("127.0.0.1", 2)[..] else {
            unreachable!("two ports")
        };
        let rendezvous_url = format!("http://127.0.0.1:{port}");
        let mut c = Command::new(binary("kindling-rendezvous", "KINDLING_RENDEZVOUS_BIN"));
        c.args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--health-listen", &format!("127.0.0.1:{health}")])
            .arg("--token-file")
            .arg(&token_file)
            .args(["--lease-ms", &lease_ms.to_string(), "--gang-timeout-ms", "30000"]);
        let mut rendezvous = Proc::spawn("rendezvous", c, format!("127.0.0.1:{health}"), dir);
        rendezvous.wait_ready().await;
        let mut cluster = ProcCluster {
            rendezvous: Some(rendezvous),
            agents: Vec::new(),
            rendezvous_url,
            agent_urls: Vec::new(),
            token_file,
        };
        for _ in 0..n {
            cluster.add_agent(dir).await;
        }
        cluster
    }

    /// `n` agents following the rendezvous at `urls` (replicas,
    /// comma-separated, taking [`TOKEN`]); returns once every agent is ready.
    pub async fn on(urls: &str, n: usize, dir: &Path) -> ProcCluster {
        let token_file = dir.join("token");
        std::fs::write(&token_file, TOKEN).expect("token file");
        let mut cluster = ProcCluster {
            rendezvous: None,
            agents: Vec::new(),
            rendezvous_url: urls.to_owned(),
            agent_urls: Vec::new(),
            token_file,
        };
        for _ in 0..n {
            cluster.add_agent(dir).await;
        }
        cluster
    }

    /// Starts one more agent (`agent-<i>`), ready when this returns.
    pub async fn add_agent(&mut self, dir: &Path) -> usize {
        let i = self.agents.len();
        let (agent, url) = self.spawn_agent(i, dir, format!("agent-{i}")).await;
        self.agents.push(Some(agent));
        self.agent_urls.push(url);
        i
    }

    /// Starts agent `i` again (killed before) with its id and work dir, as
    /// a DaemonSet restarts a pod's container on its node: on new ports,
    /// ready when this returns.
    pub async fn restart_agent(&mut self, i: usize, dir: &Path) {
        assert!(self.agents[i].is_none(), "agent-{i} still runs: kill it first");
        // Its log beside the killed process's.
        let (agent, url) = self.spawn_agent(i, dir, format!("agent-{i}-restarted")).await;
        self.agents[i] = Some(agent);
        self.agent_urls[i] = url;
    }

    async fn spawn_agent(&self, i: usize, dir: &Path, name: String) -> (Proc, String) {
        let [port, health] = free_ports("127.0.0.1", 2)[..] else {
            unreachable!("two ports")
        };
        let mut c = Command::new(binary("kindling-agent", "KINDLING_AGENT_BIN"));
        c.args(["--agent-id", &format!("agent-{i}")])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--advertise-host", "127.0.0.1"])
            .args(["--health-listen", &format!("127.0.0.1:{health}")])
            .args(["--rendezvous", &self.rendezvous_url])
            .arg("--token-file")
            .arg(&self.token_file)
            .arg("--work-dir")
            .arg(dir.join(format!("agent-{i}")))
            .args(["--collective-timeout-ms", "20000", "--log-level", "info"]);
        let mut agent = Proc::spawn(&name, c, format!("127.0.0.1:{health}"), dir);
        agent.wait_ready().await;
        (agent, format!("http://127.0.0.1:{port}"))
    }

    /// The cluster's token.
    pub fn token(&self) -> Token {
        Token::new(TOKEN)
    }

    /// SIGKILLs agent `i` (as a node's crash would).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut a) = self.agents[i].take() {
            a.sigkill();
        }
    }

    /// SIGSTOPs agent `i` (`frozen`) or SIGCONTs it.
    pub fn freeze_agent(&self, i: usize, frozen: bool) {
        if let Some(a) = &self.agents[i] {
            a.freeze(frozen);
        }
    }

    /// The index of the agent at `url`.
    pub fn index_of(&self, url: &str) -> Option<usize> {
        self.agent_urls.iter().position(|u| u == url)
    }

    /// Every process's log, headed by its name.
    pub fn logs(&self) -> String {
        self.rendezvous
            .iter()
            .chain(self.agents.iter().flatten())
            .map(|p| format!("--- {} ---\n{}", p.name, p.logs()))
            .collect()
    }
}
