//! What every Kindling gRPC server adds around its own service: server
//! reflection (`tonic-reflection`, v1 and the older v1alpha that some tools
//! still ask first), so `grpcurl list` / `describe` and other standard tools
//! discover the health service, reflection itself and the server's own
//! service from the server alone (with the token, as every call but one);
//! [`TokenLayer`], which checks the bearer token of every call before any
//! service — or the router's UNIMPLEMENTED for a path no service serves —
//! sees it, the health service's `Check` alone excepted (the kubelet's gRPC
//! probes send no token); and [`TraceLayer`], which gives each call a span
//! with the caller's trace id (`kindling_schemas::trace`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use kindling_schemas::auth::{AUTHORIZATION, BearerCheck};
use kindling_schemas::trace::{METADATA_KEY, TraceContext};
use tonic::codegen::http;
use tonic_reflection::server::{Builder, Error, v1, v1alpha};
use tracing::Instrument as _;

/// A tower layer for a tonic server: each call runs in a span `rpc` with
/// its method's path and, when the caller sent a valid `traceparent`, its
/// trace id — and with that trace context as the task's current one, so the
/// calls the handler makes carry it on.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLayer;

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced { inner }
    }
}

/// A service wrapped by [`TraceLayer`].
#[derive(Clone, Debug)]
pub struct Traced<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Traced<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let trace = request
            .headers()
            .get(METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(TraceContext::parse);
        let span = tracing::info_span!("rpc", rpc = %request.uri().path(), trace_id = tracing::field::Empty);
        if let Some(trace) = &trace {
            span.record("trace_id", trace.trace_id());
        }
        let call = self.inner.call(request).instrument(span);
        match trace {
            Some(trace) => Box::pin(trace.scope(call)),
            None => Box::pin(call),
        }
    }
}

/// The one call a server answers without a token: the standard health
/// check, as `grpc_health_probe` and Kubernetes' gRPC probes ask it. Its
/// streaming sibling `Watch`, which holds a stream open as long as the
/// caller likes, needs the token like everything else.
pub const OPEN_WITHOUT_TOKEN: &[&str] = &["/grpc.health.v1.Health/Check"];

/// A tower layer for a tonic server: every call but [`OPEN_WITHOUT_TOKEN`]
/// must pass `check` (the operator token, or a job credential where the
/// check takes them) before anything else answers it — health `Watch`,
/// reflection, and a path no service serves (UNAUTHENTICATED, not
/// UNIMPLEMENTED, to a caller without a token). A service's own
/// interceptor still checks its calls (and says who the caller is).
#[derive(Clone, Debug)]
pub struct TokenLayer {
    check: BearerCheck,
}

impl TokenLayer {
    /// Requires what `check` accepts.
    pub fn new(check: BearerCheck) -> Self {
        TokenLayer { check }
    }
}

impl<S> tower::Layer<S> for TokenLayer {
    type Service = TokenChecked<S>;

    fn layer(&self, inner: S) -> TokenChecked<S> {
        TokenChecked {
            inner,
            check: self.check.clone(),
        }
    }
}

/// A service wrapped by [`TokenLayer`].
#[derive(Clone, Debug)]
pub struct TokenChecked<S> {
    inner: S,
    check: BearerCheck,
}

impl<S, B, R> tower::Service<http::Request<B>> for TokenChecked<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !OPEN_WITHOUT_TOKEN.contains(&request.uri().path()) {
            // Only the authorization header is looked at: copy it alone.
            let mut headers = http::HeaderMap::new();
            if let Some(value) = request.headers().get(AUTHORIZATION) {
                headers.insert(AUTHORIZATION, value.clone());
            }
            let metadata = tonic::metadata::MetadataMap::from_headers(headers);
            if let Err(status) = self.check.check(&metadata) {
                return Box::pin(std::future::ready(Ok(status.into_http())));
            }
        }
        Box::pin(self.inner.call(request))
    }
}

/// Reflection over the health service, reflection itself and `own` (an
/// encoded descriptor set: `kindling_schemas::pb::FLIGHT_FILE_DESCRIPTOR_SET`
/// on the agent, `kindling_schemas::pb::rendezvous::FILE_DESCRIPTOR_SET` on
/// the rendezvous), as the v1 and the v1alpha service.
#[allow(clippy::type_complexity)]
pub fn reflection(
    own: &'static [u8],
) -> Result<
    (
        v1::ServerReflectionServer<impl v1::ServerReflection>,
        v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>,
    ),
    Error,
> {
    let builder = || {
        Builder::configure()
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(own)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_descriptor_sets_decode() {
        for own in [
            kindling_schemas::pb::FLIGHT_FILE_DESCRIPTOR_SET,
            kindling_schemas::pb::rendezvous::FILE_DESCRIPTOR_SET,
        ] {
            reflection(own).expect("descriptor set");
        }
    }
}
