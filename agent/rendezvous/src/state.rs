//! The rendezvous state machine: agents and their leases, jobs, attempts,
//! gangs and collectives. No gRPC here; `server.rs` is a thin shell over it.
//!
//! One mutex guards everything; no lock is held across an `.await`. A blocked
//! call (join, all-gather) parks a `oneshot` sender in the state and awaits the
//! receiver; whoever moves the attempt on (the last member to arrive, a
//! failure, a timeout, a cancel, shutdown) resolves every parked sender under
//! the lock, so all blocked members learn the outcome at once.
//!
//! Time is `tokio::time`, so timeouts can be tested with paused time.
//!
//! Agent leases are in `state/agents.rs`, the job's client (its lease,
//! detaching) in `state/client.rs`, joins and gang formation in
//! `state/gang.rs`, all-gathers and barriers in `state/gather.rs`; the value
//! types come from `kindling_schemas::rendezvous` and [`crate::types`].

use crate::store::SnapshotStore;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use kindling_schemas::rendezvous::{AgentInfo, AttemptFailure, AttemptRef, JobConfig, JobState, JobStatus};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::error::RendezvousError;
use crate::types::{ReapReport, RendezvousConfig};

mod agents;
mod client;
mod durable;
mod gang;
mod gather;

use agents::{agent_mut, remove_agent};
use gang::{Joiner, expire_gang_now};
use gather::{Collective, GatherResult, expire_gather_now};

type Result<T, E = RendezvousError> = std::result::Result<T, E>;

struct Agent {
    info: AgentInfo,
    lease_until: Instant,
    /// Latest failed attempt per job this agent joined (heartbeat reply).
    notices: BTreeMap<String, AttemptRef>,
}

/// The current attempt of a job.
#[derive(Default)]
struct Gang {
    /// Join order; after formation, the members.
    joined: Vec<Joiner>,
    deadline: Option<Instant>,
    /// Set when the gang formed: members in rank order.
    members: Option<Arc<[AgentInfo]>>,
    collective: Option<Collective>,
    last_gather: Option<(u64, GatherResult)>,
    /// Restored from the state file: the members' collective sequence is not
    /// known, so the next collective may carry any sequence number.
    resumed: bool,
}

impl Gang {
    fn resolve_all(&mut self, err: &RendezvousError) {
        for j in &mut self.joined {
            if let Some(w) = j.waiter.take() {
                let _ = w.send(Err(err.clone()));
            }
        }
        if let Some(c) = self.collective.take() {
            for w in c.waiters.into_iter().flatten() {
                let _ = w.send(Err(err.clone()));
            }
        }
    }
}

/// The rendezvous's record of one job: its config, its attempts and the
/// current one's gang, and its watchers.
struct JobEntry {
    config: JobConfig,
    gang_timeout: Duration,
    barrier_timeout: Duration,
    state: JobState,
    attempt: u32,
    failures: Vec<AttemptFailure>,
    cancel_reason: Option<String>,
    created: SystemTime,
    updated: SystemTime,
    /// Which job of this id this is ([`JobStatus::incarnation`]).
    incarnation: u64,
    finished_at: Option<Instant>,
    /// Wall-clock time of `finished_at`, for the state file.
    ended: Option<SystemTime>,
    gang: Gang,
    events: watch::Sender<JobStatus>,
    /// When the client's lease lapses (jobs created with a client lease).
    client_lease_until: Option<Instant>,
    /// The client let the job go ([`RendezvousState::detach_job`]).
    detached: bool,
    /// A change the watchers have not been told yet: they are told once it
    /// is durable ([`RendezvousState::commit`]), never before.
    unpublished: bool,
}

impl JobEntry {
    fn status(&self) -> JobStatus {
        let members = match &self.gang.members {
            Some(m) => m.iter().map(|a| a.agent_id.clone()).collect(),
            None => self.gang.joined.iter().map(|j| j.agent_id.clone()).collect(),
        };
        JobStatus {
            job_id: self.config.job_id.clone(),
            state: self.state,
            attempt: self.attempt,
            max_attempts: self.config.max_attempts,
            num_slots: self.config.num_slots,
            members,
            failures: self.failures.clone(),
            spec_summary: self.config.spec_summary.clone(),
            created: self.created,
            updated: self.updated,
            cancel_reason: self.cancel_reason.clone(),
            incarnation: self.incarnation,
            detached: self.detached,
        }
    }

    /// Starts the client's lease again (a no-op for a job without one).
    fn renew_client_lease(&mut self) {
        self.client_lease_until = self.config.client_lease.map(|lease| Instant::now() + lease);
    }

    /// Records a state change; the watchers are told once it is written
    /// (write before announce: a watcher never sees a state that a crash
    /// before the write would take back).
    fn publish(&mut self) {
        self.updated = SystemTime::now();
        self.unpublished = true;
    }

    /// Tells the watchers a change that is now durable.
    fn announce(&mut self) {
        if std::mem::take(&mut self.unpublished) {
            let status = self.status();
            self.events.send_replace(status);
        }
    }

    fn finish(&mut self, state: JobState) {
        self.state = state;
        self.finished_at = Some(Instant::now());
        self.ended = Some(SystemTime::now());
    }

    /// Refuses calls on a finished job.
    fn check_active(&self) -> Result<()> {
        match self.state {
            JobState::Cancelled => Err(RendezvousError::JobCancelled {
                job_id: self.config.job_id.clone(),
                reason: self.cancel_reason.clone().unwrap_or_default(),
            }),
            JobState::Succeeded | JobState::Failed => Err(self.wrong_state(format!(
                "the job already ended ({:?}); no further calls are accepted",
                self.state
            ))),
            JobState::Ganging | JobState::Running => Ok(()),
        }
    }

    /// Fencing: the call must name the current attempt.
    fn check_attempt(&self, given: u32) -> Result<()> {
        if given == self.attempt {
            Ok(())
        } else {
            Err(RendezvousError::StaleAttempt {
                job_id: self.config.job_id.clone(),
                current: self.attempt,
                given,
            })
        }
    }

    fn wrong_state(&self, detail: String) -> RendezvousError {
        RendezvousError::WrongState {
            job_id: self.config.job_id.clone(),
            detail,
        }
    }

    fn is_member(&self, agent_id: &str) -> bool {
        self.gang.joined.iter().any(|j| j.agent_id == agent_id)
    }
}

#[derive(Default)]
struct State {
    agents: HashMap<String, Agent>,
    jobs: HashMap<String, JobEntry>,
    closed: bool,
    /// The state file or etcd, when the state is durable.
    store: Option<Box<dyn SnapshotStore>>,
    /// The last write failed: what memory holds is not (all) on disk, so no
    /// outcome is handed out until a write succeeds.
    unsaved: bool,
}

/// The job `job_id`, or [`RendezvousError::JobNotFound`].
fn job_ref<'a>(jobs: &'a HashMap<String, JobEntry>, job_id: &str) -> Result<&'a JobEntry> {
    jobs.get(job_id).ok_or_else(|| RendezvousError::JobNotFound {
        job_id: job_id.to_owned(),
    })
}

/// The job `job_id` to change, or [`RendezvousError::JobNotFound`].
fn job_mut<'a>(jobs: &'a mut HashMap<String, JobEntry>, job_id: &str) -> Result<&'a mut JobEntry> {
    jobs.get_mut(job_id).ok_or_else(|| RendezvousError::JobNotFound {
        job_id: job_id.to_owned(),
    })
}

/// Fails the job's current attempt: records the cause, wakes every blocked
/// call with the error `make_err(next_attempt)` builds, tells the members
/// (heartbeat notices, watchers) and opens the next attempt or fails the job.
fn fail_attempt(
    agents: &mut HashMap<String, Agent>,
    job: &mut JobEntry,
    reporter: &str,
    cause: String,
    make_err: impl FnOnce(Option<u32>) -> RendezvousError,
) -> Option<u32> {
    fail_attempt_for(agents, job, reporter, cause, false, make_err)
}

/// [`fail_attempt`]; a `last` failure opens no next attempt.
fn fail_attempt_for(
    agents: &mut HashMap<String, Agent>,
    job: &mut JobEntry,
    reporter: &str,
    cause: String,
    last: bool,
    make_err: impl FnOnce(Option<u32>) -> RendezvousError,
) -> Option<u32> {
    let attempt = job.attempt;
    job.failures.push(AttemptFailure {
        attempt,
        agent_id: reporter.to_owned(),
        cause: cause.clone(),
        at: SystemTime::now(),
    });
    let next = (!last && attempt < job.config.max_attempts).then_some(attempt + 1);
    let err = make_err(next);
    let mut gang = std::mem::take(&mut job.gang);
    gang.resolve_all(&err);
    notify_members(agents, &gang, &job.config.job_id, attempt, &err.to_string());
    match next {
        Some(n) => {
            job.attempt = n;
            job.state = JobState::Ganging;
        }
        None => job.finish(JobState::Failed),
    }
    tracing::info!(job = %job.config.job_id, attempt, ?next, %cause, "attempt failed");
    job.publish();
    next
}

fn notify_members(agents: &mut HashMap<String, Agent>, gang: &Gang, job_id: &str, attempt: u32, cause: &str) {
    for j in &gang.joined {
        if let Some(agent) = agents.get_mut(&j.agent_id) {
            agent.notices.insert(
                job_id.to_owned(),
                AttemptRef {
                    job_id: job_id.to_owned(),
                    attempt,
                    cause: cause.to_owned(),
                },
            );
        }
    }
}

/// Cancels an active job: wakes every blocked call with `JobCancelled` and
/// tells the members (heartbeat notices, watchers).
fn cancel_active(agents: &mut HashMap<String, Agent>, job: &mut JobEntry, reason: &str) {
    let err = RendezvousError::JobCancelled {
        job_id: job.config.job_id.clone(),
        reason: reason.to_owned(),
    };
    job.gang.resolve_all(&err);
    notify_members(
        agents,
        &job.gang,
        &job.config.job_id,
        job.attempt,
        &err.to_string(),
    );
    job.cancel_reason = Some(reason.to_owned());
    job.finish(JobState::Cancelled);
    job.publish();
    tracing::info!(job = %job.config.job_id, %reason, "job cancelled");
}

fn require(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        Err(RendezvousError::invalid(format!("{what} must not be empty")))
    } else {
        Ok(())
    }
}

fn require_attempt(attempt: u32) -> Result<()> {
    if attempt == 0 {
        Err(RendezvousError::invalid("attempts are numbered from 1"))
    } else {
        Ok(())
    }
}

/// The whole rendezvous state; cheap to clone (shared).
#[derive(Clone)]
pub struct RendezvousState {
    config: Arc<RendezvousConfig>,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for RendezvousState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RendezvousState")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RendezvousState {
    /// An empty state, in memory only: a restart loses every job.
    pub fn new(config: RendezvousConfig) -> Result<Self> {
        Self::open(config, None)
    }

    /// The settings.
    pub fn config(&self) -> &RendezvousConfig {
        &self.config
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        let guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.closed {
            Err(RendezvousError::ShuttingDown)
        } else {
            Ok(guard)
        }
    }

    // ---- jobs ---------------------------------------------------------------

    /// Creates a job and returns the attempt to join (1). Creating an active
    /// job again with identical parameters returns its current attempt;
    /// different parameters, or a finished job, give `JobExists`.
    pub fn create_job(&self, config: JobConfig) -> Result<u32> {
        require("job_id", &config.job_id)?;
        if config.num_slots == 0 || config.num_slots > self.config.max_slots {
            return Err(RendezvousError::invalid(format!(
                "num_slots must be in 1..={}, got {}",
                self.config.max_slots, config.num_slots
            )));
        }
        let mut config = config;
        if config.max_attempts == 0 {
            config.max_attempts = self.config.default_max_attempts;
        }
        let gang_timeout = config
            .gang_timeout
            .filter(|d| !d.is_zero())
            .unwrap_or(self.config.gang_timeout);
        let barrier_timeout = config
            .barrier_timeout
            .filter(|d| !d.is_zero())
            .unwrap_or(self.config.barrier_timeout);
        let mut st = self.lock()?;
        if let Some(job) = st.jobs.get(&config.job_id) {
            let same = job.config.num_slots == config.num_slots
                && job.config.max_attempts == config.max_attempts
                && job.config.spec_summary == config.spec_summary
                && job.gang_timeout == gang_timeout
                && job.barrier_timeout == barrier_timeout
                && job.config.client_lease == config.client_lease;
            return match (same, job.state.is_terminal()) {
                // A retry of a create whose write failed writes it now.
                (true, false) => {
                    let attempt = job.attempt;
                    Self::commit(&mut st).map(|()| attempt)
                }
                (true, true) => Err(RendezvousError::JobExists {
                    job_id: config.job_id,
                    detail: format!("it already ended ({:?}); use a new job id", job.state),
                }),
                (false, _) => Err(RendezvousError::JobExists {
                    job_id: config.job_id,
                    detail: "with different parameters".to_owned(),
                }),
            };
        }
        let now = SystemTime::now();
        let job_id = config.job_id.clone();
        let mut job = JobEntry {
            config,
            gang_timeout,
            barrier_timeout,
            state: JobState::Ganging,
            attempt: 1,
            failures: Vec::new(),
            cancel_reason: None,
            created: now,
            updated: now,
            incarnation: new_incarnation(),
            finished_at: None,
            ended: None,
            gang: Gang::default(),
            events: watch::Sender::new(placeholder_status()),
            client_lease_until: None,
            detached: false,
            unpublished: false,
        };
        job.renew_client_lease();
        job.publish();
        tracing::info!(job = %job_id, slots = job.config.num_slots, "job created");
        st.jobs.insert(job_id, job);
        Self::commit(&mut st)?;
        Ok(1)
    }

    async fn await_outcome<T>(
        &self,
        mut rx: oneshot::Receiver<Result<T>>,
        mut deadline: Instant,
        expire: impl Fn(&Self) -> Option<Instant>,
    ) -> Result<T> {
        let outcome = loop {
            match tokio::time::timeout_at(deadline, &mut rx).await {
                Ok(outcome) => break outcome.unwrap_or(Err(RendezvousError::Superseded)),
                Err(_elapsed) => match expire(self) {
                    Some(later) => deadline = later,
                    None => break rx.await.unwrap_or(Err(RendezvousError::Superseded)),
                },
            }
        };
        self.durable(outcome)
    }

    /// A member (or the driver) reports the attempt failed. Returns the
    /// attempt to re-join, or `None` when the job ran out of attempts.
    /// Reporting an attempt that already failed changes nothing.
    pub fn report_failure(
        &self,
        job_id: &str,
        attempt: u32,
        reporter: &str,
        cause: &str,
    ) -> Result<Option<u32>> {
        self.report_failure_with(job_id, attempt, reporter, cause, false)
    }

    /// [`report_failure`](Self::report_failure); a `final` failure (the
    /// job's own input or spec) fails the job for good, whatever attempts
    /// are left.
    pub fn report_failure_with(
        &self,
        job_id: &str,
        attempt: u32,
        reporter: &str,
        cause: &str,
        r#final: bool,
    ) -> Result<Option<u32>> {
        require("job_id", job_id)?;
        require("agent_id", reporter)?;
        require_attempt(attempt)?;
        let mut guard = self.lock()?;
        let st = &mut *guard;
        let job = job_mut(&mut st.jobs, job_id)?;
        job.check_active()?;
        if attempt < job.attempt {
            let current = job.attempt;
            return Self::commit(st).map(|()| Some(current));
        }
        job.check_attempt(attempt)?;
        let cause = if cause.is_empty() {
            format!("agent `{reporter}` reported a failure")
        } else {
            format!("agent `{reporter}` reported: {cause}")
        };
        let job_id = job_id.to_owned();
        let next = fail_attempt_for(
            &mut st.agents,
            job,
            reporter,
            cause.clone(),
            r#final,
            |next_attempt| RendezvousError::AttemptFailed {
                job_id,
                attempt,
                cause,
                next_attempt,
            },
        );
        Self::commit(st)?;
        Ok(next)
    }

    /// Marks the job succeeded. Idempotent for the attempt that completed it.
    pub fn complete_job(&self, job_id: &str, attempt: u32) -> Result<()> {
        require("job_id", job_id)?;
        require_attempt(attempt)?;
        let mut st = self.lock()?;
        let job = job_mut(&mut st.jobs, job_id)?;
        if job.state == JobState::Succeeded && job.attempt == attempt {
            // A retry of a completion whose write failed writes it now.
            return Self::commit(&mut st);
        }
        job.check_active()?;
        job.check_attempt(attempt)?;
        if job.state != JobState::Running {
            return Err(job.wrong_state(format!("attempt {attempt} cannot complete: it is still ganging")));
        }
        let err = job.wrong_state(format!("attempt {attempt} completed"));
        job.gang.resolve_all(&err);
        job.finish(JobState::Succeeded);
        job.publish();
        tracing::info!(job = %job_id, attempt, "job succeeded");
        Self::commit(&mut st)
    }

    /// Cancels an active job and wakes every blocked call with `JobCancelled`.
    /// Cancelling a cancelled job is a no-op.
    pub fn cancel_job(&self, job_id: &str, reason: &str) -> Result<()> {
        require("job_id", job_id)?;
        let mut guard = self.lock()?;
        let st = &mut *guard;
        let job = job_mut(&mut st.jobs, job_id)?;
        if job.state == JobState::Cancelled {
            return Self::commit(st);
        }
        job.check_active()?;
        let reason = if reason.is_empty() {
            "no reason given"
        } else {
            reason
        };
        cancel_active(&mut st.agents, job, reason);
        Self::commit(st)
    }

    /// A job's status.
    pub fn job_status(&self, job_id: &str) -> Result<JobStatus> {
        require("job_id", job_id)?;
        let st = self.lock()?;
        job_ref(&st.jobs, job_id).map(JobEntry::status)
    }

    /// Every job (until garbage-collected), by job id.
    pub fn list_jobs(&self) -> Result<Vec<JobStatus>> {
        let st = self.lock()?;
        let mut jobs: Vec<JobStatus> = st.jobs.values().map(JobEntry::status).collect();
        jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        Ok(jobs)
    }

    /// The job's state changes; the receiver starts at the current state and
    /// closes when the job is garbage-collected or the service shuts down.
    pub fn watch(&self, job_id: &str) -> Result<watch::Receiver<JobStatus>> {
        require("job_id", job_id)?;
        let st = self.lock()?;
        job_ref(&st.jobs, job_id).map(|j| j.events.subscribe())
    }

    // ---- housekeeping -------------------------------------------------------

    /// Removes agents whose lease lapsed (failing their attempts), fails
    /// gangs and collectives past their deadline with no waiter left to
    /// notice, and garbage-collects jobs finished longer than the retention.
    pub fn reap(&self) -> ReapReport {
        let mut report = ReapReport::default();
        let Ok(mut guard) = self.lock() else {
            return report;
        };
        let st = &mut *guard;
        let now = Instant::now();
        let lapsed: Vec<String> = st
            .agents
            .iter()
            .filter(|(_, a)| a.lease_until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for agent_id in lapsed {
            let cause = format!(
                "lease of agent `{agent_id}` lapsed: no heartbeat within {:?}",
                self.config.lease
            );
            tracing::warn!(agent = %agent_id, "agent lease lapsed");
            report.failed_attempts.extend(remove_agent(st, &agent_id, &cause));
            report.lapsed_agents.push(agent_id);
        }
        for job in st.jobs.values_mut() {
            let lapsed_client = !job.state.is_terminal() && job.client_lease_until.is_some_and(|t| t <= now);
            if let (true, Some(lease)) = (lapsed_client, job.config.client_lease) {
                let reason = format!("the client's lease lapsed: no renewal within {lease:?}");
                tracing::warn!(job = %job.config.job_id, "client lease lapsed");
                cancel_active(&mut st.agents, job, &reason);
                report.cancelled_jobs.push(job.config.job_id.clone());
                continue;
            }
            let attempt = job.attempt;
            let gang_expired = job.state == JobState::Ganging && job.gang.deadline.is_some_and(|d| d <= now);
            let gather_expired = job.state == JobState::Running
                && job.gang.collective.as_ref().is_some_and(|c| c.deadline <= now);
            if gang_expired {
                expire_gang_now(&mut st.agents, job);
            } else if gather_expired {
                expire_gather_now(&mut st.agents, job);
            } else {
                continue;
            }
            report.failed_attempts.push((job.config.job_id.clone(), attempt));
        }
        let retention = self.config.retention;
        let expired: Vec<String> = st
            .jobs
            .iter()
            .filter(|(_, j)| j.finished_at.is_some_and(|t| t + retention <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for job_id in expired {
            st.jobs.remove(&job_id);
            for agent in st.agents.values_mut() {
                agent.notices.remove(&job_id);
            }
            tracing::debug!(job = %job_id, "finished job garbage-collected");
            report.collected_jobs.push(job_id);
        }
        Self::commit_or_log(st);
        report
    }

    /// Shuts down: every blocked call returns `ShuttingDown`, watchers end,
    /// and every later call is refused.
    pub fn close(&self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.closed = true;
        for job in std::mem::take(&mut st.jobs).into_values() {
            let mut job = job;
            job.gang.resolve_all(&RendezvousError::ShuttingDown);
        }
    }
}

/// A job's incarnation: 64 random bits, never 0 (which stands for "drawn
/// by no rendezvous": a state file or a peer that predates incarnations).
fn new_incarnation() -> u64 {
    rand::random::<u64>().max(1)
}

fn placeholder_status() -> JobStatus {
    JobStatus {
        job_id: String::new(),
        state: JobState::Ganging,
        attempt: 0,
        max_attempts: 0,
        num_slots: 0,
        members: Vec::new(),
        failures: Vec::new(),
        spec_summary: String::new(),
        created: SystemTime::UNIX_EPOCH,
        updated: SystemTime::UNIX_EPOCH,
        cancel_reason: None,
        incarnation: 0,
        detached: false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
