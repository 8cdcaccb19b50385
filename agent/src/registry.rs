//! The jobs an agent knows, and starting their lifecycle tasks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use kindling_schemas::action::StartJob;
use kindling_schemas::rendezvous::RendezvousClient;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::AgentError;
use crate::job::{Job, JobEnv};

/// Every job on one agent.
#[derive(Debug)]
pub struct JobRegistry {
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    env: JobEnv,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl JobRegistry {
    /// An empty registry whose job tasks are tracked by `tracker` and end with `cancel`.
    pub fn new(env: JobEnv, tracker: TaskTracker, cancel: CancellationToken) -> Arc<Self> {
        Arc::new(JobRegistry {
            jobs: Mutex::new(HashMap::new()),
            env,
            tracker,
            cancel,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Job>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This agent's id.
    pub fn agent_id(&self) -> &str {
        &self.env.agent_id
    }

    /// Root of the checkpoint directories.
    pub fn checkpoint_dir(&self) -> &Path {
        &self.env.checkpoint_dir
    }

    /// Starts a job (idempotent for the same spec while it runs; a finished
    /// job with the same id is replaced).
    pub fn start(&self, start: StartJob) -> Result<Arc<Job>, AgentError> {
        let mut jobs = self.lock();
        if let Some(existing) = jobs.get(&start.job_id) {
            let state = existing.lock().state;
            if !state.is_terminal() {
                if existing.spec == start.spec && existing.rendezvous == start.rendezvous {
                    return Ok(existing.clone());
                }
                return Err(AgentError::WrongState {
                    job_id: start.job_id,
                    state: format!("{state:?}").to_lowercase(),
                    reason: "it is running with a different spec or rendezvous; cancel it first".into(),
                });
            }
        }
        // A job asking for a GPU this agent lacks is refused here, before it gangs.
        let device = crate::device::label(&start.spec)?;
        let rendezvous = RendezvousClient::connect_lazy(&start.rendezvous, self.env.token.as_ref())
            .map_err(|e| AgentError::rendezvous(&start.rendezvous, e))?;
        let job = Job::new(
            start.job_id.clone(),
            start.spec,
            start.rendezvous,
            device,
            self.env.clone(),
            self.cancel.child_token(),
        );
        jobs.insert(start.job_id, job.clone());
        self.tracker.spawn(job.clone().run(rendezvous));
        Ok(job)
    }

    /// A job by id.
    pub fn get(&self, job_id: &str) -> Result<Arc<Job>, AgentError> {
        self.lock()
            .get(job_id)
            .cloned()
            .ok_or_else(|| AgentError::UnknownJob(job_id.to_owned()))
    }

    /// Every job.
    pub fn all(&self) -> Vec<Arc<Job>> {
        self.lock().values().cloned().collect()
    }
}
