//! Searching: a Spark query fed once into a dataset on the agents, and
//! many trials — ordinary jobs with their own options — training on it,
//! weak ones stopped by ASHA at rungs; a trial equal to the same job
//! trained alone; a bad space refused before anything is fed. A real
//! Spark Connect server, real agents and a real rendezvous on loopback.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type};
use kindling::SparkSession;
use kindling::job::{Search, SearchSpace, TrainedModel, TrialOutcome};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_tests::cluster::{agent_client, cluster, status, wait_for_job};
use kindling_tests::events::fed_events;
use kindling_tests::spark::{PrivateSpark, rule_df, rule_job, rule_sql, spark_remote, spark_work};
use tokio::sync::mpsc;

/// How long a test waits for an agent to show a job's state.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The share of `batch`'s rows whose label `y` the model predicts.
fn accuracy_on(model: &TrainedModel, batch: &RecordBatch) -> f64 {
    let features = batch.project(&[0, 1]).expect("features");
    let predicted = model.predict_batch(&features).expect("predict");
    let predicted = predicted
        .column_by_name("prediction")
        .expect("prediction")
        .as_primitive::<Int64Type>();
    let labels = batch.column_by_name("y").expect("y").as_primitive::<Int32Type>();
    let right = (0..batch.num_rows())
        .filter(|&i| predicted.value(i) == labels.value(i) as i64)
        .count();
    right as f64 / batch.num_rows() as f64
}

/// Eight trials of learning rates, ASHA with η = 2 over 4 epochs (rungs 1
/// and 2): the query is fed once (one train and one eval feed, every row
/// once), every stopped trial stopped at a rung with its history cut
/// there, the finished ones trained all 4 epochs, the best is the best
/// finished trial and its model predicts the rule; afterwards the dataset
/// is gone from every agent (its job cancelled, no bytes cached) and no
/// trial runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_trials_with_asha_train_on_one_feed_and_the_best_model_predicts() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let rows = 4000u64;
    let df = rule_df(&spark, rows as usize).await;
    let (cluster, _dir) = cluster(2).await;
    let (tx, mut rx) = mpsc::channel(4096);
    let job = rule_job()
        .job_id("srch-a")
        .epochs(4)
        .events(tx)
        .build()
        .expect("job");
    let space = SearchSpace::parse(["lr=0.1|0.05|0.03|0.01|0.003|0.001|0.0003|0.0001"]).expect("space");
    let search = Search::new(space).asha(1, 2).parallel(3);
    let result = job.search_on(&cluster, &df, &search).await.expect("search");
    println!("{}", result.table());

    let fed = fed_events(&mut rx);
    let splits: Vec<&str> = fed.iter().map(|f| f.split).collect();
    assert_eq!(splits, ["eval", "train"], "one feed of each split: {fed:?}");
    let fed_rows: u64 = fed.iter().flat_map(|f| f.rows_per_shard.iter()).sum();
    assert_eq!(fed_rows, rows, "every row fed once");

    assert_eq!(result.rungs, [1, 2]);
    assert_eq!(result.trials.len(), 8);
    let mut stopped = 0;
    for t in &result.trials {
        match t.outcome {
            TrialOutcome::Stopped { at_epoch } => {
                stopped += 1;
                assert!(
                    result.rungs.contains(&at_epoch),
                    "trial {} stopped at {at_epoch}",
                    t.trial
                );
                assert_eq!(t.history.len(), at_epoch as usize);
                assert!(t.model.is_none());
            }
            TrialOutcome::Finished => {
                assert_eq!(t.history.len(), 4, "trial {}", t.trial);
                assert!(t.model.is_some());
            }
            TrialOutcome::Failed => panic!("trial {} failed: {:?}", t.trial, t.error),
        }
        assert_eq!(t.job_id, format!("srch-a-t{:02}", t.trial));
    }
    assert!(stopped >= 1, "ASHA stopped no trial:\n{}", result.table());
    let best = result.best_trial().expect("a finished trial");
    let best_loss = best.best.expect("a metric").0;
    for t in result
        .trials
        .iter()
        .filter(|t| t.outcome == TrialOutcome::Finished)
    {
        assert!(
            best_loss <= t.best.expect("metric").0,
            "trial {} beats the best",
            t.trial
        );
    }
    let model = result.best_model().expect("the best model");
    let accuracy = accuracy_on(model, &kindling_fixtures::rule_batch(2000, 99));
    assert!(accuracy > 0.9, "the best trial's model predicts {accuracy}");

    // The dataset is gone from every agent, and no trial runs.
    for i in 0..2 {
        let c = agent_client(&cluster, i);
        let data = status(&c, "srch-a-data").await;
        assert_eq!(data.state, AgentJobState::Cancelled, "agent {i}: {data:?}");
        assert_eq!((data.cache_bytes_memory, data.cache_bytes_disk), (0, 0));
    }
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rendezvous");
    for j in rv.list_jobs().await.expect("jobs") {
        assert!(j.state.is_terminal(), "{} still {:?}", j.job_id, j.state);
    }
}

/// Spark's own account: a search of eight trials runs exactly the Spark
/// jobs one `fit` of the same query runs (the query once), and the rows
/// reach the agents once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_search_of_eight_trials_runs_the_spark_jobs_of_one_fit() {
    let ui = kindling_tests::netns::free_port("127.0.0.1");
    let spark = PrivateSpark::start_with("local[2]", &[("KINDLING_SPARK_UI_PORT", &ui.to_string())]);
    let session = SparkSession::connect(&spark.remote()).await.expect("spark");
    let df = rule_df(&session, 4000).await;
    let job = rule_job().epochs(2).build().expect("job");
    let before = spark_work(ui).await;
    job.fit(&df).await.expect("fit");
    let fit = spark_work(ui).await - before;
    let (tx, mut rx) = mpsc::channel(4096);
    let searching = rule_job().epochs(2).events(tx).build().expect("job");
    let space = SearchSpace::parse(["lr=0.1|0.05|0.03|0.01", "batch_size=32|64"]).expect("space");
    let before = spark_work(ui).await;
    let result = searching
        .search(&df, &Search::new(space).parallel(4))
        .await
        .expect("search");
    let search = spark_work(ui).await - before;
    assert_eq!(result.trials.len(), 8);
    assert!(result.trials.iter().all(|t| t.outcome == TrialOutcome::Finished));
    assert!(fit.jobs > 0);
    assert_eq!(
        search.jobs, fit.jobs,
        "Spark jobs: the search {search:?}, one fit {fit:?}"
    );
    let fed = fed_events(&mut rx);
    let fed_rows: u64 = fed.iter().flat_map(|f| f.rows_per_shard.iter()).sum();
    assert_eq!((fed.len(), fed_rows), (2, 4000), "{fed:?}");
}

/// A trial trains exactly the weights the same job trains alone with
/// `fit` on the same query: the same rows in the same shards, the same seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trial_trains_the_same_weights_as_the_same_job_fit_alone() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 3000).await;
    let alone = rule_job()
        .epochs(2)
        .optimizer(kindling::OptimizerSpec::adam(0.01))
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    let space = SearchSpace::parse(["lr=0.01|0.05"]).expect("space");
    let result = rule_job()
        .epochs(2)
        .build()
        .expect("job")
        .search(&df, &Search::new(space))
        .await
        .expect("search");
    let trial = result.trials[0].model.as_ref().expect("trial 0 finished");
    assert_eq!(trial.spec().optimizer, alone.spec().optimizer);
    assert_eq!(
        trial.weights().expect("weights"),
        alone.weights().expect("weights"),
        "trial 0 and the job trained alone differ"
    );
    assert_eq!(trial.history().len(), 2);
    let other = result.trials[1].model.as_ref().expect("trial 1 finished");
    assert_ne!(
        other.weights().expect("weights"),
        alone.weights().expect("weights")
    );
}

/// A space that cannot work is refused before anything is fed: the error
/// names the option, and no job was created at the rendezvous.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_space_is_refused_naming_the_option_before_anything_is_fed() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 100).await;
    let (cluster, _dir) = cluster(2).await;
    let job = rule_job().build().expect("job");
    for (forms, says) in [
        (&["lr=log:1e-1..1e-4"][..], "`lr`: an empty range"),
        (&["learnin_rate=0.1|0.2"][..], "unknown option `learnin_rate`"),
        (&["batch_size=64|0"][..], "batch_size"),
        (&["label=a|b"][..], "`label` cannot vary"),
    ] {
        let space = SearchSpace::parse(forms.iter().copied()).expect("parses");
        let err = job
            .search_on(&cluster, &df, &Search::new(space))
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(says), "{forms:?}: {err}");
    }
    let err = job
        .search_on(
            &cluster,
            &df,
            &Search::new(SearchSpace::new().choice("lr", [0.1])).metric(kindling::Metric::EvalAccuracy),
        )
        .await
        .map(|_| ());
    assert!(err.is_ok(), "a good space runs: {err:?}");
    let rv = RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
        .await
        .expect("rendezvous");
    let jobs: Vec<String> = rv
        .list_jobs()
        .await
        .expect("jobs")
        .into_iter()
        .map(|j| j.job_id)
        .collect();
    assert_eq!(
        jobs.len(),
        2,
        "only the good search's dataset and trial were created: {jobs:?}"
    );
}

/// `kindling tune --help` documents the space's syntax.
#[test]
fn kindling_tune_help_documents_the_space() {
    let out = std::process::Command::new(kindling_tests::netns::binary("kindling", "KINDLING_CLI_BIN"))
        .args(["tune", "--help"])
        .output()
        .expect("kindling");
    let help = String::from_utf8_lossy(&out.stdout);
    for form in [
        "--space <NAME=VALUES>",
        "a|b|c",
        "low..high",
        "log:low..high",
        "int:low..high",
        "--trials",
        "--scheduler",
    ] {
        assert!(
            help.contains(form),
            "`kindling tune --help` lacks {form}:\n{help}"
        );
    }
}

/// A trial that fails (its `no_weight_decay` pattern matches no parameter,
/// found on the agents) is reported failed with its cause; the other trial
/// finishes and is the best.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_trial_does_not_stop_the_others() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 1000).await;
    let space = SearchSpace::new().choice(
        "no_weight_decay",
        [
            serde_json::json!(["no-such-parameter"]),
            serde_json::json!(["bias"]),
        ],
    );
    let result = rule_job()
        .epochs(2)
        .optimizer(kindling::OptimizerSpec::adamw(0.02, 0.01))
        .build()
        .expect("job")
        .search(&df, &Search::new(space))
        .await
        .expect("search");
    let [failed, finished] = &result.trials[..] else {
        panic!("two trials: {}", result.table());
    };
    assert_eq!(failed.outcome, TrialOutcome::Failed);
    let cause = failed.error.as_deref().expect("a cause");
    assert!(cause.contains("no-such-parameter"), "{cause}");
    assert_eq!(finished.outcome, TrialOutcome::Finished);
    assert_eq!(result.best, Some(1));
    assert!(result.table().contains("trial 0 failed:"));
}

/// Dropping a search's future mid-training cancels every trial and the
/// dataset on every agent, which drop its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_the_search_cancels_every_trial_and_frees_the_dataset() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 4000).await;
    let (cluster, _dir) = cluster(2).await;
    let cluster = std::sync::Arc::new(cluster);
    let job = rule_job()
        .job_id("srch-drop")
        .epochs(500)
        .batch_size(8)
        .build()
        .expect("job");
    let space = SearchSpace::parse(["lr=0.01|0.02"]).expect("space");
    let searching = {
        let cluster = cluster.clone();
        tokio::spawn(async move { job.search_on(&cluster, &df, &Search::new(space)).await })
    };
    let agents: Vec<_> = (0..2).map(|i| agent_client(&cluster, i)).collect();
    for c in &agents {
        wait_for_job(c, "srch-drop-t01", "an epoch", LIMIT, |s| s.epoch >= 1).await;
    }
    searching.abort();
    for c in &agents {
        for job in ["srch-drop-data", "srch-drop-t00", "srch-drop-t01"] {
            wait_for_job(c, job, "cancelled with no rows", LIMIT, |s| {
                s.state == AgentJobState::Cancelled && s.cache_bytes_memory == 0 && s.cache_bytes_disk == 0
            })
            .await;
        }
    }
}

/// Four trials at once on agents of one training thread each: every trial
/// trains on a thread pool of its own, so none waits for another's thread
/// while its ring partner on the other agent waits for it — every trial
/// finishes on its first attempt (a shared pool deadlocked two agents'
/// threads on different trials until the collective timeout failed them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_trials_at_once_on_one_thread_per_agent_never_wait_on_each_other() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 4000).await;
    let (cluster, _dir) = kindling_tests::cluster::cluster_with(2, |c| {
        c.train_threads = 1;
        c.collective_timeout = std::time::Duration::from_secs(5);
    })
    .await;
    let space = SearchSpace::parse(["lr=0.05|0.02|0.01|0.005"]).expect("space");
    let result = rule_job()
        .job_id("srch-threads")
        .epochs(3)
        .build()
        .expect("job")
        .search_on(&cluster, &df, &Search::new(space).parallel(4))
        .await
        .expect("search");
    assert!(
        result.trials.iter().all(|t| t.outcome == TrialOutcome::Finished),
        "{}",
        result.table()
    );
    for i in 0..2 {
        for t in &result.trials {
            let s = status(&agent_client(&cluster, i), &t.job_id).await;
            assert!(
                s.failed_attempts.is_empty(),
                "{} on agent {i}: {:?}",
                t.job_id,
                s.failed_attempts
            );
            assert_eq!(s.attempt, 1);
        }
    }
}

/// `kindling tune` as a user runs it (local mode, a real Spark query):
/// prints the trials' table, writes every trial to `--results` as JSON and
/// saves the best finished trial's model to `--output`.
#[test]
fn kindling_tune_prints_the_table_writes_every_trial_and_saves_the_best_model() {
    let dir = tempfile::tempdir().expect("dir");
    let results = dir.path().join("results.json");
    let model = dir.path().join("model");
    let sql = rule_sql(4000);
    let out = std::process::Command::new(kindling_tests::netns::binary("kindling", "KINDLING_CLI_BIN"))
        .args(["tune", "--local", "--remote", &spark_remote(), "--sql", &sql])
        .args([
            "--features",
            "x1,x2",
            "--label",
            "y",
            "--model",
            "mlp:8",
            "--epochs",
            "2",
        ])
        .args(["--space", "lr=0.05|0.001", "--scheduler", "all"])
        .arg("--results")
        .arg(&results)
        .arg("-o")
        .arg(&model)
        .output()
        .expect("kindling");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("trial  options"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&results).expect("results")).expect("json");
    assert_eq!(json["metric"], "eval_loss");
    let trials = json["trials"].as_array().expect("trials");
    assert_eq!(trials.len(), 2);
    for t in trials {
        assert_eq!(t["outcome"], "finished", "{t}");
        assert_eq!(t["history"].as_array().expect("history").len(), 2);
    }
    let best = json["best_trial"].as_u64().expect("a best trial") as usize;
    let loss = |i: usize| trials[i]["best"].as_f64().expect("best");
    assert!(loss(best) <= loss(1 - best));
    assert_eq!(
        trials[best]["options"]["lr"], 0.05,
        "the larger rate learns the rule in 2 epochs"
    );
    let saved = kindling::TrainedModel::load(&model).expect("the saved model");
    assert_eq!(saved.job_id(), trials[best]["job_id"].as_str().expect("id"));
}

/// `kindling train --local` as a user runs it: the status page's link,
/// which holds the run's token, goes to a file of the user's (mode 0600);
/// neither the token nor any `token=` URL reaches the terminal.
#[test]
fn kindling_train_local_writes_the_status_page_link_to_a_file_and_prints_no_token() {
    use std::io::{BufRead, Read};

    let dir = tempfile::tempdir().expect("dir");
    let sql = rule_sql(2000);
    let mut run = std::process::Command::new(kindling_tests::netns::binary("kindling", "KINDLING_CLI_BIN"))
        .args(["train", "--local", "--remote", &spark_remote(), "--sql", &sql])
        .args(["--features", "x1,x2", "--label", "y", "--epochs", "1"])
        .arg("-o")
        .arg(dir.path().join("model"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kindling");
    // The link's file lives as long as the run's local cluster: read it
    // while the run goes on.
    let mut stderr = std::io::BufReader::new(run.stderr.take().expect("stderr"));
    let mut printed = String::new();
    let link_file = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("stderr") == 0 {
            panic!("no status page link file named:\n{printed}");
        }
        printed.push_str(&line);
        if let Some(rest) = line.split("open the link in ").nth(1) {
            break rest.split(": it holds").next().expect("path").trim().to_owned();
        }
    };
    let link_file = std::path::Path::new(&link_file);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(link_file)
            .expect("the link file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{} is readable by others", link_file.display());
    }
    let link = std::fs::read_to_string(link_file).expect("the link file");
    stderr.read_to_string(&mut printed).expect("stderr");
    let out = run.wait_with_output().expect("kindling");
    printed.push_str(&String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "{printed}");
    assert!(!printed.contains("token="), "{printed}");
    let token = link
        .trim()
        .split("?token=")
        .nth(1)
        .expect("the link holds the token");
    assert!(token.len() >= 16, "{link}");
    assert!(!printed.contains(token), "the token was printed:\n{printed}");
}
