//! Where a job runs — agents started in this process (local mode) or a
//! cluster's, behind its rendezvous — and choosing its agents there; the
//! cluster that serves a trained model ([`ServingCluster`]).

#[cfg(feature = "local")]
use std::time::{Duration, Instant};

use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::rendezvous::{AgentInfo, RendezvousClient};

use super::JobError;
#[cfg(feature = "local")]
use crate::local::LocalCluster;

/// The cluster whose agents serve a model for [`TrainedModel::transform`](super::TrainedModel::transform):
/// `fit` sets it to the cluster that trained the model; a loaded model gets
/// one with [`TrainedModel::serve_on`](super::TrainedModel::serve_on).
#[derive(Debug, Clone)]
pub struct ServingCluster {
    /// The rendezvous, whose live agents serve the model.
    pub rendezvous: String,
    /// The operator token (serving a model is an operator's call).
    pub token: Option<Token>,
    /// TLS and timeouts of the calls.
    pub channel: ChannelConfig,
    /// Agents in this process (local mode): the token may travel in the plan.
    pub local: bool,
}

/// Where the job runs.
#[derive(Clone)]
pub(super) enum Target<'a> {
    #[cfg(feature = "local")]
    Local(&'a LocalCluster),
    Remote {
        url: &'a str,
        token: Option<Token>,
    },
}

impl Target<'_> {
    pub(super) fn rendezvous(&self) -> String {
        match self {
            #[cfg(feature = "local")]
            Target::Local(c) => c.rendezvous_url(),
            Target::Remote { url, .. } => (*url).to_owned(),
        }
    }

    pub(super) fn is_local(&self) -> bool {
        #[cfg(feature = "local")]
        return matches!(self, Target::Local(_));
        #[cfg(not(feature = "local"))]
        false
    }

    /// The cluster serving the model trained here (`transform`).
    pub(super) fn serving(&self, channel: &ChannelConfig) -> ServingCluster {
        ServingCluster {
            rendezvous: self.rendezvous(),
            token: self.token(),
            channel: channel.clone(),
            local: self.is_local(),
        }
    }

    pub(super) fn token(&self) -> Option<Token> {
        match self {
            #[cfg(feature = "local")]
            Target::Local(c) => c.token().cloned(),
            Target::Remote { token, .. } => token.clone(),
        }
    }
}

/// Picks `count` live agents not in `exclude`, in a stable order. In local
/// mode a missing agent is started; on a cluster too few is an error.
#[cfg_attr(not(feature = "local"), allow(clippy::never_loop))]
pub(super) async fn pick_agents(
    rv: &RendezvousClient,
    target: &Target<'_>,
    count: usize,
    exclude: &[String],
    model: &str,
) -> Result<Vec<AgentInfo>, JobError> {
    #[cfg(feature = "local")]
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (mut live, lacking): (Vec<AgentInfo>, Vec<AgentInfo>) = rv
            .list_agents()
            .await?
            .into_iter()
            .filter(|a| !exclude.contains(&a.flight_address))
            .partition(|a| a.models.iter().any(|m| m == model));
        live.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        if live.len() >= count {
            live.truncate(count);
            return Ok(live);
        }
        // Agents without the model would only refuse the job: say what they have.
        if !lacking.is_empty() && live.len() + lacking.len() >= count {
            let mut others: Vec<String> = lacking
                .iter()
                .map(|a| format!("{} has {}", a.agent_id, a.models.join(", ")))
                .collect();
            others.sort();
            return Err(JobError::ModelUnavailable {
                model: model.to_owned(),
                needed: count as u32,
                with_model: live.len(),
                others: others.join("; "),
            });
        }
        #[cfg(feature = "local")]
        if let Target::Local(cluster) = target {
            for _ in live.len()..count {
                cluster.add_agent().await?;
            }
            if Instant::now() <= deadline {
                continue;
            }
        }
        return Err(JobError::NotEnoughAgents {
            needed: count as u32,
            live: live.len(),
            rendezvous: target.rendezvous(),
        });
    }
}

/// Stops a local-mode cluster and removes its work dir.
#[cfg(feature = "local")]
pub(super) async fn stop_local(cluster: LocalCluster, dir: &std::path::Path) {
    cluster.shutdown().await;
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::debug!(dir = %dir.display(), error = %e, "could not remove the local work dir");
    }
}
