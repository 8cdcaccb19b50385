//! The one map from errors to gRPC codes, checked.

use tonic::Code;

use super::*;

#[test]
fn codes_say_whose_fault_it_is() {
    let gap = AgentError::SequenceGap {
        producer: "p".into(),
        got: 3,
        expected: 1,
    };
    assert_eq!(Status::from(gap).code(), Code::InvalidArgument);
    assert_eq!(
        Status::from(AgentError::NoCheckpoint("j".into())).code(),
        Code::NotFound
    );
    assert_eq!(
        Status::from(AgentError::UnknownLayout).code(),
        Code::FailedPrecondition
    );
    assert_eq!(
        Status::from(AgentError::Unsupported("no")).code(),
        Code::Unimplemented
    );
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
    let timeout = AgentError::RendezvousTimeout {
        url: "http://rv".into(),
    };
    assert!(timeout.is_retryable());
}

/// An agent error travels through a Flight stream and leaves with its own
/// status; the caller's broken stream keeps the status it broke with.
#[test]
fn flight_errors_keep_the_status_they_carry() {
    let carried = FlightError::from(AgentError::BatchBeforeSchema);
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
