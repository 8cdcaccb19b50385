//! A job's client: its lease renewed, or the job detached from it (it then
//! runs to its end without the client).

use std::time::Duration;

use super::{RendezvousState, Result, job_mut, require};

impl RendezvousState {
    /// Renews the job's client lease (see [`JobConfig::client_lease`](kindling_schemas::rendezvous::JobConfig::client_lease));
    /// returns the lease, `None` for a job created without one. A job that
    /// ended is refused as every call on it is.
    pub fn renew_job_lease(&self, job_id: &str) -> Result<Option<Duration>> {
        require("job_id", job_id)?;
        let mut st = self.lock()?;
        let job = job_mut(&mut st.jobs, job_id)?;
        job.check_active()?;
        job.renew_client_lease();
        Ok(job.config.client_lease)
    }

    /// Lets the job go: its client lease is dropped (for good: the state
    /// file keeps the job without one), so it runs to its end without its
    /// client. Detaching a detached job changes nothing; a job that ended is
    /// refused as every call on it is.
    pub fn detach_job(&self, job_id: &str) -> Result<()> {
        require("job_id", job_id)?;
        let mut guard = self.lock()?;
        let st = &mut *guard;
        let job = job_mut(&mut st.jobs, job_id)?;
        job.check_active()?;
        if !job.detached {
            job.detached = true;
            job.config.client_lease = None;
            job.client_lease_until = None;
            job.publish();
            tracing::info!(job = %job_id, "job detached from its client");
        }
        Self::commit(st)
    }
}
