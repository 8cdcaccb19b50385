//! A job's rows on this agent: each split's cache, who committed what to
//! it, and whether its producers said they are done.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use kindling_schemas::descriptor::Split;

use crate::cache::{DiskBudget, MemoryBudget, ShardCache};

/// A producer's committed position in one split.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProducerPosition {
    /// The next sequence number not yet committed.
    pub next_seq: u64,
    /// Rows committed.
    pub rows: u64,
}

/// One split of a job on this agent: its rows, who committed them, and
/// whether its producers said they are done.
#[derive(Debug)]
pub struct SplitIngest {
    /// The split's batches.
    pub cache: ShardCache,
    producers: HashMap<String, ProducerPosition>,
    ended: bool,
}

impl SplitIngest {
    fn new(cache: ShardCache) -> Self {
        SplitIngest {
            cache,
            producers: HashMap::new(),
            ended: false,
        }
    }

    /// The producer's committed position (zero before its first commit).
    pub fn position(&self, producer: &str) -> ProducerPosition {
        self.producers.get(producer).copied().unwrap_or_default()
    }

    /// Every producer's committed position.
    pub fn positions(&self) -> impl Iterator<Item = (&str, ProducerPosition)> {
        self.producers.iter().map(|(p, pos)| (p.as_str(), *pos))
    }

    /// Whether the split's producers said they are done.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Committed rows.
    pub fn committed_rows(&self) -> u64 {
        self.cache.committed_rows()
    }

    /// Records that the split's producers are done.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// Takes rows again until the next [`end`](Self::end).
    pub fn reopen(&mut self) {
        self.ended = false;
    }

    /// Drops the rows `producers` committed (handed over to another agent)
    /// and forgets their positions; returns the rows dropped.
    pub fn drop_producers(&mut self, producers: &[String]) -> u64 {
        let names: Vec<&str> = producers.iter().map(String::as_str).collect();
        for p in producers {
            self.producers.remove(p);
        }
        self.cache.drop_producers(&names)
    }

    /// Moves `producer`'s committed position to `next_seq`, `rows` more rows on.
    pub fn advance(&mut self, producer: &str, next_seq: u64, rows: u64) {
        let pos = self.producers.entry(producer.to_owned()).or_default();
        pos.next_seq = next_seq;
        pos.rows += rows;
    }
}

/// Both splits of a job and the numbering of its `DoPut` streams.
#[derive(Debug)]
pub struct IngestState {
    train: SplitIngest,
    eval: SplitIngest,
    next_stream: u64,
}

impl IngestState {
    /// Empty splits spilling under `spill_dir` (`train/`, `eval/`) below the
    /// disk watermark `disk`, in memory up to `budget`.
    pub fn new(spill_dir: &Path, budget: Arc<MemoryBudget>, disk: Arc<DiskBudget>) -> Self {
        let cache =
            |name: &str| ShardCache::new(spill_dir.join(name), budget.clone()).with_disk(disk.clone());
        IngestState {
            train: SplitIngest::new(cache("train")),
            eval: SplitIngest::new(cache("eval")),
            next_stream: 0,
        }
    }

    /// One split.
    pub fn split(&self, split: Split) -> &SplitIngest {
        match split {
            Split::Train => &self.train,
            Split::Eval => &self.eval,
        }
    }

    /// One split, to change.
    pub fn split_mut(&mut self, split: Split) -> &mut SplitIngest {
        match split {
            Split::Train => &mut self.train,
            Split::Eval => &mut self.eval,
        }
    }

    /// `(bytes in memory, bytes on disk)` of both splits.
    pub fn bytes(&self) -> (u64, u64) {
        let (m1, d1) = self.train.cache.bytes();
        let (m2, d2) = self.eval.cache.bytes();
        (m1 + m2, d1 + d2)
    }

    /// Numbers a new `DoPut` stream.
    pub fn open_stream(&mut self) -> u64 {
        self.next_stream += 1;
        self.next_stream
    }

    /// Drops every cached batch of both splits.
    pub fn clear(&mut self) {
        self.train.cache.clear();
        self.eval.cache.clear();
    }

    /// Bytes the job's rows hold, committed and staged, both splits.
    pub fn held_bytes(&self) -> u64 {
        self.staged_bytes() + self.train.cache.committed_bytes() + self.eval.cache.committed_bytes()
    }

    /// Bytes the job's uncommitted streams hold, both splits.
    pub fn staged_bytes(&self) -> u64 {
        self.train.cache.staged_bytes() + self.eval.cache.staged_bytes()
    }
}
