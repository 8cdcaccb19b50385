//! A detached job grows while a follower is attached ([`JobHandle::wait`]):
//! when an epoch ends and a live agent outside the gang could join, the
//! follower asks every member what it keeps (`keep_rows`: its rows by
//! producer — the shards it holds — and the job's start), moves shards to
//! the newcomer as `fit` does ([`Growth`]), and has the members keep their
//! rows again, so that a restarted member takes back only what it holds now.

use std::collections::BTreeMap;
use std::sync::Arc;

use kindling_schemas::action::KeepRowsResponse;
use kindling_schemas::descriptor::Split;
use kindling_schemas::rendezvous::RendezvousClient;

use super::JobHandle;
use crate::feed::AgentClient;
use crate::feed::relay::shard_of;
use crate::job::JobError;
use crate::job::progress::Reporter;
use crate::job::run::{Growth, Holders, newcomer};
use crate::job::target::Target;
use crate::job::training_job::Feeding;

impl JobHandle {
    /// Grows the job (its members `named`, `seen_epochs` trained) by an
    /// agent that joined, if one did and the job may grow: it was dealt
    /// more shards than it has members (`max_slots`) and has epochs left.
    /// Returns whether it may grow at a later epoch's end.
    pub(super) async fn grow_if_joined(
        &self,
        rv: &RendezvousClient,
        named: &[String],
        reporter: &mut Reporter,
        seen_epochs: usize,
    ) -> Result<bool, JobError> {
        let agents = rv.list_agents().await?;
        if !agents.iter().any(|a| !named.contains(&a.agent_id)) {
            return Ok(true);
        }
        // A member not live is recovery's business, not growth's.
        let Some(live) = self.live_members(&agents, named)? else {
            return Ok(true);
        };
        if live.len() < named.len() {
            return Ok(true);
        }
        let mut members = Vec::with_capacity(named.len());
        for (client, id) in live.clients.into_iter().zip(live.agent_ids) {
            let kept = client.keep_rows(&self.job_id).await?;
            members.push((client, id, kept));
        }
        // Producers that are not the shards 0..k, or no shard to spare: it never grows.
        let Some(mut holders) = holders_of(&members) else {
            return Ok(false);
        };
        let start = &members[0].2.start;
        if holders.members().len() >= holders.len() || seen_epochs >= start.spec.epochs as usize {
            return Ok(false);
        }
        let target = Target::Remote {
            url: &self.rendezvous,
            token: self.token.clone(),
        };
        let Some(joined) = newcomer(rv, &target, &holders, start.spec.model.name()).await? else {
            return Ok(true);
        };
        holders = holders.starting_from(start.initial_weights.as_deref().map(Arc::from));
        let feeding = Feeding::default();
        let growth = Growth {
            rv,
            job_id: &self.job_id,
            spec: &start.spec,
            rendezvous: start.rendezvous.clone(),
            token: self.token.clone(),
            channel: &self.channel,
            window: (feeding.window_bytes, feeding.commit_bytes),
            splits: if members.iter().any(|(.., k)| k.eval.ended) {
                vec![Split::Train, Split::Eval]
            } else {
                vec![Split::Train]
            },
        };
        if growth.grow(&mut holders, reporter, joined).await? {
            keep_again(&self.job_id, &holders, reporter).await;
        }
        Ok(true)
    }
}

/// Who holds each shard, from what each member keeps: shard `s`'s rows were
/// sent as producer `shard-s`. `None` unless the members' producers are
/// exactly the shards `0..k`, each on one member.
fn holders_of(members: &[(AgentClient, String, KeepRowsResponse)]) -> Option<Holders> {
    let mut held: BTreeMap<usize, (usize, u64, u64)> = BTreeMap::new();
    for (m, (.., kept)) in members.iter().enumerate() {
        for (producer, &rows) in &kept.train.producers {
            let shard = shard_of(producer)?;
            let eval = kept.eval.producers.get(producer).copied().unwrap_or(0);
            if held.insert(shard, (m, rows, eval)).is_some() {
                return None;
            }
        }
    }
    let k = held.len();
    if k == 0 || held.keys().copied().ne(0..k) {
        return None;
    }
    let (mut clients, mut ids, mut train, mut eval) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (m, rows, eval_rows) in held.into_values() {
        clients.push(members[m].0.clone());
        ids.push(members[m].1.clone());
        train.push(rows);
        eval.push(eval_rows);
    }
    Some(Holders::held(clients, ids, [train, eval]))
}

/// Every member of the grown gang keeps its rows again (the newcomer its
/// first copy): one that cannot is said, and would not take its place again
/// if restarted.
async fn keep_again(job_id: &str, holders: &Holders, reporter: &mut Reporter) {
    let (mut rows, mut bytes) = (0, 0);
    for s in holders.members() {
        match holders.clients[s].keep_rows(job_id).await {
            Ok(kept) => (rows, bytes) = (rows + kept.rows, bytes + kept.bytes),
            Err(e) => {
                let agent = &holders.agent_ids[s];
                tracing::warn!(%agent, error = %e, "rows not kept again after the growth");
                reporter.note(&format!(
                    "agent {agent} could not keep its rows on its disk again ({e}): restarted, it would \
                     not take its place in the job"
                ));
            }
        }
    }
    reporter.note(&format!(
        "{rows} rows kept again on the agents' disks ({:.1} MB)",
        bytes as f64 / 1e6
    ));
}
