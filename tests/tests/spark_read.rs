//! Reading CSV, JSON and Parquet files the test writes.

use std::io::Write;

use arrow::array::{AsArray, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type};
use kindling::spark::functions::col;
use kindling::spark::{Error, SparkSession};
use kindling_tests::spark::spark_remote;

async fn spark() -> SparkSession {
    match SparkSession::connect(&spark_remote()).await {
        Ok(s) => s,
        Err(e) => panic!("cannot connect: {e}"),
    }
}

fn all(batches: Vec<RecordBatch>) -> RecordBatch {
    let schema = batches[0].schema();
    concat_batches(&schema, &batches).unwrap_or_else(|e| panic!("{e}"))
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
    f.write_all(text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn csv_with_header_and_inferred_schema() -> Result<(), Error> {
    let spark = spark().await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = write(
        &dir,
        "trips.csv",
        "id,city,fare\n1,paris,10.5\n2,rome,7.25\n3,paris,3.0\n",
    );
    let df = spark
        .read()
        .option("header", "true")
        .option("inferSchema", "true")
        .csv([&path]);
    let schema = df.schema().await?;
    assert_eq!(schema.field(0).data_type(), &DataType::Int32);
    assert_eq!(schema.field(1).data_type(), &DataType::Utf8);
    assert_eq!(schema.field(2).data_type(), &DataType::Float64);
    let b = all(df
        .filter(col("city").eq("paris"))
        .order_by(["id"])
        .collect()
        .await?);
    let ids: Vec<_> = b.column(0).as_primitive::<Int32Type>().values().to_vec();
    assert_eq!(ids, vec![1, 3]);
    let fares: Vec<_> = b.column(2).as_primitive::<Float64Type>().values().to_vec();
    assert_eq!(fares, vec![10.5, 3.0]);

    // Without a header or inference, columns are strings named _c0...
    let raw = spark.read().csv([&path]);
    let schema = raw.schema().await?;
    assert_eq!(schema.field(0).name(), "_c0");
    assert_eq!(raw.count().await?, 4);

    // An explicit schema and options.
    let semi = write(&dir, "semi.csv", "1;x\n2;y\n");
    let typed = spark
        .read()
        .options([("sep", ";")])
        .schema_ddl("n BIGINT, s STRING")
        .csv([&semi]);
    let b = all(typed.collect().await?);
    assert_eq!(
        b.column(0).as_primitive::<Int64Type>().values().to_vec(),
        vec![1, 2]
    );
    Ok(())
}

#[tokio::test]
async fn json_lines() -> Result<(), Error> {
    let spark = spark().await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = write(
        &dir,
        "events.json",
        "{\"user\":\"a\",\"n\":1}\n{\"user\":\"b\",\"n\":5}\n{\"user\":\"a\",\"n\":2}\n",
    );
    let df = spark.read().json([&path]);
    let totals = df
        .group_by(["user"])
        .agg([kindling::spark::functions::sum(col("n")).alias("total")])
        .order_by(["user"]);
    let b = all(totals.collect().await?);
    let users: Vec<_> = b
        .column(0)
        .as_string::<i32>()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect();
    assert_eq!(users, vec![Some("a".to_string()), Some("b".to_string())]);
    assert_eq!(
        b.column(1).as_primitive::<Int64Type>().values().to_vec(),
        vec![3, 5]
    );
    Ok(())
}

#[tokio::test]
async fn parquet_written_then_read() -> Result<(), Error> {
    let spark = spark().await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = dir.path().join("pq");
    let out = out.to_string_lossy();
    spark
        .sql(&format!(
            "INSERT OVERWRITE DIRECTORY '{out}' USING parquet \
             SELECT id, id * 1.5D AS x FROM range(1000)"
        ))
        .await?;
    let df = spark.read().parquet([out.as_ref()]);
    assert_eq!(df.count().await?, 1000);
    let sums = all(df
        .agg([
            kindling::spark::functions::sum(col("id")).alias("s"),
            kindling::spark::functions::sum(col("x")).alias("sx"),
        ])
        .collect()
        .await?);
    assert_eq!(sums.column(0).as_primitive::<Int64Type>().value(0), 499_500);
    assert_eq!(sums.column(1).as_primitive::<Float64Type>().value(0), 749_250.0);
    let loaded = spark.read().format("parquet").load([out.as_ref()]);
    assert_eq!(loaded.schema().await?.field(1).data_type(), &DataType::Float64);
    Ok(())
}
