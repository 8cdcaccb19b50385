//! Recovery's one home: a run's lost agents replaced (their shards fed
//! again) or, past the wait, the gang shrunk onto the survivors.

use std::time::{Duration, Instant};

use kindling_schemas::rendezvous::{AgentInfo, JobState};

use super::Run;
use crate::feed::AgentClient;
use crate::job::JobError;
use crate::job::event::TrainingEvent;
use crate::job::source::Source;
use crate::job::target::pick_agents;

/// How often the rendezvous is asked for agents while waiting for a replacement.
const POLL: Duration = Duration::from_millis(200);
/// The id under which `fit` reports a failure to the rendezvous.
const CLIENT_REPORTER: &str = "kindling-client";

/// What a reassignment did.
struct Recovery {
    /// The shards to feed again, each to its new holder.
    resent: Vec<usize>,
    /// After an elastic shrink: the gang's new size (the shards must be fed
    /// before [`Run::shrink`] lets the survivors form the gang).
    shrunk_to: Option<u32>,
}

impl Run<'_, '_> {
    /// Recovers from losing the `lost` agents: their shards find new
    /// holders ([`Run::reassign`]), are fed again (a held dataset's own
    /// follower re-feeds its lost shards: waited for), and after an
    /// elastic shrink the survivors form the gang.
    pub(super) async fn recover(&mut self, lost: &[String]) -> Result<(), JobError> {
        let recovery = self.reassign(lost).await?;
        self.guard.clients = self.holders.member_clients();
        self.feed(Some(recovery.resent.as_slice())).await?;
        if let Source::Held(held) = self.source {
            held.recovered(lost, self.job.recovery.replacement_wait).await?;
        }
        let attempt = match recovery.shrunk_to {
            Some(world) => {
                let attempt = self.shrink(world).await?;
                self.reporter.emit(TrainingEvent::Shrunk {
                    lost: lost.to_vec(),
                    world_size: world,
                });
                attempt
            }
            None => self.rv.status(&self.job_id).await?.attempt,
        };
        self.reporter.emit(TrainingEvent::Recovering {
            attempt,
            resent_shards: recovery.resent,
            lost: lost.to_vec(),
        });
        Ok(())
    }

    /// The `lost` agents' shards find new holders: a replacement agent each
    /// (a spare, or one that registers within `replacement_wait`), or — past
    /// the wait, when at least `min_slots` agents remain — the surviving
    /// members (elastic shrink), round-robin. Before a shrink the attempt the
    /// lost agents were in is failed at the rendezvous (if it is not yet), so
    /// no survivor is still training when its new rows arrive.
    async fn reassign(&mut self, lost: &[String]) -> Result<Recovery, JobError> {
        let holders = &self.holders;
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
        let remaining = survivors.len();
        let found = self.replacements(lost, (survivor_urls, remaining)).await?;
        let holders = &mut self.holders;
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
        let (rv, job_id) = (&self.rv, self.job_id.as_str());
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
    async fn shrink(&self, world: u32) -> Result<u32, JobError> {
        let (rv, job_id) = (&self.rv, self.job_id.as_str());
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
        lost: &[String],
        (survivors, remaining): (Vec<String>, usize),
    ) -> Result<Vec<(AgentInfo, AgentClient)>, JobError> {
        let (job, rv, target, job_id) = (self.job, &self.rv, &self.target, self.job_id.as_str());
        let initial = self.holders.initial.as_deref();
        let count = lost.len();
        let deadline = Instant::now() + job.recovery.replacement_wait;
        let token = target.token();
        let mut found: Vec<(AgentInfo, AgentClient)> = Vec::with_capacity(count);
        let mut unreachable: Vec<String> = Vec::new();
        let mut announced = false;
        while found.len() < count {
            let mut exclude = survivors.clone();
            exclude.extend(found.iter().map(|(a, _)| a.flight_address.clone()));
            exclude.extend(unreachable.iter().cloned());
            let picked = pick_agents(rv, target, count - found.len(), &exclude, job.spec.model.name()).await;
            let candidates = match picked {
                Ok(candidates) => candidates,
                Err(JobError::NotEnoughAgents { live, .. }) => {
                    if Instant::now() >= deadline {
                        if remaining > 0 && remaining + found.len() >= job.min_slots() as usize {
                            tracing::warn!(lost = ?lost, remaining, "no replacement: the remaining agents take over");
                            return Ok(found);
                        }
                        return Err(JobError::NoReplacement {
                            lost: lost.join(", "),
                            waited: job.recovery.replacement_wait,
                            live,
                            survivors: remaining,
                            min_slots: job.min_slots(),
                            rendezvous: target.rendezvous(),
                        });
                    }
                    if !announced {
                        tracing::warn!(lost = ?lost, wait = ?job.recovery.replacement_wait, "no spare agent: waiting for a replacement");
                        announced = true;
                    }
                    unreachable.clear();
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            for a in candidates {
                let c = AgentClient::connect_with(&a.flight_address, token.as_ref(), &job.placement.channel)?;
                match c
                    .start_job_from(job_id, &job.spec, &target.rendezvous(), initial)
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
