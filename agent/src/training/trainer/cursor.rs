//! Cuts a rank's cached batches into training batches: in a given order
//! (a complete shard, shuffled from epoch 2) or in commit order as they
//! arrive (a live first epoch).

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use rand::SeedableRng;
use rand::seq::SliceRandom;

use super::ShardSource;
use crate::cache::CachedBatch;
use crate::error::AgentError;

/// What [`BatchCursor::pull`] found.
#[derive(Debug)]
pub enum Pull {
    /// A training batch of `batch_size` rows (fewer only at the shard's end).
    Ready(RecordBatch),
    /// The shard is still arriving and has no full batch yet.
    NotYet,
    /// The shard has ended and every row was handed out.
    Exhausted,
}

#[derive(Debug)]
enum Order {
    /// A complete shard in a given order.
    Fixed {
        cached: Vec<Arc<CachedBatch>>,
        order: std::vec::IntoIter<usize>,
    },
    /// A shard still arriving, in commit order.
    Arriving {
        source: Arc<dyn ShardSource>,
        seen: usize,
        ready: std::collections::VecDeque<Arc<CachedBatch>>,
        ended: bool,
    },
}

/// Cuts a shard's cached batches, in a given order (or in commit order as
/// they arrive), into training batches of `batch_size` rows (the last may be
/// smaller), concatenating across cached batches when needed. Holds at most
/// one cached batch plus the parts of one training batch in memory.
#[derive(Debug)]
pub struct BatchCursor {
    source: Order,
    current: Option<(RecordBatch, usize)>,
    parts: Vec<RecordBatch>,
    have: usize,
    batch_size: usize,
    /// Permute the rows of each cached batch as it is loaded (seed, batches loaded).
    shuffle_rows: Option<(u64, u64)>,
}

impl BatchCursor {
    /// A cursor over a complete shard `cached` in `order`.
    pub fn new(cached: Vec<Arc<CachedBatch>>, order: Vec<usize>, batch_size: usize) -> Self {
        Self::over(
            Order::Fixed {
                cached,
                order: order.into_iter(),
            },
            batch_size,
        )
    }

    /// A cursor over a train split that may still be arriving, in commit
    /// order, starting with `committed` (what `source.train_since(0)` gave,
    /// and whether the split had `ended` then).
    pub fn arriving(
        source: Arc<dyn ShardSource>,
        committed: Vec<Arc<CachedBatch>>,
        ended: bool,
        batch_size: usize,
    ) -> Self {
        Self::over(
            Order::Arriving {
                source,
                seen: committed.len(),
                ready: committed.into(),
                ended,
            },
            batch_size,
        )
    }

    fn over(source: Order, batch_size: usize) -> Self {
        BatchCursor {
            source,
            current: None,
            parts: Vec::new(),
            have: 0,
            batch_size,
            shuffle_rows: None,
        }
    }

    /// Also permutes the rows inside every cached batch (seeded by `seed` and
    /// the batch's position in the order), so a step's rows change from epoch
    /// to epoch even when a shard is a few large cached batches whose rows
    /// arrived sorted.
    pub fn shuffling_rows(mut self, seed: u64) -> Self {
        self.shuffle_rows = Some((seed, 0));
        self
    }

    fn permuted(&mut self, batch: RecordBatch) -> Result<RecordBatch, AgentError> {
        let Some((seed, loaded)) = self.shuffle_rows.as_mut() else {
            return Ok(batch);
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(*seed ^ loaded.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        *loaded += 1;
        let mut rows: Vec<u32> = (0..batch.num_rows() as u32).collect();
        rows.shuffle(&mut rng);
        arrow::compute::take_record_batch(&batch, &arrow::array::UInt32Array::from(rows))
            .map_err(AgentError::arrow)
    }

    /// The next cached batch: `Ok(Some(Some))`, `Ok(Some(None))` when the
    /// shard has ended, `Ok(None)` when nothing arrived within `wait`.
    fn next_cached(&mut self, wait: Duration) -> Option<Option<Arc<CachedBatch>>> {
        match &mut self.source {
            Order::Fixed { cached, order } => Some(order.next().map(|i| cached[i].clone())),
            Order::Arriving {
                source,
                seen,
                ready,
                ended,
            } => {
                let mut waited = false;
                loop {
                    if let Some(b) = ready.pop_front() {
                        return Some(Some(b));
                    }
                    if *ended {
                        return Some(None);
                    }
                    let (more, now_ended) = source.train_since(*seen);
                    *seen += more.len();
                    ready.extend(more);
                    *ended = now_ended;
                    if ready.is_empty() && !*ended {
                        if waited {
                            return None;
                        }
                        source.wait(wait);
                        waited = true;
                    }
                }
            }
        }
    }

    /// The next training batch; on an arriving shard waits up to `wait` for
    /// rows before answering [`Pull::NotYet`] (the rows gathered so far stay).
    pub fn pull(&mut self, wait: Duration) -> Result<Pull, AgentError> {
        while self.have < self.batch_size {
            let (batch, pos) = match self.current.take() {
                Some(c) => c,
                None => match self.next_cached(wait) {
                    Some(Some(cached)) => (self.permuted(cached.load()?)?, 0),
                    Some(None) => break,
                    None => return Ok(Pull::NotYet),
                },
            };
            let take = (self.batch_size - self.have).min(batch.num_rows() - pos);
            if take > 0 {
                self.parts.push(batch.slice(pos, take));
                self.have += take;
            }
            if pos + take < batch.num_rows() {
                self.current = Some((batch, pos + take));
            }
        }
        self.have = 0;
        let mut parts = std::mem::take(&mut self.parts);
        match parts.len() {
            0 => Ok(Pull::Exhausted),
            1 => Ok(Pull::Ready(parts.pop().expect("one part"))),
            _ => {
                let schema = parts[0].schema();
                arrow::compute::concat_batches(&schema, &parts)
                    .map(Pull::Ready)
                    .map_err(AgentError::arrow)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::{BatchCursor, Pull};
    use crate::cache::{MemoryBudget, ShardCache};

    /// Two cached batches of sorted ids, read in batches of 64.
    fn steps(shuffle: Option<u64>) -> Vec<Vec<i64>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cache = ShardCache::new(dir.path().join("s"), MemoryBudget::new(1 << 20));
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        for start in [0i64, 1000] {
            let ids = Int64Array::from_iter_values(start..start + 1000);
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids)]).expect("batch");
            cache.append(1, batch).expect("append");
        }
        cache.commit(1);
        let cursor = BatchCursor::new(cache.snapshot(), vec![1, 0], 64);
        let mut cursor = match shuffle {
            Some(seed) => cursor.shuffling_rows(seed),
            None => cursor,
        };
        let mut out = Vec::new();
        while let Pull::Ready(b) = cursor.pull(std::time::Duration::ZERO).expect("pull") {
            out.push(b.column(0).as_primitive::<Int64Type>().values().to_vec());
        }
        out
    }

    #[test]
    fn shuffled_rows_cover_the_shard_once_and_differ_by_seed_but_not_by_run() {
        let plain = steps(None);
        assert_eq!(
            plain[0],
            (1000..1064).collect::<Vec<_>>(),
            "batch order is followed"
        );
        let a = steps(Some(7));
        assert_eq!(a, steps(Some(7)), "same seed, same steps");
        assert_ne!(a, steps(Some(8)), "another seed, other steps");
        assert_ne!(a[0], plain[0], "rows are permuted inside a cached batch");
        assert!(
            a[0].iter().all(|id| (1000..2000).contains(id)),
            "…but stay in their batch"
        );
        assert_eq!(a.len(), plain.len());
        let mut all: Vec<i64> = a.concat();
        all.sort_unstable();
        assert_eq!(all, (0..2000).collect::<Vec<_>>());
    }
}
