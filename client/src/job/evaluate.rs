//! [`TrainedModel::evaluate`]: the model's predictions over a DataFrame
//! scored against its label, with the metrics the agents compute on the
//! eval split every epoch (`kindling_schemas::scoring`).

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float32Type, Int64Type};
use futures::TryStreamExt;
use kindling_schemas::schema::{self, SchemaError};
use kindling_schemas::scoring::{Report, Tally, TallyKind};
use kindling_schemas::spec::JobSpec;

use super::{JobError, TrainedModel};
use crate::spark::DataFrame;

impl TrainedModel {
    /// Scores the model on `df`, which holds the features, the label and,
    /// when the job weighted its rows, the sample-weight column (other
    /// columns are left out): accuracy, log loss, precision / recall / F1
    /// (macro and micro), top-k accuracy, the confusion matrix and, for two
    /// classes, AUC-ROC and PR-AUC; RMSE, MAE, R² and MAPE for regression —
    /// each over every row, as scikit-learn defines it (see
    /// `kindling_schemas::scoring`). Predicts in this process, batch by
    /// batch; an empty DataFrame is an error.
    pub async fn evaluate(&self, df: &DataFrame) -> Result<Report, JobError> {
        let spec = self.spec().clone();
        let input = df.schema().await?;
        for (column, role) in [(Some(&spec.label), "label")]
            .into_iter()
            .chain([(spec.sample_weight.as_ref(), "sample weight")])
        {
            if let Some(column) = column
                && input.field_with_name(column).is_err()
            {
                return Err(SchemaError::MissingColumn {
                    column: column.clone(),
                    role,
                }
                .into());
            }
        }
        let data = df.select(spec.columns());
        let mut predictions = self.predict(&data).await?;
        let mut tally = Tally::new(TallyKind::for_spec(&spec), 0);
        while let Some(batch) = predictions.try_next().await? {
            schema::validate_batch(&batch, &spec)?;
            add(&mut tally, &spec, &batch)?;
        }
        if tally.rows() == 0 {
            return Err(JobError::EmptyInput {
                what: "the DataFrame to evaluate",
            });
        }
        Ok(tally.report(&[]))
    }
}

/// Tallies one predicted batch (its input columns and the predictions).
fn add(tally: &mut Tally, spec: &JobSpec, batch: &RecordBatch) -> Result<(), JobError> {
    let weights = match &spec.sample_weight {
        Some(column) => Some(floats(column_of(batch, column)?, column)?),
        None => None,
    };
    match tally.kind() {
        TallyKind::Classes { .. } => {
            let probabilities = column_of(batch, "probabilities")?;
            let probabilities = floats(probabilities, "probabilities")?;
            let labels = cast(column_of(batch, &spec.label)?, &DataType::Int64).map_err(arrow_error)?;
            let labels = labels.as_primitive::<Int64Type>().values();
            tally.add_classes(&probabilities, labels, weights.as_deref());
        }
        TallyKind::Values { .. } => {
            let predicted = floats(column_of(batch, "prediction")?, "prediction")?;
            let targets = floats(column_of(batch, &spec.label)?, &spec.label)?;
            tally.add_values(&predicted, &targets, weights.as_deref());
        }
    }
    Ok(())
}

fn column_of<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array, JobError> {
    batch.column_by_name(name).map(|c| c.as_ref()).ok_or_else(|| {
        JobError::Data(SchemaError::MissingColumn {
            column: name.to_owned(),
            role: "prediction output",
        })
    })
}

/// A numeric column's values, or a list column's values flattened, as f32.
fn floats(column: &dyn Array, name: &str) -> Result<Vec<f32>, JobError> {
    let values = match column.data_type() {
        DataType::List(_) => {
            let list = column.as_list::<i32>();
            let (start, end) = (list.value_offsets()[0], list.value_offsets()[list.len()]);
            list.values().slice(start as usize, (end - start) as usize)
        }
        DataType::FixedSizeList(_, k) => {
            let list = column.as_fixed_size_list();
            let start = list.value_offset_at(0);
            list.values().slice(start, list.len() * *k as usize)
        }
        t if t.is_numeric() => column.slice(0, column.len()),
        t => {
            return Err(JobError::Data(SchemaError::WrongType {
                column: name.to_owned(),
                found: t.clone(),
                expected: "numbers or a list of numbers",
            }));
        }
    };
    let as_f32 = cast(&values, &DataType::Float32).map_err(arrow_error)?;
    Ok(as_f32.as_primitive::<Float32Type>().values().to_vec())
}

fn arrow_error(e: arrow::error::ArrowError) -> JobError {
    JobError::Io {
        context: "reading predictions".to_owned(),
        source: std::io::Error::other(e),
    }
}
