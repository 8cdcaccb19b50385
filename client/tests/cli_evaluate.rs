//! `kindling evaluate` as a real process against the real Spark Connect
//! server: a model trained by `kindling train` with a sample-weight column
//! and class weights is scored on a query, and the report it prints (JSON)
//! is the one `TrainedModel::evaluate` gives in this process on the same
//! rows; an empty query and a query without the label are refused naming
//! what is wrong.

use crate::common;

use std::process::{Command, Output};

use common::spark_remote;

const SQL: &str = "SELECT x1, x2, CAST(x1 + 2 * x2 > 0.1 AS INT) AS y, 1.0D + x1 * x1 AS w FROM \
    (SELECT rand(1) * 2 - 1 AS x1, rand(2) * 2 - 1 AS x2 FROM range(2000))";

fn kindling(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(args)
        .output()
        .expect("kindling")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluate_prints_the_report_evaluate_gives_and_refuses_bad_input() {
    let remote = spark_remote();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("model");
    let model_arg = model.to_str().expect("path");
    let out = kindling(&[
        "train",
        "--remote",
        &remote,
        "--sql",
        SQL,
        "--features",
        "x1,x2",
        "--label",
        "y",
        "--model",
        "mlp:8",
        "--local",
        "--slots",
        "2",
        "--epochs",
        "3",
        "--batch-size",
        "32",
        "--sample-weight",
        "w",
        "--class-weights",
        "1,2",
        "-o",
        model_arg,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spec = std::fs::read_to_string(model.join("spec.json")).expect("spec.json");
    let spec = kindling::JobSpec::from_json(&spec).expect("spec");
    assert_eq!(spec.sample_weight.as_deref(), Some("w"));
    assert_eq!(spec.class_weights, Some(vec![1.0, 2.0]));

    let out = kindling(&[
        "evaluate", "--remote", &remote, "--model", model_arg, "--sql", SQL, "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: kindling::Report = serde_json::from_str(stdout.trim()).expect("a JSON report");
    let spark = kindling::SparkSession::connect(&remote).await.expect("connect");
    let here = kindling::TrainedModel::load(&model)
        .expect("load")
        .evaluate(&spark.sql(SQL).await.expect("sql"))
        .await
        .expect("evaluate");
    assert_eq!(printed, here);
    assert_eq!(printed.rows, 2000);
    for metric in [
        "eval_accuracy",
        "eval_f1_macro",
        "eval_auc_roc",
        "eval_pr_auc",
        "eval_log_loss",
    ] {
        assert!(printed.metrics.contains_key(metric), "{metric}: {printed:?}");
    }

    let out = kindling(&[
        "evaluate",
        "--remote",
        &remote,
        "--model",
        model_arg,
        "--sql",
        &format!("SELECT * FROM ({SQL}) WHERE x1 > 5"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("the DataFrame to evaluate is empty"), "{stderr}");

    let out = kindling(&[
        "evaluate",
        "--remote",
        &remote,
        "--model",
        model_arg,
        "--sql",
        &format!("SELECT x1, x2, w FROM ({SQL})"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("column `y` is missing"), "{stderr}");
}
