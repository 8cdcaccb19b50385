//! The model registry: the models an agent or a local-mode client can
//! train, by name, how each is built (seeded, under the init lock, its
//! parameters counted before any is drawn), and the parameter cap.

use super::*;

use crate::models::params::{init_lock, materialized};

/// A registered model type, behind its name.
trait Factory: Send + Sync {
    fn check(&self, name: &str, config: &serde_json::Value, spec: &JobSpec) -> Result<(), AgentError>;
    /// The parameters of the model for `inputs`, none of them drawn.
    fn count(&self, name: &str, config: &serde_json::Value, inputs: &Inputs<'_>)
    -> Result<usize, AgentError>;
    fn build(
        &self,
        name: &str,
        config: &serde_json::Value,
        inputs: &Inputs<'_>,
        device: &Device,
        max_params: usize,
    ) -> Result<Box<dyn AnyModel>, AgentError>;
}

struct Typed<M>(PhantomData<fn() -> M>);

impl<M: KindlingModel> Typed<M> {
    fn config(name: &str, config: &serde_json::Value) -> Result<M::Config, ModelError> {
        serde_json::from_value(config.clone()).map_err(|e| ModelError::Config {
            model: name.to_owned(),
            field: "<json>".into(),
            reason: e.to_string(),
        })
    }

    /// The model with its parameters not drawn yet (burn draws lazily).
    fn init(
        name: &str,
        config: &serde_json::Value,
        inputs: &Inputs<'_>,
        device: &Device,
    ) -> Result<M, AgentError> {
        M::init(&Self::config(name, config)?, inputs, device)
    }
}

/// Refuses `params` parameters of `model` over `cap`.
fn under_cap(model: &str, params: usize, cap: usize) -> Result<(), ModelError> {
    if params > cap {
        return Err(ModelError::TooLarge {
            model: model.to_owned(),
            params,
            cap,
        });
    }
    Ok(())
}

impl<M: KindlingModel> Factory for Typed<M> {
    fn count(
        &self,
        name: &str,
        config: &serde_json::Value,
        inputs: &Inputs<'_>,
    ) -> Result<usize, AgentError> {
        Ok(Self::init(name, config, inputs, &Device::flex())?.num_params())
    }

    fn check(&self, name: &str, config: &serde_json::Value, spec: &JobSpec) -> Result<(), AgentError> {
        let config = Self::config(name, config)?;
        M::validate(&config, spec).map_err(|e| {
            ModelError::Config {
                model: name.to_owned(),
                field: e.field,
                reason: e.reason,
            }
            .into()
        })
    }

    fn build(
        &self,
        name: &str,
        config: &serde_json::Value,
        inputs: &Inputs<'_>,
        device: &Device,
        max_params: usize,
    ) -> Result<Box<dyn AnyModel>, AgentError> {
        // Counted here, allocated by `materialized`.
        let model = Self::init(name, config, inputs, device)?;
        under_cap(name, model.num_params(), max_params)?;
        Ok(Box::new(Erased(materialized(model))))
    }
}

/// The models an agent (or a local-mode client) can train, by name.
///
/// ```
/// use kindling_agent::ModelRegistry;
/// let models = ModelRegistry::builtin();
/// assert_eq!(models.names(), ["cnn", "linear", "mlp"]);
/// ```
#[derive(Clone)]
pub struct ModelRegistry {
    models: BTreeMap<String, Arc<dyn Factory>>,
    max_params: usize,
}

/// Default of [`ModelRegistry::max_params`]: 250 M parameters (1 GB of f32
/// weights, about 4 GB with gradients and Adam's state).
pub const DEFAULT_MAX_PARAMS: usize = 250_000_000;

impl Default for ModelRegistry {
    fn default() -> Self {
        ModelRegistry {
            models: BTreeMap::new(),
            max_params: DEFAULT_MAX_PARAMS,
        }
    }
}

impl fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.models.keys()).finish()
    }
}

impl ModelRegistry {
    /// No models at all (see [`ModelRegistry::builtin`]).
    pub fn empty() -> Self {
        ModelRegistry::default()
    }

    /// Registers `M` under `name` (replacing what had that name).
    ///
    /// # Panics
    /// If `name` is not a valid model name (`a-z0-9-_.`, starting with a
    /// letter, at most 64 characters): a registry is built in code, so this
    /// is a programming error.
    pub fn with<M: KindlingModel>(mut self, name: &str) -> Self {
        assert!(
            valid_model_name(name),
            "`{name}` is not a model name: a-z, 0-9, `-`, `_`, `.`, starting with a letter, at most 64"
        );
        self.models
            .insert(name.to_owned(), Arc::new(Typed::<M>(PhantomData)));
        self
    }

    /// Refuses to build a model of more than `max` parameters (counted
    /// before any weight is allocated): a job spec cannot make the agent
    /// allocate without bound.
    pub fn with_max_params(mut self, max: usize) -> Self {
        self.max_params = max;
        self
    }

    /// The most parameters a model built here may have.
    pub fn max_params(&self) -> usize {
        self.max_params
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.models.contains_key(name)
    }

    fn factory(&self, spec: &JobSpec) -> Result<&dyn Factory, AgentError> {
        let name = spec.model.name();
        self.models.get(name).map(|f| f.as_ref()).ok_or_else(|| {
            ModelError::Unregistered {
                name: name.to_owned(),
                available: self.names().join(", "),
            }
            .into()
        })
    }

    /// Checks that `spec`'s model is registered and its config parses and
    /// passes the model's own validation (before any row moves).
    pub fn check(&self, spec: &JobSpec) -> Result<(), AgentError> {
        let factory = self.factory(spec)?;
        let (name, config) = (spec.model.name(), spec.model.config());
        factory.check(name, &config, spec)?;
        // Before any row: the model's size with every float feature taken as
        // one value (the data can only make it larger), counted, not drawn.
        // A model that needs the data's real layout to be built is counted
        // when it is built.
        let layout = provisional_layout(spec);
        let _guard = init_lock();
        match factory.count(name, &config, &Inputs::new(&layout)) {
            Ok(params) => Ok(under_cap(name, params, self.max_params)?),
            Err(_) => Ok(()),
        }
    }

    /// `spec`'s model for `layout` on `device`, with weights from the RNG's
    /// current state (to load weights into, or when any start will do).
    pub fn build(
        &self,
        spec: &JobSpec,
        layout: &FeatureLayout,
        device: &Device,
    ) -> Result<Box<dyn AnyModel>, AgentError> {
        let factory = self.factory(spec)?;
        let _guard = init_lock();
        let model = factory.build(
            spec.model.name(),
            &spec.model.config(),
            &Inputs::new(layout),
            device,
            self.max_params,
        )?;
        // A mixed-precision job's weights live on the GPU in its compute dtype.
        match crate::models::backend::compute_dtype(spec)? {
            Some(dtype) if crate::models::backend::is_gpu(device) => Ok(model.with_dtype(dtype)),
            _ => Ok(model),
        }
    }

    /// `spec`'s model with the initial weights `seed` gives, on the CPU with
    /// autodiff: the same weights for the same seed whatever models the
    /// process builds meanwhile (every build takes the init lock; move them
    /// to another device with the record bytes). A forward pass that draws
    /// random numbers (dropout) on another thread at that moment still moves
    /// burn's RNG; ranks agree anyway, as rank 0 sends its initial weights to
    /// the others.
    pub fn build_seeded(
        &self,
        spec: &JobSpec,
        layout: &FeatureLayout,
        seed: u64,
    ) -> Result<Box<dyn AnyModel>, AgentError> {
        let factory = self.factory(spec)?;
        let _guard = init_lock();
        let cpu = Device::flex();
        cpu.seed(seed);
        factory.build(
            spec.model.name(),
            &spec.model.config(),
            &Inputs::new(layout),
            &cpu.autodiff(),
            self.max_params,
        )
    }
}

/// `spec`'s inputs before any data: its declared categorical and sequence
/// inputs, every other feature one float value.
fn provisional_layout(spec: &JobSpec) -> FeatureLayout {
    let mut offset = 0;
    let features = spec
        .features
        .iter()
        .map(|name| {
            let kind = match spec.inputs.get(name) {
                Some(kindling_schemas::spec::InputType::Categorical { vocabulary }) => {
                    FeatureKind::Categorical {
                        vocabulary: *vocabulary,
                    }
                }
                Some(kindling_schemas::spec::InputType::Sequence { vocabulary, max_len }) => {
                    FeatureKind::Sequence {
                        vocabulary: *vocabulary,
                        max_len: *max_len,
                    }
                }
                None => FeatureKind::Scalar(arrow::datatypes::DataType::Float32),
            };
            let column = kindling_schemas::schema::FeatureColumn {
                name: name.clone(),
                offset,
                kind: kind.clone(),
            };
            if matches!(kind, FeatureKind::Scalar(_)) {
                offset += 1;
            }
            column
        })
        .collect();
    FeatureLayout {
        features,
        input_dim: offset,
        label: None,
        outputs: spec.output_dim(),
    }
}
