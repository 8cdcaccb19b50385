//! Agents and their leases: registration, heartbeats (which carry the failed
//! attempts an agent joined), deregistration, and what a departing agent does
//! to the attempts it is in.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kindling_schemas::rendezvous::{AgentInfo, HeartbeatReply};
use tokio::time::Instant;

use super::{Agent, RendezvousError, RendezvousState, Result, State, fail_attempt, require};

impl RendezvousState {
    /// Registers (or re-registers) an agent and starts its lease.
    pub fn register_agent(&self, info: AgentInfo) -> Result<Duration> {
        require("agent_id", &info.agent_id)?;
        let lease = self.config.lease;
        let mut st = self.lock()?;
        let lease_until = Instant::now() + lease;
        match st.agents.get_mut(&info.agent_id) {
            Some(agent) => {
                agent.info = info;
                agent.lease_until = lease_until;
            }
            None => {
                tracing::debug!(agent = %info.agent_id, "agent registered");
                st.agents.insert(
                    info.agent_id.clone(),
                    Agent {
                        info,
                        lease_until,
                        notices: BTreeMap::new(),
                    },
                );
            }
        }
        Self::commit(&mut st)?;
        Ok(lease)
    }

    /// Renews an agent's lease; replies with the attempts it joined that failed.
    ///
    /// Write before announce: a notice is handed out only once the failure
    /// it tells is durable. While the last write failed (memory holds a
    /// change no write took), the lease is renewed (leases are not part of
    /// the durable state) but the reply is UNAVAILABLE (`Storage`), with no
    /// notice: an agent must not abandon an attempt that a crash before the
    /// next successful write would bring back. Its next heartbeat after a
    /// write succeeds (the reaper retries it) gets the notice.
    pub fn heartbeat(&self, agent_id: &str) -> Result<HeartbeatReply> {
        require("agent_id", agent_id)?;
        let lease = self.config.lease;
        let mut guard = self.lock()?;
        let st = &mut *guard;
        let agent = agent_mut(&mut st.agents, agent_id)?;
        agent.lease_until = Instant::now() + lease;
        let notices = agent.notices.values().cloned().collect();
        Self::written(st)?;
        Ok(HeartbeatReply {
            lease,
            failed_attempts: notices,
        })
    }

    /// Removes an agent at once, as if its lease lapsed.
    pub fn deregister_agent(&self, agent_id: &str) -> Result<()> {
        require("agent_id", agent_id)?;
        let mut st = self.lock()?;
        if !st.agents.contains_key(agent_id) {
            return Err(RendezvousError::AgentNotRegistered {
                agent_id: agent_id.to_owned(),
            });
        }
        let cause = format!("agent `{agent_id}` deregistered");
        remove_agent(&mut st, agent_id, &cause);
        Self::commit(&mut st)
    }

    /// Live agents, by agent id.
    pub fn list_agents(&self) -> Result<Vec<AgentInfo>> {
        let st = self.lock()?;
        let now = Instant::now();
        let mut agents: Vec<AgentInfo> = st
            .agents
            .values()
            .filter(|a| a.lease_until > now)
            .map(|a| a.info.clone())
            .collect();
        agents.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        Ok(agents)
    }
}

/// The registered agent `agent_id`, or [`RendezvousError::AgentNotRegistered`].
pub(super) fn agent_mut<'a>(agents: &'a mut HashMap<String, Agent>, agent_id: &str) -> Result<&'a mut Agent> {
    agents
        .get_mut(agent_id)
        .ok_or_else(|| RendezvousError::AgentNotRegistered {
            agent_id: agent_id.to_owned(),
        })
}

/// Drops an agent: fails the running attempts it is a member of; while a
/// gang is still forming it just leaves it (no attempt is burnt).
pub(super) fn remove_agent(st: &mut State, agent_id: &str, cause: &str) -> Vec<(String, u32)> {
    let mut failed = Vec::new();
    st.agents.remove(agent_id);
    for job in st.jobs.values_mut() {
        if job.state.is_terminal() || !job.is_member(agent_id) {
            continue;
        }
        if job.gang.members.is_some() {
            let attempt = job.attempt;
            let job_id = job.config.job_id.clone();
            let cause = cause.to_owned();
            failed.push((job_id.clone(), attempt));
            fail_attempt(&mut st.agents, job, agent_id, cause.clone(), |next_attempt| {
                RendezvousError::AttemptFailed {
                    job_id,
                    attempt,
                    cause,
                    next_attempt,
                }
            });
        } else {
            if let Some(pos) = job.gang.joined.iter().position(|j| j.agent_id == agent_id) {
                let j = job.gang.joined.remove(pos);
                if let Some(w) = j.waiter {
                    let _ = w.send(Err(RendezvousError::AgentNotRegistered {
                        agent_id: agent_id.to_owned(),
                    }));
                }
            }
            if job.gang.joined.is_empty() {
                job.gang.deadline = None;
            }
        }
    }
    failed
}
