//! A bound on the memory a caller's streams pin while a gRPC server
//! receives their messages. tonic buffers each message whole before it
//! decodes it and keeps that buffer, grown to the stream's largest message,
//! for the stream's life; nothing in tonic or hyper bounds the sum over
//! streams, so a caller with many streams that each send one large message
//! and then hold could pin far more than the server's budget. This layer
//! reads the gRPC length prefix of every message as the body passes
//! (nothing is copied or held) and charges the stream its largest message
//! against its caller's share and the total, before tonic reads (and
//! allocates) the message; a message past either ends its stream with
//! `RESOURCE_EXHAUSTED` naming the bound. The charge goes when the stream
//! ends. A caller's part shrinks while others hold buffers (room is always
//! kept for one more caller), and a message whose length was charged must
//! arrive within [`body_deadline`] of it, so prefixes that claim 64 MiB and
//! then stall hold nothing for long. Written here because no tower or tonic
//! layer meters message buffers by caller.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http;

/// The gRPC message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// How long a message's body may take to arrive once its length prefix
/// was read and charged: 10 s, and a second more per MiB (a 64 MiB message
/// may take 74 s). One that is slower ends its stream with
/// `DEADLINE_EXCEEDED` and gives its charge back.
pub fn body_deadline(len: u64) -> std::time::Duration {
    std::time::Duration::from_secs(10 + len.div_ceil(1 << 20))
}

/// Bytes of received messages all metered callers' streams may pin, and
/// each caller's share of it.
#[derive(Clone, Debug)]
pub struct ReceiveBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    total: u64,
    share: u64,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: u64,
    by_caller: HashMap<String, u64>,
}

/// A message a caller's streams have no room left for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a message of {message} bytes would take the receive buffers of {what} to {would} bytes, \
     past its bound of {bound} (--max-receiving-bytes; a caller takes at most half of it, less while \
     {others} other caller(s) hold buffers, so that one more finds room; each open stream holds its \
     largest message until it ends)"
)]
pub struct ReceiveBudgetFull {
    /// The message's length.
    pub message: u64,
    /// Whose bound: `this caller's streams` or `all callers' streams`.
    pub what: &'static str,
    /// What the streams would hold with it.
    pub would: u64,
    /// The bound.
    pub bound: u64,
    /// Other callers holding buffers.
    pub others: u64,
}

impl ReceiveBudget {
    /// `total` bytes over all metered callers, each at most `share` of it.
    pub fn new(total: u64, share: u64) -> Self {
        ReceiveBudget {
            inner: Arc::new(Inner {
                total,
                share: share.min(total),
                held: Mutex::new(Held::default()),
            }),
        }
    }

    /// What `caller`'s streams hold now.
    pub fn held_by(&self, caller: &str) -> u64 {
        self.lock().by_caller.get(caller).copied().unwrap_or(0)
    }

    /// What all streams hold now.
    pub fn held(&self) -> u64 {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Charges `caller` `more` bytes for a message of `message` bytes, or
    /// says which bound it would pass (and charges nothing).
    fn charge(&self, caller: &str, more: u64, message: u64) -> Result<(), ReceiveBudgetFull> {
        let mut held = self.lock();
        let mine = held.by_caller.get(caller).copied().unwrap_or(0);
        let others = held.by_caller.keys().filter(|c| c.as_str() != caller).count() as u64;
        let full = |what, now: u64, bound| ReceiveBudgetFull {
            message,
            what,
            would: now + more,
            bound,
            others,
        };
        // Its share, and no more than leaves an equal part to each caller
        // holding buffers and to one more.
        let part = self.inner.share.min(self.inner.total / (others + 2).max(2));
        if mine + more > part {
            return Err(full("this caller's streams", mine, part));
        }
        if held.total + more > self.inner.total {
            return Err(full("all callers' streams", held.total, self.inner.total));
        }
        held.total += more;
        *held.by_caller.entry(caller.to_owned()).or_default() += more;
        Ok(())
    }

    fn release(&self, caller: &str, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut held = self.lock();
        held.total = held.total.saturating_sub(bytes);
        if let Some(mine) = held.by_caller.get_mut(caller) {
            *mine = mine.saturating_sub(bytes);
            if *mine == 0 {
                held.by_caller.remove(caller);
            }
        }
    }
}

/// Wraps a gRPC service: the body of each request whose caller `key`
/// names is metered against `budget`; a request it names no caller for
/// (`None`: the operator) is passed on as it is.
#[derive(Clone, Debug)]
pub struct Metered<S, K> {
    inner: S,
    budget: ReceiveBudget,
    key: K,
}

impl<S, K> Metered<S, K> {
    /// `inner` with its callers' receive buffers bounded by `budget`.
    pub fn new(inner: S, budget: ReceiveBudget, key: K) -> Self {
        Metered { inner, budget, key }
    }
}

impl<S, K> tonic::server::NamedService for Metered<S, K>
where
    S: tonic::server::NamedService,
{
    const NAME: &'static str = S::NAME;
}

impl<S, K> tower::Service<http::Request<tonic::body::Body>> for Metered<S, K>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
    K: Fn(&http::Request<tonic::body::Body>) -> Option<String>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> S::Future {
        match (self.key)(&request) {
            Some(caller) => {
                let budget = self.budget.clone();
                self.inner
                    .call(request.map(|body| tonic::body::Body::new(MeteredBody::new(body, budget, caller))))
            }
            None => self.inner.call(request),
        }
    }
}

/// A request body whose messages are charged to their caller as their
/// length prefixes pass.
#[derive(Debug)]
pub struct MeteredBody<B> {
    inner: B,
    budget: ReceiveBudget,
    caller: String,
    /// What this stream is charged: its largest message so far.
    held: u64,
    /// The prefix of the next message, as far as it has come.
    prefix: [u8; PREFIX],
    prefix_seen: usize,
    /// Bytes of the current message still to pass.
    body_left: u64,
    /// The current message's length, and when its body must be in.
    due: Option<(u64, tokio::time::Instant)>,
    /// The timer of `due`, made when the body first waits.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    failed: bool,
}

impl<B> MeteredBody<B> {
    fn new(inner: B, budget: ReceiveBudget, caller: String) -> Self {
        MeteredBody {
            inner,
            budget,
            caller,
            held: 0,
            prefix: [0; PREFIX],
            prefix_seen: 0,
            body_left: 0,
            due: None,
            timer: None,
            failed: false,
        }
    }

    /// Ends the stream: its charge goes back at once (tonic may keep the
    /// body until the handler drops it).
    fn fail(
        &mut self,
        status: tonic::Status,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::codegen::StdError>>> {
        self.failed = true;
        self.budget.release(&self.caller, std::mem::take(&mut self.held));
        tracing::warn!(caller = %self.caller, error = %status.message(), "stream ended by the receive meter");
        Poll::Ready(Some(Err(Box::new(status))))
    }

    /// Whether the current message's body is past its deadline (the timer
    /// wakes this body's reader when it is).
    fn overdue(&mut self, cx: &mut Context<'_>) -> Option<tonic::Status> {
        let (len, at) = self.due?;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if timer.deadline() != at {
            timer.as_mut().reset(at);
        }
        timer.as_mut().poll(cx).is_ready().then(|| {
            tonic::Status::deadline_exceeded(format!(
                "a message of {len} bytes: {} of them did not arrive within {:?} of its length \
                 (a message's body must arrive within 10 s and a second per MiB)",
                self.body_left,
                body_deadline(len)
            ))
        })
    }

    /// Follows the message framing through `chunk`, charging each message
    /// larger than any before it on this stream.
    fn meter(&mut self, mut chunk: &[u8]) -> Result<(), ReceiveBudgetFull> {
        while !chunk.is_empty() {
            if self.body_left > 0 {
                let n = usize::try_from(self.body_left).map_or(chunk.len(), |left| left.min(chunk.len()));
                chunk.advance(n);
                self.body_left -= n as u64;
                if self.body_left == 0 {
                    self.due = None;
                }
                continue;
            }
            let n = (PREFIX - self.prefix_seen).min(chunk.len());
            self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&chunk[..n]);
            self.prefix_seen += n;
            chunk.advance(n);
            if self.prefix_seen < PREFIX {
                continue;
            }
            self.prefix_seen = 0;
            let len = u64::from(u32::from_be_bytes([
                self.prefix[1],
                self.prefix[2],
                self.prefix[3],
                self.prefix[4],
            ]));
            self.body_left = len;
            self.due = (len > 0).then(|| (len, tokio::time::Instant::now() + body_deadline(len)));
            if len > self.held {
                self.budget.charge(&self.caller, len - self.held, len)?;
                self.held = len;
            }
        }
        Ok(())
    }
}

impl<B> Drop for MeteredBody<B> {
    fn drop(&mut self) {
        self.budget.release(&self.caller, self.held);
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                return match self.overdue(cx) {
                    Some(status) => self.fail(status),
                    None => Poll::Pending,
                };
            }
        };
        if let Some(data) = frame.data_ref()
            && let Err(full) = self.meter(data)
        {
            return self.fail(tonic::Status::resource_exhausted(full.to_string()));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that yields `chunks` as data frames, then ends — or, when it
    /// `stalls`, never yields another (a caller that stops sending).
    struct Chunks {
        chunks: std::collections::VecDeque<Bytes>,
        stalls: bool,
    }

    impl Chunks {
        fn stalling(self) -> Self {
            Chunks { stalls: true, ..self }
        }
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
            match self.chunks.pop_front() {
                Some(c) => Poll::Ready(Some(Ok(Frame::data(c)))),
                None if self.stalls => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    /// `bytes` cut into chunks of `cut` bytes (a prefix may straddle two).
    fn chunks(bytes: &[u8], cut: usize) -> Chunks {
        Chunks {
            chunks: bytes.chunks(cut).map(Bytes::copy_from_slice).collect(),
            stalls: false,
        }
    }

    /// The bytes `body` yields until it ends, or the first error it yields.
    async fn drain<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> Result<usize, B::Error> {
        let mut n = 0;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            n += frame?.data_ref().map_or(0, Bytes::len);
        }
        Ok(n)
    }

    #[tokio::test]
    async fn a_stream_is_charged_its_largest_message_until_it_ends() {
        let budget = ReceiveBudget::new(1000, 500);
        let mut bytes = message(100);
        bytes.extend(message(300));
        bytes.extend(message(200));
        for cut in [1, 3, 5, 7, 64, 4096] {
            let mut body = MeteredBody::new(chunks(&bytes, cut), budget.clone(), "job-a".into());
            let drained = drain(&mut body).await.expect("within the bounds");
            assert_eq!(drained, bytes.len(), "cut {cut}");
            assert_eq!(budget.held_by("job-a"), 300, "cut {cut}");
            assert_eq!(budget.held(), 300);
            drop(body);
            assert_eq!(budget.held_by("job-a"), 0, "released at the end, cut {cut}");
            assert_eq!(budget.held(), 0);
        }
    }

    #[tokio::test]
    async fn a_message_past_the_callers_share_ends_its_stream_before_it_is_read() {
        let budget = ReceiveBudget::new(1000, 500);
        let mut first = MeteredBody::new(chunks(&message(400), 64), budget.clone(), "job-a".into());
        drain(&mut first).await.expect("within the share");
        // The caller's second stream would take it past its share: refused
        // at the prefix, the frame that carries it not passed on.
        let mut second = MeteredBody::new(chunks(&message(200), 5), budget.clone(), "job-a".into());
        let err = drain(&mut second).await.expect_err("past the share").to_string();
        assert!(
            err.contains("of 200 bytes") && err.contains("this caller's streams"),
            "{err}"
        );
        assert!(err.contains("to 600 bytes, past its bound of 500"), "{err}");
        assert_eq!(
            budget.held_by("job-a"),
            400,
            "nothing charged for the refused one"
        );
        // Another caller's part leaves room for one more: a third of the
        // total while job-a holds buffers.
        let mut other = MeteredBody::new(chunks(&message(500), 64), budget.clone(), "job-b".into());
        let err = drain(&mut other).await.expect_err("past its part").to_string();
        assert!(
            err.contains("past its bound of 333") && err.contains("1 other caller"),
            "{err}"
        );
        let mut other = MeteredBody::new(chunks(&message(300), 64), budget.clone(), "job-b".into());
        drain(&mut other).await.expect("its part");
        // …so a third caller still finds room.
        let mut third = MeteredBody::new(chunks(&message(200), 64), budget.clone(), "job-c".into());
        drain(&mut third).await.expect("a third caller's part");
        drop((first, other, third));
        assert_eq!(budget.held(), 0);
        let mut again = MeteredBody::new(chunks(&message(500), 64), budget.clone(), "job-c".into());
        drain(&mut again)
            .await
            .expect("the whole share again once the streams ended");
    }

    #[tokio::test]
    async fn the_parts_together_stay_within_the_total() {
        let budget = ReceiveBudget::new(1000, 1000);
        let mut held = Vec::new();
        for (caller, len) in [("a", 500), ("b", 333)] {
            let mut body = MeteredBody::new(chunks(&message(len), 64), budget.clone(), caller.into());
            drain(&mut body).await.expect("within its part");
            held.push(body);
        }
        // c's part is 250, but only 167 bytes are left.
        let mut c = MeteredBody::new(chunks(&message(200), 64), budget.clone(), "c".into());
        let err = drain(&mut c).await.expect_err("past the total").to_string();
        assert!(
            err.contains("all callers' streams") && err.contains("bound of 1000"),
            "{err}"
        );
        let mut c = MeteredBody::new(chunks(&message(167), 64), budget.clone(), "c".into());
        drain(&mut c).await.expect("what is left");
        assert_eq!(budget.held(), 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_charged_message_whose_body_stalls_ends_its_stream_and_gives_its_charge_back() {
        let budget = ReceiveBudget::new(1 << 30, 1 << 29);
        let len = 3 << 20;
        // The prefix and 10 bytes of a 3 MiB message, then nothing.
        let sent = message(len)[..PREFIX + 10].to_vec();
        let mut body = MeteredBody::new(chunks(&sent, 4).stalling(), budget.clone(), "job-a".into());
        let started = tokio::time::Instant::now();
        let err = drain(&mut body).await.expect_err("stalled");
        let status = err.downcast_ref::<tonic::Status>().expect("a status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status}");
        assert!(
            status.message().contains(&format!("a message of {len} bytes"))
                && status.message().contains(&format!("{} of them", len - 10)),
            "{status}"
        );
        assert_eq!(started.elapsed(), body_deadline(len as u64), "13 s for 3 MiB");
        assert_eq!(budget.held(), 0, "the charge is back before the body is dropped");
        assert!(
            drain(&mut body).await.is_ok_and(|n| n == 0),
            "the stream has ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_that_arrives_whole_has_no_deadline_left() {
        let budget = ReceiveBudget::new(1000, 500);
        // A whole message, then the stream waits (between messages).
        let mut body = MeteredBody::new(chunks(&message(100), 7).stalling(), budget.clone(), "j".into());
        let waited = tokio::time::timeout(body_deadline(100) * 10, drain(&mut body)).await;
        assert!(waited.is_err(), "no deadline between messages: {waited:?}");
        assert_eq!(budget.held(), 100);
    }

    #[tokio::test]
    async fn the_refusal_is_resource_exhausted_through_tonic() {
        let budget = ReceiveBudget::new(100, 100);
        let mut body =
            tonic::body::Body::new(MeteredBody::new(chunks(&message(101), 64), budget, "j".into()));
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
            .await
            .expect("a frame");
        let status = frame.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
    }
}
