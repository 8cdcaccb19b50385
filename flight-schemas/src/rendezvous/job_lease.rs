//! A job's client lease, renewed by its client in a background task while
//! the client lives ([`RendezvousClient::keep_job_leased`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::client::RendezvousClient;

/// A job's client lease kept alive by a background task
/// ([`RendezvousClient::keep_job_leased`]). Dropping it stops the renewals:
/// the job is then cancelled when the lease lapses, unless it ended first.
#[derive(Debug)]
pub struct JobLease {
    cancel: CancellationToken,
    tasks: TaskTracker,
}

impl JobLease {
    pub(super) fn new(cancel: CancellationToken, tasks: TaskTracker) -> Self {
        JobLease { cancel, tasks }
    }

    /// Stops renewing and waits for the task to end.
    pub async fn stop(self) {
        self.cancel.cancel();
        self.tasks.wait().await;
    }
}

impl Drop for JobLease {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(super) async fn renew_loop(
    client: RendezvousClient,
    job_id: String,
    lease: Duration,
    cancel: CancellationToken,
) {
    let (period, mut tick) = super::agent_lease::renewal_ticks(lease);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let renewed = tokio::select! {
            _ = cancel.cancelled() => return,
            renewed = tokio::time::timeout(period, client.renew_job_lease(&job_id)) => renewed,
        };
        match renewed {
            Ok(Ok(_)) => {}
            // The job ended or is gone: nothing left to keep.
            Ok(Err(e))
                if matches!(
                    e.code(),
                    Some(tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::Cancelled)
                ) =>
            {
                tracing::debug!(job = %job_id, error = %e, "client lease no longer renewed");
                return;
            }
            Ok(Err(e)) => tracing::warn!(job = %job_id, error = %e, "client lease renewal failed"),
            Err(_) => tracing::warn!(job = %job_id, "client lease renewal timed out"),
        }
    }
}
