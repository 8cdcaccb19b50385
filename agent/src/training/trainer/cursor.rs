//! Cuts a rank's cached batches into training batches: in a given order
//! (a complete shard, shuffled from epoch 2) or in commit order as they
//! arrive (a live first epoch).

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use rand::SeedableRng;
use rand::seq::SliceRandom;

use kindling_schemas::spec::JobSpec;

use super::{ShardSource, TrainContext};
use crate::cache::CachedBatch;
use crate::error::AgentError;

/// What [`BatchCursor::pull`] found.
#[derive(Debug)]
pub enum Pull {
    /// A training batch of `batch_size` rows (fewer only at the shard's end)
    /// and where its rows come from, in order.
    Ready(RecordBatch, Vec<Piece>),
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

pub use crate::models::kindling_model::staged::Piece;

/// Cuts a shard's cached batches, in a given order (or in commit order as
/// they arrive), into training batches of `batch_size` rows (the last may be
/// smaller), concatenating across cached batches when needed. Holds at most
/// one cached batch plus the parts of one training batch in memory.
#[derive(Debug)]
pub struct BatchCursor {
    source: Order,
    /// The cached batch being cut (as read: permuted), how far, and whence.
    current: Option<(RecordBatch, usize, Piece)>,
    parts: Vec<RecordBatch>,
    pieces: Vec<Piece>,
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
            pieces: Vec::new(),
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

    /// `cached` read (its rows permuted when shuffling), and a piece of
    /// none of its rows yet that says so.
    fn read(&mut self, cached: Arc<CachedBatch>) -> Result<(RecordBatch, usize, Piece), AgentError> {
        let batch = cached.load()?;
        let Some((seed, loaded)) = self.shuffle_rows.as_mut() else {
            return Ok((batch, 0, Piece::of(cached, None)));
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(*seed ^ loaded.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        *loaded += 1;
        let mut rows: Vec<u32> = (0..batch.num_rows() as u32).collect();
        rows.shuffle(&mut rng);
        // The permutation's buffer serves the take and then the pieces.
        let rows = arrow::array::UInt32Array::from(rows);
        let permuted = arrow::compute::take_record_batch(&batch, &rows).map_err(AgentError::arrow)?;
        Ok((permuted, 0, Piece::of(cached, Some(rows.values().clone()))))
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

    /// Skips the first `rows` rows of a complete shard (where a mid-epoch
    /// checkpoint left its epoch): the rows [`pull`](Self::pull) would have
    /// handed out first, in the same order. Whole cached batches are passed
    /// over unread; the batch the position falls in is read.
    pub fn skip_rows(&mut self, mut rows: u64) -> Result<(), AgentError> {
        while rows > 0 {
            if let Some((batch, pos, piece)) = self.current.take() {
                let take = (batch.num_rows() - pos).min(rows as usize);
                rows -= take as u64;
                if pos + take < batch.num_rows() {
                    self.current = Some((batch, pos + take, piece));
                }
                continue;
            }
            let Some(Some(cached)) = self.next_cached(Duration::ZERO) else {
                return Ok(()); // the shard ended first
            };
            if (cached.rows() as u64) <= rows {
                rows -= cached.rows() as u64;
                if let Some((_, loaded)) = self.shuffle_rows.as_mut() {
                    *loaded += 1; // as if permuted: the next batch's rows shuffle as before
                }
                continue;
            }
            self.current = Some(self.read(cached)?);
        }
        Ok(())
    }

    /// The next training batch; on an arriving shard waits up to `wait` for
    /// rows before answering [`Pull::NotYet`] (the rows gathered so far stay).
    pub fn pull(&mut self, wait: Duration) -> Result<Pull, AgentError> {
        while self.have < self.batch_size {
            let (batch, pos, piece) = match self.current.take() {
                Some(c) => c,
                None => match self.next_cached(wait) {
                    Some(Some(cached)) => self.read(cached)?,
                    Some(None) => break,
                    None => return Ok(Pull::NotYet),
                },
            };
            let take = (self.batch_size - self.have).min(batch.num_rows() - pos);
            if take > 0 {
                self.parts.push(batch.slice(pos, take));
                self.pieces.push(piece.rows(pos, take));
                self.have += take;
            }
            if pos + take < batch.num_rows() {
                self.current = Some((batch, pos + take, piece));
            }
        }
        self.have = 0;
        let mut parts = std::mem::take(&mut self.parts);
        let pieces = std::mem::take(&mut self.pieces);
        match parts.len() {
            0 => Ok(Pull::Exhausted),
            1 => Ok(Pull::Ready(parts.pop().expect("one part"), pieces)),
            _ => {
                let schema = parts[0].schema();
                arrow::compute::concat_batches(&schema, &parts)
                    .map(|b| Pull::Ready(b, pieces))
                    .map_err(AgentError::arrow)
            }
        }
    }
}

/// The batches of epoch `epoch`: in commit order while live or in the first
/// epoch; from epoch 2 in the shard's own order ([`shard_order`]), shuffled
/// (the order of its cached batches and the rows inside each) by the seed,
/// the epoch and the shard — not the rank, which a replaced agent may change.
pub(super) fn for_epoch(
    ctx: &TrainContext,
    spec: &JobSpec,
    (train, ended): (Vec<Arc<CachedBatch>>, bool),
    epoch: u32,
    live: bool,
) -> BatchCursor {
    let b = spec.batch_size;
    if live {
        return BatchCursor::arriving(ctx.data.clone(), train, ended, b);
    }
    let (mut order, shard) = match epoch {
        1 => ((0..train.len()).collect(), 0),
        _ => shard_order(&ctx.data.train_origins(train.len()), ctx.ring.rank()),
    };
    let shuffle = (ctx.shuffle && epoch > 1).then_some(spec.seed ^ ((epoch as u64) << 32) ^ shard);
    if let Some(seed) = shuffle {
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    }
    let cursor = BatchCursor::new(train, order, b);
    match shuffle {
        Some(seed) => cursor.shuffling_rows(seed.rotate_left(17)),
        None => cursor,
    }
}

/// A shard's batches in one order whatever order they committed in (a
/// shard fed again commits its producers' streams in another): by producer
/// and sequence number. Returns the order and the shard's identity for its
/// shuffle's seed: a hash of its first producer's name. Where a batch's
/// origin is unknown, commit order and `rank` are kept.
fn shard_order(origins: &[Option<crate::cache::Origin>], rank: u32) -> (Vec<usize>, u64) {
    let mut order: Vec<usize> = (0..origins.len()).collect();
    if origins.iter().any(Option::is_none) {
        return (order, rank as u64);
    }
    order.sort_by(|&a, &b| origins[a].cmp(&origins[b]));
    let first = order.first().and_then(|&i| origins[i].as_ref());
    (order, first.map_or(rank as u64, |o| fnv1a(o.producer.as_bytes())))
}

/// FNV-1a, 64 bits: a hash that is the same in every agent process and
/// release (std's hasher promises neither).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
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
        while let Pull::Ready(b, _) = cursor.pull(std::time::Duration::ZERO).expect("pull") {
            out.push(b.column(0).as_primitive::<Int64Type>().values().to_vec());
        }
        out
    }

    /// Every id a cursor still hands out, in order.
    fn rest(mut cursor: BatchCursor) -> Vec<i64> {
        let mut out = Vec::new();
        while let Pull::Ready(b, _) = cursor.pull(std::time::Duration::ZERO).expect("pull") {
            out.extend(b.column(0).as_primitive::<Int64Type>().values().iter());
        }
        out
    }

    #[test]
    fn skipping_rows_resumes_exactly_where_pulling_them_would_have() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cache = ShardCache::new(dir.path().join("s"), MemoryBudget::new(1 << 20));
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        for (start, n) in [(0i64, 700i64), (700, 1000), (1700, 300)] {
            let ids = Int64Array::from_iter_values(start..start + n);
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids)]).expect("batch");
            cache.append(1, batch).expect("append");
        }
        cache.commit(1);
        let cursor = || BatchCursor::new(cache.snapshot(), vec![2, 0, 1], 64).shuffling_rows(5);
        let full = rest(cursor());
        assert_eq!(full.len(), 2000);
        for skip in [0u64, 1, 64, 299, 300, 301, 999, 1000, 1984, 1999, 2000, 2500] {
            let mut c = cursor();
            c.skip_rows(skip).expect("skip");
            let from = (skip as usize).min(full.len());
            assert_eq!(rest(c), full[from..], "after skipping {skip} rows");
        }
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

    #[test]
    fn a_shard_has_one_order_and_seed_whatever_order_it_committed_in() {
        use crate::cache::Origin;
        let o = |p: &str, seq| {
            Some(Origin {
                producer: p.into(),
                seq,
            })
        };
        let first = [o("part-1", 0), o("part-0", 0), o("part-1", 1), o("part-0", 1)];
        let again = [o("part-0", 0), o("part-0", 1), o("part-1", 0), o("part-1", 1)];
        let order = |origins: &[Option<Origin>], rank| {
            let (order, seed) = super::shard_order(origins, rank);
            (
                order.iter().map(|&i| origins[i].clone()).collect::<Vec<_>>(),
                seed,
            )
        };
        // Fed again to an agent of another rank: the same batches in the same order, the same seed.
        assert_eq!(order(&first, 0), order(&again, 1));
        assert_eq!(order(&again, 1).0, again.to_vec());
        assert_ne!(
            order(&first, 0).1,
            order(&[o("part-2", 0)], 0).1,
            "another shard, another seed"
        );
        // An unknown origin keeps commit order and the rank.
        let unknown = [o("part-1", 0), None];
        assert_eq!(super::shard_order(&unknown, 3), (vec![0, 1], 3));
    }
}
