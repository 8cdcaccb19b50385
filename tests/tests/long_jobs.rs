//! Long jobs: checkpoints inside an epoch, so a lost agent costs the steps
//! since the last one, not the epoch. A real Spark Connect server, real
//! `kindling-rendezvous` and `kindling-agent` processes; the agent is
//! SIGKILLed.

use std::time::Duration;

use kindling::SparkSession;
use kindling::feed::AgentClient;
use kindling::job::{TrainingEvent, TrainingJobBuilder};
use kindling_schemas::action::{AgentJobState, AgentJobStatus};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::spec::CheckpointPolicy;
use kindling_tests::cluster::{resumed_near, wait_for_job, weight_bits};
use kindling_tests::procs::ProcCluster;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};

/// Steps between the checkpoints inside an epoch (an epoch has 2,500).
const EVERY_STEPS: u64 = 200;
/// Epochs: enough that the kill, sent once rank 0's steps of epoch 2 are
/// reported, lands before the job ends.
const EPOCHS: u32 = 6;

/// The rule job on `procs`, as a remote client drives it: [`EPOCHS`] epochs
/// of batches of 8, a checkpoint every [`EVERY_STEPS`] steps and none by
/// time (the run does not depend on the clock).
fn job(procs: &ProcCluster, job_id: &str) -> TrainingJobBuilder {
    rule_job()
        .local_mode(false)
        .rendezvous(procs.rendezvous_url.clone())
        .token(procs.token())
        .job_id(job_id)
        .epochs(EPOCHS)
        .batch_size(8)
        .eval_fraction(0.0)
        .checkpoint(CheckpointPolicy {
            every_steps: EVERY_STEPS,
            every_secs: 0,
            ..Default::default()
        })
}

/// The job's status on the agent at `url`, once it ended there.
async fn ended(url: &str, procs: &ProcCluster, job_id: &str) -> AgentJobStatus {
    let c = AgentClient::connect_with(url, Some(&procs.token()), &ChannelConfig::default()).expect("agent");
    wait_for_job(&c, job_id, "the job ended", Duration::from_secs(120), |s| {
        s.state.is_terminal()
    })
    .await
}

/// An agent SIGKILLed inside epoch 2 or later, after a checkpoint inside
/// it: the next attempt resumes from that checkpoint (not from an epoch's
/// end), the replacement trains the lost shard's rest of the epoch in the
/// same order, every epoch trains every row once, and the model is bitwise
/// the one the same job trains with no failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_agent_costs_the_steps_since_the_checkpoint_inside_the_epoch_and_changes_nothing() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let rows = 40_000u64;
    let df = rule_df(&spark, rows as usize).await;
    let dir = tempfile::tempdir().expect("dir");
    let mut procs = ProcCluster::start(2, dir.path(), 600).await;
    let began = std::time::Instant::now();
    let steady = job(&procs, "steady").build().expect("job").fit(&df).await;
    let steady = steady.unwrap_or_else(|e| panic!("fit: {e}\n{}", procs.logs()));
    eprintln!("the steady run took {:?}", began.elapsed());

    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let killed = job(&procs, "killed").events(tx).build().expect("job");
    let fit = {
        let df = df.clone();
        tokio::spawn(async move { killed.fit(&df).await })
    };
    // Frozen (SIGSTOP) once rank 0 reports steps past a checkpoint inside
    // epoch 2 or later, the victim holds the survivor within a step of
    // where it is; killed there if the survivor's epoch has a checkpoint
    // inside it and is not ending, else let go and tried at the next report.
    let mut agents = None;
    let at_kill = loop {
        match rx.recv().await.expect("the job ended before the kill") {
            TrainingEvent::Started { agents: a, .. } => agents = Some(a),
            TrainingEvent::Step { epoch, step, .. } if epoch >= 2 && step > EVERY_STEPS => {
                let agents = agents.as_ref().expect("started");
                let victim = procs.index_of(&agents[1]).expect("victim");
                procs.freeze_agent(victim, true);
                let survivor =
                    AgentClient::connect_with(&agents[0], Some(&procs.token()), &ChannelConfig::default())
                        .expect("survivor");
                let s = survivor.job_status("killed").await.expect("status");
                if s.epoch >= 2 && s.step > EVERY_STEPS && s.step + 1 < s.steps_per_epoch {
                    eprintln!(
                        "killed at epoch {}, step {} of {}",
                        s.epoch, s.step, s.steps_per_epoch
                    );
                    procs.kill_agent(victim);
                    break (s.epoch, s.step);
                }
                procs.freeze_agent(victim, false);
            }
            _ => {}
        }
    };
    procs.add_agent(dir.path()).await;
    let mut resent = None;
    while let Some(e) = rx.recv().await {
        if let TrainingEvent::Recovering { resent_shards, .. } = e {
            resent = Some(resent_shards);
        }
    }
    let model = fit
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("fit survives the kill: {e}\n{}", procs.logs()));
    assert_eq!(resent, Some(vec![1]), "the lost shard was fed again");
    let live: Vec<String> = procs
        .agent_urls
        .iter()
        .zip(&procs.agents)
        .filter(|(_, a)| a.is_some())
        .map(|(u, _)| u.clone())
        .collect();
    for url in &live {
        let s = ended(url, &procs, "killed").await;
        assert_eq!(s.state, AgentJobState::Succeeded, "{s:#?}");
        let lost = resumed_near(url, &s, at_kill, EVERY_STEPS);
        eprintln!("{url} trains {lost} steps again");
        let every_row_once = vec![rows; EPOCHS as usize];
        assert_eq!(s.rows_trained_per_epoch, every_row_once, "{url}");
    }
    assert_eq!(model.history().len(), EPOCHS as usize);
    // The resumed epoch's loss too: its first steps' sums came back from
    // the checkpoint exactly.
    for (m, s) in model.history().iter().zip(steady.history()) {
        assert_eq!((m.epoch, m.train_loss), (s.epoch, s.train_loss));
    }
    assert_eq!(
        weight_bits(&steady),
        weight_bits(&model),
        "the killed run's weights are the steady run's"
    );
}

/// The checkpoints inside epochs that `agent-<i>` under `dir` holds of
/// `job_id`, by directory name (`epoch-<e>-step-<s>`), over its attempts.
fn inside_epochs(dir: &std::path::Path, i: usize, job_id: &str) -> std::collections::BTreeSet<String> {
    let agent = format!("agent-{i}");
    let job = dir.join(&agent).join("checkpoints").join(&agent).join(job_id);
    let mut out = std::collections::BTreeSet::new();
    for attempt in std::fs::read_dir(&job).expect("the job's checkpoints").flatten() {
        for c in std::fs::read_dir(attempt.path()).expect("an attempt").flatten() {
            let name = c.file_name().to_string_lossy().into_owned();
            if name.starts_with("epoch-") && name.contains("-step-") {
                out.insert(name);
            }
        }
    }
    out
}

/// Checkpoints by time: rank 0's clock asks for one through the step's
/// all-reduce and every rank writes it after the same step, so both agents
/// hold checkpoints inside epochs, at the same positions. (An epoch here is
/// 12,500 steps per rank: seconds, past the 1-second interval.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_by_time_is_written_by_every_rank_after_the_same_step() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 200_000).await;
    let dir = tempfile::tempdir().expect("dir");
    let procs = ProcCluster::start(2, dir.path(), 600).await;
    let timed = job(&procs, "timed")
        .epochs(3)
        .checkpoint(CheckpointPolicy {
            every_secs: 1,
            keep_last: 10_000,
            ..Default::default()
        })
        .build()
        .expect("job")
        .fit(&df)
        .await;
    timed.unwrap_or_else(|e| panic!("fit: {e}\n{}", procs.logs()));
    let (a, b) = (
        inside_epochs(dir.path(), 0, "timed"),
        inside_epochs(dir.path(), 1, "timed"),
    );
    assert!(!a.is_empty(), "checkpoints inside epochs 2 and 3, by time");
    assert!(
        a.iter().all(|c| !c.starts_with("epoch-0000")),
        "none inside the first epoch: {a:?}"
    );
    assert_eq!(a, b, "every rank wrote each after the same step");
}

/// The rule job on `procs` that may grow from 2 agents to 3, its events
/// sent to `tx`.
fn growing_job(
    procs: &ProcCluster,
    job_id: &str,
    epochs: u32,
    tx: tokio::sync::mpsc::Sender<TrainingEvent>,
) -> kindling::job::TrainingJob {
    rule_job()
        .local_mode(false)
        .rendezvous(procs.rendezvous_url.clone())
        .token(procs.token())
        .job_id(job_id)
        .epochs(epochs)
        .batch_size(8)
        .max_slots(3)
        .events(tx)
        .build()
        .expect("job")
}

/// Starts a third agent while the members `held` are stopped (SIGSTOP),
/// so that it registers before their epoch ends; returns its index and a
/// rendezvous client. The members stay stopped: [`thaw`] lets them go.
async fn newcomer_while_held(
    procs: &mut ProcCluster,
    dir: &std::path::Path,
    held: &[usize],
) -> (usize, kindling_schemas::rendezvous::RendezvousClient) {
    for &i in held {
        procs.freeze_agent(i, true);
    }
    let newcomer = procs.add_agent(dir).await;
    let rv = kindling_schemas::rendezvous::RendezvousClient::connect_with(
        &procs.rendezvous_url,
        Some(&procs.token()),
        &ChannelConfig::default(),
    )
    .await
    .expect("rendezvous");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while rv.list_agents().await.expect("agents").len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the newcomer never registered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (newcomer, rv)
}

fn thaw(procs: &ProcCluster, held: &[usize]) {
    for &i in held {
        procs.freeze_agent(i, false);
    }
}

/// The job grew by `agent-2`, to 3 ranks, taking shard 2 of the three
/// dealt onto two agents.
fn grew_by_agent_2(growth: Option<(String, u32, Vec<usize>)>, fed: &Fed, procs: &ProcCluster) {
    let (joined, world, moved) = growth.unwrap_or_else(|| panic!("the job grew\n{}", procs.logs()));
    assert_eq!(
        (joined.as_str(), world, moved.as_slice()),
        ("agent-2", 3, &[2][..])
    );
    assert_eq!(
        (fed["train"].len(), fed["eval"].len()),
        (3, 3),
        "three shards dealt onto two agents"
    );
}

/// Rows fed per shard, by split.
type Fed = std::collections::HashMap<&'static str, Vec<u64>>;

/// What a job's events said of its feed and its growth (who joined, the
/// gang's new size, the shards moved).
fn fed_and_grown(events: Vec<TrainingEvent>) -> (Fed, Option<(String, u32, Vec<usize>)>) {
    let (mut fed, mut growth) = (Fed::new(), None);
    for e in events {
        match e {
            TrainingEvent::Fed {
                split,
                rows_per_shard,
                ..
            } => {
                fed.insert(split, rows_per_shard);
            }
            TrainingEvent::Grown {
                joined,
                world_size,
                moved_shards,
            } => growth = Some((joined, world_size, moved_shards)),
            _ => {}
        }
    }
    (fed, growth)
}

/// Elastic growth: a job of 2 agents that may grow to 3; a third agent
/// starts after the job did (both members held with SIGSTOP until it has
/// registered, so it is there before the first epoch ends). At that
/// epoch's end the gang re-forms with 3 ranks: shard 2's rows move from
/// the agent holding two shards to the newcomer (no Spark query runs
/// again), every row on exactly one agent, and the last epochs train every
/// row once on 3 ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_that_joins_mid_job_takes_shards_at_an_epochs_end_and_the_last_epochs_run_on_three_ranks() {
    const EPOCHS: u32 = 4;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 12_000).await;
    let dir = tempfile::tempdir().expect("dir");
    // A long lease: the members are held stopped while the newcomer starts.
    let mut procs = ProcCluster::start(2, dir.path(), 60_000).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let grown = growing_job(&procs, "grown", EPOCHS, tx);
    let fit = {
        let df = df.clone();
        tokio::spawn(async move { grown.fit(&df).await })
    };
    let members = loop {
        if let TrainingEvent::Started { agents, .. } = rx.recv().await.expect("started") {
            break agents;
        }
    };
    let held: Vec<usize> = members
        .iter()
        .map(|u| procs.index_of(u).expect("member"))
        .collect();
    let (newcomer, rv) = newcomer_while_held(&mut procs, dir.path(), &held).await;
    thaw(&procs, &held);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    let (fed, growth) = fed_and_grown(events);
    let model = fit
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("fit grows: {e}\n{}", procs.logs()));
    assert_eq!(model.history().len(), EPOCHS as usize);
    grew_by_agent_2(growth, &fed, &procs);
    let (train, eval) = (&fed["train"], &fed["eval"]);
    let status = rv.status("grown").await.expect("status");
    assert_eq!(status.num_slots, 3, "{status:?}");
    // Who holds what: shards 0 and 2 were dealt to the first member, 1 to
    // the second; shard 2 is the newcomer's now, and on no one else.
    let holds = [vec![0], vec![1], vec![2]];
    let urls = [
        members[0].clone(),
        members[1].clone(),
        procs.agent_urls[newcomer].clone(),
    ];
    let every_row_once = vec![train.iter().sum::<u64>(); EPOCHS as usize];
    for (url, shards) in urls.iter().zip(&holds) {
        let s = ended(url, &procs, "grown").await;
        assert_eq!(s.state, AgentJobState::Succeeded, "{url}: {s:#?}");
        let sum = |rows: &Vec<u64>| shards.iter().map(|&i| rows[i]).sum::<u64>();
        assert_eq!((s.rows_train, s.rows_eval), (sum(train), sum(eval)), "{url}");
        assert_eq!(s.rows_trained_per_epoch, every_row_once, "{url}");
        // The gang re-formed after the first epoch: all three resumed from
        // its checkpoint and trained the last epochs together.
        assert_eq!(s.resumed_from_epoch, Some(1), "{url}: {s:#?}");
    }
    assert!(
        train[2] > 0 && eval[2] > 0,
        "the newcomer took rows: {train:?} {eval:?}"
    );
}

/// Growth of a detached job: submitted on 2 agents with `max_slots` 3
/// (three shards dealt onto them), both members held with SIGSTOP while a
/// third agent starts and a follower attaches (`JobHandle::wait`). At the
/// next epoch's end the follower moves shard 2's rows to the newcomer (no
/// Spark query runs again), every member keeps its rows on its disk again
/// — the giver without shard 2, the newcomer with it — and the last epochs
/// train every row once on 3 ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_detached_job_grows_by_an_agent_that_joins_while_a_follower_waits_and_its_copies_follow_the_move() {
    // The first epoch ends after the feed (submit's return) at the
    // earliest: epochs to spare for the growth at the next epoch's end.
    const EPOCHS: u32 = 5;
    const JOB: &str = "grown-detached";
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 12_000).await;
    let dir = tempfile::tempdir().expect("dir");
    // A long lease: the members are held stopped while the newcomer starts.
    let mut procs = ProcCluster::start(2, dir.path(), 60_000).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let job = growing_job(&procs, JOB, EPOCHS, tx);
    let handle = job
        .submit(&df)
        .await
        .unwrap_or_else(|e| panic!("submit: {e}\n{}", procs.logs()));
    let (newcomer, rv) = newcomer_while_held(&mut procs, dir.path(), &[0, 1]).await;
    let follower = tokio::spawn(async move { handle.wait().await });
    thaw(&procs, &[0, 1]);
    let last = follower
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("the detached job grows and succeeds: {e}\n{}", procs.logs()));
    assert_eq!(last.history.len(), EPOCHS as usize);
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let (fed, growth) = fed_and_grown(events);
    grew_by_agent_2(growth, &fed, &procs);
    let (train, eval) = (&fed["train"], &fed["eval"]);
    assert!(
        train[2] > 0 && eval[2] > 0,
        "the newcomer took rows: {train:?} {eval:?}"
    );
    assert_eq!(rv.status(JOB).await.expect("status").num_slots, 3);
    // Shards 0 and 2 were dealt to agent-0, 1 to agent-1; 2 is agent-2's now.
    let every_row_once = vec![train.iter().sum::<u64>(); EPOCHS as usize];
    for (i, shard) in [(0, 0usize), (1, 1), (newcomer, 2)] {
        let url = procs.agent_urls[i].clone();
        let s = ended(&url, &procs, JOB).await;
        assert_eq!(s.state, AgentJobState::Succeeded, "agent-{i}: {s:#?}");
        assert_eq!(
            (s.rows_train, s.rows_eval),
            (train[shard], eval[shard]),
            "agent-{i}"
        );
        assert_eq!(s.rows_trained_per_epoch, every_row_once, "agent-{i}");
        // Its copy on its disk holds the shard it holds now, and no other.
        let record = dir
            .path()
            .join(format!("agent-{i}/kept/agent-{i}/{JOB}/kept.json"));
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&record).expect("kept.json")).expect("json");
        for split in ["train", "eval"] {
            let producers: Vec<&String> = record[split]["producers"]
                .as_object()
                .expect("producers")
                .keys()
                .collect();
            assert_eq!(
                producers,
                [&format!("shard-{shard}")],
                "agent-{i}'s kept {split} rows"
            );
        }
    }
}
