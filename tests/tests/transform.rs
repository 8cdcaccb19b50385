//! `TrainedModel::transform` on the shared Spark Connect server (`local[2]`:
//! its tasks have no node-local agent, so they spread over the serving
//! agents): predictions computed by real agents inside Spark tasks, equal to
//! the driver-side `predict`, with no rows through the client; the model
//! loaded once per agent; precise errors for what cannot work.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use kindling::SparkSession;
use kindling::job::{JobError, Transform};
use kindling_tests::cluster::cluster;
use kindling_tests::events::assert_same_as_predict;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};

use crate::python_common;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transform_predicts_inside_spark_like_predict_with_no_rows_through_the_client() {
    // 10,000 rows per partition, in one Arrow batch each (Spark's default
    // size): the Python side reads a batch's answer until every row is back,
    // however many messages the agent sends it in.
    const ROWS: usize = 40_000;
    let (cluster, _dir) = cluster(2).await;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    spark
        .conf_set("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
        .await
        .expect("conf");
    let df = rule_df(&spark, ROWS).await;
    let model = rule_job()
        .eval_fraction(0.0)
        .epochs(2)
        .build()
        .expect("job")
        .fit_on(&cluster, &df)
        .await
        .expect("fit");

    let scored = model.transform(&df).await.expect("transform");
    let names: Vec<String> = scored
        .schema()
        .await
        .expect("schema")
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["x1", "x2", "y", "prediction", "probabilities"]);

    // An aggregate over the predictions: every row predicted on the agents,
    // one row back to the client.
    let before = spark.data_bytes();
    let summary = scored
        .select_expr(["count(*) AS n", "sum(prediction) AS positives"])
        .collect()
        .await
        .expect("aggregate");
    let received = spark.data_bytes().received - before.received;
    let n = summary[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(n, ROWS as i64);
    assert!(received < 4096, "{received} bytes reached the client for one row");

    // The model was loaded once per agent; its streams (one per task) and
    // rows add up to the query's.
    let serving = model.serving_cluster().expect("fit_on keeps the cluster").clone();
    let (mut streams, mut rows) = (0, 0);
    for i in 0..2 {
        let list = kindling::job::TrainedModel::served_on(&serving, &cluster.agent_url(i).expect("agent"))
            .await
            .expect("served models");
        assert_eq!(list.models.len(), 1, "{list:?}");
        assert_eq!(list.models[0].loads, 1, "{list:?}");
        streams += list.models[0].streams;
        rows += list.models[0].rows;
    }
    assert_eq!(rows, ROWS as u64);
    assert_eq!(streams, 4, "one stream per partition");

    // The same predictions as the driver-side model, to 1e-6.
    let batches = scored.collect().await.expect("collect");
    assert_eq!(assert_same_as_predict(&model, &batches), ROWS);

    // Serving again loads nothing.
    let again = model.serve().await.expect("serve");
    assert!(again.agents.iter().all(|(_, a)| !a.loaded), "{again:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transform_says_precisely_what_cannot_work() {
    let (cluster, _dir) = cluster(1).await;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 2_000).await;
    let job = rule_job()
        .num_slots(1)
        .eval_fraction(0.0)
        .epochs(1)
        .build()
        .expect("job");
    let model = job.fit_on(&cluster, &df).await.expect("fit");

    // A column it would add is there already.
    let taken = df.with_column("prediction", kindling::spark::functions::lit(1));
    let err = model.transform(&taken).await.expect_err("column taken");
    assert!(
        matches!(err, JobError::PredictionColumnTaken { column: "prediction" }),
        "{err}"
    );

    // A feature is missing: named before anything runs.
    let err = model.transform(&df.drop(["x2"])).await.expect_err("no x2");
    assert!(err.to_string().contains("x2"), "{err}");

    // A task with no agent on its node, where one is required: the query
    // fails naming the node, it does not hang.
    let strict = model
        .transform_with(&df, &Transform::new().require_node_local(true))
        .await
        .expect("lazy");
    let err = strict.collect().await.expect_err("no node-local agent");
    assert!(
        err.to_string()
            .contains("no Kindling agent on this executor's node"),
        "{err}"
    );

    // A model trained by plain local-mode `fit` has no cluster left.
    let local = job.fit(&df).await.expect("local fit");
    let err = local.transform(&df).await.expect_err("no cluster");
    assert!(matches!(err, JobError::NoServingCluster), "{err}");
    cluster.shutdown().await;
}

/// A saved model served by agents that did not train it: from Rust
/// (`TrainedModel::load` + `serve_on`) and from PySpark
/// (`kindling_client.predict.serve_model` + `transform_fn`), the same predictions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saved_model_is_served_by_other_agents_from_rust_and_from_pyspark() {
    let (trainer, _dir) = cluster(1).await;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 4_000).await;
    let trained = rule_job()
        .num_slots(1)
        .eval_fraction(0.0)
        .epochs(1)
        .build()
        .expect("job")
        .fit_on(&trainer, &df)
        .await
        .expect("fit");
    trainer.shutdown().await;
    let saved = tempfile::tempdir().expect("tempdir");
    trained.save(saved.path()).expect("save");

    let (servers, _dir2) = cluster(2).await;
    let serving = kindling::job::ServingCluster {
        rendezvous: servers.rendezvous_url(),
        token: servers.token().cloned(),
        channel: servers.channel(),
        local: true,
    };
    let loaded = kindling::job::TrainedModel::load(saved.path())
        .expect("load")
        .serve_on(serving);
    let batches = loaded
        .transform(&df)
        .await
        .expect("transform")
        .collect()
        .await
        .expect("collect");
    assert_eq!(assert_same_as_predict(&trained, &batches), 4_000);

    let args = serde_json::json!({
        "remote": spark_remote(),
        "agents": servers.agent_urls(),
        "token": servers.token().expect("token").expose(),
        "model_dir": saved.path(),
        "package": python_common::repo_root().join("deploy/python/kindling_client"),
        "rows": 1_000,
    });
    let out = python_common::run_script("transform_spark.py", &args).await;
    let served = loaded.serve().await.expect("serve");
    assert_eq!(
        out["model_id"],
        serde_json::json!(served.model_id),
        "the same version, the same id"
    );
    assert_eq!(
        out["columns"],
        serde_json::json!(["x1", "x2", "prediction", "probabilities"])
    );
    let rows = out["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1_000);
    let x1: Vec<f64> = rows.iter().map(|r| r[0].as_f64().expect("x1")).collect();
    let x2: Vec<f32> = rows.iter().map(|r| r[1].as_f64().expect("x2") as f32).collect();
    let features = RecordBatch::try_from_iter([
        (
            "x1",
            std::sync::Arc::new(arrow::array::Float64Array::from(x1)) as arrow::array::ArrayRef,
        ),
        (
            "x2",
            std::sync::Arc::new(arrow::array::Float32Array::from(x2)) as arrow::array::ArrayRef,
        ),
    ])
    .expect("features");
    let expected = trained.predict_batch(&features).expect("predict");
    let classes = expected
        .column_by_name("prediction")
        .expect("prediction")
        .as_primitive::<Int64Type>();
    let probs = expected
        .column_by_name("probabilities")
        .expect("probabilities")
        .as_list::<i32>();
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[2].as_i64(), Some(classes.value(i)), "row {i}: {r}");
        let want = probs.value(i);
        let want = want.as_primitive::<Float32Type>();
        for k in 0..2 {
            let got = r[3][k].as_f64().expect("probability") as f32;
            assert!((got - want.value(k)).abs() <= 1e-6, "row {i}: {r} vs {want:?}");
        }
    }
    servers.shutdown().await;
}

/// `serve_model`, `drop_model` and prediction on a served id, through the
/// Flight actions: ids must match the content, the per-agent cap holds, and
/// an id nobody serves is refused saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn served_models_are_bounded_named_by_content_and_dropped() {
    use kindling_schemas::action::Action;
    use kindling_schemas::model_serving::{
        DropModel, MAX_SERVED_MODELS, ServeModel, ServeModelResponse, ServedList,
    };

    let (cluster, _dir) = cluster(1).await;
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 1_000).await;
    let model = rule_job()
        .num_slots(1)
        .eval_fraction(0.0)
        .epochs(1)
        .build()
        .expect("job")
        .fit_on(&cluster, &df)
        .await
        .expect("fit");
    let agent = kindling_tests::cluster::agent_client(&cluster, 0);
    let inputs = kindling_schemas::model_serving::model_inputs(
        &kindling_schemas::schema::validate(
            &df.schema().await.expect("schema"),
            model.spec(),
            kindling_schemas::schema::StreamKind::Predict,
        )
        .expect("layout"),
    );
    // A version per seed: the same weights, another spec, another id.
    let version = |seed: u64| {
        let mut spec = model.spec().clone();
        spec.seed = seed;
        ServeModel::new(spec, 2, inputs.clone(), &model.weights().expect("weights")).expect("serve")
    };

    let mut wrong = version(1);
    wrong.model_id = "mlp-0000000000000000".into();
    let err = agent
        .action::<ServeModelResponse>(&Action::ServeModel(wrong))
        .await
        .expect_err("wrong id");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("is not its content's id"), "{err}");

    for seed in 0..MAX_SERVED_MODELS as u64 {
        let v = version(seed);
        let r: ServeModelResponse = agent.action(&Action::ServeModel(v.clone())).await.expect("serve");
        assert_eq!((r.model_id, r.loaded), (v.model_id, true));
    }
    let again: ServeModelResponse = agent
        .action(&Action::ServeModel(version(0)))
        .await
        .expect("again");
    assert!(!again.loaded, "a served version loads nothing");
    let over = version(MAX_SERVED_MODELS as u64);
    let err = agent
        .action::<ServeModelResponse>(&Action::ServeModel(over.clone()))
        .await
        .expect_err("cap");
    assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("already serves {MAX_SERVED_MODELS} models")),
        "{err}"
    );

    let left: ServedList = agent
        .action(&Action::DropModel(DropModel {
            model_id: version(0).model_id,
        }))
        .await
        .expect("drop");
    assert_eq!(left.models.len(), MAX_SERVED_MODELS - 1);
    agent
        .action::<ServeModelResponse>(&Action::ServeModel(over))
        .await
        .expect("room again");

    // Predicting with a dropped (or never served) id names the fix.
    let rows = kindling_tests::cluster::rule_batch(10, 1);
    let features = rows.project(&[0, 1]).expect("features");
    let err = match agent
        .predict(
            &version(0).model_id,
            features.schema(),
            futures::stream::iter([features]),
        )
        .await
    {
        Err(e) => e.to_string(),
        Ok(out) => {
            use futures::StreamExt;
            let mut out = Box::pin(out);
            match out.next().await {
                Some(Err(e)) => e.to_string(),
                other => panic!("predicted with a dropped model: {other:?}"),
            }
        }
    };
    assert!(err.contains("serve it there first"), "{err}");
    cluster.shutdown().await;
}
