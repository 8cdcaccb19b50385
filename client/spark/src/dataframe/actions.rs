//! The actions of a [`DataFrame`]: what sends its plan to the server —
//! analysis (schema, explain, storage level), caching, views, and execution
//! (`execute_stream`, `collect`, `count`, `show`).

use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch};
use arrow::datatypes::SchemaRef;
use futures::TryStreamExt;
use spark_connect_proto::analyze_plan_request::{self as analyze, Analyze};
use spark_connect_proto::analyze_plan_response::Result as AnalyzeResult;
use spark_connect_proto::{self as proto, Plan, Relation, StorageLevel};

use super::{DataFrame, ExplainMode};
use crate::error::{Error, Result};
use crate::functions::{count, lit};
use crate::stream::{self, SparkStream};
use crate::types::spark_to_arrow_schema;

impl DataFrame {
    /// Names the DataFrame for SQL: `spark.sql("SELECT * FROM name")`.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// df.create_or_replace_temp_view("trips").await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_or_replace_temp_view(&self, name: &str) -> Result<()> {
        let command = proto::Command {
            command_type: Some(proto::command::CommandType::CreateDataframeView(
                proto::CreateDataFrameViewCommand {
                    input: Some(Relation::clone(&self.plan)),
                    name: name.to_string(),
                    is_global: false,
                    replace: true,
                },
            )),
        };
        let plan = Plan {
            op_type: Some(proto::plan::OpType::Command(command)),
        };
        stream::execute_command(self.session.transport(), plan).await?;
        Ok(())
    }

    /// Caches the result at `level` on first use (see [`StorageLevel`] helpers
    /// [`memory_and_disk`](crate::memory_and_disk)).
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let df = df.persist(kindling_spark::memory_and_disk()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn persist(&self, level: StorageLevel) -> Result<Self> {
        self.analyze(Analyze::Persist(analyze::Persist {
            relation: Some(Relation::clone(&self.plan)),
            storage_level: Some(level),
        }))
        .await?;
        Ok(self.clone())
    }

    /// [`DataFrame::persist`] with memory and disk.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let df = df.cache().await?;
    /// # Ok(()) }
    /// ```
    pub async fn cache(&self) -> Result<Self> {
        self.persist(crate::memory_and_disk()).await
    }

    /// Drops the cached data.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// df.unpersist(true).await?;
    /// # Ok(()) }
    /// ```
    pub async fn unpersist(&self, blocking: bool) -> Result<Self> {
        self.analyze(Analyze::Unpersist(analyze::Unpersist {
            relation: Some(Relation::clone(&self.plan)),
            blocking: Some(blocking),
        }))
        .await?;
        Ok(self.clone())
    }

    /// The storage level this DataFrame is cached at (all `false` when not cached).
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let cached = df.storage_level().await?.use_memory;
    /// # Ok(()) }
    /// ```
    pub async fn storage_level(&self) -> Result<StorageLevel> {
        match self
            .analyze(Analyze::GetStorageLevel(analyze::GetStorageLevel {
                relation: Some(Relation::clone(&self.plan)),
            }))
            .await?
        {
            AnalyzeResult::GetStorageLevel(r) => r
                .storage_level
                .ok_or_else(|| Error::Protocol("no storage level in answer".into())),
            other => Err(unexpected("a storage level", &other)),
        }
    }

    /// The analyzed result schema as Arrow, without running the query.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// for field in df.schema().await?.fields() { println!("{field}"); }
    /// # Ok(()) }
    /// ```
    pub async fn schema(&self) -> Result<SchemaRef> {
        match self
            .analyze(Analyze::Schema(analyze::Schema {
                plan: Some(self.root()),
            }))
            .await?
        {
            AnalyzeResult::Schema(s) => {
                let schema = s
                    .schema
                    .ok_or_else(|| Error::Protocol("no schema in answer".into()))?;
                Ok(Arc::new(spark_to_arrow_schema(&schema)?))
            }
            other => Err(unexpected("a schema", &other)),
        }
    }

    /// Spark's query plan as text.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// println!("{}", df.explain(kindling_spark::ExplainMode::Formatted).await?);
    /// # Ok(()) }
    /// ```
    pub async fn explain(&self, mode: ExplainMode) -> Result<String> {
        use analyze::explain::ExplainMode as P;
        let mode = match mode {
            ExplainMode::Simple => P::Simple,
            ExplainMode::Extended => P::Extended,
            ExplainMode::Codegen => P::Codegen,
            ExplainMode::Cost => P::Cost,
            ExplainMode::Formatted => P::Formatted,
        };
        match self
            .analyze(Analyze::Explain(analyze::Explain {
                plan: Some(self.root()),
                explain_mode: mode as i32,
            }))
            .await?
        {
            AnalyzeResult::Explain(e) => Ok(e.explain_string),
            other => Err(unexpected("an explain string", &other)),
        }
    }

    async fn analyze(&self, request: Analyze) -> Result<AnalyzeResult> {
        self.session.transport().analyze(request).await
    }

    /// Runs the query and streams its Arrow batches as Spark sends them
    /// (see [`SparkStream`]); the schema is available before iterating.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// use futures::TryStreamExt;
    /// let mut stream = df.execute_stream().await?;
    /// while let Some(batch) = stream.try_next().await? { println!("{} rows", batch.num_rows()); }
    /// # Ok(()) }
    /// ```
    pub async fn execute_stream(&self) -> Result<SparkStream> {
        stream::execute(self.session.transport(), self.root()).await
    }

    /// Runs the query and keeps every batch: only for small results (use
    /// [`DataFrame::execute_stream`] otherwise). Empty results give no batches.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let batches = df.limit(100).collect().await?;
    /// # Ok(()) }
    /// ```
    pub async fn collect(&self) -> Result<Vec<RecordBatch>> {
        self.execute_stream().await?.try_collect().await
    }

    /// Number of rows (runs a `count(1)` aggregate on the server).
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let n = df.count().await?;
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<i64> {
        let batches = self.agg([count(lit(1)).alias("count")]).collect().await?;
        batches
            .first()
            .and_then(|b| b.column(0).as_any().downcast_ref::<Int64Array>())
            .filter(|a| !a.is_empty() && a.is_valid(0))
            .map(|a| a.value(0))
            .ok_or_else(|| Error::Protocol("count returned no value".into()))
    }

    /// Prints the first `n` rows as a table.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// df.show(20).await?;
    /// # Ok(()) }
    /// ```
    pub async fn show(&self, n: i32) -> Result<()> {
        let batches = self.limit(n).collect().await?;
        println!("{}", arrow::util::pretty::pretty_format_batches(&batches)?);
        Ok(())
    }
}

fn unexpected(what: &str, got: &AnalyzeResult) -> Error {
    Error::Protocol(format!("expected {what}, got {got:?}"))
}
