//! A search's faults, with real processes SIGKILLed: an agent holding a
//! dataset shard lost mid-search is replaced as in `fit` (its shard fed
//! again, its trials resumed there); a search client killed frees the
//! dataset and its trials when its lease lapses. A real Spark Connect
//! server, real `kindling-rendezvous` and `kindling-agent` processes.

use std::time::{Duration, Instant};

use kindling::SparkSession;
use kindling::feed::AgentClient;
use kindling::job::{Search, SearchSpace, TrainingEvent, TrainingJobBuilder, TrialOutcome};
use kindling_schemas::action::{AgentJobState, AgentJobStatus};
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_tests::cluster::wait_for_job;
use kindling_tests::netns::{Proc, binary};
use kindling_tests::procs::ProcCluster;
use kindling_tests::spark::{rule_cli, rule_df, rule_job, spark_remote};
use tokio::sync::mpsc;

fn client(url: &str, cluster: &ProcCluster) -> AgentClient {
    AgentClient::connect_with(url, Some(&cluster.token()), &ChannelConfig::default()).expect("agent")
}

/// Polls `job` on `c` until `done` holds of its status (120 s at most).
async fn wait_for(
    c: &AgentClient,
    job: &str,
    what: &str,
    done: impl Fn(&AgentJobStatus) -> bool,
) -> AgentJobStatus {
    wait_for_job(c, job, what, Duration::from_secs(120), done).await
}

/// The rule job on `procs`' rendezvous as a remote client drives it, for
/// `job_id` and `epochs`, batch 8, its events to `events`.
fn cluster_job(
    procs: &ProcCluster,
    job_id: &str,
    epochs: u32,
    events: mpsc::Sender<TrainingEvent>,
) -> TrainingJobBuilder {
    rule_job()
        .local_mode(false)
        .rendezvous(procs.rendezvous_url.clone())
        .token(procs.token())
        .job_id(job_id)
        .epochs(epochs)
        .batch_size(8)
        .events(events)
}

/// Every trial of `result` finished, each after all its `epochs`.
fn every_trial_finished(result: &kindling::job::SearchResult, epochs: u32) {
    for t in &result.trials {
        assert_eq!(
            t.outcome,
            TrialOutcome::Finished,
            "trial {}: {:?}",
            t.trial,
            t.error
        );
        assert_eq!(t.history.len(), epochs as usize, "trial {}", t.trial);
    }
}

/// The dataset's agents' Flight URLs, by shard, from its `Started` event.
async fn dataset_agents(events: &mut mpsc::Receiver<TrainingEvent>) -> Vec<String> {
    loop {
        if let TrainingEvent::Started { agents, .. } = events.recv().await.expect("events") {
            return agents;
        }
    }
}

/// Three trials train at once on two of three agent processes; once trial
/// 0 trains its third epoch, one dataset agent is SIGKILLed. The dataset's
/// shard goes to the spare agent (fed again from the query), every trial
/// resumes there and finishes every epoch; the best model is a finished
/// trial's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_agent_mid_search_is_replaced_and_every_trial_finishes() {
    let dir = tempfile::tempdir().expect("dir");
    let mut procs = ProcCluster::start(3, dir.path(), 1000).await;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 16_000).await;
    let (tx, mut rx) = mpsc::channel(4096);
    let epochs = 12;
    let job = cluster_job(&procs, "srch-k", epochs, tx)
        .replacement_wait(Duration::from_secs(60))
        .build()
        .expect("job");
    let space = SearchSpace::parse(["lr=0.05|0.02|0.01"]).expect("space");
    let searching = tokio::spawn(async move { job.search(&df, &Search::new(space).parallel(3)).await });
    let agents = dataset_agents(&mut rx).await;
    let victim = procs.index_of(&agents[1]).expect("a dataset agent");
    wait_for(&client(&agents[1], &procs), "srch-k-t00", "epoch 3", |s| {
        s.epoch >= 3
    })
    .await;
    procs.kill_agent(victim);
    let result = tokio::time::timeout(Duration::from_secs(300), searching)
        .await
        .unwrap_or_else(|_| panic!("the search did not end:\n{}", procs.logs()))
        .expect("task")
        .unwrap_or_else(|e| panic!("search: {e}\n{}", procs.logs()));
    println!("{}", result.table());
    every_trial_finished(&result, epochs);
    let mut recovered = Vec::new();
    while let Ok(e) = rx.try_recv() {
        if let TrainingEvent::Recovering {
            lost, resent_shards, ..
        } = e
        {
            recovered.push((lost, resent_shards));
        }
    }
    let lost = format!("agent-{victim}");
    assert!(
        recovered
            .iter()
            .any(|(l, resent)| l.contains(&lost) && resent == &[1]),
        "the dataset's shard 1 was fed again: {recovered:?}"
    );
    assert!(result.best_model().is_some());
    // The spare (the only agent not in the first gang) held the dataset.
    let spare = (0..3)
        .find(|&i| !agents.contains(&procs.agent_urls[i]))
        .expect("a spare");
    let data = client(&procs.agent_urls[spare], &procs)
        .job_status("srch-k-data")
        .await
        .expect("status");
    assert_eq!(data.state, AgentJobState::Cancelled, "the search ended: {data:?}");
}

/// No spare and no replacement within the wait: when one of the dataset's
/// two agent processes is SIGKILLed mid-search, the survivor takes its
/// shard (fed again from the query) and the dataset shrinks to it; every
/// trial shrinks with it, resumes, and finishes every epoch on the rows of
/// both shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dataset_that_loses_an_agent_with_no_replacement_shrinks_and_its_trials_with_it() {
    let dir = tempfile::tempdir().expect("dir");
    let mut procs = ProcCluster::start(2, dir.path(), 1000).await;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let rows = 8_000;
    let df = rule_df(&spark, rows).await;
    let (tx, mut rx) = mpsc::channel(4096);
    let epochs = 10;
    let job = cluster_job(&procs, "srch-s", epochs, tx)
        .eval_fraction(0.0)
        .min_slots(1)
        .replacement_wait(Duration::from_secs(2))
        .build()
        .expect("job");
    let space = SearchSpace::parse(["lr=0.05|0.02"]).expect("space");
    let searching = tokio::spawn(async move { job.search(&df, &Search::new(space).parallel(2)).await });
    let agents = dataset_agents(&mut rx).await;
    let survivor = client(&agents[0], &procs);
    wait_for(&survivor, "srch-s-t00", "epoch 2", |s| s.epoch >= 2).await;
    procs.kill_agent(procs.index_of(&agents[1]).expect("an agent"));
    let result = tokio::time::timeout(Duration::from_secs(300), searching)
        .await
        .unwrap_or_else(|_| panic!("the search did not end:\n{}", procs.logs()))
        .expect("task")
        .unwrap_or_else(|e| panic!("search: {e}\n{}", procs.logs()));
    println!("{}", result.table());
    let mut shrunk = false;
    while let Ok(e) = rx.try_recv() {
        shrunk |= matches!(e, TrainingEvent::Shrunk { world_size: 1, .. });
    }
    assert!(shrunk, "the dataset shrank to the survivor");
    every_trial_finished(&result, epochs);
    for t in &result.trials {
        // The last epoch trained every row, all of them on the survivor.
        assert_eq!(
            t.history.last().expect("an epoch").rows,
            rows as u64,
            "trial {}",
            t.trial
        );
    }
}

/// A `kindling tune` process searching two trials over a dataset on
/// `procs`' two agents, with a client lease of `lease` seconds.
struct Tuning {
    tune: Proc,
    rv: RendezvousClient,
    data: String,
    trials: Vec<String>,
    agents: Vec<AgentClient>,
}

impl Tuning {
    /// Starts `kindling tune` and waits until its dataset and both trials
    /// run, each agent holds rows of the dataset and every trial trained
    /// an epoch on every agent.
    async fn start(procs: &ProcCluster, dir: &std::path::Path, lease: f64) -> Tuning {
        let mut command = std::process::Command::new(binary("kindling", "KINDLING_CLI_BIN"));
        command
            .args(rule_cli("tune", 20_000, 2))
            .args(["--epochs", "500", "--batch-size", "8", "--eval-fraction", "0.2"])
            .args(["--rendezvous", &procs.rendezvous_url])
            .arg("--token-file")
            .arg(&procs.token_file)
            .args(["--client-lease-secs", &lease.to_string()])
            .args(["--space", "lr=0.01|0.02", "--scheduler", "all", "--parallel", "2"])
            .arg("-o")
            .arg(dir.join("model"));
        let mut tune = Proc::spawn("tune", command, String::new(), dir);
        let rv = RendezvousClient::connect(&procs.rendezvous_url, Some(&procs.token()))
            .await
            .expect("rendezvous");
        let deadline = Instant::now() + Duration::from_secs(120);
        let (data, trials) = loop {
            let jobs = rv.list_jobs().await.expect("jobs");
            let running: Vec<String> = jobs
                .iter()
                .filter(|j| j.state == kindling_schemas::rendezvous::JobState::Running)
                .map(|j| j.job_id.clone())
                .collect();
            let data = running.iter().find(|j| j.ends_with("-data")).cloned();
            let trials: Vec<String> = running.iter().filter(|j| j.contains("-t0")).cloned().collect();
            if let (Some(data), 2) = (data, trials.len()) {
                break (data, trials);
            }
            assert!(tune.try_wait().is_none(), "tune ended:\n{}", tune.logs());
            assert!(Instant::now() < deadline, "no search running:\n{}", tune.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let agents: Vec<AgentClient> = procs.agent_urls.iter().map(|u| client(u, procs)).collect();
        for c in &agents {
            for t in &trials {
                wait_for(c, t, "an epoch", |s| s.epoch >= 1).await;
            }
            let s = c.job_status(&data).await.expect("dataset");
            assert!(
                s.rows_train > 0 && s.cache_bytes_memory > 0,
                "the dataset is held: {s:?}"
            );
        }
        Tuning {
            tune,
            rv,
            data,
            trials,
            agents,
        }
    }

    /// Runs `waits`; if one fails, panics with its message and every
    /// process's log.
    async fn or_logs(&self, procs: &ProcCluster, waits: impl std::future::Future<Output = ()>) {
        if let Err(panic) = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(waits)).await {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "a wait failed".into());
            panic!("{why}\n{}\n{}", procs.logs(), self.tune.logs());
        }
    }
}

/// `kindling tune` as a process, SIGKILLed once its trials train: the
/// rendezvous cancels the dataset and the trials when the client's lease
/// lapses, and every agent drops the dataset's rows (no bytes cached) and
/// cancels the trials reading them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_search_client_frees_the_dataset_when_its_lease_lapses() {
    let dir = tempfile::tempdir().expect("dir");
    let procs = ProcCluster::start(2, dir.path(), 1000).await;
    let mut tuning = Tuning::start(&procs, dir.path(), 3.0).await;
    tuning.tune.sigkill();
    let killed = Instant::now();
    let Tuning {
        data, trials, agents, ..
    } = &tuning;
    tuning
        .or_logs(&procs, async {
            for c in agents {
                wait_for(c, data, "the dataset dropped", |s| {
                    s.state == AgentJobState::Cancelled
                        && s.cache_bytes_memory == 0
                        && s.cache_bytes_disk == 0
                })
                .await;
                // Cancelled by their dataset (the rows went) or by their
                // own lapsed lease, whichever came first: never failed on
                // a split emptied under them.
                for t in trials {
                    wait_for(c, t, "the trial cancelled", |s| {
                        s.state == AgentJobState::Cancelled
                    })
                    .await;
                }
            }
        })
        .await;
    // The lease, then the agents' next word with the rendezvous (their
    // lease): seconds on an idle machine, printed, not asserted (a busy one
    // delays the agents' heartbeats). Nothing but the lapsed lease cancels a
    // search of 500 epochs at batch 8.
    eprintln!(
        "the dataset was freed {:?} after the client died",
        killed.elapsed()
    );
    let status = tuning.rv.status(data).await.expect("status");
    assert_eq!(status.state, kindling_schemas::rendezvous::JobState::Cancelled);
    let reason = status.cancel_reason.unwrap_or_default();
    assert!(reason.contains("lease lapsed"), "cancelled for: {reason}");
}

/// A dataset cancelled on one agent cancels the trials reading its rows
/// there before the rows go, naming the dataset: none trains on, or fails
/// on, a split emptied under it. The client is SIGKILLed first and its
/// lease is long, so nothing else ends the trials.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dataset_cancelled_on_an_agent_cancels_the_trials_reading_its_rows_there() {
    let dir = tempfile::tempdir().expect("dir");
    let procs = ProcCluster::start(2, dir.path(), 1000).await;
    let mut tuning = Tuning::start(&procs, dir.path(), 600.0).await;
    tuning.tune.sigkill();
    let Tuning {
        data, trials, agents, ..
    } = &tuning;
    let dropped = agents[0].cancel_job(data, "an operator's cancel").await;
    dropped.expect("cancel the dataset");
    tuning
        .or_logs(&procs, async {
            for t in trials {
                let s = wait_for(&agents[0], t, "the trial cancelled", |s| {
                    s.state == AgentJobState::Cancelled
                })
                .await;
                let error = s.error.unwrap_or_default();
                assert!(
                    error.contains(&format!("its dataset `{data}` ended")),
                    "{t}: {error}"
                );
            }
        })
        .await;
    let s = agents[0].job_status(data).await.expect("dataset");
    assert_eq!(
        (s.cache_bytes_memory, s.cache_bytes_disk, s.rows_train),
        (0, 0, 0),
        "{s:?}"
    );
}
