//! The client crate's main path over mutual TLS: a job built from a Spark
//! DataFrame trains on a rendezvous and two agents that speak only TLS and
//! accept only the test CA's client certificates.

use kindling::SparkSession;
use kindling::job::JobError;
use kindling_tests::cluster::tls_cluster;
use kindling_tests::events::accuracy;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_trains_end_to_end_over_mutual_tls() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 2000).await;
    let (cluster, _dir, _client, channel) = tls_cluster(2).await;
    assert!(cluster.rendezvous_url().starts_with("https://"));
    assert!(cluster.agent_urls().iter().all(|u| u.starts_with("https://")));
    let token = cluster.token().expect("token").clone();
    let model = rule_job()
        .local_mode(false)
        .rendezvous(cluster.rendezvous_url())
        .token(token.clone())
        .channel(channel.clone())
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit over TLS");
    assert_eq!(model.history().len(), 5);
    let acc = accuracy(&model);
    assert!(acc > 0.9, "learned the rule over TLS: accuracy {acc}");

    // Without TLS settings the client stops before dialling, naming the URL.
    let err = rule_job()
        .local_mode(false)
        .rendezvous(cluster.rendezvous_url())
        .token(token.clone())
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect_err("https without a CA");
    let text = format!("{err:#}");
    assert!(
        text.contains("no CA") && text.contains(&cluster.rendezvous_url()),
        "{text}"
    );
    assert!(!matches!(err, JobError::NotEnoughAgents { .. }), "{err}");

    // /metrics on the same port and the same mutual TLS (ALPN http/1.1):
    // the client certificate and the token read it; without the token, 401.
    let tls = channel
        .tls
        .as_ref()
        .and_then(|t| t.client_config())
        .expect("client TLS");
    let mut config = (*tls).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    for url in cluster.agent_urls().iter().chain([&cluster.rendezvous_url()]) {
        let addr = url.trim_start_matches("https://").to_owned();
        for (auth, want) in [(Some(token.expose()), "HTTP/1.1 200"), (None, "HTTP/1.1 401")] {
            let tcp = tokio::net::TcpStream::connect(&addr).await.expect("connect");
            let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
            let mut s = connector.connect(name, tcp).await.expect("TLS handshake");
            let header = auth
                .map(|t| format!("authorization: Bearer {t}\r\n"))
                .unwrap_or_default();
            s.write_all(
                format!("GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{header}\r\n").as_bytes(),
            )
            .await
            .expect("request");
            let mut page = String::new();
            s.read_to_string(&mut page).await.expect("response");
            assert!(page.starts_with(want), "{url}: {page}");
            if auth.is_some() {
                assert!(page.contains("kindling_"), "{url}: {page}");
            }
        }
    }

    // The standard gRPC health service answers on both servers' TLS port,
    // with no token (as `grpc_health_probe` and Kubernetes' gRPC probes ask).
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    for (url, service) in [
        (
            cluster.agent_urls()[0].clone(),
            kindling_agent::process::server::FLIGHT_SERVICE,
        ),
        (
            cluster.rendezvous_url(),
            kindling_rendezvous::server::RENDEZVOUS_SERVICE,
        ),
    ] {
        let conn = channel
            .dial(&url, true)
            .expect("dial")
            .connect()
            .await
            .expect("connect");
        let mut health = HealthClient::new(conn);
        for name in ["", service] {
            let status = health
                .check(HealthCheckRequest { service: name.into() })
                .await
                .unwrap_or_else(|e| panic!("{url} health of {name:?}: {e}"))
                .into_inner()
                .status;
            assert_eq!(status, ServingStatus::Serving as i32, "{url} {name:?}");
        }
        let unknown = health
            .check(HealthCheckRequest {
                service: "no.such.Service".into(),
            })
            .await
            .expect_err("an unknown service");
        assert_eq!(unknown.code(), tonic::Code::NotFound, "{url}");
    }
    cluster.shutdown().await;
}

/// Over mutual TLS the ring takes connections from the agents' identity
/// only: ring connections presenting the client certificate (signed by the
/// same CA) are each refused before any hello — more of them than the hello
/// cap, held open — and a job trains to the end while more keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_connections_with_a_client_certificate_are_refused_and_a_job_trains_beside_them() {
    use kindling_agent::collective::MAX_RING_HELLOS;
    use kindling_schemas::ring::read_reply;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = rule_df(&spark, 2000).await;
    let (cluster, _dir, _client, channel) = tls_cluster(2).await;
    let token = cluster.token().expect("token").clone();
    let url = cluster.agent_urls()[0].clone();
    let mut held = Vec::new();
    for _ in 0..MAX_RING_HELLOS + 8 {
        let mut conn = channel
            .connect_ring(&url, false)
            .await
            .expect("a TLS ring connection");
        let answer = read_reply(&mut conn).await.expect("an answer before any hello");
        let refused = answer.expect_err("a client certificate is no ring peer");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert!(
            refused.message().contains("agents only") && refused.message().contains("127.0.0.1"),
            "{}",
            refused.message()
        );
        held.push(conn);
    }
    // While the job trains, the same certificate keeps opening ring
    // connections (up to ten times the hello cap).
    let done = Arc::new(AtomicBool::new(false));
    let flood = tokio::spawn({
        let (channel, url, done) = (channel.clone(), url.clone(), done.clone());
        async move {
            let mut refused = 0;
            while !done.load(Ordering::Relaxed) && refused < MAX_RING_HELLOS * 10 {
                let mut conn = channel.connect_ring(&url, false).await.expect("connect");
                if let Ok(Err(status)) = read_reply(&mut conn).await {
                    assert_eq!(status.code(), tonic::Code::PermissionDenied);
                    refused += 1;
                }
            }
            refused
        }
    });
    let model = rule_job()
        .local_mode(false)
        .rendezvous(cluster.rendezvous_url())
        .token(token)
        .channel(channel.clone())
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("the agents' ring trains beside the refused connections");
    done.store(true, Ordering::Relaxed);
    let refused = flood.await.expect("the flood");
    assert_eq!(model.history().len(), 5);
    assert!(refused > 0, "the flood was answered");
    drop(held);
    cluster.shutdown().await;
}
