//! A peer that goes silent without closing its connection (a TCP proxy that
//! stops forwarding, `kindling_tests::proxy`): an agent's action fails at the
//! call timeout and its data stream within the keepalive's detection bound,
//! each with an error naming the agent, instead of hanging.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kindling::feed::AgentClient;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::spec::{JobSpec, ModelSpec, Task};
use kindling_tests::cluster::*;
use kindling_tests::proxy::FreezableProxy;

/// Generous next to the bounds under test (0.5 s + 0.5 s keepalive, 2 s
/// call timeout), short next to "forever" (and to a 30 s keepalive).
const NOTICED_WITHIN: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_fails_actions_at_the_deadline_and_streams_at_the_keepalive() {
    let (cluster, _dir) = cluster(1).await;
    start_job(&cluster, "silent", &linear_spec(1), &[0]).await;
    let agent = cluster.agent_url(0).expect("agent");
    let target: SocketAddr = agent
        .trim_start_matches("http://")
        .parse()
        .expect("agent address");
    let proxy = FreezableProxy::start(target).await;
    // Two clients through the proxy, each showing one bound: actions with a
    // call timeout well inside their keepalive, a stream with a short keepalive.
    let slow_keepalive = ChannelConfig::default()
        .with_keepalive(Duration::from_secs(30), Duration::from_secs(30))
        .with_call_timeout(Duration::from_secs(2));
    let fast_keepalive =
        ChannelConfig::default().with_keepalive(Duration::from_millis(500), Duration::from_millis(500));
    let via = AgentClient::connect_with(&proxy.url(), cluster.token(), &slow_keepalive).expect("client");
    let streamer = AgentClient::connect_with(&proxy.url(), cluster.token(), &fast_keepalive).expect("client");

    // Through the proxy, the agent answers and takes rows.
    assert_eq!(via.job_status("silent").await.expect("status").job_id, "silent");
    let path = DataPath::data("silent", Split::Train);
    let mut stream = streamer
        .put(&path, "p0", &rule_schema(), 8 << 20)
        .await
        .expect("open a stream");
    stream.write(&rule_batch(100, 1)).await.expect("a batch");

    proxy.freeze();

    // An action waits for the call timeout, then fails naming the agent.
    let asked = Instant::now();
    let err = via
        .job_status("silent")
        .await
        .expect_err("a silent agent cannot answer");
    let waited = asked.elapsed();
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
    assert!(err.is_retryable(), "fit handles it as a lost agent: {err}");
    assert!(err.to_string().contains(&proxy.url()), "{err}");
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(waited < NOTICED_WITHIN, "{waited:?}");

    // The open stream fails once the keepalive finds the connection dead.
    let frozen_at = Instant::now();
    let err = loop {
        match stream.write(&rule_batch(100, 2)).await {
            Ok(()) => assert!(frozen_at.elapsed() < NOTICED_WITHIN, "the stream never failed"),
            Err(e) => break e,
        }
    };
    let err = match err {
        e @ kindling::feed::FeedError::Agent { .. } => e,
        other => panic!("expected the agent's error, got {other}"),
    };
    assert!(frozen_at.elapsed() < NOTICED_WITHIN, "{:?}", frozen_at.elapsed());
    assert!(err.to_string().contains(&proxy.url()), "{err}");
    assert!(err.is_retryable(), "{err}");

    // The agent itself never saw a commit: the broken stream left nothing.
    let direct = agent_client(&cluster, 0);
    assert_eq!(direct.job_status("silent").await.expect("status").rows_train, 0);
}

/// Two agents whose ring runs through a proxy one way (rank 0 → rank 1):
/// frozen mid-training, the ring's keepalive finds the silent peer long
/// before the collective timeout, the attempt fails naming it, and once the
/// network is back the job resumes and ends with every epoch's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_ring_peer_fails_the_attempt_within_the_keepalive_and_the_job_recovers() {
    use kindling::local::{LocalCluster, LocalClusterConfig};
    use kindling_schemas::action::AgentJobState;
    use kindling_schemas::rendezvous::RendezvousClient;

    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path());
    config.lease = Duration::from_millis(600);
    let rendezvous = LocalCluster::start(0, config).await.expect("rendezvous");
    let channel = ChannelConfig::default()
        .with_keepalive(Duration::from_millis(500), Duration::from_millis(500))
        .with_call_timeout(Duration::from_secs(5));
    let collective_timeout = Duration::from_secs(60);
    let agent = |id: &str, advertise: Option<&str>| {
        let mut c = kindling_agent::AgentConfig::local(id, dir.path());
        c.rendezvous = Some(rendezvous.rendezvous_url());
        c.token = rendezvous.token().cloned();
        c.advertise_host = advertise.map(str::to_owned);
        c.channel = channel.clone();
        c.collective_timeout = collective_timeout;
        c.train_threads = 1;
        c
    };
    // Ranks follow agent ids: "a-direct" is rank 0 and sends to rank 1,
    // "b-proxied", whose advertised address is the proxy's.
    let a = kindling_agent::start(agent("a-direct", None))
        .await
        .expect("agent a");
    let b = kindling_agent::start(agent("b-proxied", Some("127.0.0.2")))
        .await
        .expect("agent b");
    let proxy = FreezableProxy::start_on(SocketAddr::from(([127, 0, 0, 2], b.addr().port())), b.addr()).await;
    assert_eq!(proxy.url(), b.url());
    let direct = |url: &str| AgentClient::connect(url, rendezvous.token()).expect("client");
    let (ca, cb) = (direct(a.url()), direct(&format!("http://{}", b.addr())));

    let job = "ring-stall";
    let spec = JobSpec::builder()
        .model(ModelSpec::Mlp { hidden: vec![8] })
        .task(Task::Classification { num_classes: 2 })
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .batch_size(32)
        .epochs(12)
        .build()
        .expect("spec");
    let rv = RendezvousClient::connect(rendezvous.rendezvous_url(), rendezvous.token())
        .await
        .expect("rendezvous client");
    rv.create_job(&kindling_schemas::rendezvous::JobConfig::new(job, 2).with_max_attempts(4))
        .await
        .expect("create");
    for c in [&ca, &cb] {
        c.start_job(job, &spec, &rendezvous.rendezvous_url())
            .await
            .expect("start");
    }
    for (i, c) in [&ca, &cb].into_iter().enumerate() {
        let rows = rule_batch(2000, i as u64);
        put(c, job, Split::Train, "p0", &[rows]).await.expect("rows");
        end_of_data(c, job, Split::Train, Some(2000)).await;
    }
    wait_until(&ca, job, Duration::from_secs(120), |s| s.history.len() >= 2).await;

    proxy.freeze();
    let frozen_at = Instant::now();
    let failed = loop {
        let status = rv.status(job).await.expect("status");
        if let Some(f) = status.failures.first() {
            break f.clone();
        }
        assert!(
            frozen_at.elapsed() < NOTICED_WITHIN,
            "no failure recorded: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let noticed = frozen_at.elapsed();
    assert!(
        noticed < collective_timeout / 4,
        "{noticed:?}: the keepalive, not the collective timeout"
    );
    assert!(
        failed.cause.contains("127.0.0.2"),
        "the cause names the silent peer: {failed:?}"
    );
    eprintln!(
        "silent ring peer noticed {noticed:?} after the freeze: {}",
        failed.cause
    );

    proxy.thaw();
    for c in [&ca, &cb] {
        let done = wait_done(c, job).await;
        assert_eq!(done.state, AgentJobState::Succeeded, "{done:?}");
        assert!(done.attempt >= 2, "{done:?}");
        assert_eq!(
            done.rows_trained_per_epoch,
            vec![4000; 12],
            "every row of both shards once per epoch"
        );
    }
    drop((a, b));
}
