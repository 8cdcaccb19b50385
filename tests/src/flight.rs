//! Raw Flight calls that the typed client never makes: a `DoPut` whose
//! request stream stays open and sends nothing, to see what an agent
//! decides from the call's headers alone.

use arrow_flight::FlightData;
use arrow_flight::flight_service_client::FlightServiceClient;
use kindling_schemas::auth::Token;
use tonic::Status;

/// Opens a `DoPut` on `url` with `token` and sends no message; returns the
/// agent's refusal. Panics if the agent answers anything else, or has not
/// answered within a minute (it is then waiting for a first message that
/// never comes: it did not decide from the headers).
pub async fn put_nothing(url: &str, token: &Token) -> Status {
    tokio::time::timeout(std::time::Duration::from_secs(60), refusal(url, token))
        .await
        .expect("the agent waits for a message instead of refusing the call from its headers")
}

async fn refusal(url: &str, token: &Token) -> Status {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let header: tonic::metadata::MetadataValue<_> = token.header_value().parse().expect("header");
    let mut client = FlightServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
        r.metadata_mut().insert("authorization", header.clone());
        Ok(r)
    });
    let silent = futures::stream::pending::<FlightData>();
    match client.do_put(silent).await {
        Err(status) => status,
        Ok(response) => {
            let mut answers = response.into_inner();
            match answers.message().await {
                Err(status) => status,
                Ok(answer) => panic!("the agent answered a DoPut without a message: {answer:?}"),
            }
        }
    }
}
