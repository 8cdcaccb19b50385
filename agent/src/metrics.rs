//! The agent's Prometheus metrics (served by [`crate::exposition`]): the
//! cache against its budget, and per job and rank its rows, state, epoch,
//! step, losses, throughput, where step time goes, refused `DoPut`s, and its
//! rings' all-reduces (count, bytes, a time histogram).

use std::sync::atomic::Ordering;

use kindling_schemas::action::AgentJobState;

use crate::cache::MemoryBudget;
use crate::collective::ALL_REDUCE_SECONDS;
use crate::exposition::Exposition;
use crate::registry::JobRegistry;

/// An agent's metrics.
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

pub fn agent(jobs: &JobRegistry, budget: &MemoryBudget) -> String {
    let agent = jobs.agent_id().to_owned();
    let mut e = Exposition::default();
    e.family(
        "kindling_agent_cache_bytes",
        "gauge",
        "Bytes of cached rows held in memory, all jobs.",
    );
    e.sample(
        "kindling_agent_cache_bytes",
        &[("agent", &agent)],
        budget.used() as f64,
    );
    e.family(
        "kindling_agent_cache_budget_bytes",
        "gauge",
        "The memory budget for cached rows.",
    );
    e.sample(
        "kindling_agent_cache_budget_bytes",
        &[("agent", &agent)],
        budget.limit() as f64,
    );
    let all = jobs.all();
    e.family("kindling_agent_jobs", "gauge", "Jobs on this agent.");
    e.sample("kindling_agent_jobs", &[("agent", &agent)], all.len() as f64);

    let statuses: Vec<_> = all.iter().map(|j| (j.clone(), j.status())).collect();
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
    let labels = |s: &kindling_schemas::action::AgentJobStatus| {
        let rank = s.rank.map(|r| r.to_string()).unwrap_or_default();
        (s.job_id.clone(), rank)
    };
    for (name, help, value) in gauges {
        e.family(name, "gauge", help);
        for (_, s) in &statuses {
            let (job, rank) = labels(s);
            if let Some(v) = value(s) {
                e.sample(name, &[("job_id", &job), ("agent", &agent), ("rank", &rank)], v);
            }
        }
    }
    e.family(
        "kindling_job_rows",
        "gauge",
        "Rows committed on this agent, by split.",
    );
    for (_, s) in &statuses {
        for (split, rows) in [("train", s.rows_train), ("eval", s.rows_eval)] {
            e.sample(
                "kindling_job_rows",
                &[("job_id", &s.job_id), ("agent", &agent), ("split", split)],
                rows as f64,
            );
        }
    }
    e.family(
        "kindling_job_state",
        "gauge",
        "1 for the state the job is in on this agent.",
    );
    for (_, s) in &statuses {
        let state = format!("{:?}", s.state).to_lowercase();
        e.sample(
            "kindling_job_state",
            &[("job_id", &s.job_id), ("agent", &agent), ("state", &state)],
            1.0,
        );
    }
    e.family(
        "kindling_job_doput_errors_total",
        "counter",
        "DoPut streams refused, by gRPC status code.",
    );
    for (j, _) in &statuses {
        let refused = j.refused_puts.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (code, n) in refused {
            e.sample(
                "kindling_job_doput_errors_total",
                &[("job_id", &j.job_id), ("agent", &agent), ("code", &code)],
                n as f64,
            );
        }
    }
    e.family(
        "kindling_job_step_seconds_total",
        "counter",
        "Where this rank's step time went, this attempt.",
    );
    for (j, s) in &statuses {
        let t = j
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .step_times
            .clone();
        let (job, rank) = labels(s);
        for (phase, d) in [
            ("compute", t.compute),
            ("idle", t.idle),
            ("all_reduce", t.all_reduce),
            ("optimizer", t.optimizer),
        ] {
            e.sample(
                "kindling_job_step_seconds_total",
                &[
                    ("job_id", &job),
                    ("agent", &agent),
                    ("rank", &rank),
                    ("phase", phase),
                ],
                d.as_secs_f64(),
            );
        }
    }
    // Jobs that never formed a gang have no ring.
    let rings: Vec<_> = statuses
        .iter()
        .filter(|(_, s)| !(matches!(s.state, AgentJobState::Ganging) && s.attempt == 0))
        .map(|(j, _)| (j.job_id.as_str(), &j.ring_stats))
        .collect();
    let a = agent.as_str();
    e.family(
        "kindling_allreduce_total",
        "counter",
        "All-reduces done by this agent's rings.",
    );
    for (job, r) in &rings {
        e.sample(
            "kindling_allreduce_total",
            &[("job_id", job), ("agent", a)],
            r.ops.load(Ordering::Relaxed) as f64,
        );
    }
    e.family(
        "kindling_allreduce_bytes_total",
        "counter",
        "Bytes all-reduced, as sent.",
    );
    for (job, r) in &rings {
        let bytes = r.bytes.load(Ordering::Relaxed) as f64;
        e.sample(
            "kindling_allreduce_bytes_total",
            &[("job_id", job), ("agent", a)],
            bytes,
        );
    }
    e.family(
        "kindling_allreduce_seconds",
        "histogram",
        "How long an all-reduce took.",
    );
    for (job, r) in &rings {
        let mut cumulative = 0;
        for (bound, n) in ALL_REDUCE_SECONDS.iter().zip(&r.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let le = bound.to_string();
            let labels = [("job_id", *job), ("agent", a), ("le", le.as_str())];
            e.sample("kindling_allreduce_seconds_bucket", &labels, cumulative as f64);
        }
        let ops = r.ops.load(Ordering::Relaxed) as f64;
        e.sample(
            "kindling_allreduce_seconds_bucket",
            &[("job_id", job), ("agent", a), ("le", "+Inf")],
            ops,
        );
        let sum = r.micros.load(Ordering::Relaxed) as f64 / 1e6;
        e.sample(
            "kindling_allreduce_seconds_sum",
            &[("job_id", job), ("agent", a)],
            sum,
        );
        e.sample(
            "kindling_allreduce_seconds_count",
            &[("job_id", job), ("agent", a)],
            ops,
        );
    }
    e.finish()
}
