//! The driver relay: rows streamed through this process (a Spark query, or
//! Arrow batches from anywhere) and dealt evenly to the job's shards
//! ([`relay`], [`Dealer`]). A persisted DataFrame goes to the agents as
//! consecutive queries over ranges of its partitions, each small enough for
//! the Spark Connect server to hold ([`plan`], [`SparkRows`]).
//!
//! Spark Connect runs a query's result as one Spark job whose tasks each
//! return their whole partition. The server keeps every response until the
//! client has read it (its execution never waits for the client), and it
//! aborts the job once the results pass `spark.driver.maxResultSize` (1 GiB
//! unless the server sets it). So one query over a large DataFrame fails past
//! that limit, and while the agents read slower than Spark computes, the
//! server's heap holds what they have not read yet. One slice at a time, both
//! are bounded by a slice. The slices follow the partitions' order, so the
//! rows arrive in the same order as from one query, and again on a re-feed.

use std::time::{Duration, Instant};

use arrow::array::{Array, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::schema;
use kindling_schemas::spec::JobSpec;

use super::{AgentClient, FeedError};
use crate::spark::functions::expr;
use crate::spark::{DataFrame, RecordBatchStream};

/// Batches larger than this are sliced before they are sent.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// How often relay progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Default Arrow bytes per relayed slice (`TrainingJob::relay_slice_bytes`).
pub(crate) const DEFAULT_SLICE_BYTES: u64 = 256 << 20;
/// Spark's default `spark.driver.maxResultSize`, assumed when the server does not say.
const SPARK_DEFAULT_MAX_RESULT_BYTES: u64 = 1 << 30;
/// The share of the server's limit a slice may fill: the limit counts the
/// serialized task results, which carry Arrow IPC framing besides the values.
const LIMIT_SHARE: (u64, u64) = (3, 4);

/// Opens the rows of an Arrow source once more (a feed, or a re-feed of lost shards).
pub(crate) type OpenFn<'a> =
    dyn Fn() -> BoxFuture<'static, Result<RecordBatchStream, crate::spark::Error>> + Send + Sync + 'a;

/// Where a job reads its rows from.
pub(crate) enum Rows<'a> {
    /// A Spark query, executed as a stream (again for a re-feed), whole or in slices.
    Spark(SparkRows),
    /// Arrow batches from anywhere (files, another service), opened per feed.
    Arrow { schema: SchemaRef, open: &'a OpenFn<'a> },
}

impl Rows<'_> {
    /// The rows as one stream, from the start.
    pub async fn open(&self) -> Result<(SchemaRef, RecordBatchStream), FeedError> {
        match self {
            Rows::Spark(rows) => Ok(rows.open().await?),
            Rows::Arrow { schema, open } => Ok((schema.clone(), open().await?)),
        }
    }

    /// Bytes this client exchanged with Spark so far (0 for other sources).
    pub fn spark_bytes(&self) -> u64 {
        match self {
            Rows::Spark(rows) => {
                let b = rows.df().session().data_bytes();
                b.received + b.sent
            }
            Rows::Arrow { .. } => 0,
        }
    }

    /// Queries a feed of these rows runs.
    pub fn queries(&self) -> usize {
        match self {
            Rows::Spark(rows) => rows.queries(),
            Rows::Arrow { .. } => 1,
        }
    }
}

/// The job's shards: agent clients and ids by shard, optionally only some.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shards<'a> {
    pub clients: &'a [AgentClient],
    pub agent_ids: &'a [String],
    /// `Some`: only these shards are (re-)fed.
    pub only: Option<&'a [usize]>,
}

impl Shards<'_> {
    /// Whether shard `s` is fed this time.
    pub fn feeds(&self, s: usize) -> bool {
        self.only.is_none_or(|o| o.contains(&s))
    }
}

/// Bytes a relay keeps unacknowledged per shard, and per `DoPut` stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub window_bytes: usize,
    pub commit_bytes: usize,
}

/// Streams `data` through this process and deals every batch's rows out to
/// the shards ([`Dealer`]), checking each batch's values against `spec` and
/// each shard's committed rows. `progress(shard, rows, rows_per_sec)` is
/// called about every 250 ms. Returns rows per shard and the bytes sent.
pub(crate) async fn relay(
    job_id: &str,
    spec: &JobSpec,
    data: &Rows<'_>,
    split: Split,
    shards: Shards<'_>,
    window: Window,
    mut progress: impl FnMut(usize, u64, f64),
) -> Result<(Vec<u64>, u64), FeedError> {
    let clients = shards.clients;
    let n = clients.len();
    let (schema, mut stream) = data.open().await?;
    let path = DataPath::data(job_id, split);
    let mut writers: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(s, c)| {
            shards.feeds(s).then(|| {
                c.put_committing(
                    &path,
                    producer_of(s),
                    schema.clone(),
                    window.window_bytes,
                    window.commit_bytes,
                )
            })
        })
        .collect();
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut rows = vec![0u64; n];
    let mut dealer = Dealer::new(n);
    while let Some(batch) = stream.try_next().await? {
        if batch.num_rows() == 0 {
            continue;
        }
        schema::validate_batch(&batch, spec)?;
        for (s, piece) in dealer.deal(&batch) {
            if let Some(w) = writers[s].as_mut() {
                w.write(&piece).await?;
            }
            rows[s] += piece.num_rows() as u64;
            if last_report.elapsed() >= PROGRESS_EVERY {
                last_report = Instant::now();
                let secs = started.elapsed().as_secs_f64().max(1e-9);
                progress(s, rows[s], rows.iter().sum::<u64>() as f64 / secs);
            }
        }
    }
    let mut bytes = 0;
    for (s, w) in writers.into_iter().enumerate() {
        let Some(w) = w else { continue };
        let receipt = w.finish().await?;
        bytes += receipt.bytes_sent;
        if receipt.rows_committed != rows[s] {
            return Err(FeedError::RowMismatch {
                shard: s,
                agent: clients[s].url().to_owned(),
                sent: rows[s],
                committed: receipt.rows_committed,
            });
        }
    }
    Ok((rows, bytes))
}

/// The producer name under which the relay puts shard `shard`'s rows (the
/// same on a re-feed, and when the shard moves to another agent).
pub(crate) fn producer_of(shard: usize) -> String {
    format!("shard-{shard}")
}

/// The shard whose rows `producer` ([`producer_of`]) sent, if it is one.
pub(crate) fn shard_of(producer: &str) -> Option<usize> {
    let n = producer.strip_prefix("shard-")?;
    n.parse().ok().filter(|s| producer_of(*s) == producer)
}

/// Deals the rows of a stream of batches out to `n` shards, deterministically
/// and evenly: each batch is cut into `n` contiguous slices whose sizes differ
/// by at most one row, and the shard that takes the first of the larger
/// slices rotates, so after any prefix of the stream the shards' row counts
/// differ by at most one. (Routing whole batches round-robin would put a
/// one-batch result, or a result of few large batches, on few shards.)
/// Slices are further cut to at most [`MAX_BATCH_BYTES`].
pub(crate) struct Dealer {
    n: usize,
    next: usize,
}

impl Dealer {
    pub fn new(n: usize) -> Self {
        Self { n: n.max(1), next: 0 }
    }

    /// `(shard, slice)` pairs covering `batch` in row order; empty slices are left out.
    pub fn deal(&mut self, batch: &RecordBatch) -> Vec<(usize, RecordBatch)> {
        let rows = batch.num_rows();
        let (base, extra) = (rows / self.n, rows % self.n);
        let mut out = Vec::with_capacity(self.n);
        let mut start = 0;
        for k in 0..self.n {
            let len = base + usize::from(k < extra);
            if len == 0 {
                break;
            }
            let shard = (self.next + k) % self.n;
            for piece in slice_large(&batch.slice(start, len)) {
                out.push((shard, piece));
            }
            start += len;
        }
        self.next = (self.next + extra) % self.n;
        out
    }
}

/// Slices a batch so no piece exceeds [`MAX_BATCH_BYTES`].
fn slice_large(batch: &RecordBatch) -> Vec<RecordBatch> {
    let bytes = schema::batch_bytes(batch) as usize;
    if bytes <= MAX_BATCH_BYTES || batch.num_rows() < 2 {
        return vec![batch.clone()];
    }
    let pieces = bytes.div_ceil(MAX_BATCH_BYTES);
    let per = batch.num_rows().div_ceil(pieces);
    (0..batch.num_rows())
        .step_by(per)
        .map(|start| batch.slice(start, per.min(batch.num_rows() - start)))
        .collect()
}

/// Partitions `first..=last` of a DataFrame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartitionRange {
    first: i32,
    last: i32,
}

/// A Spark query relayed as one stream, or as one query per slice.
#[derive(Debug, Clone)]
pub(crate) struct SparkRows {
    df: DataFrame,
    /// Empty: one query over the whole DataFrame.
    slices: Vec<PartitionRange>,
}

impl SparkRows {
    /// The whole DataFrame in one query.
    pub fn whole(df: DataFrame) -> SparkRows {
        SparkRows {
            df,
            slices: Vec::new(),
        }
    }

    pub fn df(&self) -> &DataFrame {
        &self.df
    }

    /// Queries the relay runs (1 when not sliced).
    pub fn queries(&self) -> usize {
        self.slices.len().max(1)
    }

    /// The rows as one stream. A slice's query starts only once the previous
    /// slice has been read to its end.
    pub async fn open(&self) -> Result<(SchemaRef, RecordBatchStream), crate::spark::Error> {
        let Some((head, rest)) = self.slices.split_first() else {
            let stream = self.df.execute_stream().await?;
            return Ok((stream.schema(), stream.into_inner()));
        };
        let first = slice_of(&self.df, *head).execute_stream().await?;
        let schema = first.schema();
        let df = self.df.clone();
        let tail = futures::stream::iter(rest.to_vec())
            .then(move |range| {
                let slice = slice_of(&df, range);
                async move { slice.execute_stream().await.map(|s| s.into_inner()) }
            })
            .try_flatten();
        Ok((schema, Box::pin(first.into_inner().chain(tail))))
    }
}

fn slice_of(df: &DataFrame, range: PartitionRange) -> DataFrame {
    df.filter(expr(&format!(
        "spark_partition_id() BETWEEN {} AND {}",
        range.first, range.last
    )))
}

/// Plans the relay of a persisted DataFrame (`schema` is its schema): counts
/// its rows per partition (one small aggregate over the cached rows) and cuts
/// the partitions into consecutive slices of at most `slice_bytes` of Arrow
/// values, and at most three quarters of the server's `spark.driver.maxResultSize`.
pub(crate) async fn plan(df: DataFrame, schema: &Schema, slice_bytes: u64) -> Result<SparkRows, FeedError> {
    let limit = server_result_limit(&df).await;
    // The most one query may return here; `None` when the server sets no limit.
    let cap = limit.map(|limit| limit / LIMIT_SHARE.1 * LIMIT_SHARE.0);
    let budget = cap.map_or(slice_bytes, |cap| slice_bytes.min(cap));
    let counts = partition_rows(&df).await?;
    let row_bytes = arrow_row_bytes(schema);
    if let (Some(limit), Some(cap)) = (limit, cap)
        && let Some(&(partition, rows)) = counts.iter().max_by_key(|(_, rows)| *rows)
        && rows * row_bytes > cap
    {
        return Err(FeedError::PartitionTooLarge {
            partition,
            rows,
            bytes: rows * row_bytes,
            limit,
        });
    }
    let slices = cut(&counts, row_bytes, budget);
    tracing::debug!(
        partitions = counts.len(),
        row_bytes,
        budget,
        slices = slices.len(),
        "driver relay planned"
    );
    Ok(SparkRows {
        df,
        slices: if slices.len() > 1 { slices } else { Vec::new() },
    })
}

/// The server's `spark.driver.maxResultSize` in bytes; `None` when unlimited
/// (`0`). Spark's default when the server does not report it.
async fn server_result_limit(df: &DataFrame) -> Option<u64> {
    let value = df.session().conf_get("spark.driver.maxResultSize").await;
    match value.ok().flatten().as_deref().map(parse_spark_bytes) {
        Some(Some(0)) => None,
        Some(Some(bytes)) => Some(bytes),
        _ => Some(SPARK_DEFAULT_MAX_RESULT_BYTES),
    }
}

/// Rows of each non-empty partition, by partition id.
async fn partition_rows(df: &DataFrame) -> Result<Vec<(i32, u64)>, FeedError> {
    let batches: Vec<RecordBatch> = df
        .select_expr(["spark_partition_id() AS partition"])
        .group_by(["partition"])
        .count()
        .collect()
        .await?;
    let mut counts = Vec::new();
    for batch in &batches {
        let ids = batch.column(0).as_any().downcast_ref::<Int32Array>();
        let rows = batch.column(1).as_any().downcast_ref::<Int64Array>();
        let (Some(ids), Some(rows)) = (ids, rows) else {
            return Err(FeedError::Spark(crate::spark::Error::Protocol(format!(
                "rows per partition came back as {:?}",
                batch.schema()
            ))));
        };
        for i in 0..ids.len() {
            counts.push((ids.value(i), rows.value(i).max(0) as u64));
        }
    }
    counts.sort_unstable();
    Ok(counts)
}

/// Arrow bytes of one row of fixed-width columns (values and validity bits);
/// 8 per value for a type without a fixed width (strings, binary): an
/// estimate, so slices of long strings can be larger than planned.
fn arrow_row_bytes(schema: &Schema) -> u64 {
    fn width(dt: &DataType) -> u64 {
        match dt {
            DataType::FixedSizeList(item, n) => width(item.data_type()) * (*n).max(0) as u64,
            DataType::Boolean => 1,
            other => other.primitive_width().map_or(8, |w| w as u64),
        }
    }
    let values: u64 = schema.fields().iter().map(|f| width(f.data_type())).sum();
    values + (schema.fields().len() as u64).div_ceil(8)
}

/// Consecutive runs of partitions of at most `budget` bytes each (a partition
/// larger than the budget alone).
fn cut(counts: &[(i32, u64)], row_bytes: u64, budget: u64) -> Vec<PartitionRange> {
    let mut slices: Vec<PartitionRange> = Vec::new();
    let mut filled = 0u64;
    for &(partition, rows) in counts {
        let bytes = rows * row_bytes;
        match slices.last_mut() {
            Some(last) if filled + bytes <= budget => {
                last.last = partition;
                filled += bytes;
            }
            _ => {
                slices.push(PartitionRange {
                    first: partition,
                    last: partition,
                });
                filled = bytes;
            }
        }
    }
    slices
}

/// Bytes from a Spark size setting: `1g`, `512m`, `64k`, `2048` (bytes), `1gb`.
fn parse_spark_bytes(value: &str) -> Option<u64> {
    let v = value.trim().to_ascii_lowercase();
    let v = v.strip_suffix('b').filter(|s| !s.is_empty()).unwrap_or(&v);
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use std::sync::Arc;

    fn ids(from: i64, rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let ids = Int64Array::from_iter_values(from..from + rows as i64);
        RecordBatch::try_new(schema, vec![Arc::new(ids)]).expect("batch")
    }

    #[test]
    fn dealt_rows_stay_within_one_of_each_other_and_keep_their_order() {
        use arrow::array::AsArray;
        use arrow::datatypes::Int64Type;
        for n in 1..=4 {
            let mut dealer = Dealer::new(n);
            let mut per_shard: Vec<Vec<i64>> = vec![Vec::new(); n];
            let mut from = 0i64;
            for rows in [1usize, 3001, 7, 2, 1, 1, 10_000, 5] {
                for (s, piece) in dealer.deal(&ids(from, rows)) {
                    per_shard[s].extend(piece.column(0).as_primitive::<Int64Type>().values());
                }
                from += rows as i64;
                let counts: Vec<usize> = per_shard.iter().map(Vec::len).collect();
                let (lo, hi) = (counts.iter().min().copied(), counts.iter().max().copied());
                assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "n={n}: {counts:?}");
            }
            // Every row lands exactly once, each shard's rows in stream order.
            let mut all: Vec<i64> = per_shard.iter().flatten().copied().collect();
            for ids in &per_shard {
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "n={n}: order");
            }
            all.sort_unstable();
            assert_eq!(all, (0..from).collect::<Vec<_>>(), "n={n}");
        }
    }

    #[test]
    fn spark_sizes_parse_as_spark_reads_them() {
        assert_eq!(parse_spark_bytes("1g"), Some(1 << 30));
        assert_eq!(parse_spark_bytes("1024m"), Some(1 << 30));
        assert_eq!(parse_spark_bytes("4M"), Some(4 << 20));
        assert_eq!(parse_spark_bytes("64k"), Some(64 << 10));
        assert_eq!(parse_spark_bytes("2gb"), Some(2 << 30));
        assert_eq!(parse_spark_bytes("2048"), Some(2048));
        assert_eq!(parse_spark_bytes("0"), Some(0));
        assert_eq!(parse_spark_bytes("lots"), None);
        assert_eq!(parse_spark_bytes("1x"), None);
        assert_eq!(parse_spark_bytes(""), None);
    }

    #[test]
    fn a_row_counts_every_value_and_its_validity_bit() {
        let schema = Schema::new(vec![
            Field::new("x", DataType::Float32, true),
            Field::new("d", DataType::Float64, true),
            Field::new(
                "v",
                DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 16),
                true,
            ),
            Field::new("label", DataType::Int32, true),
        ]);
        assert_eq!(arrow_row_bytes(&schema), 4 + 8 + 64 + 4 + 1);
    }

    #[test]
    fn slices_are_consecutive_cover_every_partition_once_and_stay_in_budget() {
        let counts: Vec<(i32, u64)> = vec![(0, 10), (1, 10), (2, 10), (4, 25), (5, 1), (7, 40), (8, 5)];
        let slices = cut(&counts, 2, 40);
        assert_eq!(
            slices,
            vec![
                PartitionRange { first: 0, last: 1 },
                PartitionRange { first: 2, last: 2 },
                PartitionRange { first: 4, last: 4 },
                PartitionRange { first: 5, last: 5 },
                PartitionRange { first: 7, last: 7 },
                PartitionRange { first: 8, last: 8 },
            ]
        );
        // Every partition in exactly one slice, in order, none over budget
        // unless it is alone.
        for &(p, rows) in &counts {
            let holding: Vec<_> = slices.iter().filter(|s| s.first <= p && p <= s.last).collect();
            assert_eq!(holding.len(), 1, "partition {p}");
            let s = holding[0];
            let bytes: u64 = counts
                .iter()
                .filter(|(q, _)| s.first <= *q && *q <= s.last)
                .map(|(_, r)| r * 2)
                .sum();
            assert!(
                bytes <= 40 || s.first == s.last,
                "slice {s:?} holds {bytes} bytes ({rows} rows)"
            );
        }
        assert!(slices.windows(2).all(|w| w[0].last < w[1].first));
    }

    #[test]
    fn a_small_dataframe_is_one_slice_and_an_empty_one_none() {
        assert_eq!(cut(&[(0, 5), (1, 5)], 4, 1 << 20).len(), 1);
        assert!(cut(&[], 4, 1 << 20).is_empty());
    }
}
