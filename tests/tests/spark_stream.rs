//! Results as a stream: batches arrive one by one, client memory stays flat.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use futures::{StreamExt, TryStreamExt};
use kindling::spark::functions::{col, concat, lit};
use kindling::spark::{Error, SparkSession};
use kindling_tests::spark::spark_remote;

/// A field of /proc/self/status in kB (VmRSS, VmHWM).
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Bytes of the batch's own values (batches decoded without copying share the
/// message buffer, so `get_array_memory_size` would count it once per column).
fn slice_bytes(batch: &RecordBatch) -> usize {
    kindling_schemas::schema::batch_bytes(batch) as usize
}

#[tokio::test]
async fn five_million_rows_stream_with_flat_memory() -> Result<(), Error> {
    // Its own peak RSS is what it measures: no other test may run beside it.
    if !kindling_tests::alone("spark_stream::five_million_rows_stream_with_flat_memory") {
        return Ok(());
    }
    let spark = SparkSession::connect(&spark_remote()).await?;
    let n: i64 = 5_000_000;
    let df = spark.range_partitions(0, n, 1, Some(4)).with_columns([
        ("x", col("id").cast("double") * 0.5),
        ("y", col("id") % 1000),
        ("s", concat([lit("row-"), col("id").cast("string")])),
    ]);
    let rss_before = status_kb("VmRSS:");
    let mut stream = df.execute_stream().await?;
    assert_eq!(stream.schema().fields().len(), 4);
    assert_eq!(stream.schema().field(1).data_type(), &DataType::Float64);
    let (mut rows, mut batches, mut id_sum, mut x_sum, mut result_bytes) = (0i64, 0, 0i64, 0f64, 0usize);
    let mut largest = 0usize;
    while let Some(batch) = stream.try_next().await? {
        rows += batch.num_rows() as i64;
        batches += 1;
        let size = slice_bytes(&batch);
        result_bytes += size;
        largest = largest.max(size);
        id_sum += batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .sum::<i64>();
        x_sum += batch
            .column(1)
            .as_primitive::<Float64Type>()
            .values()
            .iter()
            .sum::<f64>();
    }
    let peak_growth = status_kb("VmHWM:").saturating_sub(rss_before) * 1024;
    assert_eq!(rows, n);
    assert_eq!(id_sum, n * (n - 1) / 2);
    assert_eq!(x_sum, (n * (n - 1) / 2) as f64 * 0.5);
    assert!(batches > 1, "the result came as {batches} batch(es)");
    assert!(result_bytes > 150 << 20, "result is {result_bytes} bytes");
    // Flat: the peak grows by a few batches' worth, never by the result size.
    assert!(
        (peak_growth as usize) < result_bytes / 5,
        "peak RSS grew by {peak_growth} B for a {result_bytes} B result (largest batch {largest} B)"
    );
    Ok(())
}

#[tokio::test]
async fn schema_of_empty_result_and_batches_in_order() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let empty = spark
        .range(0, 100, 1)
        .filter(col("id").lt(0))
        .execute_stream()
        .await?;
    assert_eq!(empty.schema().field(0).name(), "id");
    let batches: Vec<RecordBatch> = empty.try_collect().await?;
    assert!(batches.is_empty());

    let ordered = spark
        .range(0, 50_000, 1)
        .order_by([col("id").desc()])
        .execute_stream()
        .await?;
    let mut next_expected = 49_999;
    let mut ordered = ordered.into_inner();
    while let Some(batch) = ordered.next().await {
        for v in batch?.column(0).as_primitive::<Int64Type>().values() {
            assert_eq!(*v, next_expected);
            next_expected -= 1;
        }
    }
    assert_eq!(next_expected, -1);
    Ok(())
}

#[tokio::test]
async fn dropping_a_stream_midway_releases_it_and_the_session_goes_on() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    for _ in 0..3 {
        let mut stream = spark.range(0, 2_000_000, 1).execute_stream().await?;
        let first = stream.try_next().await?.map(|b| b.num_rows()).unwrap_or(0);
        assert!(first > 0);
        drop(stream);
    }
    assert_eq!(spark.range(0, 10, 1).count().await?, 10);
    Ok(())
}
