//! `DoGet` of the rows one producer committed to a job's split here, in its
//! sequence order: the client moving them to an agent that joined a growing
//! gang (the operator only: rows are the job's data).

use arrow_flight::FlightData;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use futures::{StreamExt, TryStreamExt};
use kindling_schemas::auth::Caller;
use kindling_schemas::descriptor::Split;
use tonic::{Response, Status};

use super::{AgentFlightService, BoxStream, sent_in_time};
use crate::error::AgentError;

impl AgentFlightService {
    /// The rows `producer` committed to `split` of `job_id`, spilled ones
    /// read back from disk as they are sent.
    pub(super) fn get_rows(
        &self,
        caller: &Caller,
        (job_id, split, producer): (&str, Split, &str),
    ) -> Result<Response<BoxStream<FlightData>>, Status> {
        caller.operator_only("read a job's rows")?;
        let job = self.jobs.get(job_id)?;
        let batches = job.lock().ingest.split(split).cache.committed_by(producer);
        let slot = self.reads.take(caller).map_err(AgentError::from)?;
        let external = |e: Box<dyn std::error::Error + Send + Sync>| FlightError::ExternalError(e);
        let loaded = futures::stream::iter(batches).then(move |batch| async move {
            match tokio::task::spawn_blocking(move || batch.load()).await {
                Ok(loaded) => loaded.map_err(|e| external(Box::new(e))),
                Err(e) => Err(external(Box::new(e))),
            }
        });
        let encoded = FlightDataEncoderBuilder::new()
            .build(loaded)
            .map_err(Status::from);
        Ok(Response::new(sent_in_time(
            "DoGet",
            encoded,
            self.jobs.staging(),
            slot,
        )))
    }
}
