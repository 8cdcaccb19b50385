//! `kindling status JOB` (the binary as a real process) on a job a local
//! cluster trained: the rendezvous' view, then a table with one row per
//! epoch and a sparkline of the train loss.

use std::process::Command;
use std::time::{Duration, Instant};

use kindling::feed::AgentClient;
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::rendezvous::{JobConfig, RendezvousClient};
use kindling_schemas::spec::{JobSpec, ModelSpec, Task};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_a_job_shows_every_epoch_and_a_sparkline_of_its_loss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = LocalCluster::start(1, LocalClusterConfig::new(dir.path()))
        .await
        .expect("cluster");
    let epochs = 4;
    let spec = JobSpec::builder()
        .model(ModelSpec::Linear)
        .task(Task::Classification { num_classes: 2 })
        .features(["x1", "x2"])
        .label("y")
        .batch_size(64)
        .epochs(epochs)
        .build()
        .expect("spec");
    let rv = RendezvousClient::connect_with(cluster.rendezvous_url(), cluster.token(), &cluster.channel())
        .await
        .expect("rendezvous");
    rv.create_job(&JobConfig::new("shown", 1)).await.expect("create");
    let agent = AgentClient::connect(&cluster.agent_url(0).expect("agent"), cluster.token()).expect("agent");
    agent
        .start_job("shown", &spec, &cluster.rendezvous_url())
        .await
        .expect("start");
    let rows = kindling_fixtures::rule_batch(1000, 1);
    let mut w = agent
        .put(
            &DataPath::data("shown", Split::Train),
            "p",
            &rows.schema(),
            8 << 20,
        )
        .await
        .expect("put");
    w.write(&rows).await.expect("rows");
    w.finish().await.expect("finish");
    agent
        .end_of_data("shown", Split::Train, Some(1000))
        .await
        .expect("end of data");
    let started = Instant::now();
    while !agent
        .job_status("shown")
        .await
        .expect("status")
        .state
        .is_terminal()
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the job did not finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let token_file = dir.path().join("token");
    std::fs::write(&token_file, cluster.token().expect("token").expose()).expect("token file");
    let out = Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(["status", "shown", "--rendezvous", &cluster.rendezvous_url()])
        .arg("--token-file")
        .arg(&token_file)
        .output()
        .expect("kindling status");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("shown: Succeeded, attempt 1/"), "{stdout}");
    let epoch_rows: Vec<u32> = stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("epoch"))
        .skip(1)
        .map_while(|l| l.split_whitespace().next().and_then(|e| e.parse().ok()))
        .collect();
    assert_eq!(epoch_rows, (1..=epochs).collect::<Vec<_>>(), "{stdout}");
    let spark = stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("train loss "))
        .expect("a sparkline");
    assert_eq!(spark.chars().count(), epochs as usize, "{stdout}");
    // The loss fell: the last epoch's bar is lower than the first's.
    let bars: Vec<char> = spark.chars().collect();
    assert!(bars[epochs as usize - 1] < bars[0], "{stdout}");

    // An unknown job is a clear error naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(["status", "nope", "--rendezvous", &cluster.rendezvous_url()])
        .arg("--token-file")
        .arg(&token_file)
        .output()
        .expect("kindling status");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("job `nope`"));
    cluster.shutdown().await;
}

/// `--status-addr`: the local cluster's rendezvous (its gRPC, status page and
/// `/metrics`) listens where asked, on loopback only without TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cluster_serves_its_status_page_on_the_chosen_loopback_address_only() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut config = LocalClusterConfig::new(dir.path());
    config.rendezvous_addr = Some(addr);
    let cluster = LocalCluster::start(1, config).await.expect("cluster");
    assert_eq!(cluster.rendezvous_url(), format!("http://{addr}"));
    let token = cluster.token().expect("token").expose().to_owned();
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(
        format!("GET /api/status HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"jobs\""), "{answer}");
    cluster.shutdown().await;

    let mut open = LocalClusterConfig::new(dir.path().join("open"));
    open.rendezvous_addr = Some(([0, 0, 0, 0], 0).into());
    let err = LocalCluster::start(1, open)
        .await
        .expect_err("plaintext off loopback");
    assert!(err.to_string().contains("not a loopback address"), "{err}");
}
