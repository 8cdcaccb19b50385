//! Per-batch metadata (`FlightData.app_metadata`) and acknowledgements
//! (`PutResult.app_metadata`), both JSON.
//!
//! Every record batch a producer sends in a `DoPut` carries a
//! [`BatchMetadata`]: the producer's id, the batch's sequence number (0, 1, 2,
//! … per producer, no gaps) and the producer's attempt. The agent answers every
//! batch with a [`PutAck`] and, when the stream ends cleanly, one final ack
//! with `committed: true`. Rows become part of the shard only when their
//! stream commits; a batch whose `(producer, seq)` was already committed is
//! acknowledged as a duplicate and not stored again. So a retried or
//! speculative producer can never double rows.

use serde::{Deserialize, Serialize};

/// `app_metadata` of one record batch in a `DoPut`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMetadata {
    /// Stable id of the producer: e.g. `shard-0` for the driver relay, or
    /// `partition-17` for an executor pushing Spark partition 17.
    pub producer: String,
    /// Sequence number of this batch within the producer, from 0.
    pub seq: u64,
    /// Attempt of the producer (a Spark task attempt number); informational.
    #[serde(default)]
    pub attempt: u64,
}

impl BatchMetadata {
    /// Encodes as JSON bytes.
    ///
    /// ```
    /// use kindling_schemas::metadata::BatchMetadata;
    /// let m = BatchMetadata { producer: "shard-0".into(), seq: 3, attempt: 0 };
    /// assert_eq!(BatchMetadata::decode(&m.encode()).unwrap(), m);
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes JSON bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, MetadataError> {
        if bytes.is_empty() {
            return Err(MetadataError::Missing);
        }
        let m: BatchMetadata =
            serde_json::from_slice(bytes).map_err(|e| MetadataError::Malformed(e.to_string()))?;
        if m.producer.is_empty() || m.producer.len() > 256 {
            return Err(MetadataError::Malformed(
                "producer must be 1 to 256 characters".into(),
            ));
        }
        Ok(m)
    }
}

/// `app_metadata` of one `PutResult`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutAck {
    /// The producer acknowledged.
    pub producer: String,
    /// The batch acknowledged (the last one, when `committed`).
    pub seq: u64,
    /// Rows in that batch; in the final ack (`committed`), every row the
    /// agent holds for the producer in this split, across all its streams.
    pub rows: u64,
    /// Final ack only: rows this stream committed for the producer (0 when
    /// it was a duplicate). Summed over every stream of every producer it is
    /// the split's `expected_rows`. Absent from per-batch acks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_rows: Option<u64>,
    /// The batch had already been committed and was not stored again.
    #[serde(default)]
    pub duplicate: bool,
    /// The stream ended cleanly and its rows are now part of the shard.
    #[serde(default)]
    pub committed: bool,
    /// Arrow data bytes of that batch as decoded by the agent: the sum of
    /// its columns' buffers over the batch's rows
    /// ([`batch_bytes`](crate::schema::batch_bytes); pyarrow's
    /// `RecordBatch.nbytes` of the batch sent, for columns without a validity
    /// buffer), the same for a duplicate. In the final ack, the bytes this
    /// stream committed for the producer (0 when it was a duplicate). A
    /// sender bounds its data in flight by subtracting each ack's `bytes`.
    #[serde(default)]
    pub bytes: u64,
}

impl PutAck {
    /// Encodes as JSON bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes JSON bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, MetadataError> {
        serde_json::from_slice(bytes).map_err(|e| MetadataError::Malformed(e.to_string()))
    }
}

/// Batch metadata missing or not following the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// A record batch without `app_metadata`.
    #[error("record batch without app_metadata: every batch needs {{\"producer\", \"seq\"}}")]
    Missing,
    /// Not the expected JSON.
    #[error("malformed batch app_metadata: {0}")]
    Malformed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_round_trips() {
        let a = PutAck {
            producer: "p".into(),
            seq: 9,
            rows: 100,
            duplicate: true,
            committed: false,
            bytes: 800,
            stream_rows: None,
        };
        assert!(
            !String::from_utf8(a.encode())
                .expect("utf-8")
                .contains("stream_rows")
        );
        assert_eq!(PutAck::decode(&a.encode()), Ok(a));
    }

    #[test]
    fn missing_or_malformed_metadata_is_refused() {
        assert_eq!(BatchMetadata::decode(b""), Err(MetadataError::Missing));
        assert!(matches!(
            BatchMetadata::decode(b"{\"seq\":1}"),
            Err(MetadataError::Malformed(_))
        ));
        assert!(matches!(
            BatchMetadata::decode(b"{\"producer\":\"\",\"seq\":1}"),
            Err(MetadataError::Malformed(_))
        ));
        // attempt is optional for other-language producers.
        let m = BatchMetadata::decode(b"{\"producer\":\"x\",\"seq\":1}").expect("valid");
        assert_eq!(m.attempt, 0);
    }
}
