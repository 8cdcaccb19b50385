//! Arrow into Spark: create_dataframe inline and through cached artifact chunks.

use std::sync::Arc;

use arrow::array::{AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use futures::TryStreamExt;
use kindling::spark::functions::{col, sum};
use kindling::spark::{Error, SparkSession};
use kindling_tests::spark::spark_remote;

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("score", DataType::Float64, true),
        Field::new("label", DataType::Utf8, true),
    ]))
}

fn batch(schema: &Arc<Schema>, ids: std::ops::Range<i64>) -> RecordBatch {
    let ids: Vec<i64> = ids.collect();
    let scores: Vec<f64> = ids.iter().map(|i| *i as f64 * 0.25).collect();
    let labels: Vec<String> = ids.iter().map(|i| format!("l{}", i % 7)).collect();
    RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(Float64Array::from(scores)),
            Arc::new(StringArray::from(labels)),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn small_data_round_trips_inline_with_nulls() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let schema = schema();
    let rows = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(Float64Array::from(vec![Some(0.5), None, Some(1.5)])),
            Arc::new(StringArray::from(vec![Some("a"), Some("b"), None])),
        ],
    )?;
    let df = spark.create_dataframe(schema.clone(), [rows.clone()]).await?;
    assert!(matches!(
        df.relation().rel_type,
        Some(kindling::spark::proto::relation::RelType::LocalRelation(_))
    ));
    let back = df.order_by(["id"]).collect().await?;
    let back = concat_batches(&back[0].schema(), &back)?;
    assert_eq!(back.columns(), rows.columns());
    assert_eq!(back.schema().field(0).name(), "id");
    // Spark computes on it like on any DataFrame.
    let doubled = df
        .select([(col("id") * 2).alias("twice")])
        .order_by(["twice"])
        .collect()
        .await?;
    assert_eq!(
        doubled[0].column(0).as_primitive::<Int64Type>().values().to_vec(),
        vec![2, 4, 6]
    );
    Ok(())
}

#[tokio::test]
async fn one_million_rows_round_trip_through_cached_chunks() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let schema = schema();
    let n: i64 = 1_000_000;
    let batches: Vec<RecordBatch> = (0..n)
        .step_by(65_536)
        .map(|start| batch(&schema, start..(start + 65_536).min(n)))
        .collect();
    let df = spark.create_dataframe(schema.clone(), batches).await?;
    match &df.relation().rel_type {
        Some(kindling::spark::proto::relation::RelType::ChunkedCachedLocalRelation(r)) => {
            assert!(r.data_hashes.len() > 1);
            assert!(r.data_hashes.iter().all(|h| h.len() == 64));
        }
        other => panic!("expected a cached relation, got {other:?}"),
    }
    assert_eq!(df.count().await?, n);
    let sums = df
        .agg([sum(col("id")).alias("ids"), sum(col("score")).alias("scores")])
        .collect()
        .await?;
    assert_eq!(
        sums[0].column(0).as_primitive::<Int64Type>().value(0),
        n * (n - 1) / 2
    );
    assert_eq!(
        sums[0].column(1).as_primitive::<Float64Type>().value(0),
        (n * (n - 1) / 2) as f64 * 0.25
    );
    let per_label = df
        .group_by(["label"])
        .count()
        .order_by(["label"])
        .collect()
        .await?;
    let counts: i64 = per_label
        .iter()
        .map(|b| {
            b.column(1)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .sum::<i64>()
        })
        .sum();
    assert_eq!(counts, n);

    // Stream it back and compare a checksum computed on the client.
    let mut stream = df.execute_stream().await?;
    let (mut rows, mut checksum) = (0i64, 0i64);
    while let Some(b) = stream.try_next().await? {
        rows += b.num_rows() as i64;
        let ids = b.column(0).as_primitive::<Int64Type>();
        let labels = b.column(2).as_string::<i32>();
        for i in 0..b.num_rows() {
            assert_eq!(labels.value(i), format!("l{}", ids.value(i) % 7));
            checksum = checksum.wrapping_add(ids.value(i).wrapping_mul(31));
        }
    }
    assert_eq!(rows, n);
    assert_eq!(checksum, (n * (n - 1) / 2) * 31);
    Ok(())
}

#[tokio::test]
async fn from_a_stream_of_query_results() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let source = spark
        .range(0, 300_000, 1)
        .with_column("x", col("id").cast("double"));
    let stream = source.execute_stream().await?;
    let schema = stream.schema();
    let copy = spark.create_dataframe_from_stream(schema, stream).await?;
    assert_eq!(copy.count().await?, 300_000);
    assert_eq!(copy.subtract(&source).count().await?, 0);
    Ok(())
}

#[tokio::test]
async fn mismatched_batch_schema_is_rejected() -> Result<(), Error> {
    let spark = SparkSession::connect(&spark_remote()).await?;
    let other = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let wrong = RecordBatch::try_new(other, vec![Arc::new(Int64Array::from(vec![1]))])?;
    let err = spark.create_dataframe(schema(), [wrong]).await.err();
    assert!(matches!(err, Some(Error::InvalidArgument(_))));
    Ok(())
}
