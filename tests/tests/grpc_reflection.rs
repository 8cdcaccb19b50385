//! gRPC server reflection on the agent and the rendezvous: a standard
//! reflection client (v1, as grpcurl asks, and the older v1alpha) lists every
//! service a server serves and gets each one's description, with the token;
//! without one, only the health check answers (issue #59: reflection,
//! health `Watch` and paths no service serves check the token first).

use std::collections::BTreeSet;

use kindling_schemas::auth::{BearerAttach, Token};
use kindling_schemas::rendezvous::RendezvousClient;
use prost::Message;
use prost_types::{FileDescriptorProto, MethodDescriptorProto};
use tonic::Code;
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};

use kindling_tests::cluster::cluster;

/// The token of the cluster the tests start, attached to every call.
fn attach(token: &Token) -> BearerAttach {
    BearerAttach::new(Some(token)).expect("a valid token")
}

/// One reflection request (`$request`, a `MessageRequest` of version `$v`)
/// to the server on `$channel`, with `$token`: the message of its one
/// answer. The two versions' generated types differ in name only, hence a
/// macro.
macro_rules! ask {
    ($v:ident, $channel:expr, $token:expr, $request:expr) => {{
        let mut client =
            $v::server_reflection_client::ServerReflectionClient::with_interceptor($channel, attach($token));
        let request = $v::ServerReflectionRequest {
            host: String::new(),
            message_request: Some($request),
        };
        let mut answers = client
            .server_reflection_info(futures::stream::iter([request]))
            .await
            .expect("reflection answers with the token")
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
    ($v:ident, $channel:expr, $token:expr) => {{
        use $v::server_reflection_request::MessageRequest;
        use $v::server_reflection_response::MessageResponse;
        match ask!($v, $channel, $token, MessageRequest::ListServices(String::new())) {
            Some(MessageResponse::ListServicesResponse(list)) => list
                .service
                .into_iter()
                .map(|s| s.name)
                .collect::<BTreeSet<String>>(),
            other => panic!("not a service list: {other:?}"),
        }
    }};
}

async fn services_v1(channel: Channel, token: &Token) -> BTreeSet<String> {
    services!(v1, channel, token)
}

async fn services_v1alpha(channel: Channel, token: &Token) -> BTreeSet<String> {
    services!(v1alpha, channel, token)
}

/// The methods of `service` (fully qualified) as reflection v1 describes
/// them: the file that declares it, decoded.
async fn methods(channel: Channel, token: &Token, service: &str) -> Vec<MethodDescriptorProto> {
    use v1::server_reflection_request::MessageRequest;
    use v1::server_reflection_response::MessageResponse;
    let answer = ask!(
        v1,
        channel,
        token,
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
    let token = cluster
        .token()
        .expect("the local cluster runs with a token")
        .clone();
    let standard = ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"];

    // The agent: Flight beside the standard services.
    let agent = Channel::from_shared(cluster.agent_url(0).expect("agent"))
        .expect("url")
        .connect()
        .await
        .expect("connect to the agent");
    let listed = services_v1(agent.clone(), &token).await;
    for service in standard.iter().chain(&["arrow.flight.protocol.FlightService"]) {
        assert!(
            listed.contains(*service),
            "the agent lists {listed:?}, not {service}"
        );
    }
    // v1alpha lists the same, each version naming itself as the reflection service.
    let alpha = services_v1alpha(agent.clone(), &token).await;
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
    let flight = methods(agent.clone(), &token, "arrow.flight.protocol.FlightService").await;
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
    let listed = services_v1(rendezvous.clone(), &token).await;
    for service in standard.iter().chain(&["kindling.rendezvous.v1.Rendezvous"]) {
        assert!(
            listed.contains(*service),
            "the rendezvous lists {listed:?}, not {service}"
        );
    }
    let described = methods(rendezvous.clone(), &token, "kindling.rendezvous.v1.Rendezvous").await;
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

    // A rendezvous call without the token is refused.
    let unauthenticated = RendezvousClient::connect(cluster.rendezvous_url(), None)
        .await
        .expect("connect")
        .list_agents()
        .await;
    assert!(unauthenticated.is_err(), "a call without a token was answered");
}

/// What answers a caller without the token, on the agent and on the
/// rendezvous: the health check alone (the kubelet's gRPC probe sends
/// none). Health `Watch` (a stream held as long as the caller likes),
/// reflection, and a path no service there serves (Flight on the
/// rendezvous, the rendezvous' service on an agent) are UNAUTHENTICATED
/// before anything else answers; with the token they answer as before
/// (the unknown path UNIMPLEMENTED).
#[tokio::test]
async fn without_the_token_only_the_health_check_answers() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let (cluster, _dir) = cluster(1).await;
    let token = cluster
        .token()
        .expect("the local cluster runs with a token")
        .clone();
    let ask = || HealthCheckRequest {
        service: String::new(),
    };
    let servers = [
        ("agent", cluster.agent_url(0).expect("agent")),
        ("rendezvous", cluster.rendezvous_url()),
    ];
    for (name, url) in servers {
        let channel = Channel::from_shared(url)
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let mut open = HealthClient::new(channel.clone());
        let checked = open.check(ask()).await.expect("the health check needs no token");
        assert_eq!(
            checked.into_inner().status,
            ServingStatus::Serving as i32,
            "{name}"
        );
        let refused = open.watch(ask()).await.expect_err("a watch without the token");
        assert_eq!(refused.code(), Code::Unauthenticated, "{name}: {refused}");
        let mut authed = HealthClient::with_interceptor(channel.clone(), attach(&token));
        let mut watch = authed
            .watch(ask())
            .await
            .expect("a watch with the token")
            .into_inner();
        let first = watch.message().await.expect("an answer").expect("a status");
        assert_eq!(first.status, ServingStatus::Serving as i32, "{name}");

        let request = v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        };
        let mut reflection = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
        let refused = match reflection
            .server_reflection_info(futures::stream::iter([request]))
            .await
        {
            Err(status) => status,
            Ok(answers) => answers
                .into_inner()
                .message()
                .await
                .expect_err("reflection without the token"),
        };
        assert_eq!(refused.code(), Code::Unauthenticated, "{name}: {refused}");

        let unknown = |with: Option<&Token>| {
            let channel = channel.clone();
            let attach = BearerAttach::new(with).expect("token");
            async move {
                if name == "agent" {
                    use kindling_schemas::pb::rendezvous as pb;
                    pb::rendezvous_client::RendezvousClient::with_interceptor(channel, attach)
                        .list_agents(pb::ListAgentsRequest {})
                        .await
                        .expect_err("no rendezvous on an agent")
                } else {
                    arrow_flight::flight_service_client::FlightServiceClient::with_interceptor(
                        channel, attach,
                    )
                    .list_actions(arrow_flight::Empty {})
                    .await
                    .expect_err("no Flight on the rendezvous")
                }
            }
        };
        let refused = unknown(None).await;
        assert_eq!(refused.code(), Code::Unauthenticated, "{name}: {refused}");
        let unimplemented = unknown(Some(&token)).await;
        assert_eq!(
            unimplemented.code(),
            Code::Unimplemented,
            "{name}: {unimplemented}"
        );
    }
}
