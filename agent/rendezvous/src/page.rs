//! The rendezvous' status page: `/` is the page (one HTML file embedded in
//! the binary: no CDN, clusters are often offline), `/api/status` the data it
//! polls — the rendezvous' jobs (state, members, attempts and their causes)
//! joined with what each agent's heartbeats last reported of them (epochs,
//! sampled step losses, ranks' throughput, cache, warnings and errors).
//! Served with `/metrics` by `kindling_ops::web`, under the same TLS and tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kindling_schemas::action::{AgentJobStatus, JobEvent};
use kindling_schemas::rendezvous::{AgentInfo, AgentReport, JobStatus, MAX_REPORT_BYTES};
use serde_json::{Value, json};

use crate::state::RendezvousState;

/// The page.
pub const INDEX_HTML: &str = include_str!("page/index.html");

/// Most events a job shows (newest), across its agents.
const EVENTS_SHOWN: usize = 50;

/// The latest report of every agent that sent one, in memory only; a
/// version that moves with every report kept, for the watches that carry
/// them.
#[derive(Clone, Debug)]
pub struct Reports {
    inner: Arc<Mutex<HashMap<String, (Instant, AgentReport)>>>,
    version: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for Reports {
    fn default() -> Self {
        Reports {
            inner: Arc::default(),
            version: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl Reports {
    /// Keeps `agent_id`'s report (empty: nothing to keep). A report over
    /// [`MAX_REPORT_BYTES`] or that does not parse is refused with the
    /// reason; the agent's previous report stays.
    pub fn store(&self, agent_id: &str, bytes: &[u8]) -> Result<(), ReportError> {
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.len() > MAX_REPORT_BYTES {
            return Err(ReportError::TooLarge { bytes: bytes.len() });
        }
        let report: AgentReport = serde_json::from_slice(bytes)?;
        self.lock().insert(agent_id.to_owned(), (Instant::now(), report));
        self.version.send_modify(|v| *v += 1);
        Ok(())
    }

    /// Wakes on each report kept from now on.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// What every agent holding `job_id` last reported of it, by agent id.
    pub fn of_job(&self, job_id: &str) -> Vec<kindling_schemas::pb::rendezvous::MemberReport> {
        let mut reports: Vec<_> = self
            .lock()
            .iter()
            .filter_map(|(agent_id, (at, report))| {
                let job = report.jobs.iter().find(|j| j.job_id == job_id)?;
                Some(kindling_schemas::pb::rendezvous::MemberReport {
                    agent_id: agent_id.clone(),
                    status_json: serde_json::to_vec(job).ok()?,
                    age_ms: at.elapsed().as_millis() as u64,
                })
            })
            .collect();
        reports.sort_by(|a, b| a.agent_id.cmp(&b.agent_id));
        reports
    }

    /// Drops the reports older than `age` (agents gone for that long).
    pub fn prune(&self, age: Duration) {
        self.lock().retain(|_, (at, _)| at.elapsed() <= age);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, AgentReport)>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why an agent's heartbeat report was not kept.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Over [`MAX_REPORT_BYTES`].
    #[error("report of {bytes} bytes is over the {MAX_REPORT_BYTES}-byte bound")]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
    /// Not an [`AgentReport`] in JSON.
    #[error("report does not parse: {0}")]
    Json(#[from] serde_json::Error),
}

/// The pages of the rendezvous' HTTP side: the status page, its data and
/// the metrics.
pub fn pages(state: RendezvousState, reports: Reports) -> kindling_ops::web::Pages {
    let registry = kindling_ops::exposition::registry("rendezvous", RendezvousCollector(state.clone()));
    Arc::new(move |path: &str| {
        let (content_type, body) = match path {
            "/" | "/index.html" => (
                "text/html; charset=utf-8",
                bytes::Bytes::from_static(INDEX_HTML.as_bytes()),
            ),
            "/api/status" => {
                let jobs = state.list_jobs().unwrap_or_default();
                let agents = state.list_agents().unwrap_or_default();
                // Reports of agents gone for longer than finished jobs are kept.
                reports.prune(state.config().retention);
                let body = status(&jobs, &agents, &reports.lock(), now_ms());
                ("application/json", body.to_string().into())
            }
            "/metrics" => (
                kindling_ops::exposition::CONTENT_TYPE,
                kindling_ops::exposition::encode(&registry).into(),
            ),
            _ => return None,
        };
        Some(kindling_ops::web::Page { content_type, body })
    })
}

/// The rendezvous' metric families, written on each scrape from its state.
#[derive(Debug)]
struct RendezvousCollector(RendezvousState);

impl prometheus_client::collector::Collector for RendezvousCollector {
    fn encode(
        &self,
        encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let jobs = self.0.list_jobs().unwrap_or_default();
        let agents = self.0.list_agents().unwrap_or_default();
        crate::metrics::families(encoder, &jobs, &agents)
    }
}

fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A number the page can draw: `null` for NaN and infinities (JSON has none).
fn finite(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

/// The data of the status page (see the page's own contract in
/// `page/index.html`).
pub fn status(
    jobs: &[JobStatus],
    agents: &[AgentInfo],
    reports: &HashMap<String, (Instant, AgentReport)>,
    now_ms: u64,
) -> Value {
    let agents_json: Vec<Value> = agents
        .iter()
        .map(|a| {
            let report = reports.get(&a.agent_id);
            json!({
                "agent_id": a.agent_id,
                "address": a.flight_address,
                "report_age_ms": report.map(|(at, _)| at.elapsed().as_millis() as u64),
                "cache_bytes_memory": report.map(|(_, r)| r.cache_bytes_memory).unwrap_or(0),
                "cache_bytes_disk": report.map(|(_, r)| r.cache_bytes_disk).unwrap_or(0),
                "cache_budget_bytes": report.map(|(_, r)| r.cache_budget_bytes).unwrap_or(0),
            })
        })
        .collect();
    let jobs_json: Vec<Value> = jobs.iter().map(|j| job(j, reports)).collect();
    json!({ "now_ms": now_ms, "agents": agents_json, "jobs": jobs_json })
}

fn job(j: &JobStatus, reports: &HashMap<String, (Instant, AgentReport)>) -> Value {
    // Every agent's view of this job, the current attempt's members first.
    let mut views: Vec<&AgentJobStatus> = reports
        .values()
        .flat_map(|(_, r)| r.jobs.iter().filter(|s| s.job_id == j.job_id))
        .collect();
    views.sort_by_key(|s| {
        (
            std::cmp::Reverse(s.attempt),
            s.rank.unwrap_or(u32::MAX),
            s.agent_id.clone(),
        )
    });
    // The epochs are every rank's (losses are means over all ranks): the view
    // that has seen the most of them speaks for the job.
    let lead = views
        .iter()
        .max_by_key(|s| (s.history.len(), s.step_losses.len(), std::cmp::Reverse(s.rank)))
        .copied();
    let history: Vec<Value> = lead
        .map(|s| {
            s.history
                .iter()
                .map(|m| {
                    json!({
                        "epoch": m.epoch,
                        "train_loss": finite(m.train_loss),
                        "eval_loss": m.eval_loss.map(finite),
                        "eval_accuracy": m.eval_accuracy.map(finite),
                        "samples_per_sec": finite(m.samples_per_sec),
                        "wall_secs": m.wall_secs.map(finite),
                        "rows": m.rows,
                        "learning_rate": m.learning_rate.map(finite),
                        "metrics": m.metrics.iter().map(|(k, v)| (k.clone(), finite(*v))).collect::<serde_json::Map<String, Value>>(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let step_losses: Vec<Value> = lead
        .map(|s| {
            s.step_losses
                .iter()
                .map(|p| json!({"epoch": p.epoch, "step": p.step, "loss": finite(p.loss)}))
                .collect()
        })
        .unwrap_or_default();
    let ranks: Vec<Value> = views
        .iter()
        .map(|s| {
            json!({
                "rank": s.rank,
                "agent_id": s.agent_id,
                "state": s.state,
                "attempt": s.attempt,
                "epoch": s.epoch,
                "step": s.step,
                "steps_per_epoch": s.steps_per_epoch,
                "loss": s.loss.map(finite),
                "samples_per_sec": finite(s.samples_per_sec),
                "rows_train": s.rows_train,
                "rows_eval": s.rows_eval,
                "cache_bytes_memory": s.cache_bytes_memory,
                "cache_bytes_disk": s.cache_bytes_disk,
                "device": s.device,
                "error": s.error,
            })
        })
        .collect();
    let mut events: Vec<&JobEvent> = views.iter().flat_map(|s| s.events.iter()).collect();
    events.sort_by_key(|e| (e.at_ms, e.agent_id.clone(), e.seq));
    let skip = events.len().saturating_sub(EVENTS_SHOWN);
    let events: Vec<&JobEvent> = events.into_iter().skip(skip).collect();
    json!({
        "job_id": j.job_id,
        "state": j.state.as_str(),
        "attempt": j.attempt,
        "max_attempts": j.max_attempts,
        "num_slots": j.num_slots,
        "members": j.members,
        "created_ms": unix_ms(j.created),
        "updated_ms": unix_ms(j.updated),
        "cancel_reason": j.cancel_reason,
        "detached": j.detached,
        "spec_summary": j.spec_summary,
        "failures": j.failures.iter().map(|f| json!({
            "attempt": f.attempt,
            "agent_id": f.agent_id,
            "cause": f.cause,
            "at_ms": unix_ms(f.at),
        })).collect::<Vec<_>>(),
        "epochs": lead.map(|s| s.epochs),
        "history": history,
        "best_epoch": lead.and_then(|s| s.best_epoch),
        "stopped_early": lead.and_then(|s| s.stopped_early),
        "step_losses": step_losses,
        "ranks": ranks,
        "events": events,
    })
}

#[cfg(test)]
mod tests {
    use kindling_schemas::action::{AgentJobState, EpochMetrics, EventLevel};
    use kindling_schemas::rendezvous::JobState;

    use super::*;

    fn view(agent: &str, rank: u32, epochs_done: u32) -> AgentJobStatus {
        AgentJobStatus {
            job_id: "j".into(),
            agent_id: agent.into(),
            state: AgentJobState::Training,
            attempt: 1,
            rank: Some(rank),
            world_size: 2,
            epoch: epochs_done + 1,
            epochs: 5,
            step: 3,
            steps_per_epoch: 10,
            loss: Some(f64::NAN),
            rows_train: 100,
            rows_eval: 0,
            rows_trained_per_epoch: vec![],
            samples_per_sec: 10.0,
            cache_bytes_memory: 5,
            cache_bytes_disk: 0,
            history: (1..=epochs_done)
                .map(|e| EpochMetrics {
                    epoch: e,
                    train_loss: 1.0 / e as f64,
                    rows: 100,
                    eval_loss: None,
                    eval_accuracy: None,
                    samples_per_sec: 10.0,
                    wall_secs: Some(0.5),
                    learning_rate: None,
                    ..Default::default()
                })
                .collect(),
            resumed_from_epoch: None,
            resumed_from_step: None,
            error: None,
            device: "cpu (flex)".into(),
            failed_attempts: vec![],
            step_losses: vec![],
            events: vec![JobEvent {
                seq: 1,
                at_ms: 10 + rank as u64,
                level: EventLevel::Warn,
                agent_id: agent.into(),
                rank: Some(rank),
                attempt: 1,
                message: format!("from {agent}"),
            }],
            best_epoch: None,
            stopped_early: None,
        }
    }

    #[test]
    fn a_job_joins_every_agents_view_of_it() {
        let reports = Reports::default();
        for (agent, rank, done) in [("a", 0, 2), ("b", 1, 3)] {
            let report = AgentReport {
                cache_budget_bytes: 100,
                cache_bytes_memory: 5,
                cache_bytes_disk: 0,
                jobs: vec![view(agent, rank, done)],
            };
            reports
                .store(agent, &serde_json::to_vec(&report).expect("json"))
                .expect("stored");
        }
        let job = JobStatus {
            job_id: "j".into(),
            state: JobState::Running,
            attempt: 1,
            max_attempts: 3,
            num_slots: 2,
            members: vec!["a".into(), "b".into()],
            failures: vec![],
            spec_summary: String::new(),
            created: UNIX_EPOCH,
            updated: UNIX_EPOCH,
            cancel_reason: None,
            incarnation: 1,
            detached: false,
        };
        let page = status(&[job], &[], &reports.lock(), 7);
        let j = &page["jobs"][0];
        assert_eq!(j["state"], "running");
        assert_eq!(
            j["history"].as_array().expect("history").len(),
            3,
            "the view with most epochs"
        );
        assert_eq!(j["ranks"].as_array().expect("ranks").len(), 2);
        assert_eq!(j["ranks"][0]["rank"], 0, "ranks in order");
        assert!(j["ranks"][0]["loss"].is_null(), "NaN is null: {}", j["ranks"][0]);
        let events: Vec<&str> = j["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| e["message"].as_str().expect("message"))
            .collect();
        assert_eq!(events, ["from a", "from b"], "every agent's, oldest first");
        assert_eq!(j["epochs"], 5);
    }

    #[test]
    fn bad_reports_are_refused_and_the_last_good_one_stays() {
        let reports = Reports::default();
        let good = serde_json::to_vec(&AgentReport::default()).expect("json");
        reports.store("a", &good).expect("good");
        let err = reports.store("a", b"{not json").expect_err("bad");
        assert!(matches!(err, ReportError::Json(_)), "{err}");
        assert!(err.to_string().contains("does not parse"), "{err}");
        let err = reports
            .store("a", &vec![b' '; MAX_REPORT_BYTES + 1])
            .expect_err("too big");
        assert!(
            matches!(err, ReportError::TooLarge { bytes } if bytes == MAX_REPORT_BYTES + 1),
            "{err}"
        );
        assert!(reports.lock().contains_key("a"));
    }
}
