//! The agent's Prometheus families (served by `kindling_ops::exposition`): the
//! cache against its budget, and per job and rank its rows, state, epoch,
//! step, losses, throughput, where step time goes, refused `DoPut`s, and its
//! rings' all-reduces (count, bytes, a time histogram).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use kindling_schemas::action::{ActionKind, AgentJobState};

use crate::cache::MemoryBudget;
use crate::collective::ALL_REDUCE_SECONDS;
use crate::jobs::JobRegistry;
use kindling_ops::exposition::family;

/// The report an agent's heartbeats carry to the rendezvous' status page
/// ([`AgentReport`](kindling_schemas::rendezvous::AgentReport) JSON): its
/// cache and every job it holds, each job's sampled step losses and events
/// already bounded; the oldest epochs of a very long run are left out to
/// stay within [`MAX_REPORT_BYTES`](kindling_schemas::rendezvous::MAX_REPORT_BYTES).
pub fn report(jobs: &JobRegistry, budget: &MemoryBudget) -> Vec<u8> {
    let mut report = kindling_schemas::rendezvous::AgentReport {
        cache_budget_bytes: budget.limit(),
        cache_bytes_memory: 0,
        cache_bytes_disk: 0,
        jobs: jobs.all().iter().map(|j| j.status()).collect(),
    };
    for s in &report.jobs {
        report.cache_bytes_memory += s.cache_bytes_memory;
        report.cache_bytes_disk += s.cache_bytes_disk;
    }
    let mut keep = usize::MAX;
    loop {
        for s in &mut report.jobs {
            let drop = s.history.len().saturating_sub(keep);
            s.history.drain(..drop);
            let drop = s.rows_trained_per_epoch.len().saturating_sub(keep);
            s.rows_trained_per_epoch.drain(..drop);
        }
        let json = serde_json::to_vec(&report).unwrap_or_default();
        if json.len() <= kindling_schemas::rendezvous::MAX_REPORT_BYTES || keep == 0 {
            return json;
        }
        keep = report.jobs.iter().map(|s| s.history.len()).max().unwrap_or(0) / 2;
    }
}

/// Flight actions the agent answered, by kind (`kindling_agent_actions`).
#[derive(Debug, Default)]
pub struct ActionCounts([AtomicU64; ActionKind::ALL.len()]);

impl ActionCounts {
    /// Counts one `kind` action.
    pub fn count(&self, kind: ActionKind) {
        if let Some(i) = ActionKind::ALL.iter().position(|k| *k == kind) {
            self.0[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The agent's families, written on each scrape from its jobs and cache.
#[derive(Debug)]
pub struct AgentCollector {
    jobs: Arc<JobRegistry>,
    budget: Arc<MemoryBudget>,
    actions: Arc<ActionCounts>,
}

impl AgentCollector {
    /// The families of `jobs`, `budget` and the actions answered.
    pub fn new(jobs: Arc<JobRegistry>, budget: Arc<MemoryBudget>, actions: Arc<ActionCounts>) -> Self {
        AgentCollector {
            jobs,
            budget,
            actions,
        }
    }
}

impl Collector for AgentCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (jobs, budget) = (&self.jobs, &self.budget);
        let agent = jobs.agent_id().to_owned();
        let a = agent.as_str();
        let all = jobs.all();
        family(
            &mut e,
            "kindling_agent_cache_bytes",
            "Bytes of cached rows held in memory, all jobs.",
            MetricType::Gauge,
        )?
        .int(&[("agent", a)], budget.used() as i64)?;
        family(
            &mut e,
            "kindling_agent_cache_budget_bytes",
            "The memory budget for cached rows.",
            MetricType::Gauge,
        )?
        .int(&[("agent", a)], budget.limit() as i64)?;
        family(
            &mut e,
            "kindling_agent_jobs",
            "Jobs on this agent.",
            MetricType::Gauge,
        )?
        .int(&[("agent", a)], all.len() as i64)?;
        let mut f = family(
            &mut e,
            "kindling_agent_actions",
            "Flight actions answered, by action.",
            MetricType::Counter,
        )?;
        for (kind, n) in ActionKind::ALL.iter().zip(&self.actions.0) {
            f.int(
                &[("agent", a), ("action", kind.name())],
                n.load(Ordering::Relaxed) as i64,
            )?;
        }
        let statuses: Vec<_> = all.iter().map(|j| (j.clone(), j.status())).collect();
        job_gauges(&mut e, a, &statuses)?;
        job_families(&mut e, a, &statuses)?;
        ring_families(&mut e, a, &statuses)
    }
}

type Statuses = [(
    Arc<crate::jobs::job::Job>,
    kindling_schemas::action::AgentJobStatus,
)];

/// The per-job gauges, one sample per job with its rank.
fn job_gauges(e: &mut DescriptorEncoder<'_>, a: &str, statuses: &Statuses) -> Result<(), std::fmt::Error> {
    type Gauge = fn(&kindling_schemas::action::AgentJobStatus) -> Option<f64>;
    let gauges: [(&str, &str, Gauge); 12] = [
        ("kindling_job_epoch", "Current epoch (from 1).", |s| {
            Some(s.epoch as f64)
        }),
        ("kindling_job_step", "Steps done in the epoch.", |s| {
            Some(s.step as f64)
        }),
        ("kindling_job_attempt", "The attempt this agent is in.", |s| {
            Some(s.attempt as f64)
        }),
        ("kindling_job_world_size", "Ranks in the gang.", |s| {
            Some(s.world_size as f64)
        }),
        (
            "kindling_job_loss",
            "Mean loss of the latest step, all ranks.",
            |s| s.loss,
        ),
        (
            "kindling_job_samples_per_second",
            "Rows per second this rank trains, this epoch.",
            |s| Some(s.samples_per_sec),
        ),
        (
            "kindling_job_train_loss",
            "Train loss of the last completed epoch.",
            |s| s.history.last().map(|h| h.train_loss),
        ),
        (
            "kindling_job_eval_loss",
            "Eval loss of the last completed epoch.",
            |s| s.history.last().and_then(|h| h.eval_loss),
        ),
        (
            "kindling_job_eval_accuracy",
            "Eval accuracy of the last completed epoch.",
            |s| s.history.last().and_then(|h| h.eval_accuracy),
        ),
        ("kindling_job_epochs_done", "Completed epochs.", |s| {
            Some(s.history.len() as f64)
        }),
        (
            "kindling_job_rows_trained",
            "Rows all ranks trained in the last completed epoch.",
            |s| s.rows_trained_per_epoch.last().map(|&r| r as f64),
        ),
        (
            "kindling_job_cache_spilled_bytes",
            "Bytes of this job's rows spilled to disk.",
            |s| Some(s.cache_bytes_disk as f64),
        ),
    ];
    for (name, help, value) in gauges {
        let mut f = family(e, name, help, MetricType::Gauge)?;
        for (_, s) in statuses {
            let rank = s.rank.map(|r| r.to_string()).unwrap_or_default();
            if let Some(v) = value(s) {
                f.float(&[("job_id", &s.job_id), ("agent", a), ("rank", &rank)], v)?;
            }
        }
    }
    Ok(())
}

/// Rows by split, the state, refused `DoPut`s and where step time went.
fn job_families(e: &mut DescriptorEncoder<'_>, a: &str, statuses: &Statuses) -> Result<(), std::fmt::Error> {
    let mut f = family(
        e,
        "kindling_job_rows",
        "Rows committed on this agent, by split.",
        MetricType::Gauge,
    )?;
    for (_, s) in statuses {
        for (split, rows) in [("train", s.rows_train), ("eval", s.rows_eval)] {
            f.int(
                &[("job_id", &s.job_id), ("agent", a), ("split", split)],
                rows as i64,
            )?;
        }
    }
    let mut f = family(
        e,
        "kindling_job_state",
        "1 for the state the job is in on this agent.",
        MetricType::Gauge,
    )?;
    for (_, s) in statuses {
        let state = format!("{:?}", s.state).to_lowercase();
        f.int(&[("job_id", &s.job_id), ("agent", a), ("state", &state)], 1)?;
    }
    let mut f = family(
        e,
        "kindling_job_doput_errors",
        "DoPut streams refused, by gRPC status code.",
        MetricType::Counter,
    )?;
    for (j, _) in statuses {
        let refused = j.refused_puts.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (code, n) in refused {
            f.int(&[("job_id", &j.job_id), ("agent", a), ("code", &code)], n as i64)?;
        }
    }
    let mut f = family(
        e,
        "kindling_job_step_seconds",
        "Where this rank's step time went, this attempt.",
        MetricType::Counter,
    )?;
    for (j, s) in statuses {
        let t = j
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .step_times
            .clone();
        let rank = s.rank.map(|r| r.to_string()).unwrap_or_default();
        for (phase, d) in [
            ("compute", t.compute),
            ("idle", t.idle),
            ("all_reduce", t.all_reduce),
            ("optimizer", t.optimizer),
        ] {
            let labels = [
                ("job_id", s.job_id.as_str()),
                ("agent", a),
                ("rank", &rank),
                ("phase", phase),
            ];
            f.float(&labels, d.as_secs_f64())?;
        }
    }
    Ok(())
}

/// What the jobs' rings did: all-reduces, their bytes and a time histogram.
fn ring_families(e: &mut DescriptorEncoder<'_>, a: &str, statuses: &Statuses) -> Result<(), std::fmt::Error> {
    // Jobs that never formed a gang have no ring.
    let rings: Vec<_> = statuses
        .iter()
        .filter(|(_, s)| !(matches!(s.state, AgentJobState::Ganging) && s.rank.is_none()))
        .map(|(j, _)| (j.job_id.as_str(), &j.ring_stats))
        .collect();
    let mut f = family(
        e,
        "kindling_allreduce",
        "All-reduces done by this agent's rings.",
        MetricType::Counter,
    )?;
    for (job, r) in &rings {
        f.int(
            &[("job_id", job), ("agent", a)],
            r.ops.load(Ordering::Relaxed) as i64,
        )?;
    }
    let mut f = family(
        e,
        "kindling_allreduce_bytes",
        "Bytes all-reduced, as sent.",
        MetricType::Counter,
    )?;
    for (job, r) in &rings {
        f.int(
            &[("job_id", job), ("agent", a)],
            r.bytes.load(Ordering::Relaxed) as i64,
        )?;
    }
    let mut f = family(
        e,
        "kindling_allreduce_seconds",
        "How long an all-reduce took.",
        MetricType::Histogram,
    )?;
    for (job, r) in &rings {
        let buckets: Vec<(f64, u64)> = ALL_REDUCE_SECONDS
            .iter()
            .zip(&r.buckets)
            .map(|(&bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect();
        let sum = r.micros.load(Ordering::Relaxed) as f64 / 1e6;
        f.histogram(
            &[("job_id", job), ("agent", a)],
            sum,
            r.ops.load(Ordering::Relaxed),
            &buckets,
        )?;
    }
    Ok(())
}
