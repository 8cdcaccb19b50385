//! Job-scoped credentials against a real rendezvous and agent: a producer
//! credential puts rows into its job and does nothing else, a reader reads
//! its job's model, a tampered or expired one is refused, and an agent whose
//! operator token was rotated still takes the job's credentials.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

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
    let (cluster, _dir) = cluster_with(1, |c| {
        c.credentials = Some(CredentialKey::new(KEY).expect("key").into())
    })
    .await;
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
    let (cluster, _dir) = cluster_with(1, |c| c.credentials = Some(key.clone().into())).await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    start_job(&cluster, "a", &linear_spec(1), &[0]).await;
    let good = issue(&operator, "a", Role::Producer).await;
    let expired = key.sign(&Claims {
        expires: 1,
        ..Claims::expiring("a", Role::Producer, Duration::ZERO)
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
        ("another cluster's", foreign, "which this process does not hold"),
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
        c.credentials = Some(key.clone().into());
        c.token = Some(Token::new("operator-token-before"));
    })
    .await;
    before.shutdown().await;
    let (after, _d2) = cluster_with(1, |c| {
        c.credentials = Some(key.clone().into());
        c.token = Some(Token::new("operator-token-after"));
    })
    .await;
    start_job(&after, "a", &linear_spec(1), &[0]).await;
    // A credential of the job, signed with the cluster key alone (as one
    // issued before the token rotated was): nothing of the token is in it.
    let rv = kindling_schemas::rendezvous::RendezvousClient::connect(after.rendezvous_url(), after.token())
        .await
        .expect("rendezvous");
    let incarnation = rv.status("a").await.expect("status").incarnation();
    let credential =
        Token::new(key.sign(
            &Claims::expiring("a", Role::Producer, Duration::from_secs(600)).of_incarnation(incarnation),
        ));
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

/// A job created again under an old id (after the first ended and left the
/// rendezvous and the agent) refuses the first job's credentials, and the
/// refusal comes before DoPut reads a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_job_under_an_old_id_refuses_the_old_job_s_credentials() {
    let (cluster, _dir) = cluster_with(1, |c| {
        c.credentials = Some(CredentialKey::new(KEY).expect("key").into());
        c.finished_retention = Duration::from_millis(200);
    })
    .await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    start_job(&cluster, "a", &linear_spec(1), &[0]).await;
    let first = issue(&operator, "a", Role::Producer).await;
    let old_producer = AgentClient::connect(&url, Some(&first)).expect("client");
    put(&old_producer, "a", Split::Train, "p", &[rule_batch(20, 1)])
        .await
        .expect("the first job takes its credential");
    // The job ends everywhere; wait until the agent and the rendezvous forgot it.
    operator.cancel_job("a", "done with it").await.expect("cancel");
    let rv =
        kindling_schemas::rendezvous::RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
            .await
            .expect("rendezvous");
    rv.cancel("a", "done with it")
        .await
        .expect("cancel at the rendezvous");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while operator.job_status("a").await.is_ok() || rv.status("a").await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first job was never removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start_job(&cluster, "a", &linear_spec(1), &[0]).await;

    let e = put(&old_producer, "a", Split::Train, "p", &[rule_batch(20, 2)])
        .await
        .expect_err("the old job's credential");
    assert_eq!(code(&e), Some(Code::PermissionDenied), "{e}");
    assert!(e.to_string().contains("not the job under that id now"), "{e}");
    let e = old_producer.job_status("a").await.expect_err("status");
    assert_eq!(code(&e), Some(Code::PermissionDenied), "{e}");
    // Refused from its headers alone: a DoPut that never sends a message
    // still gets its answer.
    let e = kindling_tests::flight::put_nothing(&url, &first).await;
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    // A reader credential cannot even start a DoPut.
    let reader = issue(&operator, "a", Role::Reader).await;
    let e = kindling_tests::flight::put_nothing(&url, &reader).await;
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(e.message().contains("reader credential"), "{e}");

    let fresh =
        AgentClient::connect(&url, Some(&issue(&operator, "a", Role::Producer).await)).expect("client");
    let ok = put(&fresh, "a", Split::Train, "p", &[rule_batch(20, 3)])
        .await
        .expect("the new job takes a new credential");
    assert_eq!(ok.rows_committed, 20);
    cluster.shutdown().await;
}

/// The key rotates under a running job, as an operator rotates the Secret:
/// the new key first (both accepted), then the old line dropped. The job's
/// producer keeps putting throughout and the job trains to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_rotates_mid_job_and_nothing_fails() {
    let keys_dir = tempfile::tempdir().expect("tempdir");
    let file = keys_dir.path().join("credential-key");
    let write = |text: &str| {
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &file).expect("rename");
    };
    const NEW: &str = "the-new-credential-key-0123456789abcdef";
    write(&format!("{}\n", std::str::from_utf8(KEY).expect("utf-8")));
    let keys = kindling_schemas::credential::CredentialKeys::from_file(&file).expect("keys");
    let (cluster, _dir) = cluster_with(1, |c| c.credentials = Some(keys)).await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    start_job(&cluster, "r", &linear_spec(1), &[0]).await;
    let old_id = CredentialKey::new(KEY).expect("key").id().to_owned();
    let new_id = CredentialKey::new(NEW.as_bytes()).expect("key").id().to_owned();
    let kid = |t: &Token| {
        let claims = CredentialKey::new(KEY)
            .ok()
            .and_then(|k| k.verify(t.expose()).ok());
        claims.and_then(|c| c.kid)
    };
    let old = issue(&operator, "r", Role::Producer).await;
    assert_eq!(kid(&old).as_deref(), Some(old_id.as_str()));
    let by_old = AgentClient::connect(&url, Some(&old)).expect("client");
    let mut sent = 0;
    // A producer id per put: each is a whole producer's rows, not a retry.
    let mut put_with = |client: AgentClient, producer: &'static str| {
        sent += 1;
        let seed = sent;
        async move {
            let producer = format!("{producer}-{seed}");
            put(&client, "r", Split::Train, &producer, &[rule_batch(100, seed)])
                .await
                .map(|ack| ack.rows_committed)
        }
    };
    assert_eq!(put_with(by_old.clone(), "old").await.expect("before"), 100);

    // Step 1: the new key signs, the old one is still taken.
    write(&format!("{NEW}\n{}\n", std::str::from_utf8(KEY).expect("utf-8")));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let new = loop {
        let t = issue(&operator, "r", Role::Producer).await;
        if kid(&t).is_none() {
            break t; // signed with a key `kid` cannot verify: the new one
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the key file was never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let by_new = AgentClient::connect(&url, Some(&new)).expect("client");
    assert!(
        put_with(by_old.clone(), "old").await.is_ok(),
        "the old key during the rotation"
    );
    assert!(put_with(by_new.clone(), "new").await.is_ok(), "the new key");

    // Step 2: the old line dropped; only the new key is taken.
    write(&format!("{NEW}\n"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let refused = loop {
        match by_old.job_status("r").await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the old key was never dropped"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(code(&refused), Some(Code::Unauthenticated), "{refused}");
    // Refused as signed with a key it does not hold, without repeating the
    // (unverified) key id the credential claims.
    assert!(refused.to_string().contains("does not hold"), "{refused}");
    assert!(!refused.to_string().contains(&old_id), "{refused}");
    assert!(!new_id.is_empty());
    assert!(
        put_with(by_new.clone(), "new").await.is_ok(),
        "the new key after the rotation"
    );
    // Every row put went in (the old producer's last put was before step 2),
    // and the job trains on them.
    let rows = 100 * 4;
    end_of_data(&operator, "r", Split::Train, Some(rows)).await;
    let done = wait_done(&operator, "r").await;
    assert_eq!(
        done.state,
        kindling_schemas::action::AgentJobState::Succeeded,
        "{done:#?}"
    );
    cluster.shutdown().await;
}

/// One producer credential opens more streams than an agent takes from one
/// credential: exactly the ones past the cap are refused, from their
/// headers, and the others commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_credential_holds_at_most_its_cap_of_streams_on_an_agent() {
    use kindling_agent::jobs::MAX_STREAMS_PER_CREDENTIAL;
    let (cluster, _dir) = cluster_with(1, |c| {
        c.credentials = Some(CredentialKey::new(KEY).expect("key").into())
    })
    .await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    start_job(&cluster, "s", &linear_spec(1), &[0]).await;
    let producer =
        AgentClient::connect(&url, Some(&issue(&operator, "s", Role::Producer).await)).expect("client");
    let path = kindling_schemas::descriptor::DataPath::data("s", Split::Train);
    let batch = rule_batch(100, 1);
    let extra = 20;
    let mut writers = Vec::new();
    for i in 0..MAX_STREAMS_PER_CREDENTIAL + extra {
        let mut w = producer
            .put(&path, format!("p{i}"), &batch.schema(), 1 << 20)
            .await
            .expect("open");
        let _ = w.write(&batch).await; // a refused stream may fail here already
        writers.push(w);
    }
    // Every admitted stream staged its batch before any ends.
    let one = kindling_schemas::schema::batch_bytes(&batch);
    let staged = MAX_STREAMS_PER_CREDENTIAL as u64 * one;
    wait_until(&operator, "s", Duration::from_secs(60), |s| {
        s.cache_bytes_memory + s.cache_bytes_disk >= staged
    })
    .await;
    let mut committed = 0;
    let mut refused = 0;
    for w in writers {
        match w.finish().await {
            Ok(receipt) => committed += receipt.rows_committed,
            Err(e) => {
                assert_eq!(code(&e), Some(Code::ResourceExhausted), "{e}");
                assert!(e.to_string().contains("streams open on this agent"), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, extra);
    assert_eq!(committed, 100 * MAX_STREAMS_PER_CREDENTIAL as u64);
    // The slots are free again.
    let ok = put(&producer, "s", Split::Train, "after", &[rule_batch(10, 2)])
        .await
        .expect("a stream after the others ended");
    assert_eq!(ok.rows_committed, 10);
    cluster.shutdown().await;
}

/// A raw Flight client of agent `url` with `token`.
fn raw_flight(
    url: &str,
    token: &Token,
) -> arrow_flight::flight_service_client::FlightServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        kindling_schemas::auth::BearerAttach,
    >,
> {
    let channel = kindling_schemas::channel::ChannelConfig::default()
        .dial(url, true)
        .expect("dial")
        .connect_lazy();
    arrow_flight::flight_service_client::FlightServiceClient::with_interceptor(
        channel,
        kindling_schemas::auth::BearerAttach::new(Some(token)).expect("token"),
    )
}

/// DoExchange checks a credential before it reads a message: a producer's,
/// or the reader's of a job the agent does not hold, is refused while its
/// stream has sent nothing at all. A reader's exchange that then sends nothing is ended after the
/// idle bound, and its stream slot freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_exchange_refuses_a_credential_before_reading_and_ends_a_quiet_exchange() {
    let (cluster, _dir) = cluster_with(1, |c| {
        c.credentials = Some(CredentialKey::new(KEY).expect("key").into());
        c.staging = kindling_agent::cache::StagingLimits {
            stream_idle: Duration::from_secs(2),
            ..Default::default()
        };
    })
    .await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    start_job(&cluster, "a", &linear_spec(1), &[0]).await;
    start_job(&cluster, "b", &linear_spec(1), &[0]).await;
    let silent = || futures::stream::pending::<arrow_flight::FlightData>();
    let elsewhere =
        CredentialKey::new(KEY)
            .expect("key")
            .issue("not-here", Role::Reader, Duration::from_secs(60));
    for (what, token, code) in [
        (
            "a producer's",
            issue(&operator, "a", Role::Producer).await,
            Code::PermissionDenied,
        ),
        (
            "the reader's of a job not here",
            Token::new(elsewhere),
            Code::NotFound,
        ),
    ] {
        // Answered without a message sent: the agent read nothing first.
        let refused = tokio::time::timeout(
            Duration::from_secs(30),
            raw_flight(&url, &token).do_exchange(silent()),
        )
        .await
        .unwrap_or_else(|_| panic!("{what} credential: DoExchange waited for a message"))
        .expect_err("refused");
        assert_eq!(refused.code(), code, "{what}: {refused}");
    }

    // A reader of its own (trained) job whose exchange goes quiet: before
    // its first message, and after it.
    put(&operator, "a", Split::Train, "p", &[rule_batch(200, 1)])
        .await
        .expect("rows");
    end_of_data(&operator, "a", Split::Train, Some(200)).await;
    wait_done(&operator, "a").await;
    let reader = issue(&operator, "a", Role::Reader).await;
    let idle = |e: &tonic::Status| {
        assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
        assert!(
            e.message().contains("DoExchange stream sent or read nothing"),
            "{e}"
        );
    };
    let unopened = tokio::time::timeout(
        Duration::from_secs(60),
        raw_flight(&url, &reader).do_exchange(silent()),
    )
    .await
    .expect("an exchange that never sends is ended")
    .expect_err("with an error");
    idle(&unopened);
    let path = kindling_schemas::descriptor::DataPath::Predict { job_id: "a".into() };
    let opening = arrow_flight::FlightData {
        flight_descriptor: Some(path.descriptor()),
        ..Default::default()
    };
    let then_silent = futures::stream::once(async move { opening }).chain(silent());
    let mut quiet = raw_flight(&url, &reader)
        .do_exchange(then_silent)
        .await
        .expect("admitted")
        .into_inner();
    let ended = tokio::time::timeout(Duration::from_secs(60), quiet.message())
        .await
        .expect("the quiet exchange was ended")
        .expect_err("with an error");
    idle(&ended);
    // The credential's streams are free for an exchange that predicts.
    let client = AgentClient::connect(&url, Some(&reader)).expect("client");
    let batch = rule_batch(10, 2);
    let features = batch.project(&[0, 1]).expect("features");
    let predicted: Vec<_> = client
        .predict("a", features.schema(), futures::stream::iter([features]))
        .await
        .expect("predict")
        .try_collect()
        .await
        .expect("predictions");
    assert_eq!(predicted.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
    cluster.shutdown().await;
}

/// Predictions of `model_id` on `agent` for ten rows: `Ok` when the agent
/// answers, else the code it refused with.
async fn predict_with(agent: &AgentClient, model_id: &str) -> Result<usize, Option<Code>> {
    let features = rule_batch(10, 1).project(&[0, 1]).expect("features");
    let out = agent
        .predict(model_id, features.schema(), futures::stream::iter([features]))
        .await
        .map_err(|e| code(&e))?;
    let batches: Vec<_> = Box::pin(out).try_collect().await.map_err(|e| code(&e))?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// A served model's reader credential names the model's version as its
/// incarnation (issue #59): the one `issue_credential` gives predicts; one
/// signed with the same key but naming no incarnation, or another version,
/// is refused (before, a credential naming none read every served model).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_model_s_reader_names_its_version_and_no_other_reads_it() {
    use kindling_schemas::model_serving::{ServeModel, ServeModelResponse, model_incarnation, model_inputs};
    let (cluster, _dir) = cluster_with(1, |c| {
        c.credentials = Some(CredentialKey::new(KEY).expect("key").into());
    })
    .await;
    let url = cluster.agent_url(0).expect("agent");
    let operator = agent_client(&cluster, 0);
    let spec = linear_spec(1);
    start_job(&cluster, "a", &spec, &[0]).await;
    put(&operator, "a", Split::Train, "p", &[rule_batch(100, 1)])
        .await
        .expect("rows");
    end_of_data(&operator, "a", Split::Train, Some(100)).await;
    wait_done(&operator, "a").await;
    let weights = operator.fetch_model("a").await.expect("weights");
    let features = rule_batch(1, 1).project(&[0, 1]).expect("features");
    let layout = kindling_schemas::schema::validate(
        &features.schema(),
        &spec,
        kindling_schemas::schema::StreamKind::Predict,
    )
    .expect("layout");
    let serve = ServeModel::new(spec.clone(), 2, model_inputs(&layout), &weights).expect("body");
    let served: ServeModelResponse = operator.action(&Action::ServeModel(serve)).await.expect("serve");
    let model_id = served.model_id;

    let issued = issue(&operator, &model_id, Role::Reader).await;
    let key = CredentialKey::new(KEY).expect("key");
    let claims = key.verify(issued.expose()).expect("verifies");
    assert_eq!(claims.incarnation, Some(model_incarnation(&model_id)));
    let reader = AgentClient::connect(&url, Some(&issued)).expect("client");
    assert_eq!(predict_with(&reader, &model_id).await, Ok(10));

    let unbound = Token::new(key.issue(&model_id, Role::Reader, Duration::from_secs(600)));
    let other = Token::new(
        key.sign(
            &Claims::expiring(&model_id, Role::Reader, Duration::from_secs(600))
                .of_incarnation(model_incarnation(&model_id) ^ 1),
        ),
    );
    for (what, token) in [("no incarnation", unbound), ("another version", other)] {
        let client = AgentClient::connect(&url, Some(&token)).expect("client");
        assert_eq!(
            predict_with(&client, &model_id).await,
            Err(Some(Code::PermissionDenied)),
            "{what}"
        );
    }
    cluster.shutdown().await;
}
