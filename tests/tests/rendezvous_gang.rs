//! Gang start over real gRPC: everyone released at once with ranks and peers,
//! a short gang fails with a count, barrier and all-gather keep rank order.
#![allow(clippy::unwrap_used)]

use crate::rendezvous_common;

use std::time::Duration;

use kindling_schemas::rendezvous::{JobConfig, JobState};
use rendezvous_common::{Fixture, join_all};

async fn gang_of(n: usize) {
    let fx = Fixture::start().await;
    let prefix = format!("gang{n}");
    let leases = fx.agents(&prefix, n).await;
    let live = fx.client.list_agents().await.unwrap();
    assert_eq!(live.len(), n);
    // The client picks num_slots live agents, as TrainingJob does.
    let ids: Vec<String> = live.iter().rev().map(|a| a.agent_id.clone()).collect();
    let job = format!("job-{n}");
    assert_eq!(
        fx.client
            .create_job(&JobConfig::new(&job, n as u32))
            .await
            .unwrap(),
        1
    );

    let gangs: Vec<_> = join_all(&fx.client, &job, 1, &ids)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    for (gang, id) in gangs.iter().zip(&ids) {
        assert_eq!(gang.world_size() as usize, n);
        assert_eq!(gang.attempt(), 1);
        // Ranks follow ascending agent id; peers are listed in rank order.
        assert_eq!(sorted[gang.rank() as usize], *id);
        let peers: Vec<&str> = gang.peers().iter().map(|p| p.agent_id.as_str()).collect();
        assert_eq!(peers, sorted.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(
            gang.peers()[gang.rank() as usize].flight_address,
            format!("http://{id}.local:50051")
        );
    }
    let status = fx.client.status(&job).await.unwrap();
    assert_eq!(status.state, JobState::Running);
    assert_eq!(status.members, sorted);
    gangs[0].complete().await.unwrap();
    // Every member may complete; it is idempotent.
    gangs[n - 1].complete().await.unwrap();
    assert_eq!(fx.client.status(&job).await.unwrap().state, JobState::Succeeded);
    drop(leases);
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendezvous_gang_of_2_forms() {
    gang_of(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendezvous_gang_of_64_forms() {
    gang_of(64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_gang_fails_after_timeout_with_count() {
    let fx = Fixture::start().await;
    let _leases = fx.agents("short", 2).await;
    let job = JobConfig::new("short-job", 2)
        .with_max_attempts(1)
        .with_gang_timeout(Duration::from_millis(300));
    fx.client.create_job(&job).await.unwrap();
    let err = fx.client.join("short-job", 1, "short-000").await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
    assert!(err.to_string().contains("1 of 2 members joined"), "{err}");
    let status = fx.client.status("short-job").await.unwrap();
    assert_eq!(status.state, JobState::Failed);
    assert!(status.first_cause().unwrap().contains("1 of 2 members joined"));
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barrier_and_all_gather_return_payloads_in_rank_order() {
    let fx = Fixture::start().await;
    let _leases = fx.agents("ag", 5).await;
    let ids: Vec<String> = (0..5).rev().map(|i| format!("ag-{i:03}")).collect();
    fx.client.create_job(&JobConfig::new("ag-job", 5)).await.unwrap();
    let gangs = join_all(&fx.client, "ag-job", 1, &ids).await;
    let tasks: Vec<_> = gangs
        .into_iter()
        .map(|g| {
            let gang = g.unwrap();
            tokio::spawn(async move {
                let me = gang.peers()[gang.rank() as usize].agent_id.clone();
                let mut rounds = Vec::new();
                for round in 0..3 {
                    gang.barrier().await.unwrap();
                    let got = gang
                        .all_gather(format!("{me}/{round}").into_bytes())
                        .await
                        .unwrap();
                    rounds.push((round, got));
                }
                (gang.peers().to_vec(), rounds)
            })
        })
        .collect();
    for t in tasks {
        let (peers, rounds) = t.await.unwrap();
        for (round, got) in rounds {
            let want: Vec<Vec<u8>> = peers
                .iter()
                .map(|p| format!("{}/{round}", p.agent_id).into_bytes())
                .collect();
            let got: Vec<Vec<u8>> = got.iter().map(|b| b.to_vec()).collect();
            assert_eq!(got, want);
        }
    }
    fx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_and_unary_calls_meet_in_the_same_collectives() {
    let fx = Fixture::start().await;
    let _leases = fx.agents("mix", 3).await;
    let ids: Vec<String> = (0..3).map(|i| format!("mix-{i:03}")).collect();
    fx.client.create_job(&JobConfig::new("mix-job", 3)).await.unwrap();
    let mut gangs: Vec<_> = join_all(&fx.client, "mix-job", 1, &ids)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // Rank 0 calls unary AllGather with explicit sequence numbers; ranks 1
    // and 2 go through their gang's stream.
    let unary = gangs.remove(0);
    assert_eq!(unary.rank(), 0);
    let streamed: Vec<_> = gangs
        .into_iter()
        .map(|gang| {
            tokio::spawn(async move {
                let barrier = gang.all_gather(Vec::new()).await.unwrap();
                let gather = gang.all_gather(vec![gang.rank() as u8; 3]).await.unwrap();
                (barrier, gather)
            })
        })
        .collect();
    let m = unary.membership().clone();
    let client = fx.new_client().await;
    // A barrier: the unary reply carries no payloads at all.
    let barrier = client.all_gather(&m.job_id, 1, 0, 0, Vec::new()).await.unwrap();
    assert!(barrier.is_empty(), "{barrier:?}");
    let gather = client.all_gather(&m.job_id, 1, 0, 1, vec![0u8; 3]).await.unwrap();
    let want: Vec<Vec<u8>> = (0..3u8).map(|r| vec![r; 3]).collect();
    assert_eq!(gather.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), want);
    for t in streamed {
        let (barrier, gather) = t.await.unwrap();
        // Gang expands a barrier's reply to one empty payload per member.
        assert_eq!(barrier.len(), 3);
        assert!(barrier.iter().all(|b| b.is_empty()));
        assert_eq!(gather.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), want);
    }
    fx.shutdown().await;
}
