//! Predicting inside Spark: [`TrainedModel::transform`] serves the model on
//! the cluster's agents and returns a lazy DataFrame whose tasks each send
//! their partition to the agent on their own node (`DoExchange`) and get the
//! predictions back — the rows never reach the driver or this client.

use std::time::Duration;

use kindling_schemas::action::Action;
use kindling_schemas::credential::Role;
use kindling_schemas::model_serving::{ServeModel, ServeModelResponse, ServedList};
use kindling_schemas::rendezvous::RendezvousClient;
use kindling_schemas::spec::Task;

use super::target::ServingCluster;
use super::{JobError, TrainedModel};
use crate::feed::AgentClient;
use crate::feed::push::DEFAULT_EXECUTOR_PYTHON;
use crate::spark::{DataFrame, MapInArrowUdf};

/// How long the executors' credential for a served model lives.
const READER_CREDENTIAL_TTL_SECS: u64 = 24 * 3600;

/// Settings of [`TrainedModel::transform_with`].
///
/// ```
/// use kindling::job::Transform;
/// let t = Transform::new().require_node_local(true).python_version("3.12");
/// assert!(t.requires_node_local());
/// ```
#[derive(Debug, Clone)]
pub struct Transform {
    python_version: String,
    timeout: Duration,
    require_node_local: bool,
}

impl Default for Transform {
    fn default() -> Self {
        Transform {
            python_version: DEFAULT_EXECUTOR_PYTHON.into(),
            timeout: Duration::from_secs(60),
            require_node_local: false,
        }
    }
}

impl Transform {
    /// Defaults: executors on Python [`DEFAULT_EXECUTOR_PYTHON`]; a task
    /// whose node has no agent predicts on another node's agent.
    pub fn new() -> Self {
        Self::default()
    }

    /// The executors' Python `major.minor`.
    pub fn python_version(mut self, version: impl Into<String>) -> Self {
        self.python_version = version.into();
        self
    }

    /// Each executor's Flight calls' timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Fail a task whose node has no agent (`KINDLING_AGENT_ADDRESS` unset),
    /// naming the node, instead of predicting on another node's agent.
    pub fn require_node_local(mut self, require: bool) -> Self {
        self.require_node_local = require;
        self
    }

    /// Whether a task whose node has no agent fails.
    pub fn requires_node_local(&self) -> bool {
        self.require_node_local
    }
}

/// Where a model is served: its id and the agents that loaded it.
#[derive(Debug, Clone)]
pub struct Served {
    /// The version's id (`<model>-<16 hex digits>`): `DoExchange` on
    /// `[model_id, predict]` predicts with it on any of `agents`.
    pub model_id: String,
    /// Each serving agent's answer (whether it loaded the model now).
    pub agents: Vec<(String, ServeModelResponse)>,
}

/// The prediction columns `transform` appends, as Spark DDL.
fn prediction_ddl(task: Task, outputs: usize) -> &'static str {
    match task {
        Task::Classification { .. } => "prediction long, probabilities array<float>",
        Task::Regression if outputs == 1 => "prediction float",
        Task::Regression => "prediction array<float>",
    }
}

impl TrainedModel {
    /// The model served by `rendezvous`' live agents from now on (a loaded
    /// model, or one trained elsewhere).
    pub fn serve_on(mut self, cluster: ServingCluster) -> Self {
        self.serving = Some(cluster);
        self
    }

    /// The cluster that serves it for [`transform`](Self::transform), if any.
    pub fn serving_cluster(&self) -> Option<&ServingCluster> {
        self.serving.as_ref()
    }

    fn cluster(&self) -> Result<&ServingCluster, JobError> {
        self.serving.as_ref().ok_or(JobError::NoServingCluster)
    }

    /// Loads the model on every live agent of its cluster that has its model
    /// registered (once per agent and version: an agent that serves it
    /// already loads nothing).
    pub async fn serve(&self) -> Result<Served, JobError> {
        let cluster = self.cluster()?;
        let serve = ServeModel::new(
            self.spec.clone(),
            self.meta.input_dim,
            self.meta.inputs.clone(),
            &self.weights,
        )
        .map_err(|reason| JobError::Setting {
            setting: "transform",
            reason: format!("encoding the weights: {reason}"),
        })?;
        let rv =
            RendezvousClient::connect_with(&cluster.rendezvous, cluster.token.as_ref(), &cluster.channel)
                .await?;
        let model = self.spec.model.name();
        let agents: Vec<_> = rv
            .list_agents()
            .await?
            .into_iter()
            .filter(|a| a.models.iter().any(|m| m == model))
            .collect();
        if agents.is_empty() {
            return Err(JobError::NotEnoughAgents {
                needed: 1,
                live: 0,
                rendezvous: cluster.rendezvous.clone(),
            });
        }
        let model_id = serve.model_id.clone();
        let action = Action::ServeModel(serve);
        let mut served = Vec::with_capacity(agents.len());
        for a in agents {
            let client =
                AgentClient::connect_with(&a.flight_address, cluster.token.as_ref(), &cluster.channel)?;
            let answer: ServeModelResponse = client.action(&action).await?;
            served.push((client.url().to_owned(), answer));
        }
        Ok(Served {
            model_id,
            agents: served,
        })
    }

    /// [`transform_with`](Self::transform_with) with the defaults.
    pub async fn transform(&self, df: &DataFrame) -> Result<DataFrame, JobError> {
        self.transform_with(df, &Transform::default()).await
    }

    /// `df` with the model's predictions appended — `prediction` (class id,
    /// `long`) and `probabilities` (`array<float>`) for classification,
    /// `prediction` (`float`, or `array<float>` for several targets) for
    /// regression — computed on the Spark executors, each task asking the
    /// agent on its node. Lazy like any DataFrame: serving the model on the
    /// agents happens now, predicting when an action runs the plan. The
    /// executors need Python with pyarrow (as executor push does).
    pub async fn transform_with(&self, df: &DataFrame, opts: &Transform) -> Result<DataFrame, JobError> {
        let cluster = self.cluster()?;
        let input = df.schema().await?;
        let layout = self.check_input(&input)?;
        for taken in ["prediction", "probabilities"] {
            if input.index_of(taken).is_ok() {
                return Err(JobError::PredictionColumnTaken { column: taken });
            }
        }
        let served = self.serve().await?;
        let first = AgentClient::connect_with(&served.agents[0].0, cluster.token.as_ref(), &cluster.channel)?;
        // A reader credential of this model can predict with it and do
        // nothing else, so it may travel in the plan; agents without a
        // credential key issue none: then the token in local mode, else the
        // executors' own KINDLING_TOKEN.
        let token = match first
            .issue_credential(&served.model_id, Role::Reader, READER_CREDENTIAL_TTL_SECS)
            .await?
        {
            Some(credential) => Some(credential),
            None => cluster
                .local
                .then(|| cluster.token.as_ref().map(|t| t.expose().to_owned()))
                .flatten(),
        };
        let output = format!(
            "{}, {}",
            crate::spark::schema_to_ddl(&input)?,
            prediction_ddl(self.spec.task, self.spec.output_dim())
        );
        let mut config = serde_json::json!({
            "model_id": served.model_id,
            "columns": layout.features.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
            "output": output,
            "agents": served.agents.iter().map(|(url, _)| url.clone()).collect::<Vec<_>>(),
            "require_node_local": opts.require_node_local,
            "timeout": opts.timeout.as_secs_f64(),
        });
        if let Some(t) = token {
            config["token"] = t.into();
        }
        let session = df.session();
        session
            .add_python_package("kindling_client", crate::feed::push::KINDLING_CLIENT_PY)
            .await?;
        let udf = MapInArrowUdf::new(
            "kindling_client.predict",
            "udf_command",
            output,
            &opts.python_version,
        )
        .inputs(input.fields().iter().map(|f| f.name().clone()))
        .arg(config.to_string());
        Ok(df.map_in_arrow(&udf)?)
    }

    /// What `cluster`'s agent `url` serves (its loads, streams and rows per model).
    pub async fn served_on(cluster: &ServingCluster, url: &str) -> Result<ServedList, JobError> {
        let client = AgentClient::connect_with(url, cluster.token.as_ref(), &cluster.channel)?;
        Ok(client.action(&Action::ServedModels).await?)
    }
}
