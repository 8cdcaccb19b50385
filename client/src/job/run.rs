//! One run of a job on its agents, from the gang's start to the trained
//! model: [`Run`] owns the run's state — its rendezvous client, who holds
//! each shard, the cancel guard, the executor-push placements, the
//! reporter, the epochs seen — and runs it: `feed`, `follow`, `recover`
//! (lost agents replaced or the gang shrunk), `grow` (agents that join),
//! `finish`. Rooms: `holders` (who holds each shard) · `watched` (the job
//! as the rendezvous's watch shows it) · `recover` (recovery's one home) ·
//! `grow` (growth's) · this file.

mod grow;
mod holders;
mod recover;
mod watched;

use std::sync::Arc;
use std::time::Instant;

use kindling_schemas::action::{AgentJobState, AgentJobStatus};
use kindling_schemas::auth::Token;
use kindling_schemas::descriptor::Split;
use kindling_schemas::rendezvous::{AgentInfo, JobConfig, JobLease, JobState, RendezvousClient};
use kindling_schemas::schema::FeatureLayout;

use super::event::TrainingEvent;
use super::progress::Reporter;
use super::source::{Source, arrow_source_pushed};
use super::target::{Target, pick_agents};
use super::{Feed, JobError, TrainedModel, TrainingJob};
use crate::feed::push::{self, Placements, PushCtx};
use crate::feed::relay::{self, Rows, Window};
use crate::feed::{AgentClient, PushedPartition};
pub(super) use grow::{Growth, newcomer};
pub(super) use holders::Holders;
pub(super) use watched::{Seen, Watcher};

/// Cancels the job at the rendezvous and on its agents unless disarmed, so a
/// client that goes away (error, cancelled future) leaves nothing running.
struct CancelGuard {
    rv: RendezvousClient,
    job_id: String,
    clients: Vec<AgentClient>,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rv = self.rv.clone();
        let job_id = self.job_id.clone();
        let clients = std::mem::take(&mut self.clients);
        handle.spawn(async move {
            const REASON: &str = "the client stopped";
            let _ = rv.cancel(&job_id, REASON).await;
            for c in clients {
                let _ = c.cancel_job(&job_id, REASON).await;
            }
        });
    }
}

/// One run of a job: started on its agents by [`Run::start`], then fed,
/// followed (and recovered) to its end, and finished into the model.
pub(super) struct Run<'r, 'a> {
    job: &'r TrainingJob,
    target: Target<'r>,
    source: Source<'r, 'a>,
    job_id: String,
    token: Option<Token>,
    rv: RendezvousClient,
    /// Who holds each shard.
    holders: Holders,
    /// Where executor push placed each partition.
    placed: Placements,
    /// Epochs already reported.
    seen_epochs: usize,
    // Dropped in this order: the guard cancels the job (unless disarmed),
    // then the lease stops being renewed, then the reporter's channel ends.
    guard: CancelGuard,
    /// Renewed while the run lives; if the process dies, the job is
    /// cancelled when the lease lapses (the guard cannot run then).
    _lease: JobLease,
    reporter: Reporter,
}

impl<'r, 'a> Run<'r, 'a> {
    /// Creates `job_id` at `target`'s rendezvous and starts it on its
    /// agents (a trial on those holding its dataset), each from the
    /// `initial` weights when the job has them.
    pub async fn start(
        job: &'r TrainingJob,
        target: Target<'r>,
        source: Source<'r, 'a>,
        job_id: String,
        mut reporter: Reporter,
        initial: Option<Arc<str>>,
    ) -> Result<Self, JobError> {
        let spec = &job.spec;
        let n = spec.num_slots as usize;
        let token = target.token();
        let rv = RendezvousClient::connect_with(target.rendezvous(), token.as_ref(), &job.placement.channel)
            .await?;
        let config = JobConfig {
            spec_summary: spec.summary(),
            // Survivors wait in the gang while a replacement is awaited.
            gang_timeout: Some(job.recovery.gang_timeout + job.recovery.replacement_wait),
            client_lease: Some(job.recovery.client_lease),
            ..JobConfig::new(job_id.clone(), spec.num_slots).with_max_attempts(job.recovery.max_attempts)
        };
        rv.create_job(&config).await?;
        let lease = rv.keep_job_leased(&job_id, job.recovery.client_lease);
        let mut guard = CancelGuard {
            rv: rv.clone(),
            job_id: job_id.clone(),
            clients: Vec::new(),
            armed: true,
        };
        // A trial trains where its dataset's rows are.
        let chosen = match source {
            Source::Fed(..) => pick_agents(&rv, &target, n, &[], spec.model.name()).await?,
            Source::Held(held) => held.agents(&rv).await?,
        };
        let mut holders = Self::start_on(job, chosen, &job_id, &target, initial).await?;
        if let Source::Fed(..) = source {
            // A job that may grow deals a shard per agent it may grow to.
            holders = holders.dealt(job.max_slots() as usize);
        }
        guard.clients = holders.member_clients();
        reporter.emit(TrainingEvent::Started {
            job_id: job_id.clone(),
            agents: holders.clients.iter().map(|c| c.url().to_owned()).collect(),
        });
        Ok(Run {
            job,
            target,
            source,
            job_id,
            token,
            rv,
            holders,
            placed: Placements::new(),
            seen_epochs: 0,
            guard,
            _lease: lease,
            reporter,
        })
    }

    /// Starts the job on the `chosen` agents, each from the `initial`
    /// weights when the job has them.
    async fn start_on(
        job: &TrainingJob,
        chosen: Vec<AgentInfo>,
        job_id: &str,
        target: &Target<'_>,
        initial: Option<Arc<str>>,
    ) -> Result<Holders, JobError> {
        let token = target.token();
        let mut clients = Vec::with_capacity(chosen.len());
        for a in &chosen {
            let c = AgentClient::connect_with(&a.flight_address, token.as_ref(), &job.placement.channel)?;
            c.start_job_from(job_id, &job.spec, &target.rendezvous(), initial.as_deref())
                .await?;
            clients.push(c);
        }
        let ids = chosen.into_iter().map(|a| a.agent_id).collect();
        Ok(Holders::new(clients, ids).starting_from(initial))
    }

    /// Feeds the rows fed to the job — the eval split (if any), then the
    /// train split: every shard, or just those in `only`. A held dataset is
    /// fed already (its own follower re-feeds lost shards).
    pub async fn feed(&mut self, only: Option<&[usize]>) -> Result<(), JobError> {
        let Source::Fed(train, eval) = self.source else {
            return Ok(());
        };
        if let Some(eval) = eval {
            self.feed_split(eval, Split::Eval, only).await?;
        }
        self.feed_split(train, Split::Train, only).await
    }

    /// The first feed: agents that refused more rows because the job
    /// failed (its spec or input, found as training started) name the real
    /// cause at the rendezvous.
    pub async fn feed_all(&mut self) -> Result<(), JobError> {
        match self.feed(None).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed_at_rendezvous().await.unwrap_or(e)),
        }
    }

    /// The job's failure as the rendezvous recorded it, if it failed there.
    async fn failed_at_rendezvous(&self) -> Option<JobError> {
        let status = self.rv.status(&self.job_id).await.ok()?;
        (status.state == JobState::Failed).then(|| JobError::TrainingFailed {
            job_id: self.job_id.clone(),
            cause: status.first_cause().unwrap_or("failed").to_owned(),
        })
    }

    /// Streams one split into its shards (`only`: re-send just these) and
    /// signals the end of data, checking every shard's committed rows.
    async fn feed_split(
        &mut self,
        data: &Rows<'_>,
        split: Split,
        only: Option<&[usize]>,
    ) -> Result<(), JobError> {
        let job = self.job;
        if let Some(only) = only {
            self.reopen(split, only).await?;
        }
        let ctx = PushCtx {
            job_id: &self.job_id,
            token: self.token.as_ref(),
            local: self.target.is_local(),
        };
        let shards = self.holders.shards(only);
        let spark_before = data.spark_bytes();
        let started = Instant::now();
        let (rows, agent_bytes, partitions) = match (&job.feeding.feed, data) {
            (Feed::DriverRelay, _) => {
                let window = Window {
                    window_bytes: job.feeding.window_bytes,
                    commit_bytes: job.feeding.commit_bytes,
                };
                let reporter = &mut self.reporter;
                let progress = |shard, rows, rows_per_sec| {
                    reporter.emit(TrainingEvent::Streamed {
                        split: split.as_str(),
                        shard,
                        rows,
                        rows_per_sec,
                    })
                };
                let (rows, bytes) =
                    relay::relay(ctx.job_id, &job.spec, data, split, shards, window, progress).await?;
                (rows, bytes, Vec::<PushedPartition>::new())
            }
            (Feed::ExecutorPush(opts), Rows::Spark(rows)) => {
                let placed = &mut self.placed;
                let (rows, partitions) = push::push(&ctx, opts, rows.df(), split, shards, placed).await?;
                (rows, 0, partitions)
            }
            (Feed::ExecutorPush(_), Rows::Arrow { .. }) => return Err(arrow_source_pushed()),
        };
        // Each agent fed now ends the split holding the rows of all its shards.
        let holders = &mut self.holders;
        let fed = |s: usize| only.is_none_or(|o| o.contains(&s));
        holders.record(split, &rows, fed);
        for s in holders.members() {
            if holders.shards_of(&holders.agent_ids[s]).into_iter().any(fed) {
                let expected = holders.agent_rows(split, s);
                holders.clients[s]
                    .end_of_data(ctx.job_id, split, Some(expected))
                    .await?;
            }
        }
        let spark_bytes = data.spark_bytes() - spark_before;
        self.reporter.emit(TrainingEvent::Fed {
            split: split.as_str(),
            rows_per_shard: rows,
            feed: match job.feeding.feed {
                Feed::DriverRelay => "driver-relay",
                Feed::ExecutorPush(_) => "executor-push",
            },
            client_bytes: spark_bytes + agent_bytes,
            seconds: started.elapsed().as_secs_f64(),
            queries: data.queries(),
            partitions,
        });
        Ok(())
    }

    /// Reopens `split` on the members that hold any of the shards `only`
    /// about to be fed again: an agent that took a lost agent's shards over
    /// (an elastic shrink) had ended its split, and takes the re-fed rows
    /// only until the `end_of_data` that follows them.
    async fn reopen(&self, split: Split, only: &[usize]) -> Result<(), JobError> {
        let holders = &self.holders;
        for s in holders.members() {
            if holders
                .shards_of(&holders.agent_ids[s])
                .iter()
                .any(|x| only.contains(x))
            {
                holders.clients[s].reopen_split(&self.job_id, split).await?;
            }
        }
        Ok(())
    }

    /// Follows training to its end from the rendezvous's watch of the job,
    /// which carries what its agents report of it in their heartbeats: the
    /// agents' progress and logs as they change; an agent asked directly
    /// only when an attempt failed, when it has not been heard from for
    /// [`QUIET`](watched::QUIET), or once the job succeeded (for its final status). Lost
    /// agents are replaced (their shards fed again, or the gang shrunk).
    /// Returns the status of an agent that finished.
    pub async fn follow(&mut self) -> Result<AgentJobStatus, JobError> {
        let mut watcher = Watcher::new(self.rv.clone(), &self.job_id);
        loop {
            let epochs = self.seen_epochs;
            let ask = match watcher.next().await? {
                Seen::Event(status, reports) => watcher.watched.on_event(
                    &mut self.reporter,
                    &self.holders,
                    &status,
                    &reports,
                    &mut self.seen_epochs,
                )?,
                Seen::Check => watcher.watched.quiet(&self.holders),
            };
            if ask.is_empty() {
                // An epoch ended: an agent that joined meanwhile joins now.
                if self.seen_epochs > epochs
                    && self.may_grow()
                    && let Some(newcomer) =
                        grow::newcomer(&self.rv, &self.target, &self.holders, self.job.spec.model.name())
                            .await?
                {
                    self.grow(newcomer).await?;
                }
                continue;
            }
            let mut statuses = Vec::with_capacity(ask.len());
            let mut lost = Vec::new();
            for s in ask {
                let c = &self.holders.clients[s];
                match c.job_status(&self.job_id).await {
                    Ok(st) => statuses.push(st),
                    Err(e) if e.is_retryable() || e.code() == Some(tonic::Code::NotFound) => {
                        tracing::warn!(shard = s, agent = c.url(), error = %e, "agent lost");
                        lost.push(self.holders.agent_ids[s].clone());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            for st in &statuses {
                watcher.watched.heard_from(&mut self.reporter, st)?;
            }
            if !lost.is_empty() {
                self.recover(&lost).await?;
                continue;
            }
            let members = self.holders.members().len();
            if statuses.len() == members && statuses.iter().all(|s| s.state == AgentJobState::Succeeded) {
                return Ok(statuses.into_iter().next().expect("a member"));
            }
        }
    }

    /// The run's end for a detached job (every shard fed and committed):
    /// the rendezvous drops the job's client lease, so it trains on without
    /// this process; the guard is disarmed and the lease's renewals stop.
    pub async fn detach(mut self) -> Result<super::JobHandle, JobError> {
        // Each member keeps its rows on its disk first: restarted on its
        // node, it takes its place again with no client to feed it.
        let (mut rows, mut bytes, began) = (0, 0, Instant::now());
        for c in self.holders.member_clients() {
            let kept = match c.keep_rows(&self.job_id).await {
                Ok(kept) => kept,
                Err(e) => return Err(self.failed_at_rendezvous().await.unwrap_or(e.into())),
            };
            (rows, bytes) = (rows + kept.rows, bytes + kept.bytes);
        }
        self.reporter.note(&format!(
            "{rows} rows kept on the agents' disks ({:.1} MB in {:.2} s): an agent restarted on its \
             node takes its place again",
            bytes as f64 / 1e6,
            began.elapsed().as_secs_f64()
        ));
        if let Err(e) = self.rv.detach_job(&self.job_id).await {
            // A short job may have finished already: nothing left to detach.
            let finished = self.rv.status(&self.job_id).await.ok();
            if !finished.is_some_and(|s| s.state == JobState::Succeeded) {
                return Err(self.failed_at_rendezvous().await.unwrap_or(e.into()));
            }
        }
        self.guard.armed = false;
        self.reporter.note(&format!(
            "job {} fed and detached: it trains on without this process (kindling wait {0})",
            self.job_id
        ));
        Ok(self.job.handle(self.job_id.clone()))
    }

    /// The run's end: the epochs not reported yet, the model fetched from
    /// the agents (with `layout`), the guard disarmed.
    pub async fn finish(
        mut self,
        last: AgentJobStatus,
        layout: &FeatureLayout,
    ) -> Result<TrainedModel, JobError> {
        let job = self.job;
        let spec = &job.spec;
        while self.seen_epochs < last.history.len() {
            self.reporter
                .emit(TrainingEvent::Epoch(last.history[self.seen_epochs].clone()));
            self.seen_epochs += 1;
        }
        let weights = self.holders.clients[0].fetch_model(&self.job_id).await?;
        let mut model = TrainedModel::from_weights(
            spec.clone(),
            self.job_id.clone(),
            layout,
            last.history.clone(),
            weights,
            #[cfg(feature = "local")]
            &job.placement.models,
        )?;
        // With restore_best the agents returned the best epoch's weights.
        model.meta.best_epoch = last
            .best_epoch
            .filter(|_| spec.early_stopping.is_some_and(|s| s.restore_best));
        if let Some(epoch) = last.stopped_early {
            self.reporter.emit(TrainingEvent::EarlyStopped {
                epoch,
                best_epoch: last.best_epoch,
            });
        }
        model.serving = Some(self.target.serving(&job.placement.channel));
        self.guard.armed = false;
        self.reporter.emit(TrainingEvent::Finished {
            job_id: self.job_id.clone(),
        });
        Ok(model)
    }
}
