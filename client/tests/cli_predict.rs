//! `kindling predict` as a real process, with a saved model, a local cluster
//! (agents and rendezvous in this test's process) and a real Spark Connect
//! server:
//!
//! - with `--rendezvous` and `--output parquet:<path>` the model is served on
//!   the cluster's agents and the Spark tasks predict through them: every row
//!   once between the agents, the model loaded once per agent, the file holds
//!   one prediction per row equal to `predict_batch` of its features;
//! - a malformed `--output` is refused before anything runs, naming the forms.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use futures::FutureExt;
use kindling::job::{ProgressMode, ServingCluster, TrainedModel, TrainingJob};
use kindling::local::{LocalCluster, LocalClusterConfig};
use kindling::spark::RecordBatchStream;
use kindling_fixtures::{rule_batch, rule_schema};
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};

const ROWS: usize = 5_000;

/// The Parquet directory Spark wrote, read back through Spark.
async fn read_parquet(remote: &str, dir: &Path) -> Vec<RecordBatch> {
    let spark = kindling::SparkSession::connect(remote).await.expect("spark");
    spark
        .read()
        .parquet([dir.display().to_string()])
        .collect()
        .await
        .expect("the predictions read back")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predict_with_a_rendezvous_runs_on_the_executors_and_writes_parquet() {
    let remote = common::spark_remote();
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = LocalCluster::start(2, LocalClusterConfig::new(dir.path()))
        .await
        .expect("cluster");
    let token = cluster.token().expect("token").clone();
    let data = Arc::new((0..4).map(|s| rule_batch(1_000, s)).collect::<Vec<_>>());
    let model = TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![8] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .epochs(1)
        .rendezvous(cluster.rendezvous_url())
        .token(token.clone())
        .channel(cluster.channel())
        .progress(ProgressMode::Silent)
        .build()
        .expect("job")
        .fit_arrow(rule_schema(), || {
            let data = data.clone();
            async move {
                let rows: RecordBatchStream =
                    Box::pin(futures::stream::iter(data.as_ref().clone().into_iter().map(Ok)));
                Ok(rows)
            }
            .boxed()
        })
        .await
        .expect("fit");
    let saved = dir.path().join("model");
    model.save(&saved).expect("save");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token.expose()).expect("token file");
    let out = dir.path().join("predictions.parquet");

    let sql = format!(
        "SELECT CAST(rand(7) * 2 - 1 AS DOUBLE) AS x1, CAST(rand(8) * 2 - 1 AS FLOAT) AS x2 \
         FROM range(0, {ROWS}, 1, 4)"
    );
    let run = Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(["predict", "--remote", &remote, "--sql", &sql])
        .arg("--model")
        .arg(&saved)
        .args(["--rendezvous", &cluster.rendezvous_url()])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--output")
        .arg(format!("parquet:{}", out.display()))
        .env_remove("KINDLING_RENDEZVOUS")
        .output()
        .expect("kindling predict");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains(&format!("{ROWS} predictions written to")),
        "{stdout}"
    );

    // The agents predicted every row once, each loading the model once.
    let serving = ServingCluster {
        rendezvous: cluster.rendezvous_url(),
        token: Some(token.clone()),
        channel: cluster.channel(),
        local: true,
    };
    let mut rows = 0;
    for i in 0..2 {
        let url = cluster.agent_url(i).expect("agent");
        let list = TrainedModel::served_on(&serving, &url).await.expect("served");
        assert_eq!(list.models.len(), 1, "{url}: {list:?}");
        assert_eq!(list.models[0].loads, 1, "{url}: {list:?}");
        rows += list.models[0].rows;
    }
    assert_eq!(rows, ROWS as u64, "every row once between the agents");

    // The file: one prediction per row, as predict_batch gives.
    let batches = read_parquet(&remote, &out).await;
    let mut checked = 0;
    for b in &batches {
        let schema = b.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["x1", "x2", "prediction", "probabilities"]);
        let want = model
            .predict_batch(&b.project(&[0, 1]).expect("features"))
            .expect("predict");
        assert_eq!(
            b.column(2).as_primitive::<Int64Type>(),
            want.column_by_name("prediction")
                .expect("prediction")
                .as_primitive::<Int64Type>()
        );
        let (got, expected) = (
            b.column(3).as_list::<i32>(),
            want.column_by_name("probabilities")
                .expect("probabilities")
                .as_list::<i32>(),
        );
        for i in 0..b.num_rows() {
            let (g, w) = (got.value(i), expected.value(i));
            let (g, w) = (g.as_primitive::<Float32Type>(), w.as_primitive::<Float32Type>());
            assert_eq!(g.len(), 2);
            for k in 0..g.len() {
                assert!((g.value(k) - w.value(k)).abs() <= 1e-6, "row {i}: {g:?} vs {w:?}");
            }
        }
        checked += b.num_rows();
    }
    assert_eq!(checked, ROWS);

    // A malformed output names the forms and runs nothing.
    let bad = Command::new(env!("CARGO_BIN_EXE_kindling"))
        .args(["predict", "--remote", &remote, "--sql", "SELECT 1 AS x1"])
        .arg("--model")
        .arg(&saved)
        .args(["--output", "predictions.csv"])
        .output()
        .expect("kindling predict");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--output predictions.csv") && err.contains("parquet:<path>"),
        "{err}"
    );
    cluster.shutdown().await;
}
