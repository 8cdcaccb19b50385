//! Nodes in network namespaces for tests: `deploy/local/netns.sh` nodes
//! ([`Nodes`]), real `kindling-rendezvous` / `kindling-agent` processes
//! ([`Proc`]) and a cluster of them with one agent per node, on its node's
//! IP and the same port on every node, as a DaemonSet ([`NodeCluster`]).
//!
//! Tests that use it call [`available`] first: without root or namespaces
//! it says `skipped: <reason>` on stderr and the test returns, except under
//! `CI=true`, where only "not root" is accepted.

use std::net::TcpListener as StdListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The agents' port: the same on every node, each on its own IP.
pub const AGENT_PORT: u16 = 50051;
/// The agents' probe port, on the node IP (reached over the bridge).
pub const HEALTH_PORT: u16 = 8080;
/// Shaping of every node's eth0 (`netns.sh up --rate/--delay`).
pub const RATE: &str = "500mbit";
pub const DELAY: &str = "2ms";

/// `deploy/local/netns.sh`.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/netns.sh")
}

/// The script's message (its stderr, without the `netns.sh: ` prefixes).
fn message(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| l.strip_prefix("netns.sh: ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why `netns.sh check <args>` says nodes cannot be made here, or `None`.
pub fn unavailable(args: &[&str]) -> Option<String> {
    match Command::new(script()).arg("check").args(args).output() {
        Err(e) => Some(format!("cannot run {}: {e}", script().display())),
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(message(&out)),
    }
}

/// Whether nodes in namespaces can be made here: `Some(netem)` (whether
/// the kernel has netem; without it the nodes are shaped to the rate
/// alone), or `None` after printing `skipped: <test>: <reason>`. Under
/// `CI=true` only "not root" may skip: anything else fails the test.
pub fn available(test: &str) -> Option<bool> {
    if let Some(reason) = unavailable(&[]) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true") || reason.starts_with("not root"),
            "CI is expected to have network namespaces: {reason}"
        );
        eprintln!("skipped: {test}: {reason}");
        return None;
    }
    Some(unavailable(&["--netem"]).is_none())
}

/// `netns.sh up` nodes, brought `down` when dropped (also on a panic): drop
/// it after every process in its namespaces is gone.
#[derive(Debug)]
pub struct Nodes {
    pub prefix: String,
    /// The bridge's address in the root namespace: `<subnet>.1`.
    pub gateway: String,
    /// Node `i`'s (1-based) IP is `ips[i - 1]`.
    pub ips: Vec<String>,
}

impl Nodes {
    /// `up` with a fresh short prefix and subnet (others are tried when
    /// one is in use); `netem` false shapes the rate alone with tbf.
    pub fn up(n: usize, netem: bool) -> Nodes {
        let mut last = String::new();
        for _ in 0..5 {
            let tag: u16 = rand::random();
            let prefix = format!("kt{tag:04x}");
            let subnet = format!("10.77.{}", tag % 250);
            let mut up = Command::new(script());
            up.args(["up", &n.to_string(), "--prefix", &prefix, "--subnet", &subnet])
                .args(["--rate", RATE, "--delay", DELAY]);
            if !netem {
                up.args(["--if-no-netem", "tbf"]);
            }
            let out = up.output().expect("running netns.sh up");
            if !out.status.success() {
                last = message(&out);
                if last.contains("is in use") || last.contains("already on an interface") {
                    continue;
                }
                panic!("netns.sh up failed: {last}");
            }
            if !netem {
                eprintln!("{}", message(&out));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            let ips: Vec<String> = stdout
                .lines()
                .enumerate()
                .map(|(i, line)| {
                    let (ns, ip) = line.split_once(' ').expect("`<namespace> <ip>` lines");
                    assert_eq!(ns, format!("{prefix}-node-{}", i + 1), "{stdout}");
                    ip.to_owned()
                })
                .collect();
            assert_eq!(ips.len(), n, "one line per node: {stdout}");
            return Nodes {
                gateway: format!("{subnet}.1"),
                prefix,
                ips,
            };
        }
        panic!("no free prefix and subnet for netns.sh up: {last}");
    }

    pub fn ip(&self, node: usize) -> &str {
        &self.ips[node - 1]
    }

    /// A command running `program` in node `node`'s namespace; the process
    /// spawned becomes `program` (the script and `ip netns exec` exec it).
    pub fn command(&self, node: usize, program: &Path) -> Command {
        let mut c = Command::new(script());
        c.args(["exec", &node.to_string(), "--prefix", &self.prefix, "--"])
            .arg(program);
        c
    }

    /// `tc -s qdisc` of node `node`'s eth0.
    pub fn qdisc(&self, node: usize) -> String {
        let out = self
            .command(node, Path::new("tc"))
            .args(["-s", "qdisc", "show", "dev", "eth0"])
            .output()
            .expect("tc");
        assert!(out.status.success(), "tc: {}", message(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn down(&self) -> Result<(), String> {
        let out = Command::new(script())
            .args(["down", "--prefix", &self.prefix])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(message(&out))
        }
    }

    /// Namespaces and links named `<prefix>-...` that exist.
    pub fn leftovers(&self) -> Vec<String> {
        let named = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("ip");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let mine = format!("{}-", self.prefix);
        let namespaces = named(&["netns", "list"]);
        let links = named(&["-o", "link", "show"]);
        namespaces
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .chain(
                links
                    .lines()
                    .filter_map(|l| l.split(": ").nth(1))
                    .map(|name| name.split('@').next().unwrap_or(name)),
            )
            .filter(|name| name.starts_with(&mine))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!("netns.sh down --prefix {}: {e}", self.prefix);
        }
    }
}

/// A server binary built next to this test (`target/<profile>/`), or the
/// one `env` names.
pub fn binary(name: &str, env: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("test executable");
        // target/<profile>/deps/netns_nodes-<hash> → target/<profile>/<name>
        exe.parent()
            .and_then(Path::parent)
            .expect("target dir")
            .join(name)
    });
    assert!(
        path.is_file(),
        "{} not found: build it first with `cargo build -p kindling-agent -p kindling-rendezvous --bins` (same \
         CARGO_TARGET_DIR), or set {env}",
        path.display()
    );
    path
}

/// A spawned server, SIGKILLed when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    log: PathBuf,
    /// `/readyz` address.
    health: String,
}

impl Proc {
    /// Spawns `command` with only `PATH` from this process's environment
    /// (the flags say everything; no stray `KINDLING_*` variable), its stderr
    /// in `<dir>/<name>.log`.
    pub fn spawn(name: &str, mut command: Command, health: String, dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        command
            .env_clear()
            .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name} ({command:?}): {e}"));
        Proc {
            name: name.into(),
            child,
            log,
            health,
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `/readyz` until it answers 200 (the agent: registered with the
    /// rendezvous); panics with the logs if the process exits first.
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if tokio::time::timeout(Duration::from_secs(2), ready(&self.health))
                .await
                .unwrap_or(false)
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}) before ready:\n{}", self.name, self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready at {}:\n{}",
                self.name,
                self.health,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Whether the process has ended (its status), without waiting.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits for the process to end (blocking).
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait")
    }

    /// SIGSTOPs the process (`frozen`) or SIGCONTs it: it stops where it
    /// is, holding its connections, or goes on.
    pub fn freeze(&self, frozen: bool) {
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "kill {signal} {}", self.name);
    }

    /// SIGKILLs the process and asserts it died of it.
    pub fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("wait");
        assert_eq!(status.signal(), Some(9), "{} died of SIGKILL", self.name);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `GET /readyz` on `addr` answers 200 (false while nothing answers).
async fn ready(addr: &str) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET /readyz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    let mut answer = String::new();
    s.write_all(request.as_bytes()).await.is_ok()
        && s.read_to_string(&mut answer).await.is_ok()
        && answer.split_whitespace().nth(1) == Some("200")
}

/// A port free on `ip` (in this namespace) now.
pub fn free_port(ip: &str) -> u16 {
    free_ports(ip, 1)[0]
}

/// `n` distinct ports free on `ip` now: every listener is held until all
/// are bound, so the kernel cannot hand the same port out twice (as
/// binding and releasing one at a time can).
pub fn free_ports(ip: &str, n: usize) -> Vec<u16> {
    let held: Vec<StdListener> = (0..n)
        .map(|_| StdListener::bind((ip, 0)).unwrap_or_else(|e| panic!("bind {ip}: {e}")))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// Bytes a node's root qdisc sent (`Sent N bytes` of `tc -s qdisc`).
pub fn sent_bytes(qdisc: &str) -> u64 {
    qdisc
        .split_once("Sent ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `Sent N bytes` in {qdisc}"))
}

/// A real `kindling-rendezvous` on the bridge's address (root namespace)
/// and one real `kindling-agent` in each node's namespace, on its node's IP
/// and [`AGENT_PORT`] (the same on every node, as a DaemonSet), node `i`
/// named `node-<i>`. The bridge is not loopback: both take
/// `--allow-plaintext-token`. Every process is SIGKILLed when dropped.
#[derive(Debug)]
pub struct NodeCluster {
    pub rendezvous: Proc,
    /// Node 1's agent first.
    pub agents: Vec<Proc>,
    /// `http://<gateway>:<port>`.
    pub rendezvous_url: String,
    /// `http://<node ip>:AGENT_PORT`, node 1's first.
    pub agent_urls: Vec<String>,
}

impl NodeCluster {
    /// Starts the rendezvous and the agents (binaries from [`binary`]) with
    /// the token in `token_file`, logs and work dirs in `dir`, `agent_args`
    /// added to every agent's flags; returns once every agent is ready
    /// (registered with the rendezvous).
    pub async fn start(nodes: &Nodes, dir: &Path, token_file: &Path, agent_args: &[&str]) -> NodeCluster {
        let agent_bin = binary("kindling-agent", "KINDLING_AGENT_BIN");
        let rendezvous_bin = binary("kindling-rendezvous", "KINDLING_RENDEZVOUS_BIN");
        let rendezvous_addr = format!("{}:{}", nodes.gateway, free_port(&nodes.gateway));
        let rendezvous_url = format!("http://{rendezvous_addr}");
        let mut rendezvous = {
            let health = format!("127.0.0.1:{}", free_port("127.0.0.1"));
            let mut c = Command::new(&rendezvous_bin);
            c.args(["--listen", &rendezvous_addr, "--health-listen", &health])
                .arg("--token-file")
                .arg(token_file)
                .arg("--allow-plaintext-token")
                .args(["--lease-ms", "2000", "--gang-timeout-ms", "30000"]);
            Proc::spawn("rendezvous", c, health, dir)
        };
        rendezvous.wait_ready().await;
        let mut agents: Vec<Proc> = (1..=nodes.ips.len())
            .map(|node| {
                let ip = nodes.ip(node);
                let mut c = nodes.command(node, &agent_bin);
                c.args(["--node-name", &format!("node-{node}")])
                    .args(["--listen", &format!("{ip}:{AGENT_PORT}")])
                    .args(["--advertise-host", ip])
                    .args(["--health-listen", &format!("{ip}:{HEALTH_PORT}")])
                    .args(["--rendezvous", &rendezvous_url])
                    .arg("--token-file")
                    .arg(token_file)
                    .arg("--allow-plaintext-token")
                    .arg("--work-dir")
                    .arg(dir.join(format!("node-{node}")))
                    .args(["--collective-timeout-ms", "20000", "--log-level", "info"])
                    .args(agent_args);
                Proc::spawn(
                    &format!("agent-node-{node}"),
                    c,
                    format!("{ip}:{HEALTH_PORT}"),
                    dir,
                )
            })
            .collect();
        for agent in &mut agents {
            agent.wait_ready().await;
        }
        let agent_urls = nodes
            .ips
            .iter()
            .map(|ip| format!("http://{ip}:{AGENT_PORT}"))
            .collect();
        NodeCluster {
            rendezvous,
            agents,
            rendezvous_url,
            agent_urls,
        }
    }

    /// Every process's log, headed by its name.
    pub fn logs(&self) -> String {
        std::iter::once(&self.rendezvous)
            .chain(&self.agents)
            .map(|p| format!("--- {} ---\n{}", p.name, p.logs()))
            .collect()
    }

    /// SIGKILLs every agent, then the rendezvous, asserting each died of it.
    pub fn sigkill(&mut self) {
        for agent in &mut self.agents {
            agent.sigkill();
        }
        self.rendezvous.sigkill();
    }
}
