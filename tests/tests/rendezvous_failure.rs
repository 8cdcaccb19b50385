//! Whole-group retry over real gRPC: a killed member fails the attempt and
//! everyone learns it at once, stale attempts are fenced, attempts are
//! bounded with the first cause kept, cancel wakes blocked calls; calls
//! ride out a restart of a rendezvous that keeps its state.
#![allow(clippy::unwrap_used)]

use crate::rendezvous_common;

use std::time::Duration;

use kindling_rendezvous::{ServerConfig, serve};
use kindling_schemas::auth::Token;
use kindling_schemas::rendezvous::{ClientError, JobConfig, JobState, RendezvousClient};
use rendezvous_common::{Fixture, GUARD, TOKEN, agent_info, join_all, test_config, watch_until};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_member_fails_the_attempt_and_the_next_attempt_forms() {
    let fx = Fixture::start().await;
    let mut leases = fx.agents("kill", 3).await;
    let ids: Vec<String> = leases.iter().map(|l| l.agent_id().to_owned()).collect();
    fx.client
        .create_job(&JobConfig::new("kill-job", 3).with_max_attempts(3))
        .await
        .unwrap();
    let mut watch = fx.client.watch("kill-job").await.unwrap();
    let gangs: Vec<_> = join_all(&fx.client, "kill-job", 1, &ids)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    watch_until(&mut watch, |s| s.state == JobState::Running).await;

    // Members 0 and 1 block in an all-gather; member 2 dies before calling it.
    let mut gangs = gangs.into_iter();
    let blocked: Vec<_> = gangs
        .by_ref()
        .take(2)
        .map(|g| tokio::spawn(async move { g.all_gather(b"step".to_vec()).await }))
        .collect();
    let victim = leases.pop().unwrap();
    fx.kill_agent(victim).await;

    // Blocked calls return an error as soon as the lease lapses.
    for b in blocked {
        let err = tokio::time::timeout(GUARD, b)
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.code(), Some(Code::Aborted), "{err}");
        assert!(
            err.to_string().contains("lease of agent `kill-002` lapsed"),
            "{err}"
        );
        assert_eq!(err.current_attempt(), Some(2));
        assert!(err.is_retryable());
    }
    // The watch stream says so too ...
    let status = watch_until(&mut watch, |s| s.attempt == 2).await;
    assert_eq!(status.state, JobState::Ganging);
    assert_eq!(status.failures[0].attempt, 1);
    assert_eq!(status.failures[0].agent_id, "kill-002");
    // ... and so do the survivors' heartbeat replies.
    let mut notices = leases[0].failed_attempts();
    let notices = tokio::time::timeout(GUARD, notices.wait_for(|v| !v.is_empty()))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert_eq!((notices[0].job_id.as_str(), notices[0].attempt), ("kill-job", 1));

    // A replacement agent and the survivors form attempt 2.
    let _replacement = fx.client.register(agent_info("kill-003")).await.unwrap();
    let next: Vec<String> = vec![ids[0].clone(), ids[1].clone(), "kill-003".to_owned()];
    let gangs2: Vec<_> = join_all(&fx.client, "kill-job", 2, &next)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(gangs2.iter().all(|g| g.attempt() == 2 && g.world_size() == 3));
    watch_until(&mut watch, |s| s.state == JobState::Running && s.attempt == 2).await;

    // Fencing: attempt 1 is refused, naming the current and the given attempt.
    let err = fx.client.join("kill-job", 1, &ids[0]).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert!(
        err.to_string()
            .contains("attempt 1 is not the current attempt (current attempt is 2)"),
        "{err}"
    );
    // The "dead" member comes back with its attempt-1 gang: fenced.
    let zombie = gangs.next().unwrap();
    let err = zombie.barrier().await.unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert_eq!(err.current_attempt(), Some(2));
    let err = fx.client.complete("kill-job", 1).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_fail_the_job_with_the_first_cause() {
    let fx = Fixture::start().await;
    let _leases = fx.agents("max", 2).await;
    let ids = vec!["max-000".to_owned(), "max-001".to_owned()];
    fx.client
        .create_job(&JobConfig::new("max-job", 2).with_max_attempts(2))
        .await
        .unwrap();
    let gangs = join_all(&fx.client, "max-job", 1, &ids).await;
    let g = gangs[1].as_ref().unwrap();
    assert_eq!(g.report_failure("CUDA out of memory").await.unwrap(), Some(2));
    let gangs = join_all(&fx.client, "max-job", 2, &ids).await;
    let g = gangs[0].as_ref().unwrap();
    assert_eq!(g.report_failure("loss is NaN").await.unwrap(), None);

    let status = fx.client.status("max-job").await.unwrap();
    assert_eq!(status.state, JobState::Failed);
    assert_eq!(status.failures.len(), 2);
    assert!(status.first_cause().unwrap().contains("CUDA out of memory"));
    assert_eq!(status.failures[0].agent_id, "max-001");
    let err = fx.client.join("max-job", 2, "max-000").await.unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_wakes_blocked_joins_and_all_gathers() {
    let fx = Fixture::start().await;
    let _leases = fx.agents("cx", 4).await;
    // One job still ganging (2 of 3 joined), one running with a blocked all-gather.
    fx.client.create_job(&JobConfig::new("cx-gang", 3)).await.unwrap();
    fx.client.create_job(&JobConfig::new("cx-run", 2)).await.unwrap();
    let joins: Vec<_> = ["cx-000", "cx-001"]
        .into_iter()
        .map(|id| {
            let c = fx.client.clone();
            tokio::spawn(async move { c.join("cx-gang", 1, id).await })
        })
        .collect();
    let run = join_all(
        &fx.client,
        "cx-run",
        1,
        &["cx-002".to_owned(), "cx-003".to_owned()],
    )
    .await;
    let g = run.into_iter().next().unwrap().unwrap();
    let gather = tokio::spawn(async move { g.barrier().await });
    // Cancel only once both joins are parked (status lists joined members).
    let mut watch = fx.client.watch("cx-gang").await.unwrap();
    tokio::time::timeout(GUARD, async {
        while fx.client.status("cx-gang").await.unwrap().members.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();

    fx.client.cancel("cx-gang", "user pressed ctrl-c").await.unwrap();
    fx.client.cancel("cx-run", "user pressed ctrl-c").await.unwrap();
    for j in joins {
        let err = tokio::time::timeout(GUARD, j)
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.code(), Some(Code::Cancelled), "{err}");
        assert!(err.to_string().contains("user pressed ctrl-c"), "{err}");
    }
    let err = tokio::time::timeout(GUARD, gather)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::Cancelled), "{err}");
    let status = watch_until(&mut watch, |s| s.state == JobState::Cancelled).await;
    assert_eq!(status.cancel_reason.as_deref(), Some("user pressed ctrl-c"));
    // Cancelling again is a no-op; later calls are refused as cancelled.
    fx.client.cancel("cx-gang", "again").await.unwrap();
    let err = fx.client.join("cx-gang", 1, "cx-000").await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Cancelled), "{err}");
    fx.shutdown().await;
}

/// A rendezvous with a state dir on `listener`, and what stops it.
fn serve_durable(
    listener: TcpListener,
    dir: &std::path::Path,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let config = ServerConfig {
        state_dir: Some(dir.to_owned()),
        ..ServerConfig::new(test_config(), Some(Token::new(TOKEN)))
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(listener, config, stop.clone()));
    (stop, tokio::spawn(async move { task.await.unwrap().unwrap() }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_ride_out_a_restart_and_fail_naming_the_bound_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, server) = serve_durable(listener, dir.path());
    let url = format!("http://{addr}");
    let client = RendezvousClient::connect_lazy(&url, Some(&Token::new(TOKEN))).unwrap();
    client.register(agent_info("a0")).await.unwrap().stop().await;
    assert_eq!(client.create_job(&JobConfig::new("j", 1)).await.unwrap(), 1);
    stop.cancel();
    server.await.unwrap();

    // Nothing listens: past a short bound, a precise error naming it.
    let impatient = client.clone().with_outage_bound(Duration::from_millis(300));
    let err = impatient.status("j").await.unwrap_err();
    assert!(
        matches!(err, ClientError::Unreachable { op: "status", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("300ms"), "{err}");

    // Within the (default) bound a call keeps trying while the rendezvous
    // is down, and is answered once it is back on its address.
    let status = client.status("j");
    tokio::pin!(status);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut status)
            .await
            .is_err(),
        "no answer while nothing listens"
    );
    let (stop, server) = serve_durable(TcpListener::bind(addr).await.unwrap(), dir.path());
    let status = tokio::time::timeout(GUARD, status).await.unwrap().unwrap();
    // The restarted rendezvous read its state back.
    assert_eq!((status.state, status.attempt), (JobState::Ganging, 1));
    let agents = client.list_agents().await.unwrap();
    assert_eq!(agents[0].agent_id, "a0");
    stop.cancel();
    server.await.unwrap();
}
