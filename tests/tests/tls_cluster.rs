//! The client crate's main path over mutual TLS: a job built from a Spark
//! DataFrame trains on a rendezvous and two agents that speak only TLS and
//! accept only the test CA's client certificates.

use kindling::SparkSession;
use kindling::job::JobError;
use kindling_tests::cluster::tls_cluster;
use kindling_tests::events::accuracy;
use kindling_tests::spark::{rule_df, rule_job, spark_remote};

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
        .channel(channel)
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
        .token(token)
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
    cluster.shutdown().await;
}
