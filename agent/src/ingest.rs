//! Exactly-once ingest: per split, the shard cache, each producer's committed
//! position and end-of-data; per `DoPut` stream, what it staged until it
//! commits all or nothing.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use kindling_schemas::descriptor::Split;
use kindling_schemas::metadata::{BatchMetadata, PutAck};
use kindling_schemas::schema::{self, FeatureLayout, StreamKind};

use crate::cache::{MemoryBudget, ShardCache};
use crate::error::AgentError;
use crate::job::{Job, JobData};

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

    /// Whether the split's producers said they are done.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Committed rows.
    pub fn committed_rows(&self) -> u64 {
        self.cache.committed_rows()
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
    /// Empty splits spilling under `spill_dir` (`train/`, `eval/`), in memory
    /// up to `budget`.
    pub fn new(spill_dir: &Path, budget: Arc<MemoryBudget>) -> Self {
        IngestState {
            train: SplitIngest::new(ShardCache::new(spill_dir.join("train"), budget.clone())),
            eval: SplitIngest::new(ShardCache::new(spill_dir.join("eval"), budget)),
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

    /// Drops every cached batch of both splits.
    pub fn clear(&mut self) {
        self.train.cache.clear();
        self.eval.cache.clear();
    }
}

fn refuse_if_terminal(job: &Job, d: &JobData) -> Result<(), AgentError> {
    if d.state.is_terminal() {
        return Err(AgentError::wrong_state(
            &job.job_id,
            d.state,
            "it takes no more data",
        ));
    }
    Ok(())
}

/// Marks `split` of `job` as ended; with `expected_rows`, only when exactly
/// that many rows were committed here. Returns the committed rows.
pub fn end_of_data(job: &Job, split: Split, expected_rows: Option<u64>) -> Result<u64, AgentError> {
    let rows = {
        let mut d = job.lock();
        refuse_if_terminal(job, &d)?;
        let s = d.ingest.split_mut(split);
        let rows = s.committed_rows();
        if let Some(expected) = expected_rows
            && expected != rows
        {
            return Err(AgentError::RowCountMismatch {
                job_id: job.job_id.clone(),
                split,
                committed: rows,
                expected,
            });
        }
        s.ended = true;
        rows
    };
    job.notify_data();
    Ok(rows)
}

/// What one stream staged for one producer.
#[derive(Debug, Clone, Copy)]
struct Staged {
    /// The producer's committed position when the stream started staging.
    first: u64,
    /// Next expected sequence number.
    next: u64,
    /// Rows staged.
    rows: u64,
}

/// The state of one `DoPut` stream: staged batches become part of the shard
/// on [`commit`](Self::commit), all or nothing.
#[derive(Debug)]
pub struct PutStream {
    job: Arc<Job>,
    split: Split,
    stream: u64,
    /// Per producer, what this stream staged.
    staged: HashMap<String, Staged>,
    /// Producers whose batches in this stream were all already committed.
    duplicates_only: HashSet<String>,
    schema_seen: bool,
}

impl PutStream {
    /// A new stream into `split` of `job`.
    pub fn open(job: Arc<Job>, split: Split) -> Self {
        let stream = {
            let mut d = job.lock();
            d.ingest.next_stream += 1;
            d.ingest.next_stream
        };
        PutStream {
            job,
            split,
            stream,
            staged: HashMap::new(),
            duplicates_only: HashSet::new(),
            schema_seen: false,
        }
    }

    /// Checks the stream's schema against the job spec and the layout of the
    /// job's earlier streams (the first one sets it).
    pub fn accept_schema(&mut self, schema: &Schema) -> Result<(), AgentError> {
        let layout = schema::validate(schema, &self.job.spec, StreamKind::Train)?;
        let mut d = self.job.lock();
        refuse_if_terminal(&self.job, &d)?;
        match &d.layout {
            Some(existing) if !same_layout(existing, &layout) => {
                return Err(AgentError::LayoutMismatch {
                    stream: layout.features,
                    job: existing.features.clone(),
                });
            }
            Some(_) => {}
            None => d.layout = Some(layout),
        }
        self.schema_seen = true;
        Ok(())
    }

    /// Stages a batch, or acknowledges it as a duplicate when its producer
    /// already committed it. A batch past the memory budget is spilled on the
    /// blocking pool, outside the job's lock.
    pub async fn accept_batch(
        &mut self,
        meta: BatchMetadata,
        batch: RecordBatch,
    ) -> Result<PutAck, AgentError> {
        if !self.schema_seen {
            return Err(AgentError::BatchBeforeSchema);
        }
        schema::validate_batch(&batch, &self.job.spec)?;
        let rows = batch.num_rows() as u64;
        let placed = {
            let mut d = self.job.lock();
            let split = d.ingest.split_mut(self.split);
            let committed = split.position(&meta.producer);
            if meta.seq < committed.next_seq && !self.staged.contains_key(&meta.producer) {
                self.duplicates_only.insert(meta.producer.clone());
                let bytes = schema::batch_bytes(&batch);
                return Ok(PutAck {
                    producer: meta.producer,
                    seq: meta.seq,
                    rows,
                    duplicate: true,
                    committed: false,
                    bytes,
                });
            }
            let staged = self.staged.entry(meta.producer.clone()).or_insert(Staged {
                first: committed.next_seq,
                next: committed.next_seq,
                rows: 0,
            });
            if meta.seq != staged.next {
                return Err(AgentError::SequenceGap {
                    producer: meta.producer,
                    got: meta.seq,
                    expected: staged.next,
                });
            }
            split.cache.place(batch)
        };
        let bytes = placed.bytes();
        let cached = if placed.spills() {
            tokio::task::spawn_blocking(move || placed.store())
                .await
                .map_err(|source| AgentError::Panicked {
                    task: "the spill writer",
                    source,
                })??
        } else {
            placed.store()?
        };
        self.job
            .lock()
            .ingest
            .split_mut(self.split)
            .cache
            .stage(self.stream, cached);
        if let Some(staged) = self.staged.get_mut(&meta.producer) {
            staged.next += 1;
            staged.rows += rows;
        }
        Ok(PutAck {
            producer: meta.producer,
            seq: meta.seq,
            rows,
            duplicate: false,
            committed: false,
            bytes,
        })
    }

    /// Makes the stream's rows part of the shard, all or nothing: if another
    /// stream of the same producer committed first (a retried or speculative
    /// task), this stream's rows are dropped and reported as duplicates. One
    /// final ack per producer.
    pub fn commit(mut self) -> Vec<PutAck> {
        let mut acks = Vec::new();
        {
            let mut d = self.job.lock();
            let split = d.ingest.split_mut(self.split);
            let still_next = self
                .staged
                .iter()
                .all(|(producer, st)| split.position(producer).next_seq == st.first);
            if still_next {
                split.cache.commit(self.stream);
            } else {
                split.cache.abort(self.stream);
            }
            for (producer, st) in self.staged.drain() {
                let pos = split.producers.entry(producer.clone()).or_default();
                if still_next {
                    pos.next_seq = st.next;
                    pos.rows += st.rows;
                }
                acks.push(PutAck {
                    producer,
                    seq: st.next.saturating_sub(1),
                    rows: pos.rows,
                    duplicate: !still_next,
                    committed: true,
                    bytes: 0,
                });
            }
            for producer in self.duplicates_only.drain() {
                if acks.iter().any(|a| a.producer == producer) {
                    continue;
                }
                let pos = split.position(&producer);
                acks.push(PutAck {
                    producer,
                    seq: pos.next_seq.saturating_sub(1),
                    rows: pos.rows,
                    duplicate: true,
                    committed: true,
                    bytes: 0,
                });
            }
        }
        self.job.notify_data();
        acks
    }

    /// Drops the stream's staged batches.
    pub fn abort(self) {
        self.job
            .lock()
            .ingest
            .split_mut(self.split)
            .cache
            .abort(self.stream);
    }
}

fn same_layout(a: &FeatureLayout, b: &FeatureLayout) -> bool {
    a.input_dim == b.input_dim
        && a.features
            .iter()
            .map(|f| &f.name)
            .eq(b.features.iter().map(|f| &f.name))
}
