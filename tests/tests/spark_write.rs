//! `DataFrame::write()`: Spark writes Parquet/CSV files by path; save modes.

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use kindling::spark::functions::{col, sum};
use kindling::spark::{Error, SaveMode, SparkSession};
use kindling_tests::spark::spark_remote;

fn sum_of(batches: &[arrow::array::RecordBatch]) -> i64 {
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

#[tokio::test]
async fn parquet_round_trips_and_save_modes_apply() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("ids.parquet").to_string_lossy().into_owned();
    let n = 100_000i64;
    let df = spark
        .range_partitions(0, n, 1, Some(4))
        .with_column("twice", col("id") * 2);

    df.write().parquet(&path).await?;
    let files = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .count();
    assert_eq!(files, 4, "one Parquet file per partition");
    let back = spark.read().parquet([&path]);
    assert_eq!(back.count().await?, n);
    let total = back.agg([sum(col("twice"))]).collect().await?;
    assert_eq!(sum_of(&total), n * (n - 1));

    // The default mode refuses an existing path, with Spark's error class.
    let refused = df.write().parquet(&path).await.expect_err("the path exists");
    assert_eq!(refused.error_class(), Some("PATH_ALREADY_EXISTS"), "{refused}");

    // Overwrite replaces, Append adds, Ignore keeps.
    spark
        .range(0, 10, 1)
        .write()
        .mode(SaveMode::Overwrite)
        .parquet(&path)
        .await?;
    assert_eq!(spark.read().parquet([&path]).count().await?, 10);
    spark
        .range(0, 5, 1)
        .write()
        .mode(SaveMode::Append)
        .parquet(&path)
        .await?;
    assert_eq!(spark.read().parquet([&path]).count().await?, 15);
    spark
        .range(0, 99, 1)
        .write()
        .mode(SaveMode::Ignore)
        .parquet(&path)
        .await?;
    assert_eq!(spark.read().parquet([&path]).count().await?, 15);
    Ok(())
}

#[tokio::test]
async fn csv_with_options_and_partitioned_layout() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("out.csv").to_string_lossy().into_owned();
    let df = spark.range(0, 30, 1).with_column("bucket", col("id") % 3);
    df.write()
        .option("header", "true")
        .partition_by(["bucket"])
        .csv(&path)
        .await?;
    for bucket in 0..3 {
        assert!(
            std::path::Path::new(&path)
                .join(format!("bucket={bucket}"))
                .is_dir(),
            "no directory for bucket {bucket}"
        );
    }
    let back = spark
        .read()
        .option("header", "true")
        .option("inferSchema", "true")
        .csv([&path]);
    assert_eq!(back.filter(col("bucket").eq(2)).count().await?, 10);
    let ids = back.agg([sum(col("id"))]).collect().await?;
    assert_eq!(sum_of(&ids), (0..30).sum::<i64>());

    let empty = df.write().csv("").await.expect_err("empty path");
    assert!(empty.to_string().contains("output path is empty"), "{empty}");
    Ok(())
}
