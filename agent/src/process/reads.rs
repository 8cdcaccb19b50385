//! Bounds on reading models (`DoGet`, `GetFlightInfo`): a slot per read
//! among `--max-reads` (a job credential's reads at most half of them), one
//! encoding of each model shared by every read of it, and the send bound a
//! read that stops reading is ended by. Unread reads then hold no more than
//! their slots' messages in flight, whatever their number.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use arrow_flight::FlightData;
use arrow_flight::encode::FlightDataEncoderBuilder;
use futures::TryStreamExt;
use kindling_schemas::auth::Caller;

use crate::error::{AgentError, LimitError};
use crate::jobs::job::Job;
use crate::models::kindling_model::AnyModel;

/// Default of `--max-reads`: model reads in flight on an agent at once.
pub const DEFAULT_MAX_READS: usize = 32;

type CredentialKey = (String, String, Option<u64>);

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_credential: HashMap<CredentialKey, usize>,
}

/// The model reads in flight on this agent, all callers together and by
/// job credential.
#[derive(Debug)]
pub struct ReadSlots {
    cap: usize,
    held: Arc<Mutex<Held>>,
}

/// One read in flight ([`ReadSlots::take`]); dropping it frees the slot.
#[derive(Debug)]
pub struct ReadSlot {
    held: Arc<Mutex<Held>>,
    key: Option<CredentialKey>,
}

impl Drop for ReadSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(key) = self.key.take()
            && let Some(mine) = held.by_credential.get_mut(&key)
        {
            *mine -= 1;
            if *mine == 0 {
                held.by_credential.remove(&key);
            }
        }
    }
}

impl ReadSlots {
    /// At most `cap` reads at once (at least one); a job credential's at
    /// most half of them (at least one).
    pub fn new(cap: usize) -> Self {
        ReadSlots {
            cap: cap.max(1),
            held: Arc::default(),
        }
    }

    /// A slot for one more read of `caller`, or the cap it would pass.
    pub fn take(&self, caller: &Caller) -> Result<ReadSlot, LimitError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.total >= self.cap {
            return Err(LimitError::TooManyReads {
                whose: "all callers".into(),
                cap: self.cap,
            });
        }
        let key = match caller {
            Caller::Job(claims) => {
                let key = (claims.job_id.clone(), claims.role.to_string(), claims.incarnation);
                let share = (self.cap / 2).max(1);
                if held.by_credential.get(&key).copied().unwrap_or(0) >= share {
                    return Err(LimitError::TooManyReads {
                        whose: format!("a {} credential for job `{}`", claims.role, claims.job_id),
                        cap: share,
                    });
                }
                *held.by_credential.entry(key.clone()).or_default() += 1;
                Some(key)
            }
            _ => None,
        };
        held.total += 1;
        Ok(ReadSlot {
            held: self.held.clone(),
            key,
        })
    }
}

/// A model's weights table encoded as Flight messages (the schema first),
/// once; every read of the model sends these (their buffers are shared).
#[derive(Debug)]
pub struct Encoded {
    /// The messages.
    pub messages: Vec<FlightData>,
    /// Rows of the table (one per parameter).
    pub rows: i64,
    /// Bytes of the table.
    pub bytes: i64,
}

impl Encoded {
    /// Encodes `model`'s weights table, with the job's model `card` (JSON)
    /// in its schema's metadata when given (CPU work: run it off the async
    /// runtime).
    pub fn of(model: &dyn AnyModel, card: Option<String>) -> Result<Self, AgentError> {
        let mut table = model.to_arrow()?;
        if let Some(json) = card {
            use kindling_schemas::model_serving::MODEL_CARD_METADATA;
            let schema = table
                .schema()
                .as_ref()
                .clone()
                .with_metadata(arrow::datatypes::Metadata::default().with(MODEL_CARD_METADATA, json));
            table = table
                .with_schema(std::sync::Arc::new(schema))
                .map_err(AgentError::arrow)?;
        }
        let (rows, bytes) = (table.num_rows() as i64, table.get_array_memory_size() as i64);
        let messages = futures::executor::block_on(
            FlightDataEncoderBuilder::new()
                .build(futures::stream::once(async move { Ok(table) }))
                .try_collect(),
        )?;
        Ok(Encoded {
            messages,
            rows,
            bytes,
        })
    }
}

/// Which model a cached encoding is of: a trained model (the same one
/// while the job keeps it), or a job's latest checkpoint.
#[derive(Debug, Clone)]
pub enum ModelVersion {
    /// The job's trained model.
    Trained(Arc<dyn AnyModel>),
    /// The checkpoint at `at` in `attempt` of the job's `incarnation`.
    Checkpoint {
        /// The job's incarnation.
        incarnation: u64,
        /// Its attempt.
        attempt: u32,
        /// Where it stands.
        at: crate::training::checkpoint::Position,
    },
}

impl ModelVersion {
    fn same(&self, other: &ModelVersion) -> bool {
        match (self, other) {
            (ModelVersion::Trained(a), ModelVersion::Trained(b)) => Arc::ptr_eq(a, b),
            (
                ModelVersion::Checkpoint {
                    incarnation,
                    attempt,
                    at,
                },
                ModelVersion::Checkpoint {
                    incarnation: i,
                    attempt: a,
                    at: e,
                },
            ) => (incarnation, attempt, at) == (i, a, e),
            _ => false,
        }
    }
}

type Cell = Arc<tokio::sync::OnceCell<Arc<Encoded>>>;

#[derive(Debug)]
struct Entry {
    job: Weak<Job>,
    version: ModelVersion,
    cell: Cell,
}

/// The encodings of the models read on this agent: one per job and kind
/// (trained or checkpoint), of its latest version, kept while the job is.
#[derive(Debug, Default)]
pub struct EncodedModels {
    entries: Mutex<HashMap<(String, bool), Entry>>,
}

impl EncodedModels {
    /// The encoding of `version` of `job`'s model (`checkpoint`: of its
    /// checkpoint), made by `encode` on the first read of that version only;
    /// reads of it at the same time wait for that one.
    pub async fn get_or_encode<F>(
        &self,
        job: &Arc<Job>,
        checkpoint: bool,
        version: ModelVersion,
        encode: F,
    ) -> Result<Arc<Encoded>, AgentError>
    where
        F: std::future::Future<Output = Result<Encoded, AgentError>>,
    {
        let cell = {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            // Encodings of jobs that are gone go with them.
            entries.retain(|_, e| e.job.strong_count() > 0);
            let key = (job.job_id.clone(), checkpoint);
            match entries.get(&key) {
                Some(e) if e.version.same(&version) && e.job.ptr_eq(&Arc::downgrade(job)) => e.cell.clone(),
                _ => {
                    let cell = Cell::default();
                    entries.insert(
                        key,
                        Entry {
                            job: Arc::downgrade(job),
                            version,
                            cell: cell.clone(),
                        },
                    );
                    cell
                }
            }
        };
        let encoded = cell
            .get_or_try_init(|| async { encode.await.map(Arc::new) })
            .await?;
        Ok(encoded.clone())
    }
}
