//! Where a run's rows come from — fed to it, or held on the agents for a
//! search's trials — and the held dataset as the client sees it: who holds
//! it, whether it is fed, which lost agents' shards are held again. Below
//! both `fit` and `search`.

use std::collections::BTreeSet;
use std::time::Duration;

use kindling_schemas::rendezvous::{AgentInfo, RendezvousClient};
use tokio::sync::{mpsc, watch};

use super::JobError;
use super::event::TrainingEvent;
use crate::feed::relay::Rows;

/// Where a job's rows come from.
#[derive(Clone, Copy)]
pub(super) enum Source<'r, 'a> {
    /// Fed to the job: the train rows, and the eval rows if any.
    Fed(&'r Rows<'a>, Option<&'r Rows<'a>>),
    /// A dataset held on the agents (a search's trial).
    Held(&'r Held),
}

/// The dataset a search's trials read, as its follower last saw it.
#[derive(Debug, Clone, Default)]
pub(super) struct HeldState {
    /// Flight URLs of the agents holding its shards, at its start.
    pub urls: Vec<String>,
    /// Every split landed.
    pub fed: bool,
    /// Agents lost whose shards are held again (by replacements or the
    /// remaining agents).
    pub recovered: BTreeSet<String>,
}

/// The rows of a search's dataset job, held on its agents.
#[derive(Debug)]
pub(super) struct Held {
    pub job_id: String,
    pub state: watch::Receiver<HeldState>,
}

impl Held {
    /// The agents a trial starts on: the dataset's gang members now (its
    /// first agents until its gang formed).
    pub async fn agents(&self, rv: &RendezvousClient) -> Result<Vec<AgentInfo>, JobError> {
        let members = rv.status(&self.job_id).await?.members;
        let urls = self.state.borrow().urls.clone();
        let live = rv.list_agents().await?;
        let found: Vec<AgentInfo> = match members.is_empty() {
            false => members
                .iter()
                .filter_map(|id| live.iter().find(|a| &a.agent_id == id).cloned())
                .collect(),
            true => urls
                .iter()
                .filter_map(|u| live.iter().find(|a| &a.flight_address == u).cloned())
                .collect(),
        };
        if found.is_empty() {
            return Err(JobError::TrainingFailed {
                job_id: self.job_id.clone(),
                cause: "no live agent holds the dataset".into(),
            });
        }
        Ok(found)
    }

    /// Waits until the dataset's follower has placed the shards of every
    /// agent in `lost` again (at most `wait` plus a minute).
    pub async fn recovered(&self, lost: &[String], wait: Duration) -> Result<(), JobError> {
        let mut state = self.state.clone();
        let done = state.wait_for(|s| lost.iter().all(|l| s.recovered.contains(l)));
        match tokio::time::timeout(wait + Duration::from_secs(60), done).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(JobError::TrainingFailed {
                job_id: self.job_id.clone(),
                cause: "the dataset's follower ended".into(),
            }),
            Err(_) => Err(JobError::TrainingFailed {
                job_id: self.job_id.clone(),
                cause: format!("the dataset did not recover from losing {}", lost.join(", ")),
            }),
        }
    }
}

/// Follows the dataset's events: who holds it, when it is fed, which lost
/// agents' shards are held again; the application's channel gets them too.
pub(super) async fn follow_dataset(
    mut received: mpsc::Receiver<TrainingEvent>,
    state: watch::Sender<HeldState>,
    app: Option<mpsc::Sender<TrainingEvent>>,
) {
    while let Some(event) = received.recv().await {
        state.send_modify(|s| match &event {
            TrainingEvent::Started { agents, .. } => s.urls = agents.clone(),
            TrainingEvent::Fed { split: "train", .. } => s.fed = true,
            TrainingEvent::Recovering { lost, .. } => s.recovered.extend(lost.iter().cloned()),
            _ => {}
        });
        if let Some(app) = &app {
            let _ = app.try_send(event);
        }
    }
}

/// `fit_arrow` with executor push: there is no DataFrame for the executors to push.
pub(super) fn arrow_source_pushed() -> JobError {
    JobError::Setting {
        setting: "feed",
        reason: "fit_arrow feeds from this process: executor push needs a DataFrame (use fit)".into(),
    }
}
