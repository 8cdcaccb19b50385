//! Inference: the prediction columns of a batch ([`predict_batch`]) and the
//! `DoExchange` prediction stream, running burn on the blocking pool.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema};
use arrow_flight::decode::{DecodedFlightData, DecodedPayload};
use arrow_flight::error::FlightError;
use futures::{Stream, StreamExt};
use kindling_schemas::schema::{self, FeatureLayout, StreamKind};
use kindling_schemas::spec::JobSpec;

use crate::error::{AgentError, IngestError};
use crate::models::kindling_model::{AnyModel, Batch};
use crate::training::trainer;

/// Predictions for one stream of feature batches: the first schema sets the
/// layout, each batch then gets [`predict_batch`]'s columns.
#[derive(Debug)]
struct Predictor {
    model: Arc<dyn AnyModel>,
    spec: Arc<JobSpec>,
    layout: Option<Arc<FeatureLayout>>,
}

impl Predictor {
    fn accept_schema(&mut self, schema: &Schema) -> Result<(), AgentError> {
        let layout = schema::validate(schema, &self.spec, StreamKind::Predict)?;
        self.layout = Some(Arc::new(layout));
        Ok(())
    }

    /// Runs the model on the blocking pool: a forward pass is CPU-heavy.
    async fn predict(&self, batch: RecordBatch) -> Result<RecordBatch, AgentError> {
        let layout = self.layout.clone().ok_or(IngestError::BatchBeforeSchema)?;
        let model = self.model.clone();
        let spec = self.spec.clone();
        tokio::task::spawn_blocking(move || predict_batch(model.as_ref(), &spec, &layout, &batch))
            .await
            .map_err(AgentError::panicked("prediction"))?
    }
}

/// Streams predictions for decoded feature batches, one batch at a time.
/// Errors travel as [`FlightError`]s wrapping an [`AgentError`].
pub fn predict_stream<S>(
    decoded: S,
    model: Arc<dyn AnyModel>,
    spec: JobSpec,
) -> impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static
where
    S: Stream<Item = Result<DecodedFlightData, FlightError>> + Send + Unpin + 'static,
{
    let predictor = Predictor {
        model,
        spec: Arc::new(spec),
        layout: None,
    };
    futures::stream::unfold((decoded, predictor), |(mut decoded, mut predictor)| async move {
        loop {
            let result = match decoded.next().await? {
                Err(e) => Err(e),
                Ok(msg) => match msg.payload {
                    DecodedPayload::None => continue,
                    DecodedPayload::Schema(schema) => match predictor.accept_schema(&schema) {
                        Ok(()) => continue,
                        Err(e) => Err(e.into()),
                    },
                    DecodedPayload::RecordBatch(batch) => {
                        predictor.predict(batch).await.map_err(FlightError::from)
                    }
                },
            };
            return Some((result, (decoded, predictor)));
        }
    })
}

/// Appends the model's prediction columns to `batch`: by default
/// `prediction` (class or value) and, for classification, `probabilities`
/// (`List<Float32>`, one per class).
pub fn predict_batch(
    model: &dyn AnyModel,
    spec: &JobSpec,
    layout: &FeatureLayout,
    batch: &RecordBatch,
) -> Result<RecordBatch, AgentError> {
    let features_only = {
        let s = batch.schema();
        let cols: Vec<usize> = layout
            .features
            .iter()
            .filter_map(|f| s.index_of(&f.name).ok())
            .collect();
        batch.project(&cols).map_err(AgentError::arrow)?
    };
    let label_free = JobSpec {
        label: String::new(),
        ..spec.clone()
    };
    schema::validate_batch(&features_only, &label_free)?;
    let device = trainer::device_for(spec)?;
    let output = model.forward(&Batch::new(&features_only, layout, spec, &device))?;
    let mut fields: Vec<Arc<Field>> = batch.schema().fields().iter().cloned().collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for (field, column) in model.predictions(output, spec.task)? {
        fields.push(field);
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(AgentError::arrow)
}
