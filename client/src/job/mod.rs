//! `TrainingJob`: train a burn model on a Spark DataFrame across agents — the
//! Rust counterpart of `MirroredStrategyRunner(num_slots, local_mode, use_gpu)`
//! and `TorchDistributor`, without their intermediate files.
//!
//! - [`TrainingJob`] / [`TrainingJobBuilder`]: the validated job.
//! - `fit`: create the gang, stream the DataFrame into the agents, follow training.
//! - [`TrainedModel`]: metrics, weights, save/load, predict (also back into Spark).
//! - [`TrainingEvent`]: progress, as a stream for the application and as bars/log lines.

mod fit;
mod model;
mod progress;
mod slices;

use std::path::PathBuf;
use std::time::Duration;

use kindling_schemas::auth::Token;
use kindling_schemas::spec::{CheckpointPolicy, JobSpec, ModelSpec, OptimizerSpec, SpecError, Task};
use tokio::sync::mpsc;

pub use model::TrainedModel;
pub use progress::{ProgressMode, PushedPartition, TrainingEvent};

/// Everything that can make a training job fail.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job was configured wrongly.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A builder setting is invalid.
    #[error("invalid training job: {0}")]
    Config(String),
    /// The DataFrame's columns or values do not fit the spec (nothing was trained).
    #[error("the data does not fit the job: {0}")]
    Data(#[from] kindling_schemas::schema::SchemaError),
    /// Spark failed.
    #[error(transparent)]
    Spark(crate::spark::Error),
    /// The Spark Connect server stopped a query whose result passed its
    /// `spark.driver.maxResultSize`: a query's whole result goes through it.
    #[error(
        "{source} — a query's whole result goes through the Spark Connect server, which caps it at \
         spark.driver.maxResultSize. Persist the DataFrame so it is relayed in slices (fit persists \
         by default; TrainingJob::relay_slice_bytes sizes them), raise spark.driver.maxResultSize on \
         the server, or train with executor push (Feed::ExecutorPush), which never sends rows through it"
    )]
    DriverResultLimit {
        /// Spark's error.
        #[source]
        source: crate::spark::Error,
    },
    /// One partition alone is more than the Spark Connect server lets a query return.
    #[error(
        "partition {partition} of the DataFrame holds {rows} rows ({bytes} bytes of Arrow), more than \
         a relayed slice may hold under the Spark Connect server's spark.driver.maxResultSize \
         ({limit} bytes, of which a slice uses three quarters): repartition the DataFrame into more \
         partitions, raise spark.driver.maxResultSize on the server, or feed with executor push \
         (Feed::ExecutorPush)"
    )]
    PartitionTooLarge {
        /// The partition.
        partition: i32,
        /// Its rows.
        rows: u64,
        /// Its Arrow bytes.
        bytes: u64,
        /// The server's limit in bytes.
        limit: u64,
    },
    /// Fewer live agents than slots.
    #[error("the job needs {needed} agents but only {live} are live at {rendezvous}")]
    NotEnoughAgents {
        /// Slots asked for.
        needed: u32,
        /// Live agents.
        live: usize,
        /// Where they were counted.
        rendezvous: String,
    },
    /// An agent refused or failed.
    #[error(transparent)]
    Feed(#[from] crate::feed::FeedError),
    /// The rendezvous refused or failed.
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    /// Local mode could not start.
    #[error(transparent)]
    Local(#[from] crate::local::LocalError),
    /// Rows were lost or duplicated on the way to an agent.
    #[error("shard {shard}: sent {sent} rows but agent {agent} committed {committed}")]
    RowMismatch {
        /// Shard.
        shard: usize,
        /// Agent.
        agent: String,
        /// Rows sent.
        sent: u64,
        /// Rows committed.
        committed: u64,
    },
    /// The executors pushed a different number of rows than the DataFrame holds.
    #[error(
        "executor push of the {split} split: the DataFrame has {counted} rows but the partitions \
         pushed {pushed} ({partitions} partitions summarised)"
    )]
    PushedRows {
        /// Train or eval.
        split: &'static str,
        /// Rows the DataFrame counts.
        counted: u64,
        /// Rows the partitions' summaries report.
        pushed: u64,
        /// Partitions summarised.
        partitions: usize,
    },
    /// A partition was pushed to an agent that is not one of the job's.
    #[error(
        "executor push: partition {partition} went to agent `{agent_id}` ({address}), not one of the job's agents {job_agents:?}"
    )]
    PushedElsewhere {
        /// The partition.
        partition: u32,
        /// The agent that holds it.
        agent_id: String,
        /// The address the executor used.
        address: String,
        /// The job's agents.
        job_agents: Vec<String>,
    },
    /// Training failed on the agents.
    #[error("training of job `{job_id}` failed: {cause}")]
    TrainingFailed {
        /// The job.
        job_id: String,
        /// The first cause.
        cause: String,
    },
    /// A model file or directory could not be read or written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The model could not be built or loaded.
    #[error(transparent)]
    Model(#[from] kindling_agent::AgentError),
}

impl From<crate::spark::Error> for JobError {
    fn from(e: crate::spark::Error) -> Self {
        match &e {
            crate::spark::Error::Spark { message, .. } if message.contains("spark.driver.maxResultSize") => {
                JobError::DriverResultLimit { source: e }
            }
            _ => JobError::Spark(e),
        }
    }
}

impl JobError {
    /// Whether running the job again could help.
    pub fn is_retryable(&self) -> bool {
        match self {
            JobError::Spark(e) => e.is_retryable(),
            JobError::Feed(e) => e.is_retryable(),
            JobError::NotEnoughAgents { .. } | JobError::Rendezvous(_) => true,
            _ => false,
        }
    }
}

/// A validated training job.
///
/// ```no_run
/// # async fn demo(df: kindling::DataFrame) -> Result<(), kindling::job::JobError> {
/// use kindling::job::TrainingJob;
/// use kindling_schemas::spec::{ModelSpec, Task};
/// let model = TrainingJob::builder()
///     .model(ModelSpec::Mlp { hidden: vec![64] })
///     .task(Task::Classification { num_classes: 10 })
///     .features(["pixels"])
///     .label("digit")
///     .num_slots(2)
///     .epochs(5)
///     .local_mode(true)
///     .build()?
///     .fit(&df)
///     .await?;
/// println!("{:?}", model.history().last());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TrainingJob {
    spec: JobSpec,
    job_id: Option<String>,
    local_mode: bool,
    rendezvous: Option<String>,
    token: Option<Token>,
    eval_fraction: f64,
    work_dir: PathBuf,
    max_attempts: u32,
    window_bytes: usize,
    commit_bytes: usize,
    persist: bool,
    relay_slice_bytes: u64,
    gang_timeout: Duration,
    progress: ProgressMode,
    events: Option<mpsc::UnboundedSender<TrainingEvent>>,
    feed: Feed,
}

/// How the DataFrame's rows reach the agents.
///
/// ```
/// use kindling::job::{ExecutorPush, Feed};
/// let relay = Feed::default();
/// assert_eq!(relay, Feed::DriverRelay);
/// let push = Feed::ExecutorPush(ExecutorPush::new().python_version("3.12"));
/// # let _ = push;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Feed {
    /// The client executes the DataFrame through Spark Connect and streams its
    /// Arrow batches to the agents (needs nothing on the executors; every row
    /// crosses the client).
    #[default]
    DriverRelay,
    /// Every Spark task pushes its own partition straight to an agent with
    /// `mapInArrow` and the shipped `kindling_push.py` (rows never cross the
    /// client; the executors need Python with pyarrow). See docs/executor-push.md.
    ExecutorPush(ExecutorPush),
}

/// Settings of [`Feed::ExecutorPush`].
///
/// ```
/// let push = kindling::job::ExecutorPush::new().python_version("3.12").node_local(false);
/// assert_eq!(push.python(), "3.12");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorPush {
    python_version: String,
    node_local: bool,
    timeout: Duration,
    token_in_plan: Option<bool>,
    fail_task: Option<(u32, u32)>,
}

/// The executors' Python when none is set: the Python of the Kindling executor
/// images and of `deploy/local` (`major.minor`).
pub const DEFAULT_EXECUTOR_PYTHON: &str = "3.11";

impl Default for ExecutorPush {
    fn default() -> Self {
        ExecutorPush {
            python_version: DEFAULT_EXECUTOR_PYTHON.into(),
            node_local: true,
            timeout: Duration::from_secs(60),
            token_in_plan: None,
            fail_task: None,
        }
    }
}

impl ExecutorPush {
    /// Defaults: executors on Python [`DEFAULT_EXECUTOR_PYTHON`], node-local routing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The executors' Python `major.minor`, sent as the UDF's `python_ver`
    /// (Spark releases whose worker compares it refuse another version with
    /// `PYTHON_VERSION_MISMATCH`; `fit` names the version to set).
    pub fn python_version(mut self, version: impl Into<String>) -> Self {
        self.python_version = version.into();
        self
    }

    /// The executors' Python `major.minor`.
    pub fn python(&self) -> &str {
        &self.python_version
    }

    /// On a cluster, push each partition to the agent of the executor's node
    /// (`KINDLING_AGENT_ADDRESS`) when that agent runs the job (default on);
    /// otherwise, and always in local mode, partition `p` goes to shard
    /// `p mod num_slots`.
    pub fn node_local(mut self, on: bool) -> Self {
        self.node_local = on;
        self
    }

    /// Deadline of each Flight call an executor makes (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether the cluster token travels inside the Spark plan to the
    /// executors. Default: only in local mode (its token lives as long as the
    /// job); on a cluster the executors read `KINDLING_TOKEN` from their
    /// environment (the executor pod template sets it from the Secret).
    pub fn token_in_plan(mut self, on: bool) -> Self {
        self.token_in_plan = Some(on);
        self
    }

    /// **Test hook.** Makes attempt 0 of the task of `partition` fail after it
    /// pushed `after_batches` batches (mid-stream), to prove that a retried
    /// task does not add rows twice. Never use it in production.
    #[doc(hidden)]
    pub fn fail_first_attempt_for_test(mut self, partition: u32, after_batches: u32) -> Self {
        self.fail_task = Some((partition, after_batches));
        self
    }
}

impl TrainingJob {
    /// Starts a builder.
    pub fn builder() -> TrainingJobBuilder {
        TrainingJobBuilder::default()
    }

    /// The job spec sent to the agents.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// How rows reach the agents.
    pub fn feed(&self) -> &Feed {
        &self.feed
    }

    /// Whether the job runs its own rendezvous and agents in this process.
    pub fn is_local(&self) -> bool {
        self.local_mode
    }
}

/// Builds a [`TrainingJob`]; [`build`](Self::build) validates everything.
#[derive(Debug)]
pub struct TrainingJobBuilder {
    spec: kindling_schemas::spec::JobSpecBuilder,
    job_id: Option<String>,
    local_mode: Option<bool>,
    rendezvous: Option<String>,
    token: Option<Token>,
    eval_fraction: f64,
    work_dir: Option<PathBuf>,
    max_attempts: u32,
    window_bytes: usize,
    commit_bytes: usize,
    persist: bool,
    relay_slice_bytes: u64,
    gang_timeout: Duration,
    progress: ProgressMode,
    events: Option<mpsc::UnboundedSender<TrainingEvent>>,
    feed: Feed,
}

impl Default for TrainingJobBuilder {
    fn default() -> Self {
        TrainingJobBuilder {
            spec: JobSpec::builder(),
            job_id: None,
            local_mode: None,
            rendezvous: None,
            token: None,
            eval_fraction: 0.0,
            work_dir: None,
            max_attempts: 3,
            window_bytes: 32 << 20,
            commit_bytes: 4 << 20,
            persist: true,
            relay_slice_bytes: slices::DEFAULT_SLICE_BYTES,
            gang_timeout: Duration::from_secs(60),
            progress: ProgressMode::Auto,
            events: None,
            feed: Feed::DriverRelay,
        }
    }
}

macro_rules! spec_setter {
    ($(#[$doc:meta] $name:ident: $ty:ty),* $(,)?) => {$(
        #[$doc]
        pub fn $name(mut self, value: $ty) -> Self {
            self.spec = self.spec.$name(value);
            self
        }
    )*};
}

impl TrainingJobBuilder {
    spec_setter! {
        /// The model architecture.
        model: ModelSpec,
        /// Classification (with the number of classes) or regression.
        task: Task,
        /// The optimizer and learning rate.
        optimizer: OptimizerSpec,
        /// Passes over the data.
        epochs: u32,
        /// Rows per step on each agent.
        batch_size: usize,
        /// Number of agents training together.
        num_slots: u32,
        /// Train on GPUs (agents built with the `gpu` feature).
        use_gpu: bool,
        /// Seed for weight init, shuffling and the eval split.
        seed: u64,
        /// Checkpoint policy.
        checkpoint: CheckpointPolicy,
        /// Shuffle batch order every epoch.
        shuffle: bool,
    }

    /// Feature columns, concatenated in this order.
    pub fn features<I, S>(mut self, features: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spec = self.spec.features(features);
        self
    }

    /// The label column.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.spec = self.spec.label(label);
        self
    }

    /// Runs the rendezvous and `num_slots` agents in this process (the default
    /// when no rendezvous is given).
    pub fn local_mode(mut self, local: bool) -> Self {
        self.local_mode = Some(local);
        self
    }

    /// The rendezvous of a cluster, e.g. `http://kindling-rendezvous:7070`.
    pub fn rendezvous(mut self, url: impl Into<String>) -> Self {
        self.rendezvous = Some(url.into());
        self
    }

    /// The cluster's bearer token.
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// Holds out this fraction of rows (seeded random split) and reports
    /// eval loss and accuracy after every epoch.
    pub fn eval_fraction(mut self, fraction: f64) -> Self {
        self.eval_fraction = fraction;
        self
    }

    /// Names the job (default: a random id).
    pub fn job_id(mut self, job_id: impl Into<String>) -> Self {
        self.job_id = Some(job_id.into());
        self
    }

    /// Where local-mode agents spill and checkpoint (default: a temporary directory).
    pub fn work_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.work_dir = Some(dir.into());
        self
    }

    /// Gang attempts before the job fails.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Unacknowledged bytes allowed in flight per shard.
    pub fn window_bytes(mut self, bytes: usize) -> Self {
        self.window_bytes = bytes;
        self
    }

    /// Bytes per `DoPut` stream of a driver-relayed shard (default 4 MiB).
    /// Each stream commits on the agent when it closes, and agents train on
    /// committed rows while the rest arrive: smaller means training starts
    /// sooner, larger means fewer streams.
    pub fn commit_bytes(mut self, bytes: usize) -> Self {
        self.commit_bytes = bytes;
        self
    }

    /// Persist the DataFrame in Spark during the job so a lost shard can be
    /// re-sent cheaply and identically (default on). A persisted DataFrame is
    /// also relayed in slices (see [`relay_slice_bytes`](Self::relay_slice_bytes)),
    /// so its size is not bounded by the Spark Connect server's result limit.
    pub fn persist(mut self, persist: bool) -> Self {
        self.persist = persist;
        self
    }

    /// Arrow bytes per query of the driver relay when the DataFrame is
    /// persisted (default 256 MiB; at most three quarters of the server's
    /// `spark.driver.maxResultSize` are used whatever this says). The Spark
    /// Connect server returns a query's result through its driver and holds
    /// what the client has not read yet, so it holds at most one slice.
    pub fn relay_slice_bytes(mut self, bytes: u64) -> Self {
        self.relay_slice_bytes = bytes;
        self
    }

    /// How long agents wait for the whole gang.
    pub fn gang_timeout(mut self, timeout: Duration) -> Self {
        self.gang_timeout = timeout;
        self
    }

    /// How progress is shown.
    pub fn progress(mut self, mode: ProgressMode) -> Self {
        self.progress = mode;
        self
    }

    /// Also sends every progress event to `events`.
    pub fn events(mut self, events: mpsc::UnboundedSender<TrainingEvent>) -> Self {
        self.events = Some(events);
        self
    }

    /// How rows reach the agents: [`Feed::DriverRelay`] (default) or
    /// [`Feed::ExecutorPush`].
    pub fn feed(mut self, feed: Feed) -> Self {
        self.feed = feed;
        self
    }

    /// Validates and returns the job.
    pub fn build(self) -> Result<TrainingJob, JobError> {
        let spec = self.spec.build()?;
        if !(0.0..0.9).contains(&self.eval_fraction) {
            return Err(JobError::Config(format!(
                "eval_fraction must be in [0, 0.9), got {}",
                self.eval_fraction
            )));
        }
        if self.max_attempts == 0 {
            return Err(JobError::Config("max_attempts must be at least 1".into()));
        }
        if self.window_bytes < 64 << 10 {
            return Err(JobError::Config("window_bytes must be at least 64 KiB".into()));
        }
        if self.commit_bytes < 64 << 10 {
            return Err(JobError::Config("commit_bytes must be at least 64 KiB".into()));
        }
        if self.relay_slice_bytes < 1 << 20 {
            return Err(JobError::Config(
                "relay_slice_bytes must be at least 1 MiB".into(),
            ));
        }
        if let Some(id) = &self.job_id {
            kindling_schemas::descriptor::check_job_id(id).map_err(|e| JobError::Config(e.to_string()))?;
        }
        if let Feed::ExecutorPush(push) = &self.feed {
            let ok = push.python_version.split_once('.').is_some_and(|(a, b)| {
                !a.is_empty()
                    && !b.is_empty()
                    && a.bytes().all(|c| c.is_ascii_digit())
                    && b.bytes().all(|c| c.is_ascii_digit())
            });
            if !ok {
                return Err(JobError::Config(format!(
                    "executor push: the executors' Python version must be `major.minor` (e.g. \"3.11\"), got `{}`",
                    push.python_version
                )));
            }
            if push.timeout.is_zero() {
                return Err(JobError::Config(
                    "executor push: the timeout must be positive".into(),
                ));
            }
        }
        let local_mode = self.local_mode.unwrap_or(self.rendezvous.is_none());
        if !local_mode && self.rendezvous.is_none() {
            return Err(JobError::Config(
                "a cluster job needs .rendezvous(url); or use .local_mode(true)".into(),
            ));
        }
        let work_dir = self
            .work_dir
            .unwrap_or_else(|| std::env::temp_dir().join("kindling-local"));
        Ok(TrainingJob {
            spec,
            job_id: self.job_id,
            local_mode,
            rendezvous: self.rendezvous,
            token: self.token,
            eval_fraction: self.eval_fraction,
            work_dir,
            max_attempts: self.max_attempts,
            window_bytes: self.window_bytes,
            commit_bytes: self.commit_bytes,
            persist: self.persist,
            relay_slice_bytes: self.relay_slice_bytes,
            gang_timeout: self.gang_timeout,
            progress: self.progress,
            events: self.events,
            feed: self.feed,
        })
    }
}
