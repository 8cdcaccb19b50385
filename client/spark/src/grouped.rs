//! `GroupedData`: the keys of a `group_by`, waiting for its aggregates.

use crate::column::{Column, ColumnRef};
use crate::dataframe::DataFrame;
use crate::functions::{self, lit};

/// Rows grouped by key columns; [`GroupedData::agg`] turns it back into a DataFrame
/// with one row per key.
///
/// ```no_run
/// # fn demo(df: kindling_spark::DataFrame) {
/// use kindling_spark::functions::{col, mean, stddev};
/// let stats = df
///     .group_by(["city"])
///     .agg([mean(col("fare")).alias("mean"), stddev(col("fare")).alias("sd")]);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct GroupedData {
    df: DataFrame,
    keys: Vec<Column>,
}

impl GroupedData {
    pub(crate) fn new(df: DataFrame, keys: Vec<Column>) -> Self {
        Self { df, keys }
    }

    /// Key columns followed by one column per aggregate.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::{col, max};
    /// let latest = df.group_by(["user"]).agg([max(col("ts")).alias("latest")]);
    /// # }
    /// ```
    pub fn agg(&self, aggregates: impl IntoIterator<Item = Column>) -> DataFrame {
        self.df
            .aggregate(self.keys.clone(), aggregates.into_iter().collect())
    }

    /// Rows per group, in a column `count`.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let sizes = df.group_by(["city"]).count();
    /// # }
    /// ```
    pub fn count(&self) -> DataFrame {
        self.agg([functions::count(lit(1)).alias("count")])
    }

    /// `sum(c)` for each named column.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let totals = df.group_by(["city"]).sum(["fare", "tip"]);
    /// # }
    /// ```
    pub fn sum<C: ColumnRef>(&self, columns: impl IntoIterator<Item = C>) -> DataFrame {
        self.agg(columns.into_iter().map(|c| functions::sum(c.to_column())))
    }

    /// `avg(c)` for each named column.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let means = df.group_by(["city"]).mean(["fare"]);
    /// # }
    /// ```
    pub fn mean<C: ColumnRef>(&self, columns: impl IntoIterator<Item = C>) -> DataFrame {
        self.agg(columns.into_iter().map(|c| functions::mean(c.to_column())))
    }
}
