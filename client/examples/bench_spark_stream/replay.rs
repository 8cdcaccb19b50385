//! A Spark Connect endpoint that replays one query's recorded responses.
//!
//! It runs the query once against the real server, keeps the `ExecutePlanResponse`s
//! Spark sent (Arrow batches, metrics, `ResultComplete`), and then answers every
//! client that executes a plan with those same responses, re-addressed to the
//! client's session and operation. Both clients then read Spark's own bytes over
//! loopback gRPC from a server whose cost per response is one protobuf encode, so
//! the rows/s they reach is their own limit rather than the Spark server's.
//!
//! It speaks just enough of the service for `SparkSession::connect` + `sql` +
//! `execute_stream` (this crate) and `SparkSession.builder.remote().getOrCreate()` +
//! `sql().toArrow()` (PySpark): ExecutePlan (a SQL command, or the query),
//! AnalyzePlan (Spark version, the recorded schema) and ReleaseExecute. Anything else is
//! answered UNIMPLEMENTED with the method named, so a client that needs more fails
//! loudly instead of measuring something else.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{StreamExt, stream};
use kindling::spark::proto::spark_connect_service_client::SparkConnectServiceClient;
use kindling::spark::proto::{
    AnalyzePlanRequest, AnalyzePlanResponse, ExecutePlanRequest, ExecutePlanResponse, Plan, ReattachOptions,
    ReleaseExecuteRequest, ReleaseExecuteResponse, Sql, SqlCommand, UserContext, analyze_plan_request,
    analyze_plan_response,
    command::CommandType,
    execute_plan_request::{RequestOption, request_option},
    execute_plan_response,
    plan::OpType,
    relation::RelType,
    release_execute_request,
};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{Grpc, NamedService, ServerStreamingService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The responses of one query, as Spark sent them.
pub struct Recording {
    sql: String,
    responses: Vec<ExecutePlanResponse>,
    /// Spark's answer to AnalyzePlan(Schema) for the query (PySpark's `toArrow`
    /// asks for it before executing).
    schema: analyze_plan_response::Schema,
    server_side_session_id: String,
}

impl Recording {
    /// Executes `sql` on the Spark Connect server at `endpoint` (`http://host:port`)
    /// and keeps every response up to and including `ResultComplete`.
    pub async fn record(endpoint: &str, sql: &str) -> anyhow::Result<Recording> {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())?
            .connect()
            .await?;
        let mut client = SparkConnectServiceClient::new(channel).max_decoding_message_size(512 << 20);
        let user_context = UserContext {
            user_id: "kindling-bench".into(),
            ..Default::default()
        };
        // Reattachable, as both clients run it: Spark then ends the stream with
        // ResultComplete (and sends the same responses it sends them).
        let reattachable = RequestOption {
            request_option: Some(request_option::RequestOption::ReattachOptions(ReattachOptions {
                reattachable: true,
            })),
        };
        let request = ExecutePlanRequest {
            session_id: uuid::Uuid::new_v4().to_string(),
            operation_id: Some(uuid::Uuid::new_v4().to_string()),
            user_context: Some(user_context.clone()),
            plan: Some(Plan {
                op_type: Some(OpType::Root(sql_relation(sql))),
            }),
            request_options: vec![reattachable],
            ..Default::default()
        };
        let release = ReleaseExecuteRequest {
            session_id: request.session_id.clone(),
            operation_id: request.operation_id.clone().unwrap_or_default(),
            user_context: Some(user_context),
            release: Some(release_execute_request::Release::ReleaseAll(Default::default())),
            ..Default::default()
        };
        let analyze = AnalyzePlanRequest {
            session_id: request.session_id.clone(),
            user_context: request.user_context.clone(),
            analyze: Some(analyze_plan_request::Analyze::Schema(
                analyze_plan_request::Schema {
                    plan: request.plan.clone(),
                },
            )),
            ..Default::default()
        };
        let schema = match client.analyze_plan(analyze).await?.into_inner().result {
            Some(analyze_plan_response::Result::Schema(schema)) => schema,
            other => anyhow::bail!("AnalyzePlan(Schema) answered {other:?}"),
        };
        let mut stream = client.execute_plan(request).await?.into_inner();
        let mut responses = Vec::new();
        let mut complete = false;
        while let Some(response) = stream.message().await? {
            complete = matches!(
                response.response_type,
                Some(execute_plan_response::ResponseType::ResultComplete(_))
            );
            responses.push(response);
        }
        client.release_execute(release).await?;
        anyhow::ensure!(complete, "the recorded stream ended without ResultComplete");
        let server_side_session_id = responses[0].server_side_session_id.clone();
        Ok(Recording {
            sql: sql.to_string(),
            responses,
            schema,
            server_side_session_id,
        })
    }
}

fn sql_relation(sql: &str) -> kindling::spark::proto::Relation {
    kindling::spark::proto::Relation {
        rel_type: Some(RelType::Sql(Sql {
            query: sql.to_string(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The replaying service (`spark.connect.SparkConnectService`).
#[derive(Clone)]
pub struct Replay(Arc<Recording>);

impl Replay {
    pub fn new(recording: Recording) -> Self {
        Replay(Arc::new(recording))
    }

    /// The recorded responses for a plan execution, or the relation of a SQL command.
    fn execute(&self, request: ExecutePlanRequest) -> Result<Vec<ExecutePlanResponse>, Status> {
        let operation_id = request
            .operation_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let address = |mut r: ExecutePlanResponse| {
            r.session_id = request.session_id.clone();
            r.server_side_session_id = self.0.server_side_session_id.clone();
            r.operation_id = operation_id.clone();
            r
        };
        match request.plan.and_then(|p| p.op_type) {
            Some(OpType::Root(_)) => Ok(self.0.responses.iter().cloned().map(address).collect()),
            Some(OpType::Command(command)) => match command.command_type {
                Some(CommandType::SqlCommand(SqlCommand { input, .. })) => {
                    let query = match input.and_then(|r| r.rel_type) {
                        Some(RelType::Sql(sql)) => sql.query,
                        _ => String::new(),
                    };
                    if query != self.0.sql {
                        return Err(Status::unimplemented(format!(
                            "this replay serves one query; asked for {query:?}"
                        )));
                    }
                    let result = execute_plan_response::SqlCommandResult {
                        relation: Some(sql_relation(&query)),
                    };
                    let done = execute_plan_response::ResponseType::ResultComplete(Default::default());
                    Ok([
                        execute_plan_response::ResponseType::SqlCommandResult(result),
                        done,
                    ]
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| {
                        address(ExecutePlanResponse {
                            response_id: format!("command-{i}"),
                            response_type: Some(t),
                            ..Default::default()
                        })
                    })
                    .collect())
                }
                _ => Err(Status::unimplemented("this replay runs SQL commands only")),
            },
            _ => Err(Status::invalid_argument("no plan")),
        }
    }

    fn analyze(&self, request: AnalyzePlanRequest) -> Result<AnalyzePlanResponse, Status> {
        let result = match request.analyze {
            Some(analyze_plan_request::Analyze::SparkVersion(_)) => {
                analyze_plan_response::Result::SparkVersion(analyze_plan_response::SparkVersion {
                    version: "4.0.0-replay".into(),
                })
            }
            // Every plan a client sends here is the recorded query.
            Some(analyze_plan_request::Analyze::Schema(_)) => {
                analyze_plan_response::Result::Schema(self.0.schema.clone())
            }
            _ => {
                return Err(Status::unimplemented(
                    "this replay answers AnalyzePlan(SparkVersion | Schema) only",
                ));
            }
        };
        Ok(AnalyzePlanResponse {
            session_id: request.session_id,
            server_side_session_id: self.0.server_side_session_id.clone(),
            result: Some(result),
        })
    }
}

impl NamedService for Replay {
    const NAME: &'static str = "spark.connect.SparkConnectService";
}

/// One gRPC method of the replay: a handler from request to response(s).
struct Method<F>(F);

impl<F, Req, Resp> UnaryService<Req> for Method<F>
where
    F: Fn(Req) -> Result<Resp, Status>,
    Resp: Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<Response<Resp>, Status>;
    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let answer = (self.0)(request.into_inner()).map(Response::new);
        Box::pin(async move { answer })
    }
}

impl<F, Req> ServerStreamingService<Req> for Method<F>
where
    F: Fn(Req) -> Result<Vec<ExecutePlanResponse>, Status>,
{
    type Response = ExecutePlanResponse;
    type ResponseStream = stream::BoxStream<'static, Result<ExecutePlanResponse, Status>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;
    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let answer = (self.0)(request.into_inner())
            .map(|rs| Response::new(stream::iter(rs.into_iter().map(Ok)).boxed()));
        Box::pin(async move { answer })
    }
}

impl<B> Service<http::Request<B>> for Replay
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let this = self.clone();
        let method = request.uri().path().rsplit('/').next().unwrap_or("").to_string();
        Box::pin(async move {
            let response = match method.as_str() {
                "ExecutePlan" => {
                    let handler = Method(move |r: ExecutePlanRequest| this.execute(r));
                    Grpc::new(ProstCodec::default())
                        .server_streaming(handler, request)
                        .await
                }
                "AnalyzePlan" => {
                    let handler = Method(move |r: AnalyzePlanRequest| this.analyze(r));
                    Grpc::new(ProstCodec::default()).unary(handler, request).await
                }
                "ReleaseExecute" => {
                    let handler = Method(move |r: ReleaseExecuteRequest| {
                        Ok(ReleaseExecuteResponse {
                            session_id: r.session_id,
                            server_side_session_id: this.0.server_side_session_id.clone(),
                            operation_id: Some(r.operation_id),
                        })
                    });
                    Grpc::new(ProstCodec::default()).unary(handler, request).await
                }
                other => Status::unimplemented(format!("the replay does not serve {other}")).into_http(),
            };
            Ok(response)
        })
    }
}
