//! Spark's own security as the Kubernetes manifests set it
//! (`spark.authenticate`, `spark.network.crypto.enabled` with AES-GCM and no
//! SASL fallback, `spark.io.encryption.enabled`; `deploy/local/spark-connect.sh`
//! with `KINDLING_SPARK_AUTHENTICATE=1`): a job with executor push still
//! trains, and a peer without Spark's secret asking the driver's block
//! manager for a block (the broadcast task binaries, which carry the push
//! configuration) is refused before any block is looked up, while the same
//! request to a server without it is answered (a stream handle for a block
//! that exists, "not found" naming one that does not).

use kindling::SparkSession;
use kindling::job::{ExecutorPush, Feed};
use kindling_tests::events::fed_events;
use kindling_tests::spark::{PrivateSpark, block_manager, rule_df, rule_job, spark_remote};

use crate::python_common::run_script;

/// One `OpenBlocks` RPC without Spark's authentication handshake
/// (`tests/python/spark_block_fetch.py`): (reply, message).
async fn fetch(at: &(String, u16), block: &str) -> (String, String) {
    let out = run_script(
        "spark_block_fetch.py",
        &serde_json::json!({"host": at.0, "port": at.1, "block": block}),
    )
    .await;
    let field = |k: &str| out[k].as_str().unwrap_or_default().to_owned();
    (field("reply"), field("message"))
}

/// Blocks a job's stages leave in the driver's block manager: the pieces of
/// the first broadcasts (task binaries).
const BLOCKS: [&str; 4] = [
    "broadcast_0_piece0",
    "broadcast_1_piece0",
    "broadcast_2_piece0",
    "broadcast_3_piece0",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_sparks_authentication_a_push_trains_and_a_block_fetch_without_the_secret_is_refused() {
    // Without Spark's authentication (the shared server): the request is
    // served. A block that does not exist is "not found", by name.
    let shared_port: u16 = spark_remote()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the shared server's port");
    let open = block_manager(shared_port);
    let missing = "broadcast_999999_piece0";
    let (reply, message) = fetch(&open, missing).await;
    assert!(
        reply == "failure" && message.contains("BlockNotFoundException") && message.contains(missing),
        "a server without spark.authenticate answers the request: {reply} {message}"
    );

    // With it: a job with executor push trains through it.
    const ROWS: usize = 4_000;
    let server = PrivateSpark::start_with("local[2]", &[("KINDLING_SPARK_AUTHENTICATE", "1")]);
    let spark = SparkSession::connect(&server.remote()).await.expect("spark");
    let df = rule_df(&spark, ROWS).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let model = rule_job()
        .feed(Feed::ExecutorPush(ExecutorPush::new()))
        .eval_fraction(0.0)
        .epochs(1)
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("executor push with Spark's authentication on");
    let fed = fed_events(&mut rx);
    assert_eq!(
        fed.iter().flat_map(|f| &f.rows_per_shard).sum::<u64>(),
        ROWS as u64,
        "{fed:#?}"
    );
    assert!(model.history().last().is_some_and(|h| h.train_loss.is_finite()));

    // And a peer without the secret gets no block, nor learns whether one
    // exists: the first message must be the authentication challenge.
    let guarded = server.block_manager();
    for block in BLOCKS.iter().copied().chain([missing]) {
        let (reply, message) = fetch(&guarded, block).await;
        assert!(
            reply == "closed" || (reply == "failure" && message.contains("Unknown challenge message")),
            "{block}: {reply} {message}"
        );
        assert!(!message.contains("BlockNotFound"), "{block}: {message}");
    }
    drop(spark);
    drop(server);
}
