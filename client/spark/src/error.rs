//! The typed error of the Spark Connect client: what failed, Spark's error class, retryability.

use spark_connect_core::SparkError;

/// Everything the Spark Connect client can fail with.
///
/// Server-side failures keep Spark's error class and message verbatim
/// (`[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column ...`), transport failures
/// name the address that could not be reached.
///
/// ```no_run
/// # async fn demo() -> Result<(), kindling_spark::Error> {
/// use kindling_spark::{Error, SparkSession};
/// let spark = SparkSession::connect("sc://127.0.0.1:15002").await?;
/// match spark.sql("SELECT nope").await?.collect().await {
///     Err(e) if e.error_class() == Some("UNRESOLVED_COLUMN.WITHOUT_SUGGESTION") => {}
///     Err(e) if e.is_retryable() => { /* try again later */ }
///     other => { other?; }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The `sc://` connection string is malformed (the token, if any, is redacted).
    #[error("invalid Spark Connect URL {url}: {message}")]
    InvalidUrl {
        /// The URL with any `token=` value replaced by `***`.
        url: String,
        /// Why it was rejected.
        message: String,
    },

    /// `SPARK_REMOTE` was asked for but is not set.
    #[error("SPARK_REMOTE is not set; set it to sc://host:port or pass a URL")]
    MissingRemote,

    /// The server could not be reached (refused, timed out, TLS failure, dropped).
    #[error("cannot reach Spark Connect server at {address}: {message}")]
    Connection {
        /// `host:port` that was dialled.
        address: String,
        /// What the transport reported.
        message: String,
        /// The underlying gRPC status.
        #[source]
        source: tonic::Status,
    },

    /// Spark rejected or failed the request; `message` is Spark's own text.
    #[error("{message}")]
    Spark {
        /// Spark's error class (condition), e.g. `UNRESOLVED_COLUMN.WITH_SUGGESTION`.
        error_class: Option<String>,
        /// The SQLSTATE, when Spark sent one.
        sql_state: Option<String>,
        /// The gRPC status code the server answered with.
        code: tonic::Code,
        /// Spark's message, verbatim.
        message: String,
        /// The decoded error details from the core transport.
        #[source]
        source: Box<SparkError>,
    },

    /// Encoding or decoding Arrow IPC failed.
    #[error("Arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),

    /// The caller passed something Spark cannot express (e.g. empty weights).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The server answered with something this client does not understand.
    #[error("unexpected Spark Connect response: {0}")]
    Protocol(String),
}

impl Error {
    /// Spark's error class (condition) if the server sent one.
    ///
    /// ```no_run
    /// # fn demo(e: kindling_spark::Error) {
    /// if e.error_class() == Some("TABLE_OR_VIEW_NOT_FOUND") { /* ... */ }
    /// # }
    /// ```
    pub fn error_class(&self) -> Option<&str> {
        match self {
            Error::Spark { error_class, .. } => error_class.as_deref(),
            _ => None,
        }
    }

    /// Whether retrying the same call may succeed (transport failures, `UNAVAILABLE`,
    /// a disconnected result cursor). Analysis errors and bad input are not retryable.
    ///
    /// ```no_run
    /// # fn demo(e: kindling_spark::Error) {
    /// if e.is_retryable() { /* back off and retry */ }
    /// # }
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connection { .. } => true,
            Error::Spark { code, message, .. } => {
                matches!(code, tonic::Code::Unavailable) || message.contains("INVALID_CURSOR.DISCONNECTED")
            }
            _ => false,
        }
    }

    /// Maps a gRPC status from `address` into a connection or Spark error.
    pub(crate) fn from_status(address: &str, status: tonic::Status) -> Self {
        let transport_failure = (status.code() == tonic::Code::Unavailable && status.details().is_empty())
            || (status.code() == tonic::Code::Unknown && status.message().contains("transport"))
            || is_transport_failure(&status);
        if transport_failure {
            return Error::Connection {
                address: address.to_string(),
                message: describe_transport(&status),
                source: status,
            };
        }
        let code = status.code();
        let message = status.message().to_string();
        let details = SparkError::from_grpc_status(status);
        let error_class = details.get_condition();
        let sql_state = details.sql_state.clone();
        Error::Spark {
            error_class,
            sql_state,
            code,
            message,
            source: Box::new(details),
        }
    }
}

/// The innermost cause of a transport failure ("Connection refused", "timed out").
fn describe_transport(status: &tonic::Status) -> String {
    let mut message = status.message().to_string();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = cause {
        message = err.to_string();
        cause = err.source();
    }
    message
}

/// Shorthand for results of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether `status` was made by this side's transport (the connection broke)
/// rather than sent by the server: server statuses come from trailers and
/// carry no source error, transport failures carry the hyper/h2/io cause.
pub(crate) fn is_transport_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some() && status.details().is_empty()
}
