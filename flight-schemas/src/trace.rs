//! Trace context across processes: the W3C `traceparent` header
//! (`00-<trace id>-<span id>-<flags>`) in gRPC metadata, so one job's log
//! lines on the client, its agents and the rendezvous share a trace id.
//!
//! The client opens a context per `fit` ([`TraceContext::scope`]); every
//! call made inside it carries a child of it (`auth::BearerAttach` adds the
//! header); a server reads it per call (`kindling_ops::grpc::TraceLayer`)
//! into that call's span and scope, and an agent keeps the one `StartJob`
//! came with for all of the job's work, its calls to the rendezvous
//! included. Written here rather than taken from the OpenTelemetry SDK: the
//! header is one fixed-width line, and the propagator would bring the whole
//! SDK for it; a process that exports spans can read the same header.

use std::future::Future;

use crate::credential::{hex, unhex};

/// The metadata key (an HTTP/2 header) the context travels in.
pub const METADATA_KEY: &str = "traceparent";

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// A trace and the span of the caller within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
}

impl TraceContext {
    /// A new trace (random ids).
    pub fn new_root() -> Self {
        TraceContext {
            trace_id: random(),
            span_id: random(),
        }
    }

    /// A new span in the same trace (what a call made under `self` carries).
    pub fn child(&self) -> Self {
        TraceContext {
            trace_id: self.trace_id,
            span_id: random(),
        }
    }

    /// The trace id as 32 lowercase hex digits (what the log lines show).
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The `traceparent` header's value (version 00, sampled).
    pub fn header(&self) -> String {
        format!("00-{}-{}-01", hex(&self.trace_id), hex(&self.span_id))
    }

    /// A `traceparent` value; `None` for anything but a well-formed version
    /// 00 header with non-zero ids (the standard's rule: such a header is
    /// ignored, and the call is simply not traced).
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.trim().split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let lower_hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if parts.next().is_some()
            || version != "00"
            || !lower_hex(trace, 32)
            || !lower_hex(span, 16)
            || !lower_hex(flags, 2)
        {
            return None;
        }
        let trace_id: [u8; 16] = unhex(trace)?.try_into().ok()?;
        let span_id: [u8; 8] = unhex(span)?.try_into().ok()?;
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(TraceContext { trace_id, span_id })
    }

    /// The context of the task running now, if it runs inside a [`scope`](Self::scope).
    pub fn current() -> Option<Self> {
        CURRENT.try_with(|c| *c).ok()
    }

    /// Runs `work` with `self` as the current context: the calls it makes
    /// carry it. Tasks it spawns do not, unless scoped themselves.
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        CURRENT.scope(self, work).await
    }
}

fn random<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; N];
    // The system's generator does not fail on the platforms we build for;
    // if it did, a trace id made of the time is still unique enough.
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos());
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (nanos >> (8 * (i % 16))) as u8;
        }
    }
    if bytes.iter().all(|&b| b == 0) {
        bytes[0] = 1;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_malformed_ones_are_ignored() {
        let root = TraceContext::new_root();
        assert_eq!(TraceContext::parse(&root.header()), Some(root));
        let child = root.child();
        assert_eq!(child.trace_id(), root.trace_id());
        assert_ne!(child.header(), root.header());
        // The standard's own example.
        let example =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").expect("example");
        assert_eq!(example.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_scope_is_current_inside_and_only_there() {
        assert_eq!(TraceContext::current(), None);
        let root = TraceContext::new_root();
        let inside = root.scope(async { TraceContext::current() }).await;
        assert_eq!(inside, Some(root));
        assert_eq!(TraceContext::current(), None);
    }
}
