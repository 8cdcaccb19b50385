use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use kindling_schemas::schema::{FeatureLayout, StreamKind, validate};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};

use super::WeightsFileError;
use crate::models::kindling_model::{AnyModel, ModelRegistry};

/// A classifier of 3 classes over one feature `x` of `width` floats.
fn built(model: ModelSpec, width: i32, seed: u64) -> Box<dyn AnyModel> {
    let spec = JobSpec::builder()
        .task(Task::Classification { num_classes: 3 })
        .model(model)
        .optimizer(OptimizerSpec::adam(0.01))
        .features(["x"])
        .label("y")
        .build()
        .expect("spec");
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema = Schema::new(vec![
        Field::new("x", DataType::FixedSizeList(item, width), false),
        Field::new("y", DataType::Int32, false),
    ]);
    let layout: FeatureLayout = validate(&schema, &spec, StreamKind::Train).expect("layout");
    ModelRegistry::builtin()
        .build_seeded(&spec, &layout, seed)
        .expect("model")
}

fn cnn() -> ModelSpec {
    ModelSpec::Cnn {
        channels: 1,
        height: 8,
        width: 8,
        conv: vec![4],
        dense: 6,
    }
}

fn saved(model: &dyn AnyModel, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("model.safetensors");
    model.save_safetensors(&path, &BTreeMap::new()).expect("save");
    path
}

#[test]
fn tensors_carry_pytorch_names_and_layouts() {
    let linear = built(ModelSpec::Linear, 5, 1);
    assert_eq!(
        linear.pytorch_tensors(),
        [
            ("dense.0.weight".to_owned(), vec![3, 5]),
            ("dense.0.bias".to_owned(), vec![3])
        ]
    );
    let names: Vec<(String, Vec<usize>)> = built(cnn(), 64, 1).pytorch_tensors();
    assert_eq!(
        names,
        [
            ("convs.0.weight".to_owned(), vec![4, 1, 3, 3]),
            ("convs.0.bias".to_owned(), vec![4]),
            ("dense.0.weight".to_owned(), vec![6, 64]),
            ("dense.0.bias".to_owned(), vec![6]),
            ("dense.1.weight".to_owned(), vec![3, 6]),
            ("dense.1.bias".to_owned(), vec![3]),
        ]
    );
}

#[test]
fn saved_weights_load_back_bit_for_bit() {
    let dir = tempfile::tempdir().expect("dir");
    for spec in [ModelSpec::Linear, ModelSpec::Mlp { hidden: vec![7] }, cnn()] {
        let width = if matches!(spec, ModelSpec::Cnn { .. }) {
            64
        } else {
            5
        };
        let trained = built(spec.clone(), width, 1);
        let path = saved(trained.as_ref(), &dir);
        let other = built(spec, width, 2);
        assert_ne!(
            other.flat_weights(),
            trained.flat_weights(),
            "another seed, other weights"
        );
        let loaded = other.load_weights(&path).expect("load");
        let (want, got) = (trained.flat_weights(), loaded.flat_weights());
        assert!(
            want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()) && want.len() == got.len(),
            "the weights come back bit for bit"
        );
    }
}

#[test]
fn a_file_that_does_not_fit_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().expect("dir");
    let path = saved(built(ModelSpec::Mlp { hidden: vec![7] }, 5, 1).as_ref(), &dir);
    // Another hidden width: the first layer's weight is the first misfit.
    let err = built(ModelSpec::Mlp { hidden: vec![8] }, 5, 1)
        .load_weights(&path)
        .expect_err("wrong shape");
    assert!(
        matches!(&err, WeightsFileError::Shape { tensor, expected, found, .. }
            if tensor == "dense.0.weight" && *expected == [8, 5] && *found == [7, 5]),
        "{err}"
    );
    // Two hidden layers, the first two as the file's: the third is missing.
    let deeper = built(ModelSpec::Mlp { hidden: vec![7, 3] }, 5, 1);
    let err = deeper.load_weights(&path).expect_err("missing");
    assert!(
        matches!(&err, WeightsFileError::Missing { tensor, .. } if tensor == "dense.2.weight"),
        "{err}"
    );
    // An MLP 5→3→3 into a linear 5→3: its first layer fits, the second is extra.
    let two = dir.path().join("two.safetensors");
    built(ModelSpec::Mlp { hidden: vec![3] }, 5, 1)
        .save_safetensors(&two, &BTreeMap::new())
        .expect("save");
    let err = built(ModelSpec::Linear, 5, 1)
        .load_weights(&two)
        .expect_err("extra");
    assert!(
        matches!(&err, WeightsFileError::Extra { tensor, .. } if tensor == "dense.1.bias"),
        "{err}"
    );
}

#[test]
fn a_truncated_file_or_another_format_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let path = saved(built(ModelSpec::Linear, 5, 1).as_ref(), &dir);
    let bytes = std::fs::read(&path).expect("read");
    std::fs::write(&path, &bytes[..bytes.len() - 4]).expect("truncate");
    let err = built(ModelSpec::Linear, 5, 1)
        .load_weights(&path)
        .expect_err("truncated");
    assert!(
        matches!(&err, WeightsFileError::Read { path: p, .. } if *p == path),
        "{err}"
    );
    let bin = dir.path().join("model.bin");
    let err = built(ModelSpec::Linear, 5, 1)
        .load_weights(&bin)
        .expect_err("bin");
    assert!(matches!(err, WeightsFileError::Format { .. }), "{err}");
    // A `.pt` is read as PyTorch's: a safetensors file under that name is not one.
    let pt = dir.path().join("model.pt");
    std::fs::copy(saved(built(ModelSpec::Linear, 5, 1).as_ref(), &dir), &pt).expect("copy");
    let err = built(ModelSpec::Linear, 5, 1).load_weights(&pt).expect_err("pt");
    assert!(
        matches!(&err, WeightsFileError::Read { format: "PyTorch", path: p, .. } if *p == pt),
        "{err}"
    );
}
