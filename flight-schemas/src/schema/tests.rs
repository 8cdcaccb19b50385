use std::sync::Arc;

use arrow::array::{FixedSizeListArray, Float32Array, Float64Array, Int32Array};
use arrow::datatypes::Field;

use super::*;
use crate::spec::Task;

fn spec(features: &[&str]) -> JobSpec {
    JobSpec::builder()
        .task(Task::Classification { num_classes: 3 })
        .features(features.iter().copied())
        .label("y")
        .build()
        .expect("valid")
}

fn fsl_field(name: &str, len: i32) -> Field {
    Field::new(
        name,
        DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), len),
        true,
    )
}

#[test]
fn layout_concatenates_scalars_and_vectors() {
    let schema = Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        fsl_field("emb", 4),
        Field::new("y", DataType::Int32, true),
        Field::new("b", DataType::Float32, false),
    ]);
    let layout = validate(&schema, &spec(&["a", "emb", "b"]), StreamKind::Train).expect("valid");
    assert_eq!(layout.input_dim, 6);
    assert_eq!(
        layout.features.iter().map(|f| f.offset).collect::<Vec<_>>(),
        vec![0, 1, 5]
    );
    assert_eq!(layout.label, Some(DataType::Int32));
}

#[test]
fn schema_errors_name_the_column() {
    let s = spec(&["a"]);
    let cases = [
        (Schema::new(vec![Field::new("y", DataType::Int32, true)]), "`a`"),
        (
            Schema::new(vec![
                Field::new("a", DataType::Utf8, true),
                Field::new("y", DataType::Int32, true),
            ]),
            "`a`",
        ),
        (
            Schema::new(vec![
                Field::new("a", DataType::Float64, true),
                Field::new("y", DataType::Float32, true),
            ]),
            "`y`",
        ),
        (
            Schema::new(vec![
                Field::new("a", DataType::Float64, true),
                Field::new("y", DataType::Int32, true),
                Field::new("z", DataType::Int32, true),
            ]),
            "`z`",
        ),
        (Schema::new(vec![Field::new("a", DataType::Float64, true)]), "`y`"),
    ];
    for (schema, column) in cases {
        let err = validate(&schema, &s, StreamKind::Train).expect_err(column);
        assert!(err.to_string().contains(column), "{err} should name {column}");
    }
    // Prediction streams may omit the label and carry other columns.
    let features_only = Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("a", DataType::Float64, true),
    ]);
    assert_eq!(
        validate(&features_only, &s, StreamKind::Predict)
            .expect("valid")
            .label,
        None
    );
}

#[test]
fn batch_errors_name_column_and_row() {
    let s = spec(&["a", "emb"]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Float64, true),
        fsl_field("emb", 2),
        Field::new("y", DataType::Int32, true),
    ]));
    let emb = |vals: Vec<f32>| {
        FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            2,
            Arc::new(Float32Array::from(vals)),
            None,
        )
    };
    let batch = |a: Vec<Option<f64>>, e: Vec<f32>, y: Vec<i32>| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Float64Array::from(a)),
                Arc::new(emb(e)),
                Arc::new(Int32Array::from(y)),
            ],
        )
        .expect("batch")
    };
    assert!(validate_batch(&batch(vec![Some(1.0), Some(2.0)], vec![0.0; 4], vec![0, 2]), &s).is_ok());
    assert_eq!(
        validate_batch(&batch(vec![Some(1.0), None], vec![0.0; 4], vec![0, 1]), &s),
        Err(SchemaError::Nulls {
            column: "a".into(),
            count: 1
        })
    );
    assert_eq!(
        validate_batch(
            &batch(
                vec![Some(1.0), Some(1.0)],
                vec![0.0, 0.0, 0.0, f32::NAN],
                vec![0, 1]
            ),
            &s
        ),
        Err(SchemaError::NonFinite {
            column: "emb".into(),
            row: 1
        })
    );
    assert_eq!(
        validate_batch(
            &batch(vec![Some(1.0), Some(f64::INFINITY)], vec![0.0; 4], vec![0, 1]),
            &s
        ),
        Err(SchemaError::NonFinite {
            column: "a".into(),
            row: 1
        })
    );
    assert_eq!(
        validate_batch(&batch(vec![Some(1.0), Some(1.0)], vec![0.0; 4], vec![0, 3]), &s),
        Err(SchemaError::LabelOutOfRange {
            column: "y".into(),
            value: 3,
            row: 1,
            num_classes: 3
        })
    );
}

fn typed_spec() -> JobSpec {
    JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .features(["city", "tokens", "x"])
        .categorical("city", 5)
        .sequence("tokens", 10, 3)
        .label("y")
        .build()
        .expect("valid")
}

fn typed_schema(city: DataType) -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("city", city, true),
        Field::new(
            "tokens",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            true,
        ),
        Field::new("x", DataType::Float64, true),
        Field::new("y", DataType::Int32, true),
    ]))
}

fn typed_batch(city: Vec<i64>, tokens: Vec<Vec<i64>>) -> RecordBatch {
    use arrow::array::{Int64Array, ListArray};
    let n = city.len();
    let lists = ListArray::from_iter_primitive::<arrow::datatypes::Int64Type, _, _>(
        tokens.into_iter().map(|t| Some(t.into_iter().map(Some))),
    );
    RecordBatch::try_new(
        typed_schema(DataType::Int64),
        vec![
            Arc::new(Int64Array::from(city)),
            Arc::new(lists),
            Arc::new(Float64Array::from(vec![0.5; n])),
            Arc::new(Int32Array::from(vec![1; n])),
        ],
    )
    .expect("batch")
}

#[test]
fn declared_inputs_have_their_kind_and_take_no_float_width() {
    let layout = validate(&typed_schema(DataType::Int64), &typed_spec(), StreamKind::Train).expect("valid");
    assert_eq!(layout.input_dim, 1, "only `x` is a float input");
    assert_eq!(layout.outputs, 2);
    assert_eq!(
        layout.column("city").map(|c| &c.kind),
        Some(&FeatureKind::Categorical { vocabulary: 5 })
    );
    assert_eq!(
        layout.column("tokens").map(|c| &c.kind),
        Some(&FeatureKind::Sequence {
            vocabulary: 10,
            max_len: 3
        })
    );
    assert_eq!(layout.column("x").map(|c| c.offset), Some(0));
}

#[test]
fn a_declared_input_of_another_type_is_refused_naming_the_column() {
    for wrong in [DataType::Float64, DataType::Utf8, DataType::Int16] {
        let err =
            validate(&typed_schema(wrong.clone()), &typed_spec(), StreamKind::Train).expect_err("wrong type");
        assert!(
            matches!(&err, SchemaError::WrongType { column, .. } if column == "city"),
            "{wrong}: {err}"
        );
        assert!(err.to_string().contains("categorical"), "{err}");
    }
}

#[test]
fn ids_outside_the_vocabulary_and_long_lists_are_refused_with_column_and_row() {
    let spec = typed_spec();
    assert!(validate_batch(&typed_batch(vec![0, 4], vec![vec![1, 2, 3], vec![]]), &spec).is_ok());
    assert_eq!(
        validate_batch(&typed_batch(vec![0, 5], vec![vec![1], vec![2]]), &spec),
        Err(SchemaError::IdOutOfRange {
            column: "city".into(),
            value: 5,
            row: 1,
            vocabulary: 5
        })
    );
    assert_eq!(
        validate_batch(
            &typed_batch(vec![0, 1, 2], vec![vec![1], vec![2], vec![3, -1]]),
            &spec
        ),
        Err(SchemaError::IdOutOfRange {
            column: "tokens".into(),
            value: -1,
            row: 2,
            vocabulary: 10
        })
    );
    assert_eq!(
        validate_batch(&typed_batch(vec![0, 1], vec![vec![1], vec![1, 2, 3, 4]]), &spec),
        Err(SchemaError::SequenceTooLong {
            column: "tokens".into(),
            len: 4,
            row: 1,
            max_len: 3
        })
    );
    // A slice keeps the rows' own numbering.
    let sliced = typed_batch(vec![0, 1, 2], vec![vec![1], vec![2], vec![3, 11]]).slice(1, 2);
    assert_eq!(
        validate_batch(&sliced, &spec),
        Err(SchemaError::IdOutOfRange {
            column: "tokens".into(),
            value: 11,
            row: 1,
            vocabulary: 10
        })
    );
}

#[test]
fn several_regression_targets_need_a_list_label_of_that_length() {
    let spec = JobSpec::builder()
        .task(Task::Regression)
        .targets(3)
        .features(["x"])
        .label("y")
        .build()
        .expect("valid");
    let schema = |label: DataType| {
        Schema::new(vec![
            Field::new("x", DataType::Float64, true),
            Field::new("y", label, true),
        ])
    };
    let layout = validate(
        &schema(DataType::FixedSizeList(
            Arc::new(Field::new("item", DataType::Float32, true)),
            3,
        )),
        &spec,
        StreamKind::Train,
    )
    .expect("valid");
    assert_eq!(layout.outputs, 3);
    for wrong in [
        DataType::Float32,
        DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 2),
    ] {
        let err = validate(&schema(wrong), &spec, StreamKind::Train).expect_err("wrong label");
        assert!(err.to_string().contains("`y`"), "{err}");
    }
}

#[test]
fn a_dictionary_anywhere_in_any_column_is_refused_naming_it() {
    let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let nested = DataType::Struct(
        vec![Field::new(
            "inner",
            DataType::List(Arc::new(Field::new("item", dict.clone(), true))),
            true,
        )]
        .into(),
    );
    for (column, t) in [("plain", dict), ("nested", nested)] {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Float32, true),
            Field::new(column, t, true),
        ]);
        // In a prediction stream the column is only passed through; still refused.
        let err = validate(&schema, &spec(&["a"]), StreamKind::Predict).expect_err("a dictionary");
        assert!(
            matches!(&err, SchemaError::Dictionary { column: c, .. } if c == column),
            "{err}"
        );
        assert!(err.to_string().contains("dictionary-encoded"), "{err}");
    }
    let plain = Schema::new(vec![
        Field::new("a", DataType::Float32, true),
        Field::new("id", DataType::Utf8, true),
    ]);
    assert!(validate(&plain, &spec(&["a"]), StreamKind::Predict).is_ok());
}
