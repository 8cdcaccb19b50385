//! Exactly-once ingest into a job's splits
//! ([`IngestState`](crate::jobs::splits::IngestState)): per `DoPut`
//! stream, what it staged until it commits all or nothing; end of data.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use kindling_schemas::descriptor::Split;
use kindling_schemas::metadata::{BatchMetadata, PutAck};
use kindling_schemas::schema::{self, FeatureLayout, StreamKind};
use kindling_schemas::spec::JobKind;

use crate::cache::Origin;
use crate::error::{AgentError, IngestError, JobStateError, LimitError, SpillError};
use crate::jobs::job::{Job, JobData};

fn refuse_if_terminal(job: &Job, d: &JobData) -> Result<(), AgentError> {
    if let JobKind::Trial { dataset } = job.spec.kind() {
        return Err(JobStateError::Dataset {
            job_id: job.job_id.clone(),
            dataset: dataset.to_owned(),
            reason: "the job takes no rows: it trains on the dataset's".into(),
        }
        .into());
    }
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
        // A repeated end_of_data (its reply was lost) is answered the same
        // even when the job has trained meanwhile; a first one is refused.
        if !d.ingest.split_mut(split).ended() {
            refuse_if_terminal(job, &d)?;
        }
        let s = d.ingest.split_mut(split);
        let rows = s.committed_rows();
        if let Some(expected) = expected_rows
            && expected != rows
        {
            return Err(IngestError::RowCountMismatch {
                job_id: job.job_id.clone(),
                split,
                committed: rows,
                expected,
            }
            .into());
        }
        s.end();
        rows
    };
    job.notify_data();
    Ok(rows)
}

/// Lets `split` of `job` take rows again until its next `end_of_data`
/// (the client re-feeding a lost agent's shards to this one), dropping the
/// rows `drop` (producers) committed here: handed over to an agent that
/// joined a growing gang. Returns the committed rows.
pub fn reopen_split(job: &Job, split: Split, drop: &[String]) -> Result<u64, AgentError> {
    refuse_if_terminal(job, &job.lock())?;
    // The rows change: a copy kept on the disk no longer holds them.
    crate::jobs::kept::forget(job)?;
    let mut d = job.lock();
    refuse_if_terminal(job, &d)?;
    let s = d.ingest.split_mut(split);
    s.reopen();
    if !drop.is_empty() {
        let rows = s.drop_producers(drop);
        tracing::info!(job = %job.job_id, split = split.as_str(), producers = ?drop, rows, "rows handed over dropped");
    }
    Ok(s.committed_rows())
}

/// What one stream staged for one producer.
#[derive(Debug, Clone)]
struct Staged {
    /// The producer's name, shared by the origins of its batches.
    name: Arc<str>,
    /// The producer's committed position when the stream started staging.
    first: u64,
    /// Next expected sequence number.
    next: u64,
    /// Rows staged.
    rows: u64,
    /// Arrow bytes staged (the sum of the batches' acked `bytes`).
    bytes: u64,
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
    /// What the stream's job may stage, and for how long.
    pub fn staging(&self) -> crate::cache::StagingLimits {
        self.job.staging()
    }

    /// A new stream into `split` of `job`.
    pub fn open(job: Arc<Job>, split: Split) -> Self {
        let stream = { job.lock().ingest.open_stream() };
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
                return Err(IngestError::LayoutMismatch {
                    stream: layout.features,
                    job: existing.features.clone(),
                }
                .into());
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
            return Err(IngestError::BatchBeforeSchema.into());
        }
        schema::validate_batch(&batch, &self.job.spec)?;
        let rows = batch.num_rows() as u64;
        let (placed, producer) = {
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
                    stream_rows: None,
                });
            }
            let staged = self
                .staged
                .entry(meta.producer.clone())
                .or_insert_with(|| Staged {
                    name: Arc::from(meta.producer.as_str()),
                    first: committed.next_seq,
                    next: committed.next_seq,
                    rows: 0,
                    bytes: 0,
                });
            let producer = staged.name.clone();
            if meta.seq != staged.next {
                return Err(IngestError::SequenceGap {
                    producer: meta.producer,
                    got: meta.seq,
                    expected: staged.next,
                }
                .into());
            }
            // New rows (not a resent batch, answered above) into a split
            // said to be done would change what end_of_data counted; the
            // client reopens a split it re-feeds (`reopen_split`).
            if split.ended() {
                return Err(self.ended());
            }
            self.within_caps(&d.ingest, schema::batch_bytes(&batch))?;
            // Past half the memory budget staged batches spill.
            let held = d.ingest.staged_bytes();
            let budget = self.job.budget_limit();
            let placed = d
                .ingest
                .split_mut(self.split)
                .cache
                .place_within(batch, held < budget / 2)?;
            (placed, producer)
        };
        let bytes = placed.bytes();
        let stored = if placed.spills() {
            tokio::task::spawn_blocking(move || placed.store())
                .await
                .map_err(AgentError::panicked("the spill writer"))?
        } else {
            placed.store()
        };
        let cached = match stored {
            Ok(cached) => cached,
            Err(e @ SpillError::Full { .. }) => {
                self.job.report(
                    kindling_schemas::action::EventLevel::Error,
                    &format!("spill directory full, the job fails: {e}"),
                );
                self.job.fail_and_drop_data(e.to_string());
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        let origin = Origin {
            producer,
            seq: meta.seq,
        };
        self.job
            .lock()
            .ingest
            .split_mut(self.split)
            .cache
            .stage_from(self.stream, Some(origin), cached);
        if let Some(staged) = self.staged.get_mut(&meta.producer) {
            staged.next += 1;
            staged.rows += rows;
            staged.bytes += bytes;
        }
        Ok(PutAck {
            producer: meta.producer,
            seq: meta.seq,
            rows,
            duplicate: false,
            committed: false,
            bytes,
            stream_rows: None,
        })
    }

    /// The refusal of new rows into the stream's split, which ended.
    fn ended(&self) -> AgentError {
        IngestError::SplitEnded {
            job_id: self.job.job_id.clone(),
            split: self.split,
        }
        .into()
    }

    /// Whether a batch of `bytes` fits the job's caps: what its uncommitted
    /// streams hold, and all its rows here, committed and staged.
    fn within_caps(&self, ingest: &crate::jobs::splits::IngestState, bytes: u64) -> Result<(), AgentError> {
        let limits = self.job.staging();
        let (staged, cap) = (ingest.staged_bytes(), limits.cap());
        if staged >= cap {
            return Err(LimitError::StagingFull {
                job_id: self.job.job_id.clone(),
                staged,
                cap,
            }
            .into());
        }
        let (held, cap) = (ingest.held_bytes(), limits.job_cap());
        if held.saturating_add(bytes) > cap {
            return Err(LimitError::JobFull {
                job_id: self.job.job_id.clone(),
                held,
                needed: bytes,
                cap,
            }
            .into());
        }
        Ok(())
    }

    /// Makes the stream's rows part of the shard, all or nothing: if another
    /// stream of the same producer committed first (a retried or speculative
    /// task), this stream's rows are dropped and reported as duplicates. One
    /// final ack per producer. A stream with rows to commit into a split
    /// that ended meanwhile is refused, its rows dropped.
    pub fn commit(mut self) -> Result<Vec<PutAck>, AgentError> {
        let mut acks = Vec::new();
        {
            let mut d = self.job.lock();
            let split = d.ingest.split_mut(self.split);
            if split.ended() && !self.staged.is_empty() {
                split.cache.abort(self.stream);
                return Err(self.ended());
            }
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
                if still_next {
                    split.advance(&producer, st.next, st.rows);
                }
                let pos = split.position(&producer);
                acks.push(PutAck {
                    producer,
                    seq: st.next.saturating_sub(1),
                    rows: pos.rows,
                    duplicate: !still_next,
                    committed: true,
                    bytes: if still_next { st.bytes } else { 0 },
                    stream_rows: Some(if still_next { st.rows } else { 0 }),
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
                    stream_rows: Some(0),
                });
            }
        }
        self.job.notify_data();
        Ok(acks)
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
