//! The next batch's inputs made while the current step runs: the tensors a
//! model asked its last batch for (`Asked`) are converted from Arrow and
//! queued to the device on a second thread ([`Staged`]), so that a GPU step
//! starts with its inputs already uploaded and the host's conversion overlaps
//! the device's work instead of following it. [`Pipeline`] is the one driver,
//! used by the trainer's epoch loop and the GPU benchmark alike.
//!
//! Batches staged are also kept on the device up to a budget (`Kept`), so
//! that the epochs after the first train on them with no upload at all: on an
//! H200 the upload of a batch of 4096 MNIST rows cost more than the step.
//! The trainer's batches are cut anew each epoch from the shard's cached
//! batches (rows shuffled): what it keeps is each cached batch whole, and a
//! training batch cut from kept ones is gathered on the device by its rows
//! ([`Piece`]); a batch passed as it is (the benchmarks') is kept as itself.

use std::sync::{Arc, Mutex, Weak};

use arrow::array::Array;

use arrow::array::RecordBatch;
use arrow::buffer::ScalarBuffer;
use burn::tensor::{Device, Int, Tensor, TensorData};
use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::JobSpec;

use super::{AnyModel, Batch, StepError};
use crate::cache::CachedBatch;
use crate::models::tensorize::Targets;

/// Which inputs a model read from a batch: what the next batch stages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Asked {
    pub features: bool,
    pub floats: Vec<String>,
    pub targets: bool,
}

impl Asked {
    fn any(&self) -> bool {
        self.features || self.targets || !self.floats.is_empty()
    }
}

/// What a [`Batch`] records as its model reads it.
#[derive(Debug, Default)]
pub(crate) struct AskLog(Mutex<Asked>);

impl AskLog {
    pub fn features(&self) {
        self.with(|a| a.features = true);
    }

    pub fn float(&self, column: &str) {
        self.with(|a| {
            if !a.floats.iter().any(|c| c == column) {
                a.floats.push(column.to_string());
            }
        });
    }

    pub fn targets(&self) {
        self.with(|a| a.targets = true);
    }

    pub fn take(&self) -> Asked {
        self.with(std::mem::take)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Asked) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One batch's inputs, already on the device (in the dtype the model
/// computes in). An input that failed to convert is left out: the step then
/// converts it itself and reports the error where it belongs.
#[derive(Debug, Default, Clone)]
pub struct Staged {
    pub(crate) features: Option<Tensor<2>>,
    pub(crate) floats: Vec<(String, Tensor<2>)>,
    pub(crate) targets: Option<Targets>,
}

impl Staged {
    fn make(batch: &Batch<'_>, asked: &Asked) -> Staged {
        Staged {
            features: asked.features.then(|| batch.features().ok()).flatten(),
            floats: asked
                .floats
                .iter()
                .filter_map(|c| Some((c.clone(), batch.float(c).ok()?)))
                .collect(),
            targets: asked.targets.then(|| batch.targets().ok()).flatten(),
        }
    }

    /// The rows of `parts` (each a kept cached batch's inputs and the piece
    /// of its rows), in order, gathered on `device`; an input some part
    /// lacks is left out.
    fn gather(parts: &[(&Staged, &Piece)], device: &Device) -> Staged {
        let rows: Vec<Tensor<1, Int>> = parts
            .iter()
            .map(|(_, p)| {
                let at = p.indices();
                let n = at.len();
                Tensor::from_data(TensorData::new(at, [n]), device)
            })
            .collect();
        let classes = |s: &Staged| match &s.targets {
            Some(Targets::Classes(t)) => Some(t.clone()),
            _ => None,
        };
        let values = |s: &Staged| match &s.targets {
            Some(Targets::Values(t)) => Some(t.clone()),
            _ => None,
        };
        let targets = match parts.first().and_then(|(s, _)| s.targets.as_ref()) {
            Some(Targets::Classes(_)) => {
                select_rows(parts.iter().map(|(s, _)| classes(s)), &rows).map(Targets::Classes)
            }
            Some(Targets::Values(_)) => {
                select_rows(parts.iter().map(|(s, _)| values(s)), &rows).map(Targets::Values)
            }
            None => None,
        };
        Staged {
            features: select_rows(parts.iter().map(|(s, _)| s.features.clone()), &rows),
            floats: parts
                .first()
                .into_iter()
                .flat_map(|(s, _)| &s.floats)
                .filter_map(|(c, _)| {
                    let picked = select_rows(parts.iter().map(|(s, _)| s.float(c)), &rows)?;
                    Some((c.clone(), picked))
                })
                .collect(),
            targets,
        }
    }

    pub(crate) fn float(&self, column: &str) -> Option<Tensor<2>> {
        self.floats
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, t)| t.clone())
    }

    /// Device bytes its tensors take.
    fn bytes(&self) -> u64 {
        let size = |t: &Tensor<2>| (t.shape().num_elements() * t.dtype().size()) as u64;
        let targets = match &self.targets {
            Some(Targets::Classes(t)) => (t.shape().num_elements() * t.dtype().size()) as u64,
            Some(Targets::Values(t)) => size(t),
            None => 0,
        };
        self.features.as_ref().map_or(0, size)
            + self.floats.iter().map(|(_, t)| size(t)).sum::<u64>()
            + targets
    }
}

/// Each part's rows `rows[i]` (one tensor a part), in order, as one
/// tensor; `None` where a part has none.
fn select_rows<const D: usize, K: burn::tensor::kind::Basic>(
    parts: impl Iterator<Item = Option<Tensor<D, K>>>,
    rows: &[Tensor<1, Int>],
) -> Option<Tensor<D, K>> {
    let picked = parts
        .zip(rows)
        .map(|(t, at)| Some(t?.select(0, at.clone())))
        .collect::<Option<Vec<_>>>()?;
    Some(Tensor::cat(picked, 0))
}

/// Batches' inputs kept on the device, up to `budget` bytes, each known by its
/// column arrays (held weakly: a batch the cache spills or drops is not kept
/// alive by this, and its entry goes).
#[derive(Debug, Default)]
struct Kept {
    budget: u64,
    used: u64,
    batches: Vec<(Key, Staged, u64)>,
    /// Bytes of staged batches not kept for want of room, since last asked.
    passed_over: u64,
    /// Device bytes per row of the last cached batch kept whole.
    bytes_per_row: Option<f64>,
}

/// What a kept batch's inputs belong to, held weakly.
#[derive(Debug)]
enum Key {
    /// A batch passed as it is: its column arrays.
    Columns(Vec<Weak<dyn Array>>),
    /// A shard's cached batch, kept whole.
    Cached(Weak<CachedBatch>),
}

impl Key {
    fn alive(&self) -> bool {
        match self {
            Key::Columns(cols) => cols.iter().all(|w| w.strong_count() > 0),
            Key::Cached(c) => c.strong_count() > 0,
        }
    }
}

impl Kept {
    fn find(&mut self, batch: &RecordBatch) -> Option<Staged> {
        self.forget_dropped();
        self.batches
            .iter()
            .find(|(key, ..)| match key {
                Key::Columns(cols) => {
                    cols.len() == batch.num_columns()
                        && cols
                            .iter()
                            .zip(batch.columns())
                            .all(|(w, c)| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(c)))
                }
                Key::Cached(_) => false,
            })
            .map(|(_, s, _)| s.clone())
    }

    /// The inputs kept for `cached` whole.
    fn cached(&self, cached: &Arc<CachedBatch>) -> Option<&Staged> {
        self.batches
            .iter()
            .find(|(key, ..)| matches!(key, Key::Cached(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(cached))))
            .map(|(_, s, _)| s)
    }

    /// The batch cut as `pieces`, gathered from the cached batches kept
    /// whole, or `None` unless every one of them is.
    fn gather(&mut self, pieces: &[Piece], device: &Device) -> Option<Staged> {
        self.forget_dropped();
        let parts = pieces
            .iter()
            .map(|p| Some((self.cached(&p.cached)?, p)))
            .collect::<Option<Vec<_>>>()?;
        (!parts.is_empty()).then(|| Staged::gather(&parts, device))
    }

    /// The cached batches of `pieces` not kept yet, once each, where they
    /// would fit whole (as far as the rows kept so far tell); else none.
    fn to_keep(&self, pieces: &[Piece]) -> Vec<Arc<CachedBatch>> {
        if self.budget == 0 {
            return Vec::new();
        }
        let mut missing: Vec<Arc<CachedBatch>> = Vec::new();
        for p in pieces {
            if self.cached(&p.cached).is_none() && !missing.iter().any(|c| Arc::ptr_eq(c, &p.cached)) {
                missing.push(p.cached.clone());
            }
        }
        let rows: usize = missing.iter().map(|c| c.rows()).sum();
        let need = self.bytes_per_row.map_or(0, |b| (b * rows as f64) as u64);
        match self.used.saturating_add(need) <= self.budget {
            true => missing,
            false => Vec::new(),
        }
    }

    /// Keeps `staged` for `batch` if it fits in what is left of the budget.
    fn keep(&mut self, batch: &RecordBatch, staged: &Staged) {
        let cols = batch.columns().iter().map(Arc::downgrade).collect();
        self.keep_as(Key::Columns(cols), staged);
    }

    /// Keeps `staged`, the inputs of `cached` whole, if they fit.
    fn keep_cached(&mut self, cached: &Arc<CachedBatch>, staged: &Staged) {
        if cached.rows() > 0 {
            self.bytes_per_row = Some(staged.bytes() as f64 / cached.rows() as f64);
        }
        self.keep_as(Key::Cached(Arc::downgrade(cached)), staged);
    }

    fn keep_as(&mut self, key: Key, staged: &Staged) {
        let bytes = staged.bytes();
        if self.used.saturating_add(bytes) > self.budget {
            self.passed_over += bytes;
            return;
        }
        self.used += bytes;
        self.batches.push((key, staged.clone(), bytes));
    }

    fn forget_dropped(&mut self) {
        let used = &mut self.used;
        self.batches.retain(|(key, _, bytes)| {
            let alive = key.alive();
            if !alive {
                *used -= bytes;
            }
            alive
        });
    }
}

/// Where some of a training batch's rows come from: `len` rows from
/// `start` of a shard's cached batch as the cursor read it (its rows in
/// `order`, a permutation, or as stored).
#[derive(Debug, Clone)]
pub struct Piece {
    cached: Arc<CachedBatch>,
    order: Option<ScalarBuffer<u32>>,
    start: usize,
    len: usize,
}

impl Piece {
    /// None of `cached`'s rows yet, read in `order` (as stored if `None`).
    pub fn of(cached: Arc<CachedBatch>, order: Option<ScalarBuffer<u32>>) -> Piece {
        Piece {
            cached,
            order,
            start: 0,
            len: 0,
        }
    }

    /// `len` rows from `start` of the same cached batch, as read.
    pub fn rows(&self, start: usize, len: usize) -> Piece {
        Piece {
            start,
            len,
            ..self.clone()
        }
    }

    /// Its rows' places in the cached batch as stored.
    fn indices(&self) -> Vec<i64> {
        let range = self.start..self.start + self.len;
        match &self.order {
            Some(order) => order[range].iter().map(|&i| i64::from(i)).collect(),
            None => range.map(|i| i as i64).collect(),
        }
    }
}

/// The batch a step stages while it runs: one passed as it is, or one cut
/// from a shard's cached batches (with its rows' [`Piece`]s).
#[derive(Debug, Clone, Copy)]
pub enum Next<'a> {
    /// A batch as it is.
    Batch(&'a RecordBatch),
    /// A training batch and the pieces it was cut from.
    Cut(&'a RecordBatch, &'a [Piece]),
}

impl<'a> From<&'a RecordBatch> for Next<'a> {
    fn from(batch: &'a RecordBatch) -> Self {
        Next::Batch(batch)
    }
}

impl Next<'_> {
    fn batch(&self) -> &RecordBatch {
        match self {
            Next::Batch(b) | Next::Cut(b, _) => b,
        }
    }
}

/// A step's gradients with the next batch staged meanwhile. Stages only when
/// built `staging` (the trainer stages on a GPU, where a batch's upload and
/// the device's work can overlap; on the CPU the thread would cost more than
/// it hides for small steps).
#[derive(Debug, Default)]
pub struct Pipeline {
    staging: bool,
    asked: Asked,
    /// The batch staged last step (its columns, to recognise it) and its inputs.
    ahead: Option<(RecordBatch, Staged)>,
    kept: Kept,
}

impl Pipeline {
    /// A pipeline that stages the next batch when `staging`.
    pub fn new(staging: bool) -> Self {
        Pipeline {
            staging,
            ..Pipeline::default()
        }
    }

    /// The pipeline, also keeping up to `bytes` of staged batches' inputs on
    /// the device for the next epochs (a GPU's trainer).
    pub fn keeping(mut self, bytes: u64) -> Self {
        self.kept.budget = bytes;
        self
    }

    /// Bytes of batches' inputs kept on the device.
    pub fn kept_bytes(&self) -> u64 {
        self.kept.used
    }

    /// Device bytes it may keep batches' inputs in.
    pub fn kept_budget(&self) -> u64 {
        self.kept.budget
    }

    /// Bytes of batches' inputs staged but not kept for want of room since
    /// the last call: each epoch uploads them again.
    pub fn take_passed_over(&mut self) -> u64 {
        std::mem::take(&mut self.kept.passed_over)
    }

    /// `model`'s gradients for `records` ([`AnyModel::gradients`]); while they
    /// are computed, `next` (the batch the caller will pass next) has the
    /// inputs the model read this step converted and queued to the device.
    pub fn gradients<'n>(
        &mut self,
        model: &dyn AnyModel,
        records: &RecordBatch,
        next: Option<impl Into<Next<'n>>>,
        layout: &FeatureLayout,
        spec: &JobSpec,
        device: &Device,
    ) -> Result<Vec<f32>, StepError> {
        self.run(records, next, layout, spec, device, |batch| {
            model.gradients(batch)
        })
    }

    /// `step` (a model's gradients, on the host or kept on the device) on
    /// `records`, with `next`'s inputs staged meanwhile as
    /// [`gradients`](Self::gradients) does.
    pub fn run<'n, T>(
        &mut self,
        records: &RecordBatch,
        next: Option<impl Into<Next<'n>>>,
        layout: &FeatureLayout,
        spec: &JobSpec,
        device: &Device,
        step: impl FnOnce(&Batch<'_>) -> Result<T, StepError>,
    ) -> Result<T, StepError> {
        let staged = self
            .ahead
            .take()
            .filter(|(b, _)| same_batch(b, records))
            .map(|(_, s)| s);
        let log = AskLog::default();
        let batch = Batch::new(records, layout, spec, device).with_staged(staged.as_ref(), &log);
        let next: Option<Next<'n>> = next.map(Into::into).filter(|_| self.staging && self.asked.any());
        // A batch kept from an earlier epoch, or cut from cached batches kept
        // whole, needs no staging.
        let kept_next = next.and_then(|n| {
            let staged = match n {
                Next::Batch(b) => self.kept.find(b),
                Next::Cut(_, pieces) => self.kept.gather(pieces, device),
            }?;
            Some((n.batch().clone(), staged))
        });
        let next = next.filter(|_| kept_next.is_none());
        // A cut batch's cached batches not kept yet are staged whole to keep,
        // where they fit.
        let wholes = match next {
            Some(Next::Cut(_, pieces)) => self.kept.to_keep(pieces),
            _ => Vec::new(),
        };
        let asked = &self.asked;
        let (result, ahead) = std::thread::scope(|scope| {
            let stager = next.map(|n| {
                let wholes = &wholes;
                scope.spawn(move || stage(n, wholes, asked, (layout, spec, device)))
            });
            let result = step(&batch);
            (result, stager.and_then(|h| h.join().ok()))
        });
        self.asked = log.take();
        self.ahead = match (ahead, next) {
            (Some(Stage::Batch(staged)), Some(n)) => {
                match n {
                    Next::Batch(b) => self.kept.keep(b, &staged),
                    Next::Cut(..) => self.kept.passed_over += staged.bytes(),
                }
                Some((n.batch().clone(), *staged))
            }
            (Some(Stage::Wholes(made)), Some(Next::Cut(b, pieces))) => {
                for (cached, staged) in wholes.iter().zip(&made) {
                    self.kept.keep_cached(cached, staged);
                }
                // Whole ones that did not fit after all: the step converts it.
                self.kept.gather(pieces, device).map(|s| (b.clone(), s))
            }
            _ => kept_next,
        };
        result
    }
}

/// What the stager thread made for the next batch.
enum Stage {
    /// Its inputs.
    Batch(Box<Staged>),
    /// The inputs of the cached batches it was cut from, whole.
    Wholes(Vec<Staged>),
}

/// Stages `next`: the cached batches in `wholes` whole where there are
/// any (and each reads), else the batch itself.
fn stage(
    next: Next<'_>,
    wholes: &[Arc<CachedBatch>],
    asked: &Asked,
    (layout, spec, device): (&FeatureLayout, &JobSpec, &Device),
) -> Stage {
    if !wholes.is_empty() {
        let made = wholes
            .iter()
            .map(|c| {
                let whole = c.load().ok()?;
                Some(Staged::make(&Batch::new(&whole, layout, spec, device), asked))
            })
            .collect::<Option<Vec<_>>>();
        if let Some(made) = made {
            return Stage::Wholes(made);
        }
    }
    let batch = Batch::new(next.batch(), layout, spec, device);
    Stage::Batch(Box::new(Staged::make(&batch, asked)))
}

/// Whether `a` and `b` are the same batch (the same column arrays).
fn same_batch(a: &RecordBatch, b: &RecordBatch) -> bool {
    a.num_rows() == b.num_rows()
        && a.num_columns() == b.num_columns()
        && a.columns()
            .iter()
            .zip(b.columns())
            .all(|(x, y)| std::sync::Arc::ptr_eq(x, y))
}

#[cfg(test)]
mod tests;
