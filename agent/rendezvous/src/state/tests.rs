//! State-machine tests, no gRPC; timeouts with paused tokio time.

use std::time::Duration;

use bytes::Bytes;
use kindling_schemas::pb::rendezvous as pb;
use kindling_schemas::rendezvous::Membership;
use tokio::time::advance;

use super::*;

fn agent(id: &str) -> AgentInfo {
    AgentInfo {
        agent_id: id.to_owned(),
        flight_address: format!("http://{id}:50051"),
        collective_address: format!("http://{id}:50052"),
        node_name: format!("node-{id}"),
        capacity: 1,
        has_gpu: false,
        models: vec!["linear".into()],
    }
}

fn state() -> RendezvousState {
    RendezvousState::new(
        RendezvousConfig::default()
            .with_lease(Duration::from_secs(10))
            .with_gang_timeout(Duration::from_secs(30))
            .with_barrier_timeout(Duration::from_secs(60))
            .with_retention(Duration::from_secs(100)),
    )
    .unwrap()
}

fn with_agents(ids: &[&str]) -> RendezvousState {
    let s = state();
    for id in ids {
        s.register_agent(agent(id)).unwrap();
    }
    s
}

async fn form(s: &RendezvousState, job: &str, attempt: u32, ids: &[&str]) -> Vec<Membership> {
    let joins = ids.iter().map(|id| {
        let s = s.clone();
        let (job, id) = (job.to_owned(), id.to_string());
        tokio::spawn(async move { s.join(&job, attempt, &id).await })
    });
    let mut out = Vec::new();
    for j in joins.collect::<Vec<_>>() {
        out.push(j.await.unwrap().unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn gang_releases_everyone_with_ranks_by_agent_id() {
    let s = with_agents(&["c", "a", "b"]);
    assert_eq!(s.create_job(JobConfig::new("j", 3)).unwrap(), 1);
    let members = form(&s, "j", 1, &["c", "a", "b"]).await;
    let ranks: Vec<u32> = members.iter().map(|m| m.rank).collect();
    assert_eq!(ranks, vec![2, 0, 1]);
    let order: Vec<&str> = members[0].peers.iter().map(|p| p.agent_id.as_str()).collect();
    assert_eq!(order, vec!["a", "b", "c"]);
    assert!(members.iter().all(|m| m.world_size == 3 && m.attempt == 1));
    assert_eq!(s.job_status("j").unwrap().state, JobState::Running);
    // A retried join after formation gets the same membership.
    assert_eq!(s.join("j", 1, "b").await.unwrap().rank, 1);
}

#[tokio::test(start_paused = true)]
async fn short_gang_fails_after_the_gang_timeout_saying_how_many_joined() {
    let s = with_agents(&["a", "b"]);
    s.create_job(JobConfig::new("j", 2).with_max_attempts(2)).unwrap();
    let err = s.join("j", 1, "a").await.unwrap_err();
    assert!(
        matches!(
            err,
            RendezvousError::GangTimeout {
                joined: 1,
                expected: 2,
                next_attempt: Some(2),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("1 of 2 members joined"), "{err}");
    let status = s.job_status("j").unwrap();
    assert_eq!((status.state, status.attempt), (JobState::Ganging, 2));
    assert!(status.first_cause().unwrap().contains("gang timeout"));
}

#[tokio::test(start_paused = true)]
async fn all_gather_returns_payloads_in_rank_order() {
    let s = with_agents(&["a", "b", "c"]);
    s.create_job(JobConfig::new("j", 3)).unwrap();
    let members = form(&s, "j", 1, &["b", "c", "a"]).await;
    for seq in 0..3u64 {
        let calls: Vec<_> = members
            .iter()
            .map(|m| {
                let s = s.clone();
                let rank = m.rank;
                tokio::spawn(async move {
                    let payload = Bytes::from(format!("r{rank}s{seq}"));
                    s.all_gather("j", 1, rank, seq, payload).await
                })
            })
            .collect();
        for c in calls {
            let got = c.await.unwrap().unwrap();
            let want: Vec<Bytes> = (0..3).map(|r| Bytes::from(format!("r{r}s{seq}"))).collect();
            assert_eq!(*got, want);
        }
    }
    // Out-of-order collective is refused without changing anything.
    let err = s.all_gather("j", 1, 0, 7, Bytes::new()).await.unwrap_err();
    assert!(matches!(err, RendezvousError::WrongState { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn lapsed_lease_fails_the_attempt_and_wakes_blocked_members() {
    let s = with_agents(&["a", "b"]);
    s.create_job(JobConfig::new("j", 2)).unwrap();
    form(&s, "j", 1, &["a", "b"]).await;
    let blocked = {
        let s = s.clone();
        tokio::spawn(async move { s.all_gather("j", 1, 0, 0, Bytes::new()).await })
    };
    tokio::task::yield_now().await;
    // Only "a" keeps heartbeating.
    advance(Duration::from_secs(6)).await;
    s.heartbeat("a").unwrap();
    advance(Duration::from_secs(6)).await;
    let report = s.reap();
    assert_eq!(report.lapsed_agents, vec!["b".to_owned()]);
    let err = blocked.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            RendezvousError::AttemptFailed {
                attempt: 1,
                next_attempt: Some(2),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("lease of agent `b` lapsed"), "{err}");
    let hb = s.heartbeat("a").unwrap();
    assert_eq!(hb.failed_attempts.len(), 1);
    assert_eq!(hb.failed_attempts[0].attempt, 1);
    assert_eq!(s.job_status("j").unwrap().attempt, 2);
    // Fencing: the old attempt is refused, naming both attempts.
    let err = s.join("j", 1, "a").await.unwrap_err();
    assert!(
        matches!(
            err,
            RendezvousError::StaleAttempt {
                current: 2,
                given: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn barrier_timeout_fails_the_attempt() {
    let s = with_agents(&["a", "b"]);
    s.create_job(JobConfig::new("j", 2).with_barrier_timeout(Duration::from_secs(5)))
        .unwrap();
    form(&s, "j", 1, &["a", "b"]).await;
    let err = s.all_gather("j", 1, 1, 0, Bytes::new()).await.unwrap_err();
    assert!(
        matches!(
            err,
            RendezvousError::BarrierTimeout {
                arrived: 1,
                expected: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        s.job_status("j")
            .unwrap()
            .first_cause()
            .unwrap()
            .contains("missing ranks [0]")
    );
}

#[tokio::test(start_paused = true)]
async fn max_attempts_fails_the_job_with_the_first_cause() {
    let s = with_agents(&["a"]);
    s.create_job(JobConfig::new("j", 1).with_max_attempts(2)).unwrap();
    form(&s, "j", 1, &["a"]).await;
    assert_eq!(s.report_failure("j", 1, "a", "oom").unwrap(), Some(2));
    // A second report of the same failed attempt changes nothing.
    assert_eq!(s.report_failure("j", 1, "a", "oom again").unwrap(), Some(2));
    form(&s, "j", 2, &["a"]).await;
    assert_eq!(s.report_failure("j", 2, "a", "nan loss").unwrap(), None);
    let status = s.job_status("j").unwrap();
    assert_eq!(status.state, JobState::Failed);
    assert_eq!(status.failures.len(), 2);
    assert!(status.first_cause().unwrap().contains("oom"));
}

#[tokio::test(start_paused = true)]
async fn cancel_wakes_blocked_joins_and_finished_jobs_are_collected() {
    let s = with_agents(&["a", "b"]);
    s.create_job(JobConfig::new("j", 2)).unwrap();
    let blocked = {
        let s = s.clone();
        tokio::spawn(async move { s.join("j", 1, "a").await })
    };
    tokio::task::yield_now().await;
    s.cancel_job("j", "user asked").unwrap();
    let err = blocked.await.unwrap().unwrap_err();
    assert!(matches!(err, RendezvousError::JobCancelled { .. }), "{err}");
    s.cancel_job("j", "again").unwrap();
    advance(Duration::from_secs(101)).await;
    s.heartbeat("a").unwrap();
    s.heartbeat("b").unwrap();
    assert_eq!(s.reap().collected_jobs, vec!["j".to_owned()]);
    assert!(matches!(
        s.job_status("j"),
        Err(RendezvousError::JobNotFound { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn bad_requests_are_refused_without_state_change() {
    let s = with_agents(&["a"]);
    assert!(matches!(
        s.create_job(JobConfig::new("j", 0)),
        Err(RendezvousError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.create_job(JobConfig::new("", 1)),
        Err(RendezvousError::InvalidArgument(_))
    ));
    assert!(s.list_jobs().unwrap().is_empty());
    s.create_job(JobConfig::new("j", 1)).unwrap();
    // Idempotent with the same parameters, refused with others.
    assert_eq!(s.create_job(JobConfig::new("j", 1)).unwrap(), 1);
    assert!(matches!(
        s.create_job(JobConfig::new("j", 2)),
        Err(RendezvousError::JobExists { .. })
    ));
    form(&s, "j", 1, &["a"]).await;
    let big = Bytes::from(vec![0u8; s.config().max_payload_bytes + 1]);
    assert!(matches!(
        s.all_gather("j", 1, 0, 0, big).await,
        Err(RendezvousError::PayloadTooLarge { .. })
    ));
    assert!(matches!(
        s.all_gather("j", 1, 1, 0, Bytes::new()).await,
        Err(RendezvousError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.join("nope", 1, "a").await,
        Err(RendezvousError::JobNotFound { .. })
    ));
    // Nothing above disturbed the collective sequence.
    assert_eq!(s.all_gather("j", 1, 0, 0, Bytes::new()).await.unwrap().len(), 1);
}

// ---- restarts (the state file) ----------------------------------------------

fn durable(dir: &std::path::Path) -> RendezvousState {
    RendezvousState::open(
        RendezvousConfig::default()
            .with_lease(Duration::from_secs(10))
            .with_gang_timeout(Duration::from_secs(30))
            .with_retention(Duration::from_secs(100)),
        Some(dir),
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_restart_keeps_jobs_attempts_failures_gangs_and_agents() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    for id in ["a", "b", "c"] {
        s.register_agent(agent(id)).unwrap();
    }
    // A running job on its second attempt, with the first one's failure.
    s.create_job(JobConfig::new("run", 2).with_max_attempts(3))
        .unwrap();
    form(&s, "run", 1, &["b", "a"]).await;
    assert_eq!(s.report_failure("run", 1, "a", "boom").unwrap(), Some(2));
    let before = form(&s, "run", 2, &["a", "b"]).await;
    // A job still ganging (one of two joined), a cancelled one, a done one.
    s.create_job(JobConfig::new("gang", 2)).unwrap();
    let waiting = {
        let s = s.clone();
        tokio::spawn(async move { s.join("gang", 1, "c").await })
    };
    tokio::task::yield_now().await;
    s.create_job(JobConfig::new("cancelled", 1)).unwrap();
    s.cancel_job("cancelled", "operator said so").unwrap();
    s.create_job(JobConfig::new("done", 1)).unwrap();
    form(&s, "done", 1, &["c"]).await;
    s.complete_job("done", 1).unwrap();
    let statuses = s.list_jobs().unwrap();

    // A crash: nothing is closed, the process is gone (with it the state
    // dir's lock: the last clone of the state, in the aborted join, is
    // dropped once the task is).
    drop(s);
    waiting.abort();
    let _ = waiting.await;
    let r = durable(dir.path());

    let restored = r.list_jobs().unwrap();
    assert_eq!(restored.len(), statuses.len());
    for (was, now) in statuses.iter().zip(&restored) {
        // Everything a status says, at the wire's millisecond precision;
        // only the members of a gang still forming are gone.
        let mut was = pb::JobStatusResponse::from(was);
        if was.job_id == "gang" {
            was.members.clear();
        }
        assert_eq!(was, pb::JobStatusResponse::from(now));
    }
    let run = r.job_status("run").unwrap();
    assert_eq!((run.state, run.attempt), (JobState::Running, 2));
    assert_eq!(run.members, vec!["a", "b"]);
    assert!(run.failures[0].cause.contains("boom"));
    // Every agent is back, with a fresh lease.
    assert_eq!(r.list_agents().unwrap().len(), 3);
    assert!(r.heartbeat("a").is_ok());
    // A member whose join reply was lost gets the same membership again.
    let again = r.join("run", 2, "b").await.unwrap();
    assert_eq!(
        (again.rank, again.peers.clone()),
        (before[1].rank, before[1].peers.clone())
    );
    // The ganging job lost its blocked join: its members join again.
    let gang = r.job_status("gang").unwrap();
    assert_eq!((gang.state, gang.attempt), (JobState::Ganging, 1));
    form(&r, "gang", 1, &["c", "a"]).await;
    // The restored attempt completes.
    r.complete_job("run", 2).unwrap();
    assert_eq!(r.job_status("run").unwrap().state, JobState::Succeeded);
    // Finished jobs keep counting their retention from when they ended.
    advance(Duration::from_secs(101)).await;
    for id in ["a", "b", "c"] {
        r.heartbeat(id).unwrap();
    }
    let report = r.reap();
    assert!(report.collected_jobs.contains(&"done".to_owned()), "{report:?}");
    assert!(
        report.collected_jobs.contains(&"cancelled".to_owned()),
        "{report:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn collectives_of_a_restored_gang_resume_at_the_members_sequence_number() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    for id in ["a", "b"] {
        s.register_agent(agent(id)).unwrap();
    }
    s.create_job(JobConfig::new("j", 2)).unwrap();
    form(&s, "j", 1, &["a", "b"]).await;
    for seq in 0..3 {
        let (a, b) = tokio::join!(
            s.all_gather("j", 1, 0, seq, Bytes::from_static(b"a")),
            s.all_gather("j", 1, 1, seq, Bytes::from_static(b"b"))
        );
        a.unwrap();
        b.unwrap();
    }
    drop(s);
    let r = durable(dir.path());
    let (a, b) = tokio::join!(
        r.all_gather("j", 1, 0, 3, Bytes::from_static(b"x")),
        r.all_gather("j", 1, 1, 3, Bytes::from_static(b"y"))
    );
    assert_eq!(
        a.unwrap().as_slice(),
        &[Bytes::from_static(b"x"), Bytes::from_static(b"y")]
    );
    b.unwrap();
    // From there on the order is enforced again.
    let err = r.all_gather("j", 1, 0, 7, Bytes::new()).await.unwrap_err();
    assert!(err.to_string().contains("out of order"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_change_that_cannot_be_written_is_refused_and_written_by_its_retry() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    // A directory in the temporary file's place makes every write fail.
    let blocker = dir.path().join(".state.pb.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let err = s.create_job(JobConfig::new("j", 1)).unwrap_err();
    assert!(matches!(err, RendezvousError::Storage { .. }), "{err}");
    assert!(err.is_retryable());
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unavailable);
    std::fs::remove_dir(&blocker).unwrap();
    assert_eq!(s.create_job(JobConfig::new("j", 1)).unwrap(), 1);
    drop(s);
    assert_eq!(durable(dir.path()).job_status("j").unwrap().attempt, 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_is_announced_only_once_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    for id in ["a", "b"] {
        s.register_agent(agent(id)).unwrap();
    }
    s.create_job(JobConfig::new("j", 2).with_max_attempts(3)).unwrap();
    let mut watcher = s.watch("j").unwrap();
    watcher.borrow_and_update();
    let blocked = {
        let s = s.clone();
        tokio::spawn(async move { s.join("j", 1, "a").await })
    };
    tokio::task::yield_now().await;
    let blocker = dir.path().join(".state.pb.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let err = s.report_failure("j", 1, "b", "boom").unwrap_err();
    assert!(matches!(err, RendezvousError::Storage { .. }), "{err}");
    // Neither the watcher nor the blocked member learns of attempt 2 while
    // a crash could still take it back; the member is told to retry.
    assert!(!watcher.has_changed().unwrap(), "announced before it was written");
    assert_eq!(watcher.borrow().attempt, 1);
    // Nor does a caller reading the job, the jobs or the agents.
    let read = s.durable(s.job_status("j")).unwrap_err();
    assert!(matches!(read, RendezvousError::Storage { .. }), "{read}");
    assert!(s.durable(s.list_jobs()).is_err());
    assert!(s.durable(s.list_agents()).is_err());
    let err = blocked.await.unwrap().unwrap_err();
    assert!(matches!(err, RendezvousError::Storage { .. }), "{err}");
    std::fs::remove_dir(&blocker).unwrap();
    // The reporter's retry writes it; now it is announced.
    assert_eq!(s.report_failure("j", 1, "b", "boom").unwrap(), Some(2));
    assert!(watcher.has_changed().unwrap());
    assert_eq!(watcher.borrow_and_update().attempt, 2);
    assert_eq!(s.durable(s.job_status("j")).unwrap().attempt, 2);
    drop(s);
    let restored = durable(dir.path()).job_status("j").unwrap();
    assert_eq!((restored.attempt, restored.failures.len()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_hands_out_no_notice_before_its_failure_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    for id in ["a", "b"] {
        s.register_agent(agent(id)).unwrap();
    }
    s.create_job(JobConfig::new("j", 2).with_max_attempts(3)).unwrap();
    form(&s, "j", 1, &["a", "b"]).await;
    let blocker = dir.path().join(".state.pb.tmp");
    std::fs::create_dir(&blocker).unwrap();
    assert!(s.report_failure("j", 1, "b", "boom").is_err());
    // The failure is in memory only: a's heartbeat is UNAVAILABLE and
    // carries no notice a crash could take back.
    let err = s.heartbeat("a").unwrap_err();
    assert!(matches!(err, RendezvousError::Storage { .. }), "{err}");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unavailable);
    // The reaper's write succeeds once the disk does; then it is told.
    std::fs::remove_dir(&blocker).unwrap();
    s.reap();
    let told = s.heartbeat("a").unwrap().failed_attempts;
    assert_eq!(
        told.iter()
            .map(|n| (n.job_id.as_str(), n.attempt))
            .collect::<Vec<_>>(),
        [("j", 1)]
    );
    drop(s);
    assert_eq!(durable(dir.path()).job_status("j").unwrap().attempt, 2);
}

#[tokio::test(start_paused = true)]
async fn a_job_created_again_under_its_id_draws_a_new_random_incarnation() {
    let s = state();
    s.create_job(JobConfig::new("j", 1)).unwrap();
    let first = s.job_status("j").unwrap();
    s.cancel_job("j", "done with it").unwrap();
    advance(Duration::from_secs(101)).await;
    assert_eq!(s.reap().collected_jobs, ["j"]);
    s.create_job(JobConfig::new("j", 1)).unwrap();
    let second = s.job_status("j").unwrap();
    // Drawn, not the creation time: within one millisecond (as here, most
    // likely) the two would have shared it, and the first job's
    // credentials would open the second.
    assert_ne!(first.incarnation, 0);
    assert_ne!(first.incarnation(), second.incarnation());
    let created_ms = |j: &JobStatus| {
        j.created
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    assert_ne!(u128::from(second.incarnation()), created_ms(&second));
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_client_lease_cancels_the_job_and_wakes_its_members() {
    let s = with_agents(&["a", "b"]);
    let lease = Duration::from_secs(3);
    s.create_job(JobConfig::new("j", 2).with_client_lease(lease))
        .unwrap();
    s.create_job(JobConfig::new("free", 1)).unwrap();
    let blocked = {
        let s = s.clone();
        tokio::spawn(async move { s.join("j", 1, "a").await })
    };
    tokio::task::yield_now().await;
    // Renewed within the lease, the job lives on past it.
    advance(Duration::from_secs(2)).await;
    assert_eq!(s.renew_job_lease("j").unwrap(), Some(lease));
    advance(Duration::from_secs(2)).await;
    assert!(s.reap().cancelled_jobs.is_empty());
    assert_eq!(s.job_status("j").unwrap().state, JobState::Ganging);
    // Then the client stops renewing.
    advance(Duration::from_secs(2)).await;
    s.heartbeat("a").unwrap();
    s.heartbeat("b").unwrap();
    assert_eq!(s.reap().cancelled_jobs, vec!["j".to_owned()]);
    let err = blocked.await.unwrap().unwrap_err();
    assert!(matches!(err, RendezvousError::JobCancelled { .. }), "{err}");
    let status = s.job_status("j").unwrap();
    assert_eq!(status.state, JobState::Cancelled);
    assert_eq!(
        status.cancel_reason.as_deref(),
        Some("the client's lease lapsed: no renewal within 3s")
    );
    // A job without a lease is untouched, and renewing it reports no lease.
    assert_eq!(s.job_status("free").unwrap().state, JobState::Ganging);
    assert_eq!(s.renew_job_lease("free").unwrap(), None);
    // A cancelled job's lease can no longer be renewed.
    assert!(matches!(
        s.renew_job_lease("j"),
        Err(RendezvousError::JobCancelled { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_client_lease_is_part_of_the_job_s_parameters() {
    let s = state();
    let leased = JobConfig::new("j", 1).with_client_lease(Duration::from_secs(5));
    s.create_job(leased.clone()).unwrap();
    assert_eq!(s.create_job(leased).unwrap(), 1);
    assert!(matches!(
        s.create_job(JobConfig::new("j", 1)),
        Err(RendezvousError::JobExists { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_restart_keeps_a_client_lease_and_starts_it_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    let lease = Duration::from_secs(4);
    s.create_job(JobConfig::new("j", 1).with_client_lease(lease))
        .unwrap();
    // The client renewed last 3 s ago; the rendezvous then crashes.
    advance(Duration::from_secs(3)).await;
    drop(s);
    let r = durable(dir.path());
    // The restart gives the client a whole lease again.
    advance(Duration::from_secs(3)).await;
    assert!(r.reap().cancelled_jobs.is_empty());
    assert_eq!(r.renew_job_lease("j").unwrap(), Some(lease));
    advance(Duration::from_secs(5)).await;
    assert_eq!(r.reap().cancelled_jobs, vec!["j".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_detached_job_outlives_its_client_s_lease_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = durable(dir.path());
    let lease = Duration::from_secs(2);
    s.create_job(JobConfig::new("j", 1).with_client_lease(lease))
        .unwrap();
    s.detach_job("j").unwrap();
    s.detach_job("j").unwrap();
    assert!(s.job_status("j").unwrap().detached);
    assert_eq!(s.renew_job_lease("j").unwrap(), None);
    advance(Duration::from_secs(5)).await;
    assert!(s.reap().cancelled_jobs.is_empty());
    drop(s);
    // The state file keeps it detached, without a lease to lapse.
    let r = durable(dir.path());
    advance(Duration::from_secs(5)).await;
    assert!(r.reap().cancelled_jobs.is_empty());
    let status = r.job_status("j").unwrap();
    assert!(status.detached && status.state == JobState::Ganging, "{status:?}");
    r.cancel_job("j", "by hand").unwrap();
    assert!(matches!(
        r.detach_job("j"),
        Err(RendezvousError::JobCancelled { .. })
    ));
    assert!(matches!(
        r.detach_job("nope"),
        Err(RendezvousError::JobNotFound { .. })
    ));
}

mod resize;
