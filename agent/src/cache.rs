//! The shard cache: a job split's committed batches, in memory up to a byte
//! budget shared by the whole agent, spilled to node-local Arrow IPC files past it.
//!
//! Batches arrive per producer stream and only become visible to the trainer
//! when their stream commits; an aborted stream's batches are dropped.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::RecordBatch;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;

pub use crate::error::SpillError;
pub use disk::{DiskBudget, Reservation};

pub mod disk;

/// The agent-wide memory budget for cached batches.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    used: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(MemoryBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Reserves `bytes` if they fit.
    fn try_reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= self.limit).then_some(used + bytes)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The budget.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes in use.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// One cached batch, in memory or on disk. Dropping it frees its memory or file.
#[derive(Debug)]
pub enum CachedBatch {
    /// Held in memory.
    Memory {
        /// The batch.
        batch: RecordBatch,
        /// Bytes charged to the budget.
        bytes: u64,
        /// The budget to give them back to.
        budget: Arc<MemoryBudget>,
    },
    /// Spilled to an Arrow IPC file.
    Disk {
        /// The file.
        path: PathBuf,
        /// File size.
        bytes: u64,
        /// Rows in it.
        rows: usize,
        /// Its bytes below the disk watermark, given back with the file.
        reserved: Reservation,
    },
}

impl CachedBatch {
    /// The batch, read back from disk if it was spilled.
    pub fn load(&self) -> Result<RecordBatch, SpillError> {
        match self {
            CachedBatch::Memory { batch, .. } => Ok(batch.clone()),
            CachedBatch::Disk { path, .. } => {
                let file = File::open(path).map_err(|source| SpillError::Io {
                    context: format!("open spill file {}", path.display()),
                    source,
                })?;
                let mut reader = FileReader::try_new(file, None).map_err(SpillError::Arrow)?;
                reader
                    .next()
                    .ok_or_else(|| SpillError::Empty(path.clone()))?
                    .map_err(SpillError::Arrow)
            }
        }
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        match self {
            CachedBatch::Memory { batch, .. } => batch.num_rows(),
            CachedBatch::Disk { rows, .. } => *rows,
        }
    }
}

impl Drop for CachedBatch {
    fn drop(&mut self) {
        match self {
            CachedBatch::Memory { bytes, budget, .. } => budget.release(*bytes),
            CachedBatch::Disk { path, .. } => {
                if let Err(e) = std::fs::remove_file(path.as_path()) {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove spill file");
                }
            }
        }
    }
}

/// Bounds on what a job's `DoPut` streams stage before they commit: staged
/// rows are nobody's until their stream ends, so a producer that never ends
/// its stream must not hold the agent's memory or disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingLimits {
    /// Most bytes one job's uncommitted streams hold, in memory and spilled
    /// together; a batch past it is refused (`RESOURCE_EXHAUSTED`). `None`:
    /// [`DEFAULT_MAX_STAGED_BYTES`]. Staged bytes past half the memory budget
    /// always spill, so one job's staging leaves the other half to the rest.
    pub max_staged_bytes: Option<u64>,
    /// A stream that sends nothing for this long is ended, its staged rows
    /// dropped (`DEADLINE_EXCEEDED`).
    pub stream_idle: std::time::Duration,
    /// A stream open longer than this is ended likewise.
    pub stream_max_age: std::time::Duration,
    /// Most bytes the `DoPut` and `DoExchange` streams of all job
    /// credentials together may pin while their messages are received
    /// (each open stream holds a buffer the size of its largest message
    /// until it ends); one credential's streams at most half of it. A
    /// message past either ends its stream (`RESOURCE_EXHAUSTED`) before it
    /// is read. The operator token's streams are not metered. `None`: half
    /// the memory budget, at least [`MIN_RECEIVING_BYTES`].
    pub max_receiving_bytes: Option<u64>,
    /// Most bytes one job's rows hold on this agent, committed and staged,
    /// in memory and spilled together: a batch that would take them past it
    /// is refused (`RESOURCE_EXHAUSTED`), whatever else the job's streams
    /// stage or the agent has free. `None`: [`DEFAULT_MAX_JOB_BYTES`].
    pub max_job_bytes: Option<u64>,
    /// Most bytes all jobs' spill files hold on this agent together (the
    /// disk watermark); `None`: [`disk::DEFAULT_DISK_WATERMARK`].
    pub disk_watermark: Option<u64>,
    /// The free space a spill leaves on the work volume's file system at
    /// least; `None`: [`disk::DEFAULT_MIN_FREE_DISK`].
    pub min_free_disk: Option<u64>,
}

/// The least default of [`StagingLimits::max_receiving_bytes`]: room for
/// a credential's executors to push 8 MiB batches on 8 streams at once.
pub const MIN_RECEIVING_BYTES: u64 = 128 << 20;

impl Default for StagingLimits {
    fn default() -> Self {
        StagingLimits {
            max_staged_bytes: None,
            stream_idle: std::time::Duration::from_secs(300),
            stream_max_age: std::time::Duration::from_secs(6 * 3600),
            max_receiving_bytes: None,
            max_job_bytes: None,
            disk_watermark: None,
            min_free_disk: None,
        }
    }
}

/// The default cap on one job's rows on an agent: below the disk
/// watermark's default, so one job cannot take every other job's room.
pub const DEFAULT_MAX_JOB_BYTES: u64 = 32 << 30;

/// The default cap on one job's staged bytes: a partition pushed in one
/// stream may be far larger than the memory budget (it spills), so the cap
/// bounds the disk, not the memory (a third of the manifests' 50 GiB work
/// volume).
pub const DEFAULT_MAX_STAGED_BYTES: u64 = 16 << 30;

impl StagingLimits {
    /// The staged-bytes cap for a job.
    pub fn cap(&self) -> u64 {
        self.max_staged_bytes.unwrap_or(DEFAULT_MAX_STAGED_BYTES)
    }

    /// The cap on one job's rows, committed and staged.
    pub fn job_cap(&self) -> u64 {
        self.max_job_bytes.unwrap_or(DEFAULT_MAX_JOB_BYTES)
    }

    /// The agent's disk watermark, shared by its jobs' caches.
    pub fn disk(&self) -> Arc<DiskBudget> {
        DiskBudget::new(
            self.disk_watermark.unwrap_or(disk::DEFAULT_DISK_WATERMARK),
            self.min_free_disk.unwrap_or(disk::DEFAULT_MIN_FREE_DISK),
        )
    }

    /// The receive-buffer bound of an agent with `memory_budget`: all job
    /// credentials' streams, and one credential's (half of it).
    pub fn receiving(&self, memory_budget: u64) -> kindling_ops::receiving::ReceiveBudget {
        let total = self
            .max_receiving_bytes
            .unwrap_or((memory_budget / 2).max(MIN_RECEIVING_BYTES));
        kindling_ops::receiving::ReceiveBudget::new(total, total / 2)
    }
}

/// A batch whose place [`ShardCache::place`] decided, not yet stored.
#[derive(Debug)]
pub enum PlacedBatch {
    /// Fits the budget (already charged what it holds).
    Memory {
        /// The batch, charged.
        cached: CachedBatch,
        /// Its Arrow size (the acks' `bytes`).
        values: u64,
    },
    /// Goes to a spill file.
    Spill {
        /// The spill directory (created on first spill).
        dir: PathBuf,
        /// The file to write.
        path: PathBuf,
        /// The batch.
        batch: RecordBatch,
        /// Its Arrow size.
        bytes: u64,
        /// Its Arrow size, reserved below the disk watermark.
        reserved: Reservation,
        /// The watermark, which also says what the volume keeps free.
        disk: Arc<DiskBudget>,
    },
}

impl PlacedBatch {
    /// The batch's Arrow size: the bytes of its values (buffers shared by
    /// its columns, as after an IPC decode, count once). What it charges the
    /// budget in memory is what it holds, at least this.
    pub fn bytes(&self) -> u64 {
        match self {
            PlacedBatch::Memory { values, .. } => *values,
            PlacedBatch::Spill { bytes, .. } => *bytes,
        }
    }

    /// Whether [`store`](Self::store) writes a file (blocking I/O: run it off
    /// the async runtime).
    pub fn spills(&self) -> bool {
        matches!(self, PlacedBatch::Spill { .. })
    }

    /// Stores the batch: nothing to do in memory, else writes its spill file.
    pub fn store(self) -> Result<CachedBatch, SpillError> {
        match self {
            PlacedBatch::Memory { cached, .. } => Ok(cached),
            PlacedBatch::Spill {
                dir,
                path,
                batch,
                bytes,
                reserved,
                disk,
            } => {
                // A full disk is told apart from a broken one wherever the write fails.
                let failed = |context: String, source: std::io::Error| {
                    if is_out_of_space(&source) {
                        SpillError::Full {
                            dir: dir.clone(),
                            needed: bytes,
                            source,
                        }
                    } else {
                        SpillError::Io { context, source }
                    }
                };
                std::fs::create_dir_all(&dir)
                    .map_err(|e| failed(format!("create spill dir {}", dir.display()), e))?;
                disk.check_free(&dir, bytes)?;
                if let Err(e) = write_ipc_file(&path, &batch) {
                    // Nothing half-written stays behind.
                    let _ = std::fs::remove_file(&path);
                    return Err(match e {
                        WriteError::Io(e) => failed(format!("write spill file {}", path.display()), e),
                        WriteError::Arrow(e) => SpillError::Arrow(e),
                    });
                }
                let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                Ok(CachedBatch::Disk {
                    path,
                    bytes,
                    rows: batch.num_rows(),
                    reserved: reserved.resize(bytes),
                })
            }
        }
    }
}

#[derive(Debug)]
struct Entry {
    stream: u64,
    origin: Option<Origin>,
    batch: Arc<CachedBatch>,
}

/// Where a batch came from: its producer and its sequence number there.
/// Commit order changes when a shard is fed again (its producers' streams
/// commit in another order); origins give its batches one order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    /// The producer that sent it.
    pub producer: Arc<str>,
    /// Its sequence number in the producer's stream.
    pub seq: u64,
}

/// The batches of one job split on this agent.
#[derive(Debug)]
pub struct ShardCache {
    dir: PathBuf,
    budget: Arc<MemoryBudget>,
    disk: Arc<DiskBudget>,
    /// Staged batches of streams that have not committed yet.
    staged: Vec<Entry>,
    /// Committed batches in commit order: a batch's index never changes, so a
    /// trainer reading the shard while it arrives sees every batch once.
    committed: Vec<Arc<CachedBatch>>,
    /// The origin of each committed batch (`None` for a batch staged
    /// without one), by commit index.
    origins: Vec<Option<Origin>>,
    committed_rows: u64,
    /// Bytes of `committed`, in memory and on disk.
    committed_bytes: u64,
    /// Bytes of `staged`, in memory and on disk.
    staged_bytes: u64,
    next_file: u64,
}

/// What a stored batch holds, in memory or on disk.
fn stored_bytes(batch: &CachedBatch) -> u64 {
    match batch {
        CachedBatch::Memory { bytes, .. } | CachedBatch::Disk { bytes, .. } => *bytes,
    }
}

impl ShardCache {
    /// A cache spilling into `dir` (created on first spill), with no disk
    /// watermark but the volume's size.
    pub fn new(dir: impl Into<PathBuf>, budget: Arc<MemoryBudget>) -> Self {
        ShardCache {
            dir: dir.into(),
            budget,
            disk: DiskBudget::unbounded(),
            staged: Vec::new(),
            committed: Vec::new(),
            origins: Vec::new(),
            committed_rows: 0,
            committed_bytes: 0,
            staged_bytes: 0,
            next_file: 0,
        }
    }

    /// The cache, its spill files bounded by `disk` (shared by the agent's jobs).
    pub fn with_disk(mut self, disk: Arc<DiskBudget>) -> Self {
        self.disk = disk;
        self
    }

    /// Adds a batch of `stream`, not yet visible to readers, writing its
    /// spill file in place (see [`place`](Self::place) to write it elsewhere).
    /// Returns the batch's Arrow size, as [`PlacedBatch::bytes`].
    pub fn append(&mut self, stream: u64, batch: RecordBatch) -> Result<u64, SpillError> {
        let placed = self.place(batch)?;
        let bytes = placed.bytes();
        let cached = placed.store()?;
        self.stage(stream, cached);
        Ok(bytes)
    }

    /// Decides where a batch goes: memory when it fits the budget (charging
    /// it now), else a spill file named now and written by
    /// [`PlacedBatch::store`]. Cheap, so it can run under the job's lock while
    /// the spill write runs outside it. A batch that would spill past the
    /// disk watermark is refused ([`SpillError::Watermark`]).
    pub fn place(&mut self, batch: RecordBatch) -> Result<PlacedBatch, SpillError> {
        self.place_within(batch, true)
    }

    /// [`place`](Self::place), spilling whatever the budget holds when
    /// `memory` is false.
    pub fn place_within(&mut self, batch: RecordBatch, memory: bool) -> Result<PlacedBatch, SpillError> {
        let (batch, bytes, charge) = owned(batch);
        if memory && self.budget.try_reserve(charge) {
            return Ok(PlacedBatch::Memory {
                cached: CachedBatch::Memory {
                    batch,
                    bytes: charge,
                    budget: self.budget.clone(),
                },
                values: bytes,
            });
        }
        let reserved = self.disk.reserve(bytes)?;
        let path = self.dir.join(format!("batch-{:08}.arrow", self.next_file));
        self.next_file += 1;
        Ok(PlacedBatch::Spill {
            dir: self.dir.clone(),
            path,
            batch,
            bytes,
            reserved,
            disk: self.disk.clone(),
        })
    }

    /// Adds a stored batch of `stream`, not yet visible to readers.
    pub fn stage(&mut self, stream: u64, batch: CachedBatch) {
        self.stage_from(stream, None, batch);
    }

    /// [`stage`](Self::stage), recording where the batch came from.
    pub fn stage_from(&mut self, stream: u64, origin: Option<Origin>, batch: CachedBatch) {
        self.staged_bytes += stored_bytes(&batch);
        self.staged.push(Entry {
            stream,
            origin,
            batch: Arc::new(batch),
        });
    }

    /// Makes a stream's batches visible, after every batch committed before.
    pub fn commit(&mut self, stream: u64) {
        let (mine, others) = std::mem::take(&mut self.staged)
            .into_iter()
            .partition(|e| e.stream == stream);
        self.staged = others;
        for e in mine {
            self.staged_bytes -= stored_bytes(&e.batch);
            self.committed_bytes += stored_bytes(&e.batch);
            self.committed_rows += e.batch.rows() as u64;
            self.committed.push(e.batch);
            self.origins.push(e.origin);
        }
    }

    /// Drops a stream's uncommitted batches.
    pub fn abort(&mut self, stream: u64) {
        let mut freed = 0;
        self.staged.retain(|e| {
            let mine = e.stream == stream;
            if mine {
                freed += stored_bytes(&e.batch);
            }
            !mine
        });
        self.staged_bytes -= freed;
    }

    /// Bytes staged by streams that have not committed, in memory and on disk.
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes
    }

    /// The committed batches, in commit order.
    pub fn snapshot(&self) -> Vec<Arc<CachedBatch>> {
        self.committed.clone()
    }

    /// The committed batches from index `from` on (commit order).
    pub fn committed_since(&self, from: usize) -> Vec<Arc<CachedBatch>> {
        self.committed.get(from..).map(<[_]>::to_vec).unwrap_or_default()
    }

    /// The origins of the first `n` committed batches, by commit index.
    pub fn origins(&self, n: usize) -> Vec<Option<Origin>> {
        self.origins.iter().take(n).cloned().collect()
    }

    /// Committed rows.
    pub fn committed_rows(&self) -> u64 {
        self.committed_rows
    }

    /// Bytes of the committed batches, in memory and on disk.
    pub fn committed_bytes(&self) -> u64 {
        self.committed_bytes
    }

    /// `(bytes in memory, bytes on disk)` of every batch, committed or not.
    pub fn bytes(&self) -> (u64, u64) {
        self.committed
            .iter()
            .chain(self.staged.iter().map(|e| &e.batch))
            .fold((0, 0), |(m, d), b| match b.as_ref() {
                CachedBatch::Memory { bytes, .. } => (m + bytes, d),
                CachedBatch::Disk { bytes, .. } => (m, d + bytes),
            })
    }

    /// Drops the committed batches `producers` sent (handed over to another
    /// agent); the rest keep their order. Returns the rows dropped. Only
    /// while no trainer reads the split by index (its split reopened).
    pub fn drop_producers(&mut self, producers: &[&str]) -> u64 {
        let mine = |o: &Option<Origin>| {
            o.as_ref()
                .is_some_and(|o| producers.contains(&o.producer.as_ref()))
        };
        let (mut kept, mut origins) = (Vec::new(), Vec::new());
        let mut dropped = 0;
        for (batch, origin) in std::mem::take(&mut self.committed)
            .into_iter()
            .zip(std::mem::take(&mut self.origins))
        {
            if mine(&origin) {
                dropped += batch.rows() as u64;
                self.committed_bytes -= stored_bytes(&batch);
            } else {
                kept.push(batch);
                origins.push(origin);
            }
        }
        self.committed = kept;
        self.origins = origins;
        self.committed_rows -= dropped;
        dropped
    }

    /// The committed batches `producer` sent, in its sequence order.
    pub fn committed_by(&self, producer: &str) -> Vec<Arc<CachedBatch>> {
        let mut mine: Vec<(u64, Arc<CachedBatch>)> = self
            .committed
            .iter()
            .zip(&self.origins)
            .filter_map(|(b, o)| {
                o.as_ref()
                    .filter(|o| o.producer.as_ref() == producer)
                    .map(|o| (o.seq, b.clone()))
            })
            .collect();
        mine.sort_by_key(|(seq, _)| *seq);
        mine.into_iter().map(|(_, b)| b).collect()
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.staged.clear();
        self.staged_bytes = 0;
        self.committed.clear();
        self.origins.clear();
        self.committed_rows = 0;
        self.committed_bytes = 0;
    }
}

/// A failed spill write: the file system's error kept apart, so a full
/// disk can be told from a broken one.
enum WriteError {
    Io(std::io::Error),
    Arrow(arrow::error::ArrowError),
}

impl From<arrow::error::ArrowError> for WriteError {
    fn from(e: arrow::error::ArrowError) -> Self {
        match e {
            arrow::error::ArrowError::IoError(_, io) => WriteError::Io(io),
            other => WriteError::Arrow(other),
        }
    }
}

fn write_ipc_file(path: &Path, batch: &RecordBatch) -> Result<(), WriteError> {
    let file = File::create(path).map_err(WriteError::Io)?;
    let mut writer = FileWriter::try_new(BufWriter::new(file), &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    // The buffered tail is written (and can fail) here, not in a silent drop.
    writer
        .into_inner()?
        .into_inner()
        .map_err(|e| WriteError::Io(e.into_error()))?;
    Ok(())
}

/// How far the buffers a batch slices may outgrow its values before the
/// batch is copied into buffers of its own (IPC alignment, small messages).
const COPY_SLACK: u64 = 1 << 20;

/// `batch` as the cache keeps it, the bytes of its values, and what keeping
/// it costs (what it charges the budget). A batch decoded from a Flight
/// message slices the whole message body, so one padded past its values (a
/// one-row batch in a 60 MiB body) holds the body: one padded far past them
/// is copied into buffers of its own (the values only), and every batch is
/// charged what it still holds, never less than its values — so padding
/// below the copy threshold costs its sender budget, not the agent memory.
fn owned(batch: RecordBatch) -> (RecordBatch, u64, u64) {
    let values = kindling_schemas::schema::batch_bytes(&batch);
    let limit = values.saturating_mul(2).saturating_add(COPY_SLACK);
    let before = held(&batch);
    if before <= limit {
        return (batch, values, before.max(values));
    }
    let rows = arrow::array::UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    let copied = batch
        .columns()
        .iter()
        .map(|c| arrow::compute::take(c, &rows, None))
        .collect::<Result<Vec<_>, _>>()
        .and_then(|columns| RecordBatch::try_new(batch.schema(), columns));
    let batch = copied.unwrap_or(batch);
    let after = held(&batch);
    (batch, values, after.max(values))
}

/// [`owned`], for the ingest benchmark (`bench_agent --only caps`), which
/// times the accounting against ingest in the same run.
#[doc(hidden)]
pub fn charge(batch: RecordBatch) -> (RecordBatch, u64, u64) {
    owned(batch)
}

/// The memory a batch keeps alive, at least: its largest column's buffers
/// (columns of one decoded message share its body, so the body counts once).
fn held(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| c.get_array_memory_size() as u64)
        .max()
        .unwrap_or(0)
}

/// No room left on the device, or the user's quota is used up.
fn is_out_of_space(e: &std::io::Error) -> bool {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT)) || e.kind() == std::io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests;
