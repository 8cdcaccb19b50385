//! A lost agent with no spare live (the shape of a DaemonSet sized to the
//! job): `fit` waits for a replacement to register and resumes, or fails
//! after the wait naming the lost agent. A real Spark Connect server, agents
//! and rendezvous on loopback, driven as a cluster (no local-mode spares).

use std::sync::Arc;
use std::time::Duration;

use kindling::SparkSession;
use kindling::job::{ExecutorPush, Feed, JobError, TrainingEvent, TrainingJobBuilder};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling_schemas::action::{Action, AgentJobState, EventLevel, JobList};
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};
use tokio::sync::mpsc::Receiver;

async fn two_agents() -> (Arc<LocalCluster>, tempfile::TempDir) {
    agents(2).await
}

async fn agents(n: usize) -> (Arc<LocalCluster>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LocalClusterConfig::new(dir.path());
    config.lease = Duration::from_millis(600);
    let cluster = LocalCluster::start(n, config).await.expect("cluster");
    (Arc::new(cluster), dir)
}

/// The rule job on the cluster's rendezvous, as a remote client drives it:
/// nothing starts agents for it.
fn cluster_job(cluster: &LocalCluster) -> TrainingJobBuilder {
    let mut job = rule_job()
        .local_mode(false)
        .rendezvous(cluster.rendezvous_url())
        .epochs(5)
        .batch_size(16)
        .eval_fraction(0.0);
    if let Some(t) = cluster.token() {
        job = job.token(t.clone());
    }
    job
}

/// Waits for epoch 2 to be under way, kills the job's second agent and
/// returns its id, once the rendezvous has dropped it (its lease lapsed):
/// from then on no spare is live.
async fn kill_second_agent_in_epoch_2(cluster: &LocalCluster, rx: &mut Receiver<TrainingEvent>) -> String {
    let mut victim = None;
    while let Some(e) = rx.recv().await {
        match e {
            TrainingEvent::Started { agents, .. } => victim = Some(agents[1].clone()),
            TrainingEvent::Step { epoch, .. } if epoch >= 2 => break,
            _ => {}
        }
    }
    let victim = victim.expect("started");
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rendezvous");
    let id = rv
        .list_agents()
        .await
        .expect("agents")
        .into_iter()
        .find(|a| a.flight_address == victim)
        .expect("victim registered")
        .agent_id;
    cluster.kill_agent(cluster.index_of(&victim).expect("victim index"));
    while rv
        .list_agents()
        .await
        .expect("agents")
        .iter()
        .any(|a| a.agent_id == id)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_agent_without_a_spare_is_replaced_by_one_that_registers_later() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 20_000).await;
    let (cluster, _dir) = two_agents().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let job = cluster_job(&cluster).events(tx).build().expect("job");
    let fit = {
        let df = df.clone();
        tokio::spawn(async move { job.fit(&df).await })
    };
    let victim_id = kill_second_agent_in_epoch_2(&cluster, &mut rx).await;
    // The only live agent is the survivor: the client is waiting now. A new
    // agent registers (as a DaemonSet's restarted pod would).
    let late = cluster.add_agent().await.expect("late agent");
    let late_url = cluster.agent_url(late).expect("late url");
    let mut recovered = false;
    let mut agent_errors = Vec::new();
    while let Some(e) = rx.recv().await {
        match &e {
            TrainingEvent::Recovering { resent_shards, .. } => {
                assert_eq!(resent_shards, &vec![1]);
                recovered = true;
            }
            TrainingEvent::AgentLog { job_id, event } if event.level == EventLevel::Error => {
                agent_errors.push((job_id.clone(), event.clone()));
            }
            _ => {}
        }
    }
    let model = fit.await.expect("task").expect("fit waits for the replacement");
    assert!(recovered, "the client re-sent the lost shard");
    // The survivor's error (its ring lost the killed peer) reached the
    // client that started the job, with job, rank and attempt.
    let (job_id, error) = agent_errors
        .iter()
        .find(|(_, e)| e.attempt == 1 && e.message.starts_with("attempt 1 failed"))
        .unwrap_or_else(|| panic!("the survivor's error reached the client: {agent_errors:?}"));
    assert_eq!(job_id, model.job_id());
    assert_eq!(error.rank, Some(0), "the survivor was rank 0: {error:?}");
    assert_ne!(error.agent_id, victim_id);
    let line = kindling::job::agent_log_line(job_id, error);
    assert!(
        line.starts_with(&format!(
            "ERROR agent {} (job {job_id}, rank 0, attempt 1): attempt 1 failed",
            error.agent_id
        )),
        "{line}"
    );
    assert_eq!(model.history().len(), 5);
    let rows = df.count().await.expect("count") as u64;
    let late_client = kindling::feed::AgentClient::connect(&late_url, cluster.token()).expect("client");
    let jobs: JobList = late_client.action(&Action::ListJobs).await.expect("list");
    let done = jobs
        .jobs
        .iter()
        .find(|j| j.state == AgentJobState::Succeeded)
        .expect("the late agent trained the job to the end");
    assert_eq!(
        done.rows_trained_per_epoch,
        vec![rows; 5],
        "every epoch trained every row once"
    );
    Arc::try_unwrap(cluster).expect("sole owner").shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_replacement_the_job_fails_after_the_wait_naming_the_lost_agent() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 20_000).await;
    let (cluster, _dir) = two_agents().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let job = cluster_job(&cluster)
        .replacement_wait(Duration::from_secs(1))
        .events(tx)
        .build()
        .expect("job");
    let fit = {
        let df = df.clone();
        tokio::spawn(async move { job.fit(&df).await })
    };
    let lost = kill_second_agent_in_epoch_2(&cluster, &mut rx).await;
    while rx.recv().await.is_some() {}
    let err = fit.await.expect("task").expect_err("no replacement");
    assert!(
        matches!(&err, JobError::NoReplacement { lost: l, live: 0, .. } if *l == lost),
        "{err}"
    );
    assert!(err.to_string().contains(&lost), "{err}");
    Arc::try_unwrap(cluster).expect("sole owner").shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_executor_push_and_min_slots_2_the_survivors_take_over_the_pushed_partitions() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 20_000).await;
    let (cluster, _dir) = agents(3).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let push = ExecutorPush::new().node_local(false).token_in_plan(true);
    let job = cluster_job(&cluster)
        .num_slots(3)
        .min_slots(2)
        .replacement_wait(Duration::from_secs(1))
        .feed(Feed::ExecutorPush(push))
        .events(tx)
        .build()
        .expect("job");
    let fit = {
        let df = df.clone();
        tokio::spawn(async move { job.fit(&df).await })
    };
    let lost = kill_second_agent_in_epoch_2(&cluster, &mut rx).await;
    let (mut shrunk, mut fed) = (Vec::new(), Vec::new());
    while let Some(e) = rx.recv().await {
        match e {
            TrainingEvent::Shrunk { lost, world_size } => shrunk.push((lost, world_size)),
            TrainingEvent::Fed { partitions, .. } => fed.push(partitions),
            _ => {}
        }
    }
    let model = fit.await.expect("task").expect("the survivors finish the job");
    assert_eq!(shrunk, [(vec![lost], 2)]);
    assert_eq!(model.history().len(), 5);
    // After the kill (the first push was read before it): the re-push of only
    // the lost shard's partitions, now held by a survivor.
    assert_eq!(fed.len(), 1, "{fed:#?}");
    let resent = &fed[0];
    assert!(
        !resent.is_empty(),
        "the lost shard's partitions were pushed again"
    );
    assert!(
        resent.iter().all(|p| p.shard == Some(1) && p.partition % 3 == 1),
        "{resent:#?}"
    );
    let rows = df.count().await.expect("count") as u64;
    let mut survivors = Vec::new();
    for i in 0..3 {
        let Some(url) = cluster.agent_url(i) else {
            continue; // the killed agent
        };
        let client = kindling::feed::AgentClient::connect(&url, cluster.token()).expect("client");
        let jobs: JobList = client.action(&Action::ListJobs).await.expect("list");
        survivors.extend(jobs.jobs);
    }
    assert_eq!(survivors.len(), 2, "{survivors:#?}");
    assert_eq!(survivors.iter().map(|j| j.rows_train).sum::<u64>(), rows);
    for j in &survivors {
        assert_eq!((j.state, j.world_size), (AgentJobState::Succeeded, 2), "{j:#?}");
        assert_eq!(
            j.rows_trained_per_epoch,
            vec![rows; 5],
            "every row once per epoch: {j:#?}"
        );
    }
    Arc::try_unwrap(cluster).expect("sole owner").shutdown().await;
}
