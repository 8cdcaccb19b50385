//! Riding out a rendezvous outage: which errors are transient, and the
//! bounded, jittered exponential backoff every [`RendezvousClient`](super::RendezvousClient)
//! call uses while the rendezvous restarts.
//!
//! A call that fails with a transient error (no connection, UNAVAILABLE, or a
//! transport failure the server did not answer) is tried again after 50 ms,
//! 100 ms, … up to 2 s between tries (500 ms over several replicas, which
//! also moves the client among them: [`super::replicas`]), each delay jittered to 50–100 % so a
//! restarted rendezvous is not hit by every agent at once. Once the
//! rendezvous has been unreachable for the client's outage bound
//! ([`DEFAULT_OUTAGE_BOUND`] unless set with
//! [`with_outage_bound`](super::RendezvousClient::with_outage_bound)) the
//! call fails with [`ClientError::Unreachable`], naming the bound.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::client::Inner;
use super::error::ClientError;
use super::replicas::Replicas;

/// How long a client keeps retrying a rendezvous that does not answer.
pub const DEFAULT_OUTAGE_BOUND: Duration = Duration::from_secs(60);

const FIRST_DELAY: Duration = Duration::from_millis(50);
const MAX_DELAY: Duration = Duration::from_secs(2);
/// Between two rounds over a replicated rendezvous' replicas: a failover
/// takes about the leader's lease, and a client should find the new
/// leader soon after, not up to [`MAX_DELAY`] later.
const MAX_DELAY_REPLICAS: Duration = Duration::from_millis(500);

/// Backoff state of one call that is being retried.
#[derive(Debug)]
pub(crate) struct Backoff {
    started: Option<Instant>,
    next: Duration,
    bound: Duration,
    seed: RandomState,
    tries: u64,
    /// Several replicas: an error moves the client on (see [`super::replicas`]).
    replicas: Option<Arc<Replicas<Inner>>>,
    /// Replicas tried at once since the last sleep (a named leader is
    /// tried without waiting, once per replica between two sleeps).
    hops: usize,
}

impl Backoff {
    pub(crate) fn new(bound: Duration) -> Self {
        Backoff {
            started: None,
            next: FIRST_DELAY,
            bound,
            seed: RandomState::new(),
            tries: 0,
            replicas: None,
            hops: 0,
        }
    }

    /// A backoff that moves the client among `replicas` on each error.
    pub(crate) fn following(bound: Duration, replicas: Arc<Replicas<Inner>>) -> Self {
        Backoff {
            replicas: (replicas.len() > 1).then_some(replicas),
            ..Backoff::new(bound)
        }
    }

    /// The rendezvous answered: the next outage starts afresh.
    pub(crate) fn reset(&mut self) {
        self.started = None;
        self.next = FIRST_DELAY;
    }

    /// After `err` from `op`: sleeps and returns `Ok` when the call should be
    /// tried again; the error itself when it is not transient, or
    /// [`ClientError::Unreachable`] once the outage outlasted the bound.
    pub(crate) async fn wait(&mut self, op: &'static str, err: ClientError) -> Result<(), ClientError> {
        if !err.is_transient() {
            return Err(err);
        }
        let hinted = self.replicas.as_ref().map(|r| (r.follow(&err), r.len()));
        let started = *self.started.get_or_insert_with(Instant::now);
        let waited = started.elapsed();
        if waited >= self.bound {
            return Err(ClientError::Unreachable {
                op,
                bound: self.bound,
                source: Box::new(err),
            });
        }
        if let Some((true, replicas)) = hinted
            && self.hops < replicas
        {
            self.hops += 1;
            return Ok(());
        }
        self.hops = 0;
        self.tries += 1;
        let mut h = self.seed.build_hasher();
        h.write_u64(self.tries);
        // 50–100 % of the nominal delay.
        let jitter = 0.5 + (h.finish() % 1000) as f64 / 2000.0;
        let delay = self.next.mul_f64(jitter).min(self.bound - waited);
        if self.tries == 1 || self.tries.is_power_of_two() {
            tracing::warn!(op, error = %err, retry_in = ?delay, "rendezvous unreachable; retrying");
        }
        tokio::time::sleep(delay).await;
        let max = match self.replicas {
            Some(_) => MAX_DELAY_REPLICAS,
            None => MAX_DELAY,
        };
        self.next = (self.next * 2).min(max);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn unavailable() -> ClientError {
        ClientError::Rpc {
            op: "status",
            source: tonic::Status::unavailable("down"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_the_bound_then_named() {
        let mut b = Backoff::new(Duration::from_secs(5));
        let start = Instant::now();
        let mut tries = 0;
        let err = loop {
            match b.wait("status", unavailable()).await {
                Ok(()) => tries += 1,
                Err(e) => break e,
            }
        };
        assert!(start.elapsed() >= Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(6));
        // 50 ms doubling to 2 s between tries: more than a handful, far fewer than a busy loop.
        assert!((5..40).contains(&tries), "{tries} tries");
        assert!(
            matches!(err, ClientError::Unreachable { op: "status", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("5s"), "{err}");
        // Later may still work: the agent binary keeps trying to register.
        assert!(err.is_retryable());
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_not_retried_and_a_reset_starts_a_new_outage() {
        let mut b = Backoff::new(Duration::from_secs(1));
        let not_found = ClientError::Rpc {
            op: "status",
            source: tonic::Status::not_found("no such job"),
        };
        assert!(matches!(
            b.wait("status", not_found).await,
            Err(ClientError::Rpc { .. })
        ));
        let cancelled = ClientError::Rpc {
            op: "join",
            source: tonic::Status::cancelled("job cancelled"),
        };
        assert!(b.wait("join", cancelled).await.is_err());
        b.wait("status", unavailable()).await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        b.reset();
        b.wait("status", unavailable()).await.unwrap();
    }
}
