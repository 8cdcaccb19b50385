//! Experiment tracking in a real MLflow server (`mlflow server`, started
//! by the test) fed by a real Spark Connect query and real agents, read
//! back through MLflow's REST API: the spec as params, every epoch's
//! metrics by step, early stopping's tags, the model as artifacts, the
//! run's end. A server that is down, silent, or SIGKILLed mid-run and
//! restarted never fails training, and loses nothing it can get later.

use std::collections::BTreeMap;
use std::time::Duration;

use kindling::job::{TrainedModel, TrainingEvent};
use kindling::{EarlyStopping, Metric, SparkSession};
use kindling_tests::mlflow::MlflowServer;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};
use serde_json::Value;

/// The spec flattened as MLflow params are: `optimizer.learning_rate`, …
fn flat(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flat(&key, v, out);
            }
        }
        Value::String(s) => {
            out.insert(prefix.to_owned(), s.clone());
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

/// The one run of `experiment`, with every epoch of `model` logged.
fn assert_run_holds(server: &MlflowServer, experiment: &str, model: &TrainedModel) -> Value {
    let runs = server.runs(experiment);
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let run = runs[0].clone();
    let run_id = run["info"]["run_id"].as_str().expect("run id").to_owned();
    assert_eq!(run["info"]["run_name"], model.job_id());
    for metric in [
        "train_loss",
        "eval_loss",
        "eval_accuracy",
        "eval_auc_roc",
        "learning_rate",
    ] {
        let logged = server.history(&run_id, metric);
        let ours: Vec<(u64, f64)> = model
            .history()
            .iter()
            .map(|m| {
                let v = match metric {
                    "learning_rate" => m.learning_rate,
                    other => m.get(Metric::parse(other).expect("metric")),
                };
                (m.epoch as u64, v.expect("value"))
            })
            .collect();
        assert_eq!(logged, ours, "{metric} by epoch");
    }
    run
}

/// Every param, every epoch's metrics, the early stop, the model files and
/// `FINISHED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_holds_the_spec_every_epoch_the_early_stop_and_the_model() {
    let server = MlflowServer::start();
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = rule_df(&spark, 1200).await;
    // No epoch improves the train loss by 10: stopped after epoch 2, epoch 1 kept.
    let mut stop = EarlyStopping::new(Metric::TrainLoss, 1);
    stop.min_delta = 10.0;
    let model = rule_job()
        .epochs(6)
        .early_stopping(stop)
        .mlflow(server.url(), "kindling-test")
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    assert_eq!(model.history().len(), 2);
    let run = assert_run_holds(&server, "kindling-test", &model);
    assert_eq!(run["info"]["status"], "FINISHED", "{run:#}");
    let run_id = run["info"]["run_id"].as_str().expect("id");

    let params: BTreeMap<String, String> = run["data"]["params"]
        .as_array()
        .expect("params")
        .iter()
        .map(|p| {
            (
                p["key"].as_str().expect("key").to_owned(),
                p["value"].as_str().expect("value").to_owned(),
            )
        })
        .collect();
    let mut want = BTreeMap::new();
    flat(
        "",
        &serde_json::from_str(&model.spec().to_json()).expect("json"),
        &mut want,
    );
    assert_eq!(params, want, "the spec as params");

    let tags: BTreeMap<String, String> = run["data"]["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .map(|t| {
            (
                t["key"].as_str().expect("key").to_owned(),
                t["value"].as_str().expect("value").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        tags.get("kindling.best_epoch").map(String::as_str),
        Some("1"),
        "{tags:?}"
    );
    assert_eq!(
        tags.get("kindling.stopped_early_after_epoch").map(String::as_str),
        Some("2")
    );
    assert_eq!(
        tags.get("kindling.job_id").map(String::as_str),
        Some(model.job_id())
    );

    let mut files = server.artifacts(run_id, "model");
    files.sort();
    assert_eq!(files, ["model.bpk", "model.json", "spec.json", "weights.arrow"]);
    let spec: kindling::JobSpec =
        serde_json::from_slice(&server.artifact(&run, "model/spec.json")).expect("spec artifact");
    assert_eq!(&spec, model.spec());
}

/// A server that refuses connections, one that accepts and never answers,
/// and one SIGKILLed before the first epoch and restarted after the
/// second: training succeeds every time, and the restarted server ends up
/// with every epoch and a `FINISHED` run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tracking_server_that_is_down_silent_or_killed_never_fails_training() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = rule_df(&spark, 1200).await;

    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    }; // nothing listens there now
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_url = format!("http://{}", silent.local_addr().expect("addr"));
    for url in [format!("http://{closed}"), silent_url] {
        let model = rule_job()
            .mlflow(url.clone(), "kindling-test")
            .mlflow_flush_timeout(Duration::from_millis(500))
            .build()
            .expect("job")
            .fit(&df)
            .await
            .unwrap_or_else(|e| panic!("training with MLflow at {url}: {e}"));
        assert_eq!(model.history().len(), 5, "{url}");
    }

    let mut server = MlflowServer::start();
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let job = rule_job()
        .epochs(4)
        .events(tx)
        .mlflow(server.url(), "outage")
        .mlflow_flush_timeout(Duration::from_secs(180))
        .build()
        .expect("job");
    let fit = tokio::spawn(async move { job.fit(&rule_df(&spark, 1200).await).await });
    let mut restarted = false;
    while let Some(event) = rx.recv().await {
        match event {
            TrainingEvent::Started { .. } => server.kill(),
            TrainingEvent::Epoch(m) if m.epoch == 2 && !restarted => {
                server = tokio::task::spawn_blocking(move || {
                    server.restart();
                    server
                })
                .await
                .expect("restart");
                restarted = true;
            }
            _ => {}
        }
    }
    assert!(restarted, "the server came back mid-run");
    let model = fit.await.expect("task").expect("training with a killed MLflow");
    let run = assert_run_holds(&server, "outage", &model);
    assert_eq!(run["info"]["status"], "FINISHED", "{run:#}");
}

/// A run's tags by key.
fn tags_of(run: &Value) -> BTreeMap<String, String> {
    run["data"]["tags"]
        .as_array()
        .map(|tags| {
            tags.iter()
                .map(|t| {
                    (
                        t["key"].as_str().expect("key").to_owned(),
                        t["value"].as_str().expect("value").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A search is one MLflow run with a child run per trial: each child holds
/// its trial's epochs (a stopped trial's up to its rung, tagged), the
/// parent names the best trial and holds its model.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_search_is_a_parent_run_with_a_child_run_per_trial() {
    use kindling::job::{Search, SearchSpace, TrialOutcome};
    let server = MlflowServer::start();
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = rule_df(&spark, 2000).await;
    let space = SearchSpace::parse(["lr=0.1|0.03|0.001|0.0001"]).expect("space");
    let result = rule_job()
        .job_id("srch-ml")
        .epochs(3)
        .mlflow(server.url(), "kindling-search")
        // Every update is checked below: wait until MLflow took them all
        // (a server slowed by a busy machine took longer than the default
        // 10 s, and the search's own run was not there yet).
        .mlflow_flush_timeout(Duration::from_secs(600))
        .build()
        .expect("job")
        .search(&df, &Search::new(space).asha(1, 2).parallel(1))
        .await
        .expect("search");
    let runs = server.runs("kindling-search");
    assert_eq!(runs.len(), 5, "a parent and four children: {runs:#?}");
    let parent = runs
        .iter()
        .find(|r| r["info"]["run_name"] == "srch-ml")
        .expect("the search's run");
    let parent_id = parent["info"]["run_id"].as_str().expect("id");
    let best = result.best_trial().expect("a best trial");
    let tags = tags_of(parent);
    assert_eq!(tags.get("kindling.search.best_trial"), Some(&best.job_id));
    assert_eq!(tags.get("kindling.search.trials").map(String::as_str), Some("4"));
    assert_eq!(parent["info"]["status"], "FINISHED");
    assert!(!server.artifacts(parent_id, "model").is_empty(), "the best model");
    for t in &result.trials {
        let run = runs
            .iter()
            .find(|r| r["info"]["run_name"] == t.job_id.as_str())
            .unwrap_or_else(|| panic!("no run for {}", t.job_id));
        let tags = tags_of(run);
        assert_eq!(
            tags.get("mlflow.parentRunId").map(String::as_str),
            Some(parent_id)
        );
        let run_id = run["info"]["run_id"].as_str().expect("id");
        let logged = server.history(run_id, "eval_loss");
        // A stopped trial may log an epoch past its rung before it stops.
        assert!(logged.len() >= t.history.len(), "{}: {logged:?}", t.job_id);
        for (m, (step, v)) in t.history.iter().zip(&logged) {
            assert_eq!((m.epoch as u64, m.eval_loss), (*step, Some(*v)));
        }
        if let TrialOutcome::Stopped { at_epoch } = t.outcome {
            assert_eq!(tags.get("kindling.stopped_at_epoch"), Some(&at_epoch.to_string()));
        }
    }
}
