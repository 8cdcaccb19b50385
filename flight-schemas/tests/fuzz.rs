//! Property and fuzz tests of every parser a peer's bytes reach: Flight
//! descriptors and tickets, action JSON, job specs, batch metadata and
//! acks, Arrow IPC in Flight messages (decoded, then checked against a job's
//! schema), and the collective's and rendezvous' protobuf frames. Each
//! input is arbitrary or a valid encoding with bytes flipped, cut or
//! inserted; the property is that parsing answers `Ok` or a precise `Err`,
//! never panics, and that what parses round-trips.
//!
//! CI runs proptest's default 256 cases per property (well under a second).
//! A longer run, 200,000 cases per property (2 M in all, about 20 s on 2
//! cores): `PROPTEST_CASES=200000 cargo test --workspace --test fuzz`. The
//! first run found arrow's IPC reader panicking on a batch whose buffer
//! claims more bytes than its body: `kindling_schemas::ipc::decode` turns
//! that into an error.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Float64Array, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_flight::decode::{DecodedFlightData, DecodedPayload};
use arrow_flight::{FlightData, FlightDescriptor, SchemaAsIpc, Ticket};
use futures::StreamExt;
use kindling_schemas::action::Action;
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::metadata::{BatchMetadata, PutAck};
use kindling_schemas::pb;
use kindling_schemas::schema::{StreamKind, validate, validate_batch};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};
use proptest::prelude::*;
use prost::Message;

/// `bytes` with `edits` applied: (position, byte) overwrites, then a cut.
fn mutate(
    mut bytes: Vec<u8>,
    edits: &[(usize, u8)],
    cut: Option<usize>,
    insert: Option<(usize, u8)>,
) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(at, b) in edits {
            let i = at % bytes.len();
            bytes[i] ^= b;
        }
    }
    if let Some((at, b)) = insert {
        let i = at % (bytes.len() + 1);
        bytes.insert(i, b);
    }
    if let Some(c) = cut {
        bytes.truncate(c % (bytes.len() + 1));
    }
    bytes
}

/// Byte flips, a cut, an inserted byte ([`mutate`]).
type Edits = (Vec<(usize, u8)>, Option<usize>, Option<(usize, u8)>);

fn edits() -> impl Strategy<Value = Edits> {
    (
        prop::collection::vec((any::<usize>(), 1u8..=255), 0..6),
        prop::option::of(any::<usize>()),
        prop::option::of((any::<usize>(), any::<u8>())),
    )
}

fn spec() -> JobSpec {
    JobSpec::builder()
        .model(ModelSpec::Mlp { hidden: vec![8] })
        .task(Task::Classification { num_classes: 3 })
        .optimizer(OptimizerSpec::adam(0.01))
        .features(["x1", "x2"])
        .label("y")
        .build()
        .expect("spec")
}

fn valid_actions() -> Vec<(String, Vec<u8>)> {
    let spec_json = serde_json::to_value(spec()).expect("spec json");
    [
        (
            "start_job",
            serde_json::json!({"job_id": "j-1", "spec": spec_json, "rendezvous": "http://127.0.0.1:7070"}),
        ),
        ("job_status", serde_json::json!({"job_id": "j-1"})),
        ("cancel_job", serde_json::json!({"job_id": "j-1", "reason": "r"})),
        (
            "end_of_data",
            serde_json::json!({"job_id": "j-1", "split": "train", "expected_rows": 10}),
        ),
        ("create_job", serde_json::json!({"job_id": "j-1", "num_slots": 2})),
        ("list_jobs", serde_json::json!({})),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), serde_json::to_vec(&v).expect("json")))
    .collect()
}

fn batch(rows: usize, seed: u64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Float64, true),
        Field::new("x2", DataType::Float32, true),
        Field::new("y", DataType::Int32, true),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Float64Array::from_iter_values(
            (0..rows).map(|i| (i as u64 ^ seed) as f64 * 0.1),
        )),
        Arc::new(Float32Array::from_iter_values((0..rows).map(|i| i as f32 * 0.5))),
        Arc::new(Int32Array::from_iter_values((0..rows).map(|i| (i % 3) as i32))),
    ];
    RecordBatch::try_new(schema, cols).expect("batch")
}

/// The Flight messages of a `DoPut` stream: the schema, then the batch.
fn ipc_messages(b: &RecordBatch) -> (FlightData, FlightData) {
    let options = IpcWriteOptions::default();
    let schema: FlightData = SchemaAsIpc::new(&b.schema(), &options).into();
    let (_, encoded) = IpcDataGenerator::default()
        .encode(
            b,
            &mut DictionaryTracker::new(false),
            &options,
            &mut Default::default(),
        )
        .expect("encode");
    (schema, encoded.into())
}

proptest! {
    #[test]
    fn descriptors_and_tickets_parse_or_refuse(segments in prop::collection::vec(".{0,40}", 0..5), ty in 0i32..4, ticket in prop::collection::vec(any::<u8>(), 0..200)) {
        let d = FlightDescriptor { r#type: ty, cmd: Default::default(), path: segments.clone() };
        if let Ok(path) = DataPath::from_descriptor(&d) {
            prop_assert_eq!(DataPath::from_descriptor(&path.descriptor()).ok(), Some(path.clone()));
            prop_assert_eq!(DataPath::from_ticket(&path.ticket()).ok(), Some(path));
        }
        let _ = DataPath::from_ticket(&Ticket { ticket: ticket.into() });
    }

    #[test]
    fn job_ids_that_parse_are_safe_path_components(id in ".{0,140}") {
        if let Ok(DataPath::Data { job_id, .. }) = DataPath::from_segments(&[id.clone(), "train".into()]) {
            prop_assert!(!job_id.is_empty() && job_id.len() <= 128);
            prop_assert!(job_id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()));
            prop_assert!(!job_id.contains('/') && job_id != "." && job_id != "..");
        }
    }

    #[test]
    fn actions_parse_or_refuse(name in "[a-z_]{0,16}", body in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = Action::parse(&name, &body);
    }

    #[test]
    fn mutated_actions_parse_or_refuse(which in 0usize..6, (e, cut, ins) in edits()) {
        let actions = valid_actions();
        let (name, body) = &actions[which % actions.len()];
        prop_assert!(Action::parse(name, body).is_ok(), "the unmutated {} parses", name);
        if let Ok(action) = Action::parse(name, &mutate(body.clone(), &e, cut, ins)) {
            // What parses is a well-formed action: it encodes and parses again.
            let flight = action.to_flight();
            prop_assert!(Action::parse(&flight.r#type, &flight.body).is_ok());
        }
    }

    #[test]
    fn job_specs_from_mutated_json_are_valid_or_refused((e, cut, ins) in edits()) {
        let json = serde_json::to_vec(&spec()).expect("json");
        if let Ok(parsed) = serde_json::from_slice::<JobSpec>(&mutate(json, &e, cut, ins)) {
            let _ = parsed.validate();
        }
    }

    #[test]
    fn batch_metadata_and_acks_decode_or_refuse(bytes in prop::collection::vec(any::<u8>(), 0..300), producer in ".{1,40}", seq in any::<u64>(), attempt in any::<u64>()) {
        let _ = BatchMetadata::decode(&bytes);
        let _ = PutAck::decode(&bytes);
        let m = BatchMetadata { producer, seq, attempt };
        prop_assert_eq!(BatchMetadata::decode(&m.encode()).ok(), Some(m));
    }

    #[test]
    fn arrow_ipc_decodes_or_refuses_and_what_decodes_is_checked(rows in 0usize..64, seed in any::<u64>(), target in 0usize..2, (e, cut, ins) in edits()) {
        let b = batch(rows, seed);
        let (mut schema_msg, mut batch_msg) = ipc_messages(&b);
        // Flip, cut or grow the header or the body of one of the two messages.
        match target {
            0 => schema_msg.data_header = mutate(schema_msg.data_header.to_vec(), &e, cut, ins).into(),
            _ => {
                batch_msg.data_header = mutate(batch_msg.data_header.to_vec(), &e, None, None).into();
                batch_msg.data_body = mutate(batch_msg.data_body.to_vec(), &[], cut, ins).into();
            }
        }
        let Ok(schema) = Schema::try_from(&schema_msg) else { return Ok(()) };
        let spec = spec();
        let _ = validate(&schema, &spec, StreamKind::Train);
        // The agent's own decoder: a malformed message is an error, never a panic.
        let messages = futures::stream::iter([Ok(schema_msg), Ok(batch_msg)]);
        let decoded: Vec<_> = futures::executor::block_on(kindling_schemas::ipc::decode(messages).collect());
        for item in decoded {
            match item {
                // A decoded batch is only used once it passes the job's checks.
                Ok(DecodedFlightData { payload: DecodedPayload::RecordBatch(b), .. }) => {
                    let _ = validate_batch(&b, &spec);
                }
                Ok(_) => {}
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }

    #[test]
    fn rendezvous_messages_decode_or_refuse(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = pb::rendezvous::RegisterAgentRequest::decode(bytes.as_slice());
        let _ = pb::rendezvous::JoinRequest::decode(bytes.as_slice());
        let _ = pb::rendezvous::AllGatherRequest::decode(bytes.as_slice());
        let _ = pb::rendezvous::CreateJobRequest::decode(bytes.as_slice());
        let _ = pb::rendezvous::ReportFailureRequest::decode(bytes.as_slice());
    }

    #[test]
    fn ring_hellos_replies_and_headers_decode_or_refuse(bytes in prop::collection::vec(any::<u8>(), 0..512), magic_first in any::<bool>()) {
        use kindling_schemas::ring;
        // After the magic or not, any bytes are a hello or a named refusal,
        // and no hello makes the reader allocate more than its cap.
        let mut hello = if magic_first { ring::MAGIC.to_vec() } else { Vec::new() };
        hello.extend_from_slice(&bytes);
        if let Err(e) = futures::executor::block_on(ring::read_hello(&mut hello.as_slice())) {
            prop_assert!(e.message().starts_with("ring hello"), "{e}");
        }
        let _ = futures::executor::block_on(ring::read_reply(&mut bytes.as_slice()));
        if bytes.len() >= ring::HEADER_BYTES {
            let mut h = [0u8; ring::HEADER_BYTES];
            h.copy_from_slice(&bytes[..ring::HEADER_BYTES]);
            if let Ok(header) = ring::FrameHeader::decode(&h) {
                prop_assert_eq!(header.encode(), h);
            }
        }
    }

    #[test]
    fn ring_hellos_round_trip(job in "[a-z0-9-]{1,20}", attempt in any::<u32>(), from_rank in any::<u32>(), token in proptest::option::of("[ -~]{0,64}"), heartbeat_ms in any::<u64>()) {
        use kindling_schemas::ring;
        let hello = ring::Hello { job_id: job, attempt, from_rank, to_rank: from_rank.wrapping_add(1), token, heartbeat_ms };
        let mut bytes = Vec::new();
        futures::executor::block_on(ring::write_hello(&mut bytes, &hello)).expect("write");
        prop_assert_eq!(futures::executor::block_on(ring::read_hello(&mut bytes.as_slice())).ok(), Some(hello));
    }
}

#[test]
fn splits_parse_from_their_names() {
    for (name, split) in [("train", Split::Train), ("eval", Split::Eval)] {
        let path = DataPath::from_segments(&["j".into(), name.into()]).expect("path");
        assert_eq!(path, DataPath::data("j", split));
    }
}
