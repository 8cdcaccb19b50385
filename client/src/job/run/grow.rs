//! Elastic growth: an agent that registers while the job trains joins it at
//! an epoch's end. The rendezvous ends the running attempt and re-forms the
//! gang one larger; some shards move to the newcomer — read from the agent
//! holding them and put into the newcomer by this process, under the same
//! producer names and sequence numbers, then dropped where they were — so
//! every row stays on exactly one agent and no Spark query runs again.
//! [`Growth`] is the move itself, shared by `fit`'s run and the follower of
//! a detached job (`JobHandle::wait`).

use futures::TryStreamExt;
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::{AgentInfo, JobState, RendezvousClient};
use kindling_schemas::spec::JobSpec;

use super::Run;
use super::holders::Holders;
use crate::feed::relay::producer_of;
use crate::feed::{AgentClient, FeedError};
use crate::job::JobError;
use crate::job::event::TrainingEvent;
use crate::job::progress::Reporter;
use crate::job::source::Source;
use crate::job::target::{Target, pick_agents};

impl Run<'_, '_> {
    /// Whether the job may grow now: it is fed by this process (not a
    /// trial on a held dataset, not local), has fewer members than
    /// `max_slots` and epochs left to train.
    pub(super) fn may_grow(&self) -> bool {
        matches!(self.source, Source::Fed(..))
            && !self.target.is_local()
            && self.holders.members().len() < self.job.max_slots() as usize
            && self.seen_epochs < self.job.spec.epochs as usize
    }

    /// Grows the gang by `newcomer` ([`Growth::grow`]).
    pub(super) async fn grow(&mut self, newcomer: AgentInfo) -> Result<(), JobError> {
        let job = self.job;
        let growth = Growth {
            rv: &self.rv,
            job_id: &self.job_id,
            spec: &job.spec,
            rendezvous: self.target.rendezvous(),
            token: self.target.token(),
            channel: &job.placement.channel,
            window: (job.feeding.window_bytes, job.feeding.commit_bytes),
            splits: match self.source {
                Source::Fed(_, Some(_)) => vec![Split::Train, Split::Eval],
                _ => vec![Split::Train],
            },
        };
        growth
            .grow(&mut self.holders, &mut self.reporter, newcomer)
            .await?;
        self.guard.clients = self.holders.member_clients();
        Ok(())
    }
}

/// A live agent that is not one of `holders`' members and has `model`, if
/// one registered ([`pick_agents`]'s choice; never a local cluster's, which
/// does not grow).
pub(in crate::job) async fn newcomer(
    rv: &RendezvousClient,
    target: &Target<'_>,
    holders: &Holders,
    model: &str,
) -> Result<Option<AgentInfo>, JobError> {
    let members: Vec<String> = holders
        .member_clients()
        .iter()
        .map(|c| c.url().to_owned())
        .collect();
    match pick_agents(rv, target, 1, &members, model).await {
        Ok(picked) => Ok(picked.into_iter().next()),
        Err(JobError::NotEnoughAgents { .. } | JobError::ModelUnavailable { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What moving shards to an agent that joins needs, whoever follows the job.
pub(in crate::job) struct Growth<'g> {
    pub rv: &'g RendezvousClient,
    pub job_id: &'g str,
    /// What the newcomer trains.
    pub spec: &'g JobSpec,
    /// The rendezvous, as the agents reach it.
    pub rendezvous: String,
    pub token: Option<Token>,
    pub channel: &'g ChannelConfig,
    /// The feed's window and commit sizes, in bytes.
    pub window: (usize, usize),
    /// The splits fed rows.
    pub splits: Vec<Split>,
}

impl Growth<'_> {
    /// Grows the gang by `newcomer`: the running attempt ends at the
    /// rendezvous (the members resume from the epoch's checkpoint in the
    /// next, one larger), the members giving shards reopen their splits so
    /// no epoch starts without the move, the newcomer starts the job, the
    /// shards move, and every split ends again with its rows checked. A
    /// newcomer that cannot take the job leaves the gang as it was. Returns
    /// whether the gang grew.
    pub async fn grow(
        &self,
        holders: &mut Holders,
        reporter: &mut Reporter,
        newcomer: AgentInfo,
    ) -> Result<bool, JobError> {
        let job_id = self.job_id;
        let status = self.rv.status(job_id).await?;
        let moved = holders.shards_for_newcomer();
        if status.state != JobState::Running || moved.is_empty() {
            return Ok(false);
        }
        let world = holders.members().len() as u32;
        let client = AgentClient::connect_with(&newcomer.flight_address, self.token.as_ref(), self.channel)?;
        self.rv.resize_job(job_id, status.attempt, world + 1).await?;
        let donors = donors_of(holders, &moved);
        for &split in &self.splits {
            for &d in &donors {
                holders.clients[d].reopen_split(job_id, split).await?;
            }
        }
        let started = client
            .start_job_from(job_id, self.spec, &self.rendezvous, holders.initial.as_deref())
            .await;
        if let Err(e) = started {
            let agent = &newcomer.agent_id;
            tracing::warn!(%agent, error = %e, "the newcomer cannot take the job: the gang stays as it was");
            reporter.note(&format!(
                "agent {agent} joined but cannot take the job ({e}): the job goes on as it was"
            ));
            let attempt = self.rv.status(job_id).await?.attempt;
            self.rv.resize_job(job_id, attempt, world).await?;
            self.end_splits(holders, &donors, &[]).await?;
            return Ok(false);
        }
        for &split in &self.splits {
            for &s in &moved {
                self.move_shard(holders, split, s, &client).await?;
            }
        }
        for &s in &moved {
            tracing::info!(shard = s, from = %holders.agent_ids[s], to = %newcomer.agent_id, "shard moved");
            holders.assign(s, client.clone(), newcomer.agent_id.clone());
        }
        let mut ending = donors;
        ending.push(moved[0]);
        self.end_splits(holders, &ending, &moved).await?;
        reporter.emit(TrainingEvent::Grown {
            joined: newcomer.agent_id,
            world_size: world + 1,
            moved_shards: moved,
        });
        Ok(true)
    }

    /// Copies shard `shard`'s rows of `split` from its holder into `to`,
    /// under the shard's producer name: `to` commits them in the same order
    /// and with the same sequence numbers, so its epochs order them alike.
    async fn move_shard(
        &self,
        holders: &Holders,
        split: Split,
        shard: usize,
        to: &AgentClient,
    ) -> Result<(), JobError> {
        let producer = producer_of(shard);
        let from = &holders.clients[shard];
        let expected = holders.shard_rows(split, shard);
        let mut rows = Box::pin(from.rows_of(self.job_id, split, &producer).await?);
        let mut writer = None;
        while let Some(batch) = rows.try_next().await? {
            let w = writer.get_or_insert_with(|| {
                let path = DataPath::data(self.job_id, split);
                to.put_committing(
                    &path,
                    producer.clone(),
                    batch.schema(),
                    self.window.0,
                    self.window.1,
                )
            });
            w.write(&batch).await?;
        }
        let committed = match writer {
            Some(w) => w.finish().await?.rows_committed,
            None => 0,
        };
        if committed != expected {
            return Err(FeedError::RowMismatch {
                shard,
                agent: to.url().to_owned(),
                sent: expected,
                committed,
            }
            .into());
        }
        Ok(())
    }

    /// Ends every split on the holders of `shards` (one shard each), each
    /// checked to hold exactly the rows of the shards it holds now; the rows
    /// of the `moved` shards go from wherever else they were first.
    async fn end_splits(&self, holders: &Holders, shards: &[usize], moved: &[usize]) -> Result<(), JobError> {
        let gone: Vec<String> = moved.iter().map(|&s| producer_of(s)).collect();
        for &split in &self.splits {
            for &s in shards {
                let client = &holders.clients[s];
                let keeps = holders.shards_of(&holders.agent_ids[s]);
                if !keeps.iter().any(|k| moved.contains(k)) && !gone.is_empty() {
                    client.drop_rows(self.job_id, split, &gone).await?;
                }
                let expected = holders.agent_rows(split, s);
                client.end_of_data(self.job_id, split, Some(expected)).await?;
            }
        }
        Ok(())
    }
}

/// One shard of each member holding any of `shards`.
fn donors_of(holders: &Holders, shards: &[usize]) -> Vec<usize> {
    holders
        .members()
        .into_iter()
        .filter(|&m| {
            shards
                .iter()
                .any(|&s| holders.agent_ids[s] == holders.agent_ids[m])
        })
        .collect()
}
