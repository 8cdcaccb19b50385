use super::*;
use crate::spec::Task;

fn spec() -> JobSpec {
    JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .features(["a"])
        .label("y")
        .build()
        .expect("valid")
}

#[test]
fn every_action_round_trips() {
    let actions = [
        Action::StartJob(StartJob {
            job_id: "j".into(),
            spec: spec(),
            rendezvous: "http://127.0.0.1:1".into(),
            initial_weights: None,
        }),
        Action::JobStatus(JobRef { job_id: "j".into() }),
        Action::CancelJob(CancelJob {
            job_id: "j".into(),
            reason: "user".into(),
        }),
        Action::EndOfData(EndOfData {
            job_id: "j".into(),
            split: Split::Eval,
            expected_rows: Some(5),
        }),
        Action::ReopenSplit(ReopenSplit {
            job_id: "j".into(),
            split: Split::Train,
            drop_producers: Vec::new(),
        }),
        Action::ReopenSplit(ReopenSplit {
            job_id: "j".into(),
            split: Split::Eval,
            drop_producers: vec!["shard-2".into()],
        }),
        Action::KeepRows(JobRef { job_id: "j".into() }),
        Action::ListJobs,
        Action::ServeModel(
            crate::model_serving::ServeModel::new(
                spec(),
                1,
                Vec::new(),
                &arrow::array::RecordBatch::new_empty(std::sync::Arc::new(arrow::datatypes::Schema::empty())),
            )
            .expect("serve"),
        ),
        Action::DropModel(DropModel {
            model_id: "linear-00".into(),
        }),
        Action::ServedModels,
    ];
    for a in actions {
        let f = a.to_flight();
        assert_eq!(Action::parse(&f.r#type, &f.body).expect("parses"), a);
    }
}

#[test]
fn bad_actions_are_named() {
    assert_eq!(
        Action::parse("train", b"{}"),
        Err(ActionError::Unknown("train".into()))
    );
    let err = Action::parse("job_status", b"{").expect_err("malformed");
    assert!(matches!(
        err,
        ActionError::MalformedBody {
            action: "job_status",
            ..
        }
    ));
    let err = Action::parse("job_status", br#"{"job_id":"a/b"}"#).expect_err("bad id");
    assert!(err.to_string().contains("invalid job id"), "{err}");
    let mut bad_spec = spec();
    bad_spec.epochs = 0;
    let body = serde_json::to_vec(&StartJob {
        job_id: "j".into(),
        spec: bad_spec,
        rendezvous: String::new(),
        initial_weights: None,
    })
    .expect("json");
    let err = Action::parse("start_job", &body).expect_err("bad spec");
    assert!(err.to_string().contains("`epochs`"), "{err}");
}

#[test]
fn initial_weights_come_exactly_with_init_from() {
    let pretrained = crate::spec::Pretrained {
        file: "/models/a.safetensors".into(),
        format: "safetensors".into(),
        sha256: "ab".repeat(32),
    };
    let start = |init_from: Option<crate::spec::Pretrained>, weights: Option<&str>| {
        let spec = JobSpec { init_from, ..spec() };
        let body = serde_json::to_vec(&StartJob {
            job_id: "j".into(),
            spec,
            rendezvous: "http://127.0.0.1:1".into(),
            initial_weights: weights.map(str::to_owned),
        })
        .expect("json");
        Action::parse("start_job", &body)
    };
    let err = start(Some(pretrained.clone()), None).expect_err("no weights");
    assert!(err.to_string().contains("`initial_weights` is absent"), "{err}");
    let err = start(None, Some("AAAA")).expect_err("no init_from");
    assert!(err.to_string().contains("no `init_from`"), "{err}");
    assert!(start(Some(pretrained.clone()), Some("AAAA")).is_ok());
    let short = crate::spec::Pretrained {
        sha256: "ab".into(),
        ..pretrained
    };
    let err = start(Some(short), Some("AAAA")).expect_err("bad hash");
    assert!(err.to_string().contains("init_from.sha256"), "{err}");
}

#[test]
fn status_round_trips() {
    let s = AgentJobStatus {
        job_id: "j".into(),
        agent_id: "a".into(),
        state: AgentJobState::Training,
        attempt: 2,
        rank: Some(1),
        world_size: 2,
        epoch: 3,
        epochs: 5,
        step: 10,
        steps_per_epoch: 20,
        loss: Some(0.5),
        rows_train: 100,
        rows_eval: 10,
        rows_trained_per_epoch: vec![100, 100],
        samples_per_sec: 1e4,
        cache_bytes_memory: 1,
        cache_bytes_disk: 2,
        history: vec![EpochMetrics {
            epoch: 1,
            train_loss: 0.7,
            rows: 100,
            eval_loss: Some(0.6),
            eval_accuracy: Some(0.9),
            samples_per_sec: 1e4,
            wall_secs: Some(1.5),
            learning_rate: None,
            ..Default::default()
        }],
        resumed_from_epoch: Some(2),
        resumed_from_step: Some(40),
        error: None,
        device: "cpu (flex)".into(),
        failed_attempts: vec![FailedAttempt {
            attempt: 1,
            cause: "peer b lost".into(),
        }],
        step_losses: vec![StepLoss {
            epoch: 1,
            step: 4,
            loss: 0.8,
        }],
        events: vec![JobEvent {
            seq: 1,
            at_ms: 1,
            level: EventLevel::Error,
            agent_id: "a".into(),
            rank: Some(1),
            attempt: 1,
            message: "attempt failed: peer b lost".into(),
        }],
        best_epoch: None,
        stopped_early: None,
    };
    let json = serde_json::to_string(&s).expect("json");
    assert!(json.contains(r#""level":"ERROR""#), "{json}");
    assert_eq!(serde_json::from_str::<AgentJobStatus>(&json).expect("parse"), s);
}
