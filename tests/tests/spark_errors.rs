//! Errors: Spark's error class verbatim; dead servers fail fast with the address.

use std::time::Duration;

use kindling::spark::functions::col;
use kindling::spark::{Error, SparkSession};
use kindling_tests::spark::spark_remote;

#[tokio::test]
async fn unresolved_column_keeps_error_class_and_message() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let err = spark
        .range(0, 3, 1)
        .select([col("idd")])
        .collect()
        .await
        .err()
        .unwrap_or_else(|| panic!("selecting a missing column succeeded"));
    assert_eq!(
        err.error_class(),
        Some("UNRESOLVED_COLUMN.WITH_SUGGESTION"),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("[UNRESOLVED_COLUMN.WITH_SUGGESTION]"),
        "{err}"
    );
    assert!(err.to_string().contains("`idd`"), "{err}");
    assert!(!err.is_retryable());
    assert!(matches!(err, Error::Spark { sql_state: Some(ref s), .. } if s == "42703"));

    // The same through analysis only (schema) and through SQL.
    let err = spark.range(0, 3, 1).select([col("nope")]).schema().await.err();
    assert_eq!(
        err.as_ref().and_then(|e| e.error_class()),
        Some("UNRESOLVED_COLUMN.WITH_SUGGESTION")
    );
    let err = spark.sql("SELECT * FROM kindling_no_such_table").await.err();
    assert_eq!(
        err.as_ref().and_then(|e| e.error_class()),
        Some("TABLE_OR_VIEW_NOT_FOUND")
    );
    let err = spark.sql("SELEC 1").await.err();
    assert_eq!(
        err.as_ref().and_then(|e| e.error_class()),
        Some("PARSE_SYNTAX_ERROR")
    );
    Ok(())
}

#[tokio::test]
async fn runtime_error_surfaces_from_the_stream() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    spark.conf_set("spark.sql.ansi.enabled", "true").await?;
    let err = spark
        .sql("SELECT 1 / (id - 5) AS x FROM range(10)")
        .await?
        .collect()
        .await
        .err()
        .unwrap_or_else(|| panic!("division by zero succeeded"));
    assert_eq!(err.error_class(), Some("DIVIDE_BY_ZERO"), "{err}");
    Ok(())
}

#[tokio::test]
async fn nothing_listening_is_a_connection_error_naming_the_address() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    // A bound, not a speed check: a hang would fail here instead of blocking the suite.
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        SparkSession::connect(&format!("sc://127.0.0.1:{port}")),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting to a dead port hung"));
    let err = result.err().unwrap_or_else(|| panic!("connected to nothing"));
    match &err {
        Error::Connection { address, .. } => assert_eq!(address, &format!("127.0.0.1:{port}")),
        other => panic!("expected a connection error, got {other:?}"),
    }
    assert!(err.is_retryable());
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[tokio::test]
async fn silent_peer_is_a_connection_error_not_a_hang() {
    // Accepts TCP connections (kernel backlog) but never speaks HTTP/2.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = silent
        .local_addr()
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        SparkSession::builder()
            .remote(format!("sc://127.0.0.1:{port}"))
            .connect_timeout(Duration::from_millis(500))
            .connect(),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting to a silent peer hung"));
    let expected = format!("127.0.0.1:{port}");
    assert!(
        matches!(result, Err(Error::Connection { ref address, .. }) if *address == expected),
        "{result:?}"
    );
    drop(silent);
}
