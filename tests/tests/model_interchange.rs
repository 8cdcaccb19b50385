//! Models out and in through the readers users have: an exported model's
//! safetensors file run in numpy (the `safetensors` package) and its ONNX
//! graph run in onnxruntime (checked by `onnx.checker`) give Kindling's
//! predictions; a state dict written by numpy starts a job through
//! `init_from`; export then re-import predicts bit for bit the same; bad
//! files are refused naming the file or the tensor, with nothing trained.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::{Array, AsArray, FixedSizeListArray, Float32Array, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float32Type, Schema};
use futures::FutureExt;
use kindling::job::{
    ExportFormat, JobError, ONNX_FILE, ONNX_OPSET, ProgressMode, TrainedModel, TrainingJob,
    TrainingJobBuilder,
};
use kindling::spark::RecordBatchStream;
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};
use serde_json::json;

use crate::python_common::run_script;

/// `rows` rows: `x0`, `x1` and a vector `v` of `width` floats; label
/// `y` = a class of 3 from the features (or their sum, for regression).
fn data(rows: usize, width: i32, regression: bool) -> RecordBatch {
    let value = |i: usize, k: usize| ((i * 7919 + k * 104_729) % 2000) as f32 / 1000.0 - 1.0;
    let x0: Vec<f32> = (0..rows).map(|i| value(i, 0)).collect();
    let x1: Vec<f32> = (0..rows).map(|i| value(i, 1)).collect();
    let v: Vec<f32> = (0..rows)
        .flat_map(|i| (0..width as usize).map(move |k| value(i, k + 2)))
        .collect();
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let vectors = FixedSizeListArray::new(item.clone(), width, Arc::new(Float32Array::from(v)), None);
    let (label_type, label): (DataType, Arc<dyn Array>) = match regression {
        true => (
            DataType::Float32,
            Arc::new(Float32Array::from_iter_values(
                x0.iter().zip(&x1).map(|(a, b)| 2.0 * a - b),
            )),
        ),
        false => (
            DataType::Int32,
            Arc::new(Int32Array::from_iter_values(
                x0.iter()
                    .zip(&x1)
                    .map(|(a, b)| i32::from(*a > 0.0) + i32::from(*b > 0.0)),
            )),
        ),
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("x0", DataType::Float32, false),
        Field::new("x1", DataType::Float32, false),
        Field::new("v", DataType::FixedSizeList(item, width), false),
        Field::new("y", label_type, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Float32Array::from(x0)),
            Arc::new(Float32Array::from(x1)),
            Arc::new(vectors),
            label,
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn builder(model: ModelSpec, regression: bool) -> TrainingJobBuilder {
    featuring(model, regression, &["x0", "x1", "v"])
}

fn featuring(model: ModelSpec, regression: bool, features: &[&str]) -> TrainingJobBuilder {
    let task = match regression {
        true => Task::Regression,
        false => Task::Classification { num_classes: 3 },
    };
    TrainingJob::builder()
        .model(model)
        .task(task)
        .optimizer(OptimizerSpec::adam(0.01))
        .features(features.iter().copied())
        .label("y")
        .epochs(2)
        .batch_size(64)
        .num_slots(1)
        .local_mode(true)
        .progress(ProgressMode::Silent)
}

/// Trains `job` on `batch`; counts the times its rows were opened in `opened`.
async fn fit(job: TrainingJob, batch: &RecordBatch, opened: &AtomicUsize) -> Result<TrainedModel, JobError> {
    let batch = batch.clone();
    job.fit_arrow(batch.schema(), || {
        opened.fetch_add(1, Ordering::SeqCst);
        let batch = batch.clone();
        async move {
            let rows: RecordBatchStream = Box::pin(futures::stream::iter([Ok(batch)]));
            Ok(rows)
        }
        .boxed()
    })
    .await
}

/// Each row's `features` concatenated in spec order.
fn feature_rows(batch: &RecordBatch, features: &[&str]) -> Vec<Vec<f32>> {
    (0..batch.num_rows())
        .map(|i| {
            let mut row = Vec::new();
            for name in features {
                let column = batch
                    .column_by_name(name)
                    .unwrap_or_else(|| panic!("no column {name}"));
                match column.as_fixed_size_list_opt() {
                    Some(v) => row.extend(v.value(i).as_primitive::<Float32Type>().values().iter()),
                    None => row.push(column.as_primitive::<Float32Type>().value(i)),
                }
            }
            row
        })
        .collect()
}

/// Kindling's probabilities (classification) or values (regression), per row.
fn outputs(model: &TrainedModel, batch: &RecordBatch) -> Vec<Vec<f32>> {
    let predicted = model
        .predict_batch(batch)
        .unwrap_or_else(|e| panic!("predict: {e}"));
    match predicted.column_by_name("probabilities") {
        Some(p) => {
            let p = p.as_list::<i32>();
            (0..p.len())
                .map(|i| p.value(i).as_primitive::<Float32Type>().values().to_vec())
                .collect()
        }
        None => {
            let values = predicted
                .column_by_name("prediction")
                .unwrap_or_else(|| panic!("no prediction"))
                .as_primitive::<Float32Type>();
            values.values().iter().map(|v| vec![*v]).collect()
        }
    }
}

#[tokio::test]
async fn exported_safetensors_and_onnx_predict_in_numpy_and_onnxruntime_as_in_kindling()
-> Result<(), JobError> {
    let cnn = ModelSpec::Cnn {
        channels: 1,
        height: 4,
        width: 4,
        conv: vec![3],
        dense: 8,
    };
    let (all, image) = (&["x0", "x1", "v"][..], &["v"][..]);
    let cases = [
        ("linear", ModelSpec::Linear, 3, true, all),
        ("mlp", ModelSpec::Mlp { hidden: vec![8, 6] }, 3, false, all),
        ("cnn", cnn, 16, false, image),
    ];
    let dir = tempfile::tempdir().map_err(|e| JobError::Io {
        context: "tempdir".into(),
        source: e,
    })?;
    for (name, model, width, regression, features) in cases {
        // The CNN reads v as one 1×4×4 image.
        let rows = data(600, width, regression);
        // Only the spec's columns: the CNN's batches carry `v` and `y`.
        let rows = match features.len() {
            1 => rows.project(&[2, 3]).unwrap_or_else(|e| panic!("{e}")),
            _ => rows,
        };
        let job = featuring(model, regression, features).build()?;
        let trained = fit(job, &rows, &AtomicUsize::new(0)).await?;
        let out = dir.path().join(name);
        trained.export(&out, ExportFormat::Safetensors)?;
        let sample = rows.slice(0, 32);
        let expected = outputs(&trained, &sample);
        let checked = run_script(
            "safetensors_check.py",
            &json!({"mode": "forward", "dir": out, "rows": feature_rows(&sample, features), "expected": expected}),
        )
        .await;
        let diff = checked["max_diff"].as_f64().unwrap_or(f64::MAX);
        assert!(
            diff <= 1e-5,
            "{name}: numpy differs from Kindling by {diff}: {checked}"
        );
        assert_eq!(checked["dtypes"], json!(["float32"]), "{name}");
        assert_eq!(checked["features"], json!(features), "{name}");
        assert_eq!(checked["header_has_description"], json!(true), "{name}");
        // The ONNX graph in onnxruntime, one input per column.
        trained.export(&out, ExportFormat::Onnx)?;
        let columns: serde_json::Map<String, serde_json::Value> = features
            .iter()
            .map(|f| (f.to_string(), json!(feature_rows(&sample, &[f]))))
            .collect();
        let ran = run_script(
            "onnx_check.py",
            &json!({"path": out.join(ONNX_FILE), "inputs": columns, "expected": expected}),
        )
        .await;
        let diff = ran["max_diff"].as_f64().unwrap_or(f64::MAX);
        assert!(
            diff <= 1e-5,
            "{name}: onnxruntime differs from Kindling by {diff}: {ran}"
        );
        assert_eq!(ran["inputs"], json!(features), "{name}");
        let output = if regression { "values" } else { "probabilities" };
        assert_eq!(ran["outputs"], json!([output]), "{name}");
        assert_eq!(ran["opset"], json!([ONNX_OPSET]), "{name}");
        if name == "mlp" {
            // PyTorch's Linear layout: weight [out, in].
            assert_eq!(checked["tensors"]["dense.0.weight"], json!([8, 2 + width]));
            assert_eq!(checked["tensors"]["dense.2.weight"], json!([3, 6]));
        }
    }
    Ok(())
}

/// The names and shapes of an MLP 5 → 4 → 3's state dict (PyTorch's layout).
fn mlp_state_dict() -> serde_json::Value {
    json!({"dense.0.weight": [4, 5], "dense.0.bias": [4], "dense.1.weight": [3, 4], "dense.1.bias": [3]})
}

/// A job that starts from `path` and trains one epoch at a learning rate
/// too small to move any weight of the file's (all of them are at least
/// 0.05 from zero): its model holds the file's weights bit for bit.
fn unmoved(path: &std::path::Path) -> Result<TrainingJob, JobError> {
    builder(ModelSpec::Mlp { hidden: vec![4] }, false)
        .optimizer(OptimizerSpec::sgd(1e-30))
        .epochs(1)
        .init_from(path)
        .build()
}

#[tokio::test]
async fn a_state_dict_written_by_numpy_starts_the_job_and_comes_back_bit_for_bit() -> Result<(), JobError> {
    let dir = tempfile::tempdir().map_err(|e| JobError::Io {
        context: "tempdir".into(),
        source: e,
    })?;
    let file = dir.path().join("pretrained.safetensors");
    run_script(
        "safetensors_check.py",
        &json!({"mode": "write", "path": file, "tensors": mlp_state_dict(), "seed": 7}),
    )
    .await;
    let rows = data(300, 3, false);
    let job = unmoved(&file)?;
    let recorded = job
        .spec()
        .init_from
        .clone()
        .unwrap_or_else(|| panic!("no init_from in the spec"));
    assert_eq!(recorded.format, "safetensors");
    assert_eq!(recorded.sha256.len(), 64);
    let tuned = fit(job, &rows, &AtomicUsize::new(0)).await?;
    assert_eq!(
        tuned.spec().init_from.as_ref(),
        Some(&recorded),
        "the model's spec records the file"
    );
    let out = dir.path().join("out");
    tuned.export(&out, ExportFormat::Safetensors)?;
    let compared = run_script(
        "safetensors_check.py",
        &json!({"mode": "compare", "a": file, "b": out.join("model.safetensors")}),
    )
    .await;
    assert_eq!(compared["same"], json!(true), "{compared}");

    // A model exported and imported again predicts bit for bit the same.
    let again = fit(
        unmoved(&out.join("model.safetensors"))?,
        &rows,
        &AtomicUsize::new(0),
    )
    .await?;
    let sample = rows.slice(0, 64);
    let bits = |m: &TrainedModel| -> Vec<Vec<u32>> {
        outputs(m, &sample)
            .into_iter()
            .map(|r| r.into_iter().map(f32::to_bits).collect())
            .collect()
    };
    assert_eq!(bits(&again), bits(&tuned));
    Ok(())
}

#[tokio::test]
async fn a_weights_file_that_does_not_fit_is_refused_and_nothing_trains() -> Result<(), JobError> {
    let dir = tempfile::tempdir().map_err(|e| JobError::Io {
        context: "tempdir".into(),
        source: e,
    })?;
    let rows = data(100, 3, false);
    let cases = [
        ("truncated", "not a readable safetensors file"),
        (
            "f64",
            "tensor `dense.0.weight` is F64; the model's weights are F32",
        ),
        (
            "renamed",
            "tensor `dense.0.weight` of the model is missing from the file",
        ),
        (
            "shape",
            "tensor `dense.0.weight` has shape [8, 5]; the model's is [4, 5]",
        ),
    ];
    for (bad, says) in cases {
        let file = dir.path().join(format!("{bad}.safetensors"));
        run_script(
            "safetensors_check.py",
            &json!({
                "mode": "write", "path": file, "tensors": mlp_state_dict(), "seed": 1,
                "bad": bad, "spoil": "dense.0.weight"
            }),
        )
        .await;
        let opened = AtomicUsize::new(0);
        let err = match fit(unmoved(&file)?, &rows, &opened).await {
            Ok(_) => panic!("{bad}: trained from a bad file"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(says), "{bad}: {err}");
        assert!(
            err.contains(&file.display().to_string()),
            "{bad}: names the file: {err}"
        );
        assert_eq!(opened.load(Ordering::SeqCst), 0, "{bad}: no row was read");
    }
    // The renamed tensor is named as the file has it too.
    let renamed = dir.path().join("renamed.safetensors");
    let err = fit(unmoved(&renamed)?, &rows, &AtomicUsize::new(0))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("dense.0.weight_renamed"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_pytorch_state_dict_starts_the_job_with_the_weights_of_its_safetensors_twin() -> Result<(), JobError>
{
    let dir = tempfile::tempdir().map_err(|e| JobError::Io {
        context: "tempdir".into(),
        source: e,
    })?;
    let (pt, twin) = (
        dir.path().join("pretrained.pt"),
        dir.path().join("twin.safetensors"),
    );
    for (path, format) in [(&pt, "pt"), (&twin, "safetensors")] {
        run_script(
            "safetensors_check.py",
            &json!({"mode": "write", "path": path, "tensors": mlp_state_dict(), "seed": 11, "format": format}),
        )
        .await;
    }
    let job = unmoved(&pt)?;
    assert_eq!(
        job.spec().init_from.as_ref().map(|p| p.format.as_str()),
        Some("pytorch")
    );
    let tuned = fit(job, &data(300, 3, false), &AtomicUsize::new(0)).await?;
    let out = dir.path().join("out");
    tuned.export(&out, ExportFormat::Safetensors)?;
    let compared = run_script(
        "safetensors_check.py",
        &json!({"mode": "compare", "a": twin, "b": out.join("model.safetensors")}),
    )
    .await;
    assert_eq!(compared["same"], json!(true), "{compared}");

    // A state dict whose tensor was renamed is refused, naming it.
    let renamed = dir.path().join("renamed.pt");
    run_script(
        "safetensors_check.py",
        &json!({
            "mode": "write", "path": renamed, "tensors": mlp_state_dict(), "seed": 1,
            "format": "pt", "bad": "renamed", "spoil": "dense.0.weight"
        }),
    )
    .await;
    let opened = AtomicUsize::new(0);
    let err = fit(unmoved(&renamed)?, &data(100, 3, false), &opened)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("tensor `dense.0.weight` of the model is missing from the file"),
        "{err}"
    );
    assert_eq!(opened.load(Ordering::SeqCst), 0, "no row was read");
    Ok(())
}
