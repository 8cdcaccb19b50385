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
/// budget bounds what is kept, a batch staged without room is counted
/// each time, and a batch dropped by its owner is forgotten.
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
    assert_eq!(
        pipeline.take_passed_over(),
        2 * one,
        "batch 1, staged in the later epochs, found no room"
    );

    // Room for one batch: what is staged and not kept is counted, each
    // epoch it is staged again.
    let batches: Vec<RecordBatch> = (0..4).map(batch).collect();
    let mut pipeline = Pipeline::new(true).keeping(one + one / 2);
    assert_eq!(pipeline.kept_budget(), one + one / 2);
    let mut passed_over = Vec::new();
    for _ in 0..2 {
        for (i, b) in batches.iter().enumerate() {
            pipeline
                .gradients(model.as_ref(), b, batches.get(i + 1), &layout, &spec, &device)
                .expect("gradients");
        }
        passed_over.push(pipeline.take_passed_over());
    }
    // The first epoch stages batches 2 (kept) and 3; the second also
    // batch 1, once the step knows what the model reads.
    assert_eq!(passed_over, [one, 2 * one]);
    assert_eq!(pipeline.kept_bytes(), one);
}

/// Training batches cut from a shard's cached batches (their rows
/// permuted, one batch spanning two) are gathered on the device from the
/// cached batches kept whole: the same inputs, row for row, and the same
/// gradients as each batch converted itself. Without room for them, each
/// batch is staged as it is and counted as passed over.
#[test]
fn batches_cut_from_cached_batches_kept_whole_are_gathered_row_for_row() {
    use super::{Next, Piece};
    use crate::cache::{MemoryBudget, ShardCache};
    let (spec, device, layout, model) = setup();
    let direct = |b: &RecordBatch| {
        model
            .gradients(&Batch::new(b, &layout, &spec, &device))
            .expect("gradients")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cache = ShardCache::new(dir.path().join("s"), MemoryBudget::new(1 << 20));
    for k in 0..2 {
        cache.append(1, batch(k)).expect("append");
    }
    cache.commit(1);
    let cached = cache.snapshot();
    let order =
        arrow::buffer::ScalarBuffer::from(vec![3u32, 14, 0, 9, 12, 5, 1, 15, 7, 2, 11, 4, 13, 8, 10, 6]);
    let read = |c: usize| {
        let rows = arrow::array::UInt32Array::new(order.clone(), None);
        let whole = cached[c].load().expect("load");
        arrow::compute::take_record_batch(&whole, &rows).expect("permute")
    };
    let piece = |c: usize, start, len| Piece::of(cached[c].clone(), Some(order.clone())).rows(start, len);
    let (first, second) = (read(0), read(1));
    let spanning = arrow::compute::concat_batches(&first.schema(), &[first.slice(8, 8), second.slice(0, 4)])
        .expect("concat");
    let batches = [
        (first.slice(0, 8), vec![piece(0, 0, 8)]),
        (spanning, vec![piece(0, 8, 8), piece(1, 0, 4)]),
        (second.slice(4, 12), vec![piece(1, 4, 12)]),
    ];
    let asked = Asked {
        features: true,
        targets: true,
        ..Asked::default()
    };
    let whole = super::Staged::make(&Batch::new(&first, &layout, &spec, &device), &asked).bytes();
    for (budget, kept) in [(u64::MAX, 2 * whole), (1, 0)] {
        let mut pipeline = Pipeline::new(true).keeping(budget);
        for epoch in 0..2 {
            for (i, (b, _)) in batches.iter().enumerate() {
                let next = batches.get(i + 1).map(|(n, pieces)| Next::Cut(n, pieces));
                let got = pipeline
                    .gradients(model.as_ref(), b, next, &layout, &spec, &device)
                    .expect("gradients");
                assert_eq!(got, direct(b), "budget {budget}, epoch {epoch}, step {i}");
                // Staged ahead: not before the model asked for inputs, nor
                // after the last batch, nor where the first cached batch
                // staged whole (to learn its size) did not fit.
                let unstaged = (epoch, i) == (0, 0) || i == 2 || (budget, epoch, i) == (1, 0, 1);
                assert_eq!(
                    pipeline.ahead.is_some(),
                    !unstaged,
                    "budget {budget}, epoch {epoch}, step {i}"
                );
            }
        }
        assert_eq!(pipeline.kept_bytes(), kept, "budget {budget}");
        if kept == 0 {
            assert!(pipeline.take_passed_over() > 0, "nothing fit, and it was said");
            continue;
        }
        assert_eq!(pipeline.take_passed_over(), 0);
        for (b, pieces) in &batches {
            let gathered = pipeline
                .kept
                .gather(pieces, &device)
                .expect("every cached batch kept");
            let made = Batch::new(b, &layout, &spec, &device);
            let data = |t: Option<burn::tensor::Tensor<2>>| t.expect("input").into_data();
            assert_eq!(data(gathered.features), data(made.features().ok()));
            let Some(crate::models::tensorize::Targets::Classes(got)) = gathered.targets else {
                panic!("class targets")
            };
            let Ok(crate::models::tensorize::Targets::Classes(want)) = made.targets() else {
                panic!("class targets")
            };
            assert_eq!(got.into_data(), want.into_data());
        }
    }
}
