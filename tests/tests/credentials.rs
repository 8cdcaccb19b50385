//! Job-scoped credentials against a real rendezvous and agent: a producer
//! credential puts rows into its job and does nothing else, a reader reads
//! its job's model, a tampered or expired one is refused, and an agent whose
//! operator token was rotated still takes the job's credentials.

use std::time::Duration;

use kindling::feed::AgentClient;
use kindling_schemas::action::{Action, CredentialResponse, IssueCredential};
use kindling_schemas::auth::Token;
use kindling_schemas::credential::{Claims, CredentialKey, Role};
use kindling_schemas::descriptor::Split;
use kindling_tests::cluster::*;
use tonic::Code;

const KEY: &[u8] = b"credentials-test-key-0123456789abcdef";

async fn issue(operator: &AgentClient, job_id: &str, role: Role) -> Token {
    let r: CredentialResponse = operator
        .action(&Action::IssueCredential(IssueCredential {
            job_id: job_id.into(),
            role,
            ttl_secs: 600,
        }))
        .await
        .expect("issue_credential");
    assert_eq!((r.job_id.as_str(), r.role), (job_id, role));
    Token::new(r.credential)
}

fn code(e: &kindling::feed::FeedError) -> Option<Code> {
    e.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_credential_puts_into_its_job_and_does_nothing_else() {
    let (cluster, _dir) =
        cluster_with(1, |c| c.credentials = Some(CredentialKey::new(KEY).expect("key"))).await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    start_job(&cluster, "a", &linear_spec(1), &[0]).await;
    start_job(&cluster, "b", &linear_spec(1), &[0]).await;
    let producer =
        AgentClient::connect(&url, Some(&issue(&operator, "a", Role::Producer).await)).expect("client");

    // Its job: rows in, and its status.
    let ok = put(&producer, "a", Split::Train, "p", &[rule_batch(100, 1)])
        .await
        .expect("put into a");
    assert_eq!(ok.rows_committed, 100);
    assert_eq!(
        producer.job_status("a").await.expect("status of a").rows_train,
        100
    );
    // Nothing else.
    let denied = |what: &str, e: kindling::feed::FeedError| {
        assert_eq!(code(&e), Some(Code::PermissionDenied), "{what}: {e}");
        assert!(
            e.to_string().contains("producer credential for job `a`"),
            "{what}: {e}"
        );
    };
    denied(
        "put into b",
        put(&producer, "b", Split::Train, "p", &[rule_batch(10, 2)])
            .await
            .expect_err("b"),
    );
    denied(
        "status of b",
        producer.job_status("b").await.expect_err("status of b"),
    );
    denied(
        "cancel a",
        producer.cancel_job("a", "no").await.expect_err("cancel"),
    );
    denied(
        "start",
        producer
            .start_job("a", &linear_spec(1), &cluster.rendezvous_url())
            .await
            .expect_err("start"),
    );
    denied(
        "end_of_data",
        producer
            .end_of_data("a", Split::Train, Some(100))
            .await
            .expect_err("end_of_data"),
    );
    denied(
        "list jobs",
        producer
            .action::<serde_json::Value>(&Action::ListJobs)
            .await
            .expect_err("list"),
    );
    denied(
        "issue itself more",
        producer
            .action::<CredentialResponse>(&Action::IssueCredential(IssueCredential {
                job_id: "a".into(),
                role: Role::Reader,
                ttl_secs: 60,
            }))
            .await
            .expect_err("issue"),
    );
    denied(
        "read a's model",
        producer.fetch_model("a").await.expect_err("model"),
    );
    // Not the collective (a producer is no ring peer), not the rendezvous (operator only).
    let cred = issue(&operator, "a", Role::Producer).await;
    let (answer, _) =
        kindling_tests::ring::say_hello(&url, &kindling_tests::ring::hello("a", 1, 0, Some(cred.expose())))
            .await;
    let e = answer.expect_err("collective");
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    let rv = kindling_schemas::rendezvous::RendezvousClient::connect(cluster.rendezvous_url(), Some(&cred))
        .await
        .expect("dial");
    let e = rv.list_jobs().await.expect_err("rendezvous");
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    // The operator still sees b untouched and a with its rows.
    assert_eq!(operator.job_status("b").await.expect("b").rows_train, 0);

    // A reader credential reads the trained model, and cannot put.
    end_of_data(&operator, "a", Split::Train, Some(100)).await;
    wait_done(&operator, "a").await;
    let reader =
        AgentClient::connect(&url, Some(&issue(&operator, "a", Role::Reader).await)).expect("client");
    assert!(
        reader
            .fetch_model("a")
            .await
            .expect("reader reads the model")
            .num_rows()
            > 0
    );
    let e = put(&reader, "a", Split::Train, "p2", &[rule_batch(5, 3)])
        .await
        .expect_err("reader put");
    assert_eq!(code(&e), Some(Code::PermissionDenied), "{e}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_expired_and_foreign_credentials_are_unauthenticated() {
    let key = CredentialKey::new(KEY).expect("key");
    let (cluster, _dir) = cluster_with(1, |c| c.credentials = Some(key.clone())).await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    start_job(&cluster, "a", &linear_spec(1), &[0]).await;
    let good = issue(&operator, "a", Role::Producer).await;
    let expired = key.sign(&Claims {
        job_id: "a".into(),
        role: Role::Producer,
        expires: 1,
    });
    let mut tampered = good.expose().to_owned();
    let last = tampered.pop().expect("char");
    tampered.push(if last == '0' { '1' } else { '0' });
    let foreign = CredentialKey::new(b"some-other-cluster-key-0123456789")
        .expect("key")
        .issue("a", Role::Producer, Duration::from_secs(60));
    for (what, token, words) in [
        ("expired", expired, "expired"),
        ("tampered", tampered, "signature"),
        ("another cluster's", foreign, "signature"),
    ] {
        let client = AgentClient::connect(&url, Some(&Token::new(token))).expect("client");
        let e = put(&client, "a", Split::Train, "p", &[rule_batch(10, 1)])
            .await
            .expect_err(what);
        assert_eq!(code(&e), Some(Code::Unauthenticated), "{what}: {e}");
        assert!(e.to_string().contains(words), "{what}: {e}");
    }
    assert_eq!(
        operator.job_status("a").await.expect("a").rows_train,
        0,
        "nothing got in"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_operator_token_leaves_job_credentials_valid() {
    // The same credential key (its own Secret), two operator tokens: before
    // and after a rotation.
    let key = CredentialKey::new(KEY).expect("key");
    let (before, _d1) = cluster_with(1, |c| {
        c.credentials = Some(key.clone());
        c.token = Some(Token::new("operator-token-before"));
    })
    .await;
    let credential = issue(&agent_client(&before, 0), "a", Role::Producer).await;
    before.shutdown().await;
    let (after, _d2) = cluster_with(1, |c| {
        c.credentials = Some(key.clone());
        c.token = Some(Token::new("operator-token-after"));
    })
    .await;
    start_job(&after, "a", &linear_spec(1), &[0]).await;
    let url = after.agent_url(0).expect("agent");
    let old_operator =
        AgentClient::connect(&url, Some(&Token::new("operator-token-before"))).expect("client");
    let e = old_operator
        .job_status("a")
        .await
        .expect_err("the old operator token");
    assert_eq!(code(&e), Some(Code::Unauthenticated), "{e}");
    let producer = AgentClient::connect(&url, Some(&credential)).expect("client");
    let ok = put(&producer, "a", Split::Train, "p", &[rule_batch(50, 1)])
        .await
        .expect("the job's credential still works");
    assert_eq!(ok.rows_committed, 50);
    after.shutdown().await;
}

/// Executor push with no operator token anywhere on the executors: not in
/// the plan (`token_in_plan(false)`), not in their environment (the shared
/// Spark server, deploy/local/spark-connect.sh, sets no `KINDLING_TOKEN`).
/// The only bearer they can send is the producer credential the client put
/// in the plan, and the job trains.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executors_push_with_a_producer_credential_and_no_cluster_secret() {
    use kindling::job::{ExecutorPush, Feed};
    let spark = kindling::SparkSession::connect(&kindling_tests::spark::spark_remote())
        .await
        .expect("spark");
    let df = kindling_tests::spark::rule_df(&spark, 4000).await;
    let model = kindling_tests::spark::rule_job()
        .feed(Feed::ExecutorPush(ExecutorPush::new().token_in_plan(false)))
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("executor push with a producer credential");
    let acc = kindling_tests::events::accuracy(&model);
    assert!(acc > 0.9, "accuracy {acc}");
}
