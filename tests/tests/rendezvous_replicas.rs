//! The rendezvous replicated on etcd, with real processes: a 3-member etcd
//! cluster (Debian's `etcd-server`) and `kindling-rendezvous` replicas on
//! loopback. A SIGKILLed leader is replaced within its lease and a formed
//! gang goes on in the same attempt; a leader cut off from etcd steps down
//! before a successor acknowledges anything, and no acknowledged write is
//! lost; an etcd member's death (a follower, then etcd's leader) is
//! invisible even to a client that tries once, a lost quorum is an error
//! naming etcd, and its return resumes the job where it was. `kindling
//! train` on a real Spark query and agents rides out ten leader SIGKILLs in
//! one run; the Python package's job two (one before it is created).
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kindling_schemas::auth::Token;
use kindling_schemas::rendezvous::{
    AgentInfo, AgentLease, GangMember, JobConfig, JobState, RendezvousClient,
};
use kindling_tests::etcd::{EtcdCluster, Replica};

use crate::python_common;
use kindling_tests::proxy::FreezableProxy;
use tokio::time::Instant;

const TOKEN: &str = "replicas-test-token";

/// Upper bound of anything a test waits on.
const GUARD: Duration = Duration::from_secs(60);

async fn client(urls: &str) -> RendezvousClient {
    RendezvousClient::connect_lazy(urls, Some(&Token::new(TOKEN))).unwrap()
}

/// A client of one replica that tries each call once.
async fn one_try(url: &str) -> RendezvousClient {
    client(url).await.with_outage_bound(Duration::ZERO)
}

fn agent(id: &str) -> AgentInfo {
    AgentInfo {
        agent_id: id.to_owned(),
        flight_address: format!("http://{id}.local:50051"),
        capacity: 1,
        ..Default::default()
    }
}

/// Registers `n` agents and forms the gang of a new job `job_id`.
async fn formed_gang(
    rv: &RendezvousClient,
    job_id: &str,
    n: usize,
) -> (Vec<AgentLease>, Vec<Arc<GangMember>>) {
    let mut leases = Vec::new();
    for i in 0..n {
        leases.push(rv.register(agent(&format!("{job_id}-a{i}"))).await.unwrap());
    }
    let attempt = rv.create_job(&JobConfig::new(job_id, n as u32)).await.unwrap();
    assert_eq!(attempt, 1);
    let joins: Vec<_> = (0..n)
        .map(|i| {
            let rv = rv.clone();
            let (job, id) = (job_id.to_owned(), format!("{job_id}-a{i}"));
            tokio::spawn(async move { rv.join(&job, 1, &id).await })
        })
        .collect();
    let mut gang = Vec::new();
    for j in joins {
        gang.push(Arc::new(
            tokio::time::timeout(GUARD, j).await.unwrap().unwrap().unwrap(),
        ));
    }
    (leases, gang)
}

/// One barrier of every member; the time it took.
async fn barrier(gang: &[Arc<GangMember>]) -> Duration {
    let started = Instant::now();
    let calls: Vec<_> = gang
        .iter()
        .map(|m| {
            let m = m.clone();
            tokio::spawn(async move { m.barrier().await })
        })
        .collect();
    for c in calls {
        tokio::time::timeout(GUARD, c).await.unwrap().unwrap().unwrap();
    }
    started.elapsed()
}

/// Twenty rounds of a write (a new job) by a client of `url` that tries
/// each call once, and a barrier of `gang`: every write answered the first
/// time.
async fn answered_first_time(url: &str, gang: &[Arc<GangMember>], jobs: &str) {
    let quick = one_try(url).await;
    for i in 0..20 {
        let job = format!("{jobs}-{i}");
        if let Err(e) = quick.create_job(&JobConfig::new(&job, 1)).await {
            panic!("write {i} of 20 refused: {e}");
        }
        barrier(gang).await;
    }
}

/// A 3-member etcd, three replicas on it under `prefix`, and a local
/// cluster of two agents following them (their URLs, comma-separated).
async fn replicated_cluster(
    prefix: &str,
) -> (
    EtcdCluster,
    tempfile::TempDir,
    Vec<Replica>,
    String,
    kindling::local::LocalCluster,
) {
    use kindling::local::{LocalCluster, LocalClusterConfig};
    let etcd = EtcdCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let store = etcd.store(prefix);
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(Replica::start(&format!("r{i}"), &store, TOKEN, dir.path()).await);
    }
    let urls = replicas
        .iter()
        .map(|r| r.url.clone())
        .collect::<Vec<_>>()
        .join(",");
    let mut config = LocalClusterConfig::new(dir.path());
    config.token = Some(Token::new(TOKEN));
    config.external_rendezvous = Some(urls.clone());
    let cluster = LocalCluster::start(2, config).await.expect("cluster");
    (etcd, dir, replicas, urls, cluster)
}

/// Which of `replicas` leads: the one a status call is answered by.
async fn leader(replicas: &[&Replica]) -> usize {
    kindling_tests::etcd::leader(replicas, TOKEN).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_is_replaced_within_its_lease_and_the_gang_goes_on_in_the_same_attempt() {
    let etcd = EtcdCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let store = etcd.store("kill-leader");
    let mut replicas = [
        Replica::start("r0", &store, TOKEN, dir.path()).await,
        Replica::start("r1", &store, TOKEN, dir.path()).await,
    ];
    let urls = format!("{},{}", replicas[0].url, replicas[1].url);
    let rv = client(&urls).await;
    let (_leases, gang) = formed_gang(&rv, "failover", 2).await;
    barrier(&gang).await;

    let first = leader(&[&replicas[0], &replicas[1]]).await;
    // Leadership holds while its holder lives: three leases, the same leader
    // throughout (a lease that is not renewed would hand it over every 2 s).
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(6) {
        assert_eq!(
            leader(&[&replicas[0], &replicas[1]]).await,
            first,
            "the leadership moved without a failure after {:?}",
            watched.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    replicas[first].proc.sigkill();
    // Every member's next barrier is released by the new leader.
    let took = barrier(&gang).await;
    let status = rv.status("failover").await.unwrap();
    assert_eq!(
        (status.state, status.attempt),
        (JobState::Running, 1),
        "{status:?}"
    );
    assert!(status.failures.is_empty(), "{status:?}");
    assert_eq!(
        rv.current_url(),
        replicas[1 - first].url,
        "the client follows the new leader"
    );
    // The new leader holds what the old one acknowledged: the gang completes.
    for m in &gang {
        m.complete().await.unwrap();
    }
    let done = rv.status("failover").await.unwrap();
    assert_eq!((done.state, done.attempt), (JobState::Succeeded, 1));
    eprintln!("barrier released again {took:?} after the leader's SIGKILL");
    // A follower answers naming the leader; each says on /metrics whether it leads.
    let mut r = Replica::start("r2", &store, TOKEN, dir.path()).await;
    // A follower that has not read the election yet says that no leader is
    // known; once it has, it names the leader.
    let deadline = Instant::now() + GUARD;
    let err = loop {
        let err = one_try(&r.url).await.list_jobs().await.unwrap_err();
        if err.leader_hint().is_some() || Instant::now() > deadline {
            break err;
        }
        assert!(err.to_string().contains("no leader is known yet"), "{err}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(err.leader_hint(), Some(replicas[1 - first].url.as_str()), "{err}");
    assert!(err.to_string().contains("not the leader"), "{err}");
    for (url, leads) in [(&r.url, 0), (&replicas[1 - first].url, 1)] {
        let addr = url.trim_start_matches("http://");
        let page = kindling_tests::http::get(addr, "/metrics", &[kindling_tests::http::bearer(TOKEN)]).await;
        assert_eq!(page.code, 200, "{page:?}");
        assert!(
            page.body.lines().any(|l| l
                .strip_prefix("kindling_rendezvous_leader ")
                .and_then(|v| v.parse::<f64>().ok())
                == Some(f64::from(leads))),
            "{url}: {}",
            page.body
        );
    }
    let page = kindling_tests::http::get(
        r.url.trim_start_matches("http://"),
        "/",
        &[kindling_tests::http::bearer(TOKEN)],
    )
    .await;
    assert!(
        page.body.contains(&format!(
            "The leader is <a href=\"{}/\">",
            replicas[1 - first].url
        )),
        "the follower's page names the leader: {page:?}"
    );
    r.proc.sigkill();
}

/// One acknowledged call: which replica answered, when it was sent and
/// when its answer came back.
#[derive(Clone, Debug)]
struct Ack {
    replica: usize,
    job_id: String,
    sent: Instant,
    answered: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_from_etcd_steps_down_before_a_successor_acknowledges_and_nothing_acknowledged_is_lost()
 {
    let etcd = EtcdCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    // r0 reaches etcd only through proxies the test can freeze.
    let mut proxies = Vec::new();
    for i in 0..3 {
        proxies.push(FreezableProxy::start(etcd.client_addr(i)).await);
    }
    let hosts: Vec<String> = proxies
        .iter()
        .map(|p| p.url().trim_start_matches("http://").to_owned())
        .collect();
    let r0 = Replica::start(
        "r0",
        &format!("etcd://{}/partition", hosts.join(",")),
        TOKEN,
        dir.path(),
    )
    .await;
    assert_eq!(leader(&[&r0]).await, 0, "r0 leads first");
    let r1 = Replica::start("r1", &etcd.store("partition"), TOKEN, dir.path()).await;

    // Writers on each replica, one try per call, a fresh job id each.
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut writers = Vec::new();
    for (i, url) in [r0.url.clone(), r1.url.clone()].into_iter().enumerate() {
        let (acks, stop) = (acks.clone(), stop.clone());
        let rv = one_try(&url).await;
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.is_cancelled() {
                n += 1;
                let job_id = format!("w{i}-{n}");
                let sent = Instant::now();
                if rv.create_job(&JobConfig::new(&job_id, 1)).await.is_ok() {
                    let answered = Instant::now();
                    acks.lock().unwrap().push(Ack {
                        replica: i,
                        job_id,
                        sent,
                        answered,
                    });
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let frozen_at = Instant::now();
    for p in &proxies {
        p.freeze();
    }
    // r1 takes over once r0's lease lapsed.
    let deadline = Instant::now() + GUARD;
    while !acks.lock().unwrap().iter().any(|a| a.replica == 1) {
        assert!(
            Instant::now() < deadline,
            "r1 never led:\n{}\n{}",
            r0.proc.logs(),
            r1.proc.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    for w in writers {
        w.await.unwrap();
    }
    let acks = acks.lock().unwrap().clone();
    let (old, new): (Vec<&Ack>, Vec<&Ack>) = acks.iter().partition(|a| a.replica == 0);
    assert!(
        !old.is_empty() && !new.is_empty(),
        "both replicas led in turn: {acks:?}"
    );
    // No overlap: every call r0 acknowledged was sent before r1's first
    // acknowledgement came back.
    let last_old = old.iter().map(|a| a.sent).max().unwrap();
    let first_new = new.iter().map(|a| a.answered).min().unwrap();
    assert!(
        last_old < first_new,
        "r0 acknowledged a call sent after r1 had led"
    );
    // r0 stopped acknowledging within its 2 s lease of the cut (its last
    // answer left it before then; 0.5 s for this process to read it).
    let last_old_answer = old.iter().map(|a| a.answered).max().unwrap();
    assert!(
        last_old_answer < frozen_at + Duration::from_millis(2500),
        "r0 acknowledged {:?} after the cut",
        last_old_answer - frozen_at
    );
    let err = one_try(&r0.url).await.list_jobs().await.unwrap_err();
    assert!(err.to_string().contains("(Unavailable)"), "{err}");
    // Every acknowledged job is in the new leader's state.
    let held: std::collections::BTreeSet<String> = one_try(&r1.url)
        .await
        .list_jobs()
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.job_id)
        .collect();
    for a in &acks {
        assert!(held.contains(&a.job_id), "acknowledged `{}` was lost", a.job_id);
    }
    eprintln!(
        "{} acknowledged by r0, {} by r1; r1's first {:?} after the cut",
        old.len(),
        new.len(),
        first_new - frozen_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etcd_member_lost_is_invisible_a_lost_quorum_names_etcd_and_its_return_resumes_the_job() {
    let mut etcd = EtcdCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let store = etcd.store("quorum");
    let r0 = Replica::start("r0", &store, TOKEN, dir.path()).await;
    let r1 = Replica::start("r1", &store, TOKEN, dir.path()).await;
    let urls = format!("{},{}", r0.url, r1.url);
    let rv = client(&urls).await;
    let (_leases, gang) = formed_gang(&rv, "quorum", 2).await;
    barrier(&gang).await;

    // One member of three, not etcd's leader: nothing to see, not even for
    // a client that tries each call once (etcd's client keeps handing calls
    // to the dead member; the rendezvous sends those to another).
    let lead = leader(&[&r0, &r1]).await;
    let raft = etcd.raft_leader().expect("etcd has a leader");
    let follower = (raft + 1) % 3;
    etcd.kill(follower);
    answered_first_time(&[&r0, &r1][lead].url, &gang, "etcd-follower-lost").await;
    assert_eq!(
        leader(&[&r0, &r1]).await,
        lead,
        "losing an etcd follower moved the leadership"
    );
    etcd.restart(follower);
    etcd.wait_healthy().await;

    // etcd's own leader: etcd elects another (about a second), which the
    // gang's calls ride out; then every call is answered the first time.
    etcd.kill(raft);
    barrier(&gang).await;
    let deadline = Instant::now() + GUARD;
    while etcd.raft_leader().is_none_or(|l| l == raft) {
        assert!(Instant::now() < deadline, "etcd elected no new leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lead = leader(&[&r0, &r1]).await;
    answered_first_time(&[&r0, &r1][lead].url, &gang, "etcd-leader-lost").await;
    let status = rv.status("quorum").await.unwrap();
    assert_eq!((status.state, status.attempt), (JobState::Running, 1));
    assert!(status.failures.is_empty(), "{status:?}");

    // Two of three: a write fails naming etcd.
    let other = (0..3).find(|&m| m != raft).expect("three members");
    etcd.kill(other);
    let quick = one_try(&urls).await;
    let deadline = Instant::now() + GUARD;
    let err = loop {
        match quick.create_job(&JobConfig::new("without-quorum", 1)).await {
            Err(e) if e.to_string().contains("etcd") => break e,
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "a write without quorum never failed naming etcd"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(err.to_string().contains("(Unavailable)"), "{err}");
    // Members waiting in a barrier ride it out and go on once quorum is back.
    let waiting = {
        let gang = gang.clone();
        tokio::spawn(async move { barrier(&gang).await })
    };
    // Until quorum returns no replica leads: the leader stepped down when
    // its lease could have lapsed, and each replica's refusal names etcd.
    for url in [&r0.url, &r1.url] {
        let deadline = Instant::now() + GUARD;
        loop {
            // The leader answers until its lease could have lapsed (etcd's
            // own leader renews it until it notices the lost quorum).
            match one_try(url).await.list_jobs().await {
                Err(err)
                    if err.leader_hint().is_none()
                        && err.to_string().contains("no rendezvous replica leads") =>
                {
                    assert!(err.to_string().contains("etcd"), "{err}");
                    break;
                }
                other => {
                    assert!(
                        Instant::now() < deadline,
                        "{url} still leads or names a leader: {other:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    etcd.restart(raft);
    etcd.restart(other);
    etcd.wait_healthy().await;
    tokio::time::timeout(GUARD, waiting).await.unwrap().unwrap();
    let status = rv.status("quorum").await.unwrap();
    assert_eq!(
        (status.state, status.attempt),
        (JobState::Running, 1),
        "{status:?}"
    );
    assert!(status.failures.is_empty(), "{status:?}");
    for m in &gang {
        m.complete().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kindling_train_rides_out_ten_leader_kills_on_its_first_attempt_and_trains_every_row_once_per_epoch()
{
    use kindling_schemas::action::{Action, JobList};

    let rows = 20_000u64;
    let (_etcd, dir, mut replicas, urls, cluster) = replicated_cluster("train").await;
    let token_file = dir.path().join("cli.token");
    std::fs::write(&token_file, TOKEN).unwrap();
    // Long enough for ten failovers (each about the 2 s lease) on this kind of machine.
    let epochs = 400;
    let mut command =
        std::process::Command::new(kindling_tests::netns::binary("kindling", "KINDLING_CLI_BIN"));
    command
        .args(kindling_tests::spark::rule_cli("train", rows as usize, 2))
        .args([
            "--epochs",
            &epochs.to_string(),
            "--batch-size",
            "16",
            "--eval-fraction",
            "0",
        ])
        .args(["--rendezvous", &urls])
        .arg("--token-file")
        .arg(&token_file)
        .arg("-o")
        .arg(dir.path().join("model"));
    // Killed if the test fails; its stderr in train.log.
    let mut train = kindling_tests::netns::Proc::spawn("train", command, String::new(), dir.path());

    // Training under way: the job runs at the rendezvous.
    let rv = client(&urls).await;
    let deadline = Instant::now() + GUARD;
    let job_id = loop {
        let running = rv
            .list_jobs()
            .await
            .unwrap()
            .into_iter()
            .find(|j| j.state == JobState::Running);
        if let Some(job) = running {
            break job.job_id;
        }
        assert!(Instant::now() < deadline, "the job never ran:\n{}", train.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut failovers = Vec::new();
    for _ in 0..10 {
        let refs: Vec<&Replica> = replicas.iter().collect();
        let led = leader(&refs).await;
        replicas[led].proc.sigkill();
        let killed = Instant::now();
        rv.list_jobs().await.expect("a new leader answers");
        failovers.push(killed.elapsed());
        assert!(
            train.try_wait().is_none(),
            "kindling train ended before the tenth failover (make it longer):\n{}",
            train.logs()
        );
        replicas[led].restart().await;
    }
    let (ended, train) = tokio::task::spawn_blocking(move || (train.wait(), train))
        .await
        .unwrap();
    assert!(ended.success(), "{}", train.logs());
    assert!(dir.path().join("model/spec.json").exists(), "{}", train.logs());
    let status = rv.status(&job_id).await.unwrap();
    assert_eq!(
        (status.state, status.attempt),
        (JobState::Succeeded, 1),
        "{status:?}"
    );
    assert!(status.failures.is_empty(), "{status:?}");
    // Every epoch trained every row once (each agent reports the job's rows).
    for url in cluster.agent_urls() {
        let agent = kindling::feed::AgentClient::connect(&url, Some(&Token::new(TOKEN))).expect("client");
        let jobs: JobList = agent.action(&Action::ListJobs).await.expect("list");
        let job = jobs
            .jobs
            .iter()
            .find(|j| j.job_id == job_id)
            .expect("the job on each agent");
        assert_eq!(job.rows_trained_per_epoch.len(), epochs, "{job:?}");
        let wrong: Vec<(usize, u64)> = job
            .rows_trained_per_epoch
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != rows)
            .map(|(e, n)| (e, *n))
            .collect();
        assert!(
            wrong.is_empty(),
            "epochs that did not train each of the {rows} rows once: {wrong:?}"
        );
    }
    failovers.sort();
    eprintln!("failovers (SIGKILL → a new leader answers): {failovers:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_reaches_etcd_over_mutual_tls_one_without_a_client_certificate_never_leads_and_plaintext_off_loopback_is_refused()
 {
    use kindling_fixtures::pki::TestCa;
    use std::ffi::OsString;

    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("etcd-ca");
    let client = ca
        .issue("kindling-rendezvous", &["kindling-rendezvous"])
        .write(&dir.path().join("client-tls"), ca.pem());
    let etcd = EtcdCluster::start_tls(3, &ca, &client).await;
    let store = etcd.store("tls");
    let with = |pairs: &[(&str, &std::path::Path)]| -> Vec<OsString> {
        pairs
            .iter()
            .flat_map(|(flag, path)| [OsString::from(flag), path.as_os_str().to_owned()])
            .collect()
    };
    // No client certificate: etcd refuses the handshake; the replica never
    // leads and says why, naming etcd.
    let anonymous = Replica::start_with(
        "anonymous",
        &store,
        TOKEN,
        dir.path(),
        &with(&[("--etcd-ca", &client.ca)]),
    )
    .await;
    let err = one_try(&anonymous.url).await.list_jobs().await.unwrap_err();
    assert!(
        err.to_string().contains("not the leader") || err.to_string().contains("etcd"),
        "{err}"
    );
    // With one: it leads, and keeps jobs.
    let mutual = Replica::start_with(
        "mutual",
        &store,
        TOKEN,
        dir.path(),
        &with(&[
            ("--etcd-ca", &client.ca),
            ("--etcd-cert", &client.cert),
            ("--etcd-key", &client.key),
        ]),
    )
    .await;
    assert_eq!(leader(&[&mutual]).await, 0);
    let rv = one_try(&mutual.url).await;
    rv.create_job(&JobConfig::new("over-tls", 1)).await.unwrap();
    assert_eq!(rv.status("over-tls").await.unwrap().attempt, 1);
    let refused = one_try(&anonymous.url).await.list_jobs().await.unwrap_err();
    assert!(
        refused.to_string().contains("etcd") && !refused.to_string().contains("the leader is"),
        "the replica without a certificate still cannot reach etcd: {refused}"
    );
    // Plaintext to an etcd off loopback is refused at start, naming it.
    let out = std::process::Command::new(kindling_tests::netns::binary(
        "kindling-rendezvous",
        "KINDLING_RENDEZVOUS_BIN",
    ))
    .args([
        "--allow-unauthenticated",
        "--listen",
        "127.0.0.1:0",
        "--health-listen",
        "127.0.0.1:0",
    ])
    .args([
        "--store",
        "etcd://etcd.example:2379",
        "--advertise",
        "http://127.0.0.1:1",
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(
        stderr.contains("plaintext to etcd at etcd.example:2379"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_package_s_job_rides_out_leader_kills_before_it_is_created_and_while_it_trains() {
    use std::io::{BufRead, BufReader, Write};

    let (_etcd, _dir, mut replicas, urls, cluster) = replicated_cluster("python").await;

    // The leader SIGKILLed just before the package creates its job: the
    // agent it asks follows the rendezvous to the next leader.
    let refs: Vec<&Replica> = replicas.iter().collect();
    let first = leader(&refs).await;
    replicas[first].proc.sigkill();
    let (rows, epochs) = (2_000u64, 1_200usize);
    let args = serde_json::json!({
        "agents": cluster.agent_urls(),
        "token": TOKEN,
        "job_id": "python-on-replicas",
        "rows_per_agent": rows,
        "epochs": epochs,
    });
    let mut python = std::process::Command::new(python_common::python_bin())
        .arg(python_common::repo_root().join("tests/python/job_on_replicas.py"))
        .arg(args.to_string())
        .env("PYTHONPATH", python_common::repo_root().join("deploy/python"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    let mut stdin = python.stdin.take().unwrap();
    let mut lines = BufReader::new(python.stdout.take().unwrap()).lines();
    let fed = tokio::task::spawn_blocking(move || {
        let line = lines.next();
        (line, lines)
    });
    let (fed, lines) = tokio::time::timeout(GUARD, fed).await.unwrap().unwrap();
    let fed = match fed {
        Some(Ok(line)) => line,
        other => {
            let out = python.wait_with_output().unwrap();
            panic!(
                "the script never fed its job ({other:?}):\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        }
    };
    assert!(fed.starts_with("fed "), "{fed}");
    replicas[first].restart().await;

    // And the next leader SIGKILLed while the job trains.
    let refs: Vec<&Replica> = replicas.iter().collect();
    let second = leader(&refs).await;
    replicas[second].proc.sigkill();
    let killed = Instant::now();
    client(&urls)
        .await
        .list_jobs()
        .await
        .expect("a new leader answers");
    eprintln!("failover while training: {:?}", killed.elapsed());
    writeln!(stdin, "go on").unwrap();
    let rest = tokio::task::spawn_blocking(move || lines.collect::<Result<Vec<String>, _>>());
    let rest = tokio::time::timeout(Duration::from_secs(300), rest)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the script failed ({}):\n{rest:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The job still trained after the second kill: it ran through it.
    let resumed: serde_json::Value =
        serde_json::from_str(rest[0].strip_prefix("resumed ").expect("resumed line")).unwrap();
    assert!(
        resumed["history"].as_array().unwrap().len() < epochs,
        "the job ended before the leader was killed (make it longer): {resumed}"
    );
    eprintln!(
        "epochs trained when the job went on: {}",
        resumed["history"].as_array().unwrap().len()
    );
    let result: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(result["created"]["attempt"], 1, "{result}");
    assert_eq!(result["rendezvous"], urls.as_str(), "{result}");
    assert_eq!(
        result["states"],
        serde_json::json!(["succeeded", "succeeded"]),
        "{result}"
    );
    assert_eq!(result["attempts"], serde_json::json!([1, 1]), "{result}");
    let per_epoch = result["rows_per_epoch"].as_array().unwrap();
    assert_eq!(per_epoch.len(), epochs, "{result}");
    assert!(per_epoch.iter().all(|n| n == rows), "{result}");
    cluster.shutdown().await;
}
