//! What every Kindling gRPC server adds around its own service: server
//! reflection (`tonic-reflection`, v1 and the older v1alpha that some tools
//! still ask first), so `grpcurl list` / `describe` and other standard tools
//! discover the health service, reflection itself and the server's own
//! service from the server alone — like the health service it answers
//! without a token: it describes public protocols and holds no job's data —
//! and [`TraceLayer`], which gives each call a span with the caller's trace
//! id (`kindling_schemas::trace`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

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
