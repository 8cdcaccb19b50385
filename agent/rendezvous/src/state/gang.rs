//! Gang formation: a join waits until every slot of the attempt is filled,
//! then all members are released at once with ranks by agent id; a gang that
//! does not fill within the gang timeout fails the attempt.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use kindling_schemas::rendezvous::{AgentInfo, Membership, RENDEZVOUS_REPORTER};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{
    Agent, JobEntry, JobState, RendezvousError, RendezvousState, Result, agent_mut, fail_attempt, job_mut,
    require, require_attempt,
};

type JoinWaiter = oneshot::Sender<Result<Membership>>;

pub(super) struct Joiner {
    pub(super) agent_id: String,
    pub(super) waiter: Option<JoinWaiter>,
}

impl RendezvousState {
    /// Joins `agent_id` to the current attempt and waits until all
    /// `num_slots` members joined (or the gang timeout, a failure, a cancel).
    pub async fn join(&self, job_id: &str, attempt: u32, agent_id: &str) -> Result<Membership> {
        let (rx, deadline) = self.join_start(job_id, attempt, agent_id)?;
        self.await_outcome(rx, deadline, |s| s.expire_gang(job_id, attempt, Instant::now()))
            .await
    }

    fn join_start(
        &self,
        job_id: &str,
        attempt: u32,
        agent_id: &str,
    ) -> Result<(oneshot::Receiver<Result<Membership>>, Instant)> {
        require("job_id", job_id)?;
        require("agent_id", agent_id)?;
        require_attempt(attempt)?;
        let mut guard = self.lock()?;
        let st = &mut *guard;
        let job = job_mut(&mut st.jobs, job_id)?;
        job.check_active()?;
        job.check_attempt(attempt)?;
        let agent = agent_mut(&mut st.agents, agent_id)?;
        let (tx, rx) = oneshot::channel();
        if let Some(members) = &job.gang.members {
            // Already formed: a retried join gets its membership again.
            let rank = members
                .iter()
                .position(|m| m.agent_id == agent_id)
                .ok_or_else(|| {
                    job.wrong_state(format!(
                        "attempt {attempt} already formed with {} members; agent `{agent_id}` is not one of them",
                        members.len()
                    ))
                })?;
            let _ = tx.send(Ok(membership(job_id, attempt, rank, members)));
            return Ok((rx, Instant::now()));
        }
        let now = Instant::now();
        let deadline = *job.gang.deadline.get_or_insert(now + job.gang_timeout);
        match job.gang.joined.iter_mut().find(|j| j.agent_id == agent_id) {
            // A retried join replaces the earlier waiter.
            Some(j) => j.waiter = Some(tx),
            None => {
                job.gang.joined.push(Joiner {
                    agent_id: agent_id.to_owned(),
                    waiter: Some(tx),
                });
                agent.notices.remove(job_id);
            }
        }
        if job.gang.joined.len() == job.config.num_slots as usize {
            form_gang(&st.agents, job);
            // On disk before this join returns, so a restart keeps the gang
            // its members were told (if the write fails, this member gets
            // UNAVAILABLE and its retry gets the same membership).
            Self::commit(st)?;
        }
        Ok((rx, deadline))
    }

    /// Elastic resize. Shrink: the current attempt, still ganging, forms
    /// with `num_slots` members, and so does every later one; it forms at
    /// once when that many members already joined. Growth (up to the
    /// service's `max_slots`): a running attempt is ended (its members
    /// re-join, the cause says the gang grows) and the next forms with
    /// `num_slots` members; a growth never uses up one of the job's
    /// attempts. Returns the new size; asking for the current size again
    /// changes nothing (a retry).
    pub fn resize_job(&self, job_id: &str, attempt: u32, num_slots: u32) -> Result<u32> {
        require("job_id", job_id)?;
        require_attempt(attempt)?;
        let max_slots = self.config.max_slots;
        let mut guard = self.lock()?;
        let st = &mut *guard;
        let job = job_mut(&mut st.jobs, job_id)?;
        job.check_active()?;
        job.check_attempt(attempt)?;
        let current = job.config.num_slots;
        if num_slots == current {
            return Self::commit(st).map(|()| current);
        }
        if num_slots == 0 || num_slots > max_slots {
            return Err(RendezvousError::invalid(format!(
                "job `{job_id}`: num_slots must be in 1..={max_slots}, got {num_slots}"
            )));
        }
        if num_slots > current {
            grow(&mut st.agents, job, num_slots);
            return Self::commit(st).map(|()| num_slots);
        }
        if job.state != JobState::Ganging {
            return Err(job.wrong_state(format!(
                "attempt {attempt} already formed with {current} members; only a ganging attempt can shrink"
            )));
        }
        let joined = job.gang.joined.len();
        if joined > num_slots as usize {
            return Err(job.wrong_state(format!(
                "{joined} members already joined attempt {attempt}; it cannot shrink to {num_slots}"
            )));
        }
        job.config.num_slots = num_slots;
        tracing::info!(job = %job_id, attempt, from = current, to = num_slots, "gang shrunk");
        if joined == num_slots as usize {
            form_gang(&st.agents, job);
        } else {
            job.publish();
        }
        Self::commit(st)?;
        Ok(num_slots)
    }

    /// Fails the attempt if it is still ganging past its deadline. `Some` is
    /// a new deadline to keep waiting for; `None` means the waiter has been
    /// (or is being) resolved.
    fn expire_gang(&self, job_id: &str, attempt: u32, now: Instant) -> Option<Instant> {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let st = &mut *guard;
        let job = st.jobs.get_mut(job_id)?;
        if job.attempt != attempt || job.state != JobState::Ganging {
            return None;
        }
        let deadline = job.gang.deadline?;
        if now < deadline {
            return Some(deadline);
        }
        expire_gang_now(&mut st.agents, job);
        Self::commit_or_log(st);
        None
    }
}

fn membership(job_id: &str, attempt: u32, rank: usize, members: &Arc<[AgentInfo]>) -> Membership {
    Membership {
        job_id: job_id.to_owned(),
        attempt,
        rank: rank as u32,
        world_size: members.len() as u32,
        peers: members.clone(),
    }
}

/// All members joined: ranks by agent id, release every join at once.
fn form_gang(agents: &HashMap<String, Agent>, job: &mut JobEntry) {
    let mut members: Vec<AgentInfo> = job
        .gang
        .joined
        .iter()
        .map(|j| {
            agents
                .get(&j.agent_id)
                .map(|a| a.info.clone())
                .unwrap_or_else(|| AgentInfo {
                    agent_id: j.agent_id.clone(),
                    ..AgentInfo::default()
                })
        })
        .collect();
    members.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
    let members: Arc<[AgentInfo]> = members.into();
    let job_id = job.config.job_id.clone();
    let attempt = job.attempt;
    for j in &mut job.gang.joined {
        if let Some(w) = j.waiter.take()
            && let Some(rank) = members.iter().position(|m| m.agent_id == j.agent_id)
        {
            let _ = w.send(Ok(membership(&job_id, attempt, rank, &members)));
        }
    }
    job.gang.members = Some(members);
    job.gang.deadline = None;
    job.state = JobState::Running;
    tracing::info!(job = %job_id, attempt, world = job.config.num_slots, "gang formed");
    job.publish();
}

pub(super) fn expire_gang_now(agents: &mut HashMap<String, Agent>, job: &mut JobEntry) {
    let job_id = job.config.job_id.clone();
    let attempt = job.attempt;
    let joined = job.gang.joined.len();
    let expected = job.config.num_slots as usize;
    let timeout = job.gang_timeout;
    let cause =
        format!("gang timeout: {joined} of {expected} members joined attempt {attempt} within {timeout:?}");
    fail_attempt(agents, job, RENDEZVOUS_REPORTER, cause, |next_attempt| {
        RendezvousError::GangTimeout {
            job_id,
            attempt,
            joined,
            expected,
            timeout,
            next_attempt,
        }
    });
}

/// Grows `job`'s gang to `num_slots`: a running attempt ends (its members
/// re-join the next, which forms with the newcomers); a ganging one just
/// waits for more members. The ended attempt is given back, so a growth
/// never costs the job one of its attempts.
fn grow(agents: &mut HashMap<String, Agent>, job: &mut JobEntry, num_slots: u32) {
    let (attempt, from) = (job.attempt, job.config.num_slots);
    job.config.num_slots = num_slots;
    tracing::info!(job = %job.config.job_id, attempt, from, to = num_slots, "gang grows");
    if job.state != JobState::Running {
        job.publish();
        return;
    }
    job.config.max_attempts += 1;
    let cause = format!(
        "the gang grows from {from} to {num_slots} members: attempt {} re-forms with them",
        attempt + 1
    );
    let job_id = job.config.job_id.clone();
    let failure = cause.clone();
    fail_attempt(agents, job, RENDEZVOUS_REPORTER, cause, |next_attempt| {
        RendezvousError::AttemptFailed {
            job_id,
            attempt,
            cause: failure,
            next_attempt,
        }
    });
}
