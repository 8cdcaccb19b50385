//! Progress of a training job: events for the application, progress bars on a
//! terminal, plain log lines otherwise.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kindling_schemas::action::{EpochMetrics, JobEvent};
use tokio::sync::mpsc;

use super::event::TrainingEvent;
use super::tracking::TrackerHandle;
use crate::feed::PushedPartition;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// Bars on a terminal, log lines otherwise.
    #[default]
    Auto,
    /// Always bars.
    Bars,
    /// Always log lines (on stderr).
    Log,
    /// Nothing shown (events are still sent).
    Silent,
}

/// Fans events out to the application's channel and to the screen.
#[derive(Debug)]
pub(crate) struct Reporter {
    events: Option<mpsc::Sender<TrainingEvent>>,
    dropped: u64,
    bars: Option<MultiProgress>,
    shard_bars: HashMap<(&'static str, usize), ProgressBar>,
    train_bar: Option<ProgressBar>,
    log: bool,
    last_log: Instant,
    tracking: Option<TrackerHandle>,
}

impl Reporter {
    pub(crate) fn new(mode: ProgressMode, events: Option<mpsc::Sender<TrainingEvent>>) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let (bars, log) = match mode {
            ProgressMode::Auto if terminal => (Some(MultiProgress::new()), false),
            ProgressMode::Auto | ProgressMode::Log => (None, true),
            ProgressMode::Bars => (Some(MultiProgress::new()), false),
            ProgressMode::Silent => (None, false),
        };
        Reporter {
            events,
            dropped: 0,
            bars,
            shard_bars: HashMap::new(),
            train_bar: None,
            log,
            last_log: Instant::now(),
            tracking: None,
        }
    }

    /// Also passes the events to an MLflow run.
    pub(crate) fn tracked(mut self, tracking: Option<TrackerHandle>) -> Self {
        self.tracking = tracking;
        self
    }

    pub(crate) fn emit(&mut self, event: TrainingEvent) {
        self.show(&event);
        if let Some(t) = &self.tracking {
            t.observe(&event);
        }
        let Some(tx) = &self.events else { return };
        // Progress updates leave half of the channel to the milestones, so an
        // application that reads only at the end still gets every milestone.
        let progress = matches!(event, TrainingEvent::Streamed { .. } | TrainingEvent::Step { .. });
        if progress && tx.capacity() <= tx.max_capacity() / 2 {
            return;
        }
        match tx.try_send(event) {
            // A dropped receiver: the application stopped listening.
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                self.dropped += 1;
                if self.dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped = self.dropped,
                        ?event,
                        "the training events channel is full (the application is not reading it): events dropped"
                    );
                }
            }
        }
    }

    /// Shows a line that is no event (where to watch the job, its trace
    /// id), unless silent.
    pub(crate) fn note(&mut self, line: &str) {
        if let Some(bars) = &self.bars {
            let _ = bars.println(line);
        } else if self.log {
            eprintln!("[kindling] {line}");
        }
    }

    fn show(&mut self, event: &TrainingEvent) {
        if let Some(bars) = self.bars.clone() {
            self.show_bars(&bars, event);
        } else if self.log
            && let Some(line) = self.log_line(event)
        {
            self.last_log = Instant::now();
            eprintln!("[kindling] {line}");
        }
    }

    /// `event` on the terminal's progress bars.
    fn show_bars(&mut self, bars: &MultiProgress, event: &TrainingEvent) {
        match event {
            TrainingEvent::Streamed {
                split,
                shard,
                rows,
                rows_per_sec,
            } => {
                let bar = self.shard_bars.entry((split, *shard)).or_insert_with(|| {
                    let b = bars.add(ProgressBar::new_spinner());
                    b.set_style(
                        ProgressStyle::with_template("{prefix:>12} {spinner} {msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    b.set_prefix(format!("{split} shard {shard}"));
                    b
                });
                bar.set_message(format!("{rows} rows  {rows_per_sec:.0} rows/s"));
                bar.tick();
            }
            TrainingEvent::Fed { split, .. } => {
                for ((s, _), b) in &self.shard_bars {
                    if s == split {
                        b.finish();
                    }
                }
            }
            TrainingEvent::Step {
                epoch,
                step,
                steps,
                loss,
                samples_per_sec,
            } => {
                let bar = self.train_bar.get_or_insert_with(|| {
                    let b = bars.add(ProgressBar::new(*steps));
                    b.set_style(
                        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    );
                    b
                });
                bar.set_length((*steps).max(*step));
                bar.set_position(*step);
                bar.set_prefix(format!("epoch {epoch}"));
                let loss = loss.map(|l| format!("loss {l:.4}")).unwrap_or_default();
                bar.set_message(format!("{loss}  {samples_per_sec:.0} samples/s"));
            }
            TrainingEvent::Epoch(m) => {
                let _ = bars.println(epoch_line(m));
            }
            TrainingEvent::Shrunk { lost, world_size } => {
                let _ = bars.println(shrunk_line(lost, *world_size));
            }
            TrainingEvent::Grown {
                joined,
                world_size,
                moved_shards,
            } => {
                let _ = bars.println(grown_line(joined, *world_size, moved_shards));
            }
            TrainingEvent::Recovering {
                attempt,
                resent_shards,
                ..
            } => {
                let _ = bars.println(recovering_line(*attempt, resent_shards));
            }
            TrainingEvent::AgentLog { job_id, event } => {
                let _ = bars.println(agent_log_line(job_id, event));
            }
            TrainingEvent::EarlyStopped { epoch, best_epoch } => {
                let _ = bars.println(early_stop_line(*epoch, *best_epoch));
            }
            TrainingEvent::Finished { .. } => {
                if let Some(b) = self.train_bar.take() {
                    b.finish_and_clear();
                }
            }
            TrainingEvent::Started { .. } => {}
        }
    }

    /// `event` as a log line, when it makes one (streaming and steps at most
    /// every 2 s).
    fn log_line(&self, event: &TrainingEvent) -> Option<String> {
        match event {
            TrainingEvent::Started { job_id, agents } => {
                Some(format!("job {job_id} started on {} agents", agents.len()))
            }
            TrainingEvent::Streamed {
                split,
                shard,
                rows,
                rows_per_sec,
            } => (self.last_log.elapsed().as_secs() >= 2)
                .then(|| format!("{split} shard {shard}: {rows} rows ({rows_per_sec:.0} rows/s)")),
            TrainingEvent::Fed {
                split,
                rows_per_shard,
                feed,
                client_bytes,
                seconds,
                queries,
                partitions,
            } => Some(format!(
                "{split}: every row landed once ({feed}, {seconds:.1} s, {client_bytes} bytes through \
                 the client{}{}), rows per shard {rows_per_shard:?}",
                if *queries > 1 {
                    format!(", {queries} Spark queries")
                } else {
                    String::new()
                },
                node_local_part(partitions),
            )),
            TrainingEvent::Step {
                epoch,
                step,
                steps,
                loss,
                samples_per_sec,
            } => (self.last_log.elapsed().as_secs() >= 2).then(|| {
                let of = if *steps > 0 { steps.to_string() } else { "?".into() };
                format!(
                    "epoch {epoch} step {step}/{of} loss {:.4} {samples_per_sec:.0} samples/s",
                    loss.unwrap_or(f64::NAN)
                )
            }),
            TrainingEvent::Epoch(m) => Some(epoch_line(m)),
            TrainingEvent::Shrunk { lost, world_size } => Some(shrunk_line(lost, *world_size)),
            TrainingEvent::Grown {
                joined,
                world_size,
                moved_shards,
            } => Some(grown_line(joined, *world_size, moved_shards)),
            TrainingEvent::Recovering {
                attempt,
                resent_shards,
                ..
            } => Some(recovering_line(*attempt, resent_shards)),
            TrainingEvent::AgentLog { job_id, event } => Some(agent_log_line(job_id, event)),
            TrainingEvent::EarlyStopped { epoch, best_epoch } => Some(early_stop_line(*epoch, *best_epoch)),
            TrainingEvent::Finished { job_id } => Some(format!("job {job_id} finished")),
        }
    }
}

/// How `kindling train` and `kindling status` print an agent's warning or
/// error: `ERROR agent a (job j, rank 1, attempt 2): <message>`.
pub fn agent_log_line(job_id: &str, e: &JobEvent) -> String {
    let rank = e.rank.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
    format!(
        "{} agent {} (job {job_id}, rank {rank}, attempt {}): {}",
        e.level, e.agent_id, e.attempt, e.message
    )
}

fn recovering_line(attempt: u32, resent_shards: &[usize]) -> String {
    format!("attempt failed; attempt {attempt} re-forming, re-sent shards {resent_shards:?}")
}

fn shrunk_line(lost: &[String], world_size: u32) -> String {
    format!(
        "no replacement for {}: the job goes on with {world_size} agents, which took over the lost shards",
        lost.join(", ")
    )
}

fn grown_line(joined: &str, world_size: u32, moved: &[usize]) -> String {
    format!(
        "agent {joined} joined: the job goes on with {world_size} agents, the newcomer holding shard(s) {moved:?}"
    )
}

/// `, k of n partitions from their node's agent` for executor push.
fn node_local_part(partitions: &[PushedPartition]) -> String {
    let sent: Vec<&PushedPartition> = partitions.iter().filter(|p| p.shard.is_some()).collect();
    if sent.is_empty() {
        return String::new();
    }
    let local = sent.iter().filter(|p| p.node_local).count();
    format!(", {local} of {} partitions pushed node-local", sent.len())
}

fn epoch_line(m: &EpochMetrics) -> String {
    let mut s = format!("epoch {} train loss {:.4}", m.epoch, m.train_loss);
    if let Some(l) = m.eval_loss {
        s.push_str(&format!("  eval loss {l:.4}"));
    }
    if let Some(a) = m.eval_accuracy {
        s.push_str(&format!("  eval accuracy {:.2}%", a * 100.0));
    }
    // The headline metric of each kind of task; the rest are in the history.
    for (name, label) in [
        ("eval_f1_macro", "macro F1"),
        ("eval_auc_roc", "AUC"),
        ("eval_rmse", "RMSE"),
        ("eval_r2", "R²"),
    ] {
        if let Some(v) = m.metrics.get(name) {
            s.push_str(&format!("  {label} {v:.4}"));
        }
    }
    if let Some(lr) = m.learning_rate {
        s.push_str(&format!("  lr {lr:.3e}"));
    }
    s.push_str(&format!("  {:.0} samples/s/rank", m.samples_per_sec));
    s
}

fn early_stop_line(epoch: u32, best_epoch: Option<u32>) -> String {
    match best_epoch {
        Some(best) => format!("early stopping after epoch {epoch}: no improvement since epoch {best} (best)"),
        None => format!("early stopping after epoch {epoch}"),
    }
}

#[cfg(test)]
mod tests {
    use kindling_schemas::action::EpochMetrics;
    use tokio::sync::mpsc;

    use super::{ProgressMode, Reporter, TrainingEvent};

    fn step(step: u64) -> TrainingEvent {
        TrainingEvent::Step {
            epoch: 1,
            step,
            steps: 100,
            loss: Some(0.5),
            samples_per_sec: 1.0,
        }
    }

    fn epoch(epoch: u32) -> TrainingEvent {
        TrainingEvent::Epoch(EpochMetrics {
            epoch,
            train_loss: 0.1,
            rows: 10,
            eval_loss: None,
            eval_accuracy: None,
            samples_per_sec: 1.0,
            wall_secs: Some(0.1),
            learning_rate: None,
            ..Default::default()
        })
    }

    #[test]
    fn progress_leaves_half_the_channel_to_milestones_and_nothing_blocks() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut reporter = Reporter::new(ProgressMode::Silent, Some(tx));
        for s in 0..100 {
            reporter.emit(step(s));
        }
        for e in 1..=4 {
            reporter.emit(epoch(e));
        }
        // Full now: one more milestone is dropped, not waited for.
        reporter.emit(TrainingEvent::Finished { job_id: "j".into() });
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push(e);
        }
        let steps = got
            .iter()
            .filter(|e| matches!(e, TrainingEvent::Step { .. }))
            .count();
        assert_eq!(steps, 4, "{got:?}");
        let epochs: Vec<u32> = got
            .iter()
            .filter_map(|e| match e {
                TrainingEvent::Epoch(m) => Some(m.epoch),
                _ => None,
            })
            .collect();
        assert_eq!(epochs, [1, 2, 3, 4]);
        assert_eq!(reporter.dropped, 1);
    }

    #[test]
    fn a_dropped_receiver_is_not_an_error() {
        let (tx, rx) = mpsc::channel(2);
        drop(rx);
        let mut reporter = Reporter::new(ProgressMode::Silent, Some(tx));
        reporter.emit(epoch(1));
        assert_eq!(reporter.dropped, 0);
    }

    #[test]
    fn the_fed_line_counts_node_local_partitions_among_those_sent() {
        let part = |partition, shard, node_local| super::PushedPartition {
            partition,
            attempt: 0,
            shard,
            rows: 10,
            committed_rows: 10,
            duplicate: false,
            node: "node-1".into(),
            node_local,
        };
        let pushed = [
            part(0, Some(0), true),
            part(1, Some(1), false),
            part(2, None, false),
        ];
        assert_eq!(
            super::node_local_part(&pushed),
            ", 1 of 2 partitions pushed node-local"
        );
        assert_eq!(super::node_local_part(&[]), "", "the driver relay says nothing");
    }
}
