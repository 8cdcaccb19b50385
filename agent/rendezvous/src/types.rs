//! The rendezvous server's own settings and reports: [`RendezvousConfig`]
//! (service-wide defaults) and [`ReapReport`]. The values clients see too
//! (`JobConfig`, `JobStatus`, …) live in `kindling_schemas::rendezvous`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::RendezvousError;

type Result<T, E = RendezvousError> = std::result::Result<T, E>;

/// Service-wide settings; per-job timeouts in [`JobConfig`](kindling_schemas::rendezvous::JobConfig) override the defaults.
///
/// ```
/// use std::time::Duration;
/// use kindling_rendezvous::RendezvousConfig;
/// let config = RendezvousConfig::default().with_lease(Duration::from_secs(5));
/// config.validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RendezvousConfig {
    /// Heartbeats must arrive at least this often or the agent's lease lapses.
    pub lease: Duration,
    /// Default time a join waits for the whole gang (from the attempt's first join).
    pub gang_timeout: Duration,
    /// Default time an all-gather waits for every member (from the first arrival).
    pub barrier_timeout: Duration,
    /// How long a finished job stays queryable before it is garbage-collected.
    pub retention: Duration,
    /// Largest all-gather payload one member may send.
    pub max_payload_bytes: usize,
    /// Attempts of a job created with `max_attempts = 0`.
    pub default_max_attempts: u32,
    /// Largest `num_slots` a job may ask for.
    pub max_slots: u32,
}

impl Default for RendezvousConfig {
    fn default() -> Self {
        RendezvousConfig {
            lease: Duration::from_secs(10),
            gang_timeout: Duration::from_secs(60),
            barrier_timeout: Duration::from_secs(300),
            retention: Duration::from_secs(3600),
            max_payload_bytes: 4 << 20,
            default_max_attempts: 3,
            max_slots: 65_536,
        }
    }
}

impl RendezvousConfig {
    /// Sets the lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// Sets the default gang timeout.
    pub fn with_gang_timeout(mut self, timeout: Duration) -> Self {
        self.gang_timeout = timeout;
        self
    }
    /// Sets the default barrier timeout.
    pub fn with_barrier_timeout(mut self, timeout: Duration) -> Self {
        self.barrier_timeout = timeout;
        self
    }
    /// Sets the retention of finished jobs.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    /// Sets the maximum all-gather payload.
    pub fn with_max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max;
        self
    }
    /// Sets the default number of attempts.
    pub fn with_default_max_attempts(mut self, attempts: u32) -> Self {
        self.default_max_attempts = attempts;
        self
    }

    /// Checks every value is usable.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("lease", self.lease),
            ("gang_timeout", self.gang_timeout),
            ("barrier_timeout", self.barrier_timeout),
        ];
        for (name, d) in positive {
            if d.is_zero() {
                return Err(RendezvousError::invalid(format!("{name} must be > 0")));
            }
        }
        if self.max_payload_bytes == 0 || self.default_max_attempts == 0 || self.max_slots == 0 {
            return Err(RendezvousError::invalid(
                "max_payload_bytes, default_max_attempts and max_slots must be > 0",
            ));
        }
        Ok(())
    }

    /// How often the reaper looks for lapsed leases and expired jobs.
    pub fn reap_interval(&self) -> Duration {
        (self.lease / 10).clamp(Duration::from_millis(5), Duration::from_secs(1))
    }
}

/// What the reaper did in one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Agents whose lease lapsed.
    pub lapsed_agents: Vec<String>,
    /// Attempts failed because of a lapsed lease or an expired timeout.
    pub failed_attempts: Vec<(String, u32)>,
    /// Finished jobs removed after their retention.
    pub collected_jobs: Vec<String>,
    /// Jobs cancelled because their client's lease lapsed.
    pub cancelled_jobs: Vec<String>,
}
