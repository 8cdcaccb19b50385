//! A real etcd cluster on loopback (Debian's `etcd-server`, which
//! `deploy/local/setup.sh` installs): `n` members on free ports, each with
//! its own data directory, SIGKILLed and restarted by tests; and real
//! `kindling-rendezvous` replicas on it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::netns::{Proc, binary, free_ports};

/// The `etcd` executable: `KINDLING_ETCD_BIN`, else `etcd` on the PATH.
pub fn etcd_bin() -> PathBuf {
    std::env::var_os("KINDLING_ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// One member: its name, ports and process (`None` while killed).
#[derive(Debug)]
struct Member {
    name: String,
    client: u16,
    peer: u16,
    proc: Option<Proc>,
}

/// An etcd cluster of real processes.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    /// Mutual TLS (clients and peers): the members' certificate files, and
    /// a client's (etcdctl's here).
    tls: Option<(kindling_fixtures::pki::Files, kindling_fixtures::pki::Files)>,
    /// Where the members' certificate lies, while the cluster lives.
    _certs: Option<tempfile::TempDir>,
}

impl EtcdCluster {
    /// Starts `n` members and returns once the cluster answers.
    pub async fn start(n: usize) -> EtcdCluster {
        Self::start_with(n, None, None).await
    }

    /// [`start`](Self::start) with mutual TLS for clients and peers, the
    /// members' certificate and the client's `client` signed by `ca`.
    pub async fn start_tls(
        n: usize,
        ca: &kindling_fixtures::pki::TestCa,
        client: &kindling_fixtures::pki::Files,
    ) -> EtcdCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let member = ca
            .issue("etcd", &["127.0.0.1", "localhost"])
            .write(&dir.path().join("member-tls"), ca.pem());
        Self::start_with(n, Some((member, client.clone())), Some(dir)).await
    }

    async fn start_with(
        n: usize,
        tls: Option<(kindling_fixtures::pki::Files, kindling_fixtures::pki::Files)>,
        certs: Option<tempfile::TempDir>,
    ) -> EtcdCluster {
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            dir: tempfile::tempdir().expect("temp dir"),
            tls,
            _certs: certs,
        };
        // A port picked free can be taken by another test's process before
        // etcd binds it; a member that exits at start lost that race, and
        // the cluster starts again on new ports and a fresh data dir.
        for round in 1..=3 {
            let ports = free_ports("127.0.0.1", 2 * n);
            cluster.members = (0..n)
                .map(|i| Member {
                    name: format!("etcd{i}"),
                    client: ports[2 * i],
                    peer: ports[2 * i + 1],
                    proc: None,
                })
                .collect();
            for i in 0..n {
                cluster.spawn(i, "new");
            }
            if cluster.wait_healthy_or_exit().await || round == 3 {
                break;
            }
            eprintln!(
                "[etcd] a member exited at start; again on new ports:\n{}",
                cluster.logs()
            );
            for i in 0..n {
                cluster.kill(i);
            }
            cluster.dir = tempfile::tempdir().expect("temp dir");
        }
        cluster.wait_healthy().await;
        cluster
    }

    /// Waits for a quorum like [`Self::wait_healthy`]; false as soon as a
    /// member's process has exited (true when healthy or out of time).
    async fn wait_healthy_or_exit(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.healthy() {
                return true;
            }
            let exited = self
                .members
                .iter_mut()
                .any(|m| m.proc.as_mut().is_some_and(|p| p.try_wait().is_some()));
            if exited {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true // wait_healthy reports the timeout with the logs
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={scheme}://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let m = &self.members[i];
        let mut command = Command::new(etcd_bin());
        command
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(self.dir.path().join(&m.name))
            .arg("--listen-client-urls")
            .arg(format!("{scheme}://127.0.0.1:{}", m.client))
            .arg("--advertise-client-urls")
            .arg(format!("{scheme}://127.0.0.1:{}", m.client))
            .arg("--listen-peer-urls")
            .arg(format!("{scheme}://127.0.0.1:{}", m.peer))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("{scheme}://127.0.0.1:{}", m.peer))
            .arg("--initial-cluster")
            .arg(initial.join(","))
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg("kindling-test");
        if let Some((member, _)) = &self.tls {
            for (flag, path) in [
                ("--cert-file", &member.cert),
                ("--key-file", &member.key),
                ("--trusted-ca-file", &member.ca),
                ("--peer-cert-file", &member.cert),
                ("--peer-key-file", &member.key),
                ("--peer-trusted-ca-file", &member.ca),
            ] {
                command.arg(flag).arg(path);
            }
            command.args(["--client-cert-auth", "--peer-client-cert-auth"]);
        }
        // Health is asked with etcdctl, not an HTTP probe.
        let proc = Proc::spawn(&m.name, command, String::new(), self.dir.path());
        self.members[i].proc = Some(proc);
    }

    /// `host:port,host:port,…` of every member's client URL.
    pub fn hosts(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client address of member `i`.
    pub fn client_addr(&self, i: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.members[i].client))
    }

    /// `etcd://<every member>/<prefix>`.
    pub fn store(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.hosts())
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.sigkill();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i, "existing");
    }

    /// The logs of every member.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .filter_map(|m| m.proc.as_ref().map(|p| format!("--- {}\n{}", m.name, p.logs())))
            .collect()
    }

    /// Waits until a write through etcd's own client succeeds on the cluster
    /// (a quorum answers).
    pub async fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.healthy() {
            assert!(
                Instant::now() < deadline,
                "etcd not healthy after 60 s:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The member etcd's raft currently follows (its leader), as etcd's
    /// own `endpoint status` reports it; `None` while no member answers
    /// with a leader.
    pub fn raft_leader(&self) -> Option<usize> {
        let out = self
            .etcdctl()
            .args(["--command-timeout=2s", "endpoint", "status", "-w", "json"])
            .output()
            .ok()?;
        let statuses: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let statuses = statuses.as_array()?;
        // Each answering member names its own id and the leader's.
        let id_of = |s: &serde_json::Value| s["Status"]["header"]["member_id"].as_u64();
        let leader = statuses.iter().find_map(|s| s["Status"]["leader"].as_u64())?;
        let endpoint = statuses.iter().find(|s| id_of(s) == Some(leader))?["Endpoint"]
            .as_str()?
            .to_owned();
        self.members
            .iter()
            .position(|m| endpoint.ends_with(&format!(":{}", m.client)))
    }

    /// etcdctl with every member's endpoint (and the client identity on TLS).
    fn etcdctl(&self) -> Command {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoints: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client))
            .collect();
        let mut etcdctl = Command::new("etcdctl");
        etcdctl
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(endpoints.join(","));
        if let Some((_, client)) = &self.tls {
            etcdctl
                .arg("--cacert")
                .arg(&client.ca)
                .arg("--cert")
                .arg(&client.cert)
                .arg("--key")
                .arg(&client.key);
        }
        etcdctl
    }

    /// Whether a write through etcdctl succeeds now.
    fn healthy(&self) -> bool {
        self.etcdctl()
            .args(["--command-timeout=2s", "put", "/kindling-test/health", "ok"])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

/// A `kindling-rendezvous` replica on etcd, on a free loopback port, with
/// a 3 s agent lease.
#[derive(Debug)]
pub struct Replica {
    pub proc: Proc,
    pub url: String,
    pub health: String,
    name: String,
    port: u16,
    store: String,
    dir: PathBuf,
    extra: Vec<std::ffi::OsString>,
}

impl Replica {
    /// Spawns a replica with `store` (`etcd://…`) and `token`, its log in
    /// `dir`; returns once it answers `/readyz`.
    pub async fn start(name: &str, store: &str, token: &str, dir: &std::path::Path) -> Replica {
        Self::start_with(name, store, token, dir, &[]).await
    }

    /// [`start`](Self::start) with `extra` flags.
    pub async fn start_with(
        name: &str,
        store: &str,
        token: &str,
        dir: &std::path::Path,
        extra: &[std::ffi::OsString],
    ) -> Replica {
        let [port, health] = free_ports("127.0.0.1", 2)[..] else {
            unreachable!("two ports")
        };
        let health = format!("127.0.0.1:{health}");
        std::fs::write(dir.join(format!("{name}.token")), token).expect("token file");
        let mut replica = Replica {
            proc: Self::spawn(name, port, &health, store, dir, extra),
            url: format!("http://127.0.0.1:{port}"),
            health,
            name: name.to_owned(),
            port,
            store: store.to_owned(),
            dir: dir.to_owned(),
            extra: extra.to_vec(),
        };
        replica.proc.wait_ready().await;
        replica
    }

    fn spawn(
        name: &str,
        port: u16,
        health: &str,
        store: &str,
        dir: &std::path::Path,
        extra: &[std::ffi::OsString],
    ) -> Proc {
        let mut command = Command::new(binary("kindling-rendezvous", "KINDLING_RENDEZVOUS_BIN"));
        command
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--health-listen")
            .arg(health)
            .arg("--token-file")
            .arg(dir.join(format!("{name}.token")))
            .arg("--store")
            .arg(store)
            .arg("--advertise")
            .arg(format!("http://127.0.0.1:{port}"))
            .args(["--lease-ms", "3000"])
            .args(extra);
        Proc::spawn(name, command, health.to_owned(), dir)
    }

    /// Starts the replica again on the same ports (after a SIGKILL); its
    /// log starts afresh.
    pub async fn restart(&mut self) {
        self.proc = Self::spawn(
            &self.name,
            self.port,
            &self.health,
            &self.store,
            &self.dir,
            &self.extra,
        );
        self.proc.wait_ready().await;
    }
}

/// Which of `replicas` leads: the first a call tried once (with `token`)
/// is answered by; fails after a minute without a leader.
pub async fn leader(replicas: &[&Replica], token: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for (i, r) in replicas.iter().enumerate() {
            let once = kindling_schemas::rendezvous::RendezvousClient::connect_lazy(
                &r.url,
                Some(&kindling_schemas::auth::Token::new(token)),
            )
            .expect("client")
            .with_outage_bound(Duration::ZERO);
            if once.list_jobs().await.is_ok() {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no replica leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
