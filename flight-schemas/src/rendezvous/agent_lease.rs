//! An agent's registration kept alive: [`AgentLease`], its heartbeat task
//! (each heartbeat carrying the agent's report, [`ReportFn`]), and the
//! renewal ticks every lease is kept with.

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::client::RendezvousClient;
use super::error::ClientError;
use super::types::{AgentInfo, AttemptRef};

type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A registered agent's lease, kept alive by a background heartbeat task.
/// Dropping it stops the heartbeats (the lease then lapses on the server).
#[derive(Debug)]
pub struct AgentLease {
    agent_id: String,
    lease: Duration,
    cancel: CancellationToken,
    tasks: TaskTracker,
    failed: watch::Receiver<Vec<AttemptRef>>,
}

impl AgentLease {
    /// Heartbeats of `agent`, registered with `lease`, from now on.
    pub(super) fn start(
        client: RendezvousClient,
        agent: AgentInfo,
        lease: Duration,
        report: Option<ReportFn>,
    ) -> Self {
        let (failed_tx, failed_rx) = watch::channel(Vec::new());
        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(heartbeat_loop(
            client,
            agent.clone(),
            lease,
            report,
            failed_tx,
            cancel.clone(),
        ));
        tasks.close();
        AgentLease {
            agent_id: agent.agent_id,
            lease,
            cancel,
            tasks,
            failed: failed_rx,
        }
    }

    /// The agent's id.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The lease the server granted.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Failed attempts this agent joined, as of the latest heartbeat reply.
    pub fn failed_attempts(&self) -> watch::Receiver<Vec<AttemptRef>> {
        self.failed.clone()
    }

    /// Stops heartbeating and waits for the task to end, without
    /// deregistering: the lease lapses on the server (like a crash).
    pub async fn stop(self) {
        self.cancel.cancel();
        self.tasks.wait().await;
    }

    /// Stops heartbeating and deregisters the agent.
    pub async fn deregister(self, client: &RendezvousClient) -> Result<()> {
        self.cancel.cancel();
        self.tasks.wait().await;
        client.deregister(&self.agent_id).await
    }
}

impl Drop for AgentLease {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// What an agent's heartbeats carry: called on each one (see
/// [`RendezvousClient::register_reporting`]).
pub type ReportFn = std::sync::Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

async fn heartbeat_loop(
    client: RendezvousClient,
    agent: AgentInfo,
    lease: Duration,
    report: Option<ReportFn>,
    failed: watch::Sender<Vec<AttemptRef>>,
    cancel: CancellationToken,
) {
    let (period, mut renew) = renewal_ticks(lease);
    // A report that changed goes at once (within REPORT_CHECK): a client
    // follows its job's progress from the rendezvous's watch of them.
    let mut check = tokio::time::interval(REPORT_CHECK.min(period));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent: Option<Vec<u8>> = None;
    let make = || report.as_ref().map(|r| r()).unwrap_or_default();
    loop {
        let bytes = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = renew.tick() => make(),
            _ = check.tick(), if report.is_some() => {
                let bytes = make();
                if sent.as_ref() == Some(&bytes) {
                    continue;
                }
                renew.reset();
                bytes
            }
        };
        sent = Some(bytes.clone());
        let beat = tokio::select! {
            _ = cancel.cancelled() => return,
            beat = tokio::time::timeout(lease, client.heartbeat_reporting(&agent.agent_id, bytes)) => beat,
        };
        match beat {
            Ok(Ok(reply)) => {
                failed.send_if_modified(|current| {
                    let changed = *current != reply.failed_attempts;
                    if changed {
                        *current = reply.failed_attempts;
                    }
                    changed
                });
            }
            Ok(Err(e)) if e.code() == Some(tonic::Code::NotFound) => {
                tracing::warn!(agent = %agent.agent_id, "lease lapsed on the server; registering again");
                let registered = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = client.register_once(agent.clone()) => r,
                };
                if let Err(e) = registered {
                    tracing::warn!(agent = %agent.agent_id, error = %e, "re-registration failed");
                }
            }
            Ok(Err(e)) => tracing::warn!(agent = %agent.agent_id, error = %e, "heartbeat failed"),
            Err(_) => tracing::warn!(agent = %agent.agent_id, "heartbeat timed out"),
        }
    }
}

/// How often an agent that reports checks whether its report changed.
const REPORT_CHECK: Duration = Duration::from_millis(200);

/// Ticks every third of `lease` (the first one a third from now), delayed
/// rather than bunched after a stall: how every lease is kept alive, an
/// agent's by its heartbeat and a job's by its client.
pub(super) fn renewal_ticks(lease: Duration) -> (Duration, tokio::time::Interval) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    (period, tick)
}
