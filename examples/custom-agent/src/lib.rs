//! A crate with a burn model of its own, trained by Kindling: [`WideAndDeep`],
//! registered as `wide-and-deep` next to the built-ins ([`registry`]); the
//! crate's binary is the agent that trains it (`src/main.rs`, one line).
//!
//! A job names the model with its config and declares the categorical
//! columns the model embeds:
//!
//! ```no_run
//! use kindling::{ModelSpec, Task, TrainingJob};
//! use kindling_example_agent::{MODEL, WideAndDeepConfig};
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = WideAndDeepConfig::new(vec!["city".into()]).with_embedding(4);
//! let job = TrainingJob::builder()
//!     .model(ModelSpec::custom(MODEL, &config)?)
//!     .task(Task::Classification { num_classes: 2 })
//!     .features(["x1", "city"])
//!     .categorical("city", 5)
//!     .label("y")
//!     .rendezvous("http://kindling-rendezvous:7070")
//!     .models(kindling_example_agent::registry()) // to predict in this process
//!     .build()?;
//! # let _ = job; Ok(()) }
//! ```

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, Relu};
use burn::tensor::{Device, Tensor};
use kindling::model::{AgentError, Batch, ConfigError, Inputs, KindlingModel, ModelRegistry};
use kindling::{InputType, JobSpec};

/// The name [`WideAndDeep`] is registered under.
pub const MODEL: &str = "wide-and-deep";

/// The models this crate's agent trains: the built-ins and `wide-and-deep`.
pub fn registry() -> ModelRegistry {
    ModelRegistry::builtin().with::<WideAndDeep>(MODEL)
}

/// Config of [`WideAndDeep`] (the `config` of `ModelSpec::Custom`).
#[derive(Config, Debug)]
pub struct WideAndDeepConfig {
    /// Categorical columns to embed, each declared in the job with
    /// `.categorical(column, vocabulary)`.
    pub columns: Vec<String>,
    /// Width of each column's embedding.
    #[config(default = 8)]
    pub embedding: usize,
    /// Width of the numeric tower over the float features.
    #[config(default = 32)]
    pub hidden: usize,
}

/// Largest accepted embedding or hidden width.
pub const MAX_WIDTH: usize = 4096;

/// An embedding per categorical column and a numeric tower (Linear + ReLU)
/// over the float features, concatenated into a linear head.
#[derive(Module, Debug)]
pub struct WideAndDeep {
    embeddings: Vec<Embedding>,
    numeric: Option<Linear>,
    activation: Relu,
    head: Linear,
    #[module(skip)]
    columns: Vec<String>,
}

fn width(field: &str, value: usize) -> Result<(), ConfigError> {
    match value {
        0 => Err(ConfigError::new(field, "must be at least 1")),
        v if v > MAX_WIDTH => Err(ConfigError::new(field, format!("must be at most {MAX_WIDTH}"))),
        _ => Ok(()),
    }
}

impl KindlingModel for WideAndDeep {
    type Config = WideAndDeepConfig;

    fn validate(config: &Self::Config, spec: &JobSpec) -> Result<(), ConfigError> {
        width("embedding", config.embedding)?;
        width("hidden", config.hidden)?;
        for (i, column) in config.columns.iter().enumerate() {
            let field = format!("columns[{i}]");
            if !matches!(spec.inputs.get(column), Some(InputType::Categorical { .. })) {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "`{column}` is not declared categorical: declare it with .categorical(\"{column}\", vocabulary)"
                    ),
                ));
            }
            if config.columns[..i].contains(column) {
                return Err(ConfigError::new(field, format!("`{column}` is listed twice")));
            }
        }
        let floats = spec.features.iter().any(|f| !spec.inputs.contains_key(f));
        if config.columns.is_empty() && !floats {
            return Err(ConfigError::new(
                "columns",
                "the job has no float features, so the model would read nothing: name a categorical column",
            ));
        }
        Ok(())
    }

    fn init(config: &Self::Config, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        let embeddings = config
            .columns
            .iter()
            .map(|c| Ok(EmbeddingConfig::new(inputs.vocabulary(c)?, config.embedding).init(device)))
            .collect::<Result<Vec<_>, AgentError>>()?;
        let numeric = (inputs.float_width() > 0)
            .then(|| LinearConfig::new(inputs.float_width(), config.hidden).init(device));
        let joined = config.columns.len() * config.embedding + numeric.as_ref().map_or(0, |_| config.hidden);
        Ok(WideAndDeep {
            embeddings,
            numeric,
            activation: Relu::new(),
            head: LinearConfig::new(joined, inputs.outputs()).init(device),
            columns: config.columns.clone(),
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        let mut parts = Vec::with_capacity(self.columns.len() + 1);
        for (column, embedding) in self.columns.iter().zip(&self.embeddings) {
            let ids = batch.ids(column)?.unsqueeze_dim::<2>(1);
            parts.push(embedding.forward(ids).squeeze_dim::<2>(1));
        }
        if let Some(numeric) = &self.numeric {
            parts.push(self.activation.forward(numeric.forward(batch.features()?)));
        }
        Ok(self.head.forward(Tensor::cat(parts, 1)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kindling::arrow::array::{Float64Array, Int32Array, RecordBatch, StringArray};
    use kindling::arrow::datatypes::{DataType, Field, Schema};
    use kindling::model::ModelError;
    use kindling::{ModelSpec, Task};
    // The agent's own schema check, to build the layout a job's data gives.
    use kindling_schemas::schema::{StreamKind, validate};

    use super::*;

    fn spec(config: &WideAndDeepConfig) -> JobSpec {
        JobSpec::builder()
            .model(ModelSpec::custom(MODEL, config).expect("custom"))
            .task(Task::Classification { num_classes: 3 })
            .features(["x1", "city", "shop"])
            .categorical("city", 5)
            .categorical("shop", 7)
            .label("y")
            .build()
            .expect("spec")
    }

    fn refusal(config: WideAndDeepConfig) -> (String, String) {
        match registry().check(&spec(&config)) {
            Err(AgentError::Model(ModelError::Config { model, field, reason })) => {
                assert_eq!(model, MODEL);
                (field, reason)
            }
            other => panic!("expected a config refusal, got {other:?}"),
        }
    }

    #[test]
    fn bad_configs_are_refused_naming_the_field() {
        let ok = WideAndDeepConfig::new(vec!["city".into(), "shop".into()]);
        registry().check(&spec(&ok)).expect("a good config");
        let (field, reason) = refusal(ok.clone().with_embedding(0));
        assert_eq!(
            (field.as_str(), reason.as_str()),
            ("embedding", "must be at least 1")
        );
        assert_eq!(refusal(ok.clone().with_hidden(0)).0, "hidden");
        assert_eq!(refusal(ok.clone().with_hidden(MAX_WIDTH + 1)).0, "hidden");
        let (field, reason) = refusal(WideAndDeepConfig::new(vec!["city".into(), "x1".into()]));
        assert_eq!(field, "columns[1]");
        assert!(reason.contains("`x1` is not declared categorical"), "{reason}");
        assert_eq!(
            refusal(WideAndDeepConfig::new(vec!["city".into(), "city".into()])).0,
            "columns[1]"
        );
        // The JSON itself: a field of the wrong type.
        let bad = JobSpec {
            model: ModelSpec::Custom {
                name: MODEL.into(),
                config: serde_json::json!({"columns": ["city"], "embedding": "wide"}),
            },
            ..spec(&ok)
        };
        assert!(
            matches!(registry().check(&bad), Err(AgentError::Model(ModelError::Config { ref field, .. })) if field == "<json>")
        );
    }

    #[test]
    fn the_config_travels_whole_and_the_model_has_one_embedding_per_column() {
        // burn's `Config` fills defaults in `new`, not when parsing: the spec
        // carries the whole config.
        let config = WideAndDeepConfig::new(vec!["shop".into()]);
        let json = serde_json::json!({"columns": ["shop"], "embedding": 8, "hidden": 32});
        assert_eq!(ModelSpec::custom(MODEL, &config).expect("spec").config(), json);

        let config = WideAndDeepConfig::new(vec!["city".into(), "shop".into()])
            .with_embedding(4)
            .with_hidden(6);
        let spec = spec(&config);
        let schema = Arc::new(Schema::new(vec![
            Field::new("x1", DataType::Float64, false),
            Field::new("city", DataType::Int32, false),
            Field::new("shop", DataType::Int32, false),
            Field::new("y", DataType::Int32, false),
        ]));
        let layout = validate(&schema, &spec, StreamKind::Train).expect("layout");
        let model = registry().build_seeded(&spec, &layout, 1).expect("build");
        let table = model.to_arrow().expect("table");
        let names = table
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("names");
        let names: Vec<&str> = names.iter().map(|n| n.expect("name")).collect();
        assert_eq!(
            names,
            [
                "embeddings.0.weight",
                "embeddings.1.weight",
                "numeric.weight",
                "numeric.bias",
                "head.weight",
                "head.bias"
            ]
        );
        // city 5×4 + shop 7×4 + numeric 1×6+6 + head (4+4+6)×3+3
        assert_eq!(model.num_params(), 20 + 28 + 12 + 45);

        let rows = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Float64Array::from(vec![0.5, -1.0])),
                Arc::new(Int32Array::from(vec![4, 0])),
                Arc::new(Int32Array::from(vec![6, 2])),
                Arc::new(Int32Array::from(vec![0, 2])),
            ],
        )
        .expect("rows");
        let device = Device::flex();
        let batch = Batch::new(&rows, &layout, &spec, &device);
        assert_eq!(model.valid().forward(&batch).expect("forward").dims(), [2, 3]);
    }
}
