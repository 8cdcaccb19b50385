//! Prometheus metrics at `/metrics` on the agent's and the rendezvous' own
//! port: HTTP/1.1 told apart from gRPC by its first bytes (or TLS ALPN
//! `http/1.1`), so the same TLS and the same bearer token guard it as every
//! other call there; only the operator token reads it (metrics span every
//! job). Probes stay open on the health port.
//!
//! The text exposition format (version 0.0.4), rendered on each scrape from
//! the live state; no series outlives what it describes — a job's series go
//! when the agent drops the job (`--finished-retention-secs`, 1 h after it
//! ends), a rendezvous job's with its retention. The agent's own families
//! are in [`crate::metrics`]; the rendezvous' are here.

use std::fmt::Write as _;

use kindling_schemas::auth::{BearerCheck, Caller};
use kindling_schemas::rendezvous::{AgentInfo, JobStatus};
use kindling_schemas::tls::Conn;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::health::{read_head, write_response};

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

/// Serves `GET /metrics` on the HTTP/1.1 connections of a port, rendering
/// `scrape()` for each request from the operator.
pub async fn serve<F>(mut conns: mpsc::Receiver<Conn>, check: BearerCheck, stop: CancellationToken, scrape: F)
where
    F: Fn() -> String + Send + Sync + 'static,
{
    let scrape = std::sync::Arc::new(scrape);
    loop {
        let mut conn = tokio::select! {
            _ = stop.cancelled() => return,
            c = conns.recv() => match c {
                Some(c) => c,
                None => return,
            },
        };
        let (check, scrape) = (check.clone(), scrape.clone());
        tokio::spawn(async move {
            let (status, body, head_only) = match read_head(&mut conn).await {
                Ok(Some(Ok(head))) => {
                    let (status, body) = answer(
                        &head.method,
                        &head.path,
                        head.authorization.as_deref(),
                        &check,
                        &*scrape,
                    );
                    (status, body, head.method == "HEAD")
                }
                Ok(Some(Err(()))) => ("400 Bad Request", "bad request\n".to_owned(), false),
                _ => return,
            };
            let content_type = if status.starts_with("200") {
                CONTENT_TYPE
            } else {
                "text/plain"
            };
            let _ = write_response(&mut conn, status, content_type, body.as_bytes(), head_only).await;
        });
    }
}

fn answer(
    method: &str,
    path: &str,
    authorization: Option<&str>,
    check: &BearerCheck,
    scrape: &(dyn Fn() -> String + Send + Sync),
) -> (&'static str, String) {
    if !matches!(method, "GET" | "HEAD") {
        return ("405 Method Not Allowed", "method not allowed\n".into());
    }
    if path != "/metrics" {
        return (
            "404 Not Found",
            "not found: this port serves /metrics over HTTP\n".into(),
        );
    }
    let token = authorization.and_then(|a| a.strip_prefix("Bearer "));
    match check.caller_of(token) {
        Ok(Caller::Operator) => ("200 OK", scrape()),
        Ok(Caller::Job(_)) => (
            "403 Forbidden",
            "a job credential cannot read /metrics (they span every job): use the operator token\n".into(),
        ),
        Err(status) => (
            "401 Unauthorized",
            format!("{}: send `authorization: Bearer <token>`\n", status.message()),
        ),
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
        let n = jobs
            .iter()
            .filter(|j| format!("{:?}", j.state).to_lowercase() == state)
            .count();
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

    #[test]
    fn only_the_operator_reads_metrics() {
        let check = BearerCheck::new(Some(kindling_schemas::auth::Token::new("t")));
        let scrape = || "m 1\n".to_owned();
        assert_eq!(
            answer("GET", "/metrics", Some("Bearer t"), &check, &scrape).0,
            "200 OK"
        );
        assert_eq!(
            answer("GET", "/metrics", None, &check, &scrape).0,
            "401 Unauthorized"
        );
        assert_eq!(
            answer("GET", "/metrics", Some("Bearer x"), &check, &scrape).0,
            "401 Unauthorized"
        );
        assert_eq!(
            answer("GET", "/", Some("Bearer t"), &check, &scrape).0,
            "404 Not Found"
        );
        assert_eq!(
            answer("POST", "/metrics", Some("Bearer t"), &check, &scrape).0,
            "405 Method Not Allowed"
        );
    }
}
