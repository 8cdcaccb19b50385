//! DataFrame operations and functions, each checked for exact results on the real server.

use arrow::array::{AsArray, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type};
use kindling::spark::functions::*;
use kindling::spark::{DataFrame, Error, ExplainMode, JoinType, SparkSession};
use kindling_tests::spark::spark_remote;

async fn spark() -> SparkSession {
    match SparkSession::connect(&spark_remote()).await {
        Ok(s) => s,
        Err(e) => panic!("cannot connect: {e}"),
    }
}

async fn rows(df: &DataFrame) -> Result<RecordBatch, Error> {
    let batches = df.collect().await?;
    let schema = match batches.first() {
        Some(b) => b.schema(),
        None => df.schema().await?,
    };
    Ok(concat_batches(&schema, &batches)?)
}

fn i64s(b: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    let c = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    c.as_primitive::<Int64Type>().iter().collect()
}

fn f64s(b: &RecordBatch, name: &str) -> Vec<Option<f64>> {
    let c = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    c.as_primitive::<Float64Type>().iter().collect()
}

fn strs(b: &RecordBatch, name: &str) -> Vec<Option<String>> {
    let c = b
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    c.as_string::<i32>()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect()
}

fn some<T>(v: impl IntoIterator<Item = T>) -> Vec<Option<T>> {
    v.into_iter().map(Some).collect()
}

/// people(id, name, dept, salary) with a null salary.
async fn people(spark: &SparkSession) -> Result<DataFrame, Error> {
    spark
        .sql(
            "SELECT * FROM VALUES (1, 'ann', 'eng', 100.0D), (2, 'bob', 'eng', 80.0D), \
             (3, 'cid', 'ops', 60.0D), (4, 'dee', 'ops', CAST(NULL AS DOUBLE)) \
             AS t(id, name, dept, salary)",
        )
        .await
}

#[tokio::test]
async fn range_select_filter_with_column_drop_order_limit() -> Result<(), Error> {
    let spark = spark().await;
    let df = spark
        .range(0, 10, 1)
        .filter(col("id").ge(3) & col("id").lt(8))
        .with_column("sq", col("id") * col("id"))
        .with_columns([("neg", -col("id")), ("half", col("id") / 2)])
        .drop(["half"])
        .select(["id", "sq", "neg"])
        .order_by([col("id").desc()])
        .limit(3);
    let b = rows(&df).await?;
    assert_eq!(i64s(&b, "id"), some([7, 6, 5]));
    assert_eq!(i64s(&b, "sq"), some([49, 36, 25]));
    assert_eq!(i64s(&b, "neg"), some([-7, -6, -5]));
    assert_eq!(b.num_columns(), 3);
    assert_eq!(df.count().await?, 3);
    Ok(())
}

#[tokio::test]
async fn select_expr_where_and_renamed() -> Result<(), Error> {
    let spark = spark().await;
    let df = spark
        .range(1, 4, 1)
        .select_expr(["id", "id * 10 AS tens"])
        .r#where(expr("tens > 10"))
        .with_column_renamed("tens", "t");
    let b = rows(&df).await?;
    assert_eq!(i64s(&b, "id"), some([2, 3]));
    assert_eq!(i64s(&b, "t"), some([20, 30]));
    Ok(())
}

#[tokio::test]
async fn group_by_agg_and_aggregate_functions() -> Result<(), Error> {
    let spark = spark().await;
    let df = people(&spark)
        .await?
        .group_by(["dept"])
        .agg([
            count(col("*")).alias("n"),
            count(col("salary")).alias("n_salary"),
            sum(col("salary")).alias("total"),
            mean(col("salary")).alias("avg"),
            min(col("salary")).alias("lo"),
            max(col("salary")).alias("hi"),
            stddev(col("salary")).alias("sd"),
        ])
        .order_by(["dept"]);
    let b = rows(&df).await?;
    assert_eq!(strs(&b, "dept"), some(["eng".to_string(), "ops".to_string()]));
    assert_eq!(i64s(&b, "n"), some([2, 2]));
    assert_eq!(i64s(&b, "n_salary"), some([2, 1]));
    assert_eq!(f64s(&b, "total"), some([180.0, 60.0]));
    assert_eq!(f64s(&b, "avg"), some([90.0, 60.0]));
    assert_eq!(f64s(&b, "lo"), some([80.0, 60.0]));
    assert_eq!(f64s(&b, "hi"), some([100.0, 60.0]));
    let sd = f64s(&b, "sd");
    assert!((sd[0].unwrap_or(f64::NAN) - 200f64.sqrt()).abs() < 1e-9);
    assert_eq!(sd[1], None, "stddev of one value is null");

    let all = people(&spark).await?.agg([sum(col("id")).alias("s")]);
    assert_eq!(i64s(&rows(&all).await?, "s"), some([10]));
    let counted = people(&spark)
        .await?
        .group_by(["dept"])
        .count()
        .order_by(["dept"]);
    assert_eq!(i64s(&rows(&counted).await?, "count"), some([2, 2]));
    Ok(())
}

#[tokio::test]
async fn scalar_functions_null_handling_and_cast() -> Result<(), Error> {
    let spark = spark().await;
    let df = people(&spark)
        .await?
        .select([
            col("id"),
            when(col("salary").is_null(), lit("none"))
                .when(col("salary").gt(90), lit("high"))
                .otherwise(lit("mid"))
                .alias("band"),
            coalesce([col("salary"), lit(0.0)]).alias("salary0"),
            col("salary").is_not_null().alias("has"),
            sqrt(col("id") * 4).alias("root"),
            log(lit(1.0)).alias("ln1"),
            abs(col("id") - 3).alias("dist"),
            (col("id") % 2).eq(0).alias("even"),
            col("id").cast("double").alias("as_double"),
            col("id").cast("string").alias("as_string"),
            upper(col("name")).alias("upper"),
            col("name").is_in(["ann", "dee"]).alias("picked"),
        ])
        .order_by(["id"]);
    let b = rows(&df).await?;
    assert_eq!(
        strs(&b, "band"),
        some(["high", "mid", "mid", "none"].map(String::from))
    );
    assert_eq!(f64s(&b, "salary0"), some([100.0, 80.0, 60.0, 0.0]));
    let has: Vec<_> = b
        .column_by_name("has")
        .map(|c| c.as_boolean().iter().collect())
        .unwrap_or_default();
    assert_eq!(has, some([true, true, true, false]));
    assert_eq!(f64s(&b, "root"), some([2.0, 8f64.sqrt(), 12f64.sqrt(), 4.0]));
    assert_eq!(f64s(&b, "ln1"), some([0.0; 4]));
    let dist: Vec<_> = b
        .column_by_name("dist")
        .map(|c| c.as_primitive::<Int32Type>().iter().collect())
        .unwrap_or_default();
    assert_eq!(dist, some([2, 1, 0, 1]));
    let even: Vec<_> = b
        .column_by_name("even")
        .map(|c| c.as_boolean().iter().collect())
        .unwrap_or_default();
    assert_eq!(even, some([false, true, false, true]));
    assert_eq!(f64s(&b, "as_double"), some([1.0, 2.0, 3.0, 4.0]));
    assert_eq!(
        strs(&b, "as_string"),
        some(["1", "2", "3", "4"].map(String::from))
    );
    assert_eq!(
        strs(&b, "upper"),
        some(["ANN", "BOB", "CID", "DEE"].map(String::from))
    );
    let picked: Vec<_> = b
        .column_by_name("picked")
        .map(|c| c.as_boolean().iter().collect())
        .unwrap_or_default();
    assert_eq!(picked, some([true, false, false, true]));
    Ok(())
}

#[tokio::test]
async fn joins_inner_left_semi_anti_and_using() -> Result<(), Error> {
    let spark = spark().await;
    let left = spark.range(0, 5, 1);
    let right = spark
        .range(3, 8, 1)
        .select([col("id"), (col("id") * 100).alias("v")]);
    let inner = left
        .join(&right, left.col("id").eq(right.col("id")), JoinType::Inner)
        .select([left.col("id"), right.col("v")])
        .order_by(["id"]);
    let b = rows(&inner).await?;
    assert_eq!(i64s(&b, "id"), some([3, 4]));
    assert_eq!(i64s(&b, "v"), some([300, 400]));

    let outer = left
        .join_using(&right, ["id"], JoinType::LeftOuter)
        .order_by(["id"]);
    let b = rows(&outer).await?;
    assert_eq!(i64s(&b, "id"), some([0, 1, 2, 3, 4]));
    assert_eq!(i64s(&b, "v"), vec![None, None, None, Some(300), Some(400)]);

    let full = left.join_using(&right, ["id"], JoinType::FullOuter);
    assert_eq!(full.count().await?, 8);
    let semi = left
        .join_using(&right, ["id"], JoinType::LeftSemi)
        .order_by(["id"]);
    assert_eq!(i64s(&rows(&semi).await?, "id"), some([3, 4]));
    let anti = left
        .join_using(&right, ["id"], JoinType::LeftAnti)
        .order_by(["id"]);
    assert_eq!(i64s(&rows(&anti).await?, "id"), some([0, 1, 2]));
    let right_outer = left.join_using(&right, ["id"], JoinType::RightOuter);
    assert_eq!(right_outer.count().await?, 5);
    assert_eq!(left.cross_join(&right).count().await?, 25);
    Ok(())
}

#[tokio::test]
async fn distinct_union_repartition_set_ops() -> Result<(), Error> {
    let spark = spark().await;
    let a = spark.range(0, 4, 1);
    let b = spark.range(2, 6, 1);
    let both = a.union(&b);
    assert_eq!(both.count().await?, 8);
    let d = both.distinct().order_by(["id"]);
    assert_eq!(i64s(&rows(&d).await?, "id"), some([0, 1, 2, 3, 4, 5]));
    assert_eq!(a.union_by_name(&b).count().await?, 8);
    assert_eq!(
        i64s(&rows(&a.intersect(&b).order_by(["id"])).await?, "id"),
        some([2, 3])
    );
    assert_eq!(
        i64s(&rows(&a.subtract(&b).order_by(["id"])).await?, "id"),
        some([0, 1])
    );

    let repart = both
        .repartition(3)
        .select([spark_partition_id().alias("p")])
        .distinct();
    assert_eq!(repart.count().await?, 3);
    let one = both
        .repartition(4)
        .coalesce(1)
        .select([spark_partition_id().alias("p")])
        .distinct();
    assert_eq!(one.count().await?, 1);
    let by = both
        .repartition_by(Some(2), ["id"])
        .select([spark_partition_id().alias("p")])
        .distinct();
    assert!(by.count().await? <= 2);
    Ok(())
}

fn spark_partition_id() -> kindling::spark::Column {
    kindling::spark::Column::call("spark_partition_id", [])
}

#[tokio::test]
async fn random_split_is_disjoint_complete_and_deterministic() -> Result<(), Error> {
    let spark = spark().await;
    let df = spark.range_partitions(0, 10_000, 1, Some(4));
    let splits = df.random_split(&[0.8, 0.2], 42)?;
    assert_eq!(splits.len(), 2);
    let train = splits[0].count().await?;
    let test = splits[1].count().await?;
    assert_eq!(train + test, 10_000);
    assert!((7_500..8_500).contains(&train), "train = {train}");
    assert_eq!(splits[0].intersect(&splits[1]).count().await?, 0);
    // Same seed, same rows; another seed, other rows.
    let again = df.random_split(&[0.8, 0.2], 42)?;
    assert_eq!(again[1].subtract(&splits[1]).count().await?, 0);
    assert_eq!(again[1].count().await?, test);
    let other = df.random_split(&[0.8, 0.2], 7)?;
    assert!(other[1].subtract(&splits[1]).count().await? > 0);
    assert!(matches!(df.random_split(&[], 1), Err(Error::InvalidArgument(_))));

    let s1 = df.sample(0.1, 3);
    let s2 = df.sample(0.1, 3);
    let n = s1.count().await?;
    assert!((700..1_300).contains(&n), "sample = {n}");
    assert_eq!(s1.subtract(&s2).count().await?, 0);
    assert_eq!(s2.count().await?, n);
    Ok(())
}

#[tokio::test]
async fn random_split_in_order_keeps_the_row_order_that_random_split_sorts_away() -> Result<(), Error> {
    let spark = spark().await;
    // A random first column: Spark's sorted split orders each partition by it.
    let df = spark
        .range_partitions(0, 4_000, 1, Some(2))
        .select([rand(5).alias("r"), col("id")])
        .persist(kindling::spark::memory_only())
        .await?;
    let ascending = |ids: &[Option<i64>]| ids.windows(2).all(|w| w[0] < w[1]);
    let sorted = df.random_split(&[0.7, 0.3], 9)?;
    assert!(!ascending(&i64s(&rows(&sorted[0]).await?, "id")));
    let kept = df.random_split_in_order(&[0.7, 0.3], 9)?;
    let (a, b) = (
        i64s(&rows(&kept[0]).await?, "id"),
        i64s(&rows(&kept[1]).await?, "id"),
    );
    assert!(ascending(&a) && ascending(&b), "in-order split reordered rows");
    // Disjoint and complete, and the same rows again (the input is persisted).
    let mut all: Vec<i64> = a.iter().chain(&b).flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..4_000).collect::<Vec<_>>());
    assert!((2_500..3_100).contains(&a.len()), "{}", a.len());
    let again = df.random_split_in_order(&[0.7, 0.3], 9)?;
    assert_eq!(i64s(&rows(&again[1]).await?, "id"), b);
    df.unpersist(true).await?;
    Ok(())
}

#[tokio::test]
async fn persist_unpersist_schema_explain_sql_table() -> Result<(), Error> {
    let spark = spark().await;
    let df = spark
        .range(0, 100, 1)
        .with_column("x", col("id").cast("double") / 2);
    let cached = df.persist(kindling::spark::memory_only()).await?;
    let level = cached.storage_level().await?;
    assert!(level.use_memory && !level.use_disk);
    assert_eq!(cached.count().await?, 100);
    cached.unpersist(true).await?;
    let level = cached.storage_level().await?;
    assert!(!level.use_memory && !level.use_disk);

    let schema = df.schema().await?;
    assert_eq!(schema.field(0).name(), "id");
    assert_eq!(schema.field(0).data_type(), &DataType::Int64);
    assert!(!schema.field(0).is_nullable());
    assert_eq!(schema.field(1).name(), "x");
    assert_eq!(schema.field(1).data_type(), &DataType::Float64);

    let plan = df.filter(col("id").gt(5)).explain(ExplainMode::Extended).await?;
    assert!(plan.contains("== Physical Plan =="), "{plan}");
    assert!(plan.contains("Range (0, 100"), "{plan}");

    df.create_or_replace_temp_view("kindling_df_test").await?;
    let total = spark.sql("SELECT sum(id) AS s FROM kindling_df_test").await?;
    assert_eq!(i64s(&rows(&total).await?, "s"), some([4950]));
    assert_eq!(spark.table("kindling_df_test").count().await?, 100);
    // A SQL command runs once, eagerly.
    spark
        .sql("CREATE OR REPLACE TEMP VIEW kindling_v2 AS SELECT 1 AS one")
        .await?;
    assert_eq!(spark.table("kindling_v2").count().await?, 1);
    Ok(())
}

#[tokio::test]
async fn dataframes_are_immutable_and_cheap_to_clone() -> Result<(), Error> {
    let spark = spark().await;
    let base = spark.range(0, 10, 1);
    let filtered = base.filter(col("id").lt(3));
    let copy = filtered.clone();
    assert_eq!(base.count().await?, 10);
    assert_eq!(filtered.count().await?, 3);
    assert_eq!(copy.relation(), filtered.relation());
    Ok(())
}
