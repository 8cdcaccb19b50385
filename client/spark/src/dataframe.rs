//! `DataFrame`: an immutable, lazy Spark Connect plan and its
//! transformations; the actions that run it are in [`actions`].

mod actions;

use std::fmt;
use std::sync::Arc;

use spark_connect_proto::relation::RelType;
use spark_connect_proto::{self as proto, Plan, Relation};

use crate::column::{Column, ColumnRef};
use crate::error::{Error, Result};
use crate::grouped::GroupedData;
use crate::session::SparkSession;

/// How two DataFrames are joined.
///
/// ```
/// use kindling_spark::JoinType;
/// assert_ne!(JoinType::Inner, JoinType::LeftOuter);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinType {
    /// Rows with a match on both sides.
    Inner,
    /// All left rows, right columns null where no match.
    LeftOuter,
    /// All right rows, left columns null where no match.
    RightOuter,
    /// All rows of both sides.
    FullOuter,
    /// Left rows that have a match (left columns only).
    LeftSemi,
    /// Left rows without a match (left columns only).
    LeftAnti,
    /// Cartesian product.
    Cross,
}

impl From<JoinType> for proto::join::JoinType {
    fn from(how: JoinType) -> Self {
        use proto::join::JoinType as P;
        match how {
            JoinType::Inner => P::Inner,
            JoinType::LeftOuter => P::LeftOuter,
            JoinType::RightOuter => P::RightOuter,
            JoinType::FullOuter => P::FullOuter,
            JoinType::LeftSemi => P::LeftSemi,
            JoinType::LeftAnti => P::LeftAnti,
            JoinType::Cross => P::Cross,
        }
    }
}

/// Output of [`DataFrame::explain`].
///
/// ```
/// let mode = kindling_spark::ExplainMode::Formatted;
/// # let _ = mode;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExplainMode {
    /// Physical plan.
    Simple,
    /// Parsed, analyzed, optimized and physical plans.
    Extended,
    /// Generated code.
    Codegen,
    /// Plan with statistics.
    Cost,
    /// Physical plan outline and node details.
    Formatted,
}

/// A lazy, immutable Spark query. Every transformation returns a new `DataFrame`
/// (cloning is cheap: the session is an `Arc` and the plan is shared); nothing
/// runs until an action (`execute_stream`, `collect`, `count`, `schema`, ...).
///
/// ```no_run
/// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
/// use kindling_spark::functions::*;
/// let trips = spark.read().option("header", "true").option("inferSchema", "true").csv(["trips.csv"]);
/// let features = trips
///     .filter(col("km").gt(0))
///     .with_column("fare_per_km", col("fare") / col("km"))
///     .group_by(["city"])
///     .agg([mean(col("fare_per_km")).alias("mean_fpk"), count(col("*")).alias("n")])
///     .order_by([col("n").desc()]);
/// let batches = features.collect().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DataFrame {
    session: SparkSession,
    plan: Arc<Relation>,
}

impl fmt::Debug for DataFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataFrame")
            .field("session_id", &self.session.session_id())
            .field("plan_id", &self.plan_id())
            .finish_non_exhaustive()
    }
}

impl DataFrame {
    pub(crate) fn new(session: SparkSession, plan: Relation) -> Self {
        Self {
            session,
            plan: Arc::new(plan),
        }
    }

    fn input(&self) -> Option<Box<Relation>> {
        Some(Box::new(Relation::clone(&self.plan)))
    }

    fn derive(&self, rel_type: RelType) -> Self {
        self.session.dataframe(rel_type)
    }

    fn plan_id(&self) -> Option<i64> {
        self.plan.common.as_ref().and_then(|c| c.plan_id)
    }

    fn root(&self) -> Plan {
        Plan {
            op_type: Some(proto::plan::OpType::Root(Relation::clone(&self.plan))),
        }
    }

    /// The session this DataFrame runs in.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let spark = df.session();
    /// # }
    /// ```
    pub fn session(&self) -> &SparkSession {
        &self.session
    }

    /// The Spark Connect plan (for inspection or custom relations).
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// assert!(df.relation().rel_type.is_some());
    /// # }
    /// ```
    pub fn relation(&self) -> &Relation {
        &self.plan
    }

    /// A column of *this* DataFrame, unambiguous in joins (`left.col("id")`).
    ///
    /// ```no_run
    /// # fn demo(a: kindling_spark::DataFrame, b: kindling_spark::DataFrame) {
    /// use kindling_spark::JoinType;
    /// let joined = a.join(&b, a.col("id").eq(b.col("id")), JoinType::Inner);
    /// # }
    /// ```
    pub fn col(&self, name: &str) -> Column {
        Column::attribute(name, self.plan_id())
    }

    /// Projects columns or expressions.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::col;
    /// let a = df.select(["id", "name"]);
    /// let b = df.select([col("fare") * 2, col("id")]);
    /// # }
    /// ```
    pub fn select<C: ColumnRef>(&self, columns: impl IntoIterator<Item = C>) -> Self {
        self.derive(RelType::Project(Box::new(proto::Project {
            input: self.input(),
            expressions: columns.into_iter().map(|c| c.to_column().expr).collect(),
        })))
    }

    /// Projects SQL expression strings (`"fare * 2 AS double_fare"`).
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let b = df.select_expr(["id", "fare * 2 AS double_fare"]);
    /// # }
    /// ```
    pub fn select_expr<S: AsRef<str>>(&self, exprs: impl IntoIterator<Item = S>) -> Self {
        self.select(exprs.into_iter().map(|e| crate::functions::expr(e.as_ref())))
    }

    /// Keeps rows where `condition` is true.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::col;
    /// let adults = df.filter(col("age").ge(18));
    /// # }
    /// ```
    pub fn filter(&self, condition: Column) -> Self {
        self.derive(RelType::Filter(Box::new(proto::Filter {
            input: self.input(),
            condition: Some(condition.expr),
        })))
    }

    /// Same as [`DataFrame::filter`].
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let adults = df.r#where(kindling_spark::functions::expr("age >= 18"));
    /// # }
    /// ```
    pub fn r#where(&self, condition: Column) -> Self {
        self.filter(condition)
    }

    /// Adds or replaces one column.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::{col, sqrt};
    /// let df = df.with_column("root", sqrt(col("x")));
    /// # }
    /// ```
    pub fn with_column(&self, name: &str, column: Column) -> Self {
        self.with_columns([(name, column)])
    }

    /// Adds or replaces several columns at once.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::{col, lit};
    /// let df = df.with_columns([("one", lit(1)), ("twice", col("x") * 2)]);
    /// # }
    /// ```
    pub fn with_columns<S: AsRef<str>>(&self, columns: impl IntoIterator<Item = (S, Column)>) -> Self {
        self.derive(RelType::WithColumns(Box::new(proto::WithColumns {
            input: self.input(),
            aliases: columns
                .into_iter()
                .map(|(name, column)| column.into_alias(name.as_ref()))
                .collect(),
        })))
    }

    /// Renames a column (no-op if it does not exist).
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let df = df.with_column_renamed("fare_amount", "fare");
    /// # }
    /// ```
    pub fn with_column_renamed(&self, existing: &str, new: &str) -> Self {
        self.derive(RelType::WithColumnsRenamed(Box::new(proto::WithColumnsRenamed {
            input: self.input(),
            renames: vec![proto::with_columns_renamed::Rename {
                col_name: existing.to_string(),
                new_col_name: new.to_string(),
            }],
            ..Default::default()
        })))
    }

    /// Drops columns by name (unknown names are ignored, as in Spark).
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let df = df.drop(["raw", "debug"]);
    /// # }
    /// ```
    pub fn drop<S: AsRef<str>>(&self, columns: impl IntoIterator<Item = S>) -> Self {
        self.derive(RelType::Drop(Box::new(proto::Drop {
            input: self.input(),
            column_names: columns.into_iter().map(|c| c.as_ref().to_string()).collect(),
            ..Default::default()
        })))
    }

    /// Joins on a boolean condition.
    ///
    /// ```no_run
    /// # fn demo(trips: kindling_spark::DataFrame, zones: kindling_spark::DataFrame) {
    /// use kindling_spark::JoinType;
    /// let df = trips.join(&zones, trips.col("zone").eq(zones.col("id")), JoinType::LeftOuter);
    /// # }
    /// ```
    pub fn join(&self, other: &DataFrame, on: Column, how: JoinType) -> Self {
        self.join_relation(other, Some(on), Vec::new(), how)
    }

    /// Joins on equally named columns, which appear once in the output.
    ///
    /// ```no_run
    /// # fn demo(a: kindling_spark::DataFrame, b: kindling_spark::DataFrame) {
    /// let df = a.join_using(&b, ["id"], kindling_spark::JoinType::Inner);
    /// # }
    /// ```
    pub fn join_using<S: AsRef<str>>(
        &self,
        other: &DataFrame,
        columns: impl IntoIterator<Item = S>,
        how: JoinType,
    ) -> Self {
        let using = columns.into_iter().map(|c| c.as_ref().to_string()).collect();
        self.join_relation(other, None, using, how)
    }

    /// Cartesian product.
    ///
    /// ```no_run
    /// # fn demo(a: kindling_spark::DataFrame, b: kindling_spark::DataFrame) {
    /// let df = a.cross_join(&b);
    /// # }
    /// ```
    pub fn cross_join(&self, other: &DataFrame) -> Self {
        self.join_relation(other, None, Vec::new(), JoinType::Cross)
    }

    fn join_relation(
        &self,
        other: &DataFrame,
        on: Option<Column>,
        using_columns: Vec<String>,
        how: JoinType,
    ) -> Self {
        self.derive(RelType::Join(Box::new(proto::Join {
            left: self.input(),
            right: other.input(),
            join_condition: on.map(|c| c.expr),
            join_type: proto::join::JoinType::from(how) as i32,
            using_columns,
            join_data_type: None,
        })))
    }

    /// Groups rows for aggregation.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::{col, sum};
    /// let totals = df.group_by(["city"]).agg([sum(col("fare")).alias("total")]);
    /// # }
    /// ```
    pub fn group_by<C: ColumnRef>(&self, columns: impl IntoIterator<Item = C>) -> GroupedData {
        GroupedData::new(
            self.clone(),
            columns.into_iter().map(ColumnRef::to_column).collect(),
        )
    }

    /// Aggregates over all rows (a group-by with no keys).
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::{col, max};
    /// let top = df.agg([max(col("fare"))]);
    /// # }
    /// ```
    pub fn agg(&self, aggregates: impl IntoIterator<Item = Column>) -> Self {
        self.group_by(Vec::<Column>::new()).agg(aggregates)
    }

    pub(crate) fn aggregate(&self, keys: Vec<Column>, aggregates: Vec<Column>) -> Self {
        self.derive(RelType::Aggregate(Box::new(proto::Aggregate {
            input: self.input(),
            group_type: proto::aggregate::GroupType::Groupby as i32,
            grouping_expressions: keys.into_iter().map(|c| c.expr).collect(),
            aggregate_expressions: aggregates.into_iter().map(|c| c.expr).collect(),
            ..Default::default()
        })))
    }

    /// Sorts globally; names or columns sort ascending unless `.desc()`.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// use kindling_spark::functions::col;
    /// let df = df.order_by([col("fare").desc(), col("id").asc()]);
    /// # }
    /// ```
    pub fn order_by<C: ColumnRef>(&self, columns: impl IntoIterator<Item = C>) -> Self {
        self.derive(RelType::Sort(Box::new(proto::Sort {
            input: self.input(),
            order: columns
                .into_iter()
                .map(|c| c.to_column().into_sort_order())
                .collect(),
            is_global: Some(true),
        })))
    }

    /// Same as [`DataFrame::order_by`].
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let df = df.sort(["id"]);
    /// # }
    /// ```
    pub fn sort<C: ColumnRef>(&self, columns: impl IntoIterator<Item = C>) -> Self {
        self.order_by(columns)
    }

    /// The first `n` rows.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let head = df.limit(10);
    /// # }
    /// ```
    pub fn limit(&self, n: i32) -> Self {
        self.derive(RelType::Limit(Box::new(proto::Limit {
            input: self.input(),
            limit: n,
        })))
    }

    /// Skips the first `n` rows.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let rest = df.offset(10);
    /// # }
    /// ```
    pub fn offset(&self, n: i32) -> Self {
        self.derive(RelType::Offset(Box::new(proto::Offset {
            input: self.input(),
            offset: n,
        })))
    }

    /// Distinct rows.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let unique = df.distinct();
    /// # }
    /// ```
    pub fn distinct(&self) -> Self {
        self.derive(RelType::Deduplicate(Box::new(proto::Deduplicate {
            input: self.input(),
            all_columns_as_keys: Some(true),
            ..Default::default()
        })))
    }

    /// Keeps the first row per distinct value of `columns`.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let one_per_user = df.drop_duplicates(["user"]);
    /// # }
    /// ```
    pub fn drop_duplicates<S: AsRef<str>>(&self, columns: impl IntoIterator<Item = S>) -> Self {
        self.derive(RelType::Deduplicate(Box::new(proto::Deduplicate {
            input: self.input(),
            column_names: columns.into_iter().map(|c| c.as_ref().to_string()).collect(),
            ..Default::default()
        })))
    }

    fn set_op(
        &self,
        other: &DataFrame,
        op: proto::set_operation::SetOpType,
        all: bool,
        by_name: bool,
    ) -> Self {
        self.derive(RelType::SetOp(Box::new(proto::SetOperation {
            left_input: self.input(),
            right_input: other.input(),
            set_op_type: op as i32,
            is_all: Some(all),
            by_name: Some(by_name),
            allow_missing_columns: Some(false),
        })))
    }

    /// Rows of both, by position, duplicates kept (`UNION ALL`, like PySpark's `union`).
    ///
    /// ```no_run
    /// # fn demo(a: kindling_spark::DataFrame, b: kindling_spark::DataFrame) {
    /// let both = a.union(&b);
    /// # }
    /// ```
    pub fn union(&self, other: &DataFrame) -> Self {
        self.set_op(other, proto::set_operation::SetOpType::Union, true, false)
    }

    /// Rows of both, columns matched by name.
    ///
    /// ```no_run
    /// # fn demo(a: kindling_spark::DataFrame, b: kindling_spark::DataFrame) {
    /// let both = a.union_by_name(&b);
    /// # }
    /// ```
    pub fn union_by_name(&self, other: &DataFrame) -> Self {
        self.set_op(other, proto::set_operation::SetOpType::Union, true, true)
    }

    /// Distinct rows present in both.
    ///
    /// ```no_run
    /// # fn demo(a: kindling_spark::DataFrame, b: kindling_spark::DataFrame) {
    /// let common = a.intersect(&b);
    /// # }
    /// ```
    pub fn intersect(&self, other: &DataFrame) -> Self {
        self.set_op(other, proto::set_operation::SetOpType::Intersect, false, false)
    }

    /// Distinct rows of `self` not in `other` (`EXCEPT`).
    ///
    /// ```no_run
    /// # fn demo(a: kindling_spark::DataFrame, b: kindling_spark::DataFrame) {
    /// let only_a = a.subtract(&b);
    /// # }
    /// ```
    pub fn subtract(&self, other: &DataFrame) -> Self {
        self.set_op(other, proto::set_operation::SetOpType::Except, false, false)
    }

    /// Round-robin shuffle into `n` partitions.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let df = df.repartition(8);
    /// # }
    /// ```
    pub fn repartition(&self, n: i32) -> Self {
        self.derive(RelType::Repartition(Box::new(proto::Repartition {
            input: self.input(),
            num_partitions: n,
            shuffle: Some(true),
        })))
    }

    /// Hash-partitions by `columns` (into `n` partitions, or the session default).
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let df = df.repartition_by(Some(4), ["user"]);
    /// # }
    /// ```
    pub fn repartition_by<C: ColumnRef>(&self, n: Option<i32>, columns: impl IntoIterator<Item = C>) -> Self {
        self.derive(RelType::RepartitionByExpression(Box::new(
            proto::RepartitionByExpression {
                input: self.input(),
                partition_exprs: columns.into_iter().map(|c| c.to_column().expr).collect(),
                num_partitions: n,
            },
        )))
    }

    /// Merges down to `n` partitions without a shuffle.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let df = df.coalesce(1);
    /// # }
    /// ```
    pub fn coalesce(&self, n: i32) -> Self {
        self.derive(RelType::Repartition(Box::new(proto::Repartition {
            input: self.input(),
            num_partitions: n,
            shuffle: Some(false),
        })))
    }

    /// `sort`: Spark sorts each partition before sampling (`deterministic_order`).
    fn sample_bounds(&self, lower: f64, upper: f64, with_replacement: bool, seed: i64, sort: bool) -> Self {
        self.derive(RelType::Sample(Box::new(proto::Sample {
            input: self.input(),
            lower_bound: lower,
            upper_bound: upper,
            with_replacement: Some(with_replacement),
            seed: Some(seed),
            deterministic_order: sort,
        })))
    }

    /// A Bernoulli sample of about `fraction` of the rows; the same seed and input
    /// partitioning give the same rows.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let tenth = df.sample(0.1, 42);
    /// # }
    /// ```
    pub fn sample(&self, fraction: f64, seed: i64) -> Self {
        self.sample_bounds(0.0, fraction, false, seed, true)
    }

    /// A Poisson sample with replacement, `fraction` = expected times each row is drawn.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) {
    /// let boot = df.sample_with_replacement(1.0, 7);
    /// # }
    /// ```
    pub fn sample_with_replacement(&self, fraction: f64, seed: i64) -> Self {
        self.sample_bounds(0.0, fraction, true, seed, true)
    }

    /// Splits rows by (normalised) `weights`: disjoint, covering every row once,
    /// and deterministic for a seed and input partitioning.
    ///
    /// ```no_run
    /// # fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let splits = df.random_split(&[0.8, 0.2], 42)?;
    /// let (train, test) = (&splits[0], &splits[1]);
    /// # Ok(()) }
    /// ```
    pub fn random_split(&self, weights: &[f64], seed: i64) -> Result<Vec<DataFrame>> {
        self.split_by_weights(weights, seed, true)
    }

    /// [`random_split`](Self::random_split) without its sort: Spark sorts each
    /// partition by every column before splitting so the split is deterministic
    /// whatever order the input's rows arrive in — which also leaves each split
    /// ordered by its first column, bad for training on it in order. This
    /// keeps the input's row order, and is deterministic when the input's
    /// partitioning and order are: a persisted DataFrame, a table, files.
    ///
    /// ```no_run
    /// # async fn demo(df: kindling_spark::DataFrame) -> Result<(), kindling_spark::Error> {
    /// let cached = df.persist(kindling_spark::memory_and_disk()).await?;
    /// let splits = cached.random_split_in_order(&[0.8, 0.2], 42)?;
    /// # Ok(()) }
    /// ```
    pub fn random_split_in_order(&self, weights: &[f64], seed: i64) -> Result<Vec<DataFrame>> {
        self.split_by_weights(weights, seed, false)
    }

    fn split_by_weights(&self, weights: &[f64], seed: i64, sort: bool) -> Result<Vec<DataFrame>> {
        if weights.is_empty() || weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
            return Err(Error::InvalidArgument(
                "random_split weights must be non-negative and finite".into(),
            ));
        }
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return Err(Error::InvalidArgument(
                "random_split weights must sum to more than 0".into(),
            ));
        }
        let mut bounds = Vec::with_capacity(weights.len() + 1);
        bounds.push(0.0);
        let mut acc = 0.0;
        for w in weights {
            acc += w / total;
            bounds.push(acc);
        }
        // Make the last bound exactly 1 so no row falls off the end by rounding.
        if let Some(last) = bounds.last_mut() {
            *last = 1.0;
        }
        Ok(bounds
            .windows(2)
            .map(|b| self.sample_bounds(b[0], b[1], false, seed, sort))
            .collect())
    }
}
