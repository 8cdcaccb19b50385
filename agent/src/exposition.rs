//! Prometheus metrics at `/metrics` on the agent's and the rendezvous' own
//! port (served by [`crate::http`]: the same TLS as every other call there,
//! the operator or the viewer token).
//!
//! The text exposition format (version 0.0.4), rendered on each scrape from
//! the live state; no series outlives what it describes — a job's series go
//! when the agent drops the job (`--finished-retention-secs`, 1 h after it
//! ends), a rendezvous job's with its retention. The agent's own families
//! are in [`crate::metrics`]; the rendezvous' are here.

use std::fmt::Write as _;

use kindling_schemas::rendezvous::{AgentInfo, JobStatus};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metrics page being written: each family's `HELP` and `TYPE` once,
/// then its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
    }

    /// The page.
    pub fn finish(self) -> String {
        self.out
    }
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

/// The rendezvous' metrics, from its jobs and registered agents.
pub fn rendezvous(jobs: &[JobStatus], agents: &[AgentInfo]) -> String {
    let mut e = Exposition::default();
    e.family(
        "kindling_rendezvous_agents",
        "gauge",
        "Registered agents with a live lease.",
    );
    e.sample("kindling_rendezvous_agents", &[], agents.len() as f64);
    e.family("kindling_rendezvous_jobs", "gauge", "Jobs by state.");
    for state in ["ganging", "running", "succeeded", "failed", "cancelled"] {
        let n = jobs.iter().filter(|j| j.state.as_str() == state).count();
        e.sample("kindling_rendezvous_jobs", &[("state", state)], n as f64);
    }
    e.family(
        "kindling_rendezvous_job_attempt",
        "gauge",
        "The job's current attempt.",
    );
    for j in jobs {
        e.sample(
            "kindling_rendezvous_job_attempt",
            &[("job_id", &j.job_id)],
            j.attempt as f64,
        );
    }
    e.family(
        "kindling_rendezvous_job_gang_size",
        "gauge",
        "Members of the job's current attempt.",
    );
    for j in jobs {
        e.sample(
            "kindling_rendezvous_job_gang_size",
            &[("job_id", &j.job_id)],
            j.members.len() as f64,
        );
    }
    e.family(
        "kindling_rendezvous_job_failures",
        "gauge",
        "Failed attempts of the job, by cause.",
    );
    for j in jobs {
        let mut causes = std::collections::BTreeMap::<&str, u64>::new();
        for f in &j.failures {
            *causes.entry(cause_kind(&f.cause)).or_default() += 1;
        }
        for (cause, n) in causes {
            e.sample(
                "kindling_rendezvous_job_failures",
                &[("job_id", &j.job_id), ("cause", cause)],
                n as f64,
            );
        }
    }
    e.finish()
}

/// A failure cause's kind, a bounded label: `left`, `lease`, `peer`,
/// `timeout`, `error`.
fn cause_kind(cause: &str) -> &'static str {
    if cause.contains(" left") {
        "left"
    } else if cause.contains("lease") {
        "lease"
    } else if cause.contains("peer ") {
        "peer"
    } else if cause.contains("timed out") || cause.contains("timeout") {
        "timeout"
    } else {
        "error"
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn samples_escape_their_labels_and_special_values() {
        let mut e = Exposition::default();
        e.family("x", "gauge", "An x.");
        e.sample("x", &[("job", "a\"b\\c\nd")], 1.5);
        e.sample("x", &[], f64::INFINITY);
        let page = e.finish();
        assert_eq!(
            page,
            "# HELP x An x.\n# TYPE x gauge\nx{job=\"a\\\"b\\\\c\\nd\"} 1.5\nx +Inf\n"
        );
    }

    /// Every sample follows its own family's `TYPE` line, unbroken (the
    /// format Prometheus parses).
    pub(crate) fn assert_grouped(page: &str) {
        let mut current = String::new();
        let mut seen = std::collections::HashSet::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap_or("").to_owned();
                assert!(
                    seen.insert(current.clone()),
                    "family {current} declared twice:\n{page}"
                );
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap_or("");
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| *f == current))
                    .unwrap_or(name);
                assert_eq!(family, current, "sample `{line}` outside its family:\n{page}");
            }
        }
    }

    #[test]
    fn the_rendezvous_page_groups_its_families() {
        use kindling_schemas::rendezvous::{AttemptFailure, JobState};
        let job = |id: &str, cause: &str| JobStatus {
            job_id: id.into(),
            state: JobState::Running,
            attempt: 2,
            max_attempts: 3,
            num_slots: 2,
            members: vec!["a".into(), "b".into()],
            failures: vec![AttemptFailure {
                attempt: 1,
                agent_id: "a".into(),
                cause: cause.into(),
                at: std::time::SystemTime::UNIX_EPOCH,
            }],
            spec_summary: String::new(),
            created: std::time::SystemTime::UNIX_EPOCH,
            updated: std::time::SystemTime::UNIX_EPOCH,
            cancel_reason: None,
        };
        let page = rendezvous(
            &[job("x", "agent a left: SIGTERM"), job("y", "peer p unavailable")],
            &[],
        );
        assert_grouped(&page);
        assert!(
            page.contains("kindling_rendezvous_job_failures{job_id=\"x\",cause=\"left\"} 1"),
            "{page}"
        );
        assert!(
            page.contains("kindling_rendezvous_jobs{state=\"running\"} 2"),
            "{page}"
        );
    }
}
