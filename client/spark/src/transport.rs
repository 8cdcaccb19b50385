//! The gRPC channel to Spark Connect: headers, message limits, timeouts, unary retries.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use spark_connect_core::{RetryPolicy, RetryPolicyState};
use spark_connect_proto::spark_connect_service_client::SparkConnectServiceClient;
use spark_connect_proto::{
    AnalyzePlanRequest, AnalyzePlanResponse, ConfigRequest, ConfigResponse, UserContext,
};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::error::{Error, Result};
use crate::remote::RemoteUrl;

/// The generated Spark Connect stub over our channel with our headers.
pub(crate) type Stub = SparkConnectServiceClient<InterceptedService<Channel, Headers>>;

/// Channel settings a [`crate::SparkSession`] is built with.
#[derive(Debug, Clone)]
pub(crate) struct TransportOptions {
    pub connect_timeout: Duration,
    pub max_message_size: usize,
    pub retry: RetryPolicy,
}

impl Default for TransportOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            // Spark sends Arrow batches of up to 128 MiB; leave headroom.
            max_message_size: 256 * 1024 * 1024,
            retry: RetryPolicy {
                max_retries: Some(3),
                initial_backoff_ms: 100,
                max_backoff_ms: Some(2_000),
                ..RetryPolicy::default()
            },
        }
    }
}

/// Headers attached to every call (user agent, bearer token, URL extras).
#[derive(Clone)]
pub(crate) struct Headers {
    headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Headers").field("names", &names).finish()
    }
}

impl tonic::service::Interceptor for Headers {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let metadata = request.metadata_mut();
        for (key, value) in &self.headers {
            metadata.insert(key.clone(), value.clone());
        }
        Ok(request)
    }
}

/// One connection to a Spark Connect server and the identity requests carry.
#[derive(Clone)]
pub(crate) struct Transport {
    stub: Stub,
    address: String,
    session_id: String,
    user_context: UserContext,
    client_type: String,
    retry: RetryPolicy,
    /// Arrow IPC bytes received in query results / sent as artifacts, by this session.
    pub(crate) bytes_in: Arc<AtomicU64>,
    pub(crate) bytes_out: Arc<AtomicU64>,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("address", &self.address)
            .field("session_id", &self.session_id)
            .field("client_type", &self.client_type)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Builds a lazily connecting channel; nothing is dialled until the first call.
    pub(crate) fn new(remote: &RemoteUrl, options: &TransportOptions) -> Result<Self> {
        let address = remote.address();
        let invalid = |message: String| Error::InvalidUrl {
            url: remote.to_string(),
            message,
        };
        let scheme = if remote.use_ssl() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            // Large windows keep a 100+ MB/s Arrow stream from stalling on flow control.
            .initial_stream_window_size(Some(16 * 1024 * 1024))
            .initial_connection_window_size(Some(32 * 1024 * 1024));
        if let Some((interval, timeout)) = remote.keepalive() {
            endpoint = endpoint
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(true);
        }
        if remote.use_ssl() {
            let tls = ClientTlsConfig::new()
                .domain_name(remote.host().trim_matches(['[', ']']))
                .with_native_roots();
            endpoint = endpoint.tls_config(tls).map_err(|e| invalid(e.to_string()))?;
        }
        let channel = endpoint.connect_lazy();

        let client_type = format!(
            "{} kindling/{} spark-connect-rust/{} os/{}",
            remote.user_agent().unwrap_or("kindling"),
            env!("CARGO_PKG_VERSION"),
            spark_connect_core::channel::SPARK_VERSION,
            std::env::consts::OS,
        );
        let mut pairs = vec![("user-agent".to_string(), client_type.clone())];
        if let Some(user_id) = remote.user_id() {
            pairs.push(("user_id".to_string(), user_id.to_string()));
        }
        if let Some(token) = remote.token() {
            pairs.push(("authorization".to_string(), format!("Bearer {token}")));
        }
        pairs.extend(remote.headers());
        let mut headers = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            let key = AsciiMetadataKey::from_str(&key)
                .map_err(|_| invalid(format!("`{key}` is not a valid header name")))?;
            let value = AsciiMetadataValue::from_str(&value)
                .map_err(|_| invalid(format!("the value of `{key}` is not valid ASCII")))?;
            headers.push((key, value));
        }
        let stub = SparkConnectServiceClient::with_interceptor(channel, Headers { headers })
            .max_decoding_message_size(options.max_message_size)
            .max_encoding_message_size(options.max_message_size);

        let session_id = match remote.session_id() {
            Some(id) => id.to_string(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        Ok(Self {
            stub,
            address,
            session_id,
            user_context: UserContext {
                user_id: remote.user_id().unwrap_or_default().to_string(),
                ..Default::default()
            },
            client_type,
            retry: options.retry.clone(),
            bytes_in: Arc::default(),
            bytes_out: Arc::default(),
        })
    }

    pub(crate) fn stub(&self) -> Stub {
        self.stub.clone()
    }

    pub(crate) fn session_id(&self) -> &str {
        &self.session_id
    }

    pub(crate) fn user_context(&self) -> UserContext {
        self.user_context.clone()
    }

    pub(crate) fn client_type(&self) -> &str {
        &self.client_type
    }

    pub(crate) fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    pub(crate) fn error(&self, status: tonic::Status) -> Error {
        Error::from_status(&self.address, status)
    }

    /// Runs a unary call, retrying transient failures (UNAVAILABLE) with backoff.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(Stub) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut state = RetryPolicyState::new(self.retry.clone());
        loop {
            match call(self.stub()).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => match state.next_attempt(None) {
                    Some(wait_ms) if self.retry.can_retry(&status) => {
                        tracing::debug!(%status, wait_ms, "retrying Spark Connect call");
                        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                    }
                    _ => return Err(self.error(status)),
                },
            }
        }
    }

    pub(crate) async fn analyze(
        &self,
        analyze: spark_connect_proto::analyze_plan_request::Analyze,
    ) -> Result<spark_connect_proto::analyze_plan_response::Result> {
        let request = AnalyzePlanRequest {
            session_id: self.session_id.clone(),
            user_context: Some(self.user_context()),
            client_type: Some(self.client_type.clone()),
            analyze: Some(analyze),
            ..Default::default()
        };
        let response: AnalyzePlanResponse = self
            .retrying(|mut stub| {
                let request = request.clone();
                async move { stub.analyze_plan(request).await }
            })
            .await?;
        response
            .result
            .ok_or_else(|| Error::Protocol("AnalyzePlan answered without a result".into()))
    }

    pub(crate) async fn config(
        &self,
        op: spark_connect_proto::config_request::operation::OpType,
    ) -> Result<ConfigResponse> {
        let request = ConfigRequest {
            session_id: self.session_id.clone(),
            user_context: Some(self.user_context()),
            client_type: Some(self.client_type.clone()),
            operation: Some(spark_connect_proto::config_request::Operation { op_type: Some(op) }),
            ..Default::default()
        };
        self.retrying(|mut stub| {
            let request = request.clone();
            async move { stub.config(request).await }
        })
        .await
    }
}
