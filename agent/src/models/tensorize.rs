//! Arrow record batches → burn tensors, column by column (never row by row).

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float32Type, Int64Type};
use burn::tensor::{AllocationProperty, Bool, Bytes, DType, Device, Int, Tensor, TensorData};
use kindling_schemas::schema::{FeatureColumn, FeatureKind, FeatureLayout};
use kindling_schemas::spec::{JobSpec, Task};

use crate::error::{AgentError, ModelError};

/// Labels of one batch, in the form the loss wants.
#[derive(Debug, Clone)]
pub enum Targets {
    /// Class indices `[n]`.
    Classes(Tensor<1, Int>),
    /// Regression targets `[n, targets]`.
    Values(Tensor<2>),
}

/// A batch's id sequences, padded to the column's `max_len` with id 0.
#[derive(Debug, Clone)]
pub struct Sequence {
    /// Ids `[n, max_len]`; positions past a row's length hold 0.
    pub ids: Tensor<2, Int>,
    /// `[n, max_len]`: true where a position holds an id of the row.
    pub mask: Tensor<2, Bool>,
    /// Each row's length `[n]`.
    pub lengths: Tensor<1, Int>,
}

/// Writes the feature columns of `batch` into a row-major `[rows, input_dim]` buffer.
///
/// A `FixedSizeList<Float32>` column is copied as one contiguous block per
/// row; scalar columns are cast to f32 once and scattered into their slot.
pub fn features_row_major(batch: &RecordBatch, layout: &FeatureLayout) -> Result<Vec<f32>, AgentError> {
    if let Some(values) = lone_vector(batch, layout)? {
        return Ok(values.to_vec());
    }
    let n = batch.num_rows();
    let d = layout.input_dim;
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
            FeatureKind::Categorical { .. } | FeatureKind::Sequence { .. } => {}
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
    let shape = [batch.num_rows(), layout.input_dim];
    if let Some(values) = lone_vector(batch, layout)? {
        // Arrow's buffer handed over as it is: the upload is its one copy.
        let bytes = Bytes::from_shared(
            bytes::Bytes::from_owner(values.into_inner()),
            AllocationProperty::Native,
        );
        return Ok(Tensor::from_data(
            TensorData::from_bytes(bytes, shape, DType::F32),
            device,
        ));
    }
    let data = features_row_major(batch, layout)?;
    Ok(Tensor::from_data(TensorData::new(data, shape), device))
}

/// A lone vector feature column's values, row-major already: a slice of
/// Arrow's buffer (no copy), or `None` for any other layout.
fn lone_vector(batch: &RecordBatch, layout: &FeatureLayout) -> Result<Option<ScalarBuffer<f32>>, AgentError> {
    let [feature] = layout.features.as_slice() else {
        return Ok(None);
    };
    let FeatureKind::Vector { len } = feature.kind else {
        return Ok(None);
    };
    let list = column(batch, &feature.name)?.as_fixed_size_list();
    let values = list.values().as_primitive::<Float32Type>().values();
    Ok(Some(
        values.slice(list.value_offset_at(0), batch.num_rows() * len),
    ))
}

/// One float column `[rows, width]` (a scalar column has width 1).
pub fn float_column(
    batch: &RecordBatch,
    feature: &FeatureColumn,
    device: &Device,
) -> Result<Tensor<2>, AgentError> {
    let col = column(batch, &feature.name)?;
    let n = batch.num_rows();
    let (values, width) = match feature.kind {
        FeatureKind::Scalar(_) => {
            let as_f32 = cast(col, &DataType::Float32).map_err(AgentError::arrow)?;
            (as_f32.as_primitive::<Float32Type>().values().to_vec(), 1)
        }
        FeatureKind::Vector { len } => {
            let list = col.as_fixed_size_list();
            let base = list.value_offset_at(0);
            let values = list.values().as_primitive::<Float32Type>().values();
            (values[base..base + n * len].to_vec(), len)
        }
        FeatureKind::Categorical { .. } | FeatureKind::Sequence { .. } => {
            return Err(ModelError::InputKind {
                column: feature.name.clone(),
                wanted: "float",
                found: describe(&feature.kind),
            }
            .into());
        }
    };
    Ok(Tensor::from_data(TensorData::new(values, [n, width]), device))
}

/// How a column's kind reads in an error.
pub fn describe(kind: &FeatureKind) -> String {
    match kind {
        FeatureKind::Scalar(t) => format!("a float input ({t})"),
        FeatureKind::Vector { len } => format!("a float input of {len} values"),
        FeatureKind::Categorical { vocabulary } => format!("categorical ids (vocabulary {vocabulary})"),
        FeatureKind::Sequence { vocabulary, max_len } => {
            format!("an id sequence (vocabulary {vocabulary}, max_len {max_len})")
        }
    }
}

/// A categorical column's ids `[rows]`.
pub fn ids(batch: &RecordBatch, name: &str, device: &Device) -> Result<Tensor<1, Int>, AgentError> {
    let col = column(batch, name)?;
    let as_i64 = cast(col, &DataType::Int64).map_err(AgentError::arrow)?;
    let v = as_i64.as_primitive::<Int64Type>().values().to_vec();
    let n = v.len();
    Ok(Tensor::from_data(TensorData::new(v, [n]), device))
}

/// A sequence column, padded to `max_len` (validation has refused longer lists).
pub fn sequence(
    batch: &RecordBatch,
    name: &str,
    max_len: usize,
    device: &Device,
) -> Result<Sequence, AgentError> {
    let col = column(batch, name)?;
    let n = batch.num_rows();
    let (values, offsets) = kindling_schemas::schema::list_parts(col);
    let as_i64 = cast(&values, &DataType::Int64).map_err(AgentError::arrow)?;
    let flat = as_i64.as_primitive::<Int64Type>().values();
    let mut ids = vec![0i64; n * max_len];
    let mut mask = vec![false; n * max_len];
    let mut lengths = Vec::with_capacity(n);
    for row in 0..n {
        let (start, end) = (offsets[row], offsets[row + 1]);
        let len = (end - start).min(max_len);
        ids[row * max_len..row * max_len + len].copy_from_slice(&flat[start..start + len]);
        mask[row * max_len..row * max_len + len].fill(true);
        lengths.push(len as i64);
    }
    Ok(Sequence {
        ids: Tensor::from_data(TensorData::new(ids, [n, max_len]), device),
        mask: Tensor::from_data(TensorData::new(mask, [n, max_len]), device),
        lengths: Tensor::from_data(TensorData::new(lengths, [n]), device),
    })
}

/// The label tensor of a batch.
pub fn targets(batch: &RecordBatch, label: &str, task: Task, device: &Device) -> Result<Targets, AgentError> {
    let col = column(batch, label)?;
    let n = batch.num_rows();
    if let DataType::FixedSizeList(_, k) = col.data_type() {
        let k = *k as usize;
        let list = col.as_fixed_size_list();
        let base = list.value_offset_at(0);
        let values = list.values().as_primitive::<Float32Type>().values();
        let v = values[base..base + n * k].to_vec();
        return Ok(Targets::Values(Tensor::from_data(
            TensorData::new(v, [n, k]),
            device,
        )));
    }
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

/// Each row's weight: the spec's sample-weight column times its class
/// weight; `None` when the job weights no rows.
pub fn row_weights(batch: &RecordBatch, spec: &JobSpec) -> Result<Option<Vec<f32>>, AgentError> {
    let mut weights = sample_weights(batch, spec)?;
    if let Some(per_class) = &spec.class_weights {
        let labels = class_labels(batch, &spec.label)?;
        let w = weights.get_or_insert_with(|| vec![1.0; labels.len()]);
        for (w, &y) in w.iter_mut().zip(&labels) {
            *w *= per_class.get(y as usize).copied().unwrap_or(1.0) as f32;
        }
    }
    Ok(weights)
}

/// The spec's sample-weight column alone (what the eval metrics weigh rows
/// by; class weights shape only the loss); `None` without one.
pub fn sample_weights(batch: &RecordBatch, spec: &JobSpec) -> Result<Option<Vec<f32>>, AgentError> {
    let Some(name) = &spec.sample_weight else {
        return Ok(None);
    };
    let as_f32 = cast(column(batch, name)?, &DataType::Float32).map_err(AgentError::arrow)?;
    Ok(Some(as_f32.as_primitive::<Float32Type>().values().to_vec()))
}

/// Regression targets row-major as `f32` (`[row · targets + t]`).
pub fn target_values(batch: &RecordBatch, label: &str) -> Result<Vec<f32>, AgentError> {
    let col = column(batch, label)?;
    if let DataType::FixedSizeList(_, k) = col.data_type() {
        let list = col.as_fixed_size_list();
        let base = list.value_offset_at(0);
        let values = list.values().as_primitive::<Float32Type>().values();
        return Ok(values[base..base + batch.num_rows() * *k as usize].to_vec());
    }
    let as_f32 = cast(col, &DataType::Float32).map_err(AgentError::arrow)?;
    Ok(as_f32.as_primitive::<Float32Type>().values().to_vec())
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
        .ok_or_else(|| ModelError::MissingColumn(name.to_owned()).into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, FixedSizeListArray, Float32Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use burn::tensor::Device;
    use kindling_schemas::schema::{StreamKind, validate};
    use kindling_schemas::spec::{JobSpec, Task};

    /// A lone vector column goes to the device from Arrow's own buffer, and
    /// a batch sliced out of a larger one (its values at an offset) gives its
    /// own rows, not the parent's first ones.
    #[test]
    fn a_vector_column_is_handed_over_without_a_copy_at_its_offset() {
        let values: Vec<f32> = (0..40).map(|i| i as f32 * 0.5).collect();
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let list = FixedSizeListArray::new(item, 4, Arc::new(Float32Array::from(values.clone())), None);
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", list.data_type().clone(), false),
            Field::new("y", DataType::Int64, false),
        ]));
        let labels = arrow::array::Int64Array::from((0..10).map(|i| i % 2).collect::<Vec<i64>>());
        let batch = RecordBatch::try_new(schema, vec![Arc::new(list), Arc::new(labels)]).expect("batch");
        let spec = JobSpec::builder()
            .task(Task::Classification { num_classes: 2 })
            .features(["x"])
            .label("y")
            .build()
            .expect("spec");
        let layout = validate(&batch.schema(), &spec, StreamKind::Train).expect("layout");
        assert!(
            super::lone_vector(&batch, &layout).expect("bytes").is_some(),
            "the shared path"
        );
        let device = Device::default();
        for (offset, rows) in [(0, 10), (3, 5), (9, 1)] {
            let part = batch.slice(offset, rows);
            let t = super::features(&part, &layout, &device).expect("features");
            assert_eq!(t.dims(), [rows, 4]);
            let got = t
                .into_data()
                .convert::<f32>()
                .as_slice::<f32>()
                .expect("f32")
                .to_vec();
            assert_eq!(got, values[offset * 4..(offset + rows) * 4], "rows from {offset}");
        }
    }
}
