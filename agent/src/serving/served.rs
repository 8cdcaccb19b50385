//! Models this agent serves without having trained them: `serve_model`
//! builds one from its weights table once per version, `DoExchange` on
//! `[model_id, predict]` predicts with it from then on (every Spark task of
//! a `transform` on this node shares the one model), `drop_model` frees it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use kindling_schemas::model_serving::{
    MAX_SERVED_MODELS, ServeModel, ServeModelResponse, ServedModel, model_id_of, model_incarnation,
};
use kindling_schemas::spec::JobSpec;

use crate::error::{AgentError, JobStateError, LimitError, RequestError};
use crate::models::kindling_model::{AnyModel, ModelRegistry};
use crate::training::trainer;

/// One served model version.
#[derive(Debug)]
pub struct Served {
    /// Its id.
    pub model_id: String,
    /// The spec it was trained with.
    pub spec: JobSpec,
    /// The model, on this agent's device for the spec.
    pub model: Arc<dyn AnyModel>,
    /// What reader credentials of it name: its version, the same on every
    /// agent that serves it ([`model_incarnation`]).
    pub incarnation: u64,
    loaded_at_ms: u64,
    loads: u64,
    streams: AtomicU64,
    rows: AtomicU64,
}

impl Served {
    /// Counts one prediction stream.
    pub fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` predicted rows.
    pub fn predicted(&self, n: usize) {
        self.rows.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn report(&self) -> ServedModel {
        ServedModel {
            model_id: self.model_id.clone(),
            model: self.spec.model.name().to_owned(),
            loaded_at_ms: self.loaded_at_ms,
            loads: self.loads,
            streams: self.streams.load(Ordering::Relaxed),
            rows: self.rows.load(Ordering::Relaxed),
        }
    }
}

/// The models an agent serves, by id (at most [`MAX_SERVED_MODELS`]).
#[derive(Debug, Default)]
pub struct ServedModels {
    models: Mutex<HashMap<String, Arc<Served>>>,
    /// Builds per id over the agent's life: a version served, dropped and
    /// served again counts twice.
    loads: Mutex<HashMap<String, u64>>,
}

impl ServedModels {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Served>>> {
        self.models.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The model served as `model_id`.
    pub fn get(&self, model_id: &str) -> Option<Arc<Served>> {
        self.lock().get(model_id).cloned()
    }

    /// Loads `serve` unless its version is served already. The id must be
    /// the one its content gives ([`model_id_of`]; empty: the agent names it),
    /// so two versions never share one. Building runs on the caller's thread
    /// (call it on the blocking pool).
    pub fn serve(
        &self,
        agent_id: &str,
        models: &ModelRegistry,
        serve: &ServeModel,
    ) -> Result<ServeModelResponse, AgentError> {
        // An empty id asks the agent to name the version.
        let weights = serve.weights_table()?;
        let id = model_id_of(serve, &weights)?;
        if !serve.model_id.is_empty() && serve.model_id != id {
            return Err(RequestError::ServedModelId {
                given: serve.model_id.clone(),
                content: id,
            }
            .into());
        }
        let answer = |loaded| ServeModelResponse {
            model_id: id.clone(),
            agent_id: agent_id.to_owned(),
            loaded,
        };
        if self.get(&id).is_some() {
            return Ok(answer(false));
        }
        let full = || LimitError::TooManyModels {
            agent_id: agent_id.to_owned(),
            cap: MAX_SERVED_MODELS,
        };
        // Checked before building (not to build for nothing) and again when
        // inserting (another call may have filled the room meanwhile).
        if self.lock().len() >= MAX_SERVED_MODELS {
            return Err(full().into());
        }
        let device = trainer::device_for(&serve.spec)?;
        let model = models
            .build(&serve.spec, &serve.layout(), &device)?
            .from_arrow(&weights)?;
        let mut served = self.lock();
        if served.contains_key(&id) {
            return Ok(answer(false)); // a concurrent call loaded it first
        }
        if served.len() >= MAX_SERVED_MODELS {
            return Err(full().into());
        }
        let loads = {
            let mut loads = self.loads.lock().unwrap_or_else(|p| p.into_inner());
            let n = loads.entry(id.clone()).or_default();
            *n += 1;
            *n
        };
        served.insert(
            id.clone(),
            Arc::new(Served {
                model_id: id.clone(),
                spec: serve.spec.clone(),
                model: Arc::from(model),
                incarnation: model_incarnation(&id),
                loaded_at_ms: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                loads,
                streams: AtomicU64::new(0),
                rows: AtomicU64::new(0),
            }),
        );
        tracing::info!(agent = %agent_id, model_id = %id, loads, "serving a model");
        Ok(answer(true))
    }

    /// Stops serving `model_id` (streams already open finish with it).
    pub fn drop_model(&self, agent_id: &str, model_id: &str) -> Result<(), AgentError> {
        self.lock().remove(model_id).map(|_| ()).ok_or_else(|| {
            JobStateError::UnknownModel {
                agent_id: agent_id.to_owned(),
                model_id: model_id.to_owned(),
            }
            .into()
        })
    }

    /// Every served model, by id.
    pub fn list(&self) -> Vec<ServedModel> {
        let mut all: Vec<ServedModel> = self.lock().values().map(|s| s.report()).collect();
        all.sort_by(|a, b| a.model_id.cmp(&b.model_id));
        all
    }
}
