//! Arrow record batches → burn tensors, column by column (never row by row).

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float32Type, Int64Type};
use burn::tensor::{Device, Int, Tensor, TensorData};
use kindling_schemas::schema::{FeatureKind, FeatureLayout};
use kindling_schemas::spec::Task;

use crate::error::AgentError;
use crate::model::Targets;

/// Writes the feature columns of `batch` into a row-major `[rows, input_dim]` buffer.
///
/// A `FixedSizeList<Float32>` column is copied as one contiguous block per
/// row; scalar columns are cast to f32 once and scattered into their slot.
pub fn features_row_major(batch: &RecordBatch, layout: &FeatureLayout) -> Result<Vec<f32>, AgentError> {
    let n = batch.num_rows();
    let d = layout.input_dim;
    if layout.features.len() == 1 {
        // Fast path: a single vector column is already row-major.
        if let FeatureKind::Vector { .. } = layout.features[0].kind {
            let col = column(batch, &layout.features[0].name)?;
            let list = col.as_fixed_size_list();
            let values = list.values().as_primitive::<Float32Type>();
            let start = list.value_offset_at(0);
            return Ok(values.values()[start..start + n * d].to_vec());
        }
    }
    let mut out = vec![0f32; n * d];
    for f in &layout.features {
        let col = column(batch, &f.name)?;
        match f.kind {
            FeatureKind::Scalar(_) => {
                let as_f32 = cast(col, &DataType::Float32).map_err(AgentError::arrow)?;
                let values = as_f32.as_primitive::<Float32Type>().values();
                for (row, v) in values.iter().enumerate() {
                    out[row * d + f.offset] = *v;
                }
            }
            FeatureKind::Vector { len } => {
                let list = col.as_fixed_size_list();
                let values = list.values().as_primitive::<Float32Type>().values();
                let base = list.value_offset_at(0);
                for row in 0..n {
                    let src = &values[base + row * len..base + (row + 1) * len];
                    out[row * d + f.offset..row * d + f.offset + len].copy_from_slice(src);
                }
            }
        }
    }
    Ok(out)
}

/// The feature tensor `[rows, input_dim]` of a batch.
pub fn features(
    batch: &RecordBatch,
    layout: &FeatureLayout,
    device: &Device,
) -> Result<Tensor<2>, AgentError> {
    let data = features_row_major(batch, layout)?;
    Ok(Tensor::from_data(
        TensorData::new(data, [batch.num_rows(), layout.input_dim]),
        device,
    ))
}

/// The label tensor of a batch.
pub fn targets(batch: &RecordBatch, label: &str, task: Task, device: &Device) -> Result<Targets, AgentError> {
    let col = column(batch, label)?;
    let n = batch.num_rows();
    Ok(match task {
        Task::Classification { .. } => {
            let as_i64 = cast(col, &DataType::Int64).map_err(AgentError::arrow)?;
            let v: Vec<i64> = as_i64.as_primitive::<Int64Type>().values().to_vec();
            Targets::Classes(Tensor::<1, Int>::from_data(TensorData::new(v, [n]), device))
        }
        Task::Regression => {
            let as_f32 = cast(col, &DataType::Float32).map_err(AgentError::arrow)?;
            let v: Vec<f32> = as_f32.as_primitive::<Float32Type>().values().to_vec();
            Targets::Values(Tensor::from_data(TensorData::new(v, [n, 1]), device))
        }
    })
}

/// Class labels as i64 (for accuracy).
pub fn class_labels(batch: &RecordBatch, label: &str) -> Result<Vec<i64>, AgentError> {
    let col = column(batch, label)?;
    let as_i64 = cast(col, &DataType::Int64).map_err(AgentError::arrow)?;
    Ok(as_i64.as_primitive::<Int64Type>().values().to_vec())
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array, AgentError> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| AgentError::MissingColumn(name.to_owned()))
}
