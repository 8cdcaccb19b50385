//! The soak, scaled to a few minutes: long jobs on real agent processes
//! following three rendezvous replicas on a 3-member etcd, while faults come
//! on a schedule driven by the jobs' own events.
//!
//! - Job A (`fit` in this process, 3 agents, may grow to 4, a checkpoint
//!   every [`EVERY_STEPS`] steps): a fourth agent starts after the job did
//!   and joins at an epoch's end; the rendezvous leader is SIGKILLed (and
//!   restarted); an agent is SIGKILLed mid-epoch past a checkpoint and a
//!   replacement starts. Every epoch trains every row once on every agent;
//!   the steps lost to the kill are printed and fewer than the interval.
//! - Job B (`kindling train --detach`, then `kindling wait`): the waiting
//!   client is SIGKILLed while the job trains and the leader again; then
//!   one of its agents is SIGKILLed and restarted on its node (its work
//!   dir kept), with no client: it takes back the rows it kept on its disk
//!   and its place in the job. A new `kindling wait` re-attaches and sees
//!   it succeed, `kindling fetch` saves it. Its model is bitwise the one
//!   the same job trains with no fault (job C, on the same agents), and
//!   every epoch trained every row once.
//!
//! Growth is `fit`'s (its shards move through the client), so it is job A's.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kindling::SparkSession;
use kindling::feed::AgentClient;
use kindling::job::{TrainedModel, TrainingEvent};
use kindling_schemas::action::{AgentJobState, AgentJobStatus};
use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_schemas::spec::CheckpointPolicy;
use kindling_tests::cluster::{resumed_near, wait_for_job, weight_bits};
use kindling_tests::etcd::{EtcdCluster, Replica, leader};
use kindling_tests::netns::binary;
use kindling_tests::procs::{ProcCluster, TOKEN};
use kindling_tests::spark::{rule_cli, rule_df, rule_job, spark_remote};

/// Steps between job A's checkpoints inside an epoch.
const EVERY_STEPS: u64 = 100;
/// Job A's epochs and rows: long enough for its three faults.
const EPOCHS_A: u32 = 30;
const ROWS_A: usize = 24_000;
/// Jobs B and C.
const EPOCHS_B: u32 = 200;
const ROWS_B: usize = 8_000;

/// The job's status on the agent at `url`, once it ended there.
async fn ended(url: &str, job_id: &str) -> AgentJobStatus {
    let c =
        AgentClient::connect_with(url, Some(&Token::new(TOKEN)), &ChannelConfig::default()).expect("agent");
    wait_for_job(&c, job_id, "the job ended", Duration::from_secs(300), |s| {
        s.state.is_terminal()
    })
    .await
}

/// SIGKILLs the leading replica and starts it again.
async fn kill_leader(replicas: &mut [Replica]) {
    let led = leader(&replicas.iter().collect::<Vec<_>>(), TOKEN).await;
    replicas[led].proc.sigkill();
    replicas[led].restart().await;
}

/// `kindling ARGS` against the replicas, its stdout and stderr in
/// `dir/<name>.out` and `.err`.
fn kindling(procs: &ProcCluster, dir: &Path, name: &str, args: &[&str]) -> Child {
    let file = |ext: &str| std::fs::File::create(dir.join(format!("{name}.{ext}"))).expect("log");
    Command::new(binary("kindling", "KINDLING_CLI_BIN"))
        .args(args)
        .args(["--rendezvous", &procs.rendezvous_url])
        .arg("--token-file")
        .arg(&procs.token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file("out")))
        .stderr(Stdio::from(file("err")))
        .spawn()
        .expect("kindling")
}

/// Runs `kindling ARGS` to its end and returns its stdout; fails with both
/// outputs unless it succeeded.
async fn finished(procs: &ProcCluster, dir: &Path, name: &str, args: &[&str]) -> String {
    let mut child = kindling(procs, dir, name, args);
    let exit = tokio::task::spawn_blocking(move || child.wait().expect("wait"))
        .await
        .expect("wait");
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{name}.{ext}"))).unwrap_or_default();
    assert!(
        exit.success(),
        "kindling {name}: {exit}\n{}\n{}",
        read("out"),
        read("err")
    );
    read("out")
}

/// `kindling train --detach` of job `job_id`: the rule on [`ROWS_B`] rows.
async fn submit(procs: &ProcCluster, dir: &Path, job_id: &str) {
    let epochs = EPOCHS_B.to_string();
    let mut args = rule_cli("train", ROWS_B, 3);
    let rest = [
        "--epochs",
        &epochs,
        "--batch-size",
        "16",
        "--eval-fraction",
        "0",
        "--seed",
        "5",
    ];
    args.extend(rest.map(str::to_owned));
    args.extend(["--job-id", job_id, "--detach"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finished(procs, dir, &format!("submit-{job_id}"), &args).await;
    // Every agent kept the job's rows on its disk before it was detached.
    let err = std::fs::read_to_string(dir.join(format!("submit-{job_id}.err"))).expect("stderr");
    let kept = err
        .lines()
        .find(|l| l.contains(&format!("{ROWS_B} rows kept on the agents' disks")))
        .unwrap_or_else(|| panic!("the rows were kept before the job was detached:\n{err}"));
    eprintln!("{job_id}: {kept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_long_jobs_ride_out_agent_leader_and_client_kills_and_a_joining_agent_training_every_row_once() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let etcd = EtcdCluster::start(3).await;
    let dir = tempfile::tempdir().expect("dir");
    let store = etcd.store("soak");
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(Replica::start(&format!("r{i}"), &store, TOKEN, dir.path()).await);
    }
    let urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    let mut procs = ProcCluster::on(&urls.join(","), 3, dir.path()).await;
    let rv = RendezvousClient::connect_lazy(&procs.rendezvous_url, Some(&procs.token())).expect("rendezvous");
    let began = Instant::now();

    // Job A: grows, rides out a leader kill and an agent kill.
    let df = rule_df(&spark, ROWS_A).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(8192);
    let job_a = rule_job()
        .local_mode(false)
        .rendezvous(procs.rendezvous_url.clone())
        .token(procs.token())
        .job_id("soak-a")
        .num_slots(3)
        .max_slots(4)
        .epochs(EPOCHS_A)
        .batch_size(8)
        .eval_fraction(0.0)
        .checkpoint(CheckpointPolicy {
            every_steps: EVERY_STEPS,
            every_secs: 0,
            ..Default::default()
        })
        .events(tx)
        .build()
        .expect("job");
    let fit = {
        let df = df.clone();
        tokio::spawn(async move { job_a.fit(&df).await })
    };
    let (mut grown, mut led_killed, mut at_kill, mut members) = (None, false, None, Vec::new());
    // The last step the client saw before the gang grew: about what the
    // growth trains again (the members were past an epoch's end).
    let mut last_step = (0, 0);
    while let Some(e) = rx.recv().await {
        match e {
            TrainingEvent::Started { agents, .. } => {
                members = agents;
                // Joins at the first epoch's end after it registered.
                procs.add_agent(dir.path()).await;
            }
            TrainingEvent::Step { epoch, step, .. } if grown.is_none() => last_step = (epoch, step),
            TrainingEvent::Grown {
                joined, world_size, ..
            } => grown = Some((joined, world_size, last_step)),
            TrainingEvent::Step { epoch, .. } if grown.is_some() && !led_killed && epoch >= 3 => {
                kill_leader(&mut replicas).await;
                led_killed = true;
            }
            TrainingEvent::Step { epoch, step, .. }
                if led_killed && at_kill.is_none() && epoch >= 5 && step > EVERY_STEPS =>
            {
                // Frozen while a survivor says where it is; killed if its
                // epoch has a checkpoint inside it and is not ending.
                let victim = procs.index_of(&members[1]).expect("victim");
                procs.freeze_agent(victim, true);
                let survivor =
                    AgentClient::connect_with(&members[0], Some(&procs.token()), &ChannelConfig::default())
                        .expect("survivor");
                let s = survivor.job_status("soak-a").await.expect("status");
                if s.step > EVERY_STEPS && s.step + 1 < s.steps_per_epoch {
                    procs.kill_agent(victim);
                    at_kill = Some((s.epoch, s.step));
                    procs.add_agent(dir.path()).await;
                } else {
                    procs.freeze_agent(victim, false);
                }
            }
            _ => {}
        }
    }
    let model_a = fit
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("job A rides out its faults: {e}\n{}", procs.logs()));
    assert_eq!(model_a.history().len(), EPOCHS_A as usize);
    let (joined, world, before) = grown.unwrap_or_else(|| panic!("job A grew\n{}", procs.logs()));
    assert_eq!(world, 4, "{joined} joined");
    let at_kill = at_kill.unwrap_or_else(|| panic!("an agent was killed (make job A longer)"));
    let every_row_once = vec![ROWS_A as u64; EPOCHS_A as usize];
    let mut lost_steps = Vec::new();
    for (i, url) in procs.agent_urls.iter().enumerate() {
        if procs.agents[i].is_none() {
            continue;
        }
        let s = ended(url, "soak-a").await;
        assert_eq!(s.state, AgentJobState::Succeeded, "{url}: {s:#?}");
        assert_eq!(s.rows_trained_per_epoch, every_row_once, "{url}");
        // The kill's attempt resumed inside the killed epoch, within one
        // checkpoint interval of the kill.
        lost_steps.push(resumed_near(url, &s, at_kill, EVERY_STEPS));
    }
    let status = rv.status("soak-a").await.expect("status");
    // Attempts: the first, the growth's, the kill's; the leader kill cost none.
    assert_eq!(status.attempt, 3, "{status:?}");
    eprintln!(
        "job A: {} rows × {EPOCHS_A} epochs on 3 → 4 agents in {:?}; grew at an epoch's end (the \
         last step seen before: epoch {}, step {}); killed at epoch {}, step {}; steps trained again \
         per agent: {lost_steps:?} (interval {EVERY_STEPS})",
        ROWS_A,
        began.elapsed(),
        before.0,
        before.1,
        at_kill.0,
        at_kill.1
    );

    // Jobs B and C: a detached job whose client is killed and re-attached
    // while the leader is killed again, and the same job with no fault.
    let began = Instant::now();
    submit(&procs, dir.path(), "soak-b").await;
    let mut waiting = kindling(&procs, dir.path(), "wait-b-1", &["wait", "soak-b"]);
    let index_of = |id: &str| -> usize {
        id.strip_prefix("agent-")
            .and_then(|i| i.parse().ok())
            .expect("agent-<i>")
    };
    let members: Vec<usize> = rv
        .status("soak-b")
        .await
        .expect("status")
        .members
        .iter()
        .map(|id| index_of(id))
        .collect();
    assert_eq!(members.len(), 3);
    let agent = |procs: &ProcCluster, i: usize| {
        AgentClient::connect_with(
            &procs.agent_urls[i],
            Some(&procs.token()),
            &ChannelConfig::default(),
        )
        .expect("agent")
    };
    // Killed once the job is well into training.
    wait_for_job(
        &agent(&procs, members[0]),
        "soak-b",
        "job B in epoch 3",
        Duration::from_secs(120),
        |s| s.epoch >= 3 || s.state.is_terminal(),
    )
    .await;
    assert!(
        waiting.try_wait().expect("wait").is_none(),
        "kindling wait ended early (make job B longer)"
    );
    waiting.kill().expect("SIGKILL");
    waiting.wait().expect("reaped");
    kill_leader(&mut replicas).await;
    let status = rv.status("soak-b").await.expect("a new leader answers");
    assert!(
        !status.state.is_terminal(),
        "job B ended before the leader's kill (make it longer): {status:?}"
    );
    // With no client: an agent SIGKILLed and restarted on its node, inside
    // an epoch (frozen while a survivor says where the job is).
    let (victim, survivor) = (members[1], agent(&procs, members[0]));
    wait_for_job(
        &survivor,
        "soak-b",
        "job B in epoch 6",
        Duration::from_secs(120),
        |s| s.epoch >= 6 || s.state.is_terminal(),
    )
    .await;
    let at_kill = loop {
        procs.freeze_agent(victim, true);
        let s = survivor.job_status("soak-b").await.expect("status");
        assert!(
            !s.state.is_terminal(),
            "job B ended before the agent's kill (make it longer): {s:?}"
        );
        if s.step > 0 && s.step + 1 < s.steps_per_epoch {
            procs.kill_agent(victim);
            break s;
        }
        procs.freeze_agent(victim, false);
        wait_for_job(
            &survivor,
            "soak-b",
            "job B inside an epoch",
            Duration::from_secs(60),
            |t| (t.epoch, t.step) != (s.epoch, s.step),
        )
        .await;
    };
    procs.restart_agent(victim, dir.path()).await;
    let waited = finished(&procs, dir.path(), "wait-b-2", &["wait", "soak-b"]).await;
    assert!(
        waited.contains(&format!("job soak-b succeeded: {EPOCHS_B} epochs")),
        "{waited}"
    );
    let b_dir = dir.path().join("model-b");
    finished(
        &procs,
        dir.path(),
        "fetch-b",
        &["fetch", "soak-b", "-o", b_dir.to_str().expect("path")],
    )
    .await;
    let b_secs = began.elapsed();
    submit(&procs, dir.path(), "soak-c").await;
    finished(&procs, dir.path(), "wait-c", &["wait", "soak-c"]).await;
    let c_dir = dir.path().join("model-c");
    finished(
        &procs,
        dir.path(),
        "fetch-c",
        &["fetch", "soak-c", "-o", c_dir.to_str().expect("path")],
    )
    .await;
    let (b, c) = (
        TrainedModel::load(&b_dir).expect("model B"),
        TrainedModel::load(&c_dir).expect("model C"),
    );
    assert_eq!(
        weight_bits(&b),
        weight_bits(&c),
        "the re-attached job's model is the fault-free one's"
    );
    // One failed attempt, the agent's kill's; the leader's cost none.
    let status = rv.status("soak-b").await.expect("status");
    assert_eq!((status.attempt, status.failures.len()), (2, 1), "{status:?}");
    let mut redone = Vec::new();
    for &i in &members {
        let url = &procs.agent_urls[i];
        let s = ended(url, "soak-b").await;
        assert_eq!(
            s.rows_trained_per_epoch,
            vec![ROWS_B as u64; EPOCHS_B as usize],
            "agent-{i} at {url}"
        );
        // Job B checkpoints at each epoch's end only: the restart's attempt
        // resumed from the end of the epoch before the kill's.
        let from = s
            .resumed_from_epoch
            .unwrap_or_else(|| panic!("agent-{i} resumed: {s:#?}"));
        assert_eq!(
            from + 1,
            at_kill.epoch,
            "agent-{i}: resumed at the killed epoch's start"
        );
        redone.push(at_kill.step - s.resumed_from_step.unwrap_or(0));
    }
    eprintln!(
        "job B: {ROWS_B} rows × {EPOCHS_B} epochs on 3 agents in {b_secs:?}: its client killed and \
         re-attached, the leader killed, an agent killed at epoch {} step {} of {} and restarted with \
         no client (steps trained again per agent: {redone:?}, interval: an epoch); its model \
         bitwise job C's",
        at_kill.epoch, at_kill.step, at_kill.steps_per_epoch
    );
    // Every agent of B and C kept their rows; one restarted after both
    // ended removes its copies (their jobs ended at the rendezvous).
    let kept = |i: usize, job: &str| {
        dir.path()
            .join(format!("agent-{i}/kept/agent-{i}/{job}/kept.json"))
            .exists()
    };
    for &i in &members {
        assert!(
            kept(i, "soak-b") && kept(i, "soak-c"),
            "agent-{i} kept B's and C's rows"
        );
    }
    let again = members[2];
    procs.kill_agent(again);
    procs.restart_agent(again, dir.path()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while kept(again, "soak-b") || kept(again, "soak-c") {
        assert!(
            Instant::now() < deadline,
            "agent-{again} restarted removes the copies of jobs that ended\n{}",
            procs.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
