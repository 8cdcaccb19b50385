//! Spark SQL functions for ETL, named as in `pyspark.sql.functions`.
//!
//! ```
//! use kindling_spark::functions::*;
//! let features = [
//!     (col("fare") / col("km")).alias("fare_per_km"),
//!     log(col("km") + 1).alias("log_km"),
//!     coalesce([col("tip"), lit(0.0)]).alias("tip"),
//!     when(col("km").gt(10), lit(1)).otherwise(lit(0)).alias("long_trip"),
//! ];
//! let stats = [mean(col("fare")), stddev(col("fare")), count(col("*"))];
//! # let _ = (features, stats);
//! ```

use spark_connect_proto::expression::{ExprType, ExpressionString};

use crate::column::{Column, ColumnRef};

/// A column by name (`"a"`, `"t.a"`, `` "`odd name`" ``, `"*"`).
///
/// ```
/// let c = kindling_spark::functions::col("fare");
/// # let _ = c;
/// ```
pub fn col(name: &str) -> Column {
    name.to_column()
}

/// Alias of [`col`].
///
/// ```
/// let c = kindling_spark::functions::column("fare");
/// # let _ = c;
/// ```
pub fn column(name: &str) -> Column {
    col(name)
}

/// A literal value (`bool`, integers, floats, strings).
///
/// ```
/// let c = kindling_spark::functions::lit(0.5);
/// # let _ = c;
/// ```
pub fn lit(value: impl Into<Column>) -> Column {
    value.into()
}

/// A typed SQL `NULL`, e.g. `null("double")`.
///
/// ```
/// let c = kindling_spark::functions::null("double");
/// # let _ = c;
/// ```
pub fn null(ddl_type: &str) -> Column {
    expr("NULL").cast(ddl_type)
}

/// A SQL expression string parsed by Spark (`"fare * 2 AS double_fare"`).
///
/// ```
/// let c = kindling_spark::functions::expr("upper(name) AS name");
/// # let _ = c;
/// ```
pub fn expr(sql: &str) -> Column {
    Column::from_type(ExprType::ExpressionString(ExpressionString {
        expression: sql.to_string(),
    }))
}

/// `CASE WHEN condition THEN value`; chain [`Column::when`] and [`Column::otherwise`].
///
/// ```
/// use kindling_spark::functions::{col, lit, when};
/// let c = when(col("x").gt(0), lit("pos")).otherwise(lit("non-pos"));
/// # let _ = c;
/// ```
pub fn when(condition: Column, value: impl Into<Column>) -> Column {
    Column::call("when", [condition, value.into()])
}

/// First non-null argument.
///
/// ```
/// use kindling_spark::functions::{coalesce, col, lit};
/// let c = coalesce([col("a"), col("b"), lit(0)]);
/// # let _ = c;
/// ```
pub fn coalesce(columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call("coalesce", columns)
}

/// `count(DISTINCT ...)`.
///
/// ```
/// use kindling_spark::functions::{col, count_distinct};
/// let c = count_distinct([col("user")]);
/// # let _ = c;
/// ```
pub fn count_distinct(columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call_distinct("count", columns)
}

/// Natural logarithm (PySpark's one-argument `log`).
///
/// ```
/// let c = kindling_spark::functions::log(kindling_spark::functions::col("x"));
/// # let _ = c;
/// ```
pub fn log(column: impl Into<Column>) -> Column {
    Column::call("ln", [column.into()])
}

/// Logarithm in `base`.
///
/// ```
/// let c = kindling_spark::functions::log_base(2.0, kindling_spark::functions::col("x"));
/// # let _ = c;
/// ```
pub fn log_base(base: f64, column: impl Into<Column>) -> Column {
    Column::call("log", [base.into(), column.into()])
}

/// `base ^ exponent`.
///
/// ```
/// use kindling_spark::functions::{col, pow};
/// let c = pow(col("x"), 2);
/// # let _ = c;
/// ```
pub fn pow(base: impl Into<Column>, exponent: impl Into<Column>) -> Column {
    Column::call("power", [base.into(), exponent.into()])
}

/// Rounds half up to `scale` decimal places.
///
/// ```
/// use kindling_spark::functions::{col, round};
/// let c = round(col("x"), 2);
/// # let _ = c;
/// ```
pub fn round(column: impl Into<Column>, scale: i32) -> Column {
    Column::call("round", [column.into(), scale.into()])
}

/// Concatenates with a separator.
///
/// ```
/// use kindling_spark::functions::{col, concat_ws};
/// let c = concat_ws("-", [col("a"), col("b")]);
/// # let _ = c;
/// ```
pub fn concat_ws(separator: &str, columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call("concat_ws", std::iter::once(lit(separator)).chain(columns))
}

/// Replaces every match of a Java regex.
///
/// ```
/// use kindling_spark::functions::{col, regexp_replace};
/// let c = regexp_replace(col("s"), "[0-9]+", "#");
/// # let _ = c;
/// ```
pub fn regexp_replace(column: impl Into<Column>, pattern: &str, replacement: &str) -> Column {
    Column::call("regexp_replace", [column.into(), lit(pattern), lit(replacement)])
}

/// Splits a string on a Java regex.
///
/// ```
/// use kindling_spark::functions::{col, split};
/// let c = split(col("tags"), ",");
/// # let _ = c;
/// ```
pub fn split(column: impl Into<Column>, pattern: &str) -> Column {
    Column::call("split", [column.into(), lit(pattern)])
}

/// Parses a date with a Spark datetime pattern.
///
/// ```
/// use kindling_spark::functions::{col, to_date};
/// let c = to_date(col("day"), "yyyy-MM-dd");
/// # let _ = c;
/// ```
pub fn to_date(column: impl Into<Column>, format: &str) -> Column {
    Column::call("to_date", [column.into(), lit(format)])
}

/// Parses a timestamp with a Spark datetime pattern.
///
/// ```
/// use kindling_spark::functions::{col, to_timestamp};
/// let c = to_timestamp(col("ts"), "yyyy-MM-dd HH:mm:ss");
/// # let _ = c;
/// ```
pub fn to_timestamp(column: impl Into<Column>, format: &str) -> Column {
    Column::call("to_timestamp", [column.into(), lit(format)])
}

/// Uniform random in [0, 1), reproducible for a seed and partitioning.
///
/// ```
/// let c = kindling_spark::functions::rand(42);
/// # let _ = c;
/// ```
pub fn rand(seed: i64) -> Column {
    Column::call("rand", [seed.into()])
}

/// Standard normal random, reproducible for a seed and partitioning.
///
/// ```
/// let c = kindling_spark::functions::randn(42);
/// # let _ = c;
/// ```
pub fn randn(seed: i64) -> Column {
    Column::call("randn", [seed.into()])
}

/// A unique, increasing (not consecutive) 64-bit id per row.
///
/// ```
/// let c = kindling_spark::functions::monotonically_increasing_id();
/// # let _ = c;
/// ```
pub fn monotonically_increasing_id() -> Column {
    Column::call("monotonically_increasing_id", [])
}

macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident => $fun:literal;)*) => {$(
        $(#[$doc])*
        #[doc = ""]
        #[doc = "```"]
        #[doc = concat!("let c = kindling_spark::functions::", stringify!($name), "(kindling_spark::functions::col(\"x\"));")]
        #[doc = "# let _ = c;"]
        #[doc = "```"]
        pub fn $name(column: impl Into<Column>) -> Column {
            Column::call($fun, [column.into()])
        }
    )*};
}

unary! {
    /// Square root.
    sqrt => "sqrt";
    /// Base-10 logarithm.
    log10 => "log10";
    /// `ln(1 + x)`.
    log1p => "log1p";
    /// `e ^ x`.
    exp => "exp";
    /// Absolute value.
    abs => "abs";
    /// Round down.
    floor => "floor";
    /// Round up.
    ceil => "ceil";
    /// Sign (-1, 0, 1).
    signum => "signum";
    /// Mean (aggregate).
    mean => "avg";
    /// Mean (aggregate).
    avg => "avg";
    /// Sample standard deviation (aggregate).
    stddev => "stddev";
    /// Population standard deviation (aggregate).
    stddev_pop => "stddev_pop";
    /// Sample variance (aggregate).
    variance => "variance";
    /// Minimum (aggregate).
    min => "min";
    /// Maximum (aggregate).
    max => "max";
    /// Sum (aggregate).
    sum => "sum";
    /// Number of non-null values; `count(col("*"))` counts rows (aggregate).
    count => "count";
    /// First value in the group (aggregate).
    first => "first";
    /// Last value in the group (aggregate).
    last => "last";
    /// Values of the group as an array (aggregate).
    collect_list => "collect_list";
    /// Approximate distinct count (aggregate).
    approx_count_distinct => "approx_count_distinct";
    /// Upper case.
    upper => "upper";
    /// Lower case.
    lower => "lower";
    /// Trim spaces both sides.
    trim => "trim";
    /// String length in characters.
    length => "length";
    /// `true` if null.
    isnull => "isnull";
    /// `true` if NaN.
    isnan => "isnan";
    /// Year of a date/timestamp.
    year => "year";
    /// Month of a date/timestamp.
    month => "month";
    /// Day of month.
    dayofmonth => "dayofmonth";
    /// Day of week (1 = Sunday).
    dayofweek => "dayofweek";
    /// Hour of a timestamp.
    hour => "hour";
    /// Murmur3 hash.
    hash => "hash";
    /// MD5 hex digest.
    md5 => "md5";
    /// One row per array element.
    explode => "explode";
}

/// Concatenates strings (null if any input is null).
///
/// ```
/// use kindling_spark::functions::{col, concat};
/// let c = concat([col("a"), col("b")]);
/// # let _ = c;
/// ```
pub fn concat(columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call("concat", columns)
}

/// Largest of the arguments, skipping nulls.
///
/// ```
/// use kindling_spark::functions::{col, greatest};
/// let c = greatest([col("a"), col("b")]);
/// # let _ = c;
/// ```
pub fn greatest(columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call("greatest", columns)
}

/// Smallest of the arguments, skipping nulls.
///
/// ```
/// use kindling_spark::functions::{col, least};
/// let c = least([col("a"), col("b")]);
/// # let _ = c;
/// ```
pub fn least(columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call("least", columns)
}

/// `a` unless it is NaN, else `b`.
///
/// ```
/// use kindling_spark::functions::{col, lit, nanvl};
/// let c = nanvl(col("x"), lit(0.0));
/// # let _ = c;
/// ```
pub fn nanvl(a: impl Into<Column>, b: impl Into<Column>) -> Column {
    Column::call("nanvl", [a.into(), b.into()])
}

/// Array of the arguments.
///
/// ```
/// use kindling_spark::functions::{array, col};
/// let c = array([col("x1"), col("x2")]);
/// # let _ = c;
/// ```
pub fn array(columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call("array", columns)
}

/// Struct of the arguments.
///
/// ```
/// use kindling_spark::functions::{col, struct_};
/// let c = struct_([col("x1"), col("x2")]);
/// # let _ = c;
/// ```
pub fn struct_(columns: impl IntoIterator<Item = Column>) -> Column {
    Column::call("struct", columns)
}
