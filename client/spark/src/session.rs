//! `SparkSession`: one Spark Connect session (connection, identity, config) and DataFrame roots.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use spark_connect_core::RetryPolicy;
use spark_connect_proto::analyze_plan_request::{Analyze, SparkVersion};
use spark_connect_proto::analyze_plan_response::Result as AnalyzeResult;
use spark_connect_proto::command::CommandType;
use spark_connect_proto::config_request::{Get, Set, Unset, operation::OpType};
use spark_connect_proto::execute_plan_response::ResponseType;
use spark_connect_proto::relation::RelType;
use spark_connect_proto::{Command, KeyValue, Plan, Relation, RelationCommon, SqlCommand};
use tokio::sync::OnceCell;

use crate::dataframe::DataFrame;
use crate::error::{Error, Result};
use crate::reader::DataFrameReader;
use crate::remote::RemoteUrl;
use crate::stream;
use crate::transport::{Transport, TransportOptions};

/// A session on a Spark Connect server. Cheap to clone (an `Arc`); every
/// [`DataFrame`] keeps one.
///
/// ```no_run
/// # async fn demo() -> Result<(), kindling_spark::Error> {
/// use kindling_spark::SparkSession;
/// let spark = SparkSession::connect("sc://127.0.0.1:15002").await?;
/// println!("Spark {} session {}", spark.version().await?, spark.session_id());
/// spark.conf_set("spark.sql.shuffle.partitions", "8").await?;
/// let df = spark.sql("SELECT 1 AS one").await?;
/// df.show(10).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SparkSession {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    remote: RemoteUrl,
    next_plan_id: AtomicI64,
    version: OnceCell<String>,
}

impl fmt::Debug for SparkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SparkSession")
            .field("remote", &self.inner.remote)
            .field("session_id", &self.session_id())
            .finish()
    }
}

/// Data bytes a session moved through the client ([`SparkSession::data_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataBytes {
    /// Arrow IPC bytes of query results received.
    pub received: u64,
    /// Artifact bytes uploaded.
    pub sent: u64,
}

/// Options for a [`SparkSession`] beyond the URL.
///
/// ```no_run
/// # async fn demo() -> Result<(), kindling_spark::Error> {
/// use std::time::Duration;
/// let spark = kindling_spark::SparkSession::builder()
///     .remote("sc://127.0.0.1:15002/;user_id=etl")
///     .connect_timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct SparkSessionBuilder {
    remote: Option<String>,
    options: TransportOptions,
}

impl SparkSessionBuilder {
    /// The `sc://` URL to connect to.
    ///
    /// ```
    /// let b = kindling_spark::SparkSession::builder().remote("sc://localhost:15002");
    /// # let _ = b;
    /// ```
    pub fn remote(mut self, url: impl Into<String>) -> Self {
        self.remote = Some(url.into());
        self
    }

    /// How long to wait for the TCP/TLS connection (default 3 s).
    ///
    /// ```
    /// let b = kindling_spark::SparkSession::builder().connect_timeout(std::time::Duration::from_secs(1));
    /// # let _ = b;
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }

    /// Largest gRPC message accepted or sent (default 256 MiB; Spark sends up to 128 MiB).
    ///
    /// ```
    /// let b = kindling_spark::SparkSession::builder().max_message_size(512 << 20);
    /// # let _ = b;
    /// ```
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.options.max_message_size = bytes;
        self
    }

    /// Retry policy for transient failures and reattach (default: 3 retries, 100 ms
    /// doubling backoff).
    ///
    /// ```
    /// let b = kindling_spark::SparkSession::builder()
    ///     .retry_policy(spark_connect_core::RetryPolicy::no_retries());
    /// # let _ = b;
    /// ```
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.options.retry = policy;
        self
    }

    /// Connects and checks that the server answers (by asking its Spark version);
    /// a peer that does not answer within twice the connect timeout plus 5 s is a
    /// [`Error::Connection`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), kindling_spark::Error> {
    /// let spark = kindling_spark::SparkSession::builder().remote("sc://localhost").connect().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<SparkSession> {
        let url = self.remote.ok_or(Error::MissingRemote)?;
        let remote = RemoteUrl::parse(&url)?;
        let transport = Transport::new(&remote, &self.options)?;
        let session = SparkSession {
            inner: Arc::new(Inner {
                transport,
                remote,
                next_plan_id: AtomicI64::new(0),
                version: OnceCell::new(),
            }),
        };
        // A peer that accepts TCP but never answers gRPC must not hang the caller.
        let answer_within = self.options.connect_timeout * 2 + Duration::from_secs(5);
        match tokio::time::timeout(answer_within, session.version()).await {
            Ok(version) => version.map(|_| session),
            Err(_) => Err(Error::Connection {
                address: session.remote().address(),
                message: format!("no Spark Connect answer within {answer_within:?}"),
                source: tonic::Status::deadline_exceeded("no answer to SparkVersion"),
            }),
        }
    }
}

impl SparkSession {
    /// A builder for options beyond the URL.
    ///
    /// ```
    /// let b = kindling_spark::SparkSession::builder();
    /// # let _ = b;
    /// ```
    pub fn builder() -> SparkSessionBuilder {
        SparkSessionBuilder::default()
    }

    /// Connects to `url` (`sc://host:port/;token=..;use_ssl=true;user_id=..`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), kindling_spark::Error> {
    /// let spark = kindling_spark::SparkSession::connect("sc://127.0.0.1:15002").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder().remote(url).connect().await
    }

    /// Connects to the URL in the `SPARK_REMOTE` environment variable.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), kindling_spark::Error> {
    /// let spark = kindling_spark::SparkSession::from_env().await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_env() -> Result<Self> {
        let url = std::env::var("SPARK_REMOTE").map_err(|_| Error::MissingRemote)?;
        Self::connect(&url).await
    }

    pub(crate) fn transport(&self) -> &Transport {
        &self.inner.transport
    }

    /// This session's id (a UUID v4 the client chose, or `session_id=` from the URL).
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// println!("{}", spark.session_id());
    /// # }
    /// ```
    pub fn session_id(&self) -> &str {
        self.inner.transport.session_id()
    }

    /// The connection string, token redacted.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// println!("connected to {}", spark.remote());
    /// # }
    /// ```
    pub fn remote(&self) -> &RemoteUrl {
        &self.inner.remote
    }

    /// The client type / user agent string sent with every request.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// assert!(spark.user_agent().contains("kindling/"));
    /// # }
    /// ```
    pub fn user_agent(&self) -> &str {
        self.inner.transport.client_type()
    }

    /// Data bytes this session moved through the client so far: Arrow IPC
    /// received in query results, and artifact bytes uploaded (local relations,
    /// Python files). Plans, schemas and control messages are not counted.
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// let before = spark.data_bytes();
    /// spark.range(0, 1000, 1).collect().await?;
    /// assert!(spark.data_bytes().received > before.received);
    /// # Ok(()) }
    /// ```
    pub fn data_bytes(&self) -> DataBytes {
        let t = self.transport();
        DataBytes {
            received: t.bytes_in.load(Ordering::Relaxed),
            sent: t.bytes_out.load(Ordering::Relaxed),
        }
    }

    /// The server's Spark version (asked once, then cached).
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// assert!(spark.version().await?.starts_with('4'));
    /// # Ok(()) }
    /// ```
    pub async fn version(&self) -> Result<String> {
        let version = self
            .inner
            .version
            .get_or_try_init(|| async {
                match self
                    .inner
                    .transport
                    .analyze(Analyze::SparkVersion(SparkVersion {}))
                    .await?
                {
                    AnalyzeResult::SparkVersion(v) => Ok(v.version),
                    other => Err(Error::Protocol(format!("expected a version, got {other:?}"))),
                }
            })
            .await?;
        Ok(version.clone())
    }

    /// A runtime SQL config value (`None` if unset and without default).
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// let partitions = spark.conf_get("spark.sql.shuffle.partitions").await?;
    /// # Ok(()) }
    /// ```
    pub async fn conf_get(&self, key: &str) -> Result<Option<String>> {
        let response = self
            .inner
            .transport
            .config(OpType::Get(Get {
                keys: vec![key.to_string()],
            }))
            .await?;
        Ok(response
            .pairs
            .into_iter()
            .find(|pair| pair.key == key)
            .and_then(|pair| pair.value))
    }

    /// Sets a runtime SQL config for this session.
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// spark.conf_set("spark.sql.shuffle.partitions", "4").await?;
    /// # Ok(()) }
    /// ```
    pub async fn conf_set(&self, key: &str, value: &str) -> Result<()> {
        self.inner
            .transport
            .config(OpType::Set(Set {
                pairs: vec![KeyValue {
                    key: key.to_string(),
                    value: Some(value.to_string()),
                }],
                ..Default::default()
            }))
            .await?;
        Ok(())
    }

    /// Resets a runtime SQL config to its default.
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// spark.conf_unset("spark.sql.shuffle.partitions").await?;
    /// # Ok(()) }
    /// ```
    pub async fn conf_unset(&self, key: &str) -> Result<()> {
        self.inner
            .transport
            .config(OpType::Unset(Unset {
                keys: vec![key.to_string()],
            }))
            .await?;
        Ok(())
    }

    /// Runs a SQL statement: commands (DDL, `SET`, `CREATE VIEW`) run now, once;
    /// queries come back as a lazy [`DataFrame`].
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// spark.sql("CREATE OR REPLACE TEMP VIEW v AS SELECT id FROM range(10)").await?;
    /// let df = spark.sql("SELECT sum(id) AS total FROM v").await?;
    /// # Ok(()) }
    /// ```
    pub async fn sql(&self, query: &str) -> Result<DataFrame> {
        let input = self.relation(RelType::Sql(spark_connect_proto::Sql {
            query: query.to_string(),
            ..Default::default()
        }));
        let command = Command {
            command_type: Some(CommandType::SqlCommand(SqlCommand {
                input: Some(input),
                ..Default::default()
            })),
        };
        let plan = Plan {
            op_type: Some(spark_connect_proto::plan::OpType::Command(command)),
        };
        let responses = stream::execute_command(self.transport(), plan).await?;
        let relation = responses
            .into_iter()
            .find_map(|r| match r.response_type {
                Some(ResponseType::SqlCommandResult(result)) => result.relation,
                _ => None,
            })
            .ok_or_else(|| Error::Protocol("SQL command answered without a relation".into()))?;
        Ok(DataFrame::new(self.clone(), relation))
    }

    /// A table or view by name.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let trips = spark.table("trips");
    /// # }
    /// ```
    pub fn table(&self, name: &str) -> DataFrame {
        self.read().table(name)
    }

    /// Integers `start..end` by `step` in a column `id` (BIGINT).
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let ids = spark.range(0, 1_000, 1);
    /// # }
    /// ```
    pub fn range(&self, start: i64, end: i64, step: i64) -> DataFrame {
        self.range_partitions(start, end, step, None)
    }

    /// Like [`SparkSession::range`] with an explicit number of partitions.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let ids = spark.range_partitions(0, 1_000_000, 1, Some(8));
    /// # }
    /// ```
    pub fn range_partitions(
        &self,
        start: i64,
        end: i64,
        step: i64,
        num_partitions: Option<i32>,
    ) -> DataFrame {
        self.dataframe(RelType::Range(spark_connect_proto::Range {
            start: Some(start),
            end,
            step,
            num_partitions,
        }))
    }

    /// Reads files or tables: `spark.read().option("header", "true").csv(path)`.
    ///
    /// ```no_run
    /// # fn demo(spark: kindling_spark::SparkSession) {
    /// let df = spark.read().parquet(["/data/trips.parquet"]);
    /// # }
    /// ```
    pub fn read(&self) -> DataFrameReader {
        DataFrameReader::new(self.clone())
    }

    /// Releases this session on the server (its temp views, cache and artifacts).
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// spark.stop().await?;
    /// # Ok(()) }
    /// ```
    pub async fn stop(&self) -> Result<()> {
        let transport = self.transport();
        let request = spark_connect_proto::ReleaseSessionRequest {
            session_id: transport.session_id().to_string(),
            user_context: Some(transport.user_context()),
            client_type: Some(transport.client_type().to_string()),
            ..Default::default()
        };
        transport
            .stub()
            .release_session(request)
            .await
            .map_err(|s| transport.error(s))?;
        Ok(())
    }

    /// A relation with a fresh plan id (so columns can point at it in joins).
    pub(crate) fn relation(&self, rel_type: RelType) -> Relation {
        let plan_id = self.inner.next_plan_id.fetch_add(1, Ordering::Relaxed);
        Relation {
            common: Some(RelationCommon {
                plan_id: Some(plan_id),
                ..Default::default()
            }),
            rel_type: Some(rel_type),
        }
    }

    pub(crate) fn dataframe(&self, rel_type: RelType) -> DataFrame {
        DataFrame::new(self.clone(), self.relation(rel_type))
    }
}
