//! Elastic growth: an agent that registers while the job trains joins it at
//! an epoch's end. The rendezvous ends the running attempt and re-forms the
//! gang one larger; some shards move to the newcomer — read from the agent
//! holding them and put into the newcomer by this process, under the same
//! producer names and sequence numbers, then dropped where they were — so
//! every row stays on exactly one agent and no Spark query runs again.

use futures::TryStreamExt;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::{AgentInfo, JobState};

use super::Run;
use crate::feed::relay::producer_of;
use crate::feed::{AgentClient, FeedError};
use crate::job::JobError;
use crate::job::event::TrainingEvent;
use crate::job::source::Source;
use crate::job::target::pick_agents;

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

    /// A live agent that is not a member and has the job's model, if one
    /// registered ([`pick_agents`]'s choice; never a local cluster's, which
    /// does not grow).
    pub(super) async fn newcomer(&self) -> Result<Option<AgentInfo>, JobError> {
        let members: Vec<String> = self
            .holders
            .member_clients()
            .iter()
            .map(|c| c.url().to_owned())
            .collect();
        let model = self.job.spec.model.name();
        match pick_agents(&self.rv, &self.target, 1, &members, model).await {
            Ok(picked) => Ok(picked.into_iter().next()),
            Err(JobError::NotEnoughAgents { .. } | JobError::ModelUnavailable { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Grows the gang by `newcomer`: the running attempt ends at the
    /// rendezvous (the members resume from the epoch's checkpoint in the
    /// next, one larger), the members giving shards reopen their splits so
    /// no epoch starts without the move, the newcomer starts the job, the
    /// shards move, and every split ends again with its rows checked. A
    /// newcomer that cannot take the job leaves the gang as it was.
    pub(super) async fn grow(&mut self, newcomer: AgentInfo) -> Result<(), JobError> {
        let (job, job_id) = (self.job, self.job_id.clone());
        let status = self.rv.status(&job_id).await?;
        let moved = self.holders.shards_for_newcomer();
        if status.state != JobState::Running || moved.is_empty() {
            return Ok(());
        }
        let world = self.holders.members().len() as u32;
        let token = self.target.token();
        let client =
            AgentClient::connect_with(&newcomer.flight_address, token.as_ref(), &job.placement.channel)?;
        self.rv.resize_job(&job_id, status.attempt, world + 1).await?;
        let splits = self.fed_splits();
        let donors = self.donors_of(&moved);
        for &split in &splits {
            for &d in &donors {
                self.holders.clients[d].reopen_split(&job_id, split).await?;
            }
        }
        let started = client
            .start_job_from(
                &job_id,
                &job.spec,
                &self.target.rendezvous(),
                self.holders.initial.as_deref(),
            )
            .await;
        if let Err(e) = started {
            let agent = &newcomer.agent_id;
            tracing::warn!(%agent, error = %e, "the newcomer cannot take the job: the gang stays as it was");
            self.reporter.note(&format!(
                "agent {agent} joined but cannot take the job ({e}): the job goes on as it was"
            ));
            let attempt = self.rv.status(&job_id).await?.attempt;
            self.rv.resize_job(&job_id, attempt, world).await?;
            return self.end_splits(&splits, &donors, &[]).await;
        }
        for &split in &splits {
            for &s in &moved {
                self.move_shard(split, s, &client).await?;
            }
        }
        for &s in &moved {
            tracing::info!(shard = s, from = %self.holders.agent_ids[s], to = %newcomer.agent_id, "shard moved");
            self.holders.assign(s, client.clone(), newcomer.agent_id.clone());
        }
        self.guard.clients = self.holders.member_clients();
        let mut ending = donors;
        ending.push(moved[0]);
        self.end_splits(&splits, &ending, &moved).await?;
        self.reporter.emit(TrainingEvent::Grown {
            joined: newcomer.agent_id,
            world_size: world + 1,
            moved_shards: moved,
        });
        Ok(())
    }

    /// The splits this run fed rows into.
    fn fed_splits(&self) -> Vec<Split> {
        match self.source {
            Source::Fed(_, Some(_)) => vec![Split::Train, Split::Eval],
            _ => vec![Split::Train],
        }
    }

    /// One shard of each member holding any of `shards`.
    fn donors_of(&self, shards: &[usize]) -> Vec<usize> {
        let holders = &self.holders;
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

    /// Copies shard `shard`'s rows of `split` from its holder into `to`,
    /// under the shard's producer name: `to` commits them in the same order
    /// and with the same sequence numbers, so its epochs order them alike.
    async fn move_shard(&self, split: Split, shard: usize, to: &AgentClient) -> Result<(), JobError> {
        let producer = producer_of(shard);
        let from = &self.holders.clients[shard];
        let expected = self.holders.shard_rows(split, shard);
        let mut rows = Box::pin(from.rows_of(&self.job_id, split, &producer).await?);
        let mut writer = None;
        while let Some(batch) = rows.try_next().await? {
            let w = writer.get_or_insert_with(|| {
                let path = DataPath::data(&self.job_id, split);
                let feeding = &self.job.feeding;
                to.put_committing(
                    &path,
                    producer.clone(),
                    batch.schema(),
                    feeding.window_bytes,
                    feeding.commit_bytes,
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
    async fn end_splits(&self, splits: &[Split], shards: &[usize], moved: &[usize]) -> Result<(), JobError> {
        let holders = &self.holders;
        let gone: Vec<String> = moved.iter().map(|&s| producer_of(s)).collect();
        for &split in splits {
            for &s in shards {
                let client = &holders.clients[s];
                let keeps = holders.shards_of(&holders.agent_ids[s]);
                if !keeps.iter().any(|k| moved.contains(k)) && !gone.is_empty() {
                    client.drop_rows(&self.job_id, split, &gone).await?;
                }
                let expected = holders.agent_rows(split, s);
                client.end_of_data(&self.job_id, split, Some(expected)).await?;
            }
        }
        Ok(())
    }
}
