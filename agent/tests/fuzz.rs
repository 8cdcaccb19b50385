//! Property and fuzz tests of what a peer's broadcast or a checkpoint gives
//! the agent to decode: a packed checkpoint (`checkpoint::unpack`, which
//! a resuming rank reads from rank 0's broadcast), the burn record of a
//! model's weights (`AnyModel::from_record_bytes`: the initial weights
//! rank 0 broadcasts, a checkpoint's model) and the optimizer's state
//! (`FlatOptimizer::load_bytes`). Each input is arbitrary or a valid
//! encoding with bytes flipped, cut or inserted; the property is that
//! decoding answers `Ok` or a precise `Err`, never panics, that what
//! decodes round-trips, and that a refused input changes nothing.
//!
//! CI runs 64 cases of each property (each builds a small model);
//! `PROPTEST_CASES=5000 cargo test -p kindling-agent --test fuzz` runs more.

use std::sync::OnceLock;

use arrow::datatypes::{DataType, Field, Schema};
use kindling_agent::ModelRegistry;
use kindling_agent::burn::tensor::Device;
use kindling_agent::models::kindling_model::AnyModel;
use kindling_agent::optim::FlatOptimizer;
use kindling_agent::training::checkpoint::{Checkpoint, CheckpointMeta, PartialEpoch, pack, unpack};
use kindling_fixtures::fuzz::{cases, edits, mutate};
use kindling_schemas::action::EpochMetrics;
use kindling_schemas::schema::{FeatureLayout, StreamKind, validate};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};
use proptest::prelude::*;

fn spec() -> JobSpec {
    JobSpec::builder()
        .model(ModelSpec::Mlp { hidden: vec![4] })
        .task(Task::Classification { num_classes: 3 })
        .optimizer(OptimizerSpec::adam(0.01))
        .features(["x1", "x2"])
        .label("y")
        .build()
        .expect("spec")
}

/// A fresh model of [`spec`] on the CPU (its weights whatever the RNG gives).
fn model() -> Box<dyn AnyModel> {
    static LAYOUT: OnceLock<FeatureLayout> = OnceLock::new();
    let layout = LAYOUT.get_or_init(|| {
        let schema = Schema::new(vec![
            Field::new("x1", DataType::Float64, false),
            Field::new("x2", DataType::Float32, false),
            Field::new("y", DataType::Int32, false),
        ]);
        validate(&schema, &spec(), StreamKind::Train).expect("layout")
    });
    ModelRegistry::builtin()
        .build(&spec(), layout, &Device::flex())
        .expect("model")
}

/// A model's weights as rank 0 broadcasts them.
fn record() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| model().to_record_bytes().expect("record"))
}

/// The optimizer state of [`model`]'s weights after a step.
fn optimizer() -> FlatOptimizer {
    let n = model().num_params();
    let mut opt = FlatOptimizer::new(&OptimizerSpec::adam(0.01), n);
    let mut weights = vec![0.5f32; n];
    let grads: Vec<f32> = (0..n).map(|i| i as f32 * 0.01 - 0.1).collect();
    opt.step(&mut weights, &grads, 1.0);
    opt
}

/// A checkpoint as rank 0 packs it for a resuming gang.
fn checkpoint(best: bool) -> Checkpoint {
    Checkpoint {
        meta: CheckpointMeta {
            epoch: 2,
            attempt: 3,
            rows_trained_per_epoch: vec![100, 100],
            history: vec![EpochMetrics {
                epoch: 1,
                train_loss: 0.7,
                rows: 100,
                eval_loss: Some(0.6),
                ..Default::default()
            }],
            best_epoch: best.then_some(1),
            // One taken inside an epoch too: 40 steps into epoch 3.
            step: if best { 0 } else { 40 },
            partial: (!best).then_some(PartialEpoch {
                loss_sum: 12.5,
                weight_total: 640.0,
                rows_total: 640.0,
                secs: 1.25,
                world: 2,
            }),
            files: Vec::new(),
        },
        weights: record().to_vec(),
        optimizer: optimizer().to_bytes(),
        best: best.then(|| record().to_vec()),
    }
}

/// Two checkpoints hold the same.
fn same(a: &Checkpoint, b: &Checkpoint) -> bool {
    a.meta == b.meta && a.weights == b.weights && a.optimizer == b.optimizer && a.best == b.best
}

proptest! {
    #![proptest_config(cases(64))]

    #[test]
    fn checkpoint_broadcasts_unpack_or_refuse(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        best in any::<bool>(),
        (e, cut, ins) in edits(),
    ) {
        let packed = pack(&checkpoint(best));
        prop_assert!(same(&unpack(&packed).expect("the unmutated one unpacks"), &checkpoint(best)));
        for bytes in [bytes, mutate(packed, &e, cut, ins)] {
            match unpack(&bytes) {
                // What unpacks packs and unpacks to itself.
                Ok(c) => prop_assert!(same(&unpack(&pack(&c)).expect("again"), &c)),
                // Which part is cut, or what in the metadata is wrong.
                Err(e) => {
                    let message = e.to_string();
                    prop_assert!(
                        message.starts_with("model record: truncated checkpoint broadcast: the ")
                            || message.starts_with("model record: checkpoint in a broadcast: "),
                        "{message}"
                    );
                }
            }
        }
    }

    #[test]
    fn model_records_load_or_refuse(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        (e, cut, ins) in edits(),
    ) {
        let original = model().from_record_bytes(record().to_vec()).expect("the unmutated record loads");
        prop_assert_eq!(original.to_record_bytes().expect("record"), record());
        for bytes in [bytes, mutate(record().to_vec(), &e, cut, ins)] {
            match model().from_record_bytes(bytes) {
                // What loads is a model of the job's shape, whose record loads again.
                Ok(loaded) => {
                    prop_assert_eq!(loaded.num_params(), original.num_params());
                    let again = loaded.to_record_bytes().expect("record");
                    let reloaded = model().from_record_bytes(again).expect("reloads");
                    let (a, b) = (loaded.flat_weights(), reloaded.flat_weights());
                    prop_assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "weights changed on a reload");
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }

    #[test]
    fn optimizer_states_load_exactly_or_change_nothing(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        (e, cut, ins) in edits(),
    ) {
        let state = optimizer().to_bytes();
        for bytes in [bytes, mutate(state.clone(), &e, cut, ins)] {
            let mut opt = optimizer();
            match opt.load_bytes(&bytes) {
                Ok(()) => prop_assert_eq!(opt.to_bytes(), bytes),
                Err(e) => {
                    prop_assert!(e.to_string().contains("optimizer state"), "{e}");
                    prop_assert_eq!(opt.to_bytes(), state.clone(), "a refused state changed the optimizer");
                }
            }
        }
    }
}
