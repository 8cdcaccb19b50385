//! [`GangMember`]: one member's place in a formed gang and what it does there —
//! barrier / all-gather on one stream kept open, failure and completion
//! reports, and watching for the attempt's end.

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::client::RendezvousClient;
use super::error::ClientError;
use super::types::{AgentInfo, JobState, JobStatus, Membership};
use crate::pb::rendezvous as pb;

type Result<T, E = ClientError> = std::result::Result<T, E>;

/// This member's place in a formed gang, with the collective calls of the
/// attempt. Sequence numbers are kept here: every member must make the same
/// sequence of barrier / all-gather calls.
#[derive(Debug)]
pub struct GangMember {
    client: RendezvousClient,
    agent_id: String,
    membership: Membership,
    /// The next collective's sequence number and the open all-gather stream
    /// (`None` before the first call and after an error). One lock: calls on
    /// one gang are serialised, in sequence order.
    collective: tokio::sync::Mutex<(u64, Option<GatherStream>)>,
}

/// An open `AllGatherStream`: one reply per request, in order.
pub(super) struct GatherStream {
    requests: mpsc::Sender<pb::AllGatherRequest>,
    replies: tonic::Streaming<pb::AllGatherResponse>,
}

impl std::fmt::Debug for GatherStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherStream").finish_non_exhaustive()
    }
}

impl GatherStream {
    /// Opens an all-gather stream and sends `first` on it (so opening costs
    /// no extra round trip).
    async fn open(client: &RendezvousClient, first: pb::AllGatherRequest) -> Result<Self> {
        let (requests, rx) = mpsc::channel(1);
        // Cannot fail: the receiver is alive and the channel is empty.
        let _ = requests.try_send(first);
        let replies = client
            .grpc()
            .all_gather_stream(ReceiverStream::new(rx))
            .await
            .map_err(ClientError::rpc("all_gather"))?
            .into_inner();
        Ok(GatherStream { requests, replies })
    }

    /// Sends `request` and waits for its reply.
    async fn call(&mut self, request: pb::AllGatherRequest) -> Result<pb::AllGatherResponse> {
        let ended = || ClientError::Rpc {
            op: "all_gather",
            source: tonic::Status::unavailable("the rendezvous closed the all-gather stream"),
        };
        self.requests.send(request).await.map_err(|_| ended())?;
        self.next_reply().await
    }

    async fn next_reply(&mut self) -> Result<pb::AllGatherResponse> {
        self.replies
            .message()
            .await
            .map_err(ClientError::rpc("all_gather"))?
            .ok_or_else(|| ClientError::Rpc {
                op: "all_gather",
                source: tonic::Status::unavailable("the rendezvous closed the all-gather stream"),
            })
    }
}

pub(super) fn gather_request(
    job_id: &str,
    attempt: u32,
    rank: u32,
    seq: u64,
    payload: Bytes,
) -> pb::AllGatherRequest {
    pb::AllGatherRequest {
        job_id: job_id.to_owned(),
        attempt,
        rank,
        seq,
        payload,
    }
}

impl GangMember {
    pub(super) fn new(client: RendezvousClient, agent_id: String, membership: Membership) -> Self {
        GangMember {
            client,
            agent_id,
            membership,
            collective: tokio::sync::Mutex::new((0, None)),
        }
    }

    /// Rank, world size, peers.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }
    /// This member's rank (ranks follow ascending agent id).
    pub fn rank(&self) -> u32 {
        self.membership.rank
    }
    /// Number of members.
    pub fn world_size(&self) -> u32 {
        self.membership.world_size
    }
    /// The attempt this gang belongs to.
    pub fn attempt(&self) -> u32 {
        self.membership.attempt
    }
    /// Every member in rank order.
    pub fn peers(&self) -> &[AgentInfo] {
        &self.membership.peers
    }

    /// Like Spark's `BarrierTaskContext.allGather`: every member's payload in
    /// rank order. Fails (ABORTED / DEADLINE_EXCEEDED) when the attempt fails.
    ///
    /// Calls travel on one stream kept open for the gang (opened by the
    /// first call, re-opened after an error). A call the rendezvous dropped
    /// (a restart) is sent again with the same sequence number within the
    /// client's outage bound: the server answers a repeat of the collective
    /// that just completed with its result.
    pub async fn all_gather(&self, payload: impl Into<Bytes>) -> Result<Vec<Bytes>> {
        let m = &self.membership;
        let mut guard = self.collective.lock().await;
        let (next_seq, open) = &mut *guard;
        let request = gather_request(&m.job_id, m.attempt, m.rank, *next_seq, payload.into());
        *next_seq += 1;
        let mut backoff = self.client.backoff();
        let reply = loop {
            let reply = match open {
                Some(stream) => stream.call(request.clone()).await,
                None => match GatherStream::open(&self.client, request.clone()).await {
                    Ok(mut stream) => {
                        let reply = stream.next_reply().await;
                        *open = Some(stream);
                        reply
                    }
                    Err(e) => Err(e),
                },
            };
            match reply {
                Ok(reply) => break reply,
                Err(e) => {
                    *open = None;
                    backoff.wait("all_gather", e).await?;
                }
            }
        };
        let payloads = reply.payloads;
        if payloads.is_empty() {
            // A barrier: the server sends no payloads when all are empty.
            return Ok(vec![Bytes::new(); m.world_size as usize]);
        }
        if payloads.len() != m.world_size as usize {
            return Err(ClientError::Malformed {
                op: "all_gather",
                detail: format!("{} payloads for world size {}", payloads.len(), m.world_size),
            });
        }
        Ok(payloads)
    }

    /// Like Spark's `BarrierTaskContext.barrier`.
    pub async fn barrier(&self) -> Result<()> {
        self.all_gather(Bytes::new()).await.map(drop)
    }

    /// Reports this attempt failed; returns the attempt to re-join.
    pub async fn report_failure(&self, cause: &str) -> Result<Option<u32>> {
        let m = &self.membership;
        self.client
            .report_failure(&m.job_id, m.attempt, &self.agent_id, cause)
            .await
    }

    /// Reports this attempt failed for a reason no attempt can escape (the
    /// job's input or spec): the job fails for good.
    pub async fn report_final_failure(&self, cause: &str) -> Result<()> {
        let m = &self.membership;
        self.client
            .report(&m.job_id, m.attempt, &self.agent_id, cause, true)
            .await
            .map(drop)
    }

    /// Marks the job succeeded.
    pub async fn complete(&self) -> Result<()> {
        let m = &self.membership;
        self.client.complete(&m.job_id, m.attempt).await
    }

    /// Resolves when the rendezvous says this attempt is over — failed,
    /// superseded by a later attempt, or cancelled — with that status; or
    /// with the error when the watch cannot be opened or breaks. Never
    /// resolves once the job succeeded in this attempt: the first member to
    /// complete ends the job's watch while the others are still finishing,
    /// and they must not take that for a failure. Drop it to stop watching.
    ///
    /// A watch the rendezvous drops (a restart) is opened again, within the
    /// client's outage bound: a rendezvous that comes back with the job
    /// where it was (its state dir) costs the attempt nothing.
    pub async fn attempt_over(&self) -> Result<JobStatus> {
        let attempt = self.attempt();
        let mut succeeded = false;
        let mut backoff = self.client.backoff();
        loop {
            let mut watch = self.client.watch(&self.membership.job_id).await?;
            let broken = loop {
                let status = match watch.next().await {
                    Some(Ok(status)) => status,
                    Some(Err(e)) => break e,
                    None => {
                        break ClientError::Rpc {
                            op: "watch",
                            source: tonic::Status::unavailable("the rendezvous ended the watch"),
                        };
                    }
                };
                backoff.reset();
                succeeded = status.state == JobState::Succeeded && status.attempt == attempt;
                if status.attempt > attempt || matches!(status.state, JobState::Failed | JobState::Cancelled)
                {
                    return Ok(status);
                }
            };
            if succeeded {
                std::future::pending::<()>().await;
            }
            backoff.wait("watch", broken).await?;
        }
    }
}
