//! What a job spec says about its model: which registered model
//! ([`ModelSpec`], a built-in network or one an agent registered by name,
//! with its config as JSON) and the declared types of its non-float inputs
//! ([`InputType`]).
//!
//! The model's own config is checked by the model itself, on the agent (and
//! in the client when it links the model); here only its shape: a name an
//! agent can register, a JSON object of bounded size.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::SpecError;

/// The model a job trains: one of the three built-in networks, or a model
/// registered by name on the agents (`kindling_agent::ModelRegistry`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSpec {
    /// One dense layer: linear regression, or logistic (softmax) regression
    /// for a classification task.
    Linear,
    /// A multi-layer perceptron with ReLU between the hidden layers.
    Mlp {
        /// Widths of the hidden layers, e.g. `[256, 128]`.
        hidden: Vec<usize>,
    },
    /// A small CNN over one `FixedSizeList<Float32>` image feature, laid out
    /// row-major as `channels × height × width`.
    Cnn {
        /// Input channels (1 for grey scale).
        channels: usize,
        /// Image height.
        height: usize,
        /// Image width.
        width: usize,
        /// Output channels of each 3×3 conv (+ReLU +2×2 max-pool) block.
        conv: Vec<usize>,
        /// Hidden width of the dense layer after the convolutions.
        dense: usize,
    },
    /// A model the agents registered under `name`, built from `config` (the
    /// JSON of the model's config type).
    Custom {
        /// The registered name, e.g. `tabular-embeddings`.
        name: String,
        /// The model's config (a JSON object; `{}` when it has no fields).
        #[serde(default = "empty_object")]
        config: serde_json::Value,
    },
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// Largest accepted layer width of the built-in networks.
pub const MAX_WIDTH: usize = 1 << 16;
/// Longest accepted model name.
pub const MAX_MODEL_NAME: usize = 64;
/// Largest accepted model config, as JSON.
pub const MAX_CONFIG_BYTES: usize = 64 << 10;
/// Largest accepted vocabulary of a categorical or sequence input.
pub const MAX_VOCABULARY: usize = 1 << 24;
/// Largest accepted `max_len` of a sequence input.
pub const MAX_SEQUENCE: usize = 1 << 16;

/// Whether `name` can name a registered model: 1 to [`MAX_MODEL_NAME`]
/// characters of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter.
pub fn valid_model_name(name: &str) -> bool {
    (1..=MAX_MODEL_NAME).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
}

impl ModelSpec {
    /// A registered model with its config (anything serialisable to a JSON
    /// object, such as a burn `#[derive(Config)]` type).
    ///
    /// ```
    /// use kindling_schemas::spec::ModelSpec;
    /// let m = ModelSpec::custom("seq-pool", &serde_json::json!({"embedding": 16})).unwrap();
    /// assert_eq!(m.name(), "seq-pool");
    /// ```
    pub fn custom(name: impl Into<String>, config: &impl Serialize) -> Result<Self, SpecError> {
        let config =
            serde_json::to_value(config).map_err(|e| SpecError::new("model.config", e.to_string()))?;
        Ok(ModelSpec::Custom {
            name: name.into(),
            config,
        })
    }

    /// The name the model is registered under: `linear`, `mlp`, `cnn`, or
    /// the custom model's name.
    pub fn name(&self) -> &str {
        match self {
            ModelSpec::Linear => "linear",
            ModelSpec::Mlp { .. } => "mlp",
            ModelSpec::Cnn { .. } => "cnn",
            ModelSpec::Custom { name, .. } => name,
        }
    }

    /// The model's config as JSON: a custom model's `config`, or a built-in's
    /// fields (`{"hidden": [64]}` for an MLP).
    pub fn config(&self) -> serde_json::Value {
        match self {
            ModelSpec::Custom { config, .. } => config.clone(),
            builtin => {
                let mut v = serde_json::to_value(builtin).unwrap_or_else(|_| empty_object());
                if let Some(map) = v.as_object_mut() {
                    map.remove("kind");
                }
                v
            }
        }
    }

    /// Checks what can be checked without the model: a built-in's fields; a
    /// custom model's name and config shape.
    pub(crate) fn validate(&self, features: &[String]) -> Result<(), SpecError> {
        match self {
            ModelSpec::Linear => Ok(()),
            ModelSpec::Mlp { hidden } => validate_mlp(hidden),
            ModelSpec::Cnn {
                channels,
                height,
                width,
                conv,
                dense,
            } => {
                validate_cnn(*channels, *height, *width, conv, *dense)?;
                if features.len() != 1 {
                    return Err(SpecError::new(
                        "features",
                        "a CNN takes exactly one FixedSizeList<Float32> image column",
                    ));
                }
                Ok(())
            }
            ModelSpec::Custom { name, config } => {
                if !valid_model_name(name) {
                    return Err(SpecError::new(
                        "model.name",
                        format!(
                            "`{name}` is not a model name: 1..={MAX_MODEL_NAME} characters of a-z, 0-9, \
                             `-`, `_`, `.`, starting with a letter"
                        ),
                    ));
                }
                if !config.is_object() {
                    return Err(SpecError::new("model.config", "must be a JSON object"));
                }
                if config.to_string().len() > MAX_CONFIG_BYTES {
                    return Err(SpecError::new(
                        "model.config",
                        format!("larger than {MAX_CONFIG_BYTES} bytes of JSON"),
                    ));
                }
                Ok(())
            }
        }
    }
}

fn validate_mlp(hidden: &[usize]) -> Result<(), SpecError> {
    if hidden.is_empty() {
        return Err(SpecError::new(
            "model.hidden",
            "an MLP needs at least one hidden layer (use `linear` for none)",
        ));
    }
    for (i, w) in hidden.iter().enumerate() {
        if *w == 0 || *w > MAX_WIDTH {
            return Err(SpecError::new(
                format!("model.hidden[{i}]"),
                format!("must be in 1..={MAX_WIDTH}"),
            ));
        }
    }
    Ok(())
}

fn validate_cnn(
    channels: usize,
    height: usize,
    width: usize,
    conv: &[usize],
    dense: usize,
) -> Result<(), SpecError> {
    if channels == 0 || channels > 64 {
        return Err(SpecError::new("model.channels", "must be in 1..=64"));
    }
    let (mut h, mut w) = (height, width);
    if h == 0 || w == 0 || h > 4096 || w > 4096 {
        return Err(SpecError::new(
            "model.height",
            "height and width must be in 1..=4096",
        ));
    }
    if conv.is_empty() {
        return Err(SpecError::new(
            "model.conv",
            "a CNN needs at least one conv block",
        ));
    }
    for (i, c) in conv.iter().enumerate() {
        if *c == 0 || *c > 1024 {
            return Err(SpecError::new(format!("model.conv[{i}]"), "must be in 1..=1024"));
        }
        h /= 2;
        w /= 2;
        if h == 0 || w == 0 {
            return Err(SpecError::new(
                format!("model.conv[{i}]"),
                "too many pooling blocks for the image size",
            ));
        }
    }
    if dense == 0 || dense > MAX_WIDTH {
        return Err(SpecError::new(
            "model.dense",
            format!("must be in 1..={MAX_WIDTH}"),
        ));
    }
    Ok(())
}

/// The declared type of a feature column that is not a float input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputType {
    /// One id per row in `0..vocabulary` (an `Int32` or `Int64` column), for
    /// an embedding. The string → id mapping belongs in the ETL.
    Categorical {
        /// Number of distinct ids.
        vocabulary: usize,
    },
    /// A variable-length list of ids in `0..vocabulary` per row
    /// (`List<Int32|Int64>`), at most `max_len` long. The model receives it
    /// padded to `max_len` with a mask and the lengths.
    Sequence {
        /// Number of distinct ids.
        vocabulary: usize,
        /// Longest accepted list.
        max_len: usize,
    },
}

impl InputType {
    /// The number of distinct ids.
    pub fn vocabulary(&self) -> usize {
        match self {
            InputType::Categorical { vocabulary } | InputType::Sequence { vocabulary, .. } => *vocabulary,
        }
    }
}

/// Checks the declared inputs: each names a feature column, with a
/// vocabulary and length in bounds.
pub(crate) fn validate_inputs(
    inputs: &BTreeMap<String, InputType>,
    features: &[String],
    label: &str,
) -> Result<(), SpecError> {
    for (column, ty) in inputs {
        let field = format!("inputs.{column}");
        if !features.contains(column) {
            let role = if column == label {
                "it is the label; a label is a class id, a value or a FixedSizeList<Float32>"
            } else {
                "it is not one of the feature columns"
            };
            return Err(SpecError::new(
                field,
                format!("`{column}` is declared but {role}"),
            ));
        }
        if !(1..=MAX_VOCABULARY).contains(&ty.vocabulary()) {
            return Err(SpecError::new(
                format!("{field}.vocabulary"),
                format!("must be in 1..={MAX_VOCABULARY}"),
            ));
        }
        if let InputType::Sequence { max_len, .. } = ty
            && !(1..=MAX_SEQUENCE).contains(max_len)
        {
            return Err(SpecError::new(
                format!("{field}.max_len"),
                format!("must be in 1..={MAX_SEQUENCE}"),
            ));
        }
    }
    Ok(())
}

/// Where a job's initial weights came from (`init_from`): recorded in the
/// spec (and so in a saved model's `spec.json`); the weights themselves
/// travel in `start_job`'s `initial_weights`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pretrained {
    /// The file as it was given, on the machine that started the job.
    pub file: String,
    /// Its format: `safetensors`, or `pytorch` (a `torch.save` state dict).
    pub format: String,
    /// SHA-256 of the file's bytes, lower-case hex.
    pub sha256: String,
}

impl Pretrained {
    /// Longest `file` a spec carries.
    pub const MAX_FILE: usize = 4096;
    /// The formats read: safetensors, and PyTorch state dicts (`torch.save`).
    pub const FORMATS: [&'static str; 2] = ["safetensors", "pytorch"];

    pub(super) fn check(&self) -> Result<(), SpecError> {
        if self.file.is_empty() || self.file.len() > Self::MAX_FILE {
            return Err(SpecError::new(
                "init_from.file",
                format!("must be 1 to {} bytes", Self::MAX_FILE),
            ));
        }
        if !Self::FORMATS.contains(&self.format.as_str()) {
            return Err(SpecError::new(
                "init_from.format",
                format!(
                    "`{}`: the formats read are `safetensors` and `pytorch`",
                    self.format
                ),
            ));
        }
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if self.sha256.len() != 64 || !self.sha256.chars().all(hex) {
            return Err(SpecError::new(
                "init_from.sha256",
                "must be 64 lower-case hex digits",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_configs_of_builtins_and_custom_models() {
        assert_eq!(ModelSpec::Linear.name(), "linear");
        assert_eq!(ModelSpec::Linear.config(), serde_json::json!({}));
        let mlp = ModelSpec::Mlp { hidden: vec![8, 4] };
        assert_eq!(mlp.config(), serde_json::json!({"hidden": [8, 4]}));
        let custom = ModelSpec::custom("seq-pool", &serde_json::json!({"embedding": 8})).expect("custom");
        assert_eq!(custom.name(), "seq-pool");
        assert_eq!(custom.config()["embedding"], 8);
        let json = serde_json::to_string(&custom).expect("json");
        assert_eq!(serde_json::from_str::<ModelSpec>(&json).expect("parse"), custom);
        // A config may be left out: it is `{}`.
        let bare: ModelSpec = serde_json::from_str(r#"{"kind":"custom","name":"m"}"#).expect("parse");
        assert_eq!(bare.config(), serde_json::json!({}));
    }

    #[test]
    fn model_names_are_checked() {
        for ok in ["m", "tabular-embeddings", "seq_pool.v2"] {
            assert!(valid_model_name(ok), "{ok}");
        }
        let long = "m".repeat(MAX_MODEL_NAME + 1);
        for bad in ["", "Net", "1net", "a b", "net/evil", long.as_str()] {
            assert!(!valid_model_name(bad), "{bad}");
        }
    }
}
