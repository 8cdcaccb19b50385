//! The driver relay against a Spark Connect server whose result limit
//! (`spark.driver.maxResultSize`) is below the DataFrame: a persisted
//! DataFrame is relayed in slices and trains on every row once; one query over
//! the same rows is stopped by Spark and `fit` names the limit and the ways
//! round it; a partition larger than a slice may be is refused before a job
//! starts, and the rows `fit` persisted for it are released.

use futures::TryStreamExt;
use kindling::SparkSession;
use kindling::feed::FeedError;
use kindling::job::JobError;
use kindling_tests::events::{Fed, accuracy, fed_events};
use kindling_tests::spark::{PrivateSpark, rule_df, rule_job};

/// Rows of the DataFrame: 17 bytes of Arrow each (f64, f32, i32 and the
/// validity bits), ~4 MB in 4 partitions of ~1 MB, against a 2 MiB limit.
const ROWS: u64 = 240_000;
const LIMIT: &str = "2m";
const LIMIT_BYTES: u64 = 2 << 20;

fn job() -> kindling::job::TrainingJobBuilder {
    rule_job().batch_size(256).epochs(1).eval_fraction(0.1).seed(5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dataframe_over_the_servers_result_limit_is_relayed_in_slices() {
    let server = PrivateSpark::start_with("local[2]", &[("KINDLING_SPARK_MAX_RESULT_SIZE", LIMIT)]);
    let spark = SparkSession::connect(&server.remote()).await.expect("spark");
    let df = rule_df(&spark, ROWS as usize).await;

    // Persisted (the default): relayed in slices, every row lands once.
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let model = job()
        .events(tx)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("a persisted DataFrame over the limit trains");
    let fed = fed_events(&mut rx);
    let split = |name: &str| fed.iter().find(|f| f.split == name).expect(name);
    let (train, eval) = (split("train"), split("eval"));
    let rows = |f: &Fed| f.rows_per_shard.iter().sum::<u64>();
    assert_eq!(rows(train) + rows(eval), ROWS, "rows fed: {fed:?}");
    // ~3.7 MB of training rows against slices of at most 1.5 MiB.
    assert!(
        train.queries >= 3,
        "the training rows took {} queries",
        train.queries
    );
    let trained = accuracy(&model);
    assert!(trained > 0.9, "accuracy {trained}");

    // Predicting over the rows persisted reads them in slices too; not
    // persisted, in one query that Spark stops.
    let cached = df
        .persist(kindling::spark::memory_and_disk())
        .await
        .expect("persist");
    let predicted: u64 = model
        .predict(&cached)
        .await
        .expect("predict over a persisted DataFrame")
        .map_ok(|batch| batch.num_rows() as u64)
        .try_fold(0, |sum, rows| async move { Ok(sum + rows) })
        .await
        .expect("predictions");
    assert_eq!(predicted, ROWS);
    cached.unpersist(true).await.expect("unpersist");
    let err = match model.predict(&df).await {
        Ok(stream) => stream
            .try_for_each(|_| async { Ok(()) })
            .await
            .expect_err("one query over the limit"),
        Err(e) => e,
    };
    assert!(matches!(err, JobError::DriverResultLimit { .. }), "{err:?}");

    // The same rows in one query: Spark stops it, and the error says why and
    // what to do.
    let err = job()
        .persist(false)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect_err("one query over the limit");
    let text = err.to_string();
    assert!(matches!(err, JobError::DriverResultLimit { .. }), "{err:?}");
    for needle in ["spark.driver.maxResultSize", "relay_slice_bytes", "executor push"] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }

    // One partition holding everything cannot be sliced: refused up front.
    let err = job()
        .build()
        .expect("job")
        .fit(&df.coalesce(1))
        .await
        .expect_err("one partition over the limit");
    match err {
        JobError::Feed(FeedError::PartitionTooLarge {
            partition,
            rows,
            bytes,
            limit,
        }) => {
            assert_eq!(partition, 0);
            assert!(
                rows > ROWS / 2 && bytes == rows * 17,
                "{rows} rows, {bytes} bytes"
            );
            assert_eq!(limit, LIMIT_BYTES);
        }
        other => panic!("expected PartitionTooLarge, got {other:?}"),
    }
    // The rows `fit` persisted for it are released again.
    let level = df
        .coalesce(1)
        .select(["x1", "x2", "y"])
        .storage_level()
        .await
        .expect("storage level");
    assert!(!level.use_memory && !level.use_disk, "still cached: {level:?}");
}
