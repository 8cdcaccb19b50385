//! Following a job at the rendezvous: its `Watch` stream of states
//! ([`JobWatch`]), with its agents' reports too ([`ReportWatch`]).

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};

use super::client::{RendezvousClient, status_from_pb};
use super::error::ClientError;
use super::types::{JobStatus, MemberReport};
use crate::pb::rendezvous as pb;

type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A stream of a job's states: the current one first, then every change
/// (intermediate states may be skipped); ends after a terminal state.
pub struct JobWatch {
    inner: Pin<Box<dyn Stream<Item = Result<JobStatus>> + Send>>,
}

/// [`RendezvousClient::watch_reports`]' stream: the job's state with its
/// agents' latest reports of it, the current ones first; ends after a
/// terminal state.
pub struct ReportWatch {
    inner: Events,
}

/// A watch's events: the job's state and its agents' reports.
type Events = Pin<Box<dyn Stream<Item = Result<(JobStatus, Vec<MemberReport>)>> + Send>>;

impl std::fmt::Debug for ReportWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportWatch").finish_non_exhaustive()
    }
}

impl Stream for ReportWatch {
    type Item = Result<(JobStatus, Vec<MemberReport>)>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for JobWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobWatch").finish_non_exhaustive()
    }
}

impl Stream for JobWatch {
    type Item = Result<JobStatus>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl RendezvousClient {
    /// Streams the job's state changes, starting with the current state.
    pub async fn watch(&self, job_id: &str) -> Result<JobWatch> {
        let stream = self.watch_events(job_id, false).await?;
        let inner = Box::pin(stream.map(|event| event.map(|(status, _)| status)));
        Ok(JobWatch { inner })
    }

    /// Streams the job's state and what its agents report of it: an event
    /// when the state changes or a report does (the agents' heartbeats, at
    /// most every 100 ms); ends after a terminal state. How a client follows
    /// a job without asking each agent.
    pub async fn watch_reports(&self, job_id: &str) -> Result<ReportWatch> {
        let inner = self.watch_events(job_id, true).await?;
        Ok(ReportWatch { inner })
    }

    async fn watch_events(&self, job_id: &str, with_reports: bool) -> Result<Events> {
        let request = pb::WatchRequest {
            job_id: job_id.to_owned(),
            with_reports,
        };
        let stream = self
            .retrying("watch", |mut g| {
                let request = request.clone();
                async move { g.watch(request).await }
            })
            .await?;
        Ok(Box::pin(stream.map(|event| {
            let event = event.map_err(ClientError::rpc("watch"))?;
            let status = event.status.ok_or_else(|| ClientError::Malformed {
                op: "watch",
                detail: "event without status".to_owned(),
            })?;
            let reports = event
                .reports
                .into_iter()
                .map(MemberReport::try_from)
                .collect::<Result<_>>()?;
            Ok((status_from_pb("watch", status)?, reports))
        })))
    }
}

impl TryFrom<pb::MemberReport> for MemberReport {
    type Error = ClientError;

    fn try_from(r: pb::MemberReport) -> Result<Self> {
        let status = serde_json::from_slice(&r.status_json).map_err(|e| ClientError::Malformed {
            op: "watch",
            detail: format!("agent `{}`'s report: {e}", r.agent_id),
        })?;
        Ok(MemberReport {
            agent_id: r.agent_id,
            status,
            age: Duration::from_millis(r.age_ms),
        })
    }
}
