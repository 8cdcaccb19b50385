//! The one map from errors to gRPC codes, checked: every room's error keeps
//! the code and retry rule it had when one 100-line match gave them.

use std::time::Duration;

use kindling_schemas::credential::Role;
use kindling_schemas::descriptor::Split;
use tonic::Code;

use super::*;

fn code(e: impl Into<AgentError>) -> Code {
    Status::from(e.into()).code()
}

#[test]
fn codes_say_whose_fault_it_is() {
    let gap = IngestError::SequenceGap {
        producer: "p".into(),
        got: 3,
        expected: 1,
    };
    assert_eq!(Status::from(AgentError::from(gap)).code(), Code::InvalidArgument);
    assert_eq!(code(JobStateError::NoCheckpoint("j".into())), Code::NotFound);
    assert_eq!(code(JobStateError::UnknownLayout), Code::FailedPrecondition);
    assert_eq!(code(RequestError::Unsupported("no")), Code::Unimplemented);
    let refused = AgentError::rendezvous(
        "http://rv",
        ClientError::rpc("join")(Status::unauthenticated("no")),
    );
    assert!(!refused.is_retryable());
    assert_eq!(Status::from(refused).code(), Code::Unavailable);
    let exists = AgentError::rendezvous(
        "http://rv",
        ClientError::rpc("create_job")(Status::already_exists("job `j` already exists")),
    );
    assert_eq!(
        Status::from(exists).code(),
        Code::AlreadyExists,
        "the caller's own mistake keeps its code"
    );
    let down = AgentError::rendezvous("http://rv", ClientError::rpc("join")(Status::unavailable("down")));
    assert!(down.is_retryable());
    let timeout = AgentError::from(RendezvousError::Timeout {
        url: "http://rv".into(),
    });
    assert!(timeout.is_retryable());
}

/// An agent error travels through a Flight stream and leaves with its own
/// status; the caller's broken stream keeps the status it broke with.
#[test]
fn flight_errors_keep_the_status_they_carry() {
    let carried = FlightError::from(AgentError::from(IngestError::BatchBeforeSchema));
    let status = Status::from(AgentError::from(carried));
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("record batch before schema"),
        "{status}"
    );
    let broken = FlightError::Tonic(Box::new(Status::cancelled("gone")));
    let status = Status::from(AgentError::from(broken));
    assert_eq!((status.code(), status.message()), (Code::Cancelled, "gone"));
    let malformed = Status::from(AgentError::from(FlightError::protocol("bad header")));
    assert_eq!(malformed.code(), Code::InvalidArgument);
}

#[test]
fn the_call_and_its_streams_are_the_callers_input() {
    let path = || PathError::UnknownPath(vec!["x".into()]);
    let weights = || WeightsError::NotIpc(arrow::error::ArrowError::ComputeError("x".into()));
    let action = || ActionError::Unknown("x".into());
    let cases: Vec<(AgentError, Code)> = vec![
        (
            RequestError::EmptyStream { call: "DoPut" }.into(),
            Code::InvalidArgument,
        ),
        (
            RequestError::NoDescriptor { call: "DoPut" }.into(),
            Code::InvalidArgument,
        ),
        (path().into(), Code::InvalidArgument),
        (
            RequestError::WrongPath {
                call: "DoPut",
                expected: "[job_id, train|eval]",
                got: vec![],
            }
            .into(),
            Code::InvalidArgument,
        ),
        (RequestError::NotAModel(vec![]).into(), Code::InvalidArgument),
        (weights().into(), Code::InvalidArgument),
        (
            RequestError::ServedModelId {
                given: "a".into(),
                content: "b".into(),
            }
            .into(),
            Code::InvalidArgument,
        ),
        (RequestError::NoSchema(vec![]).into(), Code::InvalidArgument),
        (action().into(), Code::InvalidArgument),
        (InvalidToken.into(), Code::InvalidArgument),
        (RequestError::Unsupported("no").into(), Code::Unimplemented),
        (AgentError::caller_stream(&Status::data_loss("x")), Code::DataLoss),
        (MetadataError::Missing.into(), Code::InvalidArgument),
        (
            IngestError::PutStreamBroke(Box::new(Status::resource_exhausted("big"))).into(),
            Code::ResourceExhausted,
        ),
        (
            IngestError::PutStreamBroke(Box::new(Status::unknown("reset"))).into(),
            Code::InvalidArgument,
        ),
        (
            IngestError::MalformedFlight(FlightError::protocol("x")).into(),
            Code::InvalidArgument,
        ),
        (IngestError::BatchBeforeSchema.into(), Code::InvalidArgument),
        (
            SchemaError::MissingColumn {
                column: "c".into(),
                role: "feature",
            }
            .into(),
            Code::InvalidArgument,
        ),
        (
            IngestError::LayoutMismatch {
                stream: vec![],
                job: vec![],
            }
            .into(),
            Code::InvalidArgument,
        ),
        (IngestError::ProducerGone.into(), Code::InvalidArgument),
        (
            IngestError::RowCountMismatch {
                job_id: "j".into(),
                split: Split::Train,
                committed: 1,
                expected: 2,
            }
            .into(),
            Code::FailedPrecondition,
        ),
    ];
    check(cases);
}

#[test]
fn caps_jobs_and_training_keep_their_codes() {
    let cases: Vec<(AgentError, Code)> = vec![
        (
            LimitError::StagingFull {
                job_id: "j".into(),
                staged: 2,
                cap: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::TooManyStreams {
                job_id: "j".into(),
                role: Role::Producer,
                cap: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::TooManyJobs {
                agent_id: "a".into(),
                active: 1,
                cap: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::TooManyModels {
                agent_id: "a".into(),
                cap: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::MessageTooLarge { message: "x".into() }.into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::StreamIdle {
                call: "DoPut",
                idle: Duration::from_secs(1),
                dropped: "",
            }
            .into(),
            Code::DeadlineExceeded,
        ),
        (
            LimitError::StreamTooOld {
                call: "DoPut",
                max_age: Duration::from_secs(1),
                dropped: "",
            }
            .into(),
            Code::DeadlineExceeded,
        ),
        (JobStateError::UnknownJob("j".into()).into(), Code::NotFound),
        (
            JobStateError::UnknownModel {
                agent_id: "a".into(),
                model_id: "m".into(),
            }
            .into(),
            Code::NotFound,
        ),
        (
            JobStateError::NoDataset {
                job_id: "j".into(),
                dataset: "d".into(),
                agent_id: "a".into(),
            }
            .into(),
            Code::Unavailable,
        ),
        (
            JobStateError::Dataset {
                job_id: "j".into(),
                dataset: "d".into(),
                reason: "r".into(),
            }
            .into(),
            Code::FailedPrecondition,
        ),
        (
            AgentError::wrong_state("j", AgentJobState::Training, "r"),
            Code::FailedPrecondition,
        ),
        (
            JobStateError::NoCredentialKey { agent_id: "a".into() }.into(),
            Code::FailedPrecondition,
        ),
        (JobStateError::Cancelled("x".into()).into(), Code::Cancelled),
        (NoGpu::NotBuilt.into(), Code::FailedPrecondition),
        (TrainingError::NoData.into(), Code::FailedPrecondition),
        (
            TrainingError::Diverged {
                loss: f64::NAN,
                epoch: 1,
                step: 2,
            }
            .into(),
            Code::Internal,
        ),
        (TrainingError::OptimizerState("x".into()).into(), Code::Internal),
        (
            ModelError::TooLarge {
                model: "m".into(),
                params: 2,
                cap: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (ModelError::Table("x".into()).into(), Code::InvalidArgument),
        (
            ModelError::MissingColumn("x".into()).into(),
            Code::InvalidArgument,
        ),
    ];
    check(cases);
}

#[test]
fn the_rendezvous_ring_and_the_agent_itself_keep_their_codes() {
    let io = || std::io::Error::other("disk");
    let cases: Vec<(AgentError, Code)> = vec![
        (RendezvousError::NoRendezvous.into(), Code::InvalidArgument),
        (
            RendezvousError::NotAtRendezvous {
                job_id: "j".into(),
                rendezvous: "http://rv".into(),
            }
            .into(),
            Code::NotFound,
        ),
        (
            RendezvousError::WorldMismatch {
                job_id: "j".into(),
                spec: 1,
                job: 2,
                hint: "",
            }
            .into(),
            Code::InvalidArgument,
        ),
        (
            AgentError::rendezvous("http://rv", ClientError::InvalidToken(InvalidToken)),
            Code::InvalidArgument,
        ),
        (
            AgentError::rendezvous("http://rv", ClientError::rpc("status")(Status::not_found("j"))),
            Code::NotFound,
        ),
        (
            AgentError::rendezvous(
                "http://rv",
                ClientError::Malformed {
                    op: "join",
                    detail: "x".into(),
                },
            ),
            Code::Unavailable,
        ),
        (
            SpillError::Full {
                dir: "/tmp".into(),
                needed: 1,
                source: io(),
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (SpillError::Empty("/tmp/x".into()).into(), Code::Internal),
        (
            CheckpointError::Truncated {
                part: "the weights".into(),
                claimed: 9,
                left: 1,
            }
            .into(),
            Code::Internal,
        ),
        (AgentError::io("writing", io()), Code::Internal),
        (
            AgentError::arrow(arrow::error::ArrowError::ComputeError("x".into())),
            Code::Internal,
        ),
        (
            InternalError::ResponseJson(serde_json::from_str::<u8>("x").expect_err("not JSON")).into(),
            Code::Internal,
        ),
        (
            RingRefusal::ShuttingDown { job_id: "j".into() }.into(),
            Code::Unavailable,
        ),
        (
            RingRefusal::Fenced {
                job_id: "j".into(),
                attempt: 1,
                current: 2,
            }
            .into(),
            Code::FailedPrecondition,
        ),
        (
            RingRefusal::TooManyUnjoined {
                job_id: "j".into(),
                held: 64,
                cap: 64,
                ttl: Duration::from_secs(60),
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            RingRefusal::AlreadyOpen {
                from_rank: 0,
                job_id: "j".into(),
                attempt: 1,
            }
            .into(),
            Code::AlreadyExists,
        ),
        (
            RingRefusal::JobNotHere { job_id: "j".into() }.into(),
            Code::PermissionDenied,
        ),
    ];
    check(cases);
}

#[tokio::test]
async fn a_panicked_task_is_the_agents_own_failure() {
    let task = tokio::spawn(std::future::pending::<()>());
    task.abort();
    let e = task
        .await
        .map_err(AgentError::panicked("the test task"))
        .expect_err("aborted");
    assert!(e.to_string().starts_with("the test task panicked: "), "{e}");
    assert_eq!(Status::from(e).code(), Code::Internal);
}

/// Each error leaves with its code and its own message; only a failed
/// attempt, a broken peer and some rendezvous failures are retried.
fn check(cases: Vec<(AgentError, Code)>) {
    for (e, want) in cases {
        let (msg, retryable) = (e.to_string(), e.is_retryable());
        assert!(!retryable, "{msg}");
        let status = Status::from(e);
        assert_eq!((status.code(), status.message()), (want, msg.as_str()));
    }
}

#[test]
fn the_ring_refusal_messages_are_the_ones_peers_read() {
    let too_many = RingRefusal::TooManyUnjoined {
        job_id: "j".into(),
        held: 64,
        cap: 64,
        ttl: Duration::from_secs(60),
    };
    assert_eq!(
        too_many.to_string(),
        "ring connection for job `j` refused: this agent is not in that job and already holds \
         64 connections for jobs it is not in (the cap is 64, each kept for 60s)"
    );
    let too_large = Status::from(LimitError::MessageTooLarge {
        message: "message length too large: found 9 bytes, the limit is: 4 bytes".into(),
    });
    assert_eq!(
        too_large.message(),
        "a Flight message over this agent's cap (--max-message-bytes, KINDLING_MAX_MESSAGE_BYTES): \
         message length too large: found 9 bytes, the limit is: 4 bytes; send smaller record batches"
    );
}
