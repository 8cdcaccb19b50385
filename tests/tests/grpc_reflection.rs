//! gRPC server reflection on the agent and the rendezvous: a standard
//! reflection client (v1, as grpcurl asks, and the older v1alpha) lists every
//! service a server serves and gets each one's description, with no token,
//! while the services themselves still refuse a caller without one.

use std::collections::BTreeSet;

use kindling_schemas::rendezvous::RendezvousClient;
use prost::Message;
use prost_types::{FileDescriptorProto, MethodDescriptorProto};
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};

use kindling_tests::cluster::cluster;

/// One reflection request (`$request`, a `MessageRequest` of version `$v`)
/// to the server on `$channel`: the message of its one answer. The two
/// versions' generated types differ in name only, hence a macro.
macro_rules! ask {
    ($v:ident, $channel:expr, $request:expr) => {{
        let mut client = $v::server_reflection_client::ServerReflectionClient::new($channel);
        let request = $v::ServerReflectionRequest {
            host: String::new(),
            message_request: Some($request),
        };
        let mut answers = client
            .server_reflection_info(futures::stream::iter([request]))
            .await
            .expect("reflection answers without a token")
            .into_inner();
        answers
            .message()
            .await
            .expect("answer")
            .expect("one answer")
            .message_response
    }};
}

/// The services the server on `$channel` lists through reflection `$v`.
macro_rules! services {
    ($v:ident, $channel:expr) => {{
        use $v::server_reflection_request::MessageRequest;
        use $v::server_reflection_response::MessageResponse;
        match ask!($v, $channel, MessageRequest::ListServices(String::new())) {
            Some(MessageResponse::ListServicesResponse(list)) => list
                .service
                .into_iter()
                .map(|s| s.name)
                .collect::<BTreeSet<String>>(),
            other => panic!("not a service list: {other:?}"),
        }
    }};
}

async fn services_v1(channel: Channel) -> BTreeSet<String> {
    services!(v1, channel)
}

async fn services_v1alpha(channel: Channel) -> BTreeSet<String> {
    services!(v1alpha, channel)
}

/// The methods of `service` (fully qualified) as reflection v1 describes
/// them: the file that declares it, decoded.
async fn methods(channel: Channel, service: &str) -> Vec<MethodDescriptorProto> {
    use v1::server_reflection_request::MessageRequest;
    use v1::server_reflection_response::MessageResponse;
    let answer = ask!(
        v1,
        channel,
        MessageRequest::FileContainingSymbol(service.to_owned())
    );
    let Some(MessageResponse::FileDescriptorResponse(files)) = answer else {
        panic!("no file declares {service}");
    };
    let (package, name) = service.rsplit_once('.').expect("qualified name");
    files
        .file_descriptor_proto
        .iter()
        .map(|bytes| FileDescriptorProto::decode(bytes.as_slice()).expect("a file descriptor"))
        .filter(|file| file.package() == package)
        .flat_map(|file| file.service)
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("{service} is not in the files reflection returned"))
        .method
}

fn names(methods: &[MethodDescriptorProto]) -> BTreeSet<&str> {
    methods.iter().map(|m| m.name()).collect()
}

#[tokio::test]
async fn the_agent_and_the_rendezvous_describe_their_services_to_a_standard_reflection_client() {
    let (cluster, _dir) = cluster(1).await;
    assert!(cluster.token().is_some(), "the local cluster runs with a token");
    let standard = ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"];

    // The agent: Flight beside the standard services.
    let agent = Channel::from_shared(cluster.agent_url(0).expect("agent"))
        .expect("url")
        .connect()
        .await
        .expect("connect to the agent");
    let listed = services_v1(agent.clone()).await;
    for service in standard.iter().chain(&["arrow.flight.protocol.FlightService"]) {
        assert!(
            listed.contains(*service),
            "the agent lists {listed:?}, not {service}"
        );
    }
    // v1alpha lists the same, each version naming itself as the reflection service.
    let alpha = services_v1alpha(agent.clone()).await;
    let without = |set: &BTreeSet<String>| -> BTreeSet<String> {
        set.iter()
            .filter(|s| !s.starts_with("grpc.reflection."))
            .cloned()
            .collect()
    };
    assert!(
        alpha.contains("grpc.reflection.v1alpha.ServerReflection"),
        "{alpha:?}"
    );
    assert_eq!(without(&alpha), without(&listed), "v1alpha lists what v1 does");
    let flight = methods(agent.clone(), "arrow.flight.protocol.FlightService").await;
    assert_eq!(
        names(&flight),
        BTreeSet::from([
            "Handshake",
            "ListFlights",
            "GetFlightInfo",
            "PollFlightInfo",
            "GetSchema",
            "DoGet",
            "DoPut",
            "DoExchange",
            "DoAction",
            "ListActions",
        ])
    );
    let do_put = flight.iter().find(|m| m.name() == "DoPut").expect("DoPut");
    assert!(
        do_put.client_streaming() && do_put.server_streaming(),
        "{do_put:?}"
    );
    assert_eq!(do_put.input_type(), ".arrow.flight.protocol.FlightData");

    // The rendezvous: its own service, every method the generated server routes.
    let rendezvous = Channel::from_shared(cluster.rendezvous_url())
        .expect("url")
        .connect()
        .await
        .expect("connect to the rendezvous");
    let listed = services_v1(rendezvous.clone()).await;
    for service in standard.iter().chain(&["kindling.rendezvous.v1.Rendezvous"]) {
        assert!(
            listed.contains(*service),
            "the rendezvous lists {listed:?}, not {service}"
        );
    }
    let described = methods(rendezvous.clone(), "kindling.rendezvous.v1.Rendezvous").await;
    let proto = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../flight-schemas/proto/rendezvous.proto"),
    )
    .expect("rendezvous.proto");
    let declared: BTreeSet<&str> = proto
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rpc "))
        .filter_map(|l| l.split('(').next())
        .map(str::trim)
        .collect();
    assert!(declared.len() >= 10, "{declared:?}");
    assert_eq!(
        names(&described),
        declared,
        "reflection describes rendezvous.proto's methods"
    );

    // Reflection answered without a token; the services themselves did not
    // open: a rendezvous call without one is refused.
    let unauthenticated = RendezvousClient::connect(cluster.rendezvous_url(), None)
        .await
        .expect("connect")
        .list_agents()
        .await;
    assert!(unauthenticated.is_err(), "a call without a token was answered");
}
