//! Arrow into Spark: `create_dataframe` as an inline LocalRelation, or as cached
//! artifact chunks (`cache/<sha256>`) referenced by a ChunkedCachedLocalRelation.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::StreamWriter;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use spark_connect_core::compute_crc32;
use spark_connect_proto::add_artifacts_request::{
    ArtifactChunk, Batch, BeginChunkedArtifact, Payload, SingleChunkArtifact,
};
use spark_connect_proto::config_request::{GetWithDefault, operation::OpType};
use spark_connect_proto::relation::RelType;
use spark_connect_proto::{AddArtifactsRequest, ChunkedCachedLocalRelation, KeyValue, LocalRelation};

use crate::dataframe::DataFrame;
use crate::error::{Error, Result};
use crate::session::SparkSession;
use crate::types::schema_to_ddl;

/// Bytes per AddArtifacts message (the artifact protocol chunks within an artifact).
const ARTIFACT_MESSAGE_BYTES: usize = 1024 * 1024;
/// Rows per slice when cutting caller batches into relation chunks.
const SLICE_ROWS: usize = 1024;

/// The server's local-relation limits (`spark.sql.session.localRelation*`).
#[derive(Debug, Clone, Copy)]
struct Limits {
    cache_threshold: usize,
    chunk_rows: usize,
    chunk_bytes: usize,
    upload_batch_bytes: usize,
    size_limit: usize,
}

impl SparkSession {
    /// A DataFrame holding `batches` (all of `schema`), sent to Spark without files.
    ///
    /// Small data goes inline in the plan; above the server's
    /// `spark.sql.session.localRelationCacheThreshold` (1 MiB by default) it is cut
    /// into Arrow IPC chunks uploaded as session artifacts `cache/<sha256>`, and the
    /// plan refers to them by hash, so any size up to the server's
    /// `localRelationSizeLimit` works.
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use arrow::array::{Float64Array, Int64Array, RecordBatch};
    /// use arrow::datatypes::{DataType, Field, Schema};
    /// let schema = Arc::new(Schema::new(vec![
    ///     Field::new("id", DataType::Int64, false),
    ///     Field::new("prediction", DataType::Float64, false),
    /// ]));
    /// let batch = RecordBatch::try_new(schema.clone(), vec![
    ///     Arc::new(Int64Array::from(vec![1, 2])),
    ///     Arc::new(Float64Array::from(vec![0.25, 0.75])),
    /// ])?;
    /// let predictions = spark.create_dataframe(schema, [batch]).await?;
    /// assert_eq!(predictions.count().await?, 2);
    /// # Ok(()) }
    /// ```
    pub async fn create_dataframe(
        &self,
        schema: SchemaRef,
        batches: impl IntoIterator<Item = RecordBatch>,
    ) -> Result<DataFrame> {
        let batches: Vec<Result<RecordBatch>> = batches.into_iter().map(Ok).collect();
        self.create_dataframe_from_stream(schema, futures::stream::iter(batches))
            .await
    }

    /// Like [`SparkSession::create_dataframe`], pulling batches from a stream; memory
    /// stays bounded by one upload batch (not the whole data).
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession, df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// // Round-trip a query result through the client (e.g. after scoring it locally).
    /// let stream = df.execute_stream().await?;
    /// let schema = stream.schema();
    /// let copy = spark.create_dataframe_from_stream(schema, stream).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_dataframe_from_stream<S>(&self, schema: SchemaRef, batches: S) -> Result<DataFrame>
    where
        S: Stream<Item = Result<RecordBatch>> + Send,
    {
        let limits = self.local_relation_limits().await?;
        let mut batches = std::pin::pin!(batches);
        let mut chunker = Chunker::new(schema.clone(), limits)?;
        let mut uploader = Uploader::new(self, limits);
        while let Some(batch) = batches.next().await {
            let batch = batch?;
            if batch.schema().fields() != schema.fields() {
                return Err(Error::InvalidArgument(format!(
                    "batch schema {} differs from the DataFrame schema {}",
                    batch.schema(),
                    schema
                )));
            }
            for chunk in chunker.push(&batch)? {
                uploader.add(chunk).await?;
            }
        }
        let rows_in_last = chunker.rows_in_last;
        let last = chunker.finish()?;
        let inline = if uploader.is_empty() && last.len() < limits.cache_threshold {
            Some(last)
        } else {
            if rows_in_last > 0 || uploader.is_empty() {
                uploader.add(last).await?;
            }
            None
        };
        let rel_type = match inline {
            Some(data) => RelType::LocalRelation(LocalRelation {
                data: Some(data),
                schema: None,
            }),
            None => {
                // The server requires the schema (Spark DDL, UTF-8) as its own artifact.
                let ddl = schema_to_ddl(&schema)?;
                let schema_hash = uploader.add_schema(Bytes::from(ddl.into_bytes())).await?;
                RelType::ChunkedCachedLocalRelation(ChunkedCachedLocalRelation {
                    data_hashes: uploader.finish().await?,
                    schema_hash: Some(schema_hash),
                })
            }
        };
        Ok(self.dataframe(rel_type))
    }

    async fn local_relation_limits(&self) -> Result<Limits> {
        const KEYS: [(&str, usize); 5] = [
            ("spark.sql.session.localRelationCacheThreshold", 1 << 20),
            ("spark.sql.session.localRelationChunkSizeRows", 10_000),
            ("spark.sql.session.localRelationChunkSizeBytes", 16 << 20),
            ("spark.sql.session.localRelationBatchOfChunksSizeBytes", 64 << 20),
            ("spark.sql.session.localRelationSizeLimit", 3 << 30),
        ];
        let response = self
            .transport()
            .config(OpType::GetWithDefault(GetWithDefault {
                pairs: KEYS
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: k.to_string(),
                        value: Some(v.to_string()),
                    })
                    .collect(),
            }))
            .await?;
        let value = |i: usize| {
            let (key, default) = KEYS[i];
            response
                .pairs
                .iter()
                .find(|p| p.key == key)
                .and_then(|p| p.value.as_deref())
                .and_then(|v| v.trim_end_matches('b').parse().ok())
                .unwrap_or(default)
        };
        Ok(Limits {
            cache_threshold: value(0),
            chunk_rows: value(1).max(1),
            chunk_bytes: value(2).max(1024),
            // One upload batch is what the client holds in memory at once.
            upload_batch_bytes: value(3).clamp(1 << 20, 64 << 20),
            size_limit: value(4),
        })
    }
}

/// Cuts batches into Arrow IPC streams of at most `chunk_rows` rows / ~`chunk_bytes`.
struct Chunker {
    schema: SchemaRef,
    limits: Limits,
    writer: StreamWriter<Vec<u8>>,
    rows_in_last: usize,
    total_bytes: usize,
}

impl Chunker {
    fn new(schema: SchemaRef, limits: Limits) -> Result<Self> {
        let writer = StreamWriter::try_new(Vec::new(), &schema)?;
        Ok(Self {
            schema,
            limits,
            writer,
            rows_in_last: 0,
            total_bytes: 0,
        })
    }

    fn push(&mut self, batch: &RecordBatch) -> Result<Vec<Bytes>> {
        let mut full = Vec::new();
        let mut offset = 0;
        while offset < batch.num_rows() {
            let len = SLICE_ROWS.min(batch.num_rows() - offset);
            self.writer.write(&batch.slice(offset, len))?;
            self.rows_in_last += len;
            offset += len;
            let bytes = self.writer.get_ref().len();
            // Until the data is known to exceed the inline threshold, keep one
            // stream so that small data can still go inline in the plan.
            let caching = self.total_bytes > 0 || bytes >= self.limits.cache_threshold;
            if caching && (self.rows_in_last >= self.limits.chunk_rows || bytes >= self.limits.chunk_bytes) {
                full.push(self.cut()?);
            }
        }
        Ok(full)
    }

    fn cut(&mut self) -> Result<Bytes> {
        let fresh = StreamWriter::try_new(Vec::new(), &self.schema)?;
        let mut done = std::mem::replace(&mut self.writer, fresh);
        done.finish()?;
        self.rows_in_last = 0;
        let bytes = Bytes::from(done.into_inner()?);
        self.total_bytes += bytes.len();
        if self.total_bytes > self.limits.size_limit {
            return Err(Error::InvalidArgument(format!(
                "local data exceeds spark.sql.session.localRelationSizeLimit ({} bytes)",
                self.limits.size_limit
            )));
        }
        Ok(bytes)
    }

    /// The last chunk (possibly only a schema, when there were no rows).
    fn finish(&mut self) -> Result<Bytes> {
        self.cut()
    }
}

/// Uploads chunks as `cache/<sha256>` artifacts, one AddArtifacts call per batch
/// of chunks, so at most one batch is held in memory.
struct Uploader<'a> {
    session: &'a SparkSession,
    limits: Limits,
    pending: Vec<(String, Bytes)>,
    pending_bytes: usize,
    hashes: Vec<String>,
}

impl<'a> Uploader<'a> {
    fn new(session: &'a SparkSession, limits: Limits) -> Self {
        Self {
            session,
            limits,
            pending: Vec::new(),
            pending_bytes: 0,
            hashes: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    async fn add(&mut self, chunk: Bytes) -> Result<()> {
        let hash = hex(&Sha256::digest(&chunk));
        self.hashes.push(hash.clone());
        if self.pending_bytes + chunk.len() > self.limits.upload_batch_bytes {
            self.flush().await?;
        }
        self.pending_bytes += chunk.len();
        self.pending.push((hash, chunk));
        Ok(())
    }

    /// Uploads a blob that is not a data chunk; returns its hash.
    async fn add_schema(&mut self, blob: Bytes) -> Result<String> {
        let hash = hex(&Sha256::digest(&blob));
        self.pending_bytes += blob.len();
        self.pending.push((hash.clone(), blob));
        Ok(hash)
    }

    async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let artifacts = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(hash, data)| (format!("cache/{hash}"), data))
            .collect();
        self.pending_bytes = 0;
        self.session.add_artifacts(artifacts).await
    }

    async fn finish(mut self) -> Result<Vec<String>> {
        self.flush().await?;
        Ok(self.hashes)
    }
}

impl SparkSession {
    /// Uploads named artifacts (`cache/…`, `pyfiles/…`, `jars/…`) in one
    /// AddArtifacts call, each cut into CRC-checked pieces.
    pub(crate) async fn add_artifacts(&self, artifacts: Vec<(String, Bytes)>) -> Result<()> {
        if artifacts.is_empty() {
            return Ok(());
        }
        let transport = self.transport();
        let total: usize = artifacts.iter().map(|(_, data)| data.len()).sum();
        let mut requests = Vec::new();
        for (name, data) in artifacts {
            let pieces: Vec<Bytes> = (0..data.len().div_ceil(ARTIFACT_MESSAGE_BYTES).max(1))
                .map(|i| {
                    let start = i * ARTIFACT_MESSAGE_BYTES;
                    data.slice(start..(start + ARTIFACT_MESSAGE_BYTES).min(data.len()))
                })
                .collect();
            let chunk = |piece: &Bytes| ArtifactChunk {
                crc: i64::from(compute_crc32(piece)),
                data: piece.clone(),
            };
            let base = AddArtifactsRequest {
                session_id: transport.session_id().to_string(),
                user_context: Some(transport.user_context()),
                client_type: Some(transport.client_type().to_string()),
                ..Default::default()
            };
            // The server only finishes a chunked artifact on a `Chunk` message, so a
            // single-piece artifact must go as a batch entry.
            if let [only] = pieces.as_slice() {
                requests.push(AddArtifactsRequest {
                    payload: Some(Payload::Batch(Batch {
                        artifacts: vec![SingleChunkArtifact {
                            name,
                            data: Some(chunk(only)),
                        }],
                    })),
                    ..base.clone()
                });
                continue;
            }
            requests.push(AddArtifactsRequest {
                payload: Some(Payload::BeginChunk(BeginChunkedArtifact {
                    name,
                    total_bytes: data.len() as i64,
                    num_chunks: pieces.len() as i64,
                    initial_chunk: pieces.first().map(chunk),
                })),
                ..base.clone()
            });
            for piece in pieces.iter().skip(1) {
                requests.push(AddArtifactsRequest {
                    payload: Some(Payload::Chunk(chunk(piece))),
                    ..base.clone()
                });
            }
        }
        let response = transport
            .stub()
            .add_artifacts(futures::stream::iter(requests))
            .await
            .map_err(|s| transport.error(s))?
            .into_inner();
        if let Some(bad) = response.artifacts.iter().find(|a| !a.is_crc_successful) {
            return Err(Error::Protocol(format!(
                "the server rejected artifact {} (CRC mismatch)",
                bad.name
            )));
        }
        transport
            .bytes_out
            .fetch_add(total as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
