//! `kindling train` as a real process against the real Spark Connect server,
//! in local mode:
//!
//! - the training flags (AdamW with biases exempt from decay, a warmup +
//!   cosine schedule, norm clipping, accumulation, early stopping) reach the
//!   job: the saved model's spec carries them and its epochs print their rate;
//! - a query with no rows is an error that names the empty train split, the
//!   process exits non-zero and writes no model;
//! - a bad flag value is refused before anything runs, naming the flag;
//! - `--split-by` reaches the job (the saved spec records the split), and a
//!   column that cannot split is refused naming it, writing no model.

use crate::common;

use std::process::{Command, Output};

use common::spark_remote;

const RULE_SQL: &str = "SELECT x1, x2, CAST(x1 + 2 * x2 > 0.1 AS INT) AS y FROM \
    (SELECT rand(1) * 2 - 1 AS x1, rand(2) * 2 - 1 AS x2 FROM range(3000))";

fn train(sql: &str, output: &std::path::Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(["train", "--remote", &spark_remote(), "--sql", sql])
        .args(["--features", "x1,x2", "--label", "y", "--model", "mlp:8"])
        .args(["--local", "--slots", "2", "--epochs", "4", "--batch-size", "32"])
        .args(extra)
        .arg("-o")
        .arg(output)
        .output()
        .expect("kindling train")
}

#[test]
fn train_flags_reach_the_job_and_an_empty_query_saves_no_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("model");
    let out = train(
        RULE_SQL,
        &model,
        &[
            "--optimizer",
            "adamw:0.02:0.01",
            "--no-weight-decay",
            "bias",
            "--schedule",
            "cosine",
            "--warmup-epochs",
            "0.5",
            "--clip-norm",
            "1",
            "--accumulate",
            "2",
            "--early-stopping",
            "3",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let spec = std::fs::read_to_string(model.join("spec.json")).expect("spec.json");
    let spec = kindling::JobSpec::from_json(&spec).expect("spec");
    assert_eq!(spec.optimizer, kindling::OptimizerSpec::adamw(0.02, 0.01));
    assert_eq!(spec.no_weight_decay, vec!["bias".to_owned()]);
    assert_eq!(spec.accumulate, 2);
    assert!(
        matches!(spec.schedule, kindling::Schedule::Cosine { warmup_epochs, .. } if warmup_epochs == 0.5)
    );
    assert!(spec.early_stopping.is_some_and(|s| s.patience == 3));
    assert!(stderr.contains(" lr "), "epoch lines carry the rate: {stderr}");

    let empty = dir.path().join("empty");
    let out = train(&format!("SELECT * FROM ({RULE_SQL}) WHERE x1 > 5"), &empty, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an empty query must fail: {stderr}");
    assert!(
        stderr.contains("train split") && stderr.contains("is empty"),
        "{stderr}"
    );
    assert!(!empty.exists(), "no model is written");

    let out = train(RULE_SQL, &dir.path().join("bad"), &["--schedule", "cyclic"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--schedule"), "{stderr}");
}

#[test]
fn split_by_reaches_the_saved_spec_and_a_float_column_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sql = "SELECT id, x1, x2, CAST(x1 + 2 * x2 > 0.1 AS INT) AS y FROM \
        (SELECT id, rand(1) * 2 - 1 AS x1, rand(2) * 2 - 1 AS x2 FROM range(3000))";
    let model = dir.path().join("model");
    let split = ["--split-by", "id", "--eval-fraction", "0.3", "--seed", "4"];
    let out = train(sql, &model, &split);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let spec = std::fs::read_to_string(model.join("spec.json")).expect("spec.json");
    let spec = kindling::JobSpec::from_json(&spec).expect("spec");
    assert_eq!(spec.eval_split, Some(kindling::EvalSplit::new("id", 0.3)));
    assert_eq!(spec.seed, 4);

    let bad = dir.path().join("bad");
    let out = train(sql, &bad, &["--split-by", "x1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a float split column must be refused: {stderr}"
    );
    assert!(
        stderr.contains("`x1` (eval_split_by) has type Float64"),
        "{stderr}"
    );
    assert!(!bad.exists(), "no model is written");
}
