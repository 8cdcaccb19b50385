//! Ring all-reduce and broadcast between real collective listeners on
//! loopback (and one in a process of its own, killed with SIGKILL).

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use kindling_agent::collective::{Inbox, Precision, Ring, RingConfig};
use kindling_schemas::auth::{BearerCheck, Token};
use kindling_schemas::credential::{CredentialKey, Role};
use kindling_schemas::ring::{FrameHeader, Kind};
use kindling_tests::ring::{hello, say_hello};
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

struct Peer {
    url: String,
    inbox: std::sync::Arc<Inbox>,
    stop: CancellationToken,
}

async fn peers(n: usize, token: &Token) -> Vec<Peer> {
    peers_with(n, BearerCheck::new(Some(token.clone()))).await
}

async fn peers_with(n: usize, check: BearerCheck) -> Vec<Peer> {
    let mut out = Vec::new();
    for _ in 0..n {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let inbox = Inbox::new();
        let stop = CancellationToken::new();
        kindling_agent::collective::listen(listener, None, inbox.clone(), check.clone(), stop.clone());
        out.push(Peer { url, inbox, stop });
    }
    out
}

fn ring(urls: &[String], rank: usize, token: &Token, job: &str, inbox: &std::sync::Arc<Inbox>) -> Ring {
    inbox.enter_attempt(job, 1);
    Ring::new(
        RingConfig {
            job_id: job.into(),
            attempt: 1,
            rank: rank as u32,
            peers: urls.to_vec(),
            token: Some(token.clone()),
            timeout: Duration::from_secs(20),
            channel: Default::default(),
        },
        inbox.clone(),
        CancellationToken::new(),
    )
    .expect("ring")
}

fn rings(peers: &[Peer], token: &Token, job: &str) -> Vec<Ring> {
    let urls: Vec<String> = peers.iter().map(|p| p.url.clone()).collect();
    peers
        .iter()
        .enumerate()
        .map(|(rank, p)| ring(&urls, rank, token, job, &p.inbox))
        .collect()
}

/// Every rank's result of all-reducing `inputs` (one per rank) in `precision`.
async fn all_reduce(rings: Vec<Ring>, inputs: Vec<Vec<f32>>, precision: Precision) -> Vec<Vec<f32>> {
    let tasks: Vec<_> = rings
        .into_iter()
        .zip(inputs)
        .map(|(mut ring, mut buf)| {
            tokio::spawn(async move {
                ring.all_reduce(&mut buf, precision).await.expect("all-reduce");
                buf
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("task"));
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_reduce_equals_the_naive_sum_for_2_3_4_ranks_odd_lengths_f32_and_bf16() {
    let token = Token::new("t");
    for world in [2usize, 3, 4] {
        let ps = peers(world, &token).await;
        for len in [0usize, 1, 7, 1001, 1_200_003] {
            for precision in [Precision::F32, Precision::Bf16] {
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
                let job = format!("j{len}-{precision:?}");
                let results = all_reduce(rings(&ps, &token, &job), inputs, precision).await;
                // f32: the ring's order of additions; bf16: each of at most
                // `world` roundings of a partial sum (|sum| <= world) is off by
                // at most 2^-9 of it.
                let tolerance = match precision {
                    Precision::F32 => 1e-4,
                    Precision::Bf16 => (world * world) as f64 / 512.0,
                };
                let first: Vec<u32> = results[0].iter().map(|x| x.to_bits()).collect();
                for r in &results {
                    assert_eq!(r.len(), len);
                    let bits: Vec<u32> = r.iter().map(|x| x.to_bits()).collect();
                    assert!(
                        bits == first,
                        "world {world} len {len} {precision:?}: ranks must agree bitwise"
                    );
                    for (got, want) in r.iter().zip(&expected) {
                        assert!(
                            (*got as f64 - want).abs() <= tolerance,
                            "world {world} len {len} {precision:?}: {got} vs {want}"
                        );
                    }
                }
                if precision == Precision::Bf16 && len > 0 {
                    // bf16 on the wire: the results are not the exact f32 sums.
                    let exact: usize = results[0]
                        .iter()
                        .zip(&expected)
                        .filter(|(g, w)| (**g as f64 - **w).abs() < 1e-6)
                        .count();
                    assert!(
                        exact < len || len < 8,
                        "world {world} len {len}: bf16 was not used"
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
async fn two_jobs_sharing_agents_never_mix_their_parts() {
    let token = Token::new("t");
    let ps = peers(3, &token).await;
    let len = 700_001;
    let (a, b) = (rings(&ps, &token, "a"), rings(&ps, &token, "b"));
    let ones = vec![vec![1.0f32; len]; 3];
    let twos: Vec<Vec<f32>> = (0..3).map(|r| vec![10.0 * (r + 1) as f32; len]).collect();
    // Both jobs run their all-reduces at once, three times over, on the same listeners.
    let run = |rings: Vec<Ring>, inputs: Vec<Vec<f32>>| {
        tokio::spawn(async move {
            let mut out = Vec::new();
            let tasks: Vec<_> = rings
                .into_iter()
                .zip(inputs)
                .map(|(mut ring, buf)| {
                    tokio::spawn(async move {
                        let mut last = Vec::new();
                        for _ in 0..3 {
                            let mut b = buf.clone();
                            ring.all_reduce_sum(&mut b).await.expect("all-reduce");
                            last = b;
                        }
                        last
                    })
                })
                .collect();
            for t in tasks {
                out.push(t.await.expect("rank"));
            }
            out
        })
    };
    let (ra, rb) = (run(a, ones), run(b, twos));
    for r in ra.await.expect("job a") {
        assert!(r.iter().all(|&x| x == 3.0), "job a got another job's values");
    }
    for r in rb.await.expect("job b") {
        assert!(r.iter().all(|&x| x == 60.0), "job b got another job's values");
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
    assert!(
        err.to_string().contains(&ps[2].url),
        "the dead peer is named: {err}"
    );
}

/// A next rank that answers the hello and then goes away (as an agent
/// killed between rendezvous and its first operation) fails the ring while
/// it still waits for its previous rank, naming the next rank, instead of
/// after the ring's timeout. The next rank is a listener speaking the hello
/// by hand: a real agent cannot be stopped on demand between those two
/// moments.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_next_rank_gone_after_its_hello_fails_the_wait_for_the_previous_rank() {
    let token = Token::new("t");
    let ps = peers(1, &token).await;
    let next = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let next_url = format!("http://{}", next.local_addr().expect("addr"));
    let answered_then_gone = tokio::spawn(async move {
        let (mut conn, _) = next.accept().await.expect("accept");
        let hello = kindling_schemas::ring::read_hello(&mut conn)
            .await
            .expect("hello");
        kindling_schemas::ring::write_reply(&mut conn, &Ok(()))
            .await
            .expect("reply");
        hello
    });
    // Rank 1 of 3: its previous rank (0) never connects; its next (2) goes.
    let urls = vec![
        "http://127.0.0.1:9".to_owned(),
        ps[0].url.clone(),
        next_url.clone(),
    ];
    let mut r = ring(&urls, 1, &token, "gone", &ps[0].inbox);
    let mut buf = vec![1.0f32; 10];
    let op = tokio::spawn(async move { r.all_reduce_sum(&mut buf).await });
    let hello = answered_then_gone.await.expect("the next rank");
    assert_eq!((hello.from_rank, hello.to_rank), (1, 2));
    // Far below the ring's 20 s wait for rank 0.
    let err = tokio::time::timeout(Duration::from_secs(10), op)
        .await
        .expect("fails at once, not after waiting for rank 0")
        .expect("task")
        .expect_err("the next rank is gone");
    assert!(err.to_string().contains("unavailable"), "{err}");
    assert!(
        err.to_string().contains(&next_url),
        "the next rank is named: {err}"
    );
    assert!(!err.to_string().contains("did not connect"), "{err}");
}

/// A ring of two whose connections are open (one all-reduce done).
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_without_the_token_for_another_job_or_a_stale_attempt_are_refused_before_any_value() {
    let token = Token::new("t");
    let key = CredentialKey::new(&[7u8; 32]).expect("key");
    let ps = peers_with(
        2,
        BearerCheck::new(Some(token.clone())).with_credentials(Some(key.clone().into())),
    )
    .await;
    let url = &ps[1].url;
    ps[1].inbox.set_incarnation("job", 9);
    ps[1].inbox.enter_attempt("job", 2);
    let issue = |job: &str, role: Role, incarnation: u64| {
        key.sign(
            &kindling_schemas::credential::Claims::expiring(job, role, Duration::from_secs(60))
                .of_incarnation(incarnation),
        )
    };
    let for_other_job = issue("other", Role::Peer, 9);
    let producer = issue("job", Role::Producer, 9);
    let earlier_job = issue("job", Role::Peer, 8);
    let cases = [
        (
            "a peer credential of an earlier job under the id",
            hello("job", 2, 0, Some(&earlier_job)),
            Code::PermissionDenied,
            "incarnation 8",
        ),
        (
            "no token",
            hello("job", 2, 0, None),
            Code::Unauthenticated,
            "token",
        ),
        (
            "a wrong token",
            hello("job", 2, 0, Some("nope")),
            Code::Unauthenticated,
            "token",
        ),
        (
            "a peer credential of another job",
            hello("job", 2, 0, Some(&for_other_job)),
            Code::PermissionDenied,
            "other",
        ),
        (
            "a producer credential of the job",
            hello("job", 2, 0, Some(&producer)),
            Code::PermissionDenied,
            "producer",
        ),
        (
            "a stale attempt",
            hello("job", 1, 0, Some(token.expose())),
            Code::FailedPrecondition,
            "the job is on attempt 2",
        ),
    ];
    for (what, h, code, words) in cases {
        let channel = kindling_schemas::channel::ChannelConfig::default();
        let mut conn = channel.connect_ring(url, false).await.expect("connect");
        // The hello and, at once, a frame of floats: the agent must answer
        // the hello without reading a value.
        kindling_schemas::ring::write_hello(&mut conn, &h)
            .await
            .expect("hello");
        let header = FrameHeader {
            op: 1,
            step: 0,
            part: 0,
            kind: Kind::F32,
            len: 4096,
        };
        let _ = conn.write_all(&header.encode()).await;
        let _ = conn.write_all(&[0u8; 4096]).await;
        let answer = kindling_schemas::ring::read_reply(&mut conn)
            .await
            .expect("an answer");
        let e = answer.expect_err(what);
        assert_eq!(e.code(), code, "{what}: {e}");
        assert!(e.message().contains(words), "{what}: {e}");
    }
    // A second connection for the same rank of the same attempt is refused.
    let (first, _open) = say_hello(url, &hello("job", 2, 0, Some(token.expose()))).await;
    first.expect("the first is accepted");
    let (second, _) = say_hello(url, &hello("job", 2, 0, Some(token.expose()))).await;
    let e = second.expect_err("duplicate");
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_part_is_refused_and_fails_the_ring_naming_the_sender() {
    let token = Token::new("t");
    let ps = peers(2, &token).await;
    let urls = vec![ps[0].url.clone(), ps[1].url.clone()];
    // Rank 1 is a real ring; rank 0 is this test, speaking the protocol by hand.
    let mut r1 = ring(&urls, 1, &token, "dup", &ps[1].inbox);
    ps[0].inbox.enter_attempt("dup", 1);
    let (answer, mut conn) = say_hello(&ps[1].url, &hello("dup", 1, 0, Some(token.expose()))).await;
    answer.expect("accepted");
    let n = 5usize;
    let header = FrameHeader {
        op: 1,
        step: 0,
        part: 0,
        kind: Kind::F32,
        len: (n * 4) as u32,
    };
    let payload: Vec<u8> = [2.0f32; 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    for _ in 0..2 {
        conn.write_all(&header.encode()).await.expect("frame");
        conn.write_all(&payload).await.expect("payload");
    }
    let mut buf = vec![1.0f32; n];
    r1.all_reduce_sum(&mut buf).await.expect("the first op");
    assert_eq!(buf, vec![3.0f32; n]);
    let e = tokio::time::timeout(Duration::from_secs(10), r1.all_reduce_sum(&mut buf))
        .await
        .expect("fails, not hangs")
        .expect_err("the repeated part");
    let text = e.to_string();
    assert!(
        text.contains("a duplicate, out-of-order or malformed frame"),
        "{text}"
    );
    assert!(text.contains(&ps[0].url), "{text}");
}

/// Collective listener and ring rank in a process of its own
/// (`src/bin/ring_rank.rs`), so it can die by SIGKILL.
struct RankProcess {
    child: std::process::Child,
    url: String,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl RankProcess {
    fn start(token: &Token, job: &str, rank: usize, floats: usize) -> RankProcess {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ring_rank"))
            .args(["--token", token.expose(), "--job", job])
            .args(["--rank", &rank.to_string(), "--floats", &floats.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("ring_rank");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = lines.next().expect("a line").expect("url");
        let url = url.strip_prefix("url=").expect("url=").to_owned();
        RankProcess { child, url, lines }
    }

    fn peers(&mut self, urls: &[String]) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{}", urls.join(",")).expect("peers");
    }

    /// Blocks until the process says it finished operation `op`.
    fn wait_for_op(&mut self, op: u64) {
        for line in self.lines.by_ref() {
            if line.expect("line") == format!("op {op}") {
                return;
            }
        }
        panic!("ring_rank ended before op {op}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rank_killed_mid_operation_fails_every_other_rank_within_a_second_naming_it() {
    let token = Token::new("t");
    let ps = peers(2, &token).await;
    // 8 M floats (32 MB) per operation: the kill lands inside one.
    let floats = 8 << 20;
    let mut dead = RankProcess::start(&token, "kill", 2, floats);
    let urls = vec![ps[0].url.clone(), ps[1].url.clone(), dead.url.clone()];
    dead.peers(&urls);
    let tasks: Vec<_> = (0..2)
        .map(|rank| {
            let mut ring = ring(&urls, rank, &token, "kill", &ps[rank].inbox);
            tokio::spawn(async move {
                let mut buf = vec![1.0f32; floats];
                loop {
                    if let Err(e) = ring.all_reduce_sum(&mut buf).await {
                        return (e.to_string(), Instant::now());
                    }
                }
            })
        })
        .collect();
    let dead_url = dead.url.clone();
    let killed_at = tokio::task::spawn_blocking(move || {
        dead.wait_for_op(2);
        dead.child.kill().expect("SIGKILL");
        let at = Instant::now();
        let _ = dead.child.wait();
        at
    })
    .await
    .expect("kill");
    for t in tasks {
        let (error, failed_at) = tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .expect("fails, not hangs")
            .expect("rank");
        let after = failed_at.saturating_duration_since(killed_at);
        assert!(
            after < Duration::from_secs(1),
            "failed {after:?} after the kill: {error}"
        );
        assert!(error.contains(&dead_url), "the killed rank is named: {error}");
    }
}

/// The optimizer stepping buckets as they arrive (overlapped or not) gives
/// bitwise the weights of one whole all-reduce and one whole step.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bucketed_and_overlapped_steps_equal_one_whole_step() {
    use kindling_agent::optim::FlatOptimizer;
    use kindling_agent::training::gradients::{GradientStep, StepTimes, Trailer};
    use kindling_schemas::spec::OptimizerSpec;
    let token = Token::new("t");
    let ps = peers(2, &token).await;
    let grads = 1003;
    let run = |exchange: GradientStep, job: &'static str| {
        let rings = rings(&ps, &token, job);
        let rt = tokio::runtime::Handle::current();
        rings
            .into_iter()
            .enumerate()
            .map(|(rank, mut ring)| {
                let rt = rt.clone();
                tokio::task::spawn_blocking(move || {
                    let mut weights: Vec<f32> = (0..grads).map(|i| (i as f32 * 0.1).sin()).collect();
                    let mut optim = FlatOptimizer::new(&OptimizerSpec::adam(0.01), grads);
                    let mut times = StepTimes::default();
                    for step in 0..4 {
                        // [gradient sums…, trailer]
                        let mut buf: Vec<f32> = (0..grads)
                            .map(|i| ((i * (rank + 2) + step) as f32 * 0.37).cos())
                            .collect();
                        let trailer = Trailer {
                            rows: 32.0,
                            weight: 32.0,
                            loss_sum: 1.5,
                            ..Trailer::default()
                        };
                        trailer.append_to(&mut buf);
                        let stepped = exchange
                            .run(
                                (&rt, &mut ring),
                                (&mut buf, grads),
                                (&mut optim, &mut weights),
                                &mut times,
                                |t| Some(1.0 / t.weight),
                            )
                            .expect("exchange");
                        assert!(stepped);
                        let summed = Trailer {
                            rows: 64.0,
                            weight: 64.0,
                            loss_sum: 3.0,
                            ..Trailer::default()
                        };
                        assert_eq!(Trailer::read(&buf[grads..]), summed);
                    }
                    (weights, times)
                })
            })
            .collect::<Vec<_>>()
    };
    let mut results = Vec::new();
    // Norm clipping needs every bucket before any weight steps: it turns
    // overlap off and must give the same weights in one piece or in buckets.
    for (job, bucket_values, overlap, clip_norm) in [
        ("whole", usize::MAX, false, None),
        ("buckets", 100, false, None),
        ("overlap", 100, true, None),
        ("whole-clipped", usize::MAX, false, Some(0.05)),
        ("overlap-clipped", 100, true, Some(0.05)),
    ] {
        let exchange = GradientStep {
            precision: Precision::F32,
            bucket_values,
            device_bucket_values: kindling_agent::training::gradients::DEVICE_BUCKET_VALUES,
            overlap,
            clip_norm,
        };
        let mut ranks = Vec::new();
        for t in run(exchange, job) {
            ranks.push(t.await.expect("rank"));
        }
        assert_eq!(ranks[0].0, ranks[1].0, "{job}: ranks differ");
        if bucket_values < grads {
            assert!(ranks[0].1.idle > Duration::ZERO, "{job}: the trailer went first");
        }
        results.push(ranks.swap_remove(0).0);
    }
    assert_eq!(results[0], results[1], "buckets change the weights");
    assert_eq!(results[0], results[2], "overlap changes the weights");
    assert_eq!(results[3], results[4], "buckets change the clipped weights");
    assert_ne!(results[0], results[3], "clipping at 0.05 changes the step");
}

/// A silent ring connection from `source`: the ring's magic (so the port
/// routes it to the ring), then nothing.
async fn silent_ring_connection(
    url: &str,
    source: std::net::IpAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().expect("address");
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((source, 0).into())?;
    let mut conn = socket.connect(addr).await?;
    conn.write_all(&kindling_schemas::ring::MAGIC).await?;
    Ok(conn)
}

/// Reads `conn` until the agent closes it; false if it sent a byte.
async fn closed_by_agent(conn: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(conn.read(&mut byte).await, Ok(0) | Err(_))
}

/// Silent ring connections are bounded per address and in time: while one
/// address (127.0.0.2) keeps re-opening more silent connections than the
/// agent's whole hello cap as fast as they are closed, two agents' rings
/// (from 127.0.0.1) still form and all-reduce; and a connection that is
/// within its address's cap but never says hello is closed by the agent
/// (the hello timeout), not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_ring_connections_from_one_address_leaves_rings_forming_and_each_is_closed() {
    use kindling_agent::collective::{MAX_RING_HELLOS, MAX_RING_HELLOS_PER_ADDRESS};
    use std::sync::atomic::{AtomicBool, Ordering};
    let token = Token::new("t");
    let ps = peers_with(2, BearerCheck::new(Some(token.clone()))).await;
    let flooder: std::net::IpAddr = [127, 0, 0, 2].into();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (closed, mut closes) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut flood = Vec::new();
    for p in &ps {
        for _ in 0..MAX_RING_HELLOS + 16 {
            let (url, stop, closed) = (p.url.clone(), stop.clone(), closed.clone());
            flood.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let mut conn = silent_ring_connection(&url, flooder).await.expect("connect");
                    assert!(closed_by_agent(&mut conn).await, "a silent connection got bytes");
                    let _ = closed.send(());
                    // The flood's pace: as fast as a loop of connects, not faster.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
    }
    // The flood runs: its connections are being closed.
    for _ in 0..2 * MAX_RING_HELLOS {
        closes.recv().await.expect("the flood runs");
    }
    for job in ["a", "b", "c"] {
        let inputs = vec![vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]];
        let results = all_reduce(rings(&ps, &token, job), inputs, Precision::F32).await;
        for r in results {
            assert_eq!(r, vec![11.0, 22.0, 33.0], "{job}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.await.expect("flood task");
    }
    // Within another address's cap, silent connections wait for a hello
    // only until the hello timeout: the agent closes each.
    let quiet: std::net::IpAddr = [127, 0, 0, 3].into();
    let mut conns = Vec::new();
    for _ in 0..MAX_RING_HELLOS_PER_ADDRESS {
        conns.push(silent_ring_connection(&ps[0].url, quiet).await.expect("connect"));
    }
    let waits = conns.iter_mut().map(closed_by_agent);
    let outcomes = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(waits))
        .await
        .expect("silent connections held past any hello timeout");
    assert!(outcomes.into_iter().all(|c| c), "a silent connection got bytes");
}
