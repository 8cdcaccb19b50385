//! The shape of a DaemonSet sized to the job: no spare agent. An agent
//! SIGKILLed mid-epoch comes back under its id on its node (as the
//! DaemonSet restarts its pod): `fit` waits for it, it takes its shard
//! again, and the job completes from the checkpoint with every epoch
//! training every row once.

mod common;

use std::time::{Duration, Instant};

use kindling::job::{TrainingEvent, TrainingJob};
use kindling_example_agent::{MODEL, WideAndDeepConfig, registry};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::auth::Token;
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_schemas::spec::{CheckpointPolicy, ModelSpec, OptimizerSpec, Task};
use tokio::sync::mpsc;

use common::{CITIES, Cluster, SERIAL, TOKEN, city_df, spark};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_restarted_under_its_id_takes_its_place_when_no_spare_is_live() {
    let _serial = SERIAL.lock().await;
    let spark = spark().await;
    const ROWS: u64 = 12_000;
    const EPOCHS: u32 = 6;
    let df = city_df(&spark, ROWS as usize, 12, "INT").await;
    let mut cluster = Cluster::start(2).await;
    let config = WideAndDeepConfig::new(vec!["city".into()])
        .with_embedding(4)
        .with_hidden(8);
    let (tx, mut rx) = mpsc::channel(1024);
    let job = cluster
        .job(
            TrainingJob::builder()
                .model(ModelSpec::custom(MODEL, &config).expect("config"))
                .task(Task::Classification { num_classes: 2 })
                .features(["x1", "city"])
                .categorical("city", CITIES)
                .label("y"),
        )
        .models(registry())
        .num_slots(2)
        .batch_size(8)
        .epochs(EPOCHS)
        .optimizer(OptimizerSpec::adam(0.01))
        .checkpoint(CheckpointPolicy {
            every_epochs: 1,
            keep_last: 2,
        })
        .seed(3)
        .events(tx)
        .build()
        .expect("job");
    let fit = tokio::spawn(async move { job.fit(&df).await });
    let mut started = None;
    while let Some(e) = rx.recv().await {
        match e {
            TrainingEvent::Started { job_id, agents } => started = Some((job_id, agents)),
            TrainingEvent::Step { epoch, .. } if epoch >= 2 => break,
            _ => {}
        }
    }
    let (job_id, agents) = started.expect("the job started");
    let victim = cluster.by_url(&agents[1]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = victim.client().job_status(&job_id).await.expect("status");
        if s.state == AgentJobState::Training && s.epoch >= 2 && s.step > 0 {
            break;
        }
        assert!(!s.state.is_terminal(), "the job ended before the kill: {s:#?}");
        assert!(Instant::now() < deadline, "not training epoch 2: {s:#?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let victim_id = victim.name.clone();
    victim.sigkill();

    // Once its lease lapses the rendezvous lists only the survivor: no spare.
    let rv = RendezvousClient::connect(cluster.rendezvous.url(), Some(&Token::new(TOKEN)))
        .await
        .expect("rendezvous");
    while rv
        .list_agents()
        .await
        .expect("agents")
        .iter()
        .any(|a| a.agent_id == victim_id)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same node restarts its agent: same id, same work directory.
    let restarted_url = cluster.restart(&agents[1]).await;

    let mut recoveries = Vec::new();
    while let Some(e) = rx.recv().await {
        if let TrainingEvent::Recovering { resent_shards, .. } = e {
            recoveries.push(resent_shards);
        }
    }
    let model = fit.await.expect("fit task").unwrap_or_else(|e| {
        panic!(
            "fit did not wait for the restarted agent: {e}\n{}",
            cluster.logs()
        )
    });
    assert_eq!(recoveries, [vec![1]], "the lost shard was re-sent once");
    assert_eq!(model.history().len(), EPOCHS as usize);
    let restarted = cluster.by_url(&restarted_url);
    assert_eq!(restarted.name, victim_id, "the restarted agent has its old id");
    let mut finished = restarted.jobs().await;
    finished.extend(cluster.by_url(&agents[0]).jobs().await);
    let finished: Vec<_> = finished.into_iter().filter(|j| j.job_id == job_id).collect();
    assert_eq!(finished.len(), 2, "{finished:#?}");
    for j in &finished {
        assert_eq!(j.state, AgentJobState::Succeeded, "{j:#?}");
        assert!(j.attempt >= 2, "a new attempt formed: {j:#?}");
        assert_eq!(
            j.rows_trained_per_epoch,
            vec![ROWS; EPOCHS as usize],
            "{}: every row once per epoch",
            j.agent_id
        );
    }
}
