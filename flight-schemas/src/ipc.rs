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

/// `message` unless it is a dictionary batch: no Kindling stream takes
/// dictionary-encoded columns, and a decoder keeps every dictionary (and
/// each delta) a peer sends for the life of the stream, so one is refused
/// before it is decoded.
pub fn no_dictionary(message: FlightData) -> Result<FlightData, FlightError> {
    if !message.data_header.is_empty()
        && let Ok(header) = arrow::ipc::root_as_message(&message.data_header)
        && header.header_type() == arrow::ipc::MessageHeader::DictionaryBatch
    {
        return Err(FlightError::DecodeError(
            "a dictionary batch: no stream takes dictionary-encoded columns; cast them to their value type"
                .into(),
        ));
    }
    Ok(message)
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("the decoder panicked")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{DictionaryArray, Int32Array, RecordBatch, StringArray};
    use arrow::datatypes::Int32Type;
    use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};

    use super::*;

    #[tokio::test]
    async fn a_dictionary_batch_is_refused_before_it_is_decoded() {
        let values: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
        let batch = RecordBatch::try_from_iter([
            ("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as _),
            ("d", Arc::new(values) as _),
        ])
        .unwrap();
        let plain = RecordBatch::try_from_iter([("s", Arc::new(StringArray::from(vec!["a"])) as _)]).unwrap();
        let encode = |b: RecordBatch| {
            FlightDataEncoderBuilder::new()
                .with_dictionary_handling(DictionaryHandling::Resend)
                .build(futures::stream::once(async move { Ok(b) }))
        };
        let messages: Vec<FlightData> = encode(batch).map(Result::unwrap).collect().await;
        let refused: Vec<_> = messages.into_iter().map(no_dictionary).collect();
        let err = refused
            .iter()
            .find_map(|r| r.as_ref().err())
            .expect("a dictionary batch");
        assert!(err.to_string().contains("dictionary"), "{err}");
        // A stream without one passes untouched.
        let clean: Vec<FlightData> = encode(plain).map(Result::unwrap).collect().await;
        assert!(clean.into_iter().all(|m| no_dictionary(m).is_ok()));
    }
}
