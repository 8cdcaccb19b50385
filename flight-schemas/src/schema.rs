//! Arrow schema conventions and their validation against a [`JobSpec`].
//!
//! - A feature column is a float input unless the spec declares it
//!   otherwise: a numeric scalar (any integer or float type) or a
//!   `FixedSizeList<Float32>` (an embedding or an image); the float inputs
//!   concatenated in spec order are the built-in networks' input.
//! - A column the spec declares categorical ([`InputType::Categorical`]) is
//!   `Int32`/`Int64` ids inside its vocabulary; one declared a sequence
//!   ([`InputType::Sequence`]) is `List<Int32|Int64>` of such ids, none longer
//!   than its `max_len`.
//! - The label is an integer type for classification, and a numeric type (or
//!   a `FixedSizeList<Float32>` of the spec's `targets` values) for regression.
//! - A training stream carries exactly the feature and label columns (a
//!   prediction stream may omit the label); any other column is refused.
//! - Nulls, NaN and infinities in any used column are refused per batch by
//!   [`validate_batch`]. The schema's nullability flag itself is not an error:
//!   Spark marks nearly every column nullable, so the values are what is checked.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type, Schema};

use crate::spec::{InputType, JobSpec, ModelSpec, Task};

/// How one feature column maps into the model input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeatureKind {
    /// One numeric value per row.
    Scalar(DataType),
    /// `len` Float32 values per row.
    Vector {
        /// List length.
        len: usize,
    },
    /// One id per row in `0..vocabulary` (declared in the spec).
    Categorical {
        /// Number of distinct ids.
        vocabulary: usize,
    },
    /// A list of ids in `0..vocabulary` per row, at most `max_len` long.
    Sequence {
        /// Number of distinct ids.
        vocabulary: usize,
        /// Longest list.
        max_len: usize,
    },
}

impl FeatureKind {
    /// Values this column adds to the float input (0 for ids).
    pub fn float_width(&self) -> usize {
        match self {
            FeatureKind::Scalar(_) => 1,
            FeatureKind::Vector { len } => *len,
            FeatureKind::Categorical { .. } | FeatureKind::Sequence { .. } => 0,
        }
    }
}

/// A feature column and its place in the input vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureColumn {
    /// Column name.
    pub name: String,
    /// Scalar or vector.
    pub kind: FeatureKind,
    /// Offset of its first value in the float input (for float columns).
    pub offset: usize,
}

/// The result of validating a schema: how batches become tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureLayout {
    /// Feature columns in spec order.
    pub features: Vec<FeatureColumn>,
    /// Width of the float input (the float columns concatenated).
    pub input_dim: usize,
    /// The label's type, when the stream carries the label.
    pub label: Option<DataType>,
    /// Width of the model's output: classes, or regression targets.
    pub outputs: usize,
}

impl FeatureLayout {
    /// The feature column `name`.
    pub fn column(&self, name: &str) -> Option<&FeatureColumn> {
        self.features.iter().find(|f| f.name == name)
    }

    /// The input as a model sees it, without Arrow types: comparable and
    /// storable with a trained model.
    pub fn signature(&self) -> Vec<(String, String)> {
        self.features
            .iter()
            .map(|f| {
                let kind = match &f.kind {
                    FeatureKind::Scalar(_) => "float".to_owned(),
                    FeatureKind::Vector { len } => format!("float[{len}]"),
                    FeatureKind::Categorical { vocabulary } => format!("categorical({vocabulary})"),
                    FeatureKind::Sequence { vocabulary, max_len } => {
                        format!("sequence({vocabulary}, max_len {max_len})")
                    }
                };
                (f.name.clone(), kind)
            })
            .collect()
    }
}

/// A schema or batch that does not fit the job spec. Every variant names the column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A feature or the label is not in the stream.
    #[error("column `{column}` is missing from the stream (it is the {role} in the job spec)")]
    MissingColumn {
        /// Column.
        column: String,
        /// `feature` or `label`.
        role: &'static str,
    },
    /// The stream has a column the spec does not use.
    #[error(
        "column `{column}` is dictionary-encoded ({found}): no stream takes dictionaries (a peer's deltas would grow for the life of the stream); cast it to its value type"
    )]
    Dictionary {
        /// The column.
        column: String,
        /// Its type.
        found: DataType,
    },
    #[error("unknown column `{column}`: it is neither a feature nor the label of the job spec")]
    UnknownColumn {
        /// Column.
        column: String,
    },
    /// A column has a type the contract does not allow there.
    #[error("column `{column}` has type {found}, expected {expected}")]
    WrongType {
        /// Column.
        column: String,
        /// What it is.
        found: DataType,
        /// What is allowed.
        expected: &'static str,
    },
    /// The feature widths do not fit the model.
    #[error("features give an input of width {found}, but the model needs {expected}")]
    WrongWidth {
        /// What the features give.
        found: usize,
        /// What the model needs.
        expected: usize,
    },
    /// Null values in a used column.
    #[error(
        "column `{column}` has {count} null value(s); Kindling does not impute: drop or fill them in the ETL"
    )]
    Nulls {
        /// Column.
        column: String,
        /// How many.
        count: usize,
    },
    /// NaN or infinity.
    #[error("column `{column}` has a non-finite value (NaN or infinity) at row {row}")]
    NonFinite {
        /// Column.
        column: String,
        /// Row within the batch.
        row: usize,
    },
    /// An id outside a categorical or sequence column's vocabulary.
    #[error("column `{column}` has id {value} at row {row}, outside its declared vocabulary 0..{vocabulary}")]
    IdOutOfRange {
        /// Column.
        column: String,
        /// Offending id.
        value: i64,
        /// Row within the batch.
        row: usize,
        /// Declared vocabulary.
        vocabulary: usize,
    },
    /// A sequence longer than its declared `max_len`.
    #[error(
        "column `{column}` has a list of {len} ids at row {row}, longer than its declared max_len {max_len}"
    )]
    SequenceTooLong {
        /// Column.
        column: String,
        /// The list's length.
        len: usize,
        /// Row within the batch.
        row: usize,
        /// Declared maximum.
        max_len: usize,
    },
    /// A class label outside `0..num_classes`.
    #[error("label column `{column}` has class {value} at row {row}, outside 0..{num_classes}")]
    LabelOutOfRange {
        /// Column.
        column: String,
        /// Offending value.
        value: i64,
        /// Row within the batch.
        row: usize,
        /// Classes in the spec.
        num_classes: usize,
    },
    /// A negative row weight.
    #[error(
        "sample-weight column `{column}` has the negative weight {value} at row {row}; weights must be ≥ 0"
    )]
    NegativeWeight {
        /// Column.
        column: String,
        /// Offending value, as written (a float column's digits).
        value: String,
        /// Row within the batch.
        row: usize,
    },
}

const NUMERIC: &str =
    "a numeric scalar (Int8..Int64, UInt8..UInt64, Float16/32/64) or FixedSizeList<Float32>";
const CATEGORICAL: &str = "Int32 or Int64 ids (the spec declares it categorical)";
const SEQUENCE: &str = "List<Int32> or List<Int64> of ids (the spec declares it a sequence)";

fn is_numeric(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

/// What a stream is for, which decides how strict [`validate`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// Training or eval rows: exactly the features and the label.
    Train,
    /// Rows to predict: the features are required; the label and any other
    /// columns are allowed and passed through to the output.
    Predict,
}

/// Whether `t` holds a dictionary anywhere (itself, or a nested field).
fn has_dictionary(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => has_dictionary(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| has_dictionary(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| has_dictionary(f.data_type())),
        DataType::RunEndEncoded(ends, values) => {
            has_dictionary(ends.data_type()) || has_dictionary(values.data_type())
        }
        _ => false,
    }
}

/// Validates a stream's schema against the spec.
///
/// ```
/// use arrow::datatypes::{DataType, Field, Schema};
/// use kindling_schemas::{schema::{validate, StreamKind}, spec::{JobSpec, Task}};
/// let spec = JobSpec::builder().task(Task::Classification { num_classes: 2 })
///     .features(["x"]).label("y").build().unwrap();
/// let schema = Schema::new(vec![
///     Field::new("x", DataType::Float64, true),
///     Field::new("y", DataType::Int32, true),
/// ]);
/// assert_eq!(validate(&schema, &spec, StreamKind::Train).unwrap().input_dim, 1);
/// ```
pub fn validate(schema: &Schema, spec: &JobSpec, kind: StreamKind) -> Result<FeatureLayout, SchemaError> {
    if let Some(field) = schema.fields().iter().find(|f| has_dictionary(f.data_type())) {
        return Err(SchemaError::Dictionary {
            column: field.name().clone(),
            found: field.data_type().clone(),
        });
    }
    let require_label = kind == StreamKind::Train;
    for field in schema.fields().iter().filter(|_| require_label) {
        if *field.name() != spec.label
            && !spec.features.contains(field.name())
            && spec.sample_weight.as_ref() != Some(field.name())
        {
            return Err(SchemaError::UnknownColumn {
                column: field.name().clone(),
            });
        }
    }
    let mut features = Vec::with_capacity(spec.features.len());
    let mut offset = 0;
    for name in &spec.features {
        let kind = feature_kind(schema, spec, name)?;
        let width = kind.float_width();
        features.push(FeatureColumn {
            name: name.clone(),
            kind,
            offset,
        });
        offset += width;
    }
    if let ModelSpec::Cnn {
        channels,
        height,
        width,
        ..
    } = &spec.model
    {
        let expected = channels * height * width;
        if offset != expected {
            return Err(SchemaError::WrongWidth {
                found: offset,
                expected,
            });
        }
    }
    let label = label_type(schema, spec, require_label)?;
    if let (Some(column), true) = (&spec.sample_weight, require_label) {
        let field = schema
            .field_with_name(column)
            .map_err(|_| SchemaError::MissingColumn {
                column: column.clone(),
                role: "sample weight",
            })?;
        if !is_numeric(field.data_type()) {
            return Err(SchemaError::WrongType {
                column: column.clone(),
                found: field.data_type().clone(),
                expected: "a numeric row weight",
            });
        }
    }
    Ok(FeatureLayout {
        features,
        input_dim: offset,
        label,
        outputs: spec.output_dim(),
    })
}

/// The kind of feature column `name`: what the spec's `inputs` declare it
/// as, or a number or a float vector; a column missing or of another type
/// is an error naming it.
fn feature_kind(schema: &Schema, spec: &JobSpec, name: &str) -> Result<FeatureKind, SchemaError> {
    let field = schema
        .field_with_name(name)
        .map_err(|_| SchemaError::MissingColumn {
            column: name.to_owned(),
            role: "feature",
        })?;
    let wrong = |expected| SchemaError::WrongType {
        column: name.to_owned(),
        found: field.data_type().clone(),
        expected,
    };
    Ok(match (spec.inputs.get(name), field.data_type()) {
        (Some(InputType::Categorical { vocabulary }), t) => match t {
            DataType::Int32 | DataType::Int64 => FeatureKind::Categorical {
                vocabulary: *vocabulary,
            },
            _ => return Err(wrong(CATEGORICAL)),
        },
        (Some(InputType::Sequence { vocabulary, max_len }), t) => match t {
            DataType::List(item) | DataType::LargeList(item)
                if matches!(item.data_type(), DataType::Int32 | DataType::Int64) =>
            {
                FeatureKind::Sequence {
                    vocabulary: *vocabulary,
                    max_len: *max_len,
                }
            }
            _ => return Err(wrong(SEQUENCE)),
        },
        (None, t) if is_numeric(t) => FeatureKind::Scalar(t.clone()),
        (None, DataType::FixedSizeList(inner, len))
            if *inner.data_type() == DataType::Float32 && *len > 0 =>
        {
            FeatureKind::Vector { len: *len as usize }
        }
        (None, _) => return Err(wrong(NUMERIC)),
    })
}

/// The label column's type, checked against the task (an integer class,
/// a number, or a float vector of the spec's `targets`); `None` where a
/// stream without labels (prediction) has none.
fn label_type(schema: &Schema, spec: &JobSpec, require_label: bool) -> Result<Option<DataType>, SchemaError> {
    let field = match schema.field_with_name(&spec.label) {
        Ok(field) => field,
        Err(_) if require_label => {
            return Err(SchemaError::MissingColumn {
                column: spec.label.clone(),
                role: "label",
            });
        }
        Err(_) => return Ok(None),
    };
    let t = field.data_type();
    let ok = match (spec.task, t) {
        (Task::Classification { .. }, t) => t.is_integer(),
        (Task::Regression, DataType::FixedSizeList(inner, len)) => {
            *inner.data_type() == DataType::Float32 && *len as usize == spec.targets
        }
        (Task::Regression, t) => spec.targets == 1 && is_numeric(t),
    };
    if !ok {
        return Err(SchemaError::WrongType {
            column: spec.label.clone(),
            found: t.clone(),
            expected: match spec.task {
                Task::Classification { .. } => "an integer class label",
                Task::Regression if spec.targets == 1 => "a numeric label",
                Task::Regression => "a FixedSizeList<Float32> label of the spec's `targets` values",
            },
        });
    }
    Ok(Some(t.clone()))
}

/// Bytes of a batch's own values (the sum of its columns' sliced buffers).
///
/// Use this, not `RecordBatch::get_array_memory_size`, to account for memory
/// or size messages: a batch decoded from Arrow IPC without copying has every
/// column in one shared message buffer, and a slice shares its parent's
/// buffers, so `get_array_memory_size` counts the shared buffer once per
/// column (or per slice).
pub fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size()) as u64
        })
        .sum()
}

/// Checks the values of one batch's feature and label columns: no nulls, no
/// NaN/infinity, class labels in range. The batch must have a schema that
/// [`validate`] accepted; other (pass-through) columns are not looked at.
pub fn validate_batch(batch: &RecordBatch, spec: &JobSpec) -> Result<(), SchemaError> {
    let schema = batch.schema();
    let used = schema.fields().iter().zip(batch.columns()).filter(|(f, _)| {
        *f.name() == spec.label
            || spec.features.contains(f.name())
            || spec.sample_weight.as_ref() == Some(f.name())
    });
    for (field, column) in used {
        let name = field.name();
        if column.null_count() > 0 {
            return Err(SchemaError::Nulls {
                column: name.clone(),
                count: column.null_count(),
            });
        }
        if let Some(declared) = spec.inputs.get(name) {
            check_ids(name, column.as_ref(), declared)?;
            continue;
        }
        let values: &dyn Array = match column.data_type() {
            DataType::FixedSizeList(..) => {
                let list = column.as_fixed_size_list();
                if list.values().null_count() > 0 {
                    return Err(SchemaError::Nulls {
                        column: name.clone(),
                        count: list.values().null_count(),
                    });
                }
                list.values().as_ref()
            }
            _ => column.as_ref(),
        };
        let width = match column.data_type() {
            DataType::FixedSizeList(_, n) => (*n).max(1) as usize,
            _ => 1,
        };
        let non_finite = match values.data_type() {
            DataType::Float32 => first_where(values.as_primitive::<Float32Type>().values(), |v| {
                v.to_bits() & 0x7f80_0000 == 0x7f80_0000
            }),
            DataType::Float64 => first_where(values.as_primitive::<Float64Type>().values(), |v| {
                v.to_bits() & 0x7ff0_0000_0000_0000 == 0x7ff0_0000_0000_0000
            }),
            DataType::Float16 => values
                .as_primitive::<arrow::datatypes::Float16Type>()
                .values()
                .iter()
                .position(|v| !v.is_finite()),
            _ => None,
        };
        if let Some(i) = non_finite {
            let offset = match column.data_type() {
                DataType::FixedSizeList(..) => column.as_fixed_size_list().value_offset_at(0),
                _ => 0,
            };
            return Err(SchemaError::NonFinite {
                column: name.clone(),
                row: i.saturating_sub(offset) / width,
            });
        }
        if spec.sample_weight.as_ref() == Some(name)
            && let Some((row, value)) = first_negative(column.as_ref())
        {
            return Err(SchemaError::NegativeWeight {
                column: name.clone(),
                value,
                row,
            });
        }
        if let (true, Task::Classification { num_classes }) = (*name == spec.label, spec.task)
            && let Some((row, value)) = class_out_of_range(name, column.as_ref(), num_classes)?
        {
            return Err(SchemaError::LabelOutOfRange {
                column: name.clone(),
                value,
                row,
                num_classes,
            });
        }
    }
    Ok(())
}

/// The first negative value of a numeric column (row, value).
fn first_negative(column: &dyn Array) -> Option<(usize, String)> {
    let values = arrow::compute::cast(column, &DataType::Float64).ok()?;
    let values = values.as_primitive::<Float64Type>().values();
    first_where(values, |v| v < 0.0).map(|row| (row, values[row].to_string()))
}

/// The index of the first value `bad` picks. Scans in blocks with an
/// or-reduction the compiler vectorizes, and only looks for the position
/// inside a block that has one.
fn first_where<T: Copy>(values: &[T], bad: impl Fn(T) -> bool) -> Option<usize> {
    const BLOCK: usize = 1024;
    values.chunks(BLOCK).enumerate().find_map(|(b, chunk)| {
        chunk
            .iter()
            .fold(false, |any, &v| any | bad(v))
            .then(|| chunk.iter().position(|&v| bad(v)).map(|i| b * BLOCK + i))
            .flatten()
    })
}

/// The first class label outside `0..num_classes` (row, value), read from
/// the column's own integer values: min and max first (vectorized, no copy),
/// the row only when one is out of range.
fn class_out_of_range(
    name: &str,
    column: &dyn Array,
    num_classes: usize,
) -> Result<Option<(usize, i64)>, SchemaError> {
    use arrow::datatypes::*;
    macro_rules! check {
        ($t:ty) => {{
            let values = column.as_primitive::<$t>();
            let (min, max) = (arrow::compute::min(values), arrow::compute::max(values));
            let inside = |v: i128| v >= 0 && v < num_classes as i128;
            if min.is_none_or(|m| inside(m as i128)) && max.is_none_or(|m| inside(m as i128)) {
                return Ok(None);
            }
            Ok(values
                .values()
                .iter()
                .position(|&v| !inside(v as i128))
                .map(|row| (row, values.value(row) as i64)))
        }};
    }
    match column.data_type() {
        DataType::Int8 => check!(Int8Type),
        DataType::Int16 => check!(Int16Type),
        DataType::Int32 => check!(Int32Type),
        DataType::Int64 => check!(Int64Type),
        DataType::UInt8 => check!(UInt8Type),
        DataType::UInt16 => check!(UInt16Type),
        DataType::UInt32 => check!(UInt32Type),
        DataType::UInt64 => check!(UInt64Type),
        other => Err(SchemaError::WrongType {
            column: name.to_owned(),
            found: other.clone(),
            expected: "an integer class label",
        }),
    }
}

/// A `List` or `LargeList` column's child values and its `rows + 1`
/// offsets into them (absolute: a sliced column's first offset need not be 0).
///
/// # Panics
/// If `column` is neither list type (check the type first).
pub fn list_parts(column: &dyn Array) -> (arrow::array::ArrayRef, Vec<usize>) {
    match column.data_type() {
        DataType::LargeList(_) => {
            let l = column.as_list::<i64>();
            (
                l.values().clone(),
                l.offsets().iter().map(|&o| o as usize).collect(),
            )
        }
        _ => {
            let l = column.as_list::<i32>();
            (
                l.values().clone(),
                l.offsets().iter().map(|&o| o as usize).collect(),
            )
        }
    }
}

/// Checks a categorical or sequence column: no null ids, every id inside
/// the vocabulary, no list longer than `max_len`.
fn check_ids(name: &str, column: &dyn Array, declared: &InputType) -> Result<(), SchemaError> {
    let vocabulary = declared.vocabulary();
    let (ids, rows_of): (arrow::array::ArrayRef, Box<dyn Fn(usize) -> usize>) = match column.data_type() {
        DataType::List(_) | DataType::LargeList(_) => {
            let (values, offsets) = list_parts(column);
            if let InputType::Sequence { max_len, .. } = declared
                && let Some((row, len)) = offsets
                    .windows(2)
                    .map(|w| w[1] - w[0])
                    .enumerate()
                    .find(|(_, len)| len > max_len)
            {
                return Err(SchemaError::SequenceTooLong {
                    column: name.to_owned(),
                    len,
                    row,
                    max_len: *max_len,
                });
            }
            let first = offsets.first().copied().unwrap_or(0);
            let last = offsets.last().copied().unwrap_or(0);
            let used = values.slice(first, last - first);
            let row_of = move |i: usize| offsets.partition_point(|&o| o <= first + i).saturating_sub(1);
            (used, Box::new(row_of))
        }
        _ => (arrow::array::make_array(column.to_data()), Box::new(|i| i)),
    };
    if ids.null_count() > 0 {
        return Err(SchemaError::Nulls {
            column: name.to_owned(),
            count: ids.null_count(),
        });
    }
    let as_i64 = arrow::compute::cast(&ids, &DataType::Int64).map_err(|_| SchemaError::WrongType {
        column: name.to_owned(),
        found: ids.data_type().clone(),
        expected: CATEGORICAL,
    })?;
    if let Some((i, &value)) = as_i64
        .as_primitive::<arrow::datatypes::Int64Type>()
        .values()
        .iter()
        .enumerate()
        .find(|(_, v)| **v < 0 || **v >= vocabulary as i64)
    {
        return Err(SchemaError::IdOutOfRange {
            column: name.to_owned(),
            value,
            row: rows_of(i),
            vocabulary,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
