//! The rendezvous' Prometheus families (jobs by state, attempts, gang sizes,
//! failures by cause, live agents), written on every scrape from the state;
//! the page around them is `kindling_ops::exposition`'s.

use kindling_ops::exposition::{family, single};
use kindling_schemas::rendezvous::{AgentInfo, JobStatus};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

/// The families for `jobs` and `agents` (their collector is the status
/// page's, [`crate::page`]).
pub fn families(
    mut e: DescriptorEncoder<'_>,
    jobs: &[JobStatus],
    agents: &[AgentInfo],
) -> Result<(), std::fmt::Error> {
    leader(&mut e, true)?;
    single(
        &mut e,
        "kindling_rendezvous_agents",
        "Registered agents with a live lease.",
        MetricType::Gauge,
        agents.len() as f64,
    )?;
    let mut f = family(
        &mut e,
        "kindling_rendezvous_jobs",
        "Jobs by state.",
        MetricType::Gauge,
    )?;
    for state in ["ganging", "running", "succeeded", "failed", "cancelled"] {
        let n = jobs.iter().filter(|j| j.state.as_str() == state).count();
        f.int(&[("state", state)], n as i64)?;
    }
    let mut f = family(
        &mut e,
        "kindling_rendezvous_job_attempt",
        "The job's current attempt.",
        MetricType::Gauge,
    )?;
    for j in jobs {
        f.int(&[("job_id", j.job_id.as_str())], j.attempt as i64)?;
    }
    let mut f = family(
        &mut e,
        "kindling_rendezvous_job_gang_size",
        "Members of the job's current attempt.",
        MetricType::Gauge,
    )?;
    for j in jobs {
        f.int(&[("job_id", j.job_id.as_str())], j.members.len() as i64)?;
    }
    let mut f = family(
        &mut e,
        "kindling_rendezvous_job_failures",
        "Failed attempts of the job, by cause.",
        MetricType::Gauge,
    )?;
    for j in jobs {
        let mut causes = std::collections::BTreeMap::<&str, u64>::new();
        for failure in &j.failures {
            *causes.entry(cause_kind(&failure.cause)).or_default() += 1;
        }
        for (cause, n) in causes {
            f.int(&[("job_id", j.job_id.as_str()), ("cause", cause)], n as i64)?;
        }
    }
    Ok(())
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
mod tests {
    use kindling_fixtures::assert_grouped;
    use kindling_ops::exposition::encode;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    use super::*;

    fn page_of(c: impl Collector) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(c));
        encode(&registry)
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
            incarnation: 1,
            detached: false,
        };
        #[derive(Debug)]
        struct Fixed(Vec<JobStatus>);
        impl Collector for Fixed {
            fn encode(&self, e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
                families(e, &self.0, &[])
            }
        }
        let jobs = vec![job("x", "agent a left: SIGTERM"), job("y", "peer p unavailable")];
        let page = page_of(Fixed(jobs));
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

/// `kindling_rendezvous_leader`: 1 where this process answers from the state
/// (a single rendezvous always; of replicas on etcd, the leader), 0 on a
/// follower, whose `/metrics` has nothing else of the rendezvous'.
pub fn leader(e: &mut DescriptorEncoder<'_>, leads: bool) -> Result<(), std::fmt::Error> {
    single(
        e,
        "kindling_rendezvous_leader",
        "1 when this rendezvous answers from the state (the leader of replicas on etcd), 0 on a follower.",
        MetricType::Gauge,
        if leads { 1.0 } else { 0.0 },
    )
}

/// What a follower replica's `/metrics` shows of the rendezvous.
#[derive(Debug)]
pub struct Follower;

impl prometheus_client::collector::Collector for Follower {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        leader(&mut encoder, false)
    }
}
