//! Everything that can make a training job, a prediction or a transform fail.

use std::time::Duration;

use arrow::datatypes::DataType;
use kindling_schemas::spec::SpecError;

/// Everything that can make a training job fail.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job was configured wrongly.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A setting is invalid, or does not fit how the job is run.
    #[error("invalid training job: {setting}: {reason}")]
    Setting {
        /// The setting (builder method).
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The job id cannot name a job on the agents.
    #[error("invalid training job: job_id: {0}")]
    JobId(#[source] kindling_schemas::descriptor::PathError),
    /// The DataFrame's columns or values do not fit the spec (nothing was trained).
    #[error("the data does not fit the job: {0}")]
    Data(#[from] kindling_schemas::schema::SchemaError),
    /// The column the eval split is drawn by (`eval_split_by`) cannot place
    /// the rows: nothing was started or fed.
    #[error("the eval split's column `{column}` (eval_split_by) {problem}")]
    SplitColumn {
        /// The column.
        column: String,
        /// What is wrong with it.
        problem: SplitProblem,
    },
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
    /// Too few live agents have the job's model registered (the others
    /// would refuse the job): nothing was started or fed.
    #[error(
        "model `{model}` is registered on {with_model} live agent(s), the job needs {needed}; the others \
         lack it ({others}): run agents built with it (kindling_agent::run with your registry)"
    )]
    ModelUnavailable {
        /// The model the job names.
        model: String,
        /// Slots asked for.
        needed: u32,
        /// Live agents that have it.
        with_model: usize,
        /// What each agent without it has.
        others: String,
    },
    /// An agent was lost, no spare was live, none registered within the
    /// wait, and too few agents survived to go on without it (`min_slots`).
    #[error(
        "lost agent(s) {lost} and no replacement registered at {rendezvous} within {waited:?} \
         ({live} other live agent(s)); {survivors} agent(s) survive and the job needs at least \
         {min_slots} (min_slots): raise TrainingJobBuilder::replacement_wait, lower min_slots, or add \
         agents"
    )]
    NoReplacement {
        /// The lost agents' ids.
        lost: String,
        /// How long fit waited.
        waited: Duration,
        /// Live agents that could not take the place.
        live: usize,
        /// The job's agents still training.
        survivors: usize,
        /// The fewest agents the job may go on with.
        min_slots: u32,
        /// The rendezvous asked.
        rendezvous: String,
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
    /// Moving rows into the agents failed, or an agent refused or failed a call.
    #[error(transparent)]
    Feed(crate::feed::FeedError),
    /// The rendezvous refused or failed.
    #[error("rendezvous: {0}")]
    Rendezvous(#[from] kindling_schemas::rendezvous::ClientError),
    /// Local mode could not start.
    #[cfg(feature = "local")]
    #[error(transparent)]
    Local(#[from] crate::local::LocalError),
    /// Training failed on the agents.
    #[error("training of job `{job_id}` failed: {cause}")]
    TrainingFailed {
        /// The job.
        job_id: String,
        /// The first cause.
        cause: String,
    },
    /// A detached job's model was asked for before the job succeeded.
    #[error(
        "job `{job_id}` has not finished (it is {state}): wait for it first (JobHandle::wait, \
         `kindling wait`)"
    )]
    NotFinished {
        /// The job.
        job_id: String,
        /// Its state at the rendezvous.
        state: &'static str,
    },
    /// No agent of a finished job could hand out its model.
    #[error(
        "no agent of job `{job_id}` gave its model: {reason} (agents keep a finished job's model for \
         their --finished-retention-secs)"
    )]
    ModelGone {
        /// The job.
        job_id: String,
        /// What each member agent answered.
        reason: String,
    },
    /// An agent's weights of a job came without a usable model card.
    #[error("agent {agent}'s weights of job `{job_id}` cannot be a model: {reason}")]
    ModelCard {
        /// The job.
        job_id: String,
        /// The agent asked.
        agent: String,
        /// What is wrong with the card.
        reason: String,
    },
    /// The input to predict has no rows.
    #[error("{what} is empty: there is nothing to predict")]
    EmptyInput {
        /// What was empty.
        what: &'static str,
    },
    /// The features to predict do not have the width the model was trained on.
    #[error("the features give an input of width {features}, the model was trained on {model}")]
    InputWidth {
        /// Width of the features given.
        features: usize,
        /// Width the model takes.
        model: usize,
    },
    /// The features to predict are not the kinds of input the model was trained on.
    #[error("the features to predict are {features}, the model was trained on {model}")]
    InputMismatch {
        /// The inputs given.
        features: String,
        /// The inputs the model was trained on.
        model: String,
    },
    /// The model to predict with is not registered in this process.
    #[error(
        "model `{model}` is not registered in this process: pass a registry with it \
         (TrainingJobBuilder::models, TrainedModel::load_with) to predict here"
    )]
    ModelNotLinked {
        /// The model.
        model: String,
    },
    /// The model cannot be written in the format asked for.
    #[error("cannot export as {format}: {reason}")]
    Export {
        /// The format (`onnx`, `safetensors`).
        format: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// `transform` has no cluster to serve the model on.
    #[error(
        "the model has no cluster to serve it: a model trained in local mode by `fit` lost its \
         in-process agents when fit returned; train with `fit_on(&cluster, …)`, or give a cluster \
         with TrainedModel::serve_on"
    )]
    NoServingCluster,
    /// The DataFrame to transform already has a column `transform` adds.
    #[error("the DataFrame to transform already has a column `{column}`: rename or drop it first")]
    PredictionColumnTaken {
        /// The column.
        column: &'static str,
    },
    /// A prediction thread panicked or was cancelled.
    #[error("prediction thread failed: {0}")]
    PredictionThread(#[source] tokio::task::JoinError),
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
    #[cfg(feature = "local")]
    #[error(transparent)]
    Model(#[from] kindling_agent::AgentError),
    /// A weights file (`init_from`, `export`) that does not fit the model
    /// or could not be read or written; names the file and the tensor.
    #[cfg(feature = "local")]
    #[error(transparent)]
    WeightsFile(#[from] kindling_agent::models::interchange::WeightsFileError),
    /// The `init_from` file changed between building the job and starting it.
    #[error("init_from: {file} changed since the job was built (SHA-256 {now}, the spec records {recorded})")]
    InitFromChanged {
        /// The file.
        file: String,
        /// Its hash now.
        now: String,
        /// The hash the spec records.
        recorded: String,
    },
    /// Weights that cannot be carried to the agents.
    #[error(transparent)]
    Weights(#[from] kindling_schemas::model_serving::WeightsError),
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

impl From<crate::feed::FeedError> for JobError {
    /// Spark's and the data's errors read the same whether they arose while
    /// checking the job or while feeding it.
    fn from(e: crate::feed::FeedError) -> Self {
        match e {
            crate::feed::FeedError::Spark(e) => e.into(),
            crate::feed::FeedError::Data(e) => JobError::Data(e),
            other => JobError::Feed(other),
        }
    }
}

impl JobError {
    /// Whether running the job again could help.
    pub fn is_retryable(&self) -> bool {
        match self {
            JobError::Spark(e) => e.is_retryable(),
            JobError::Feed(e) => e.is_retryable(),
            JobError::Rendezvous(e) => e.is_retryable(),
            JobError::NotEnoughAgents { .. } => true,
            _ => false,
        }
    }
}

/// What is wrong with the column an eval split is drawn by.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitProblem {
    /// The DataFrame has no such column.
    #[error("is not a column of the DataFrame (its columns: {columns})")]
    Missing {
        /// The DataFrame's columns, comma-separated.
        columns: String,
    },
    /// The column is neither integer nor string.
    #[error(
        "has type {found}; the split hashes integer or string values: split by an id, or cast the \
         column in the ETL"
    )]
    Type {
        /// Its type.
        found: DataType,
    },
    /// Some rows have no value to hash.
    #[error(
        "has {count} null value(s): every row needs a value to go to train or eval; drop or fill \
         them in the ETL"
    )]
    Nulls {
        /// Rows with a null.
        count: u64,
    },
}
