//! `DataFrameReader`: lazy reads of files (CSV, Parquet, JSON, ...) and tables.

use std::collections::HashMap;

use arrow::datatypes::Schema;
use spark_connect_proto::read::{DataSource, NamedTable, ReadType};
use spark_connect_proto::relation::RelType;

use crate::dataframe::DataFrame;
use crate::error::Result;
use crate::session::SparkSession;
use crate::types::schema_to_ddl;

/// Builds a read of a data source; like PySpark's `spark.read`.
///
/// Paths are resolved by the Spark server (its filesystem, HDFS, S3, ...).
///
/// ```no_run
/// # fn demo(spark: kindling_spark::SparkSession) {
/// let csv = spark.read().option("header", "true").option("inferSchema", "true").csv(["/data/a.csv"]);
/// let typed = spark.read().schema_ddl("id BIGINT, name STRING").json(["/data/b.json"]);
/// let pq = spark.read().parquet(["/data/c.parquet"]);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DataFrameReader {
    session: SparkSession,
    format: Option<String>,
    schema: Option<String>,
    options: HashMap<String, String>,
}

impl DataFrameReader {
    pub(crate) fn new(session: SparkSession) -> Self {
        Self {
            session,
            format: None,
            schema: None,
            options: HashMap::new(),
        }
    }

    /// The data source (`"csv"`, `"parquet"`, `"json"`, `"orc"`, `"text"`, ...).
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let df = spark.read().format("orc").load(["/data/x.orc"]);
    /// # }
    /// ```
    pub fn format(mut self, format: &str) -> Self {
        self.format = Some(format.to_string());
        self
    }

    /// A source option, e.g. `("header", "true")`, `("sep", ";")`.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let r = spark.read().option("header", "true");
    /// # }
    /// ```
    pub fn option(mut self, key: &str, value: impl ToString) -> Self {
        self.options.insert(key.to_string(), value.to_string());
        self
    }

    /// Several options at once.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let r = spark.read().options([("header", "true"), ("inferSchema", "true")]);
    /// # }
    /// ```
    pub fn options<K: AsRef<str>, V: ToString>(mut self, options: impl IntoIterator<Item = (K, V)>) -> Self {
        for (k, v) in options {
            self.options.insert(k.as_ref().to_string(), v.to_string());
        }
        self
    }

    /// The schema as Spark DDL (`"id BIGINT, name STRING"`), skipping inference.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let r = spark.read().schema_ddl("id BIGINT, fare DOUBLE");
    /// # }
    /// ```
    pub fn schema_ddl(mut self, ddl: &str) -> Self {
        self.schema = Some(ddl.to_string());
        self
    }

    /// The schema as an Arrow schema (converted to Spark DDL).
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// use arrow::datatypes::{DataType, Field, Schema};
    /// let schema = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
    /// let r = spark.read().schema(&schema)?;
    /// # Ok(()) }
    /// ```
    pub fn schema(self, schema: &Schema) -> Result<Self> {
        Ok(self.schema_ddl(&schema_to_ddl(schema)?))
    }

    /// Reads `paths` with the configured format.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let df = spark.read().format("parquet").load(["/data/part-0.parquet", "/data/part-1.parquet"]);
    /// # }
    /// ```
    pub fn load<S: AsRef<str>>(self, paths: impl IntoIterator<Item = S>) -> DataFrame {
        let session = self.session.clone();
        session.dataframe(RelType::Read(spark_connect_proto::Read {
            read_type: Some(ReadType::DataSource(DataSource {
                format: self.format,
                schema: self.schema,
                options: self.options,
                paths: paths.into_iter().map(|p| p.as_ref().to_string()).collect(),
                ..Default::default()
            })),
            is_streaming: false,
        }))
    }

    /// CSV files (`header`, `inferSchema`, `sep`, ... as options).
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let df = spark.read().option("header", "true").csv(["/data/a.csv"]);
    /// # }
    /// ```
    pub fn csv<S: AsRef<str>>(self, paths: impl IntoIterator<Item = S>) -> DataFrame {
        self.format("csv").load(paths)
    }

    /// Parquet files.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let df = spark.read().parquet(["/data/a.parquet"]);
    /// # }
    /// ```
    pub fn parquet<S: AsRef<str>>(self, paths: impl IntoIterator<Item = S>) -> DataFrame {
        self.format("parquet").load(paths)
    }

    /// JSON-lines files (`multiLine` option for whole-file JSON).
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let df = spark.read().json(["/data/a.jsonl"]);
    /// # }
    /// ```
    pub fn json<S: AsRef<str>>(self, paths: impl IntoIterator<Item = S>) -> DataFrame {
        self.format("json").load(paths)
    }

    /// A table or view by name (options are passed to the table's source).
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let df = spark.read().table("warehouse.trips");
    /// # }
    /// ```
    pub fn table(self, name: &str) -> DataFrame {
        let session = self.session.clone();
        session.dataframe(RelType::Read(spark_connect_proto::Read {
            read_type: Some(ReadType::NamedTable(NamedTable {
                unparsed_identifier: name.to_string(),
                options: self.options,
            })),
            is_streaming: false,
        }))
    }
}
