//! Durability: the state as the state file keeps it (a snapshot), and the
//! state read back from it after a restart (see [`crate::store`] and
//! docs/rendezvous.md, "Restarts").

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use kindling_schemas::pb::rendezvous as pb;
use kindling_schemas::rendezvous::wire::{from_unix_ms, unix_ms};
use kindling_schemas::rendezvous::{AgentInfo, JobConfig, JobState, JobStatus};
use tokio::sync::watch;
use tokio::time::Instant;

use super::gang::Joiner;
use super::{
    Agent, Gang, JobEntry, RendezvousConfig, RendezvousError, RendezvousState, Result, State,
    placeholder_status,
};
use crate::error::{RecordError, StorageError};
use crate::store::{STATE_FORMAT, SnapshotStore, StateStore};

impl JobEntry {
    /// The job as the state file keeps it.
    fn record(&self) -> pb::JobRecord {
        let config = JobConfig {
            gang_timeout: Some(self.gang_timeout),
            barrier_timeout: Some(self.barrier_timeout),
            ..self.config.clone()
        };
        let mut status = pb::JobStatusResponse::from(&self.status());
        status.members.clear();
        pb::JobRecord {
            config: Some(pb::CreateJobRequest::from(&config)),
            status: Some(status),
            members: self
                .gang
                .members
                .as_deref()
                .map(<[AgentInfo]>::to_vec)
                .unwrap_or_default(),
            finished_unix_ms: self.ended.map_or(0, unix_ms),
        }
    }

    /// A job read back from the state file: blocked calls and all-gathers
    /// are gone (their callers retry); a formed gang keeps its members.
    fn restore(record: pb::JobRecord, defaults: &RendezvousConfig) -> Result<JobEntry, RecordError> {
        let config = JobConfig::from(record.config.ok_or(RecordError::NoConfig)?);
        let status = JobStatus::try_from(record.status.ok_or(RecordError::NoStatus)?)
            .map_err(|e| RecordError::UnknownState(e.0))?;
        // Only what a rendezvous writes: a record no call could reach or
        // move on is refused, not restored as a job that never runs.
        let job_id = &config.job_id;
        if job_id.is_empty() {
            return Err(RecordError::NoJobId);
        }
        if config.num_slots == 0 {
            return Err(RecordError::NoSlots(job_id.clone()));
        }
        if status.attempt == 0 || status.attempt > config.max_attempts {
            return Err(RecordError::Attempt {
                job_id: job_id.clone(),
                attempt: status.attempt,
                max_attempts: config.max_attempts,
            });
        }
        let gang_timeout = config.gang_timeout.unwrap_or(defaults.gang_timeout);
        let barrier_timeout = config.barrier_timeout.unwrap_or(defaults.barrier_timeout);
        let ended = (record.finished_unix_ms > 0).then(|| from_unix_ms(record.finished_unix_ms));
        let finished_at = ended.map(|t| {
            let ago = SystemTime::now().duration_since(t).unwrap_or_default();
            Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
        });
        let mut gang = Gang::default();
        if !record.members.is_empty() {
            gang.joined = record
                .members
                .iter()
                .map(|m| Joiner {
                    agent_id: m.agent_id.clone(),
                    waiter: None,
                })
                .collect();
            gang.members = Some(record.members.into());
            gang.resumed = status.state == JobState::Running;
        }
        // A record written before incarnations keeps the one its
        // credentials name: the creation time.
        let incarnation = status.incarnation();
        let mut job = JobEntry {
            config,
            gang_timeout,
            barrier_timeout,
            state: status.state,
            attempt: status.attempt,
            failures: status.failures,
            cancel_reason: status.cancel_reason,
            incarnation,
            created: status.created,
            updated: status.updated,
            finished_at,
            ended,
            gang,
            events: watch::Sender::new(placeholder_status()),
            client_lease_until: None,
            detached: status.detached,
            unpublished: false,
        };
        // Like an agent's, the client's lease starts afresh: a restart costs
        // the client no renewal.
        job.renew_client_lease();
        job.events.send_replace(job.status());
        Ok(job)
    }
}

impl State {
    /// What a restart must not lose, in a stable order.
    fn snapshot(&self) -> pb::StateSnapshot {
        let mut agents: Vec<AgentInfo> = self.agents.values().map(|a| a.info.clone()).collect();
        agents.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        let mut jobs: Vec<&JobEntry> = self.jobs.values().collect();
        jobs.sort_by(|a, b| a.config.job_id.cmp(&b.config.job_id));
        pb::StateSnapshot {
            format: STATE_FORMAT,
            agents,
            jobs: jobs.into_iter().map(JobEntry::record).collect(),
        }
    }
}

impl State {
    /// The state `snapshot` holds (empty when `None`), writing to `store` from now on.
    pub(super) fn restore(
        store: Box<dyn SnapshotStore>,
        snapshot: Option<pb::StateSnapshot>,
        config: &RendezvousConfig,
    ) -> Result<State> {
        let mut state = State::default();
        if let Some(snapshot) = snapshot {
            let now = Instant::now();
            for info in snapshot.agents {
                let agent = Agent {
                    info,
                    lease_until: now + config.lease,
                    notices: BTreeMap::new(),
                };
                state.agents.insert(agent.info.agent_id.clone(), agent);
            }
            for record in snapshot.jobs {
                let job = JobEntry::restore(record, config).map_err(|e| RendezvousError::Storage {
                    place: store.place(),
                    source: e.into(),
                })?;
                state.jobs.insert(job.config.job_id.clone(), job);
            }
            tracing::info!(
                from = %store.place(),
                agents = state.agents.len(),
                jobs = state.jobs.len(),
                "state restored"
            );
        }
        state.store = Some(store);
        Ok(state)
    }
}

impl RendezvousState {
    /// A durable state kept in `state_dir` (or in memory only when `None`):
    /// what the directory holds is read back, and every change is written
    /// there before it is acknowledged (see [`crate::store`]). Agents read
    /// back get a fresh lease, so a restart within one lease costs no attempt.
    pub fn open(config: RendezvousConfig, state_dir: Option<&Path>) -> Result<Self> {
        config.validate()?;
        let state = match state_dir {
            Some(dir) => {
                let (store, snapshot) = StateStore::open(dir)?;
                State::restore(Box::new(store), snapshot, &config)?
            }
            None => State::default(),
        };
        Ok(RendezvousState {
            config: Arc::new(config),
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// A durable state kept in `store`, starting from `snapshot` (what the
    /// store held when it was opened; `None`: nothing yet).
    pub fn with_store(
        config: RendezvousConfig,
        store: Box<dyn SnapshotStore>,
        snapshot: Option<pb::StateSnapshot>,
    ) -> Result<Self> {
        config.validate()?;
        let state = State::restore(store, snapshot, &config)?;
        Ok(RendezvousState {
            config: Arc::new(config),
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// Writes the durable state if it changed (a no-op without a state dir).
    /// Called under the lock at the end of every call that may have changed
    /// it, so nothing is acknowledged before it is on disk.
    /// Only then are the watchers told ([`JobEntry::announce`]).
    pub(super) fn commit(st: &mut State) -> Result<()> {
        if st.store.is_some() {
            let snapshot = st.snapshot();
            if let Some(store) = st.store.as_mut() {
                let saved = store.save(&snapshot);
                st.unsaved = saved.is_err();
                saved?;
            }
        }
        for job in st.jobs.values_mut() {
            job.announce();
        }
        Ok(())
    }

    /// Hands out an outcome only once the change that decided it is on disk.
    /// Whoever resolved it holds the lock until its write ends, so taking the
    /// lock orders this after that write; if the write failed, the caller
    /// gets UNAVAILABLE and its retry gets the same outcome once a write
    /// succeeds. Reads answered to callers (a job's status, the jobs, the
    /// agents) pass through it too: memory holding a change no write took
    /// is not shown as if a crash could not take it back.
    pub fn durable<T>(&self, outcome: Result<T>) -> Result<T> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Self::written(&st)?;
        outcome
    }

    /// `Ok` unless the last write failed: memory then holds a change no
    /// write took, and nothing read from it may be handed out.
    pub(super) fn written(st: &State) -> Result<()> {
        match (&st.store, st.unsaved) {
            (Some(store), true) => Err(RendezvousError::Storage {
                place: store.place(),
                source: StorageError::Unsaved,
            }),
            _ => Ok(()),
        }
    }

    /// [`Self::commit`] where no caller waits for the outcome: a failed write
    /// is logged and retried by the next change.
    pub(super) fn commit_or_log(st: &mut State) {
        if let Err(e) = Self::commit(st) {
            tracing::error!(error = %e, "could not persist the rendezvous state");
        }
    }
}
