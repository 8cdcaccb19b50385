//! The bad-input battery: more than 40 kinds of bad input sent to every
//! endpoint of a real rendezvous and agent (Flight actions, DoPut, DoGet,
//! GetFlightInfo, DoExchange, the collective port, the rendezvous' gRPC
//! service, the health port). For each: the error names the problem
//! (its gRPC code and words of its message), and nothing changed — every
//! job's status on the agent and at the rendezvous, and the live agents, are
//! the same after as before. Two jobs stand by: one being fed, one trained.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Float64Array, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteOptions};
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor, SchemaAsIpc, Ticket};
use futures::StreamExt;
use kindling::feed::AgentClient;
use kindling::local::LocalCluster;
use kindling_schemas::action::{Action, JobList};
use kindling_schemas::auth::{BearerAttach, Token};
use kindling_schemas::descriptor::{DataPath, Split};
use kindling_schemas::metadata::BatchMetadata;
use kindling_schemas::pb;
use kindling_schemas::spec::ModelSpec;
use kindling_tests::cluster::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::bytes::{Buf, BufMut};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

type Flight = FlightServiceClient<InterceptedService<Channel, BearerAttach>>;

/// What must not change: every job on the agent and at the rendezvous, and
/// the live agents.
#[derive(Debug, PartialEq)]
struct Snapshot {
    agent: Vec<String>,
    rendezvous: Vec<String>,
    agents: Vec<String>,
}

async fn snapshot(cluster: &LocalCluster, agent: &AgentClient) -> Snapshot {
    let list: JobList = agent.action(&Action::ListJobs).await.expect("list_jobs");
    let mut on_agent: Vec<String> = list
        .jobs
        .iter()
        .map(|j| {
            format!(
                "{} {:?} attempt {} epoch {} rows {}+{} trained {:?} error {:?}",
                j.job_id,
                j.state,
                j.attempt,
                j.epoch,
                j.rows_train,
                j.rows_eval,
                j.rows_trained_per_epoch,
                j.error
            )
        })
        .collect();
    on_agent.sort();
    let rv =
        kindling_schemas::rendezvous::RendezvousClient::connect(cluster.rendezvous_url(), cluster.token())
            .await
            .expect("rendezvous");
    let mut at_rendezvous: Vec<String> = rv
        .list_jobs()
        .await
        .expect("jobs")
        .iter()
        .map(|j| {
            format!(
                "{} {:?} attempt {} members {}",
                j.job_id,
                j.state,
                j.attempt,
                j.members.len()
            )
        })
        .collect();
    at_rendezvous.sort();
    let mut agents: Vec<String> = rv
        .list_agents()
        .await
        .expect("agents")
        .into_iter()
        .map(|a| a.agent_id)
        .collect();
    agents.sort();
    Snapshot {
        agent: on_agent,
        rendezvous: at_rendezvous,
        agents,
    }
}

fn flight(url: &str, token: Option<&Token>) -> Flight {
    let channel = kindling_schemas::channel::ChannelConfig::default()
        .dial(url, token.is_some())
        .expect("dial")
        .connect_lazy();
    FlightServiceClient::with_interceptor(channel, BearerAttach::new(token).expect("token"))
        .max_encoding_message_size(usize::MAX)
}

/// The status a call, or the first failing item of its reply stream, ends with.
async fn failure<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>>,
) -> tonic::Status {
    match call.await {
        Err(s) => s,
        Ok(reply) => {
            let mut stream = reply.into_inner();
            while let Some(item) = stream.next().await {
                if let Err(s) = item {
                    return s;
                }
            }
            panic!("the call succeeded")
        }
    }
}

fn schema_msg(schema: &Schema, path: Option<&DataPath>) -> FlightData {
    let mut m: FlightData = SchemaAsIpc::new(schema, &IpcWriteOptions::default()).into();
    m.flight_descriptor = path.map(DataPath::descriptor);
    m
}

fn batch_msg(b: &RecordBatch, producer: &str, seq: u64) -> FlightData {
    let options = IpcWriteOptions::default();
    let (_, encoded) = IpcDataGenerator::default()
        .encode(
            b,
            &mut DictionaryTracker::new(false),
            &options,
            &mut Default::default(),
        )
        .expect("encode");
    let mut m: FlightData = encoded.into();
    m.app_metadata = BatchMetadata {
        producer: producer.into(),
        seq,
        attempt: 0,
    }
    .encode()
    .into();
    m
}

fn rule(x1: Vec<f64>, x2: Vec<f32>, y: Vec<Option<i32>>) -> RecordBatch {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Float64Array::from(x1)),
        Arc::new(Float32Array::from(x2)),
        Arc::new(Int32Array::from(y)),
    ];
    RecordBatch::try_new(rule_schema(), cols).expect("batch")
}

fn other_epochs(spec: &serde_json::Value) -> serde_json::Value {
    let mut s = spec.clone();
    s["epochs"] = serde_json::json!(3);
    s
}

/// A `DoPut` of `messages` (the stream's first names its path).
async fn put_raw(f: &mut Flight, messages: Vec<FlightData>) -> tonic::Status {
    failure(f.do_put(futures::stream::iter(messages))).await
}

/// Passes bytes through unchanged: garbage protobuf for the rendezvous.
#[derive(Debug, Clone, Default)]
struct Raw;
impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}
impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}
impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let v = src.chunk().to_vec();
        src.advance(v.len());
        Ok(Some(v))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_kinds_of_bad_input_are_refused_by_name_and_change_nothing() {
    let (cluster, _dir) = cluster(1).await;
    let url = cluster.agent_url(0).expect("agent");
    let token = cluster.token().expect("token").clone();
    let agent = agent_client(&cluster, 0);
    // A job being fed (Ingesting, 100 rows) and one trained (Succeeded, with a model).
    start_job(&cluster, "fed", &linear_spec(1), &[0]).await;
    put(&agent, "fed", Split::Train, "p", &[rule_batch(100, 1)])
        .await
        .expect("put");
    start_job(&cluster, "trained", &linear_spec(1), &[0]).await;
    put(&agent, "trained", Split::Train, "p", &[rule_batch(200, 2)])
        .await
        .expect("put");
    end_of_data(&agent, "trained", Split::Train, Some(200)).await;
    wait_done(&agent, "trained").await;
    let before = snapshot(&cluster, &agent).await;
    let mut f = flight(&url, Some(&token));
    let fed = DataPath::data("fed", Split::Train);
    let mut cases = 0;

    // Every case runs; what went wrong is listed at the end.
    let mut mismatches: Vec<String> = Vec::new();
    macro_rules! case {
        ($what:expr, $status:expr, $code:expr, $words:expr) => {{
            let status: tonic::Status = $status;
            if status.code() != $code {
                mismatches.push(format!(
                    "{}: {:?}, expected {:?}: {}",
                    $what,
                    status.code(),
                    $code,
                    status.message()
                ));
            }
            for w in $words {
                if !status.message().contains(w) {
                    mismatches.push(format!("{}: {w:?} not in {:?}", $what, status.message()));
                }
            }
            let after = snapshot(&cluster, &agent).await;
            if after != before {
                mismatches.push(format!("{} changed something: {after:#?}", $what));
            }
            cases += 1;
        }};
    }
    let action = |name: &str, body: &[u8]| arrow_flight::Action::new(name.to_owned(), body.to_vec());
    let spec_json = serde_json::to_value(linear_spec(1)).expect("spec json");
    let start = |job: &str| {
        serde_json::to_vec(
            &serde_json::json!({"job_id": job, "spec": spec_json, "rendezvous": cluster.rendezvous_url()}),
        )
        .expect("json")
    };

    // ----- Flight actions
    case!(
        "unknown action",
        failure(f.do_action(action("drop_tables", b"{}"))).await,
        Code::InvalidArgument,
        ["drop_tables"]
    );
    case!(
        "action body not JSON",
        failure(f.do_action(action("job_status", b"\xff\xfe"))).await,
        Code::InvalidArgument,
        ["job_status"]
    );
    case!(
        "action body missing a field",
        failure(f.do_action(action("job_status", b"{}"))).await,
        Code::InvalidArgument,
        ["job_id"]
    );
    case!(
        "job id `.`",
        failure(f.do_action(action("start_job", &start(".")))).await,
        Code::InvalidArgument,
        ["job id"]
    );
    case!(
        "job id `..`",
        failure(f.do_action(action("start_job", &start("..")))).await,
        Code::InvalidArgument,
        ["job id"]
    );
    case!(
        "job id with a slash",
        failure(f.do_action(action("start_job", &start("a/b")))).await,
        Code::InvalidArgument,
        ["a/b"]
    );
    case!(
        "job id of 200 characters",
        failure(f.do_action(action("start_job", &start(&"j".repeat(200))))).await,
        Code::InvalidArgument,
        ["job id"]
    );
    case!(
        "start_job for a job the rendezvous lacks",
        failure(f.do_action(action("start_job", &start("never-created")))).await,
        Code::NotFound,
        ["never-created"]
    );
    let mut custom = spec_json.clone();
    custom["model"] =
        serde_json::to_value(ModelSpec::custom("gpt-9", &serde_json::json!({})).expect("custom"))
            .expect("json");
    let body = serde_json::to_vec(
        &serde_json::json!({"job_id": "newcomer", "spec": custom, "rendezvous": cluster.rendezvous_url()}),
    )
    .expect("json");
    case!(
        "a model the agent lacks",
        failure(f.do_action(action("start_job", &body))).await,
        Code::InvalidArgument,
        ["gpt-9", "linear"]
    );
    let mut zero = spec_json.clone();
    zero["num_slots"] = serde_json::json!(0);
    let body = serde_json::to_vec(
        &serde_json::json!({"job_id": "newcomer", "spec": zero, "rendezvous": cluster.rendezvous_url()}),
    )
    .expect("json");
    case!(
        "a spec of 0 slots",
        failure(f.do_action(action("start_job", &body))).await,
        Code::InvalidArgument,
        ["slots"]
    );
    let mut huge = spec_json.clone();
    // Three hidden layers of the widest width a spec allows: 8.6 G parameters.
    huge["model"] = serde_json::to_value(ModelSpec::Mlp {
        hidden: vec![1 << 16; 3],
    })
    .expect("json");
    let body = serde_json::to_vec(
        &serde_json::json!({"job_id": "huge", "spec": huge, "rendezvous": cluster.rendezvous_url()}),
    )
    .expect("json");
    let huge_status = failure(f.do_action(action("start_job", &body))).await;
    case!(
        "a spec naming a model of 8.6 G parameters",
        huge_status,
        Code::ResourceExhausted,
        ["--max-model-params"]
    );
    let body = serde_json::to_vec(&serde_json::json!({"job_id": "fed", "spec": other_epochs(&spec_json), "rendezvous": cluster.rendezvous_url()})).expect("json");
    case!(
        "another spec for a running job",
        failure(f.do_action(action("start_job", &body))).await,
        Code::FailedPrecondition,
        ["fed"]
    );
    let body =
        serde_json::to_vec(&serde_json::json!({"job_id": "x", "spec": spec_json, "rendezvous": "ftp://rv"}))
            .expect("json");
    case!(
        "a rendezvous that is not http(s)",
        failure(f.do_action(action("start_job", &body))).await,
        Code::InvalidArgument,
        ["ftp://rv"]
    );
    case!(
        "status of an unknown job",
        failure(f.do_action(action("job_status", br#"{"job_id": "ghost"}"#))).await,
        Code::NotFound,
        ["ghost"]
    );
    case!(
        "cancel of an unknown job",
        failure(f.do_action(action("cancel_job", br#"{"job_id": "ghost", "reason": "r"}"#))).await,
        Code::NotFound,
        ["ghost"]
    );
    case!(
        "end_of_data of a split that does not exist",
        failure(f.do_action(action("end_of_data", br#"{"job_id": "fed", "split": "test"}"#))).await,
        Code::InvalidArgument,
        ["test"]
    );
    case!(
        "end_of_data with the wrong count",
        failure(f.do_action(action(
            "end_of_data",
            br#"{"job_id": "fed", "split": "train", "expected_rows": 99}"#
        )))
        .await,
        Code::FailedPrecondition,
        ["100", "99"]
    );
    case!(
        "create_job of 0 slots",
        failure(f.do_action(action("create_job", br#"{"job_id": "zero", "num_slots": 0}"#))).await,
        Code::InvalidArgument,
        ["slot"]
    );

    // ----- DoPut
    case!(
        "an empty DoPut",
        put_raw(&mut f, vec![]).await,
        Code::InvalidArgument,
        ["empty"]
    );
    case!(
        "a DoPut without a descriptor",
        put_raw(&mut f, vec![schema_msg(&rule_schema(), None)]).await,
        Code::InvalidArgument,
        ["descriptor"]
    );
    let mut cmd = schema_msg(&rule_schema(), None);
    cmd.flight_descriptor = Some(FlightDescriptor {
        r#type: DescriptorType::Cmd as i32,
        cmd: b"SELECT 1".to_vec().into(),
        path: vec![],
    });
    case!(
        "a DoPut with a CMD descriptor",
        put_raw(&mut f, vec![cmd]).await,
        Code::InvalidArgument,
        ["PATH", "CMD"]
    );
    case!(
        "a DoPut into a model",
        put_raw(
            &mut f,
            vec![schema_msg(
                &rule_schema(),
                Some(&DataPath::Model { job_id: "fed".into() })
            )]
        )
        .await,
        Code::InvalidArgument,
        ["DoPut"]
    );
    case!(
        "a DoPut into an unknown job",
        put_raw(
            &mut f,
            vec![
                schema_msg(&rule_schema(), Some(&DataPath::data("ghost", Split::Train))),
                batch_msg(&rule_batch(5, 1), "p", 0)
            ]
        )
        .await,
        Code::NotFound,
        ["ghost"]
    );
    let no_x2 = Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Float64, true),
        Field::new("y", DataType::Int32, true),
    ]));
    case!(
        "a schema without a feature",
        put_raw(&mut f, vec![schema_msg(&no_x2, Some(&fed))]).await,
        Code::InvalidArgument,
        ["x2"]
    );
    let text_label = Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Float64, true),
        Field::new("x2", DataType::Float32, true),
        Field::new("y", DataType::Utf8, true),
    ]));
    case!(
        "a text label",
        put_raw(&mut f, vec![schema_msg(&text_label, Some(&fed))]).await,
        Code::InvalidArgument,
        ["`y`"]
    );
    // A valid schema of another layout: x2 becomes a vector of 3 values.
    let vector_x2 = Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Float64, true),
        Field::new(
            "x2",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 3),
            true,
        ),
        Field::new("y", DataType::Int32, true),
    ]));
    let put_one = |b: RecordBatch| vec![schema_msg(&rule_schema(), Some(&fed)), batch_msg(&b, "p", 1)];
    case!(
        "NaN in a feature",
        put_raw(&mut f, put_one(rule(vec![f64::NAN], vec![0.5], vec![Some(1)]))).await,
        Code::InvalidArgument,
        ["x1"]
    );
    case!(
        "infinity in a feature",
        put_raw(
            &mut f,
            put_one(rule(vec![0.1], vec![f32::INFINITY], vec![Some(1)]))
        )
        .await,
        Code::InvalidArgument,
        ["x2"]
    );
    case!(
        "a null label",
        put_raw(&mut f, put_one(rule(vec![0.1], vec![0.5], vec![None]))).await,
        Code::InvalidArgument,
        ["y"]
    );
    case!(
        "a label outside the classes",
        put_raw(&mut f, put_one(rule(vec![0.1], vec![0.5], vec![Some(5)]))).await,
        Code::InvalidArgument,
        ["y", "5"]
    );
    let mut no_meta = batch_msg(&rule_batch(5, 3), "p", 1);
    no_meta.app_metadata = Default::default();
    case!(
        "a batch without metadata",
        put_raw(&mut f, vec![schema_msg(&rule_schema(), Some(&fed)), no_meta]).await,
        Code::InvalidArgument,
        ["metadata"]
    );
    let mut bad_meta = batch_msg(&rule_batch(5, 3), "p", 1);
    bad_meta.app_metadata = b"{\"producer\": 7}".to_vec().into();
    case!(
        "malformed batch metadata",
        put_raw(&mut f, vec![schema_msg(&rule_schema(), Some(&fed)), bad_meta]).await,
        Code::InvalidArgument,
        ["metadata"]
    );
    case!(
        "a sequence gap",
        put_raw(
            &mut f,
            vec![
                schema_msg(&rule_schema(), Some(&fed)),
                batch_msg(&rule_batch(5, 3), "p", 7)
            ]
        )
        .await,
        Code::InvalidArgument,
        ["seq"]
    );
    case!(
        "a schema change in the middle of a DoPut",
        put_raw(
            &mut f,
            vec![
                schema_msg(&rule_schema(), Some(&fed)),
                batch_msg(&rule_batch(5, 3), "p", 1),
                schema_msg(&vector_x2, None)
            ]
        )
        .await,
        Code::InvalidArgument,
        ["layout", "differs"]
    );
    let mut truncated = batch_msg(&rule_batch(50, 3), "p", 1);
    truncated.data_body = truncated.data_body.slice(0..truncated.data_body.len() / 3);
    case!(
        "a truncated Arrow IPC body",
        put_raw(&mut f, vec![schema_msg(&rule_schema(), Some(&fed)), truncated]).await,
        Code::InvalidArgument,
        ["IPC"]
    );
    let mut garbage = batch_msg(&rule_batch(5, 3), "p", 1);
    garbage.data_header = b"not a flatbuffer at all".to_vec().into();
    case!(
        "a garbage Arrow IPC header",
        put_raw(&mut f, vec![schema_msg(&rule_schema(), Some(&fed)), garbage]).await,
        Code::InvalidArgument,
        ["malformed"]
    );
    let mut early = batch_msg(&rule_batch(5, 3), "p", 1);
    early.flight_descriptor = Some(fed.descriptor());
    case!(
        "a batch before the schema",
        put_raw(&mut f, vec![early]).await,
        Code::InvalidArgument,
        ["prior to Schema"]
    );
    case!(
        "a Flight message over the cap",
        put_raw(
            &mut f,
            vec![
                schema_msg(&rule_schema(), Some(&fed)),
                batch_msg(&rule_batch(4_500_000, 4), "p", 1)
            ]
        )
        .await,
        Code::ResourceExhausted,
        ["--max-message-bytes"]
    );

    // ----- DoGet, GetFlightInfo, DoExchange
    case!(
        "a ticket that is not UTF-8",
        failure(f.do_get(Ticket {
            ticket: b"\xff\xfe/model".to_vec().into()
        }))
        .await,
        Code::InvalidArgument,
        ["ticket"]
    );
    case!(
        "the model of a job still being fed",
        failure(f.do_get(DataPath::Model { job_id: "fed".into() }.ticket())).await,
        Code::FailedPrecondition,
        ["fed"]
    );
    let unknown_kind = FlightDescriptor::new_path(vec!["trained".into(), "weights".into()]);
    case!(
        "flight info of an unknown kind",
        f.get_flight_info(unknown_kind).await.expect_err("unknown kind"),
        Code::InvalidArgument,
        ["weights"]
    );
    let predict = DataPath::Predict {
        job_id: "trained".into(),
    };
    let text_x = Arc::new(Schema::new(vec![
        Field::new("x1", DataType::Utf8, true),
        Field::new("x2", DataType::Float32, true),
    ]));
    let text_batch = RecordBatch::try_new(
        text_x.clone(),
        vec![
            Arc::new(StringArray::from(vec!["a"])),
            Arc::new(Float32Array::from(vec![0.5])),
        ],
    )
    .expect("batch");
    let mut msgs = vec![schema_msg(&text_x, Some(&predict))];
    msgs.push(batch_msg(&text_batch, "p", 0));
    case!(
        "a predict batch of the wrong schema",
        failure(f.do_exchange(futures::stream::iter(msgs))).await,
        Code::InvalidArgument,
        ["x1"]
    );
    let msgs = vec![schema_msg(
        &rule_schema(),
        Some(&DataPath::Predict { job_id: "fed".into() }),
    )];
    case!(
        "predicting with a job not trained",
        failure(f.do_exchange(futures::stream::iter(msgs))).await,
        Code::FailedPrecondition,
        ["fed"]
    );

    // ----- credentials
    let mut anonymous = flight(&url, None);
    case!(
        "a Flight call without a token",
        failure(anonymous.do_action(action("list_jobs", b"{}"))).await,
        Code::Unauthenticated,
        ["token"]
    );
    let mut wrong = flight(&url, Some(&Token::new("not-the-token")));
    case!(
        "a Flight call with a wrong token",
        failure(wrong.do_action(action("list_jobs", b"{}"))).await,
        Code::Unauthenticated,
        ["token"]
    );
    case!(
        "a ring connection without a token",
        kindling_tests::ring::say_hello(&url, &kindling_tests::ring::hello("fed", 1, 0, None))
            .await
            .0
            .expect_err("no token"),
        Code::Unauthenticated,
        ["token"]
    );
    let mut rv_anonymous = pb::rendezvous::rendezvous_client::RendezvousClient::new(
        kindling_schemas::channel::ChannelConfig::default()
            .dial(&cluster.rendezvous_url(), false)
            .expect("dial")
            .connect_lazy(),
    );
    case!(
        "a rendezvous call without a token",
        rv_anonymous
            .list_jobs(pb::rendezvous::ListJobsRequest {})
            .await
            .expect_err("no token"),
        Code::Unauthenticated,
        ["token"]
    );

    // ----- the rendezvous' own checks
    let rv_channel = kindling_schemas::channel::ChannelConfig::default()
        .dial(&cluster.rendezvous_url(), true)
        .expect("dial")
        .connect_lazy();
    let mut rv = pb::rendezvous::rendezvous_client::RendezvousClient::with_interceptor(
        rv_channel.clone(),
        BearerAttach::new(Some(&token)).expect("token"),
    );
    case!(
        "registering an agent without an id",
        rv.register_agent(pb::rendezvous::RegisterAgentRequest {
            agent: Some(pb::rendezvous::AgentInfo::default())
        })
        .await
        .expect_err("no id"),
        Code::InvalidArgument,
        ["agent"]
    );
    case!(
        "creating a job of 0 slots at the rendezvous",
        rv.create_job(pb::rendezvous::CreateJobRequest {
            job_id: "zero".into(),
            num_slots: 0,
            ..Default::default()
        })
        .await
        .expect_err("0 slots"),
        Code::InvalidArgument,
        ["slot"]
    );
    case!(
        "joining a job that does not exist",
        rv.join(pb::rendezvous::JoinRequest {
            job_id: "ghost".into(),
            attempt: 1,
            agent_id: "nobody".into(),
        })
        .await
        .expect_err("ghost"),
        Code::NotFound,
        ["ghost"]
    );
    case!(
        "an all-gather payload over the cap",
        rv.all_gather(pb::rendezvous::AllGatherRequest {
            job_id: "fed".into(),
            attempt: 1,
            rank: 0,
            payload: vec![0u8; (4 << 20) + 1024].into(),
            ..Default::default()
        })
        .await
        .expect_err("payload"),
        Code::InvalidArgument,
        ["4195328 bytes", "maximum of 4194304"]
    );
    let mut raw = tonic::client::Grpc::new(rv_channel);
    raw.ready().await.expect("ready");
    let mut request = tonic::Request::new(b"\x0a\xff\xff\xff\xff\x0f garbage".to_vec());
    request
        .metadata_mut()
        .insert("authorization", token.header_value().parse().expect("ascii"));
    let garbage_pb = raw
        .unary(
            request,
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/kindling.rendezvous.v1.Rendezvous/CreateJob",
            ),
            Raw,
        )
        .await
        .expect_err("garbage protobuf");
    case!(
        "garbage protobuf to the rendezvous",
        garbage_pb,
        Code::Internal,
        ["decode"]
    );

    // ----- the health port: a malformed request gets a 4xx, and it serves on.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let ready = kindling_ops::web::probes::Readiness::new();
    ready.set(true);
    let health =
        kindling_ops::web::probes::HealthServer::start(listener, ready, Default::default()).expect("health");
    let addr = health.addr();
    let ask = |request: &'static [u8]| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    };
    let reply = ask(b"\x16\x03\x01\x02\x00garbage\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 4"), "malformed request: {reply:?}");
    assert!(
        ask(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 200"),
        "serving on"
    );
    health.shutdown().await;
    cases += 1;

    assert!(
        mismatches.is_empty(),
        "{} mismatches in {cases} cases:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    assert!(cases >= 40, "only {cases} kinds of bad input");
    // Everything still works after the battery.
    end_of_data(&agent, "fed", Split::Train, Some(100)).await;
    let done = wait_done(&agent, "fed").await;
    assert_eq!(done.rows_trained_per_epoch, vec![100], "{done:#?}");
    cluster.shutdown().await;
}

/// Every RPC of every endpoint, and every action, refuses a caller without
/// the token and one with a wrong token (`UNAUTHENTICATED`), before any
/// handler runs: the agent's Flight service (each of its RPCs and each
/// action), its collective service, and each of the rendezvous' sixteen RPCs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_and_action_refuses_a_caller_without_the_token() {
    use kindling_schemas::action::ActionKind;
    use pb::rendezvous as rv;
    let (cluster, _dir) = cluster(1).await;
    let url = cluster.agent_url(0).expect("agent");
    let wrong = Token::new("not-the-token");
    let mut checked = 0;
    for token in [None, Some(&wrong)] {
        let mut f = flight(&url, token);
        let path = DataPath::data("j", Split::Train);
        let mut refusals: Vec<(String, tonic::Status)> = vec![
            (
                "Handshake".into(),
                failure(f.handshake(futures::stream::iter(vec![
                    arrow_flight::HandshakeRequest::default(),
                ])))
                .await,
            ),
            (
                "ListFlights".into(),
                failure(f.list_flights(arrow_flight::Criteria::default())).await,
            ),
            (
                "GetFlightInfo".into(),
                f.get_flight_info(path.descriptor())
                    .await
                    .expect_err("GetFlightInfo"),
            ),
            (
                "PollFlightInfo".into(),
                f.poll_flight_info(path.descriptor())
                    .await
                    .expect_err("PollFlightInfo"),
            ),
            (
                "GetSchema".into(),
                f.get_schema(path.descriptor()).await.expect_err("GetSchema"),
            ),
            (
                "DoGet".into(),
                failure(f.do_get(DataPath::Model { job_id: "j".into() }.ticket())).await,
            ),
            (
                "DoPut".into(),
                failure(f.do_put(futures::stream::iter(vec![schema_msg(
                    &rule_schema(),
                    Some(&path),
                )])))
                .await,
            ),
            (
                "DoExchange".into(),
                failure(f.do_exchange(futures::stream::iter(vec![schema_msg(
                    &rule_schema(),
                    Some(&DataPath::Predict { job_id: "j".into() }),
                )])))
                .await,
            ),
            (
                "ListActions".into(),
                failure(f.list_actions(arrow_flight::Empty {})).await,
            ),
        ];
        for kind in ActionKind::ALL {
            let name = kind.name();
            refusals.push((
                format!("DoAction {name}"),
                failure(f.do_action(arrow_flight::Action::new(name, b"{}".to_vec()))).await,
            ));
        }
        let dial = |u: &str| {
            kindling_schemas::channel::ChannelConfig::default()
                .dial(u, false)
                .expect("dial")
                .connect_lazy()
        };
        let attach = BearerAttach::new(token).expect("token");
        refusals.push((
            "ring connection".into(),
            kindling_tests::ring::say_hello(
                &url,
                &kindling_tests::ring::hello("fed", 1, 0, token.map(Token::expose)),
            )
            .await
            .0
            .expect_err("ring"),
        ));
        let mut r = rv::rendezvous_client::RendezvousClient::with_interceptor(
            dial(&cluster.rendezvous_url()),
            attach,
        );
        macro_rules! rpc {
            ($name:literal, $call:expr) => {
                refusals.push((
                    format!("Rendezvous {}", $name),
                    $call.await.map(|_| ()).expect_err($name),
                ))
            };
        }
        rpc!(
            "RegisterAgent",
            r.register_agent(rv::RegisterAgentRequest::default())
        );
        rpc!("Heartbeat", r.heartbeat(rv::HeartbeatRequest::default()));
        rpc!(
            "DeregisterAgent",
            r.deregister_agent(rv::DeregisterAgentRequest::default())
        );
        rpc!("ListAgents", r.list_agents(rv::ListAgentsRequest::default()));
        rpc!("CreateJob", r.create_job(rv::CreateJobRequest::default()));
        rpc!(
            "RenewJobLease",
            r.renew_job_lease(rv::RenewJobLeaseRequest::default())
        );
        rpc!("DetachJob", r.detach_job(rv::DetachJobRequest::default()));
        rpc!("Join", r.join(rv::JoinRequest::default()));
        rpc!("AllGather", r.all_gather(rv::AllGatherRequest::default()));
        rpc!(
            "AllGatherStream",
            r.all_gather_stream(futures::stream::iter(vec![rv::AllGatherRequest::default()]))
        );
        rpc!(
            "ReportFailure",
            r.report_failure(rv::ReportFailureRequest::default())
        );
        rpc!("ResizeJob", r.resize_job(rv::ResizeJobRequest::default()));
        rpc!("CompleteJob", r.complete_job(rv::CompleteJobRequest::default()));
        rpc!("CancelJob", r.cancel_job(rv::CancelJobRequest::default()));
        rpc!("JobStatus", r.job_status(rv::JobStatusRequest::default()));
        rpc!("ListJobs", r.list_jobs(rv::ListJobsRequest::default()));
        rpc!("Watch", r.watch(rv::WatchRequest::default()));
        assert_eq!(refusals.len(), 9 + ActionKind::ALL.len() + 1 + 17);
        for (what, status) in refusals {
            assert_eq!(
                status.code(),
                Code::Unauthenticated,
                "{what} with token {token:?}: {status}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * (9 + ActionKind::ALL.len() + 1 + 17));
    cluster.shutdown().await;
}
