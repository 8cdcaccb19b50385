//! Flight ingest into a real agent: exactly-once acks, schema refusal, spill, auth.

use std::sync::Arc;

use arrow::array::{Float64Array, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use kindling::feed::AgentClient;
use kindling_schemas::action::{Action, AgentJobState};
use kindling_schemas::descriptor::Split;
use kindling_schemas::spec::{JobSpec, ModelSpec, Task};
use kindling_tests::cluster::*;

fn spec(num_slots: u32) -> JobSpec {
    JobSpec::builder()
        .model(ModelSpec::Mlp { hidden: vec![8] })
        .task(Task::Classification { num_classes: 2 })
        .features(["x1", "x2"])
        .label("y")
        .num_slots(num_slots)
        .batch_size(64)
        .epochs(1)
        .build()
        .expect("spec")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_batch_is_acknowledged_as_duplicate_and_stored_once() {
    let (cluster, _dir) = cluster(1).await;
    start_job(&cluster, "dup", &spec(1), &[0]).await;
    let c = agent_client(&cluster, 0);
    let batches = [rule_batch(100, 1), rule_batch(50, 2)];
    let first = put(&c, "dup", Split::Train, "p", &batches).await.expect("first");
    assert_eq!(first.rows_committed, 150);
    // The producer retries the whole stream (it never saw the commit).
    let again = put(&c, "dup", Split::Train, "p", &batches).await.expect("again");
    assert_eq!(again.duplicate_batches, 2);
    assert_eq!(again.rows_committed, 150, "nothing stored twice");
    // And continues where it left off with a new batch.
    let more = {
        let mut w = c
            .put(
                &kindling_schemas::descriptor::DataPath::data("dup", Split::Train),
                "p",
                &rule_schema(),
                1 << 20,
            )
            .await
            .expect("open");
        for b in &batches {
            w.write(b).await.expect("dup write");
        }
        w.write(&rule_batch(25, 3)).await.expect("new write");
        w.finish().await.expect("finish")
    };
    assert_eq!(more.rows_committed, 175);
    assert_eq!(status(&c, "dup").await.rows_train, 175);
    assert_eq!(end_of_data(&c, "dup", Split::Train, Some(175)).await.rows, 175);
    // Retried after its reply was lost, once the job has trained: the same answer.
    assert_eq!(wait_done(&c, "dup").await.state, AgentJobState::Succeeded);
    assert_eq!(end_of_data(&c, "dup", Split::Train, Some(175)).await.rows, 175);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_schema_or_bad_values_are_refused_naming_the_column_and_store_nothing() {
    let (cluster, _dir) = cluster(1).await;
    start_job(&cluster, "bad", &spec(1), &[0]).await;
    let c = agent_client(&cluster, 0);

    let string_feature = Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Utf8, true),
        Field::new("x2", DataType::Float64, true),
        Field::new("y", DataType::Int32, true),
    ]));
    let b = RecordBatch::try_new(
        string_feature,
        vec![
            Arc::new(StringArray::from(vec!["a"])),
            Arc::new(Float64Array::from(vec![1.0])),
            Arc::new(Int32Array::from(vec![1])),
        ],
    )
    .expect("batch");
    let err = put(&c, "bad", Split::Train, "p", &[b])
        .await
        .expect_err("string feature");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    assert!(err.to_string().contains("`x1`"), "{err}");

    let null_label = RecordBatch::try_new(
        rule_schema(),
        vec![
            Arc::new(Float64Array::from(vec![0.5, 0.1])),
            Arc::new(arrow::array::Float32Array::from(vec![0.5, 0.2])),
            Arc::new(Int32Array::from(vec![Some(1), None])),
        ],
    )
    .expect("batch");
    // A good batch first: it must be dropped with the stream.
    let err = put(&c, "bad", Split::Train, "p", &[rule_batch(10, 1), null_label])
        .await
        .expect_err("null label");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    assert!(
        err.to_string().contains("`y`") && err.to_string().contains("null"),
        "{err}"
    );

    let s = status(&c, "bad").await;
    assert_eq!(
        (s.rows_train, s.cache_bytes_memory, s.cache_bytes_disk),
        (0, 0, 0),
        "nothing stored"
    );
    // The producer can start over cleanly.
    assert_eq!(
        put(&c, "bad", Split::Train, "p", &[rule_batch(10, 1)])
            .await
            .expect("clean")
            .rows_committed,
        10
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_bigger_than_the_budget_spills_and_still_trains() {
    let budget = 128 << 10;
    let (cluster, _dir) = cluster_with_budget(1, budget).await;
    let mut s = spec(1);
    s.epochs = 2;
    start_job(&cluster, "spill", &s, &[0]).await;
    let c = agent_client(&cluster, 0);
    let batches: Vec<_> = (0..40).map(|i| rule_batch(4000, i)).collect();
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    assert!(bytes as u64 > 8 * budget, "shard must dwarf the budget");
    put(&c, "spill", Split::Train, "p", &batches).await.expect("put");
    let before = status(&c, "spill").await;
    assert!(
        before.cache_bytes_memory <= budget,
        "memory {} over budget {budget}",
        before.cache_bytes_memory
    );
    assert!(before.cache_bytes_disk > 0, "nothing spilled");
    end_of_data(&c, "spill", Split::Train, Some(160_000)).await;
    let done = wait_done(&c, "spill").await;
    assert_eq!(done.state, AgentJobState::Succeeded, "{done:#?}");
    assert_eq!(done.rows_trained_per_epoch, vec![160_000, 160_000]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_token_or_for_unknown_jobs_are_refused() {
    let (cluster, _dir) = cluster(1).await;
    let url = cluster.agent_url(0).expect("agent");
    let anonymous = AgentClient::connect(&url, None).expect("client");
    let err = anonymous
        .action::<serde_json::Value>(&Action::ListJobs)
        .await
        .expect_err("no token");
    assert_eq!(err.code(), Some(tonic::Code::Unauthenticated));
    let wrong =
        AgentClient::connect(&url, Some(&kindling_schemas::auth::Token::new("nope"))).expect("client");
    let err = wrong
        .action::<serde_json::Value>(&Action::ListJobs)
        .await
        .expect_err("bad token");
    assert_eq!(err.code(), Some(tonic::Code::Unauthenticated));

    let c = agent_client(&cluster, 0);
    let err = c.job_status("ghost").await.expect_err("unknown job");
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    assert!(err.to_string().contains("ghost"));
    let err = put(&c, "ghost", Split::Train, "p", &[rule_batch(3, 1)])
        .await
        .expect_err("unknown job put");
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    // A job never created at the rendezvous is refused when it is started,
    // naming the job and the rendezvous, and nothing of it stays here.
    let err = c
        .start_job("never-created", &spec(1), &cluster.rendezvous_url())
        .await
        .expect_err("start of a job the rendezvous does not know");
    assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("never-created") && text.contains(&cluster.rendezvous_url()),
        "{text}"
    );
    let err = c.job_status("never-created").await.expect_err("no job kept");
    assert_eq!(err.code(), Some(tonic::Code::NotFound));
    cluster.shutdown().await;
}

/// A model the agent has not registered, or a config its model refuses, is
/// refused at `start_job` (before any row), naming the model, what the agent
/// has or the field; nothing of the job stays on the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_job_refuses_unregistered_models_and_bad_configs() {
    let (cluster, _dir) = cluster(1).await;
    let c = agent_client(&cluster, 0);
    let rv =
        kindling_schemas::rendezvous::RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
            .await
            .expect("rendezvous");
    let agents = rv.list_agents().await.expect("agents");
    assert_eq!(
        agents[0].models,
        ["cnn", "linear", "mlp"],
        "agents advertise their models"
    );
    let cases = [
        (
            ModelSpec::custom("wide-and-deep", &serde_json::json!({})).expect("custom"),
            ["`wide-and-deep` is not registered", "cnn, linear, mlp"],
        ),
        (
            ModelSpec::Custom {
                name: "mlp".into(),
                config: serde_json::json!({"hidden": "wide"}),
            },
            ["model `mlp`", "config `<json>`"],
        ),
    ];
    for (i, (model, needles)) in cases.into_iter().enumerate() {
        let job_id = format!("bad-model-{i}");
        rv.create_job(&kindling_schemas::rendezvous::JobConfig::new(job_id.clone(), 1))
            .await
            .expect("create");
        let spec = JobSpec { model, ..spec(1) };
        let err = c
            .start_job(&job_id, &spec, &cluster.rendezvous_url())
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
        for needle in needles {
            assert!(err.to_string().contains(needle), "{err} should say {needle}");
        }
        let err = c.job_status(&job_id).await.expect_err("no job kept");
        assert_eq!(err.code(), Some(tonic::Code::NotFound));
    }
    cluster.shutdown().await;
}

/// `create_job` creates the job at the agent's rendezvous (Flight-only
/// clients need no gRPC stubs); an agent registered nowhere, or a bad slot
/// count, is refused naming what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_job_goes_to_the_agents_rendezvous_or_says_what_is_missing() {
    let (cluster, dir) = cluster(1).await;
    let c = agent_client(&cluster, 0);
    let created = c.create_job("made-over-flight", 1).await.expect("create");
    assert_eq!(
        (created.attempt, created.rendezvous.as_str()),
        (1, cluster.rendezvous_url().as_str())
    );
    let rv =
        kindling_schemas::rendezvous::RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
            .await
            .expect("rendezvous");
    assert_eq!(rv.status("made-over-flight").await.expect("status").num_slots, 1);
    let err = c
        .action::<serde_json::Value>(&Action::CreateJob(kindling_schemas::action::CreateJob {
            job_id: "zero".into(),
            num_slots: 0,
            max_attempts: 0,
            gang_timeout_ms: None,
            rendezvous: None,
        }))
        .await
        .expect_err("no slots");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    assert!(err.to_string().contains("num_slots"), "{err}");

    let mut config = kindling_agent::AgentConfig::local("standalone", dir.path().join("standalone"));
    config.token = cluster.token().cloned();
    let standalone = kindling_agent::start(config).await.expect("standalone agent");
    let s = AgentClient::connect(standalone.url(), cluster.token()).expect("client");
    let err = s.create_job("nowhere", 1).await.expect_err("no rendezvous");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    assert!(err.to_string().contains("pass `rendezvous`"), "{err}");
    standalone.shutdown_and_wait().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_holds_at_most_max_jobs_unfinished_jobs_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = kindling::local::LocalClusterConfig::new(dir.path());
    config.max_jobs = 2;
    let cluster = kindling::local::LocalCluster::start(1, config)
        .await
        .expect("cluster");
    let rv =
        kindling_schemas::rendezvous::RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
            .await
            .expect("rendezvous");
    for job in ["cap-a", "cap-b", "cap-c"] {
        rv.create_job(&kindling_schemas::rendezvous::JobConfig::new(job, 1))
            .await
            .expect("create job");
    }
    let c = agent_client(&cluster, 0);
    start_on(&cluster, 0, "cap-a", &spec(1)).await;
    start_on(&cluster, 0, "cap-b", &spec(1)).await;
    let refused = c
        .start_job("cap-c", &spec(1), &cluster.rendezvous_url())
        .await
        .expect_err("a third unfinished job");
    assert_eq!(refused.code(), Some(tonic::Code::ResourceExhausted), "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("already holds 2 unfinished job(s)") && text.contains("--max-jobs"),
        "{text}"
    );
    assert!(
        c.job_status("cap-c").await.is_err(),
        "the refused job left nothing"
    );
    // Restarting a job the agent already runs is not a new job.
    start_on(&cluster, 0, "cap-a", &spec(1)).await;
    // A finished job frees its place.
    c.cancel_job("cap-b", "making room").await.expect("cancel");
    start_on(&cluster, 0, "cap-c", &spec(1)).await;
    let taken = status(&c, "cap-c").await;
    assert!(!taken.state.is_terminal(), "the third job runs now: {taken:#?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_message_over_the_cap_is_refused_naming_it_and_stores_nothing() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    let (cluster, _dir) = cluster(1).await;
    start_job(&cluster, "big-msg", &spec(1), &[0]).await;
    let url = cluster.agent_url(0).expect("agent");
    let channel = kindling_schemas::channel::ChannelConfig::default()
        .dial(&url, true)
        .expect("dial")
        .connect_lazy();
    let attach = kindling_schemas::auth::BearerAttach::new(cluster.token()).expect("token");
    // The client would send it: only the agent's cap stands in the way.
    let mut raw =
        FlightServiceClient::with_interceptor(channel, attach).max_encoding_message_size(usize::MAX);
    // 4.5 M rows of 16 bytes: one 72 MB message, over the 64 MiB default.
    let big = rule_batch(4_500_000, 1);
    let messages =
        kindling_fixtures::put_messages("big-msg", Split::Train, "p", &rule_schema(), std::iter::once(big));
    let refused = match raw.do_put(messages).await {
        Err(status) => status,
        Ok(acks) => {
            let mut acks = acks.into_inner();
            loop {
                match futures::StreamExt::next(&mut acks).await {
                    Some(Err(status)) => break status,
                    Some(Ok(_)) => continue,
                    None => panic!("a 72 MB message was taken"),
                }
            }
        }
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert!(refused.message().contains("--max-message-bytes"), "{refused}");
    let c = agent_client(&cluster, 0);
    assert_eq!(status(&c, "big-msg").await.rows_train, 0, "nothing stored");
    // The job takes batches of the right size afterwards.
    let ok = put(&c, "big-msg", Split::Train, "p", &[rule_batch(100, 2)])
        .await
        .expect("small put");
    assert_eq!(ok.rows_committed, 100);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_is_removed_with_its_files_after_the_retention() {
    let (cluster, dir) = cluster_with(1, |c| c.finished_retention = std::time::Duration::from_secs(2)).await;
    let mut done_spec = spec(1);
    done_spec.checkpoint = kindling_schemas::spec::CheckpointPolicy {
        every_epochs: 1,
        keep_last: 1,
        ..Default::default()
    };
    start_job(&cluster, "done", &done_spec, &[0]).await;
    start_job(&cluster, "open", &spec(1), &[0]).await;
    let c = agent_client(&cluster, 0);
    put(&c, "done", Split::Train, "p", &[rule_batch(200, 1)])
        .await
        .expect("put");
    // A small budget would spill; here the rows stay in memory, the checkpoint is on disk.
    end_of_data(&c, "done", Split::Train, Some(200)).await;
    // The checkpoint is looked for at every poll until the job is done: the
    // retention runs from the end, and a loaded machine may poll late.
    let agent_id = status(&c, "done").await.agent_id;
    let checkpoints = dir.path().join("checkpoints").join(&agent_id).join("done");
    let seen = std::cell::Cell::new(false);
    let done = wait_until(&c, "done", std::time::Duration::from_secs(300), |s| {
        seen.set(seen.get() || checkpoints.exists());
        s.state.is_terminal()
    })
    .await;
    assert_eq!(done.state, AgentJobState::Succeeded);
    assert!(seen.get(), "a checkpoint was written");

    // Gone after the retention: status, rows, files. Polled, with a bound.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let gone = loop {
        match c.job_status("done").await {
            Err(e) => break e,
            Ok(_) => {
                assert!(std::time::Instant::now() < deadline, "never removed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    assert!(gone.to_string().contains("done"), "{gone}");
    assert!(!checkpoints.exists(), "its checkpoints went with it");
    assert!(
        !dir.path()
            .join("spill")
            .join(&done.agent_id)
            .join("done")
            .exists()
    );
    // A job that has not finished stays, whatever its age.
    assert_eq!(status(&c, "open").await.state, AgentJobState::Ingesting);
    cluster.shutdown().await;
}

/// One producer credential's worth of hostile staging: a stream held open
/// and never committed, then another pushing past the job's staging cap.
/// The second is refused (RESOURCE_EXHAUSTED) once the job's uncommitted
/// bytes reach the cap; staged bytes past half the memory budget went to
/// disk, not memory; the quiet stream is ended after the idle bound and all
/// it staged is freed; another job on the agent trains to the end meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_is_capped_per_job_spills_past_half_the_budget_and_quiet_streams_end() {
    const BUDGET: u64 = 4 << 20;
    const CAP: u64 = 6 << 20;
    let (cluster, _dir) = cluster_with(1, |c| {
        c.memory_budget = BUDGET;
        c.staging = kindling_agent::cache::StagingLimits {
            max_staged_bytes: Some(CAP),
            // Long enough that a loaded machine does not end the held
            // stream before the checks below; the test waits it out at the end.
            stream_idle: std::time::Duration::from_secs(15),
            stream_max_age: std::time::Duration::from_secs(3600),
            ..Default::default()
        };
    })
    .await;
    start_job(&cluster, "hostile", &spec(1), &[0]).await;
    start_job(&cluster, "honest", &spec(1), &[0]).await;
    let c = agent_client(&cluster, 0);
    let path = kindling_schemas::descriptor::DataPath::data("hostile", Split::Train);
    let batch = rule_batch(40_000, 1); // ~0.5 MiB of values
    let one = kindling_schemas::schema::batch_bytes(&batch);

    // A stream that stages about two thirds of the cap and stays open.
    let mut held = c
        .put(&path, "held", &batch.schema(), 64 << 20)
        .await
        .expect("open");
    let mut sent = 0u64;
    while sent < CAP * 2 / 3 {
        held.write(&batch).await.expect("staged below the cap");
        sent += one;
    }
    // Every batch of it staged before the next stream starts (else the two
    // race for the cap, and the held one may be the one refused).
    wait_until(&c, "hostile", std::time::Duration::from_secs(60), |s| {
        s.cache_bytes_memory + s.cache_bytes_disk >= sent
    })
    .await;
    // Another stream of the same job runs into the cap.
    let mut pushy = c
        .put(&path, "pushy", &batch.schema(), 64 << 20)
        .await
        .expect("open");
    let refused = loop {
        if let Err(e) = pushy.write(&batch).await {
            break e;
        }
    };
    assert_eq!(refused.code(), Some(tonic::Code::ResourceExhausted), "{refused}");
    assert!(refused.to_string().contains("the cap is"), "{refused}");
    let s = status(&c, "hostile").await;
    assert!(
        s.cache_bytes_memory <= BUDGET / 2 + one,
        "staging took {} bytes of memory, past half the budget ({})",
        s.cache_bytes_memory,
        BUDGET / 2
    );
    assert!(
        s.cache_bytes_disk > 0,
        "nothing past half the budget spilled: {s:?}"
    );

    // Another job on the agent trains to the end beside the held stream.
    let honest = agent_client(&cluster, 0);
    put(&honest, "honest", Split::Train, "p", &[rule_batch(2000, 2)])
        .await
        .expect("the honest job's rows");
    end_of_data(&honest, "honest", Split::Train, Some(2000)).await;
    assert_eq!(wait_done(&honest, "honest").await.state, AgentJobState::Succeeded);

    // The held stream goes quiet: it is ended and what it staged freed.
    let freed = wait_until(&c, "hostile", std::time::Duration::from_secs(60), |s| {
        s.cache_bytes_memory + s.cache_bytes_disk == 0
    })
    .await;
    assert_eq!(freed.rows_train, 0, "nothing was committed");
    let ended = held.finish().await.expect_err("the quiet stream was ended");
    assert_eq!(ended.code(), Some(tonic::Code::DeadlineExceeded), "{ended}");
    assert!(ended.to_string().contains("sent or read nothing"), "{ended}");
    // The job takes rows again, from a producer that finishes its stream.
    let ok = put(&c, "hostile", Split::Train, "calm", &[rule_batch(100, 3)])
        .await
        .expect("a stream that commits");
    assert_eq!(ok.rows_committed, 100);
    cluster.shutdown().await;
}
