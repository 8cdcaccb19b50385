//! Kindling's wire contract: everything two Kindling processes (or a client in
//! another language) must agree on, plus the typed rendezvous client that
//! speaks it — so a client needs this crate, not the agent (nor burn).
//!
//! - [`descriptor`]: Flight path descriptors and tickets (`[job_id, "train"]`, …).
//! - [`metadata`]: per-batch `app_metadata` (producer + sequence) and `PutResult` acks.
//! - [`action`]: Flight action names and their JSON bodies.
//! - [`spec`]: the [`spec::JobSpec`], validated on construction.
//! - [`ipc`]: decoding a peer's Arrow IPC (a malformed message is an error, not a panic).
//! - [`schema`]: Arrow schema conventions and [`validate`](schema::validate).
//! - [`auth`]: bearer-token interceptors shared by every gRPC server and client.
//! - [`credential`]: signed, expiring job credentials by role (producer, peer, reader).
//! - [`trace`]: the W3C trace context (`traceparent`) calls carry between processes.
//! - [`channel`], [`tls`]: how connections are made and served (keepalive,
//!   deadlines, TLS and mutual TLS with certificates reloaded on change).
//! - [`ring`]: the ring data plane between agents (hello, frames, heartbeats).
//! - [`pb`]: the generated rendezvous gRPC service.
//! - [`rendezvous`]: the rendezvous's value types, their one conversion to
//!   `pb`, and the typed async [`RendezvousClient`](rendezvous::RendezvousClient)
//!   (the server is the `kindling-rendezvous` crate).

pub mod action;
pub mod auth;
pub mod channel;
pub mod credential;
pub mod descriptor;
pub mod ipc;
pub mod metadata;
pub mod model_serving;
pub mod rendezvous;
pub mod ring;
pub mod schema;
pub mod scoring;
pub mod spec;
pub mod status;
pub mod tls;
pub mod trace;

/// Generated protobuf messages and tonic services.
pub mod pb {
    /// The barrier rendezvous service (`kindling.rendezvous.v1`).
    pub mod rendezvous {
        #![allow(missing_debug_implementations, clippy::all, rust_2018_idioms)]
        tonic::include_proto!("kindling.rendezvous.v1");

        /// The encoded descriptor set of `kindling.rendezvous.v1`, for gRPC
        /// reflection.
        pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("rendezvous_descriptor");
    }

    /// The encoded descriptor set of `arrow.flight.protocol` (the Flight
    /// service the agent serves through arrow-flight), for gRPC reflection.
    pub const FLIGHT_FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("flight_descriptor");
}

pub use action::{Action, ActionKind};
pub use descriptor::{DataPath, Split};
pub use spec::{JobSpec, ModelSpec, OptimizerSpec, Task};

#[cfg(test)]
mod tests {
    use arrow_flight::{
        Action, ActionType, BasicAuth, CancelFlightInfoRequest, CancelFlightInfoResult, Criteria, FlightData,
        FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, Location,
        PollInfo, PutResult, RenewFlightEndpointRequest, Result, SchemaResult, Ticket,
    };
    use prost::Message;
    use prost_types::FileDescriptorSet;

    /// The field number of the first field in `bytes` (a message with one field set).
    fn first_field(bytes: &[u8]) -> u64 {
        let (mut key, mut shift) = (0u64, 0);
        for b in bytes {
            key |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return key >> 3;
            }
            shift += 7;
        }
        panic!("no field in {bytes:?}")
    }

    /// `flight.proto`, the description reflection serves, gives each field the
    /// number arrow-flight's own types write it with: every message, every
    /// field, set alone and encoded by arrow-flight.
    #[test]
    // A message of one field is set whole: `case!` updates the rest anyway.
    #[allow(clippy::needless_update)]
    fn the_flight_description_numbers_fields_as_arrow_flight_encodes_them() {
        let set = FileDescriptorSet::decode(super::pb::FLIGHT_FILE_DESCRIPTOR_SET).expect("descriptor set");
        let file = set
            .file
            .iter()
            .find(|f| f.package() == "arrow.flight.protocol")
            .expect("arrow.flight.protocol");
        let number = |message: &str, field: &str| -> u64 {
            let m = file
                .message_type
                .iter()
                .find(|m| m.name() == message)
                .expect(message);
            let f = m.field.iter().find(|f| f.name() == field).expect(field);
            u64::try_from(f.number()).expect("positive")
        };
        let b = || bytes::Bytes::from_static(b"x");
        let descriptor = FlightDescriptor::new_path(vec!["p".into()]);
        let time = prost_types::Timestamp::default;
        // (message, field, the message with only that field set, encoded)
        macro_rules! case {
            ($ty:ident . $field:ident = $value:expr) => {
                (
                    stringify!($ty),
                    stringify!($field).trim_start_matches("r#"),
                    $ty {
                        $field: $value,
                        ..Default::default()
                    }
                    .encode_to_vec(),
                )
            };
        }
        let cases = [
            case!(HandshakeRequest.protocol_version = 1),
            case!(HandshakeRequest.payload = b()),
            case!(HandshakeResponse.protocol_version = 1),
            case!(HandshakeResponse.payload = b()),
            case!(BasicAuth.username = "u".into()),
            case!(BasicAuth.password = "p".into()),
            case!(ActionType.r#type = "t".into()),
            case!(ActionType.description = "d".into()),
            case!(Criteria.expression = b()),
            case!(Action.r#type = "t".into()),
            case!(Action.body = b()),
            case!(Result.body = b()),
            case!(SchemaResult.schema = b()),
            case!(FlightDescriptor.r#type = 1),
            case!(FlightDescriptor.cmd = b()),
            case!(FlightDescriptor.path = vec!["p".into()]),
            case!(FlightInfo.schema = b()),
            case!(FlightInfo.flight_descriptor = Some(descriptor.clone())),
            case!(FlightInfo.endpoint = vec![FlightEndpoint::default()]),
            case!(FlightInfo.total_records = 1),
            case!(FlightInfo.total_bytes = 1),
            case!(FlightInfo.ordered = true),
            case!(FlightInfo.app_metadata = b()),
            case!(PollInfo.info = Some(FlightInfo::default())),
            case!(PollInfo.flight_descriptor = Some(descriptor.clone())),
            case!(PollInfo.progress = Some(0.5)),
            case!(PollInfo.expiration_time = Some(time())),
            case!(CancelFlightInfoRequest.info = Some(FlightInfo::default())),
            case!(CancelFlightInfoResult.status = 1),
            case!(Ticket.ticket = b()),
            case!(Location.uri = "u".into()),
            case!(FlightEndpoint.ticket = Some(Ticket::default())),
            case!(FlightEndpoint.location = vec![Location::default()]),
            case!(FlightEndpoint.expiration_time = Some(time())),
            case!(FlightEndpoint.app_metadata = b()),
            case!(RenewFlightEndpointRequest.endpoint = Some(FlightEndpoint::default())),
            case!(FlightData.flight_descriptor = Some(descriptor.clone())),
            case!(FlightData.data_header = b()),
            case!(FlightData.app_metadata = b()),
            case!(FlightData.data_body = b()),
            case!(PutResult.app_metadata = b()),
        ];
        for (message, field, bytes) in &cases {
            assert_eq!(number(message, field), first_field(bytes), "{message}.{field}");
        }
        // Every field the description declares was checked.
        for m in &file.message_type {
            for f in &m.field {
                assert!(
                    cases
                        .iter()
                        .any(|(message, field, _)| message == &m.name() && field == &f.name()),
                    "{}.{} is not checked",
                    m.name(),
                    f.name()
                );
            }
        }
    }
}
