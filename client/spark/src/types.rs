//! Spark SQL types ⇄ Arrow types: analyzed schemas to Arrow, Arrow types to Spark DDL.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, TimeUnit};
use spark_connect_proto::data_type::Kind;

use crate::error::{Error, Result};

/// Converts Spark's analyzed schema (a struct `DataType`) to an Arrow schema,
/// using the same mapping Spark uses when it sends Arrow batches.
pub(crate) fn spark_to_arrow_schema(data_type: &spark_connect_proto::DataType) -> Result<Schema> {
    match &data_type.kind {
        Some(Kind::Struct(st)) => Ok(Schema::new(struct_fields(st)?)),
        _ => Ok(Schema::new(vec![Field::new(
            "value",
            spark_to_arrow(data_type)?,
            true,
        )])),
    }
}

fn struct_fields(st: &spark_connect_proto::data_type::Struct) -> Result<Fields> {
    st.fields
        .iter()
        .map(|f| {
            let dt = f
                .data_type
                .as_ref()
                .ok_or_else(|| Error::Protocol(format!("field `{}` has no type", f.name)))?;
            Ok(Field::new(&f.name, spark_to_arrow(dt)?, f.nullable))
        })
        .collect()
}

fn spark_to_arrow(data_type: &spark_connect_proto::DataType) -> Result<DataType> {
    let kind = data_type
        .kind
        .as_ref()
        .ok_or_else(|| Error::Protocol("a data type without a kind".into()))?;
    Ok(match kind {
        Kind::Null(_) => DataType::Null,
        Kind::Binary(_) => DataType::Binary,
        Kind::Boolean(_) => DataType::Boolean,
        Kind::Byte(_) => DataType::Int8,
        Kind::Short(_) => DataType::Int16,
        Kind::Integer(_) => DataType::Int32,
        Kind::Long(_) => DataType::Int64,
        Kind::Float(_) => DataType::Float32,
        Kind::Double(_) => DataType::Float64,
        Kind::Decimal(d) => {
            let precision = d.precision.unwrap_or(10).clamp(1, 38);
            let scale = d.scale.unwrap_or(0);
            DataType::Decimal128(
                u8::try_from(precision).unwrap_or(38),
                i8::try_from(scale).unwrap_or(0),
            )
        }
        Kind::String(_) | Kind::Char(_) | Kind::VarChar(_) => DataType::Utf8,
        Kind::Date(_) => DataType::Date32,
        Kind::Timestamp(_) => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        Kind::TimestampNtz(_) => DataType::Timestamp(TimeUnit::Microsecond, None),
        Kind::Array(a) => {
            let element = a
                .element_type
                .as_deref()
                .ok_or_else(|| Error::Protocol("array without element type".into()))?;
            DataType::List(Arc::new(Field::new(
                "element",
                spark_to_arrow(element)?,
                a.contains_null,
            )))
        }
        Kind::Struct(st) => DataType::Struct(struct_fields(st)?),
        Kind::Map(m) => {
            let (Some(key), Some(value)) = (m.key_type.as_deref(), m.value_type.as_deref()) else {
                return Err(Error::Protocol("map without key or value type".into()));
            };
            let entries = Field::new(
                "entries",
                DataType::Struct(Fields::from(vec![
                    Field::new("key", spark_to_arrow(key)?, false),
                    Field::new("value", spark_to_arrow(value)?, m.value_contains_null),
                ])),
                false,
            );
            DataType::Map(Arc::new(entries), false)
        }
        other => {
            return Err(Error::Protocol(format!(
                "Spark type {other:?} has no Arrow equivalent in this client"
            )));
        }
    })
}

/// Spark DDL for an Arrow type (`BIGINT`, `ARRAY<DOUBLE>`, `DECIMAL(10,2)`, ...).
///
/// ```
/// use arrow::datatypes::DataType;
/// assert_eq!(kindling_spark::arrow_to_ddl(&DataType::Float64)?, "DOUBLE");
/// # Ok::<(), kindling_spark::Error>(())
/// ```
pub fn arrow_to_ddl(data_type: &DataType) -> Result<String> {
    Ok(match data_type {
        DataType::Null => "VOID".into(),
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "STRING".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "BINARY".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP_NTZ".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p},{s})"),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            format!("ARRAY<{}>", arrow_to_ddl(f.data_type())?)
        }
        DataType::Struct(fields) => format!("STRUCT<{}>", fields_ddl(fields, ": ")?),
        other => {
            return Err(Error::InvalidArgument(format!(
                "Arrow type {other} has no Spark SQL equivalent"
            )));
        }
    })
}

/// Spark DDL for a whole schema: `` `a` BIGINT, `b` STRING ``.
///
/// ```
/// use arrow::datatypes::{DataType, Field, Schema};
/// let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
/// assert_eq!(kindling_spark::schema_to_ddl(&schema)?, "`id` BIGINT NOT NULL");
/// # Ok::<(), kindling_spark::Error>(())
/// ```
pub fn schema_to_ddl(schema: &Schema) -> Result<String> {
    fields_ddl(schema.fields(), " ")
}

fn fields_ddl(fields: &Fields, separator: &str) -> Result<String> {
    let parts = fields
        .iter()
        .map(|f| {
            let not_null = if f.is_nullable() { "" } else { " NOT NULL" };
            Ok(format!(
                "`{}`{separator}{}{not_null}",
                f.name().replace('`', "``"),
                arrow_to_ddl(f.data_type())?
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(parts.join(", "))
}
