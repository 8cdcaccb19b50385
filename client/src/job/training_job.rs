//! [`TrainingJob`]: a validated job and its setting groups — where it runs
//! ([`Placement`]), how rows reach the agents ([`Feeding`]), how it recovers
//! ([`Recovery`]) and how it reports ([`Reporting`]). The builder that makes
//! one is in `builder.rs`; running it, in `fit.rs` and `search.rs`.

use std::path::PathBuf;
use std::time::Duration;

use kindling_schemas::auth::Token;
use kindling_schemas::channel::ChannelConfig;
use kindling_schemas::spec::JobSpec;
use tokio::sync::mpsc;

use super::{
    DEFAULT_CLIENT_LEASE, DEFAULT_REPLACEMENT_WAIT, Feed, MlflowTracking, ProgressMode, TrainingEvent,
};

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
    pub(super) spec: JobSpec,
    pub(super) job_id: Option<String>,
    pub(super) placement: Placement,
    pub(super) feeding: Feeding,
    pub(super) recovery: Recovery,
    pub(super) reporting: Reporting,
}

/// Where a job runs: in this process or on a cluster, and how it reaches it.
#[derive(Debug, Clone)]
pub(super) struct Placement {
    pub(super) local_mode: bool,
    pub(super) rendezvous: Option<String>,
    pub(super) token: Option<Token>,
    #[cfg_attr(not(feature = "local"), allow(dead_code))]
    pub(super) work_dir: PathBuf,
    #[cfg_attr(not(feature = "local"), allow(dead_code))]
    pub(super) status_addr: Option<std::net::SocketAddr>,
    pub(super) channel: ChannelConfig,
    #[cfg(feature = "local")]
    pub(super) models: kindling_agent::ModelRegistry,
}

/// How rows reach the agents.
#[derive(Debug, Clone)]
pub(super) struct Feeding {
    pub(super) feed: Feed,
    pub(super) eval_fraction: f64,
    pub(super) window_bytes: usize,
    pub(super) commit_bytes: usize,
    pub(super) persist: bool,
    pub(super) relay_slice_bytes: u64,
}

impl Default for Feeding {
    fn default() -> Self {
        Feeding {
            feed: Feed::DriverRelay,
            eval_fraction: 0.0,
            window_bytes: 32 << 20,
            commit_bytes: 4 << 20,
            persist: true,
            relay_slice_bytes: crate::feed::relay::DEFAULT_SLICE_BYTES,
        }
    }
}

/// How a job recovers: attempts, waits for a gang and for replacements, and
/// the client's lease.
#[derive(Debug, Clone)]
pub(super) struct Recovery {
    pub(super) max_attempts: u32,
    pub(super) gang_timeout: Duration,
    pub(super) replacement_wait: Duration,
    /// `None`: `num_slots` (no shrinking).
    pub(super) min_slots: Option<u32>,
    /// `None`: `num_slots` (no growth).
    pub(super) max_slots: Option<u32>,
    pub(super) client_lease: Duration,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            max_attempts: 3,
            gang_timeout: Duration::from_secs(60),
            replacement_wait: DEFAULT_REPLACEMENT_WAIT,
            min_slots: None,
            max_slots: None,
            client_lease: DEFAULT_CLIENT_LEASE,
        }
    }
}

/// How a job reports: bars or log lines, an event stream, MLflow.
#[derive(Debug, Clone)]
pub(super) struct Reporting {
    pub(super) progress: ProgressMode,
    pub(super) events: Option<mpsc::Sender<TrainingEvent>>,
    pub(super) mlflow: Option<MlflowTracking>,
}

impl Default for Reporting {
    fn default() -> Self {
        Reporting {
            progress: ProgressMode::Auto,
            events: None,
            mlflow: None,
        }
    }
}

impl TrainingJob {
    /// The job spec sent to the agents.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// How rows reach the agents.
    pub fn feed(&self) -> &Feed {
        &self.feeding.feed
    }

    /// Whether the job runs its own rendezvous and agents in this process.
    pub fn is_local(&self) -> bool {
        self.placement.local_mode
    }

    /// The fewest agents the job continues with after losing some.
    pub(super) fn min_slots(&self) -> u32 {
        self.recovery.min_slots.unwrap_or(self.spec.num_slots)
    }

    /// The most agents the job grows to when agents join the cluster.
    pub(super) fn max_slots(&self) -> u32 {
        self.recovery.max_slots.unwrap_or(self.spec.num_slots)
    }
}
