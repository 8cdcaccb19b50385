//! `DataFrame::write()`: saving a DataFrame to files (Parquet, CSV, JSON, ...) by path.

use std::collections::HashMap;

use spark_connect_proto as proto;
use spark_connect_proto::write_operation::{SaveMode as ProtoSaveMode, SaveType};

use crate::dataframe::DataFrame;
use crate::error::{Error, Result};
use crate::stream;

/// What to do when the target path already holds data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveMode {
    /// Fail if the path exists (Spark's default).
    #[default]
    ErrorIfExists,
    /// Replace whatever the path holds.
    Overwrite,
    /// Add files next to the existing ones.
    Append,
    /// Do nothing if the path exists.
    Ignore,
}

impl SaveMode {
    fn to_proto(self) -> ProtoSaveMode {
        match self {
            SaveMode::ErrorIfExists => ProtoSaveMode::ErrorIfExists,
            SaveMode::Overwrite => ProtoSaveMode::Overwrite,
            SaveMode::Append => ProtoSaveMode::Append,
            SaveMode::Ignore => ProtoSaveMode::Ignore,
        }
    }
}

/// Writes a DataFrame out through Spark (the files are written by the Spark
/// executors, on the server's file system). Built by [`DataFrame::write`].
///
/// ```no_run
/// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
/// use kindling_spark::SaveMode;
/// df.write().mode(SaveMode::Overwrite).option("compression", "snappy").parquet("/tmp/out").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DataFrameWriter {
    df: DataFrame,
    mode: SaveMode,
    format: Option<String>,
    options: HashMap<String, String>,
    partition_by: Vec<String>,
}

impl DataFrameWriter {
    pub(crate) fn new(df: DataFrame) -> Self {
        Self {
            df,
            mode: SaveMode::default(),
            format: None,
            options: HashMap::new(),
            partition_by: Vec::new(),
        }
    }

    /// What to do if the path already exists (default: fail).
    pub fn mode(mut self, mode: SaveMode) -> Self {
        self.mode = mode;
        self
    }

    /// The data source (`parquet`, `csv`, `json`, `orc`, ...) used by [`save`](Self::save).
    pub fn format(mut self, format: impl Into<String>) -> Self {
        self.format = Some(format.into());
        self
    }

    /// A data source option, e.g. `compression` = `zstd`, `header` = `true`.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.insert(key.into(), value.into());
        self
    }

    /// Lays the output out in one directory per value of these columns.
    pub fn partition_by<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.partition_by = columns.into_iter().map(Into::into).collect();
        self
    }

    /// Runs the query and writes its result to `path` in the chosen format;
    /// returns when Spark has committed the files.
    pub async fn save(self, path: &str) -> Result<()> {
        if path.is_empty() {
            return Err(Error::InvalidArgument("write: the output path is empty".into()));
        }
        let write = proto::WriteOperation {
            input: Some(self.df.relation().clone()),
            source: self.format,
            mode: self.mode.to_proto() as i32,
            partitioning_columns: self.partition_by,
            options: self.options,
            save_type: Some(SaveType::Path(path.to_string())),
            ..Default::default()
        };
        let plan = proto::Plan {
            op_type: Some(proto::plan::OpType::Command(proto::Command {
                command_type: Some(proto::command::CommandType::WriteOperation(write)),
            })),
        };
        stream::execute_command(self.df.session().transport(), plan).await?;
        Ok(())
    }

    /// `format("parquet").save(path)`.
    pub async fn parquet(self, path: &str) -> Result<()> {
        self.format("parquet").save(path).await
    }

    /// `format("csv").save(path)` (set `header` with [`option`](Self::option)).
    pub async fn csv(self, path: &str) -> Result<()> {
        self.format("csv").save(path).await
    }

    /// `format("json").save(path)` (one JSON object per line).
    pub async fn json(self, path: &str) -> Result<()> {
        self.format("json").save(path).await
    }
}

impl DataFrame {
    /// Writes this DataFrame out through Spark; see [`DataFrameWriter`].
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// df.write().mode(kindling_spark::SaveMode::Overwrite).parquet("/tmp/features").await?;
    /// # Ok(()) }
    /// ```
    pub fn write(&self) -> DataFrameWriter {
        DataFrameWriter::new(self.clone())
    }
}
