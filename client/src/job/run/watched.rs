//! What `fit` has seen of its job's agents through the rendezvous's watch
//! (their heartbeat reports) and their direct answers: each log entry once,
//! the epochs and steps, failures, and when each agent was last heard from —
//! so that an agent is asked directly only when something calls for it —
//! [`Follow`], the watch stream it is read from, and [`Watcher`], both with
//! the check for quiet agents, as every follower of a job reads them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kindling_schemas::action::{AgentJobState, AgentJobStatus};
use kindling_schemas::rendezvous::{JobState, JobStatus, MemberReport, RendezvousClient, ReportWatch};

use super::holders::Holders;
use crate::job::JobError;
use crate::job::event::TrainingEvent;
use crate::job::progress::Reporter;

/// Pause before re-opening a watch stream the rendezvous ended without a final state.
const REOPEN: Duration = Duration::from_millis(100);

/// An agent not heard from for this long (in its reports through the
/// rendezvous's watch, or asked directly) is asked for its status: a lost
/// agent that no failed attempt names is found so. Longer than the third of
/// a lease at which an agent with nothing new to report still heartbeats.
pub(crate) const QUIET: Duration = Duration::from_secs(4);

pub(crate) struct Watched {
    job_id: String,
    started: Instant,
    /// Per agent, the last log entry emitted.
    seen_events: HashMap<String, u64>,
    /// Per agent, when it last sent or answered.
    heard: HashMap<String, Instant>,
    /// Failed attempts seen.
    failures: usize,
    /// The job succeeded at the rendezvous: every member is asked until all
    /// say so.
    finishing: bool,
}

impl Watched {
    pub fn new(job_id: &str) -> Self {
        Watched {
            job_id: job_id.to_owned(),
            started: Instant::now(),
            seen_events: HashMap::new(),
            heard: HashMap::new(),
            failures: 0,
            finishing: false,
        }
    }

    /// Takes in one event of the watch: emits the members' new log entries,
    /// the lead's new epochs and its step; fails on a failed job or member.
    /// Returns the shards (one per member) whose agents to ask now: every
    /// member after an attempt failed (to find one lost) or once the job
    /// succeeded (for the final status).
    pub fn on_event(
        &mut self,
        reporter: &mut Reporter,
        holders: &Holders,
        status: &JobStatus,
        reports: &[MemberReport],
        seen_epochs: &mut usize,
    ) -> Result<Vec<usize>, JobError> {
        let members = holders.members();
        let ids: HashSet<&str> = members.iter().map(|&s| holders.agent_ids[s].as_str()).collect();
        let reports: Vec<&MemberReport> = reports
            .iter()
            .filter(|r| ids.contains(r.agent_id.as_str()))
            .collect();
        for r in &reports {
            let sent = Instant::now().checked_sub(r.age).unwrap_or_else(Instant::now);
            self.heard.insert(r.agent_id.clone(), sent);
            self.emit_events(reporter, &r.status);
        }
        if matches!(status.state, JobState::Failed | JobState::Cancelled) {
            let cause = status.first_cause().unwrap_or("cancelled").to_owned();
            return Err(self.failed(cause));
        }
        for r in &reports {
            self.check(&r.status)?;
        }
        let lead = reports
            .iter()
            .find(|r| r.status.rank == Some(0))
            .or(reports.first());
        if let Some(lead) = lead.map(|r| &r.status) {
            for m in &lead.history {
                if m.epoch as usize > *seen_epochs {
                    reporter.emit(TrainingEvent::Epoch(m.clone()));
                    *seen_epochs = m.epoch as usize;
                }
            }
            if lead.state == AgentJobState::Training {
                reporter.emit(TrainingEvent::Step {
                    epoch: lead.epoch,
                    step: lead.step,
                    steps: lead.steps_per_epoch,
                    loss: lead.loss,
                    samples_per_sec: reports.iter().map(|r| r.status.samples_per_sec).sum(),
                });
            }
        }
        let all_done = reports.len() == members.len()
            && reports.iter().all(|r| r.status.state == AgentJobState::Succeeded);
        let attempt_failed = status.failures.len() > self.failures;
        self.failures = status.failures.len();
        if status.state == JobState::Succeeded || all_done {
            self.finishing = true;
        }
        Ok(match attempt_failed || self.finishing {
            true => members,
            false => Vec::new(),
        })
    }

    /// The members to ask on a check: every one once the job succeeded,
    /// else those not heard from for [`QUIET`] (since the start, for one
    /// never heard from).
    pub fn quiet(&self, holders: &Holders) -> Vec<usize> {
        let since_start = self.started.elapsed() >= QUIET;
        holders
            .members()
            .into_iter()
            .filter(|&s| {
                self.finishing
                    || self
                        .heard
                        .get(&holders.agent_ids[s])
                        .map_or(since_start, |t| t.elapsed() >= QUIET)
            })
            .collect()
    }

    /// An agent answered directly: heard from now, its new log entries;
    /// fails when it failed.
    pub fn heard_from(&mut self, reporter: &mut Reporter, status: &AgentJobStatus) -> Result<(), JobError> {
        self.heard.insert(status.agent_id.clone(), Instant::now());
        self.emit_events(reporter, status);
        self.check(status)
    }

    /// The failure of an agent that failed or was cancelled.
    fn check(&self, status: &AgentJobStatus) -> Result<(), JobError> {
        match status.state {
            AgentJobState::Failed | AgentJobState::Cancelled => {
                let cause = status
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("{:?}", status.state));
                Err(self.failed(cause))
            }
            _ => Ok(()),
        }
    }

    fn failed(&self, cause: String) -> JobError {
        JobError::TrainingFailed {
            job_id: self.job_id.clone(),
            cause,
        }
    }

    /// Sends the agent's log entries for the job not sent yet (by their
    /// sequence number, per agent).
    fn emit_events(&mut self, reporter: &mut Reporter, status: &AgentJobStatus) {
        let last = self.seen_events.entry(status.agent_id.clone()).or_insert(0);
        for event in status.events.iter().filter(|e| e.seq > *last) {
            reporter.emit(TrainingEvent::AgentLog {
                job_id: self.job_id.clone(),
                event: event.clone(),
            });
        }
        *last = status.events.last().map_or(*last, |e| e.seq.max(*last));
    }
}

/// The job's state at the rendezvous and what its agents report of it, from
/// its `Watch` stream with reports: each change as it happens, instead of
/// asking the rendezvous and every agent again and again. A stream that breaks
/// (a rendezvous restart) is opened again; opening retries within the
/// client's outage bound, past which the error is returned.
pub(crate) struct Follow {
    rv: RendezvousClient,
    job_id: String,
    stream: Option<ReportWatch>,
    ended: bool,
}

impl Follow {
    pub fn new(rv: RendezvousClient, job_id: &str) -> Self {
        Follow {
            rv,
            job_id: job_id.to_owned(),
            stream: None,
            ended: false,
        }
    }

    /// The job's next state with its agents' latest reports; never resolves
    /// after a final state. Cancel-safe: an event not yet returned stays in
    /// the stream.
    pub async fn next(&mut self) -> Result<(JobStatus, Vec<MemberReport>), JobError> {
        loop {
            if self.ended {
                return std::future::pending().await;
            }
            let stream = match &mut self.stream {
                Some(stream) => stream,
                None => self.stream.insert(self.rv.watch_reports(&self.job_id).await?),
            };
            match stream.next().await {
                Some(Ok((status, reports))) => {
                    self.ended = status.state.is_terminal();
                    return Ok((status, reports));
                }
                Some(Err(e)) if e.is_transient() => {
                    tracing::debug!(job = %self.job_id, error = %e, "the job's watch broke: opening it again");
                    self.stream = None;
                }
                Some(Err(e)) => return Err(e.into()),
                None => {
                    self.stream = None;
                    tokio::time::sleep(REOPEN).await;
                }
            }
        }
    }
}

/// One follower's view of a job — `Run::follow`'s and `JobHandle::wait`'s:
/// the rendezvous's watch ([`Follow`]), what was seen of the agents
/// ([`Watched`]), and a check every quarter of [`QUIET`] between events
/// for agents not heard from.
pub(crate) struct Watcher {
    follow: Follow,
    /// What was seen of the job's agents.
    pub watched: Watched,
    check: tokio::time::Interval,
}

/// What a [`Watcher`] saw next.
pub(crate) enum Seen {
    /// An event of the watch: the job's state and its members' reports.
    Event(JobStatus, Vec<MemberReport>),
    /// The check's tick: time to ask the agents not heard from.
    Check,
}

impl Watcher {
    pub fn new(rv: RendezvousClient, job_id: &str) -> Self {
        let mut check = tokio::time::interval(QUIET / 4);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Watcher {
            follow: Follow::new(rv, job_id),
            watched: Watched::new(job_id),
            check,
        }
    }

    /// The next event of the watch, or the check's next tick.
    pub async fn next(&mut self) -> Result<Seen, JobError> {
        tokio::select! {
            event = self.follow.next() => {
                let (status, reports) = event?;
                Ok(Seen::Event(status, reports))
            }
            _ = self.check.tick() => Ok(Seen::Check),
        }
    }
}
