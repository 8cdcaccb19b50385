//! Models out in the format the field reads: the weights as safetensors
//! under the names and in the layouts of PyTorch's `state_dict` of the
//! equivalent `nn.Module`, and beside them `kindling.json`, what a reader
//! needs to feed the tensors: the task, the feature columns in order, the
//! label, the class count, the normalisation, Kindling's version.

use std::collections::BTreeMap;
use std::path::Path;

use kindling_schemas::model_serving::ModelInput;
use kindling_schemas::spec::{Pretrained, Task};
use serde::Serialize;

use super::{JobError, TrainedModel};

/// The name of the weights file [`TrainedModel::export`] writes.
pub const SAFETENSORS_FILE: &str = "model.safetensors";
/// The name of the description written beside it.
pub const INFO_FILE: &str = "kindling.json";

/// A format [`TrainedModel::export`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// `model.safetensors`: every parameter under PyTorch's `state_dict`
    /// name, in PyTorch's layout (a `Linear`'s weight `[out, in]`), `F32`;
    /// any model, a model of one's own too.
    Safetensors,
}

impl ExportFormat {
    /// The name the CLI and `kindling.json` use.
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Safetensors => "safetensors",
        }
    }

    /// The format `name` names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "safetensors" => Some(ExportFormat::Safetensors),
            _ => None,
        }
    }
}

/// `kindling.json`: how to feed the exported tensors and read their output.
#[derive(Debug, Serialize)]
struct ExportInfo<'a> {
    /// The weights file's format and name.
    format: &'static str,
    file: &'static str,
    /// The model (a built-in's name or a registered one's) and its config.
    model: &'a str,
    model_config: serde_json::Value,
    /// Classification (with `num_classes`) or regression.
    task: &'a Task,
    /// The output's width: classes, or regression targets.
    outputs: usize,
    /// What the output is: `logits` (softmax gives the probabilities) or `values`.
    output: &'static str,
    /// The feature columns in the order they are concatenated into the input.
    features: &'a [ModelInput],
    /// Width of the concatenated float input.
    input_dim: usize,
    /// The label column.
    label: &'a str,
    /// What the features go through before the model: nothing, the spec
    /// applies no normalisation (the features are read as given).
    normalisation: Option<()>,
    /// Every tensor with its shape, in the model's order.
    tensors: Vec<TensorInfo>,
    /// Where the weights the training started from came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    init_from: Option<&'a Pretrained>,
    /// The job that trained it.
    job_id: &'a str,
    kindling_version: &'static str,
}

#[derive(Debug, Serialize)]
struct TensorInfo {
    name: String,
    shape: Vec<usize>,
}

impl TrainedModel {
    /// Writes the model to `dir` (created if missing; the files replaced if
    /// there) in `format`: `model.safetensors` and `kindling.json`. The
    /// tensors stream to the file one by one. Needs the model linked into
    /// this process (the built-ins always are).
    ///
    /// ```no_run
    /// # fn demo(model: kindling::job::TrainedModel) -> Result<(), kindling::job::JobError> {
    /// use kindling::job::ExportFormat;
    /// model.export("exported", ExportFormat::Safetensors)?;
    /// // Python: safetensors.numpy.load_file("exported/model.safetensors")
    /// # Ok(()) }
    /// ```
    pub fn export(&self, dir: impl AsRef<Path>, format: ExportFormat) -> Result<(), JobError> {
        let dir = dir.as_ref();
        let net = self.net.as_ref().ok_or_else(|| JobError::ModelNotLinked {
            model: self.spec.model.name().to_owned(),
        })?;
        std::fs::create_dir_all(dir).map_err(|e| JobError::Io {
            context: format!("create export dir {}", dir.display()),
            source: e,
        })?;
        let info = self.export_info(
            format,
            net.pytorch_tensors()
                .into_iter()
                .map(|(name, shape)| TensorInfo { name, shape })
                .collect(),
        );
        let json = serde_json::to_string_pretty(&info).map_err(|e| JobError::Io {
            context: format!("encode {INFO_FILE}"),
            source: e.into(),
        })?;
        match format {
            ExportFormat::Safetensors => {
                // The description rides in the file's header too, so the
                // file alone says what it is.
                let metadata = BTreeMap::from([
                    ("kindling".to_owned(), json.clone()),
                    ("format".to_owned(), "pt".to_owned()),
                ]);
                net.save_safetensors(&dir.join(SAFETENSORS_FILE), &metadata)?;
            }
        }
        std::fs::write(dir.join(INFO_FILE), json).map_err(|e| JobError::Io {
            context: format!("write {INFO_FILE} in {}", dir.display()),
            source: e,
        })
    }

    fn export_info(&self, format: ExportFormat, tensors: Vec<TensorInfo>) -> ExportInfo<'_> {
        let spec = &self.spec;
        ExportInfo {
            format: format.name(),
            file: SAFETENSORS_FILE,
            model: spec.model.name(),
            model_config: spec.model.config(),
            task: &spec.task,
            outputs: spec.output_dim(),
            output: match spec.task {
                Task::Classification { .. } => "logits",
                Task::Regression => "values",
            },
            features: &self.meta.inputs,
            input_dim: self.meta.input_dim,
            label: &spec.label,
            normalisation: None,
            tensors,
            init_from: spec.init_from.as_ref(),
            job_id: self.job_id(),
            kindling_version: env!("CARGO_PKG_VERSION"),
        }
    }
}
