//! The eval split: which rows `fit` holds out — Spark's seeded random split,
//! or a hash of a column's value and the seed ([`EvalSplit`], set with
//! `eval_split_by`). Both are planned in Spark, so the driver relay and
//! executor push (each reading the split DataFrames) feed the same rows.
//!
//! The random split depends on the rows' order and partitioning (Spark
//! samples each partition with its own stream of random numbers), so it
//! moves when the ETL's order does (`rand()`, a join, a new partitioning).
//! The split by a column depends on the column's values alone: each row
//! carries an eval mark computed from its own value before the rows are
//! persisted, and the train and eval splits are the rows marked each way.

use arrow::datatypes::DataType;
use kindling_schemas::spec::{EvalSplit, JobSpec};

use super::error::{JobError, SplitProblem};
use crate::spark::functions::{col, lit, null, when};
use crate::spark::{Column, DataFrame};

/// The column `fit` adds to the rows it persists when the split is by a
/// column: `true` for an eval row, `false` for a train row, null where the
/// split column is null.
const EVAL_MARK: &str = "__kindling_eval";

/// The most columns a [`SplitProblem::Missing`] lists (a DataFrame may
/// have thousands).
const LISTED_COLUMNS: usize = 32;

/// `df`'s job columns, and last the eval mark of each row by `split` and
/// `spec.seed` ([`EvalSplit`] says how). Fails naming the column when `df`
/// has no such column or its type cannot be hashed.
pub(super) async fn marked(df: &DataFrame, spec: &JobSpec, split: &EvalSplit) -> Result<DataFrame, JobError> {
    let schema = df.schema().await?;
    let by = split.by.as_str();
    let problem = |problem| JobError::SplitColumn {
        column: by.to_owned(),
        problem,
    };
    let Some(field) = schema.fields().iter().find(|f| f.name() == by) else {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let mut columns = names[..names.len().min(LISTED_COLUMNS)].join(", ");
        if names.len() > LISTED_COLUMNS {
            columns.push_str(&format!(", … ({} in all)", names.len()));
        }
        return Err(problem(SplitProblem::Missing { columns }));
    };
    let value = match field.data_type() {
        // One width for every integer type, so an ETL that widens an INT id
        // to a BIGINT keeps the split.
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => col(by).cast("bigint"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => col(by),
        // Floats are refused: a value that moves in its last bit with the
        // ETL's rounding would move its row.
        other => return Err(problem(SplitProblem::Type { found: other.clone() })),
    };
    let hash = Column::call("hash", [lit(spec.seed as i64), value]);
    let bucket = Column::call("pmod", [hash, lit(EvalSplit::BUCKETS)]);
    let mark = when(col(by).is_null(), null("boolean")).otherwise(bucket.lt(lit(split.eval_buckets())));
    let mut columns: Vec<Column> = spec.columns().into_iter().map(col).collect();
    columns.push(mark.alias(EVAL_MARK));
    Ok(df.select(columns))
}

/// Refuses rows [`marked`] could not place (a null in the split column),
/// counting them: one pass over the rows, which also fills the cache when
/// `marked` is persisted.
pub(super) async fn check_marks(marked: &DataFrame, split: &EvalSplit) -> Result<(), JobError> {
    let nulls = marked.filter(col(EVAL_MARK).is_null()).count().await?;
    if nulls > 0 {
        return Err(JobError::SplitColumn {
            column: split.by.clone(),
            problem: SplitProblem::Nulls { count: nulls as u64 },
        });
    }
    Ok(())
}

/// The train and eval rows of `marked`, with the job's columns only, each
/// in `marked`'s order.
pub(super) fn by_mark(marked: &DataFrame, spec: &JobSpec) -> (DataFrame, DataFrame) {
    let side = |eval: bool| marked.filter(col(EVAL_MARK).eq(lit(eval))).select(spec.columns());
    (side(false), side(true))
}

/// The train and eval rows of `data` by Spark's seeded random split. A
/// persisted `data` keeps its rows' partitioning and order, so the split
/// can keep their order too (Spark's sorted split would hand each shard
/// its rows ordered by the first column).
pub(super) fn random(
    data: DataFrame,
    fraction: f64,
    seed: u64,
    persisted: bool,
) -> Result<(DataFrame, DataFrame), JobError> {
    let weights = [1.0 - fraction, fraction];
    let mut parts = match persisted {
        true => data.random_split_in_order(&weights, seed as i64)?,
        false => data.random_split(&weights, seed as i64)?,
    };
    match (parts.pop(), parts.pop()) {
        (Some(eval), Some(train)) => Ok((train, eval)),
        _ => Err(JobError::Spark(crate::spark::Error::Protocol(
            "random_split gave fewer than two parts".into(),
        ))),
    }
}
