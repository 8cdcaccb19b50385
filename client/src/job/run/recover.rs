//! Following a job at the rendezvous and recovering from lost agents: who
//! holds each shard, replacements, elastic shrink.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kindling_schemas::descriptor::Split;
use kindling_schemas::rendezvous::{
    AgentInfo, JobState, JobStatus, MemberReport, RendezvousClient, ReportWatch,
};

use super::target::{Target, pick_agents};
use super::{JobError, TrainingJob};
use crate::feed::AgentClient;
use crate::feed::relay::Shards;

/// How often the rendezvous is asked for agents while waiting for a replacement.
const POLL: Duration = Duration::from_millis(200);
/// Pause before re-opening a watch stream the rendezvous ended without a final state.
const REOPEN: Duration = Duration::from_millis(100);
/// The id under which `fit` reports a failure to the rendezvous.
const CLIENT_REPORTER: &str = "kindling-client";

/// Who holds each shard: shard `s` lives on `clients[s]` (`agent_ids[s]`).
/// One shard per agent, until an elastic shrink hands a lost agent's shards
/// to survivors, which then hold several.
pub(super) struct Holders {
    pub clients: Vec<AgentClient>,
    pub agent_ids: Vec<String>,
    /// Rows each shard holds, as last fed: train, eval.
    rows: [Vec<u64>; 2],
    /// The initial weights (`init_from`) every agent starting the job gets,
    /// a replacement too.
    pub initial: Option<Arc<str>>,
}

fn split_index(split: Split) -> usize {
    match split {
        Split::Train => 0,
        Split::Eval => 1,
    }
}

impl Holders {
    pub fn new(clients: Vec<AgentClient>, agent_ids: Vec<String>) -> Self {
        let n = clients.len();
        Holders {
            clients,
            agent_ids,
            rows: [vec![0; n], vec![0; n]],
            initial: None,
        }
    }

    /// With the initial weights every agent of the job starts from.
    pub fn starting_from(self, initial: Option<Arc<str>>) -> Self {
        Holders { initial, ..self }
    }

    /// The shards to feed (`only`: just these).
    pub fn shards<'a>(&'a self, only: Option<&'a [usize]>) -> Shards<'a> {
        Shards {
            clients: &self.clients,
            agent_ids: &self.agent_ids,
            only,
        }
    }

    /// The first shard of each agent, in shard order: one per gang member.
    pub fn members(&self) -> Vec<usize> {
        let mut seen = HashSet::new();
        (0..self.agent_ids.len())
            .filter(|&s| seen.insert(self.agent_ids[s].as_str()))
            .collect()
    }

    /// Every agent's client, once.
    pub fn member_clients(&self) -> Vec<AgentClient> {
        self.members()
            .into_iter()
            .map(|s| self.clients[s].clone())
            .collect()
    }

    /// The shards `agent_id` holds.
    pub fn shards_of(&self, agent_id: &str) -> Vec<usize> {
        (0..self.agent_ids.len())
            .filter(|&s| self.agent_ids[s] == agent_id)
            .collect()
    }

    /// Records the rows a feed of `split` put into the shards it fed.
    pub fn record(&mut self, split: Split, rows: &[u64], fed: impl Fn(usize) -> bool) {
        let held = &mut self.rows[split_index(split)];
        for (s, &r) in rows.iter().enumerate() {
            if fed(s) {
                held[s] = r;
            }
        }
    }

    /// The rows of `split` the holder of shard `shard` must have committed:
    /// those of every shard it holds.
    pub fn agent_rows(&self, split: Split, shard: usize) -> u64 {
        let held = &self.rows[split_index(split)];
        self.shards_of(&self.agent_ids[shard])
            .into_iter()
            .map(|s| held[s])
            .sum()
    }

    fn assign(&mut self, shard: usize, client: AgentClient, agent_id: String) {
        self.clients[shard] = client;
        self.agent_ids[shard] = agent_id;
    }
}

/// The job's state at the rendezvous and what its agents report of it, from
/// its `Watch` stream with reports: each change as it happens, instead of
/// asking the rendezvous and every agent again and again. A stream that breaks
/// (a rendezvous restart) is opened again; opening retries within the
/// client's outage bound, past which the error is returned.
pub(super) struct Follow {
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

/// What a recovery did.
pub(super) struct Recovery {
    /// The shards to feed again, each to its new holder.
    pub resent: Vec<usize>,
    /// After an elastic shrink: the gang's new size (the shards must be fed
    /// before [`TrainingJob::shrink`] lets the survivors form the gang).
    pub shrunk_to: Option<u32>,
}

impl TrainingJob {
    /// The `lost` agents' shards find new holders: a replacement agent each
    /// (a spare, or one that registers within `replacement_wait`), or — past
    /// the wait, when at least `min_slots` agents remain — the surviving
    /// members (elastic shrink), round-robin. Before a shrink the attempt the
    /// lost agents were in is failed at the rendezvous (if it is not yet), so
    /// no survivor is still training when its new rows arrive.
    pub(super) async fn reassign(
        &self,
        rv: &RendezvousClient,
        target: &Target<'_>,
        job_id: &str,
        holders: &mut Holders,
        lost: &[String],
    ) -> Result<Recovery, JobError> {
        let lost_shards: Vec<Vec<usize>> = lost.iter().map(|id| holders.shards_of(id)).collect();
        let survivors: Vec<usize> = holders
            .members()
            .into_iter()
            .filter(|&s| !lost.contains(&holders.agent_ids[s]))
            .collect();
        let survivor_urls = survivors
            .iter()
            .map(|&s| holders.clients[s].url().to_owned())
            .collect();
        let found = self
            .replacements(
                rv,
                target,
                job_id,
                lost,
                (survivor_urls, survivors.len()),
                holders.initial.as_deref(),
            )
            .await?;
        let mut found = found.into_iter();
        let mut orphans = Vec::new();
        for shards in &lost_shards {
            match found.next() {
                Some((agent, client)) => {
                    for &s in shards {
                        tracing::info!(shard = s, lost = %holders.agent_ids[s], replacement = %agent.agent_id, "agent replaced");
                        holders.assign(s, client.clone(), agent.agent_id.clone());
                    }
                }
                None => orphans.extend(shards.iter().copied()),
            }
        }
        let mut resent: Vec<usize> = lost_shards.concat();
        resent.sort_unstable();
        if orphans.is_empty() {
            return Ok(Recovery {
                resent,
                shrunk_to: None,
            });
        }
        // Elastic shrink: the members that remain take the orphaned shards.
        let takers: Vec<usize> = holders
            .members()
            .into_iter()
            .filter(|s| !orphans.contains(s))
            .collect();
        for (i, &s) in orphans.iter().enumerate() {
            let t = takers[i % takers.len()];
            let (client, id) = (holders.clients[t].clone(), holders.agent_ids[t].clone());
            tracing::info!(shard = s, lost = %holders.agent_ids[s], taken_by = %id, "shard taken over");
            holders.assign(s, client, id);
        }
        let world = takers.len() as u32;
        let status = rv.status(job_id).await?;
        if status.state == JobState::Running {
            let cause = format!(
                "agent(s) {} lost; {world} remaining agent(s) take over their shards",
                lost.join(", ")
            );
            rv.report_failure(job_id, status.attempt, CLIENT_REPORTER, &cause)
                .await?;
        }
        Ok(Recovery {
            resent,
            shrunk_to: Some(world),
        })
    }

    /// Lets the current attempt form with `world` members (once the
    /// survivors hold every shard), and every later attempt.
    pub(super) async fn shrink(
        &self,
        rv: &RendezvousClient,
        job_id: &str,
        world: u32,
    ) -> Result<u32, JobError> {
        let mut tries = 0;
        loop {
            let status = rv.status(job_id).await?;
            if status.state.is_terminal() {
                return Err(JobError::TrainingFailed {
                    job_id: job_id.to_owned(),
                    cause: status.first_cause().unwrap_or("cancelled").to_owned(),
                });
            }
            match rv.resize_job(job_id, status.attempt, world).await {
                Ok(_) => return Ok(status.attempt),
                // The attempt moved on meanwhile (a gang timeout): shrink the new one.
                Err(e) if e.current_attempt().is_some() && tries < 3 => tries += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Up to one replacement per `lost` agent started on the job: spare live
    /// agents, else — waiting up to `replacement_wait` — agents that
    /// register meanwhile (the lost agent restarted on its node, as a
    /// DaemonSet does, or a new one). `survivors` (members' URLs) are never
    /// picked. A listed agent that cannot take the job (its process is gone
    /// but its lease has not lapsed yet) is passed over and asked again
    /// later. Past the wait, fewer than asked are returned when the
    /// `remaining` members and they make at least `min_slots`; else
    /// [`JobError::NoReplacement`].
    async fn replacements(
        &self,
        rv: &RendezvousClient,
        target: &Target<'_>,
        job_id: &str,
        lost: &[String],
        (survivors, remaining): (Vec<String>, usize),
        initial: Option<&str>,
    ) -> Result<Vec<(AgentInfo, AgentClient)>, JobError> {
        let count = lost.len();
        let deadline = Instant::now() + self.recovery.replacement_wait;
        let token = target.token();
        let mut found: Vec<(AgentInfo, AgentClient)> = Vec::with_capacity(count);
        let mut unreachable: Vec<String> = Vec::new();
        let mut announced = false;
        while found.len() < count {
            let mut exclude = survivors.clone();
            exclude.extend(found.iter().map(|(a, _)| a.flight_address.clone()));
            exclude.extend(unreachable.iter().cloned());
            let picked = pick_agents(rv, target, count - found.len(), &exclude, self.spec.model.name()).await;
            let candidates = match picked {
                Ok(candidates) => candidates,
                Err(JobError::NotEnoughAgents { live, .. }) => {
                    if Instant::now() >= deadline {
                        if remaining > 0 && remaining + found.len() >= self.min_slots() as usize {
                            tracing::warn!(lost = ?lost, remaining, "no replacement: the remaining agents take over");
                            return Ok(found);
                        }
                        return Err(JobError::NoReplacement {
                            lost: lost.join(", "),
                            waited: self.recovery.replacement_wait,
                            live,
                            survivors: remaining,
                            min_slots: self.min_slots(),
                            rendezvous: target.rendezvous(),
                        });
                    }
                    if !announced {
                        tracing::warn!(lost = ?lost, wait = ?self.recovery.replacement_wait, "no spare agent: waiting for a replacement");
                        announced = true;
                    }
                    unreachable.clear();
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            for a in candidates {
                let c =
                    AgentClient::connect_with(&a.flight_address, token.as_ref(), &self.placement.channel)?;
                match c
                    .start_job_from(job_id, &self.spec, &target.rendezvous(), initial)
                    .await
                {
                    Ok(_) => found.push((a, c)),
                    Err(e) if e.is_retryable() => {
                        tracing::debug!(agent = %a.agent_id, error = %e, "listed agent cannot take the job yet");
                        unreachable.push(a.flight_address);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(found)
    }
}
