//! Rendezvous fixture shared by the `rendezvous_*` tests: a real embedded
//! server on 127.0.0.1:0 with a token, agents with live leases, fault hooks.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig};
use kindling_schemas::auth::Token;
use kindling_schemas::rendezvous::{
    AgentInfo, AgentLease, GangMember, JobStatus, JobWatch, RendezvousClient,
};

pub const TOKEN: &str = "rendezvous-test-token";

/// Upper bound for anything a test waits on, so a bug fails instead of hanging.
pub const GUARD: Duration = Duration::from_secs(30);

/// Short enough to see a lapse quickly, long enough for a loaded CI box.
pub fn test_config() -> RendezvousConfig {
    RendezvousConfig::default()
        .with_lease(Duration::from_millis(1500))
        .with_gang_timeout(Duration::from_secs(30))
        .with_barrier_timeout(Duration::from_secs(30))
}

pub struct Fixture {
    pub server: EmbeddedRendezvous,
    pub client: RendezvousClient,
}

impl Fixture {
    pub async fn start() -> Self {
        Self::with_config(test_config()).await
    }

    pub async fn with_config(config: RendezvousConfig) -> Self {
        let server = EmbeddedRendezvous::start(config, Some(Token::new(TOKEN)))
            .await
            .unwrap();
        let client = RendezvousClient::connect(server.url(), Some(&Token::new(TOKEN)))
            .await
            .unwrap();
        Fixture { server, client }
    }

    /// A new connection with the right token.
    pub async fn new_client(&self) -> RendezvousClient {
        RendezvousClient::connect(self.server.url(), Some(&Token::new(TOKEN)))
            .await
            .unwrap()
    }

    /// Registers agents `prefix-000..` with heartbeating leases.
    pub async fn agents(&self, prefix: &str, n: usize) -> Vec<AgentLease> {
        let mut leases = Vec::new();
        for i in 0..n {
            leases.push(
                self.client
                    .register(agent_info(&format!("{prefix}-{i:03}")))
                    .await
                    .unwrap(),
            );
        }
        leases
    }

    /// Fault hook: the agent stops heartbeating, as if its process died.
    pub async fn kill_agent(&self, lease: AgentLease) {
        lease.stop().await;
    }

    pub async fn shutdown(self) {
        self.server.shutdown_and_wait().await.unwrap();
    }
}

pub fn agent_info(id: &str) -> AgentInfo {
    AgentInfo {
        agent_id: id.to_owned(),
        flight_address: format!("http://{id}.local:50051"),
        collective_address: format!("http://{id}.local:50052"),
        node_name: format!("node-{id}"),
        capacity: 1,
        has_gpu: false,
        models: Vec::new(),
    }
}

/// Joins every agent concurrently; results in the order of `ids`.
pub async fn join_all(
    client: &RendezvousClient,
    job: &str,
    attempt: u32,
    ids: &[String],
) -> Vec<Result<GangMember, kindling_schemas::rendezvous::ClientError>> {
    let calls = ids.iter().map(|id| {
        let client = client.clone();
        let (job, id) = (job.to_owned(), id.clone());
        tokio::spawn(async move { client.join(&job, attempt, &id).await })
    });
    let handles: Vec<_> = calls.collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(tokio::time::timeout(GUARD, h).await.unwrap().unwrap());
    }
    out
}

/// Reads the watch stream until `pred` holds.
pub async fn watch_until(watch: &mut JobWatch, pred: impl Fn(&JobStatus) -> bool) -> JobStatus {
    tokio::time::timeout(GUARD, async {
        loop {
            let status = watch.next().await.expect("watch ended").unwrap();
            if pred(&status) {
                return status;
            }
        }
    })
    .await
    .expect("watch condition not reached")
}
