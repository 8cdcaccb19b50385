//! Property and fuzz tests of what the client makes of Spark Connect's
//! answers: `ExecutePlanResponse`s as protobuf bytes (arbitrary, or a real
//! response with bytes flipped, cut or inserted), and the Arrow IPC stream
//! of an Arrow batch changed the same way. The property: the client's
//! decoder ([`ResponseDecoder`], what every result stream reads with)
//! answers `Ok` or a precise `Err`, never panics; an unchanged response
//! gives back its batch and schema. (arrow's IPC reader panics on some
//! malformed batches; the decoder turns that panic into an error of the
//! call, which these properties reach.)
//!
//! CI runs 256 cases of each property (well under a second);
//! `PROPTEST_CASES=5000 cargo test -p kindling-spark --test fuzz` runs more.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::StreamWriter;
use kindling_fixtures::fuzz::{cases, edits, mutate};
use kindling_spark::ResponseDecoder;
use kindling_spark::proto::data_type::{self, Kind};
use kindling_spark::proto::execute_plan_response::{ArrowBatch, ResponseType, ResultComplete};
use kindling_spark::proto::{self, ExecutePlanResponse};
use proptest::prelude::*;
use prost::Message;

/// A result batch as Spark sends it: ids, names (some null), scores.
fn batch(rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..rows as i64)),
        Arc::new(StringArray::from_iter(
            (0..rows).map(|i| (i % 3 != 0).then(|| format!("n{i}"))),
        )),
        Arc::new(Float64Array::from_iter_values((0..rows).map(|i| i as f64 * 0.5))),
    ];
    RecordBatch::try_new(schema, columns).expect("batch")
}

/// `batch` as one Arrow batch's data: a complete IPC stream.
fn ipc(batch: &RecordBatch) -> Vec<u8> {
    let mut writer = StreamWriter::try_new(Vec::new(), &batch.schema()).expect("writer");
    writer.write(batch).expect("write");
    writer.into_inner().expect("stream")
}

fn arrow_response(data: Vec<u8>, rows: usize) -> ExecutePlanResponse {
    ExecutePlanResponse {
        session_id: "s".into(),
        operation_id: "op".into(),
        response_id: "r-1".into(),
        response_type: Some(ResponseType::ArrowBatch(ArrowBatch {
            row_count: rows as i64,
            data: data.into(),
            start_offset: Some(0),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn spark_type(kind: Kind) -> proto::DataType {
    proto::DataType { kind: Some(kind) }
}

/// The schema Spark announces for [`batch`], with a nested column too.
fn schema_response() -> ExecutePlanResponse {
    let field = |name: &str, data_type, nullable| data_type::StructField {
        name: name.into(),
        data_type: Some(data_type),
        nullable,
        metadata: None,
    };
    let array = spark_type(Kind::Array(Box::new(data_type::Array {
        element_type: Some(Box::new(spark_type(Kind::Double(Default::default())))),
        contains_null: true,
        type_variation_reference: 0,
    })));
    let schema = spark_type(Kind::Struct(data_type::Struct {
        fields: vec![
            field("id", spark_type(Kind::Long(Default::default())), false),
            field("name", spark_type(Kind::String(Default::default())), true),
            field("score", spark_type(Kind::Double(Default::default())), true),
            field("history", array, true),
        ],
        type_variation_reference: 0,
    }));
    ExecutePlanResponse {
        session_id: "s".into(),
        operation_id: "op".into(),
        response_id: "r-0".into(),
        schema: Some(schema),
        response_type: Some(ResponseType::ResultComplete(ResultComplete {})),
        ..Default::default()
    }
}

/// What the decoder makes of `response`: its batches, or its error (a
/// message that says what was wrong).
fn read(response: ExecutePlanResponse) -> Result<(Vec<RecordBatch>, ResponseDecoder), TestCaseError> {
    let mut decoder = ResponseDecoder::default();
    match decoder.read(response) {
        Ok(()) => {
            let batches = std::iter::from_fn(|| decoder.next_batch()).collect::<Vec<_>>();
            for b in &batches {
                prop_assert!(b.num_rows() > 0, "a batch without rows is not handed out");
            }
            Ok((batches, decoder))
        }
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            Ok((Vec::new(), decoder))
        }
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn execute_plan_responses_decode_or_refuse(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(response) = ExecutePlanResponse::decode(bytes.as_slice()) {
            read(response)?;
        }
    }

    #[test]
    fn mutated_responses_decode_or_refuse(rows in 0usize..20, schema in any::<bool>(), (e, cut, ins) in edits()) {
        let response = match schema {
            true => schema_response(),
            false => arrow_response(ipc(&batch(rows)), rows),
        };
        let bytes = mutate(response.encode_to_vec(), &e, cut, ins);
        if let Ok(response) = ExecutePlanResponse::decode(bytes.as_slice()) {
            read(response)?;
        }
    }

    #[test]
    fn mutated_arrow_batches_decode_or_refuse(rows in 0usize..20, (e, cut, ins) in edits()) {
        let sent = batch(rows);
        let data = ipc(&sent);
        // Unchanged: the batch (if it has rows) and its schema.
        let (batches, decoder) = read(arrow_response(data.clone(), rows))?;
        prop_assert_eq!(batches, [sent.clone()].into_iter().filter(|b| b.num_rows() > 0).collect::<Vec<_>>());
        prop_assert_eq!(decoder.announced_schema(), Some(sent.schema()));
        let (batches, _) = read(arrow_response(mutate(data, &e, cut, ins), rows))?;
        for b in batches {
            // What decodes is a well-formed batch.
            prop_assert!(b.columns().iter().all(|c| c.len() == b.num_rows()));
        }
    }
}

#[test]
fn an_announced_schema_converts() {
    let mut decoder = ResponseDecoder::default();
    decoder.read(schema_response()).expect("schema");
    let schema = decoder.announced_schema().expect("announced");
    let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "name", "score", "history"]);
}
