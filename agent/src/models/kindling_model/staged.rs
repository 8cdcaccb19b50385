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

use std::sync::{Arc, Mutex, Weak};

use arrow::array::Array;

use arrow::array::RecordBatch;
use burn::tensor::{Device, Tensor};
use kindling_schemas::schema::FeatureLayout;
use kindling_schemas::spec::JobSpec;

use super::{AnyModel, Batch, StepError};
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

/// Batches' inputs kept on the device, up to `budget` bytes, each known by its
/// column arrays (held weakly: a batch the cache spills or drops is not kept
/// alive by this, and its entry goes).
#[derive(Debug, Default)]
struct Kept {
    budget: u64,
    used: u64,
    batches: Vec<(Columns, Staged, u64)>,
}

/// A kept batch's column arrays, held weakly.
type Columns = Vec<Weak<dyn Array>>;

impl Kept {
    fn find(&mut self, batch: &RecordBatch) -> Option<Staged> {
        self.forget_dropped();
        self.batches
            .iter()
            .find(|(cols, ..)| {
                cols.len() == batch.num_columns()
                    && cols
                        .iter()
                        .zip(batch.columns())
                        .all(|(w, c)| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(c)))
            })
            .map(|(_, s, _)| s.clone())
    }

    /// Keeps `staged` for `batch` if it fits in what is left of the budget.
    fn keep(&mut self, batch: &RecordBatch, staged: &Staged) {
        let bytes = staged.bytes();
        if self.used + bytes > self.budget {
            return;
        }
        self.used += bytes;
        let cols = batch.columns().iter().map(Arc::downgrade).collect();
        self.batches.push((cols, staged.clone(), bytes));
    }

    fn forget_dropped(&mut self) {
        let used = &mut self.used;
        self.batches.retain(|(cols, _, bytes)| {
            let alive = cols.iter().all(|w| w.strong_count() > 0);
            if !alive {
                *used -= bytes;
            }
            alive
        });
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

    /// `model`'s gradients for `records` ([`AnyModel::gradients`]); while they
    /// are computed, `next` (the batch the caller will pass next) has the
    /// inputs the model read this step converted and queued to the device.
    pub fn gradients(
        &mut self,
        model: &dyn AnyModel,
        records: &RecordBatch,
        next: Option<&RecordBatch>,
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
    pub fn run<T>(
        &mut self,
        records: &RecordBatch,
        next: Option<&RecordBatch>,
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
        let asked = &self.asked;
        let next = next.filter(|_| self.staging && asked.any());
        // A batch kept from an earlier epoch needs no staging.
        let kept_next = next.and_then(|n| Some((n.clone(), self.kept.find(n)?)));
        let next = next.filter(|_| kept_next.is_none());
        let (result, ahead) = std::thread::scope(|scope| {
            let stager = next.map(|n| {
                scope.spawn(move || {
                    (
                        n.clone(),
                        Staged::make(&Batch::new(n, layout, spec, device), asked),
                    )
                })
            });
            let result = step(&batch);
            (result, stager.and_then(|h| h.join().ok()))
        });
        self.asked = log.take();
        if let Some((batch, staged)) = &ahead {
            self.kept.keep(batch, staged);
        }
        self.ahead = ahead.or(kept_next);
        result
    }
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
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float32Array, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use burn::tensor::Device;
    use kindling_schemas::schema::{FeatureLayout, StreamKind, validate};
    use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};

    use super::{Asked, Pipeline};
    use crate::models::kindling_model::{AnyModel, Batch, ModelRegistry};

    fn spec() -> JobSpec {
        JobSpec::builder()
            .task(Task::Classification { num_classes: 3 })
            .model(ModelSpec::Mlp { hidden: vec![8] })
            .optimizer(OptimizerSpec::adam(0.01))
            .features(["a", "b"])
            .label("y")
            .build()
            .expect("spec")
    }

    /// Batch `k` of 16 rows (different values for each `k`).
    fn batch(k: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Float32, false),
            Field::new("b", DataType::Float32, false),
            Field::new("y", DataType::Int64, false),
        ]));
        let a = (0..16).map(|i| ((i * 7 + k * 3) % 11) as f32 / 11.0);
        let b = (0..16).map(|i| ((i * 5 + k) % 13) as f32 / 13.0 - 0.5);
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Float32Array::from_iter_values(a)),
                Arc::new(Float32Array::from_iter_values(b)),
                Arc::new(Int64Array::from_iter_values((0..16).map(|i| (i + k) % 3))),
            ],
        )
        .expect("batch")
    }

    /// The spec, the CPU device, the batches' layout and a model for them.
    fn setup() -> (JobSpec, Device, FeatureLayout, Box<dyn AnyModel>) {
        let spec = spec();
        let device = Device::default().autodiff();
        let layout = validate(&batch(0).schema(), &spec, StreamKind::Train).expect("layout");
        let model = ModelRegistry::builtin()
            .build(&spec, &layout, &device)
            .expect("model");
        (spec, device, layout, model)
    }

    #[test]
    fn staged_inputs_give_the_step_the_same_gradients_and_only_for_the_batch_they_were_made_for() {
        let (spec, device, layout, model) = setup();
        let batches: Vec<RecordBatch> = (0..4).map(batch).collect();
        let direct = |b: &RecordBatch| {
            model
                .gradients(&Batch::new(b, &layout, &spec, &device))
                .expect("gradients")
        };
        let mut pipeline = Pipeline::new(true);
        for (i, b) in batches.iter().enumerate() {
            // Step 3 is handed a batch other than the one staged for it (a copy of
            // batch 3 with its own arrays): the staged inputs must not be used.
            let b = if i == 3 { &batch(3) } else { b };
            let staged_for_this = pipeline.ahead.as_ref().map(|(s, _)| super::same_batch(s, b));
            let got = pipeline
                .gradients(model.as_ref(), b, batches.get(i + 1), &layout, &spec, &device)
                .expect("gradients");
            assert_eq!(got, direct(b), "step {i}: staged and direct gradients differ");
            match i {
                // What the model reads is known after its first step: the
                // second is not staged yet, the third is.
                0 | 1 => assert_eq!(staged_for_this, None),
                2 => assert_eq!(staged_for_this, Some(true), "step {i} was not staged"),
                _ => assert_eq!(staged_for_this, Some(false)),
            }
            if (1..3).contains(&i) {
                let (_, staged) = pipeline.ahead.as_ref().expect("the next batch staged");
                assert!(staged.features.is_some() && staged.targets.is_some());
                assert!(staged.floats.is_empty(), "the MLP reads features() only");
            }
        }
        assert!(pipeline.asked.features && pipeline.asked.targets);
        assert_eq!(pipeline.kept_bytes(), 0, "nothing kept without a budget");
        // Without staging (the CPU's trainer) nothing is made ahead.
        let mut plain = Pipeline::new(false);
        for (i, b) in batches.iter().enumerate() {
            let got = plain
                .gradients(model.as_ref(), b, batches.get(i + 1), &layout, &spec, &device)
                .expect("gradients");
            assert_eq!(got, direct(b));
            assert!(plain.ahead.is_none());
        }
    }

    /// With a budget, the batches staged in the first epoch are kept on the
    /// device and the next epochs use them, with the same gradients; the
    /// budget bounds what is kept, and a batch dropped by its owner is
    /// forgotten.
    #[test]
    fn batches_kept_on_the_device_serve_the_next_epochs_within_the_budget() {
        let (spec, device, layout, model) = setup();
        let direct = |b: &RecordBatch| {
            model
                .gradients(&Batch::new(b, &layout, &spec, &device))
                .expect("gradients")
        };
        let mut batches: Vec<RecordBatch> = (0..4).map(batch).collect();
        // One batch's inputs on the device (16 rows × 2 features and 16
        // labels): room for two batches.
        let asked = Asked {
            features: true,
            targets: true,
            ..Asked::default()
        };
        let one = super::Staged::make(&Batch::new(&batches[0], &layout, &spec, &device), &asked).bytes();
        assert!(one >= 16 * 2 * 4 + 16 * 4, "{one} bytes");
        let mut pipeline = Pipeline::new(true).keeping(2 * one + one / 2);
        for epoch in 0..3 {
            for (i, b) in batches.iter().enumerate() {
                let kept_before = pipeline.kept_bytes();
                let got = pipeline
                    .gradients(model.as_ref(), b, batches.get(i + 1), &layout, &spec, &device)
                    .expect("gradients");
                assert_eq!(got, direct(b), "epoch {epoch} step {i}");
                if epoch > 0 {
                    assert_eq!(
                        pipeline.kept_bytes(),
                        kept_before,
                        "kept once, in the first epoch"
                    );
                }
            }
            // Batches 2 and 3 were staged (the first two are made by the step).
            assert_eq!(pipeline.kept_bytes(), 2 * one, "epoch {epoch}: two batches kept");
        }
        // The next epoch's batch 2 comes from what was kept: the staged
        // inputs ahead are the kept ones.
        pipeline
            .gradients(
                model.as_ref(),
                &batches[1],
                Some(&batches[2]),
                &layout,
                &spec,
                &device,
            )
            .expect("gradients");
        let (ahead, _) = pipeline.ahead.as_ref().expect("ahead");
        assert!(super::same_batch(ahead, &batches[2]));
        // A batch its owner drops is forgotten.
        pipeline.ahead = None;
        assert!(
            pipeline.kept.find(&batches[1]).is_none(),
            "batch 1 was never kept"
        );
        assert_eq!(pipeline.kept_bytes(), 2 * one);
        batches.truncate(2);
        pipeline.kept.forget_dropped();
        assert_eq!(pipeline.kept_bytes(), 0, "batches 2 and 3 are gone");
    }
}
