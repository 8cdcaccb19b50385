//! Elastic shrink: three agent processes, no spare, one SIGKILLed mid-epoch
//! and never restarted. With `min_slots = 2` the two survivors take over the
//! lost shard (its rows sent to them again) and the job completes on two
//! ranks, every epoch training every row once; with `min_slots = 3` the job
//! fails after the replacement wait naming the lost agent.

use crate::common;

use std::time::{Duration, Instant};

use kindling::job::{JobError, TrainedModel, TrainingEvent};
use kindling::{CheckpointPolicy, OptimizerSpec};
use kindling_example_agent::registry;
use kindling_schemas::action::AgentJobState;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use common::{Cluster, SERIAL, city_df, config, custom, job, spark, started_until_epoch_2};

const ROWS: u64 = 12_000;
const EPOCHS: u32 = 5;

/// What the kill left: the running `fit`, its events, the job and the lost agent.
struct Killed {
    fit: JoinHandle<Result<TrainedModel, JobError>>,
    events: mpsc::Receiver<TrainingEvent>,
    job_id: String,
    agents: Vec<String>,
    victim_id: String,
}

/// Starts a 3-slot job on the cluster's 3 agents with `min_slots`, waits
/// until the second agent trains epoch 2, SIGKILLs it and waits until the
/// rendezvous dropped it (from then on no spare is live).
async fn start_and_kill_one(cluster: &mut Cluster, min_slots: u32, eval_fraction: f64) -> Killed {
    let spark = spark().await;
    let df = city_df(&spark, ROWS as usize, 12, "INT").await;
    let (tx, mut events) = mpsc::channel(4096);
    let job = cluster
        .job(job(custom(&config())))
        .models(registry())
        .num_slots(3)
        .min_slots(min_slots)
        .replacement_wait(Duration::from_secs(2))
        .eval_fraction(eval_fraction)
        .batch_size(8)
        .epochs(EPOCHS)
        .optimizer(OptimizerSpec::adam(0.01))
        .checkpoint(CheckpointPolicy {
            every_epochs: 1,
            keep_last: 2,
            ..Default::default()
        })
        .seed(5)
        .events(tx)
        .build()
        .expect("job");
    let fit = tokio::spawn(async move { job.fit(&df).await });
    let (job_id, agents) = started_until_epoch_2(&mut events).await;
    let victim_id = cluster.sigkill_in_epoch_2(&agents[1], &job_id).await;
    Killed {
        fit,
        events,
        job_id,
        agents,
        victim_id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_min_slots_2_the_survivors_take_over_the_lost_shard_and_finish() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3).await;
    let mut k = start_and_kill_one(&mut cluster, 2, 0.2).await;
    let mut shrunk = Vec::new();
    let mut recoveries = Vec::new();
    while let Some(e) = k.events.recv().await {
        match e {
            TrainingEvent::Shrunk { lost, world_size } => shrunk.push((lost, world_size)),
            TrainingEvent::Recovering { resent_shards, .. } => recoveries.push(resent_shards),
            _ => {}
        }
    }
    let model = k
        .fit
        .await
        .expect("fit task")
        .unwrap_or_else(|e| panic!("the survivors did not finish the job: {e}\n{}", cluster.logs()));
    assert_eq!(shrunk, [(vec![k.victim_id.clone()], 2)], "one shrink to 2 ranks");
    assert_eq!(recoveries, [vec![1]], "the lost shard was sent again once");
    assert_eq!(model.history().len(), EPOCHS as usize);

    let mut survivors = cluster.by_url(&k.agents[0]).jobs().await;
    survivors.extend(cluster.by_url(&k.agents[2]).jobs().await);
    let survivors: Vec<_> = survivors.into_iter().filter(|j| j.job_id == k.job_id).collect();
    assert_eq!(survivors.len(), 2, "{survivors:#?}");
    // Between them the survivors hold every row once: the train split they
    // trained and the eval split they scored.
    let train: u64 = survivors.iter().map(|j| j.rows_train).sum();
    let eval: u64 = survivors.iter().map(|j| j.rows_eval).sum();
    assert_eq!(train + eval, ROWS, "{survivors:#?}");
    assert!(eval > 0, "{survivors:#?}");
    for j in &survivors {
        assert_eq!(j.state, AgentJobState::Succeeded, "{j:#?}");
        assert_eq!(j.world_size, 2, "the gang shrank: {j:#?}");
        assert!(j.attempt >= 2, "a new attempt formed: {j:#?}");
        assert_eq!(
            j.rows_trained_per_epoch,
            vec![train; EPOCHS as usize],
            "{}: every train row once per epoch, before and after the shrink",
            j.agent_id
        );
    }
    // The first survivor took the lost shard: it holds two shards' rows.
    assert!(
        survivors[0].rows_train > survivors[1].rows_train,
        "{survivors:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_min_slots_3_the_job_fails_after_the_wait_naming_the_lost_agent() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3).await;
    let mut k = start_and_kill_one(&mut cluster, 3, 0.0).await;
    while k.events.recv().await.is_some() {}
    let err = k
        .fit
        .await
        .expect("fit task")
        .expect_err("too few agents survive");
    assert!(
        matches!(
            &err,
            JobError::NoReplacement { lost, survivors: 2, min_slots: 3, .. } if *lost == k.victim_id
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&k.victim_id) && text.contains("min_slots"),
        "{text}"
    );
    // fit cancelled the job on the survivors as it gave up.
    for url in [&k.agents[0], &k.agents[2]] {
        let agent = cluster.by_url(url);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = agent.client().job_status(&k.job_id).await.expect("status");
            if s.state == AgentJobState::Cancelled {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} still has the job: {s:#?}",
                agent.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
