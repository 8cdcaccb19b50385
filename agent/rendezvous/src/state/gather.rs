//! Collectives of a formed gang: all-gather by sequence number (a barrier is
//! an all-gather of empty payloads), a retried call answered from the last
//! result, and a barrier timeout that fails the attempt.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use bytes::Bytes;
use kindling_schemas::rendezvous::RENDEZVOUS_REPORTER;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{
    Agent, JobEntry, JobState, RendezvousError, RendezvousState, Result, fail_attempt, job_mut, require,
    require_attempt,
};

pub(super) type GatherResult = Arc<Vec<Bytes>>;

/// One collective of one attempt, as the members' calls name it.
#[derive(Clone, Copy)]
struct GatherKey<'a> {
    job_id: &'a str,
    attempt: u32,
    seq: u64,
}
type GatherWaiter = oneshot::Sender<Result<GatherResult>>;

pub(super) struct Collective {
    pub(super) seq: u64,
    pub(super) payloads: Vec<Option<Bytes>>,
    pub(super) waiters: Vec<Option<GatherWaiter>>,
    pub(super) arrived: usize,
    pub(super) deadline: Instant,
}

impl RendezvousState {
    /// All-gather inside the current attempt: returns every member's payload
    /// in rank order once all members called with this `seq`. An empty
    /// payload makes it a plain barrier.
    pub async fn all_gather(
        &self,
        job_id: &str,
        attempt: u32,
        rank: u32,
        seq: u64,
        payload: Bytes,
    ) -> Result<Arc<Vec<Bytes>>> {
        let key = GatherKey { job_id, attempt, seq };
        let (rx, deadline) = self.gather_start(key, rank, payload)?;
        self.await_outcome(rx, deadline, |s| s.expire_gather(key, Instant::now()))
            .await
    }

    fn gather_start(
        &self,
        key: GatherKey<'_>,
        rank: u32,
        payload: Bytes,
    ) -> Result<(oneshot::Receiver<Result<GatherResult>>, Instant)> {
        let GatherKey { job_id, attempt, seq } = key;
        require("job_id", job_id)?;
        require_attempt(attempt)?;
        if payload.len() > self.config.max_payload_bytes {
            return Err(RendezvousError::PayloadTooLarge {
                size: payload.len(),
                max: self.config.max_payload_bytes,
            });
        }
        let mut st = self.lock()?;
        let job = job_mut(&mut st.jobs, job_id)?;
        job.check_active()?;
        job.check_attempt(attempt)?;
        let Some(members) = &job.gang.members else {
            return Err(job.wrong_state(format!(
                "attempt {attempt} is still ganging ({} of {} members joined)",
                job.gang.joined.len(),
                job.config.num_slots
            )));
        };
        let world = members.len();
        if rank as usize >= world {
            return Err(RendezvousError::invalid(format!(
                "rank {rank} out of range for world size {world}"
            )));
        }
        let (tx, rx) = oneshot::channel();
        if let Some((last_seq, result)) = &job.gang.last_gather
            && *last_seq == seq
        {
            // A retried call of the collective that just completed.
            let _ = tx.send(Ok(result.clone()));
            return Ok((rx, Instant::now()));
        }
        let expected = job.gang.last_gather.as_ref().map_or(0, |(s, _)| s + 1);
        let barrier_timeout = job.barrier_timeout;
        let in_progress = job.gang.collective.as_ref().map(|c| c.seq);
        match in_progress {
            Some(current) if current != seq => {
                return Err(job.wrong_state(format!(
                    "collective {seq} called while collective {current} is in progress"
                )));
            }
            // After a restart the members' next sequence number is not known.
            None if seq != expected && !job.gang.resumed => {
                return Err(job.wrong_state(format!(
                    "collective {seq} out of order: the next collective is {expected}"
                )));
            }
            _ => {}
        }
        let collective = job.gang.collective.get_or_insert_with(|| Collective {
            seq,
            payloads: vec![None; world],
            waiters: (0..world).map(|_| None).collect(),
            arrived: 0,
            deadline: Instant::now() + barrier_timeout,
        });
        let r = rank as usize;
        if collective.payloads[r].replace(payload).is_none() {
            collective.arrived += 1;
        }
        collective.waiters[r] = Some(tx);
        let deadline = collective.deadline;
        if collective.arrived == world
            && let Some(c) = job.gang.collective.take()
        {
            let result: GatherResult =
                Arc::new(c.payloads.into_iter().map(Option::unwrap_or_default).collect());
            for w in c.waiters.into_iter().flatten() {
                let _ = w.send(Ok(result.clone()));
            }
            job.gang.last_gather = Some((seq, result));
            job.gang.resumed = false;
        }
        Ok((rx, deadline))
    }

    fn expire_gather(&self, key: GatherKey<'_>, now: Instant) -> Option<Instant> {
        let GatherKey { job_id, attempt, seq } = key;
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let st = &mut *guard;
        let job = st.jobs.get_mut(job_id)?;
        if job.attempt != attempt || job.state != JobState::Running {
            return None;
        }
        let c = job.gang.collective.as_ref().filter(|c| c.seq == seq)?;
        if now < c.deadline {
            return Some(c.deadline);
        }
        expire_gather_now(&mut st.agents, job);
        Self::commit_or_log(st);
        None
    }
}

pub(super) fn expire_gather_now(agents: &mut HashMap<String, Agent>, job: &mut JobEntry) {
    let Some(c) = job.gang.collective.as_ref() else {
        return;
    };
    let job_id = job.config.job_id.clone();
    let attempt = job.attempt;
    let (seq, arrived, expected) = (c.seq, c.arrived, c.payloads.len());
    let missing: Vec<usize> = (0..expected).filter(|r| c.payloads[*r].is_none()).collect();
    let timeout = job.barrier_timeout;
    let cause = format!(
        "barrier timeout: {arrived} of {expected} members reached collective {seq} of attempt {attempt} within {timeout:?} (missing ranks {missing:?})"
    );
    fail_attempt(agents, job, RENDEZVOUS_REPORTER, cause, |next_attempt| {
        RendezvousError::BarrierTimeout {
            job_id,
            attempt,
            seq,
            arrived,
            expected,
            timeout,
            next_attempt,
        }
    });
}
