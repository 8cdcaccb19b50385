//! Property and fuzz tests of every parser a peer's bytes reach: Flight
//! descriptors and tickets, action JSON, job specs, batch metadata and
//! acks, Arrow IPC in Flight messages (decoded, then checked against a job's
//! schema), arbitrary Arrow schemas (wide, nested, dictionary-encoded) as
//! `DoPut` validates them, the collective's and rendezvous' protobuf frames,
//! and what a peer presents before it is authenticated: bearer tokens, job
//! credentials and the credential key file; the ring's goodbyes and abort
//! reasons, the `traceparent` header, and the heartbeat, gather and watch
//! messages of the rendezvous with the agent reports a watch carries. Each input is arbitrary or a
//! valid encoding with bytes flipped, cut or inserted; the property is that
//! parsing answers `Ok` or a precise `Err`, never panics, that what parses
//! round-trips, and that no changed credential verifies as other claims.
//!
//! CI runs proptest's default 256 cases per property (about a second for
//! the file on 2 cores). A longer run,
//! `PROPTEST_CASES=5000 cargo test -p kindling-schemas --test fuzz`, takes
//! about 10 s, most of it the arbitrary schemas (under 2 ms a case); the
//! properties from descriptors to ring hellos ran 200,000 cases each in
//! about 20 s. The first run found arrow's IPC reader panicking on a batch
//! whose buffer claims more bytes than its body:
//! `kindling_schemas::ipc::decode` turns that into an error.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arrow::array::{
    ArrayRef, FixedSizeBinaryArray, FixedSizeListArray, Float32Array, Float64Array, Int32Array, Int64Array,
    IntervalMonthDayNanoArray, LargeListArray, ListArray, MapArray, RecordBatch, RecordBatchOptions,
    StringArray, StructArray, new_empty_array, new_null_array,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{
    DataType, Field, Fields, IntervalMonthDayNano, IntervalUnit, Schema, SchemaRef, TimeUnit,
};
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_flight::decode::{DecodedFlightData, DecodedPayload};
use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::{FlightData, FlightDescriptor, SchemaAsIpc, Ticket};
use futures::{StreamExt, TryStreamExt};
use kindling_fixtures::fuzz::{JOB_REPORT_JSON, edits, mutate};
use kindling_schemas::action::Action;
use kindling_schemas::auth::{BearerCheck, Caller, Token};
use kindling_schemas::credential::{
    Claims, CredentialKey, CredentialKeys, KeyFileError, MIN_KEY_BYTES, Role, hex, looks_like_credential,
};
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::metadata::{BatchMetadata, PutAck};
use kindling_schemas::pb;
use kindling_schemas::schema::{SchemaError, StreamKind, validate, validate_batch};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};
use proptest::prelude::*;
use prost::Message;

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

// ---- the ring's reasons, the trace header, heartbeats, gathers, watches ------

/// What a reader of a reason of `claim` bytes must return from `bytes`:
/// the first `claim` bytes (at most [`ring::MAX_REPLY_BYTES`]) as UTF-8,
/// or `None` where `bytes` end before them.
fn reason_model(bytes: &[u8], claim: u32) -> Option<String> {
    let want = (claim as usize).min(kindling_schemas::ring::MAX_REPLY_BYTES);
    bytes.get(..want).map(|r| String::from_utf8_lossy(r).into_owned())
}

/// A report of one job as an agent sends it with its heartbeat.
fn job_report() -> kindling_schemas::action::AgentJobStatus {
    serde_json::from_str(JOB_REPORT_JSON).expect("a job report")
}

/// A job's status as the rendezvous sends it.
fn job_status() -> pb::rendezvous::JobStatusResponse {
    pb::rendezvous::JobStatusResponse {
        job_id: "j-1".into(),
        state: pb::rendezvous::JobState::Running as i32,
        attempt: 2,
        max_attempts: 3,
        num_slots: 2,
        members: vec!["a".into(), "b".into()],
        failures: vec![pb::rendezvous::Failure {
            attempt: 1,
            agent_id: "c".into(),
            cause: "lost".into(),
            at_unix_ms: 1_700_000_000_123,
        }],
        spec_summary: "mlp [8], adam".into(),
        created_unix_ms: 1_700_000_000_000,
        updated_unix_ms: 1_700_000_000_500,
        cancel_reason: String::new(),
        incarnation: 0x1234_5678,
        detached: true,
    }
}

/// A heartbeat, its answer, a gather and its answer, a watch request and
/// a watch event with reports, encoded.
fn valid_rendezvous_messages() -> Vec<Vec<u8>> {
    use pb::rendezvous as r;
    let report = kindling_schemas::rendezvous::AgentReport {
        cache_budget_bytes: 1 << 30,
        cache_bytes_memory: 1 << 20,
        cache_bytes_disk: 0,
        jobs: vec![job_report()],
    };
    vec![
        r::HeartbeatRequest {
            agent_id: "a".into(),
            report: serde_json::to_vec(&report).expect("json"),
        }
        .encode_to_vec(),
        r::HeartbeatResponse {
            lease_ms: 30_000,
            failed_attempts: vec![r::AttemptRef {
                job_id: "j-1".into(),
                attempt: 1,
                cause: "peer b lost".into(),
            }],
        }
        .encode_to_vec(),
        r::AllGatherRequest {
            job_id: "j-1".into(),
            attempt: 2,
            rank: 1,
            seq: 7,
            payload: b"rank 1's part".to_vec().into(),
        }
        .encode_to_vec(),
        r::AllGatherResponse {
            payloads: vec![b"a".to_vec().into(), Default::default(), b"c".to_vec().into()],
        }
        .encode_to_vec(),
        r::WatchRequest {
            job_id: "j-1".into(),
            with_reports: true,
        }
        .encode_to_vec(),
        r::JobEvent {
            status: Some(job_status()),
            reports: vec![r::MemberReport {
                agent_id: "a".into(),
                status_json: JOB_REPORT_JSON.as_bytes().to_vec(),
                age_ms: 1500,
            }],
        }
        .encode_to_vec(),
    ]
}

/// `bytes` as each heartbeat, gather and watch message: each decodes or
/// is refused, and what decodes encodes to itself; a watch event's status
/// converts or names its unknown state, and each report is the job's
/// status or a refusal naming the agent it came from.
fn check_rendezvous_messages(bytes: &[u8]) -> Result<(), TestCaseError> {
    use pb::rendezvous as r;
    fn round_trips<M: Message + Default + PartialEq + std::fmt::Debug>(
        bytes: &[u8],
    ) -> Result<Option<M>, TestCaseError> {
        let Ok(m) = M::decode(bytes) else { return Ok(None) };
        let again = M::decode(m.encode_to_vec().as_slice()).ok();
        prop_assert_eq!(again.as_ref(), Some(&m));
        Ok(Some(m))
    }
    round_trips::<r::HeartbeatRequest>(bytes)?;
    round_trips::<r::HeartbeatResponse>(bytes)?;
    round_trips::<r::AllGatherRequest>(bytes)?;
    round_trips::<r::AllGatherResponse>(bytes)?;
    round_trips::<r::WatchRequest>(bytes)?;
    let Some(event) = round_trips::<r::JobEvent>(bytes)? else {
        return Ok(());
    };
    if let Some(status) = event.status {
        match kindling_schemas::rendezvous::JobStatus::try_from(status.clone()) {
            // What converts is what was sent.
            Ok(converted) => prop_assert_eq!(r::JobStatusResponse::from(&converted), status),
            Err(e) => prop_assert_eq!(e.0, status.state),
        }
    }
    for report in event.reports {
        let agent_id = report.agent_id.clone();
        match kindling_schemas::rendezvous::MemberReport::try_from(report) {
            Ok(m) => {
                prop_assert_eq!(&m.agent_id, &agent_id);
                let again: kindling_schemas::action::AgentJobStatus =
                    serde_json::from_slice(&serde_json::to_vec(&m.status).expect("json"))
                        .expect("what parsed parses again");
                prop_assert_eq!(
                    (&again.job_id, &again.agent_id, again.state, again.attempt),
                    (
                        &m.status.job_id,
                        &m.status.agent_id,
                        m.status.state,
                        m.status.attempt
                    )
                );
            }
            Err(e) => prop_assert!(
                e.to_string().contains(&format!("agent `{agent_id}`'s report")),
                "{e}"
            ),
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn ring_goodbyes_and_abort_reasons_read_within_their_bound(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        claim in prop_oneof![0u32..64, any::<u32>()],
        reason in ".{0,40}",
        long in any::<bool>(),
    ) {
        use kindling_schemas::ring;
        // Any bytes after a CLOSING byte: the reason its length claims (a
        // huge claim reads at most the bound, and fails where the bytes
        // end), never a panic.
        let read = futures::executor::block_on(ring::read_closing(&mut bytes.as_slice()));
        let expected = bytes.get(4..).and_then(|rest| {
            reason_model(rest, u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        });
        prop_assert_eq!(read.as_ref().ok(), expected.as_ref(), "{:?}", read);
        if let Err(e) = read {
            prop_assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        }
        // An abort frame's payload, its length from the header.
        let read = futures::executor::block_on(ring::read_reason(&mut bytes.as_slice(), claim));
        prop_assert_eq!(read.ok(), reason_model(&bytes, claim));
        // A goodbye written reads back as its reason, cut to the bound at
        // a character boundary.
        let reason = match long {
            true => format!("é{reason}").repeat(ring::MAX_REPLY_BYTES / 2),
            false => reason,
        };
        let goodbye = ring::closing(&reason);
        prop_assert_eq!(goodbye[0], ring::CLOSING);
        prop_assert!(goodbye.len() <= 5 + ring::MAX_REPLY_BYTES);
        let back = futures::executor::block_on(ring::read_closing(&mut &goodbye[1..])).expect("a goodbye");
        prop_assert!(reason.starts_with(&back) && (back.len() == reason.len() || back.len() + 4 > ring::MAX_REPLY_BYTES), "{} of {}", back.len(), reason.len());
    }

    #[test]
    fn trace_headers_parse_as_the_standard_says_or_are_ignored(
        value in prop_oneof![
            ".{0,64}",
            "[ \t]{0,2}00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}[ \t]{0,2}",
            "00-(0{32}|[0-9a-f]{32})-(0{16}|[0-9a-f]{16})-01",
            "[ \t]{0,2}0[0-9a-g]-[0-9a-fA-F]{31,33}-[0-9a-fA-F]{15,17}-[0-9a-f]{1,3}(-[0-9a-f]{0,2})?[ \t]{0,2}",
        ],
        (e, cut, ins) in edits(),
    ) {
        use kindling_schemas::trace::TraceContext;
        let root = TraceContext::new_root();
        let header = root.header();
        prop_assert_eq!(TraceContext::parse(&header), Some(root));
        let mutated = mutate(header.clone().into_bytes(), &e, cut, ins);
        for value in [value, String::from_utf8_lossy(&mutated).into_owned()] {
            let Some(parsed) = TraceContext::parse(&value) else { continue };
            // What parses is the header it says: version 00, those ids, and
            // the ids are not zero.
            let value = value.trim();
            let again = parsed.header();
            prop_assert_eq!(value.len(), again.len(), "{:?}", value);
            prop_assert_eq!(&value[..53], &again[..53]);
            prop_assert!(!again.contains("-00000000000000000000000000000000-") && !again.contains("-0000000000000000-"));
            prop_assert_eq!(TraceContext::parse(&again), Some(parsed));
        }
    }

    #[test]
    fn heartbeats_gathers_and_watch_events_decode_or_refuse(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_rendezvous_messages(&bytes)?;
    }

    #[test]
    fn mutated_heartbeats_gathers_and_watch_events_decode_or_refuse(which in any::<prop::sample::Index>(), (e, cut, ins) in edits()) {
        let messages = valid_rendezvous_messages();
        let valid = &messages[which.index(messages.len())];
        check_rendezvous_messages(valid)?;
        check_rendezvous_messages(&mutate(valid.clone(), &e, cut, ins))?;
    }

    /// An agent's report of a job as a watch event carries it: the job's
    /// status, or a refusal naming the agent.
    #[test]
    fn member_reports_parse_or_name_their_agent((e, cut, ins) in edits(), agent_id in "[a-z0-9-]{1,12}", age_ms in any::<u64>()) {
        let json = JOB_REPORT_JSON.as_bytes().to_vec();
        let report = pb::rendezvous::MemberReport { agent_id: agent_id.clone(), status_json: json, age_ms };
        prop_assert_eq!(kindling_schemas::rendezvous::MemberReport::try_from(report.clone()).map(|m| m.status).ok(), Some(job_report()));
        let mutated = pb::rendezvous::MemberReport { status_json: mutate(report.status_json, &e, cut, ins), ..report };
        check_rendezvous_messages(&pb::rendezvous::JobEvent { status: None, reports: vec![mutated] }.encode_to_vec())?;
    }
}

// ---- credentials and bearer tokens ------------------------------------------

const OPERATOR: &str = "op";
const KEY_SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const OTHER_SECRET: &[u8] = b"fedcba9876543210fedcba9876543210-other";

fn key() -> CredentialKey {
    CredentialKey::new(KEY_SECRET).expect("key")
}

/// A rotation under way, read from a key file: `OTHER` signs, `KEY` is
/// still accepted.
fn rotated_keys() -> CredentialKeys {
    static KEYS: OnceLock<CredentialKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("credential-keys");
        std::fs::write(&path, [OTHER_SECRET, b"\n", KEY_SECRET, b"\n"].concat()).expect("write");
        CredentialKeys::from_file(&path).expect("keys")
    })
    .clone()
}

/// The key rings a presented string meets besides the key itself: the key
/// alone, and a rotation that still accepts it.
fn verifiers() -> [CredentialKeys; 2] {
    [CredentialKeys::from(key()), rotated_keys()]
}

fn claims() -> impl Strategy<Value = Claims> {
    (
        prop_oneof!["[a-z0-9-]{1,20}", ".{0,24}"],
        prop::sample::select(vec![Role::Producer, Role::Peer, Role::Reader]),
        60u64..1_000_000_000,
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(job_id, role, ttl, incarnation)| Claims {
            incarnation,
            ..Claims::expiring(&job_id, role, Duration::from_secs(ttl))
        })
}

/// What every verifier makes of `presented`: the claims `signed` (those of
/// the credential it was made from) or a refusal, never other claims; the
/// operator only for the operator token; every refusal `UNAUTHENTICATED`.
fn check_presented(presented: &str, signed: Option<&Claims>) -> Result<(), TestCaseError> {
    let by_key = key().verify(presented);
    if let Ok(claims) = &by_key {
        prop_assert_eq!(Some(claims), signed, "{:?} verified as other claims", presented);
        prop_assert!(
            looks_like_credential(presented),
            "{presented:?} verified but looks like no credential"
        );
    }
    for keys in verifiers() {
        let verified = keys.verify(presented);
        prop_assert_eq!(verified.as_ref().ok(), by_key.as_ref().ok(), "{:?}", presented);
        if let Err(e) = verified {
            prop_assert!(!e.to_string().is_empty());
        }
        let check = BearerCheck::new(Some(Token::new(OPERATOR))).with_credentials(Some(keys));
        match check.caller_of(Some(presented)) {
            Ok(Caller::Operator) => prop_assert_eq!(presented, OPERATOR),
            Ok(Caller::Job(claims)) => prop_assert_eq!(Some(&claims), signed, "{:?}", presented),
            Err(status) => prop_assert_eq!(
                status.code(),
                tonic::Code::Unauthenticated,
                "{}",
                status.message()
            ),
        }
    }
    Ok(())
}

/// The credential `claims` make with `secret` (any bytes), as an attacker
/// who guessed a key would sign them.
fn signed_with(secret: &[u8], claims: &Claims) -> String {
    let body = hex(&serde_json::to_vec(claims).expect("json"));
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
        body.as_bytes(),
    );
    format!("kc1.{body}.{}", hex(tag.as_ref()))
}

/// One line of a key file: a key of a small pool (so that some repeat),
/// padded, too short, a comment, blank, or any bytes.
fn key_line() -> impl Strategy<Value = Vec<u8>> {
    const POOL: [&[u8]; 3] = [
        KEY_SECRET,
        OTHER_SECRET,
        b"a third key, long enough to be one: 0123",
    ];
    prop_oneof![
        3 => prop::sample::select(POOL.to_vec()).prop_map(<[u8]>::to_vec),
        1 => ("[ \t]{0,2}", prop::sample::select(POOL.to_vec()), "[ \t\r]{0,2}")
            .prop_map(|(pre, key, post)| [pre.as_bytes(), key, post.as_bytes()].concat()),
        2 => "[!-~]{0,31}".prop_map(String::into_bytes),
        1 => "#.{0,40}".prop_map(String::into_bytes),
        1 => "[ \t\r]{0,3}".prop_map(String::into_bytes),
        2 => prop::collection::vec(any::<u8>(), 0..80),
    ]
}

/// What `text` as a key file must give (module doc of
/// `credential::keys`): the ids of its keys in order, or the words of the
/// refusal, with the line it names.
fn expected_keys(text: &[u8]) -> Result<Vec<String>, String> {
    let mut ids: Vec<String> = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let Ok(key) = CredentialKey::new(line) else {
            return Err(format!(
                "line {}: a credential key needs at least {MIN_KEY_BYTES} bytes",
                i + 1
            ));
        };
        if ids.iter().any(|id| id == key.id()) {
            return Err(format!("line {}: the same key twice", i + 1));
        }
        ids.push(key.id().to_owned());
    }
    if ids.is_empty() {
        return Err("no key in it".to_owned());
    }
    Ok(ids)
}

proptest! {
    #[test]
    fn credentials_verify_to_their_claims_and_no_mutant_to_other_claims(c in claims(), (e, cut, ins) in edits()) {
        let key = key();
        let credential = key.sign(&c);
        let signed = Claims { kid: Some(key.id().to_owned()), ..c };
        prop_assert_eq!(key.verify(&credential), Ok(signed.clone()));
        prop_assert!(looks_like_credential(&credential));
        for keys in verifiers() {
            prop_assert_eq!(keys.verify(&credential), Ok(signed.clone()));
            let check = BearerCheck::new(Some(Token::new(OPERATOR))).with_credentials(Some(keys));
            prop_assert_eq!(check.caller_of(Some(&credential)).ok(), Some(Caller::Job(signed.clone())));
        }
        let mutant = String::from_utf8_lossy(&mutate(credential.clone().into_bytes(), &e, cut, ins)).into_owned();
        check_presented(&mutant, Some(&signed))?;
    }

    #[test]
    fn arbitrary_strings_are_no_credential(s in prop_oneof![
        ".{0,200}",
        "kc1\\.[0-9a-fA-F+]{0,80}\\.[0-9a-fA-F+ -]{0,80}",
        "kc1\\.(7b22[0-9a-f]{0,60})?\\.[0-9a-f]{64}",
        Just(OPERATOR.to_owned()),
        "op.{1,3}",
    ]) {
        check_presented(&s, None)?;
    }

    #[test]
    fn claims_signed_with_another_key_or_spliced_never_verify(
        c in claims(),
        kid in prop::option::of(prop_oneof![Just(key().id().to_owned()), "[0-9a-f]{16}", ".{0,20}"]),
        secret in prop::collection::vec(any::<u8>(), 0..64),
        other in claims(),
        how in 0u8..3,
    ) {
        let forged_claims = Claims { kid, ..c };
        let presented = match how {
            // Signed with a key the verifiers do not hold, naming theirs or any.
            0 => signed_with(&secret, &forged_claims),
            // A real signature of other claims spliced onto these.
            1 => {
                let real = key().sign(&other);
                let tag = real.rsplit_once('.').expect("tag").1;
                format!("kc1.{}.{tag}", hex(&serde_json::to_vec(&forged_claims).expect("json")))
            }
            // The key's signature of the claims' JSON, not of their hex.
            _ => {
                let json = serde_json::to_vec(&forged_claims).expect("json");
                let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, KEY_SECRET), &json);
                format!("kc1.{}.{}", hex(&json), hex(tag.as_ref()))
            }
        };
        let same_key = secret.trim_ascii() == KEY_SECRET || secret.trim_ascii() == OTHER_SECRET;
        let spliced_onto_itself = how == 1 && Claims { kid: Some(key().id().to_owned()), ..other.clone() } == forged_claims;
        prop_assume!(!same_key && !spliced_onto_itself);
        check_presented(&presented, None)?;
    }

    #[test]
    fn key_files_give_their_keys_or_a_refusal_naming_file_and_line(text in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..400),
        prop::collection::vec(key_line(), 0..6).prop_map(|lines| lines.join(&b"\n"[..])),
    ]) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("credential-keys");
        std::fs::write(&path, &text).expect("write");
        match (CredentialKeys::from_file(&path), expected_keys(&text)) {
            (Ok(keys), Ok(ids)) => {
                prop_assert_eq!(keys.ids(), ids.clone());
                // The first signs, and what it signs verifies.
                let credential = keys.issue("j", Role::Peer, Duration::from_secs(60), 1);
                prop_assert_eq!(keys.verify(&credential).map(|c| c.kid), Ok(Some(ids[0].clone())));
            }
            (Err(e @ KeyFileError::Invalid { .. }), Err(says)) => {
                let message = e.to_string();
                prop_assert!(message.contains(&says), "{message} (expected {says})");
                prop_assert!(message.contains(&path.display().to_string()), "{message}");
            }
            (got, want) => prop_assert!(false, "the key file gave {got:?}, expected {want:?}"),
        }
    }
}

// ---- arbitrary Arrow schemas, as DoPut validates them -----------------------

/// The specs a stream is checked against: every kind of input (scalars,
/// a vector, categorical ids, id sequences, a sample weight), a regression
/// with a vector label, and a CNN over one 8×8 image column.
fn specs() -> &'static [JobSpec; 3] {
    static SPECS: OnceLock<[JobSpec; 3]> = OnceLock::new();
    SPECS.get_or_init(|| {
        let base = || JobSpec::builder().optimizer(OptimizerSpec::adam(0.01)).label("y");
        [
            base()
                .model(ModelSpec::Mlp { hidden: vec![8] })
                .task(Task::Classification { num_classes: 3 })
                .features(["x1", "x2", "c", "s", "v"])
                .categorical("c", 5)
                .sequence("s", 7, 4)
                .sample_weight("w")
                .build()
                .expect("classification spec"),
            base()
                .model(ModelSpec::Linear)
                .task(Task::Regression)
                .targets(2)
                .features(["x1", "v"])
                .build()
                .expect("regression spec"),
            base()
                .model(ModelSpec::Cnn {
                    channels: 1,
                    height: 8,
                    width: 8,
                    conv: vec![2],
                    dense: 4,
                })
                .task(Task::Classification { num_classes: 2 })
                .features(["v"])
                .build()
                .expect("cnn spec"),
        ]
    })
}

/// Every column name a spec above uses.
const SPEC_COLUMNS: [&str; 7] = ["x1", "x2", "c", "s", "v", "y", "w"];

const INTEGERS: [DataType; 8] = [
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::UInt8,
    DataType::UInt16,
    DataType::UInt32,
    DataType::UInt64,
];

fn numeric_type() -> impl Strategy<Value = DataType> {
    let mut numeric = INTEGERS.to_vec();
    numeric.extend([DataType::Float16, DataType::Float32, DataType::Float64]);
    prop::sample::select(numeric)
}

fn leaf_type() -> impl Strategy<Value = DataType> {
    prop_oneof![
        3 => numeric_type(),
        2 => prop::sample::select(vec![
            DataType::Null,
            DataType::Boolean,
            DataType::Utf8,
            DataType::LargeUtf8,
            DataType::Utf8View,
            DataType::Binary,
            DataType::LargeBinary,
            DataType::FixedSizeBinary(3),
            DataType::Date32,
            DataType::Date64,
            DataType::Timestamp(TimeUnit::Millisecond, None),
            DataType::Timestamp(TimeUnit::Nanosecond, Some("+01:00".into())),
            DataType::Time32(TimeUnit::Second),
            DataType::Duration(TimeUnit::Microsecond),
            DataType::Interval(IntervalUnit::MonthDayNano),
            DataType::Decimal128(10, 2),
        ]),
        1 => (
            prop::sample::select(INTEGERS.to_vec()),
            prop::sample::select(vec![
                DataType::Utf8,
                DataType::LargeUtf8,
                DataType::Binary,
                DataType::Int32,
                DataType::Int64,
                DataType::Float32,
                DataType::Float64,
            ]),
        )
            .prop_map(|(k, v)| DataType::Dictionary(Box::new(k), Box::new(v))),
    ]
}

/// A name a peer might give a field: a spec column, empty, any text.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(SPEC_COLUMNS.to_vec()).prop_map(str::to_owned),
        1 => Just(String::new()),
        1 => Just("item".to_owned()),
        2 => ".{0,8}",
        1 => "[a-z0-9_]{1,12}",
    ]
}

/// Any type, nested up to three levels: lists, large and fixed-size lists,
/// structs and maps of leaves and dictionaries.
fn data_type() -> impl Strategy<Value = DataType> {
    leaf_type().prop_recursive(3, 24, 4, |inner| {
        let child = (field_name(), inner, any::<bool>())
            .prop_map(|(n, t, nullable)| Arc::new(Field::new(n, t, nullable)))
            .boxed();
        prop_oneof![
            child.clone().prop_map(DataType::List),
            child.clone().prop_map(DataType::LargeList),
            (child.clone(), 0i32..6).prop_map(|(f, n)| DataType::FixedSizeList(f, n)),
            prop::collection::vec(child.clone(), 0..4).prop_map(|f| DataType::Struct(Fields::from(f))),
            (leaf_type(), child, any::<bool>()).prop_map(|(key, value, sorted)| {
                let entries = Fields::from(vec![Arc::new(Field::new("key", key, false)), value]);
                DataType::Map(
                    Arc::new(Field::new("entries", DataType::Struct(entries), false)),
                    sorted,
                )
            }),
        ]
    })
}

/// A few, or up to ~200, columns of any names and types.
fn arbitrary_fields() -> impl Strategy<Value = Vec<Field>> {
    let field =
        || (field_name(), data_type(), any::<bool>()).prop_map(|(n, t, nullable)| Field::new(n, t, nullable));
    prop_oneof![
        prop::collection::vec(field(), 0..8),
        prop::collection::vec(field(), 0..200),
    ]
}

/// A type `spec` accepts for its column `name`.
fn accepted_type(spec: usize, name: &str) -> BoxedStrategy<DataType> {
    let ids = || prop::sample::select(vec![DataType::Int32, DataType::Int64]);
    let f32s = |lens: std::ops::Range<i32>| {
        ("[a-z]{0,4}", any::<bool>(), lens).prop_map(|(n, nullable, len)| {
            DataType::FixedSizeList(Arc::new(Field::new(n, DataType::Float32, nullable)), len)
        })
    };
    match (spec, name) {
        (_, "c") => ids().boxed(),
        (_, "s") => (ids(), "[a-z]{0,4}", any::<bool>(), any::<bool>())
            .prop_map(|(t, n, nullable, large)| {
                let item = Arc::new(Field::new(n, t, nullable));
                if large {
                    DataType::LargeList(item)
                } else {
                    DataType::List(item)
                }
            })
            .boxed(),
        (2, "v") => f32s(64..65).boxed(),
        (_, "v") => f32s(1..6).boxed(),
        (1, "y") => f32s(2..3).boxed(),
        (_, "y") => prop::sample::select(INTEGERS.to_vec()).boxed(),
        _ => numeric_type().boxed(),
    }
}

/// A stream's schema for `spec` with the types it accepts, then changed as
/// a peer might: columns retyped, dropped, renamed, duplicated or added.
fn near_valid_fields() -> impl Strategy<Value = (usize, Vec<Field>)> {
    (0usize..3).prop_flat_map(|which| {
        let spec = &specs()[which];
        let columns: Vec<_> = spec
            .columns()
            .into_iter()
            .map(|name| (Just(name.to_owned()), accepted_type(which, name), any::<bool>()))
            .collect();
        let edits = prop::collection::vec(
            (0u8..6, any::<prop::sample::Index>(), field_name(), data_type()),
            0..4,
        );
        (Just(which), columns, edits).prop_map(|(which, columns, edits)| {
            let mut fields: Vec<Field> = columns
                .into_iter()
                .map(|(name, t, nullable)| Field::new(name, t, nullable))
                .collect();
            for (op, at, name, t) in edits {
                let nullable = fields.len().is_multiple_of(2);
                if fields.is_empty() {
                    fields.push(Field::new(name, t, nullable));
                    continue;
                }
                let i = at.index(fields.len());
                match op {
                    0 => fields[i] = fields[i].clone().with_data_type(t),
                    1 => drop(fields.remove(i)),
                    2 => fields[i] = fields[i].clone().with_name(name),
                    3 => fields.insert(i, fields[i].clone()),
                    4 => fields.insert(i, Field::new(name, t, nullable)),
                    _ => fields.swap(0, i),
                }
            }
            (which, fields)
        })
    })
}

/// What `validate` answers, checked: a layout of every feature in spec
/// order, or an error naming a column it is right about.
fn check_validation(schema: &Schema, spec: &JobSpec, kind: StreamKind) -> Result<bool, TestCaseError> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let columns = spec.columns();
    match validate(schema, spec, kind) {
        Ok(layout) => {
            let features: Vec<&str> = layout.features.iter().map(|f| f.name.as_str()).collect();
            prop_assert_eq!(
                features,
                spec.features.iter().map(String::as_str).collect::<Vec<_>>()
            );
            if kind == StreamKind::Train {
                prop_assert!(names.iter().all(|n| columns.contains(n)), "{names:?}");
                prop_assert!(layout.label.is_some());
            }
            prop_assert!(!schema.fields().iter().any(|f| holds_dictionary(f.data_type())));
            Ok(true)
        }
        // No stream takes a dictionary, anywhere in it: the first is named.
        Err(SchemaError::Dictionary { column, found }) => {
            let first = schema.fields().iter().find(|f| holds_dictionary(f.data_type()));
            prop_assert_eq!(first.map(|f| (f.name(), f.data_type())), Some((&column, &found)));
            Ok(false)
        }
        Err(SchemaError::UnknownColumn { column }) => {
            prop_assert!(
                kind == StreamKind::Train
                    && names.contains(&column.as_str())
                    && !columns.contains(&column.as_str()),
                "{column}"
            );
            Ok(false)
        }
        Err(SchemaError::MissingColumn { column, .. }) => {
            prop_assert!(
                columns.contains(&column.as_str()) && !names.contains(&column.as_str()),
                "{column}"
            );
            Ok(false)
        }
        Err(SchemaError::WrongType { column, found, .. }) => {
            prop_assert_eq!(
                schema.field_with_name(&column).map(|f| f.data_type()).ok(),
                Some(&found)
            );
            Ok(false)
        }
        Err(SchemaError::WrongWidth { found, expected }) => {
            prop_assert!(
                matches!(spec.model, ModelSpec::Cnn { .. }) && found != expected,
                "{found} {expected}"
            );
            Ok(false)
        }
        // Any other refusal names a column of the stream.
        Err(e) => {
            let message = e.to_string();
            prop_assert!(
                names.iter().any(|n| message.contains(&format!("`{n}`"))),
                "{message}"
            );
            Ok(false)
        }
    }
}

/// `rows` values `validate_batch` accepts in `field`, a column `spec`
/// uses (ids and classes 0 or 1, weights and floats ≥ 0, short
/// sequences), where its type is one `validate` accepts there.
fn valid_values(field: &Field, rows: usize) -> Option<ArrayRef> {
    let small =
        |n: usize| -> ArrayRef { Arc::new(Int64Array::from_iter_values((0..n).map(|i| (i % 2) as i64))) };
    match field.data_type() {
        t if t.is_integer() || t.is_floating() => arrow::compute::cast(&small(rows), t).ok(),
        DataType::FixedSizeList(item, len) if *item.data_type() == DataType::Float32 => {
            let values = Float32Array::from(vec![0.5; rows * usize::try_from(*len).ok()?]);
            Some(Arc::new(
                FixedSizeListArray::try_new_with_length(item.clone(), *len, Arc::new(values), None, rows)
                    .ok()?,
            ))
        }
        DataType::List(item) | DataType::LargeList(item) if item.data_type().is_integer() => {
            let lengths: Vec<usize> = (0..rows).map(|i| i % 3).collect();
            let values = arrow::compute::cast(&small(lengths.iter().sum()), item.data_type()).ok()?;
            let offsets = OffsetBuffer::from_lengths(lengths.iter().copied());
            Some(match field.data_type() {
                DataType::List(_) => Arc::new(ListArray::try_new(item.clone(), offsets, values, None).ok()?),
                _ => Arc::new(
                    LargeListArray::try_new(item.clone(), OffsetBuffer::from_lengths(lengths), values, None)
                        .ok()?,
                ),
            })
        }
        _ => None,
    }
}

/// A column of `rows` values for `field`: [`valid_values`] for a column
/// `spec` uses, else nulls where the field takes them, else [`filled`].
fn column_of(field: &Field, spec: &JobSpec, rows: usize) -> Option<ArrayRef> {
    if spec.columns().contains(&field.name().as_str())
        && let Some(values) = valid_values(field, rows)
    {
        return Some(values);
    }
    match field.is_nullable() {
        true => Some(new_null_array(field.data_type(), rows)),
        false => filled(field.data_type(), rows),
    }
}

/// `rows` values of type `t` without a null anywhere (zeros, empty lists,
/// empty maps), for a column that may not hold nulls; `None` for a type
/// this cannot fill.
fn filled(t: &DataType, rows: usize) -> Option<ArrayRef> {
    Some(match t {
        DataType::Null => new_null_array(t, rows),
        DataType::Struct(fields) => {
            let children = fields
                .iter()
                .map(|f| filled(f.data_type(), rows))
                .collect::<Option<Vec<_>>>()?;
            Arc::new(StructArray::try_new_with_length(fields.clone(), children, None, rows).ok()?)
        }
        DataType::List(item) => Arc::new(
            ListArray::try_new(
                item.clone(),
                OffsetBuffer::new_zeroed(rows),
                filled(item.data_type(), 0)?,
                None,
            )
            .ok()?,
        ),
        DataType::LargeList(item) => Arc::new(
            LargeListArray::try_new(
                item.clone(),
                OffsetBuffer::new_zeroed(rows),
                filled(item.data_type(), 0)?,
                None,
            )
            .ok()?,
        ),
        DataType::FixedSizeList(item, len) => {
            let values = filled(item.data_type(), rows * usize::try_from(*len).ok()?)?;
            Arc::new(FixedSizeListArray::try_new_with_length(item.clone(), *len, values, None, rows).ok()?)
        }
        DataType::Map(entries, sorted) => {
            let DataType::Struct(fields) = entries.data_type() else {
                return None;
            };
            let children = fields
                .iter()
                .map(|f| filled(f.data_type(), 0))
                .collect::<Option<Vec<_>>>()?;
            let entries_array = StructArray::try_new_with_length(fields.clone(), children, None, 0).ok()?;
            Arc::new(
                MapArray::try_new(
                    entries.clone(),
                    OffsetBuffer::new_zeroed(rows),
                    entries_array,
                    None,
                    *sorted,
                )
                .ok()?,
            )
        }
        DataType::Dictionary(_, value) => arrow::compute::cast(&filled(value, rows)?, t).ok()?,
        DataType::FixedSizeBinary(width) => {
            let zeros = vec![0u8; rows * usize::try_from(*width).ok()?];
            Arc::new(FixedSizeBinaryArray::try_new_with_len(*width, zeros.into(), None, rows).ok()?)
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => Arc::new(IntervalMonthDayNanoArray::from(vec![
                IntervalMonthDayNano::ZERO;
                rows
            ])),
        _ => {
            let sources: [ArrayRef; 4] = [
                Arc::new(Int64Array::from(vec![0; rows])),
                Arc::new(Int32Array::from(vec![0; rows])),
                Arc::new(Float64Array::from(vec![0.0; rows])),
                Arc::new(StringArray::from(vec!["0"; rows])),
            ];
            sources.iter().find_map(|a| arrow::compute::cast(a, t).ok())?
        }
    })
}

/// The messages of a `DoPut` stream of `schema` (and `batch`), as
/// arrow-flight's encoder sends them, dictionaries kept; `None` where it
/// cannot encode them.
fn ipc_stream(schema: &SchemaRef, batch: Option<&RecordBatch>) -> Option<Vec<FlightData>> {
    let encoder = FlightDataEncoderBuilder::new()
        .with_schema(schema.clone())
        .with_dictionary_handling(DictionaryHandling::Resend)
        .build(futures::stream::iter(batch.cloned().map(Ok)));
    futures::executor::block_on(encoder.collect::<Vec<_>>())
        .into_iter()
        .collect::<Result<_, _>>()
        .ok()
}

/// `messages` as `DoPut` reads them: dictionary batches refused, the rest
/// through the agent's decoder, up to the first error (which ends the call).
fn decode_all(messages: Vec<FlightData>) -> Vec<Result<DecodedFlightData, arrow_flight::error::FlightError>> {
    let stream = futures::stream::iter(messages.into_iter().map(Ok))
        .and_then(|m| futures::future::ready(kindling_schemas::ipc::no_dictionary(m)));
    let mut decoded = Vec::new();
    for item in futures::executor::block_on_stream(kindling_schemas::ipc::decode(stream)) {
        let failed = item.is_err();
        decoded.push(item);
        if failed {
            break;
        }
    }
    decoded
}

/// Whether `t` holds a dictionary, itself or in a nested field.
fn holds_dictionary(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(..) => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) | DataType::Map(f, _) => {
            holds_dictionary(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().any(|f| holds_dictionary(f.data_type())),
        _ => false,
    }
}

/// A batch of `schema`, `rows` long, of columns [`column_of`] builds
/// (else none long, where every type has an empty array).
fn batch_of(schema: &SchemaRef, spec: &JobSpec, rows: usize) -> Option<RecordBatch> {
    let columns: Option<Vec<ArrayRef>> = schema.fields().iter().map(|f| column_of(f, spec, rows)).collect();
    let (columns, rows) = match columns {
        Some(columns) => (columns, rows),
        None => (
            schema
                .fields()
                .iter()
                .map(|f| new_empty_array(f.data_type()))
                .collect(),
            0,
        ),
    };
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options).ok()
}

proptest! {
    #[test]
    fn schemas_near_a_spec_validate_or_name_the_column_and_their_batches_pass(
        (which, fields) in near_valid_fields(),
        rows in 1usize..5,
    ) {
        let spec = &specs()[which];
        let schema = Arc::new(Schema::new(fields));
        for kind in [StreamKind::Train, StreamKind::Predict] {
            if !check_validation(&schema, spec, kind)? {
                continue;
            }
            let Some(batch) = batch_of(&schema, spec, rows) else { continue };
            // Valid values in every used column pass. (`validate` checks the
            // first of two columns of one name, `validate_batch` both; a
            // prediction stream's sample weight is not checked.)
            let used: Vec<&Field> = schema
                .fields()
                .iter()
                .map(|f| f.as_ref())
                .filter(|f| spec.columns().contains(&f.name().as_str()))
                .collect();
            let unique = used.iter().enumerate().all(|(i, f)| used[..i].iter().all(|g| g.name() != f.name()));
            let all_valid = used.iter().all(|f| valid_values(f, 0).is_some());
            match validate_batch(&batch, spec) {
                Ok(()) => {}
                Err(e) => prop_assert!(!(unique && all_valid), "a valid batch of {schema:?} was refused: {e}"),
            }
            // As a peer sends it, it arrives whole.
            let Some(messages) = ipc_stream(&schema, Some(&batch)) else { continue };
            let decoded: Vec<RecordBatch> = decode_all(messages)
                .into_iter()
                .filter_map(|d| match d {
                    Ok(DecodedFlightData { payload: DecodedPayload::RecordBatch(b), .. }) => Some(Ok(b)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<_, _>>()
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            // (An empty batch is not sent.)
            prop_assert_eq!(decoded, [batch].into_iter().filter(|b| b.num_rows() > 0).collect::<Vec<_>>());
        }
    }

    #[test]
    fn arbitrary_schemas_validate_or_refuse_and_decode_as_sent(
        fields in arbitrary_fields(),
        which in 0usize..3,
        rows in 0usize..3,
        target in prop::option::of(any::<prop::sample::Index>()),
        (e, cut, ins) in edits(),
    ) {
        let spec = &specs()[which];
        let schema = Arc::new(Schema::new(fields));
        for kind in [StreamKind::Train, StreamKind::Predict] {
            check_validation(&schema, spec, kind)?;
        }
        let batch = batch_of(&schema, spec, rows).filter(|b| b.num_rows() > 0);
        let Some(mut messages) = ipc_stream(&schema, batch.as_ref()) else { return Ok(()) };
        // Unchanged, the stream decodes to what was sent, or ends at its
        // first dictionary batch; with one message changed, to a precise
        // error or what validation then checks.
        let dictionaries = batch.is_some() && schema.fields().iter().any(|f| holds_dictionary(f.data_type()));
        if let Some(at) = target {
            let i = at.index(messages.len());
            messages[i].data_header = mutate(messages[i].data_header.to_vec(), &e, None, None).into();
            messages[i].data_body = mutate(messages[i].data_body.to_vec(), &[], cut, ins).into();
        }
        let (mut schemas, mut batches, mut errors) = (Vec::new(), Vec::new(), Vec::new());
        for item in decode_all(messages) {
            match item {
                Ok(DecodedFlightData { payload: DecodedPayload::Schema(s), .. }) => {
                    for kind in [StreamKind::Train, StreamKind::Predict] {
                        check_validation(&s, spec, kind)?;
                    }
                    schemas.push(s);
                }
                Ok(DecodedFlightData { payload: DecodedPayload::RecordBatch(b), .. }) => {
                    let _ = validate_batch(&b, spec);
                    batches.push(b);
                }
                Ok(_) => {}
                Err(e) => {
                    prop_assert!(!e.to_string().is_empty());
                    errors.push(e.to_string());
                }
            }
        }
        if target.is_none() {
            prop_assert_eq!(schemas, vec![schema]);
            if dictionaries {
                prop_assert!(batches.is_empty());
                prop_assert!(errors.len() == 1 && errors[0].contains("dictionary"), "{errors:?}");
            } else {
                prop_assert_eq!(batches, batch.into_iter().collect::<Vec<_>>());
                prop_assert!(errors.is_empty(), "an unchanged stream failed to decode: {errors:?}");
            }
        }
    }
}
