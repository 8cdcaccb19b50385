//! [`TrainingJobBuilder`]: every setting of a [`TrainingJob`], checked
//! together by [`build`](TrainingJobBuilder::build).

use std::path::PathBuf;
use std::time::Duration;

use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::spec::{
    CheckpointPolicy, EarlyStopping, EvalSplit, GradientClip, JobSpec, ModelSpec, OptimizerSpec, Precision,
    Schedule, Task,
};
use tokio::sync::mpsc;

use super::training_job::{Feeding, Placement, Recovery, Reporting, TrainingJob};
use super::{Feed, JobError, MlflowTracking, ProgressMode, TrainingEvent, pretrained};

/// The most shards a job's rows are dealt into (`max_slots`): each is one
/// `DoPut` stream from this process per split.
const MAX_SHARDS: u32 = 1024;

impl TrainingJob {
    /// Starts a builder.
    pub fn builder() -> TrainingJobBuilder {
        TrainingJobBuilder::default()
    }
}

/// Builds a [`TrainingJob`]; [`build`](Self::build) validates everything.
#[derive(Debug)]
pub struct TrainingJobBuilder {
    spec: kindling_schemas::spec::JobSpecBuilder,
    job_id: Option<String>,
    /// `None`: local unless a rendezvous is set.
    local_mode: Option<bool>,
    rendezvous: Option<String>,
    token: Option<Token>,
    /// `None`: `kindling-local` in the system's temporary directory.
    work_dir: Option<PathBuf>,
    status_addr: Option<std::net::SocketAddr>,
    channel: ChannelConfig,
    #[cfg(feature = "local")]
    models: kindling_agent::ModelRegistry,
    feeding: Feeding,
    /// The column of [`eval_split_by`](TrainingJobBuilder::eval_split_by).
    split_by: Option<String>,
    recovery: Recovery,
    reporting: Reporting,
    init_from: Option<PathBuf>,
}

impl Default for TrainingJobBuilder {
    fn default() -> Self {
        TrainingJobBuilder {
            spec: JobSpec::builder(),
            job_id: None,
            local_mode: None,
            rendezvous: None,
            token: None,
            work_dir: None,
            status_addr: None,
            channel: ChannelConfig::default(),
            #[cfg(feature = "local")]
            models: kindling_agent::ModelRegistry::builtin(),
            feeding: Feeding::default(),
            split_by: None,
            recovery: Recovery::default(),
            reporting: Reporting::default(),
            init_from: None,
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
        /// Compute precision: `Bf16` is mixed precision on the GPU (bf16 compute, f32 master weights).
        precision: Precision,
        /// Checkpoint policy.
        checkpoint: CheckpointPolicy,
        /// Shuffle batch order every epoch.
        shuffle: bool,
        /// Regression targets per label (a `FixedSizeList<Float32>` label when more than 1).
        targets: usize,
        /// The learning rate by global step (default constant; the guide's "Training options").
        schedule: Schedule,
        /// Clip the all-reduced gradient by global norm or by value.
        clip: GradientClip,
        /// Micro-batches of `batch_size` rows each agent sums per step.
        accumulate: u32,
        /// Stop when a metric stops improving, keeping the best epoch.
        early_stopping: EarlyStopping,
        /// `k` of the eval split's top-k accuracy (default 5).
        top_k: u32,
    }

    /// Starts from the weights of a safetensors file with PyTorch's names and
    /// layouts (what [`TrainedModel::export`] writes, or
    /// `safetensors.torch.save_file(module.state_dict(), path)`), or of a
    /// PyTorch state dict (`torch.save(module.state_dict(), "x.pt")`; `.pt`
    /// or `.pth`, read by burn-store without running its pickle), instead of
    /// seeded ones: every tensor of the model must be in it by name, shape
    /// and dtype, and nothing else, or `fit` refuses naming the first that
    /// does not fit, before anything trains. The spec records the file and
    /// its SHA-256 (`init_from`); a checkpoint, when the job resumes, wins.
    pub fn init_from(mut self, path: impl Into<PathBuf>) -> Self {
        self.init_from = Some(path.into());
        self
    }

    /// The job's seed (default 0). It fixes:
    ///
    /// - the initial weights (rank 0 draws them and sends them to the
    ///   others);
    /// - the shuffle from the second epoch on: the order of each rank's
    ///   cached batches and of the rows inside each (with `shuffle`, the
    ///   default);
    /// - the eval split ([`eval_fraction`](Self::eval_fraction)): with
    ///   [`eval_split_by`](Self::eval_split_by), exactly which rows are
    ///   eval rows, whatever the data's order; without it, Spark's random
    ///   split, which also depends on the rows' order and partitioning.
    ///
    /// It does not fix which rows each rank holds, nor the first epoch's
    /// order: the rows are dealt to the ranks, and trained first, in the
    /// order Spark returns them (sort in the ETL to fix it); nor random
    /// numbers a model draws while training (dropout: burn's generator is
    /// shared by the agent's process); nor the rounding of sums split over
    /// threads or a GPU.
    pub fn seed(mut self, seed: u64) -> Self {
        self.spec = self.spec.seed(seed);
        self
    }

    /// Weights each class's rows in the loss, one positive weight per
    /// class (`torch`'s `CrossEntropyLoss(weight=…)`, Keras' `class_weight`).
    pub fn class_weights(mut self, weights: impl Into<Vec<f64>>) -> Self {
        self.spec = self.spec.class_weights(weights);
        self
    }

    /// Weights each row by the numeric `column` (finite, ≥ 0) in the loss
    /// and in every eval metric (scikit-learn's `sample_weight`).
    pub fn sample_weight(mut self, column: impl Into<String>) -> Self {
        self.spec = self.spec.sample_weight(column);
        self
    }

    /// Parameter path patterns that take no weight decay, e.g.
    /// `["bias", "*norm*", "*embedding*"]`.
    pub fn no_weight_decay<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spec = self.spec.no_weight_decay(patterns);
        self
    }

    /// Declares feature `column` categorical: `Int32`/`Int64` ids in
    /// `0..vocabulary` (map strings to ids in the ETL), for an embedding.
    pub fn categorical(mut self, column: impl Into<String>, vocabulary: usize) -> Self {
        self.spec = self.spec.categorical(column, vocabulary);
        self
    }

    /// Declares feature `column` a sequence: `List<Int32|Int64>` of ids in
    /// `0..vocabulary`, at most `max_len` per row.
    pub fn sequence(mut self, column: impl Into<String>, vocabulary: usize, max_len: usize) -> Self {
        self.spec = self.spec.sequence(column, vocabulary, max_len);
        self
    }

    /// The models this process can train in local mode and predict with
    /// (default: the built-ins). Register your own model here to train it
    /// in-process with no agent binary:
    /// `.models(ModelRegistry::builtin().with::<MyNet>("my-net"))`.
    #[cfg(feature = "local")]
    pub fn models(mut self, models: kindling_agent::ModelRegistry) -> Self {
        self.models = models;
        self
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

    /// In local mode, where the in-process rendezvous — and so its status
    /// page — listens (a loopback address unless the cluster has TLS; by
    /// default a free port on 127.0.0.1). `fit` prints the page's address.
    pub fn status_addr(mut self, addr: std::net::SocketAddr) -> Self {
        self.status_addr = Some(addr);
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

    /// Holds out this fraction of rows and reports eval loss and metrics
    /// after every epoch. By default the rows are drawn by Spark's seeded
    /// random split, which moves when the query's row order or partitioning
    /// does; [`eval_split_by`](Self::eval_split_by) draws them by a column.
    pub fn eval_fraction(mut self, fraction: f64) -> Self {
        self.feeding.eval_fraction = fraction;
        self
    }

    /// Draws the eval split ([`eval_fraction`](Self::eval_fraction)) by a
    /// hash of `column`'s value and the [`seed`](Self::seed): each row is
    /// an eval row or not by its own value, so the same data gives the same
    /// split whatever order or partitioning Spark returns it in, and rows
    /// sharing a value (a user's, a session's) fall on the same side.
    ///
    /// `column`: an integer or string column (an id; need not be a
    /// feature). `fit` refuses a missing column, another type or a null,
    /// naming it ([`JobError::SplitColumn`]), before anything starts on the
    /// agents. The spec records the split ([`EvalSplit`] gives the hash);
    /// the guide's "The eval split" has the rest.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), kindling::job::JobError> {
    /// use kindling::job::TrainingJob;
    /// use kindling::{ModelSpec, Task};
    /// let job = TrainingJob::builder()
    ///     .model(ModelSpec::Linear)
    ///     .task(Task::Classification { num_classes: 2 })
    ///     .features(["x1", "x2"])
    ///     .label("y")
    ///     .eval_fraction(0.2)
    ///     .eval_split_by("user_id")
    ///     .seed(7)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn eval_split_by(mut self, column: impl Into<String>) -> Self {
        self.split_by = Some(column.into());
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
        self.recovery.max_attempts = attempts;
        self
    }

    /// Unacknowledged bytes allowed in flight per shard.
    pub fn window_bytes(mut self, bytes: usize) -> Self {
        self.feeding.window_bytes = bytes;
        self
    }

    /// Bytes per `DoPut` stream of a driver-relayed shard (default 4 MiB).
    /// Each stream commits on the agent when it closes, and agents train on
    /// committed rows while the rest arrive: smaller means training starts
    /// sooner, larger means fewer streams.
    pub fn commit_bytes(mut self, bytes: usize) -> Self {
        self.feeding.commit_bytes = bytes;
        self
    }

    /// Persist the DataFrame in Spark during the job so a lost shard can be
    /// re-sent cheaply and identically (default on). A persisted DataFrame is
    /// also relayed in slices (see [`relay_slice_bytes`](Self::relay_slice_bytes)),
    /// so its size is not bounded by the Spark Connect server's result limit.
    pub fn persist(mut self, persist: bool) -> Self {
        self.feeding.persist = persist;
        self
    }

    /// Arrow bytes per query of the driver relay when the DataFrame is
    /// persisted (default 256 MiB; at most three quarters of the server's
    /// `spark.driver.maxResultSize` are used whatever this says). The Spark
    /// Connect server returns a query's result through its driver and holds
    /// what the client has not read yet, so it holds at most one slice.
    pub fn relay_slice_bytes(mut self, bytes: u64) -> Self {
        self.feeding.relay_slice_bytes = bytes;
        self
    }

    /// How long agents wait for the whole gang (default 60 s). `fit` gives
    /// the rendezvous this plus [`replacement_wait`](Self::replacement_wait):
    /// while it waits for a replacement the survivors wait in the gang, and
    /// that wait must not fail the attempt.
    pub fn gang_timeout(mut self, timeout: Duration) -> Self {
        self.recovery.gang_timeout = timeout;
        self
    }

    /// How long `fit` waits for a replacement when an agent is lost and no
    /// spare agent is live (default 2 minutes): a DaemonSet restarts the
    /// agent's pod on its node, or a new node's agent registers. The job then
    /// resumes from its latest checkpoint; after the wait it fails naming the
    /// lost agents.
    pub fn replacement_wait(mut self, wait: Duration) -> Self {
        self.recovery.replacement_wait = wait;
        self
    }

    /// Elastic shrink: the fewest agents the job may go on with (default
    /// `num_slots`: no shrink). When an agent is lost and no replacement
    /// registers within [`replacement_wait`](Self::replacement_wait), and at
    /// least `min_slots` agents survive, the survivors take over the lost
    /// agents' shards (their rows are sent to them again) and the job resumes
    /// from its latest checkpoint on fewer ranks; every epoch still trains
    /// every row once. With fewer survivors `fit` fails with
    /// [`JobError::NoReplacement`] naming the lost agents.
    pub fn min_slots(mut self, min_slots: u32) -> Self {
        self.recovery.min_slots = Some(min_slots);
        self
    }

    /// Elastic growth: the most agents the job may grow to (default
    /// `num_slots`: no growth). The rows are dealt into `max_slots` shards,
    /// several per agent; when an agent registers while the job trains,
    /// `fit` lets it join at the next epoch's end: the gang re-forms one
    /// larger, some shards move to the newcomer (agent to agent, through
    /// this process, without a second Spark query; each row exactly once)
    /// and training resumes from that epoch's checkpoint on more ranks. The
    /// learning rate is kept: each rank still steps `batch_size` rows, so
    /// the global batch grows with the gang. Needs the driver relay feed
    /// (the default); a search's trial does not grow, a detached job
    /// ([`submit`](crate::job::TrainingJob::submit)) grows while a follower
    /// waits on it ([`JobHandle::wait`](crate::job::JobHandle::wait)).
    pub fn max_slots(mut self, max_slots: u32) -> Self {
        self.recovery.max_slots = Some(max_slots);
        self
    }

    /// The job's client lease (default 30 s): `fit` renews it at the
    /// rendezvous every third of it, and if this process dies without
    /// cleaning up (SIGKILL, a lost node) the rendezvous cancels the job once
    /// the lease lapses, so its agents drop its rows and take other jobs.
    pub fn client_lease(mut self, lease: Duration) -> Self {
        self.recovery.client_lease = lease;
        self
    }

    /// Keepalive and deadlines of the job's connections to the agents and
    /// the rendezvous (default [`ChannelConfig::default`]): an agent that
    /// goes silent without closing its connection is found within the
    /// keepalive's detection bound (a data stream) or the call timeout (a
    /// status call) and handled as a lost agent.
    pub fn channel(mut self, channel: ChannelConfig) -> Self {
        self.channel = channel;
        self
    }

    /// How progress is shown.
    pub fn progress(mut self, mode: ProgressMode) -> Self {
        self.reporting.progress = mode;
        self
    }

    /// Also sends the job's events to `events`, a bounded channel: `fit`
    /// never waits for the application to read it. Progress updates
    /// ([`TrainingEvent::Streamed`], [`TrainingEvent::Step`]) are skipped while
    /// the channel is more than half full, so the milestones (start, each
    /// split fed, each epoch, recoveries, the end) fit in the rest; size it for
    /// those if you read only after `fit` returns (a few plus one per epoch).
    /// Beyond that, events are dropped with a warning.
    pub fn events(mut self, events: mpsc::Sender<TrainingEvent>) -> Self {
        self.reporting.events = Some(events);
        self
    }

    /// Logs the run to MLflow: the spec as params, every epoch's metrics
    /// by step, early stopping as tags, the model under the run's `model/`
    /// artifacts. A tracking server that is down or slow never fails or
    /// holds up training (see [`MlflowTracking`]); `MLFLOW_TRACKING_TOKEN`,
    /// when set, is sent as a bearer token (over HTTPS, or to this machine).
    pub fn mlflow(mut self, url: impl Into<String>, experiment: impl Into<String>) -> Self {
        self.reporting.mlflow = Some(MlflowTracking::new(url, experiment));
        self
    }

    /// How long `fit` waits at the end for MLflow to take the run's last
    /// updates (default 10 s); set after [`mlflow`](Self::mlflow).
    pub fn mlflow_flush_timeout(mut self, wait: Duration) -> Self {
        if let Some(m) = &mut self.reporting.mlflow {
            m.flush_timeout = wait;
        }
        self
    }

    /// How rows reach the agents: [`Feed::DriverRelay`] (default) or
    /// [`Feed::ExecutorPush`].
    pub fn feed(mut self, feed: Feed) -> Self {
        self.feeding.feed = feed;
        self
    }

    /// Validates and returns the job.
    pub fn build(self) -> Result<TrainingJob, JobError> {
        let fraction = self.feeding.eval_fraction;
        if !(0.0..0.9).contains(&fraction) {
            return Err(JobError::Setting {
                setting: "eval_fraction",
                reason: format!("must be in [0, 0.9), got {fraction}"),
            });
        }
        let spec = match &self.split_by {
            Some(_) if fraction == 0.0 => {
                return Err(setting(
                    "eval_split_by",
                    "draws the eval split, and there is none: set eval_fraction above 0",
                ));
            }
            Some(by) => self.spec.eval_split(EvalSplit::new(by.clone(), fraction)),
            None => self.spec,
        }
        .build()?;
        let spec = match &self.init_from {
            Some(path) => pretrained::recorded(spec, path)?,
            None => spec,
        };
        let (feeding, recovery) = (&self.feeding, &self.recovery);
        if recovery.max_attempts == 0 {
            return Err(setting("max_attempts", "must be at least 1"));
        }
        if feeding.window_bytes < 64 << 10 {
            return Err(setting("window_bytes", "must be at least 64 KiB"));
        }
        if feeding.commit_bytes < 64 << 10 {
            return Err(setting("commit_bytes", "must be at least 64 KiB"));
        }
        if recovery.client_lease < Duration::from_secs(1) {
            return Err(setting("client_lease", "must be at least 1 s"));
        }
        if feeding.relay_slice_bytes < 1 << 20 {
            return Err(setting("relay_slice_bytes", "must be at least 1 MiB"));
        }
        let min_slots = recovery.min_slots.unwrap_or(spec.num_slots);
        if !(1..=spec.num_slots).contains(&min_slots) {
            return Err(JobError::Setting {
                setting: "min_slots",
                reason: format!("must be in 1..={} (num_slots), got {min_slots}", spec.num_slots),
            });
        }
        let max_slots = recovery.max_slots.unwrap_or(spec.num_slots);
        if max_slots < spec.num_slots || max_slots > MAX_SHARDS {
            return Err(JobError::Setting {
                setting: "max_slots",
                reason: format!(
                    "must be in {}..={MAX_SHARDS} (num_slots..), got {max_slots}",
                    spec.num_slots
                ),
            });
        }
        if max_slots > spec.num_slots && !matches!(feeding.feed, Feed::DriverRelay) {
            return Err(JobError::Setting {
                setting: "max_slots",
                reason: "a job grows with the driver relay feed only: its shards move between agents by \
                         producer; leave max_slots at num_slots with executor push"
                    .into(),
            });
        }
        if let Some(id) = &self.job_id {
            kindling_schemas::descriptor::check_job_id(id).map_err(JobError::JobId)?;
        }
        if let Feed::ExecutorPush(push) = &feeding.feed {
            push.check()
                .map_err(|(setting, reason)| JobError::Setting { setting, reason })?;
        }
        let local_mode = self.local_mode.unwrap_or(self.rendezvous.is_none());
        // The model's config is checked here when this process has the model
        // (always in local mode); cluster agents check it when the job starts.
        #[cfg(feature = "local")]
        if local_mode || self.models.contains(spec.model.name()) {
            self.models.check(&spec)?;
        }
        if local_mode && cfg!(not(feature = "local")) {
            return Err(setting(
                "local_mode",
                "this build of kindling has no local mode (the `local` feature is off): set .rendezvous(url)",
            ));
        }
        if !local_mode && self.rendezvous.is_none() {
            return Err(setting(
                "rendezvous",
                "a cluster job needs .rendezvous(url); or use .local_mode(true)",
            ));
        }
        let work_dir = self
            .work_dir
            .unwrap_or_else(|| std::env::temp_dir().join("kindling-local"));
        Ok(TrainingJob {
            spec,
            job_id: self.job_id,
            placement: Placement {
                local_mode,
                rendezvous: self.rendezvous,
                token: self.token,
                work_dir,
                status_addr: self.status_addr,
                channel: self.channel,
                #[cfg(feature = "local")]
                models: self.models,
            },
            feeding: self.feeding,
            recovery: self.recovery,
            reporting: self.reporting,
        })
    }
}

fn setting(setting: &'static str, reason: &str) -> JobError {
    JobError::Setting {
        setting,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::push::ExecutorPush;

    fn job(num_slots: u32) -> TrainingJobBuilder {
        TrainingJob::builder()
            .model(ModelSpec::Mlp { hidden: vec![4] })
            .task(Task::Regression)
            .features(["x"])
            .label("y")
            .num_slots(num_slots)
    }

    #[test]
    fn max_slots_below_num_slots_or_with_executor_push_is_refused_naming_it() {
        let refused = |b: TrainingJobBuilder| match b.build() {
            Err(JobError::Setting { setting, reason }) => (setting, reason),
            other => panic!("refused: {other:?}"),
        };
        let (setting, reason) = refused(job(3).max_slots(2));
        assert_eq!(setting, "max_slots");
        assert!(reason.contains("must be in 3..=1024"), "{reason}");
        let (setting, reason) = refused(
            job(2)
                .max_slots(3)
                .feed(Feed::ExecutorPush(ExecutorPush::default())),
        );
        assert_eq!(setting, "max_slots");
        assert!(reason.contains("driver relay"), "{reason}");
        assert!(job(2).max_slots(3).build().is_ok());
    }
}
