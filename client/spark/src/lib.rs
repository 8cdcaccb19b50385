//! Spark Connect client: a session, lazy DataFrames that build Spark Connect plans,
//! and query results streamed as Arrow record batches.
//!
//! Transport pieces (URL parsing, error details, retry policy, reattach bookkeeping)
//! come from the ASF `apache-spark-connect-core` crate and the plan types from
//! `apache-spark-connect-proto`; this module is the thin async, typed layer on top.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kindling_spark::Error> {
//! use futures::TryStreamExt;
//! use kindling_spark::{SparkSession, functions::*};
//!
//! let spark = SparkSession::connect("sc://127.0.0.1:15002").await?;
//! let df = spark
//!     .range(0, 1_000_000, 1)
//!     .with_column("x", sqrt(col("id")))
//!     .filter((col("id") % 2).eq(0));
//! let mut batches = df.execute_stream().await?;
//! while let Some(batch) = batches.try_next().await? {
//!     println!("{} rows", batch.num_rows());
//! }
//! # Ok(()) }
//! ```

mod column;
mod dataframe;
mod error;
pub mod functions;
mod grouped;
mod local_relation;
mod python;
mod reader;
mod remote;
mod session;
mod stream;
mod transport;
mod types;
mod writer;

pub use column::{Column, ColumnRef};
pub use dataframe::{DataFrame, ExplainMode, JoinType};
pub use error::{Error, Result};
pub use grouped::GroupedData;
pub use python::{MapInArrowUdf, SQL_MAP_ARROW_ITER_UDF};
pub use reader::DataFrameReader;
pub use remote::RemoteUrl;
pub use session::{DataBytes, SparkSession, SparkSessionBuilder};
pub use spark_connect_core::RetryPolicy;
/// The Spark Connect protocol types (plans, expressions) this client builds.
pub use spark_connect_proto as proto;
pub use spark_connect_proto::StorageLevel;
pub use stream::{RecordBatchStream, ResponseDecoder, SparkStream};
pub use types::{arrow_to_ddl, schema_to_ddl};
pub use writer::{DataFrameWriter, SaveMode};

/// Memory, spilling to disk (Spark's default for `cache()`).
///
/// ```
/// let level = kindling_spark::memory_and_disk();
/// assert!(level.use_memory && level.use_disk);
/// ```
pub fn memory_and_disk() -> StorageLevel {
    StorageLevel {
        use_disk: true,
        use_memory: true,
        use_off_heap: false,
        deserialized: false,
        replication: 1,
    }
}

/// Memory only.
///
/// ```
/// let level = kindling_spark::memory_only();
/// assert!(level.use_memory && !level.use_disk);
/// ```
pub fn memory_only() -> StorageLevel {
    StorageLevel {
        use_disk: false,
        ..memory_and_disk()
    }
}

/// Disk only.
///
/// ```
/// let level = kindling_spark::disk_only();
/// assert!(!level.use_memory && level.use_disk);
/// ```
pub fn disk_only() -> StorageLevel {
    StorageLevel {
        use_memory: false,
        ..memory_and_disk()
    }
}
