//! A small ETL: read a CSV, derive features, aggregate, stream the result.
//!
//! ```text
//! cargo run -p kindling --example spark_etl -- sc://127.0.0.1:15002
//! ```

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use futures::TryStreamExt;
use kindling::spark::functions::{col, count, lit, log, mean, stddev, when};
use kindling::spark::{JoinType, SparkSession};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let remote = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let spark = SparkSession::connect(&remote).await?;
    println!(
        "Spark {} (session {})",
        spark.version().await?,
        spark.session_id()
    );

    let dir = tempfile::tempdir()?;
    let csv = dir.path().join("trips.csv");
    std::fs::write(
        &csv,
        "id,city,km,fare\n1,paris,3.2,12.5\n2,rome,10.4,30.0\n3,paris,0.0,4.0\n4,rome,22.0,51.0\n",
    )?;
    let trips = spark
        .read()
        .option("header", "true")
        .option("inferSchema", "true")
        .csv([csv.to_string_lossy()]);

    let features = trips.filter(col("km").gt(0)).with_columns([
        ("fare_per_km", col("fare") / col("km")),
        ("log_km", log(col("km") + 1)),
        ("long", when(col("km").gt(10), lit(1)).otherwise(lit(0))),
    ]);
    features.show(10).await?;

    // Predictions computed in Rust go back to Spark without files.
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("prediction", DataType::Float64, false),
    ]));
    let predictions = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 4])),
            Arc::new(Float64Array::from(vec![0.1, 0.8, 0.9])),
        ],
    )?;
    let predictions = spark.create_dataframe(schema, [predictions]).await?;
    let scored = features
        .with_column("id", col("id").cast("bigint"))
        .join_using(&predictions, ["id"], JoinType::Inner)
        .group_by(["city"])
        .agg([
            count(col("*")).alias("trips"),
            mean(col("prediction")).alias("mean_prediction"),
            stddev(col("fare_per_km")).alias("sd_fare_per_km"),
        ])
        .order_by(["city"]);

    let mut stream = scored.execute_stream().await?;
    println!(
        "schema: {:?}",
        stream
            .schema()
            .fields()
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
    );
    while let Some(batch) = stream.try_next().await? {
        println!("{}", arrow::util::pretty::pretty_format_batches(&[batch])?);
    }
    Ok(())
}
