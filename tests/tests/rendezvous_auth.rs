//! Auth and bad requests over real gRPC: missing or wrong token is
//! UNAUTHENTICATED; malformed requests get precise codes and change nothing.
#![allow(clippy::unwrap_used)]

use crate::rendezvous_common;

use kindling_schemas::auth::Token;
use kindling_schemas::rendezvous::{ClientError, JobConfig, RendezvousClient};
use rendezvous_common::{Fixture, agent_info, join_all, test_config};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_token_is_unauthenticated() {
    let fx = Fixture::start().await;
    let anonymous = RendezvousClient::connect(fx.server.url(), None).await.unwrap();
    let wrong = RendezvousClient::connect(fx.server.url(), Some(&Token::new("not-it")))
        .await
        .unwrap();
    for client in [&anonymous, &wrong] {
        let err = client.list_agents().await.unwrap_err();
        assert_eq!(err.code(), Some(Code::Unauthenticated), "{err}");
        let err = client.register(agent_info("intruder")).await.unwrap_err();
        assert_eq!(err.code(), Some(Code::Unauthenticated), "{err}");
        let err = client.watch("any").await.unwrap_err();
        assert_eq!(err.code(), Some(Code::Unauthenticated), "{err}");
    }
    // Nothing got in.
    assert!(fx.client.list_agents().await.unwrap().is_empty());
    fx.shutdown().await;
}

/// The status code of a refused call (`None` if it unexpectedly succeeded).
fn code<T>(r: Result<T, ClientError>) -> Option<Code> {
    r.err().and_then(|e| e.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_precise_codes_and_change_nothing() {
    let fx = Fixture::with_config(test_config().with_max_payload_bytes(1024)).await;
    let c = &fx.client;

    assert_eq!(code(c.status("nope").await), Some(Code::NotFound));
    assert_eq!(code(c.join("nope", 1, "a").await), Some(Code::NotFound));
    assert_eq!(
        code(c.create_job(&JobConfig::new("j", 0)).await),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        code(c.create_job(&JobConfig::new("", 1)).await),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        code(c.register(agent_info("")).await),
        Some(Code::InvalidArgument)
    );
    assert_eq!(code(c.heartbeat("ghost").await), Some(Code::NotFound));
    assert!(c.list_jobs().await.unwrap().is_empty());

    let _leases = fx.agents("bad", 2).await;
    let ids = vec!["bad-000".to_owned(), "bad-001".to_owned()];
    assert_eq!(
        c.create_job(&JobConfig::new("j", 2).with_spec_summary("{}"))
            .await
            .unwrap(),
        1
    );
    // Same parameters: idempotent. Different: ALREADY_EXISTS.
    assert_eq!(
        c.create_job(&JobConfig::new("j", 2).with_spec_summary("{}"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        code(c.create_job(&JobConfig::new("j", 3)).await),
        Some(Code::AlreadyExists)
    );
    assert_eq!(code(c.join("j", 0, "bad-000").await), Some(Code::InvalidArgument));
    assert_eq!(code(c.join("j", 1, "").await), Some(Code::InvalidArgument));
    assert_eq!(
        code(c.join("j", 2, "bad-000").await),
        Some(Code::FailedPrecondition)
    );
    assert_eq!(code(c.join("j", 1, "unregistered").await), Some(Code::NotFound));
    // Collectives before the gang formed: wrong state.
    assert_eq!(
        code(c.all_gather("j", 1, 0, 0, Vec::new()).await),
        Some(Code::FailedPrecondition)
    );

    join_all(c, "j", 1, &ids).await;
    assert_eq!(
        code(c.all_gather("j", 1, 2, 0, Vec::new()).await),
        Some(Code::InvalidArgument)
    );
    let err = c.all_gather("j", 1, 0, 0, vec![0u8; 1025]).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(
        err.to_string().contains("exceeds the maximum of 1024 bytes"),
        "{err}"
    );
    assert_eq!(
        code(c.all_gather("j", 1, 0, 5, Vec::new()).await),
        Some(Code::FailedPrecondition)
    );

    // None of the refused calls changed the job: the collective sequence still starts at 0.
    let status = c.status("j").await.unwrap();
    assert_eq!((status.attempt, status.failures.len()), (1, 0));
    let a = c.clone();
    let first = tokio::spawn(async move { a.all_gather("j", 1, 0, 0, b"x".to_vec()).await });
    let got = c.all_gather("j", 1, 1, 0, b"y".to_vec()).await.unwrap();
    assert_eq!(
        got.iter().map(|b| b.to_vec()).collect::<Vec<_>>(),
        vec![b"x".to_vec(), b"y".to_vec()]
    );
    first.await.unwrap().unwrap();
    fx.shutdown().await;
}
