//! Decoding a peer's Arrow IPC without trusting it. arrow's IPC reader
//! panics on some malformed messages (a buffer that claims more bytes than
//! the message body has, found by `tests/fuzz.rs`); [`decode`] turns such a
//! panic into an error naming the problem, so one bad stream fails itself
//! with `INVALID_ARGUMENT`, not the task that serves it.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;

use arrow_flight::FlightData;
use arrow_flight::decode::{DecodedFlightData, FlightDataDecoder};
use arrow_flight::error::FlightError;
use futures::{Stream, StreamExt};

/// A decoded Flight stream ([`decode`]).
pub type Decoded = Pin<Box<dyn Stream<Item = Result<DecodedFlightData, FlightError>> + Send>>;

/// The decoded messages of `messages`; a message arrow cannot decode ends
/// the stream with [`FlightError::DecodeError`] instead of a panic.
pub fn decode<S>(messages: S) -> Decoded
where
    S: Stream<Item = Result<FlightData, FlightError>> + Send + 'static,
{
    Box::pin(
        AssertUnwindSafe(FlightDataDecoder::new(messages))
            .catch_unwind()
            .map(|item| match item {
                Ok(decoded) => decoded,
                Err(panic) => Err(FlightError::DecodeError(format!(
                    "malformed Arrow IPC message: {}",
                    panic_message(panic.as_ref())
                ))),
            }),
    )
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("the decoder panicked")
}
