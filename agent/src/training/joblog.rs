//! What a job keeps of its own history on an agent besides its epochs: the
//! training loss per step, sampled to a bounded curve ([`StepSamples`]),
//! and its warnings and errors with job, rank and attempt ([`JobLog`]),
//! which `job_status`, the rendezvous' status page and the client show.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use kindling_schemas::action::{
    EventLevel, FailedAttempt, JOB_EVENTS_KEPT, JobEvent, STEP_LOSS_SAMPLES, StepLoss,
};

/// Longest event message kept (longer ones are cut at a character boundary).
const MAX_MESSAGE_BYTES: usize = 2048;

/// Most failed attempts kept (a job's attempts are bounded by its
/// `max_attempts`; this bounds a misconfigured one).
const MAX_FAILED_ATTEMPTS: usize = 64;

/// The loss of every `stride`-th step, at most [`STEP_LOSS_SAMPLES`]: when
/// full, every other sample goes and the stride doubles, so the curve always
/// spans the whole run at an even spacing.
#[derive(Clone, Debug)]
pub struct StepSamples {
    points: Vec<StepLoss>,
    stride: u64,
    seen: u64,
}

impl Default for StepSamples {
    fn default() -> Self {
        StepSamples {
            points: Vec::new(),
            stride: 1,
            seen: 0,
        }
    }
}

impl StepSamples {
    /// Records one step's loss (non-finite losses are skipped).
    pub fn push(&mut self, epoch: u32, step: u64, loss: f64) {
        self.seen += 1;
        if !loss.is_finite() || !(self.seen - 1).is_multiple_of(self.stride) {
            return;
        }
        if self.points.len() == STEP_LOSS_SAMPLES {
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride *= 2;
            if !(self.seen - 1).is_multiple_of(self.stride) {
                return;
            }
        }
        self.points.push(StepLoss { epoch, step, loss });
    }

    /// The samples, oldest first.
    pub fn points(&self) -> &[StepLoss] {
        &self.points
    }
}

/// A job's latest warnings and errors on this agent, and its failed attempts.
#[derive(Debug, Default)]
pub struct JobLog {
    events: VecDeque<JobEvent>,
    next_seq: u64,
    failed: Vec<FailedAttempt>,
}

impl JobLog {
    /// Keeps an event (the oldest goes past [`JOB_EVENTS_KEPT`]).
    pub fn push(
        &mut self,
        level: EventLevel,
        agent_id: &str,
        rank: Option<u32>,
        attempt: u32,
        message: &str,
    ) {
        self.next_seq += 1;
        if self.events.len() == JOB_EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back(JobEvent {
            seq: self.next_seq,
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            level,
            agent_id: agent_id.to_owned(),
            rank,
            attempt,
            message: truncated(message),
        });
    }

    /// Records a failed attempt and its cause (once per attempt).
    pub fn attempt_failed(&mut self, attempt: u32, cause: &str) {
        if self.failed.iter().any(|f| f.attempt == attempt) || self.failed.len() == MAX_FAILED_ATTEMPTS {
            return;
        }
        self.failed.push(FailedAttempt {
            attempt,
            cause: truncated(cause),
        });
    }

    /// The events, oldest first.
    pub fn events(&self) -> Vec<JobEvent> {
        self.events.iter().cloned().collect()
    }

    /// The failed attempts, oldest first.
    pub fn failed_attempts(&self) -> Vec<FailedAttempt> {
        self.failed.clone()
    }
}

fn truncated(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_samples_stay_bounded_and_evenly_spread_over_the_whole_run() {
        let mut s = StepSamples::default();
        let steps = 10_000u64;
        for i in 0..steps {
            s.push(1 + (i / 1000) as u32, i % 1000 + 1, i as f64);
        }
        let points = s.points();
        assert!(points.len() <= STEP_LOSS_SAMPLES, "{}", points.len());
        assert!(points.len() > STEP_LOSS_SAMPLES / 2, "{}", points.len());
        assert_eq!(points[0].loss, 0.0, "the first step stays");
        // Evenly spaced: every gap is the stride.
        let gaps: Vec<f64> = points.windows(2).map(|w| w[1].loss - w[0].loss).collect();
        assert!(gaps.iter().all(|g| *g == gaps[0]), "{gaps:?}");
        assert!(
            points.last().expect("points").loss >= (steps as f64) - gaps[0],
            "the curve reaches the last steps"
        );
        assert_eq!(points[1].epoch, 1);
        assert_eq!(points.last().expect("points").epoch, 10);
    }

    #[test]
    fn non_finite_losses_are_skipped() {
        let mut s = StepSamples::default();
        s.push(1, 1, f64::NAN);
        s.push(1, 2, 0.5);
        assert_eq!(s.points().len(), 1);
        assert_eq!(s.points()[0].step, 2);
    }

    #[test]
    fn the_log_keeps_the_latest_events_numbered_and_cut_to_size() {
        let mut log = JobLog::default();
        for i in 0..(JOB_EVENTS_KEPT as u32 + 5) {
            log.push(EventLevel::Warn, "a", Some(1), i, &format!("event {i}"));
        }
        log.push(EventLevel::Error, "a", None, 9, &"é".repeat(MAX_MESSAGE_BYTES));
        let events = log.events();
        assert_eq!(events.len(), JOB_EVENTS_KEPT);
        assert_eq!(events.last().expect("last").seq, JOB_EVENTS_KEPT as u64 + 6);
        assert_eq!(events[0].message, "event 6");
        let long = &events.last().expect("last").message;
        assert!(long.len() <= MAX_MESSAGE_BYTES + '…'.len_utf8() && long.ends_with('…'));
        log.attempt_failed(1, "peer b lost");
        log.attempt_failed(1, "again");
        assert_eq!(log.failed_attempts().len(), 1);
        assert_eq!(log.failed_attempts()[0].cause, "peer b lost");
    }
}
