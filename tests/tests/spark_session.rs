//! Session: URL parsing, identity, config and version against the real server.

use kindling::spark::{Error, RemoteUrl, SparkSession};
use kindling_tests::spark::spark_remote;

#[tokio::test]
async fn connects_and_reports_version_and_identity() -> Result<(), Error> {
    let spark = SparkSession::connect(&format!("{}/;user_id=kindling-test", spark_remote())).await?;
    assert!(spark.version().await?.starts_with("4."));
    assert_eq!(spark.session_id().len(), 36);
    assert!(spark.user_agent().contains("kindling/"));
    let other = SparkSession::connect(&spark_remote()).await?;
    assert_ne!(spark.session_id(), other.session_id());
    Ok(())
}

#[tokio::test]
async fn config_set_get_unset_is_per_session() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let other = SparkSession::connect(&spark_remote()).await?;
    spark.conf_set("spark.sql.shuffle.partitions", "7").await?;
    assert_eq!(
        spark.conf_get("spark.sql.shuffle.partitions").await?.as_deref(),
        Some("7")
    );
    let theirs = other.conf_get("spark.sql.shuffle.partitions").await?;
    assert_ne!(theirs.as_deref(), Some("7"));
    spark.conf_unset("spark.sql.shuffle.partitions").await?;
    // Unset drops the session value (Spark falls back to the SQL default).
    let after = spark.conf_get("spark.sql.shuffle.partitions").await?;
    assert!(after.is_some() && after.as_deref() != Some("7"), "{after:?}");
    Ok(())
}

#[tokio::test]
async fn session_id_from_url_is_used() -> Result<(), Error> {
    // Drawn per run: a server the suite reuses (deploy/local/spark-connect.sh)
    // keeps the ids of closed sessions and refuses them
    // (INVALID_HANDLE.SESSION_CLOSED) when a later run names one again.
    let bits: u128 = rand::random();
    let id = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        bits >> 96,
        (bits >> 80) & 0xffff,
        (bits >> 68) & 0xfff,
        (bits >> 56) & 0xfff,
        bits & 0xffff_ffff_ffff
    );
    let spark = SparkSession::connect(&format!("{}/;session_id={id}", spark_remote())).await?;
    assert_eq!(spark.session_id(), id);
    Ok(())
}

#[test]
fn url_parameters_and_redaction() -> Result<(), Error> {
    let url = RemoteUrl::parse("sc://example.com:443/;use_ssl=true;token=TOPSECRET;user_id=ada;x-team=ml")?;
    assert_eq!(url.address(), "example.com:443");
    assert!(url.use_ssl());
    assert_eq!(url.token(), Some("TOPSECRET"));
    assert_eq!(url.user_id(), Some("ada"));
    assert_eq!(url.headers(), vec![("x-team".to_string(), "ml".to_string())]);
    assert!(!format!("{url:?} {url}").contains("TOPSECRET"));
    assert!(matches!(
        RemoteUrl::parse("sc://h/;token=x"),
        Err(Error::InvalidUrl { .. })
    ));
    assert!(matches!(
        RemoteUrl::parse("sc://h:notaport"),
        Err(Error::InvalidUrl { .. })
    ));
    Ok(())
}

/// Spark Connect behind its token (`SPARK_CONNECT_AUTHENTICATE_TOKEN`, as
/// the Kubernetes deployment runs it): the client's `token=` reaches it as a
/// bearer header; no token or another one is refused, and the error never
/// shows a token.
#[tokio::test]
async fn a_token_protected_server_takes_the_url_s_token_and_refuses_others() -> Result<(), Error> {
    const TOKEN: &str = "spark-connect-test-token-7f3a";
    let server = kindling_tests::spark::PrivateSpark::start_with(
        "local[1]",
        &[("SPARK_CONNECT_AUTHENTICATE_TOKEN", TOKEN)],
    );
    let spark = SparkSession::connect(&format!("{}/;token={TOKEN}", server.remote())).await?;
    assert!(spark.version().await?.starts_with("4."));
    for url in [
        server.remote(),
        format!("{}/;token=not-the-token", server.remote()),
    ] {
        let refused = match SparkSession::connect(&url).await {
            Err(e) => e,
            Ok(s) => s.version().await.expect_err("a wrong token is refused"),
        };
        let text = refused.to_string();
        assert!(
            matches!(
                &refused,
                Error::Spark {
                    code: tonic::Code::Unauthenticated,
                    ..
                }
            ) || matches!(&refused, Error::Connection { source, .. } if source.code() == tonic::Code::Unauthenticated),
            "{url}: {refused:?}"
        );
        assert!(!text.contains(TOKEN) && !text.contains("not-the-token"), "{text}");
    }
    Ok(())
}
