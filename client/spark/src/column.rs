//! `Column`: an unresolved Spark expression with PySpark-style operators.

use std::ops;

use spark_connect_proto::Expression;
use spark_connect_proto::expression::{
    self, Alias, Cast, ExprType, Literal, SortOrder, UnresolvedAttribute, UnresolvedFunction,
    cast::CastToType, literal::LiteralType, sort_order,
};

use crate::error::Result;
use crate::types::arrow_to_ddl;

/// A column expression, resolved by Spark when the plan runs.
///
/// Build one with [`functions::col`](crate::functions::col), [`lit`](crate::functions::lit)
/// or [`expr`](crate::functions::expr), then combine with operators (`+ - * / % -x !x & |`)
/// and methods (`eq`, `gt`, `cast`, `alias`, `is_null`, ...). Plain Rust values on the
/// right-hand side of an operator are literals, as in PySpark.
///
/// ```
/// use kindling_spark::functions::{col, lit, when};
/// let fare_per_km = (col("fare") / col("km")).alias("fare_per_km");
/// let is_long = col("km").gt(10).and(col("fare").is_not_null());
/// let bucket = when(col("km").lt(2), lit("short")).otherwise(lit("long"));
/// # let _ = (fare_per_km, is_long, bucket);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub(crate) expr: Expression,
}

impl Column {
    pub(crate) fn from_type(expr_type: ExprType) -> Self {
        Self {
            expr: Expression {
                expr_type: Some(expr_type),
                ..Default::default()
            },
        }
    }

    /// A column by (possibly dotted or back-quoted) name; `plan_id` pins it to one DataFrame.
    pub(crate) fn attribute(name: &str, plan_id: Option<i64>) -> Self {
        Self::from_type(ExprType::UnresolvedAttribute(UnresolvedAttribute {
            unparsed_identifier: name.to_string(),
            plan_id,
            ..Default::default()
        }))
    }

    pub(crate) fn literal(literal_type: LiteralType) -> Self {
        Self::from_type(ExprType::Literal(Literal {
            literal_type: Some(literal_type),
            ..Default::default()
        }))
    }

    /// Calls the Spark SQL function `name` (built-in or registered) on `args`.
    ///
    /// ```
    /// use kindling_spark::{Column, functions::col};
    /// let c = Column::call("atan2", [col("y"), col("x")]);
    /// # let _ = c;
    /// ```
    pub fn call(name: &str, args: impl IntoIterator<Item = Column>) -> Self {
        Self::from_type(ExprType::UnresolvedFunction(UnresolvedFunction {
            function_name: name.to_string(),
            arguments: args.into_iter().map(|c| c.expr).collect(),
            ..Default::default()
        }))
    }

    pub(crate) fn call_distinct(name: &str, args: impl IntoIterator<Item = Column>) -> Self {
        let mut column = Self::call(name, args);
        if let Some(ExprType::UnresolvedFunction(f)) = column.expr.expr_type.as_mut() {
            f.is_distinct = true;
        }
        column
    }

    fn binary(self, op: &str, other: impl Into<Column>) -> Self {
        Self::call(op, [self, other.into()])
    }

    /// The underlying Spark Connect expression.
    ///
    /// ```
    /// let proto = kindling_spark::functions::col("a").into_expression();
    /// assert!(proto.expr_type.is_some());
    /// ```
    pub fn into_expression(self) -> Expression {
        self.expr
    }

    /// Renames the result (`AS name`).
    ///
    /// ```
    /// let c = kindling_spark::functions::col("a").alias("b");
    /// # let _ = c;
    /// ```
    pub fn alias(self, name: &str) -> Self {
        Self::from_type(ExprType::Alias(Box::new(Alias {
            expr: Some(Box::new(self.expr)),
            name: vec![name.to_string()],
            metadata: None,
        })))
    }

    /// Same as [`Column::alias`].
    ///
    /// ```
    /// let c = kindling_spark::functions::col("a").name("b");
    /// # let _ = c;
    /// ```
    pub fn name(self, name: &str) -> Self {
        self.alias(name)
    }

    /// Casts to a Spark SQL type given as DDL: `"double"`, `"int"`, `"decimal(10,2)"`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("age").cast("double");
    /// # let _ = c;
    /// ```
    pub fn cast(self, ddl_type: &str) -> Self {
        Self::from_type(ExprType::Cast(Box::new(Cast {
            expr: Some(Box::new(self.expr)),
            cast_to_type: Some(CastToType::TypeStr(ddl_type.to_string())),
            ..Default::default()
        })))
    }

    /// Casts to the Spark type matching an Arrow type.
    ///
    /// ```
    /// use arrow::datatypes::DataType;
    /// let c = kindling_spark::functions::col("x").cast_to(&DataType::Float32)?;
    /// # let _ = c; Ok::<(), kindling_spark::Error>(())
    /// ```
    pub fn cast_to(self, data_type: &arrow::datatypes::DataType) -> Result<Self> {
        Ok(self.cast(&arrow_to_ddl(data_type)?))
    }

    /// `self = other` (SQL equality; null if either side is null).
    ///
    /// ```
    /// let c = kindling_spark::functions::col("city").eq("Paris");
    /// # let _ = c;
    /// ```
    pub fn eq(self, other: impl Into<Column>) -> Self {
        self.binary("==", other)
    }

    /// `self <> other`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").neq(0);
    /// # let _ = c;
    /// ```
    pub fn neq(self, other: impl Into<Column>) -> Self {
        !self.eq(other)
    }

    /// Null-safe equality `self <=> other`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("a").eq_null_safe(kindling_spark::functions::col("b"));
    /// # let _ = c;
    /// ```
    pub fn eq_null_safe(self, other: impl Into<Column>) -> Self {
        self.binary("<=>", other)
    }

    /// `self > other`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").gt(1);
    /// # let _ = c;
    /// ```
    pub fn gt(self, other: impl Into<Column>) -> Self {
        self.binary(">", other)
    }

    /// `self >= other`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").ge(1);
    /// # let _ = c;
    /// ```
    pub fn ge(self, other: impl Into<Column>) -> Self {
        self.binary(">=", other)
    }

    /// `self < other`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").lt(1);
    /// # let _ = c;
    /// ```
    pub fn lt(self, other: impl Into<Column>) -> Self {
        self.binary("<", other)
    }

    /// `self <= other`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").le(1);
    /// # let _ = c;
    /// ```
    pub fn le(self, other: impl Into<Column>) -> Self {
        self.binary("<=", other)
    }

    /// `lower <= self AND self <= upper`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").between(1, 5);
    /// # let _ = c;
    /// ```
    pub fn between(self, lower: impl Into<Column>, upper: impl Into<Column>) -> Self {
        self.clone().ge(lower).and(self.le(upper))
    }

    /// Logical `AND` (also `a & b`).
    ///
    /// ```
    /// use kindling_spark::functions::col;
    /// let c = col("a").gt(1).and(col("b").lt(2));
    /// # let _ = c;
    /// ```
    pub fn and(self, other: impl Into<Column>) -> Self {
        self.binary("and", other)
    }

    /// Logical `OR` (also `a | b`).
    ///
    /// ```
    /// use kindling_spark::functions::col;
    /// let c = col("a").gt(1).or(col("b").lt(2));
    /// # let _ = c;
    /// ```
    pub fn or(self, other: impl Into<Column>) -> Self {
        self.binary("or", other)
    }

    /// `self IS NULL`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("a").is_null();
    /// # let _ = c;
    /// ```
    pub fn is_null(self) -> Self {
        Self::call("isnull", [self])
    }

    /// `self IS NOT NULL`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("a").is_not_null();
    /// # let _ = c;
    /// ```
    pub fn is_not_null(self) -> Self {
        Self::call("isnotnull", [self])
    }

    /// `self IS NaN`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("x").is_nan();
    /// # let _ = c;
    /// ```
    pub fn is_nan(self) -> Self {
        Self::call("isnan", [self])
    }

    /// `self IN (values...)`.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").is_in([1, 2, 3]);
    /// # let _ = c;
    /// ```
    pub fn is_in<T: Into<Column>>(self, values: impl IntoIterator<Item = T>) -> Self {
        Self::call(
            "in",
            std::iter::once(self).chain(values.into_iter().map(Into::into)),
        )
    }

    /// SQL `LIKE` pattern match.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("name").like("A%");
    /// # let _ = c;
    /// ```
    pub fn like(self, pattern: &str) -> Self {
        self.binary("like", pattern)
    }

    /// Regular-expression match (`RLIKE`).
    ///
    /// ```
    /// let c = kindling_spark::functions::col("name").rlike("^A.*");
    /// # let _ = c;
    /// ```
    pub fn rlike(self, pattern: &str) -> Self {
        self.binary("rlike", pattern)
    }

    /// Substring from 1-based `start`, `len` characters.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("zip").substr(1, 2);
    /// # let _ = c;
    /// ```
    pub fn substr(self, start: i32, len: i32) -> Self {
        Self::call("substr", [self, start.into(), len.into()])
    }

    /// Adds a `WHEN condition THEN value` branch to a [`when`](crate::functions::when) column.
    ///
    /// ```
    /// use kindling_spark::functions::{col, lit, when};
    /// let c = when(col("x").lt(0), lit(-1)).when(col("x").gt(0), lit(1)).otherwise(lit(0));
    /// # let _ = c;
    /// ```
    pub fn when(mut self, condition: Column, value: impl Into<Column>) -> Self {
        if let Some(ExprType::UnresolvedFunction(f)) = self.expr.expr_type.as_mut()
            && f.function_name == "when"
            && f.arguments.len() % 2 == 0
        {
            f.arguments.push(condition.expr);
            f.arguments.push(value.into().expr);
            return self;
        }
        // Not a `when` chain (or already closed): start a fresh CASE.
        Self::call("when", [condition, value.into()])
    }

    /// The `ELSE` value of a [`when`](crate::functions::when) column.
    ///
    /// ```
    /// use kindling_spark::functions::{col, lit, when};
    /// let c = when(col("x").is_null(), lit(0)).otherwise(col("x"));
    /// # let _ = c;
    /// ```
    pub fn otherwise(mut self, value: impl Into<Column>) -> Self {
        if let Some(ExprType::UnresolvedFunction(f)) = self.expr.expr_type.as_mut()
            && f.function_name == "when"
            && f.arguments.len() % 2 == 0
        {
            f.arguments.push(value.into().expr);
        }
        self
    }

    fn sort(self, direction: sort_order::SortDirection, nulls: sort_order::NullOrdering) -> Self {
        Self::from_type(ExprType::SortOrder(Box::new(SortOrder {
            child: Some(Box::new(self.expr)),
            direction: direction as i32,
            null_ordering: nulls as i32,
        })))
    }

    /// Ascending sort key, nulls first (Spark's default).
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").asc();
    /// # let _ = c;
    /// ```
    pub fn asc(self) -> Self {
        self.sort(
            sort_order::SortDirection::Ascending,
            sort_order::NullOrdering::SortNullsFirst,
        )
    }

    /// Ascending sort key, nulls last.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").asc_nulls_last();
    /// # let _ = c;
    /// ```
    pub fn asc_nulls_last(self) -> Self {
        self.sort(
            sort_order::SortDirection::Ascending,
            sort_order::NullOrdering::SortNullsLast,
        )
    }

    /// Descending sort key, nulls last (Spark's default).
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").desc();
    /// # let _ = c;
    /// ```
    pub fn desc(self) -> Self {
        self.sort(
            sort_order::SortDirection::Descending,
            sort_order::NullOrdering::SortNullsLast,
        )
    }

    /// Descending sort key, nulls first.
    ///
    /// ```
    /// let c = kindling_spark::functions::col("n").desc_nulls_first();
    /// # let _ = c;
    /// ```
    pub fn desc_nulls_first(self) -> Self {
        self.sort(
            sort_order::SortDirection::Descending,
            sort_order::NullOrdering::SortNullsFirst,
        )
    }

    pub(crate) fn into_sort_order(self) -> SortOrder {
        match self.expr.expr_type {
            Some(ExprType::SortOrder(order)) => *order,
            _ => SortOrder {
                child: Some(Box::new(self.expr)),
                direction: sort_order::SortDirection::Ascending as i32,
                null_ordering: sort_order::NullOrdering::SortNullsFirst as i32,
            },
        }
    }

    /// The name Spark would give an `Alias` of this column in `with_columns`.
    pub(crate) fn into_alias(self, name: &str) -> Alias {
        Alias {
            expr: Some(Box::new(self.expr)),
            name: vec![name.to_string()],
            metadata: None,
        }
    }
}

/// Something that names a column: a [`Column`], or a column name (`&str`, `String`).
///
/// Used by `select`, `group_by`, `order_by`, ... where PySpark accepts `"name"` or `col(...)`.
///
/// ```
/// use kindling_spark::{ColumnRef, functions::col};
/// let by_name = "fare".to_column();
/// assert_eq!(by_name, col("fare"));
/// ```
pub trait ColumnRef {
    /// The column this refers to.
    fn to_column(self) -> Column;
}

impl ColumnRef for Column {
    fn to_column(self) -> Column {
        self
    }
}

impl ColumnRef for &Column {
    fn to_column(self) -> Column {
        self.clone()
    }
}

impl ColumnRef for &str {
    fn to_column(self) -> Column {
        if self == "*" {
            Column::from_type(ExprType::UnresolvedStar(expression::UnresolvedStar::default()))
        } else {
            Column::attribute(self, None)
        }
    }
}

impl ColumnRef for String {
    fn to_column(self) -> Column {
        self.as_str().to_column()
    }
}

impl ColumnRef for &String {
    fn to_column(self) -> Column {
        self.as_str().to_column()
    }
}

macro_rules! literal_from {
    ($($t:ty => $variant:ident as $target:ty),* $(,)?) => {$(
        impl From<$t> for Column {
            fn from(value: $t) -> Self {
                Column::literal(LiteralType::$variant(<$target>::from(value)))
            }
        }
    )*};
}

literal_from!(
    bool => Boolean as bool,
    i8 => Byte as i32,
    i16 => Short as i32,
    i32 => Integer as i32,
    i64 => Long as i64,
    f32 => Float as f32,
    f64 => Double as f64,
    &str => String as String,
    String => String as String,
);

impl From<&Column> for Column {
    fn from(value: &Column) -> Self {
        value.clone()
    }
}

macro_rules! binary_op {
    ($($trait:ident $method:ident $fun:literal),* $(,)?) => {$(
        impl<T: Into<Column>> ops::$trait<T> for Column {
            type Output = Column;
            fn $method(self, rhs: T) -> Column {
                self.binary($fun, rhs)
            }
        }
    )*};
}

binary_op!(
    Add add "+",
    Sub sub "-",
    Mul mul "*",
    Div div "/",
    Rem rem "%",
    BitAnd bitand "and",
    BitOr bitor "or",
);

impl ops::Neg for Column {
    type Output = Column;
    fn neg(self) -> Column {
        Column::call("negative", [self])
    }
}

impl ops::Not for Column {
    type Output = Column;
    fn not(self) -> Column {
        Column::call("not", [self])
    }
}
