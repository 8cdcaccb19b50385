//! Ring all-reduce and broadcast between real collective servers on loopback.

use std::time::Duration;

use kindling_agent::collective::{Inbox, Ring, RingConfig, grpc_service};
use kindling_schemas::auth::{BearerCheck, Token};
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

struct Peer {
    url: String,
    inbox: std::sync::Arc<Inbox>,
    stop: CancellationToken,
}

async fn peers(n: usize, token: &Token) -> Vec<Peer> {
    let mut out = Vec::new();
    for _ in 0..n {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let inbox = Inbox::new();
        let stop = CancellationToken::new();
        let svc = grpc_service(inbox.clone(), BearerCheck::new(Some(token.clone())));
        let (shutdown, closing) = (stop.clone(), inbox.clone());
        tokio::spawn(async move {
            // As an agent stops: close the inbox (ending open chunk streams), then serve no more.
            let stopping = async move {
                shutdown.cancelled().await;
                closing.close();
            };
            kindling_agent::collective::server_builder(&Default::default())
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    stopping,
                )
                .await
                .expect("serve");
        });
        out.push(Peer { url, inbox, stop });
    }
    out
}

fn rings(peers: &[Peer], token: &Token, job: &str) -> Vec<Ring> {
    let urls: Vec<String> = peers.iter().map(|p| p.url.clone()).collect();
    peers
        .iter()
        .enumerate()
        .map(|(rank, p)| {
            p.inbox.enter_attempt(job, 1);
            Ring::new(
                RingConfig {
                    job_id: job.into(),
                    attempt: 1,
                    rank: rank as u32,
                    peers: urls.clone(),
                    token: Some(token.clone()),
                    timeout: Duration::from_secs(20),
                    channel: Default::default(),
                },
                p.inbox.clone(),
                CancellationToken::new(),
            )
            .expect("ring")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_reduce_equals_the_naive_sum_for_2_3_4_ranks_and_odd_lengths() {
    let token = Token::new("t");
    for world in [2usize, 3, 4] {
        let ps = peers(world, &token).await;
        for len in [1usize, 7, 1001, 1_200_003] {
            let mut rng = rand::rngs::StdRng::seed_from_u64((world * 31 + len) as u64);
            let inputs: Vec<Vec<f32>> = (0..world)
                .map(|_| (0..len).map(|_| rng.random_range(-1.0..1.0)).collect())
                .collect();
            let mut expected = vec![0f64; len];
            for v in &inputs {
                for (e, x) in expected.iter_mut().zip(v) {
                    *e += *x as f64;
                }
            }
            let tasks: Vec<_> = rings(&ps, &token, &format!("j{len}"))
                .into_iter()
                .zip(inputs)
                .map(|(mut ring, mut buf)| {
                    tokio::spawn(async move {
                        ring.all_reduce_sum(&mut buf).await.expect("all-reduce");
                        buf
                    })
                })
                .collect();
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await.expect("task"));
            }
            for r in &results {
                assert_eq!(r.len(), len);
                let bits: Vec<u32> = r.iter().map(|x| x.to_bits()).collect();
                let first: Vec<u32> = results[0].iter().map(|x| x.to_bits()).collect();
                assert_eq!(bits, first, "world {world} len {len}: ranks must agree bitwise");
                for (got, want) in r.iter().zip(&expected) {
                    assert!(
                        (*got as f64 - want).abs() < 1e-4,
                        "world {world} len {len}: {got} vs {want}"
                    );
                }
            }
        }
        for p in ps {
            p.stop.cancel();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broadcast_reaches_every_rank_and_a_dead_peer_fails_fast() {
    let token = Token::new("t");
    let ps = peers(3, &token).await;
    let payload: Vec<u8> = (0..9_000_001u32).map(|i| (i % 251) as u8).collect();
    let tasks: Vec<_> = rings(&ps, &token, "b")
        .into_iter()
        .enumerate()
        .map(|(rank, mut ring)| {
            let p = (rank == 1).then(|| payload.clone());
            tokio::spawn(async move { ring.broadcast(1, p).await.expect("broadcast") })
        })
        .collect();
    for t in tasks {
        assert!(t.await.expect("task") == payload);
    }
    // Rank 1's next peer is gone: its push fails with the peer named.
    ps[2].stop.cancel();
    let mut r = rings(&ps, &token, "dead").into_iter().nth(1).expect("rank 1");
    let mut buf = vec![1.0f32; 10];
    let err = tokio::time::timeout(Duration::from_secs(30), r.all_reduce_sum(&mut buf))
        .await
        .expect("fails, not hangs")
        .expect_err("dead peer");
    assert!(err.to_string().contains("unavailable"), "{err}");
}

/// A ring of two whose chunk streams are open (one all-reduce done).
async fn two_open_rings(ps: &[Peer], token: &Token, job: &str) -> (Ring, Ring) {
    let mut rs = rings(ps, token, job).into_iter();
    let (mut r0, mut r1) = (rs.next().expect("rank 0"), rs.next().expect("rank 1"));
    let (mut a, mut b) = (vec![1.0f32; 100], vec![2.0f32; 100]);
    let (x, y) = tokio::join!(r0.all_reduce_sum(&mut a), r1.all_reduce_sum(&mut b));
    x.expect("rank 0");
    y.expect("rank 1");
    assert_eq!(a, vec![3.0f32; 100]);
    assert_eq!(b, a);
    (r0, r1)
}

/// The error of `ring`'s next all-reduce. The guard (15 s) is below the
/// ring's own timeout (20 s), so the cause must come from the peer, not from waiting.
async fn next_all_reduce_error(ring: &mut Ring) -> String {
    let mut buf = vec![1.0f32; 100];
    tokio::time::timeout(Duration::from_secs(15), ring.all_reduce_sum(&mut buf))
        .await
        .expect("fails, not hangs")
        .expect_err("the operation fails")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_stopping_under_an_open_stream_fails_the_next_operation_with_its_cause() {
    let token = Token::new("t");
    let ps = peers(2, &token).await;
    let (mut r0, _r1) = two_open_rings(&ps, &token, "stop").await;
    // Peer 1 stops serving, as an agent does on shutdown, with rank 0's stream into it open.
    ps[1].stop.cancel();
    let text = next_all_reduce_error(&mut r0).await;
    assert!(
        text.contains("shutting down") && text.contains(&ps[1].url),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chunk_the_receiver_fences_fails_the_senders_operation_with_the_cause() {
    let token = Token::new("t");
    let ps = peers(2, &token).await;
    let (mut r0, _r1) = two_open_rings(&ps, &token, "fence").await;
    // Rank 1's agent moved on to attempt 2: attempt 1's chunks are refused.
    ps[1].inbox.enter_attempt("fence", 2);
    let text = next_all_reduce_error(&mut r0).await;
    assert!(text.contains("the job is on attempt 2"), "{text}");
}
