//! The shape of a DaemonSet sized to the job: no spare agent. An agent
//! SIGKILLed mid-epoch comes back under its id on its node (as the
//! DaemonSet restarts its pod): `fit` waits for it, it takes its shard
//! again, and the job completes from the checkpoint with every epoch
//! training every row once.

use crate::common;

use kindling::job::TrainingEvent;
use kindling::{CheckpointPolicy, OptimizerSpec};
use kindling_example_agent::registry;
use kindling_schemas::action::AgentJobState;
use tokio::sync::mpsc;

use common::{Cluster, SERIAL, city_df, config, custom, job, spark, started_until_epoch_2};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_restarted_under_its_id_takes_its_place_when_no_spare_is_live() {
    let _serial = SERIAL.lock().await;
    let spark = spark().await;
    const ROWS: u64 = 12_000;
    const EPOCHS: u32 = 6;
    let df = city_df(&spark, ROWS as usize, 12, "INT").await;
    let mut cluster = Cluster::start(2).await;
    let (tx, mut rx) = mpsc::channel(1024);
    let job = cluster
        .job(job(custom(&config())))
        .models(registry())
        .num_slots(2)
        .batch_size(8)
        .epochs(EPOCHS)
        .optimizer(OptimizerSpec::adam(0.01))
        .checkpoint(CheckpointPolicy {
            every_epochs: 1,
            keep_last: 2,
            ..Default::default()
        })
        .seed(3)
        .events(tx)
        .build()
        .expect("job");
    let fit = tokio::spawn(async move { job.fit(&df).await });
    let (job_id, agents) = started_until_epoch_2(&mut rx).await;
    // Once its lease lapses the rendezvous lists only the survivor: no spare.
    let victim_id = cluster.sigkill_in_epoch_2(&agents[1], &job_id).await;
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
