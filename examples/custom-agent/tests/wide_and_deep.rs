//! The crate's own agent binary trains its own model: `kindling-example-agent`
//! processes, a rendezvous, real Spark, and `TrainingJob` driving them.

use crate::common;

use std::time::{Duration, Instant};

use kindling::functions::col;
use kindling::futures::TryStreamExt;
use kindling::job::{JobError, TrainedModel, TrainingEvent};
use kindling::model::{AgentError, ModelError};
use kindling::{CheckpointPolicy, ModelSpec, OptimizerSpec};
use kindling_example_agent::{MODEL, registry};
use kindling_schemas::action::AgentJobState;
use kindling_schemas::schema::SchemaError;
use tokio::sync::mpsc;

use common::{
    CITIES, Cluster, SERIAL, assert_no_job_on_agents, city_df, config, custom, drain, job, python, spark,
    table,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_agents_with_batch_b_end_within_1e5_of_one_agent_with_batch_2b() {
    let _serial = SERIAL.lock().await;
    let spark = spark().await;
    const B: usize = 16;
    // Partitions of 2b rows: the relay deals each partition's first b rows
    // to shard 0 and its last b to shard 1, so step k of the two ranks trains
    // exactly the rows of step k of one rank with batch 2b (partition k).
    let df = city_df(&spark, 16 * 2 * B, 16, "INT").await;
    let cluster = Cluster::start(2).await;
    let run = |slots: u32, batch: usize| {
        cluster.job(
            job(custom(&config()))
                .models(registry())
                .num_slots(slots)
                .batch_size(batch)
                .shuffle(false)
                .optimizer(OptimizerSpec::sgd(0.1))
                .epochs(3)
                .seed(5),
        )
    };
    let (tx, mut rx) = mpsc::channel(256);
    let two = run(2, B)
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .unwrap_or_else(|e| panic!("2 agents: {e}\n{}", cluster.logs()));
    let one = run(1, 2 * B)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .unwrap_or_else(|e| panic!("1 agent: {e}\n{}", cluster.logs()));

    let events = drain(&mut rx);
    let Some(TrainingEvent::Started { job_id, agents }) = events.first() else {
        panic!("no start: {events:?}");
    };
    assert_eq!(agents.len(), 2, "{events:?}");
    let fed: Vec<&Vec<u64>> = events
        .iter()
        .filter_map(|e| match e {
            TrainingEvent::Fed { rows_per_shard, .. } => Some(rows_per_shard),
            _ => None,
        })
        .collect();
    assert_eq!(fed, [&vec![256, 256]], "each shard gets half of every partition");
    let history = two.history();
    assert_eq!(history.len(), 3);
    assert!(
        history[2].train_loss < history[0].train_loss,
        "it learned: {history:?}"
    );

    // Both ranks hold the same weights, bit for bit.
    let mut ranks = Vec::new();
    for url in agents {
        let c = cluster
            .agents
            .iter()
            .find(|a| &a.url == url)
            .expect("agent")
            .client();
        ranks.push(common::table(&c.fetch_model(job_id).await.expect("model table")));
    }
    assert_eq!(ranks[0], ranks[1], "the ranks' weights differ");

    let (w2, w1) = (
        table(&two.weights().expect("w")),
        table(&one.weights().expect("w")),
    );
    assert_eq!(w2, ranks[0], "the client's table is rank 0's");
    assert_eq!(w2.len(), 5, "embedding, numeric tower, head: {w2:?}");
    let mut max_diff = 0f32;
    for ((n2, s2, v2), (n1, s1, v1)) in w2.iter().zip(&w1) {
        assert_eq!((n2, s2), (n1, s1));
        assert_eq!(v2.len(), v1.len());
        for (a, b) in v2.iter().zip(v1) {
            max_diff = max_diff.max((a - b).abs());
        }
    }
    eprintln!("2 agents × b vs 1 agent × 2b: max abs diff {max_diff}");
    assert!(
        max_diff < 1e-5,
        "2 agents × b vs 1 agent × 2b: max abs diff {max_diff}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_agent_is_replaced_and_every_epoch_trains_every_row_once() {
    let _serial = SERIAL.lock().await;
    let spark = spark().await;
    const ROWS: u64 = 12_000;
    const EPOCHS: u32 = 8;
    let df = city_df(&spark, ROWS as usize, 12, "INT").await;
    let mut cluster = Cluster::start(3).await;
    let (tx, mut rx) = mpsc::channel(1024);
    let spec = custom(&config());
    let fit = {
        let job = cluster
            .job(job(spec.clone()))
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
        tokio::spawn(async move { job.fit(&df).await })
    };
    // The client reports training in epoch 2 or later.
    let mut started = None;
    let mut in_epoch_2 = false;
    while let Some(e) = rx.recv().await {
        match e {
            TrainingEvent::Started { job_id, agents } => started = Some((job_id, agents)),
            TrainingEvent::Step { epoch, .. } if epoch >= 2 => {
                in_epoch_2 = true;
                break;
            }
            _ => {}
        }
    }
    if !in_epoch_2 {
        let result = fit.await.expect("fit task").map(|m| m.history().len());
        panic!(
            "the job ended before epoch 2 was seen: {result:?}\n{}",
            cluster.logs()
        );
    }
    let (job_id, agents) = started.expect("the job started");
    assert_eq!(agents.len(), 2);
    let victim_url = agents[1].clone();
    // Its shard-1 agent is mid-epoch (≥ 2) itself: epoch 1's checkpoint exists.
    let victim = cluster.by_url(&victim_url);
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
    victim.sigkill();

    let mut recoveries = Vec::new();
    while let Some(e) = rx.recv().await {
        if let TrainingEvent::Recovering { resent_shards, .. } = e {
            recoveries.push(resent_shards);
        }
    }
    let model = fit
        .await
        .expect("fit task")
        .unwrap_or_else(|e| panic!("fit did not survive the kill: {e}\n{}", cluster.logs()));
    assert_eq!(recoveries, [vec![1]], "the client re-sent the lost shard once");
    assert_eq!(model.history().len(), EPOCHS as usize);
    assert_eq!(model.spec().model, spec, "the same model config throughout");

    // The two agents that finished it: every epoch trained exactly the
    // dataset's rows, after resuming from the same checkpoint.
    let mut finished = Vec::new();
    for a in cluster.agents.iter().filter(|a| a.url != victim_url) {
        finished.extend(a.jobs().await.into_iter().filter(|j| j.job_id == job_id));
    }
    assert_eq!(finished.len(), 2, "the survivor and the spare: {finished:#?}");
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
    let resumed = finished[0].resumed_from_epoch.expect("resumed from a checkpoint");
    assert!(resumed >= 1, "{finished:#?}");
    assert_eq!(
        finished[1].resumed_from_epoch,
        Some(resumed),
        "the same checkpoint"
    );
    // The resumed model is the config's: one 5 × 4 embedding table first.
    let weights = table(&model.weights().expect("weights"));
    assert_eq!(weights[0].1, [CITIES as u64, 4], "{weights:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_custom_model_predicts_into_spark_and_saves_a_table_pyarrow_reads() {
    let _serial = SERIAL.lock().await;
    let spark = spark().await;
    let df = city_df(&spark, 4000, 4, "INT").await;
    let cluster = Cluster::start(2).await;
    let model = cluster
        .job(job(custom(&config())))
        .models(registry())
        .num_slots(2)
        .batch_size(32)
        .epochs(8)
        .optimizer(OptimizerSpec::adam(0.02))
        .seed(11)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .unwrap_or_else(|e| panic!("fit: {e}\n{}", cluster.logs()));

    // Into Spark: every row, and right where only the city tells
    // (ignoring it is right on about 80 % of the rows).
    let predicted = model
        .predict_into_spark(&spark, &df)
        .await
        .expect("predict into spark");
    assert_eq!(predicted.count().await.expect("count"), 4000);
    let wrong = predicted
        .filter(col("prediction").neq(col("y")))
        .count()
        .await
        .expect("count");
    assert!(wrong < 200, "{wrong} of 4000 mispredicted");

    // The model table: names and shapes of the config's layers.
    let weights = table(&model.weights().expect("weights"));
    let layout: Vec<(&str, &[u64])> = weights
        .iter()
        .map(|(n, s, _)| (n.as_str(), s.as_slice()))
        .collect();
    assert_eq!(
        layout,
        [
            ("embeddings.0.weight", &[CITIES as u64, 4][..]),
            ("numeric.weight", &[1, 8][..]),
            ("numeric.bias", &[8][..]),
            ("head.weight", &[12, 2][..]),
            ("head.bias", &[2][..]),
        ]
    );

    // Saved, read back by pyarrow: the same names, shapes and values.
    let dir = tempfile::tempdir().expect("tempdir");
    model.save(dir.path()).expect("save");
    let script = "import json, sys, pyarrow as pa\n\
                  t = pa.ipc.open_file(sys.argv[1]).read_all()\n\
                  print(json.dumps([t.column(c).to_pylist() for c in ('name', 'shape', 'values')]))";
    let out = std::process::Command::new(python())
        .args(["-c", script])
        .arg(dir.path().join("weights.arrow"))
        .output()
        .expect("run python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (names, shapes, values): (Vec<String>, Vec<Vec<u64>>, Vec<Vec<f64>>) =
        serde_json::from_slice(&out.stdout).expect("json");
    let from_python: common::Table = names
        .into_iter()
        .zip(shapes)
        .zip(values)
        .map(|((n, s), v)| (n, s, v.into_iter().map(|x| x as f32).collect()))
        .collect();
    assert_eq!(from_python, weights, "pyarrow reads the model table");

    // Loaded with the registry: the same spec and weights, the same predictions.
    let loaded = TrainedModel::load_with(dir.path(), &registry()).expect("load_with");
    assert_eq!(loaded.spec(), model.spec());
    assert_eq!(table(&loaded.weights().expect("weights")), weights);
    let sample = df.limit(500);
    let before: Vec<_> = model
        .predict(&sample)
        .await
        .expect("predict")
        .try_collect()
        .await
        .expect("a");
    let after: Vec<_> = loaded
        .predict(&sample)
        .await
        .expect("predict")
        .try_collect()
        .await
        .expect("b");
    assert_eq!(before.iter().map(|b| b.num_rows()).sum::<usize>(), 500);
    assert!(before[0].column_by_name("probabilities").is_some());
    assert_eq!(before, after, "predictions before and after save + load_with");
    // A model of one's own exports as safetensors with no code of its own
    // (the names of its burn module tree), which the `safetensors` package
    // reads; ONNX is refused, naming what it would need.
    let out = dir.path().join("exported");
    loaded
        .export(&out, kindling::job::ExportFormat::Safetensors)
        .expect("export safetensors");
    let read = std::process::Command::new(python())
        .arg("-c")
        .arg(
            "import sys, json; from safetensors.numpy import load_file; \
             t = load_file(sys.argv[1]); print(json.dumps(sorted((k, list(v.shape)) for k, v in t.items())))",
        )
        .arg(out.join(kindling::job::SAFETENSORS_FILE))
        .output()
        .expect("python");
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let read: Vec<(String, Vec<usize>)> = serde_json::from_slice(&read.stdout).expect("json");
    let mut want: Vec<&String> = weights.iter().map(|(n, _, _)| n).collect();
    want.sort();
    assert_eq!(
        read.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        want,
        "every parameter under its module-tree name"
    );
    // PyTorch's Linear layout: the head's weight [out, in].
    assert!(
        read.contains(&("head.weight".to_owned(), vec![2, 12])),
        "{read:?}"
    );
    let onnx = loaded
        .export(dir.path().join("onnx"), kindling::job::ExportFormat::Onnx)
        .expect_err("onnx of a model of one's own");
    assert!(onnx.to_string().contains("burn 0.23's graph capture"), "{onnx}");
    // Without the model linked, the weights load but cannot predict.
    let bare = TrainedModel::load(dir.path()).expect("load without the model");
    assert_eq!(table(&bare.weights().expect("weights")), weights);
    match bare.predict_batch(&before[0].project(&[0, 1, 2]).expect("inputs")) {
        Err(e @ JobError::ModelNotLinked { .. }) => assert!(
            e.to_string().starts_with(
                "model `wide-and-deep` is not registered in this process: pass a registry with it (Tr"
            ),
            "{e}"
        ),
        other => panic!("expected ModelNotLinked, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_jobs_fail_before_any_row_is_fed() {
    let _serial = SERIAL.lock().await;
    let spark = spark().await;
    let df = city_df(&spark, 200, 2, "INT").await;
    let cluster = Cluster::start(2).await;
    let nothing_happened = |rx: &mut mpsc::Receiver<TrainingEvent>, what: &str| {
        let events = drain(rx);
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, TrainingEvent::Started { .. } | TrainingEvent::Fed { .. })),
            "{what}: {events:?}"
        );
    };

    // A model no agent has: refused by the client, naming what they have.
    let (tx, mut rx) = mpsc::channel(64);
    let unknown =
        ModelSpec::custom("no-such-model", &serde_json::json!({"columns": ["city"]})).expect("spec");
    let err = cluster
        .job(job(unknown).num_slots(2).events(tx))
        .build()
        .expect("the client cannot check a model it lacks")
        .fit(&df)
        .await
        .expect_err("an unregistered model");
    match &err {
        JobError::ModelUnavailable {
            model,
            needed: 2,
            with_model: 0,
            others,
        } => {
            assert_eq!(model, "no-such-model");
            assert!(
                others.contains("agent-node-0 has cnn, linear, mlp, wide-and-deep"),
                "{others}"
            );
        }
        other => panic!("expected ModelUnavailable, got {other}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("model `no-such-model` is registered on 0 live agent(s)"),
        "{message}"
    );
    assert!(
        message.contains("the others lack it (agent-node-0 has cnn"),
        "{message}"
    );
    nothing_happened(&mut rx, "unregistered model");

    // A config the model refuses, the client lacking the model: the agents'
    // start_job refuses it, naming the model and the field.
    let zero = custom(&config().with_embedding(0));
    let (tx, mut rx) = mpsc::channel(64);
    let err = cluster
        .job(job(zero.clone()).num_slots(2).events(tx))
        .build()
        .expect("the client cannot check a model it lacks")
        .fit(&df)
        .await
        .expect_err("embedding 0");
    match &err {
        JobError::Feed(e) => assert_eq!(e.code(), Some(tonic::Code::InvalidArgument), "{err}"),
        other => panic!("expected the agent's refusal, got {other}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("model `wide-and-deep`: config `embedding`: must be at least 1"),
        "{message}"
    );
    nothing_happened(&mut rx, "config refused by the agents");

    // The same config with the model linked: refused by build().
    match cluster.job(job(zero).num_slots(2)).models(registry()).build() {
        Err(JobError::Model(AgentError::Model(ModelError::Config { model, field, reason }))) => {
            assert_eq!((model.as_str(), field.as_str()), (MODEL, "embedding"));
            assert_eq!(reason, "must be at least 1");
        }
        other => panic!("expected a config error from build, got {other:?}"),
    }

    // A categorical column of the wrong type: the data's error, naming it.
    let doubles = city_df(&spark, 200, 2, "DOUBLE").await;
    let (tx, mut rx) = mpsc::channel(64);
    let err = cluster
        .job(job(custom(&config())).models(registry()).num_slots(2).events(tx))
        .build()
        .expect("job")
        .fit(&doubles)
        .await
        .expect_err("a Float64 categorical column");
    match &err {
        JobError::Data(SchemaError::WrongType { column, .. }) => assert_eq!(column, "city", "{err}"),
        other => panic!("expected a wrong-type error naming `city`, got {other}"),
    }
    nothing_happened(&mut rx, "wrong dtype");

    // None of the four reached an agent.
    assert_no_job_on_agents(&cluster, "after the refused jobs").await;
}
