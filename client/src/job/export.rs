//! Models out in the formats the field reads: the weights as safetensors
//! under the names and in the layouts of PyTorch's `state_dict` of the
//! equivalent `nn.Module`, or a built-in network as an ONNX graph
//! (`onnx.rs`); beside either, `kindling.json`, what a reader needs to feed
//! them: the task, the feature columns in order, the label, the class
//! count, the normalisation, Kindling's version.

mod onnx;

use std::collections::BTreeMap;
use std::path::Path;

use kindling_schemas::model_serving::ModelInput;
use kindling_schemas::spec::{Pretrained, Task};
use serde::Serialize;

use super::{JobError, TrainedModel};

/// The name of the weights file [`TrainedModel::export`] writes.
pub const SAFETENSORS_FILE: &str = "model.safetensors";
/// The name of the ONNX file [`TrainedModel::export`] writes.
pub const ONNX_FILE: &str = "model.onnx";
/// The opset of the ONNX graphs [`TrainedModel::export`] writes.
pub const ONNX_OPSET: i64 = onnx::OPSET;
/// The name of the description written beside it.
pub const INFO_FILE: &str = "kindling.json";

/// A format [`TrainedModel::export`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// `model.safetensors`: every parameter under PyTorch's `state_dict`
    /// name, in PyTorch's layout (a `Linear`'s weight `[out, in]`), `F32`;
    /// any model, a model of one's own too.
    Safetensors,
    /// `model.onnx`: the built-in linear, MLP and CNN as an ONNX graph
    /// (opset 17), one `[N, width]` float32 input per feature column in
    /// spec order, one output: `probabilities` (classification) or
    /// `values`. A model of one's own is refused (it needs burn 0.23's
    /// graph capture).
    Onnx,
}

impl ExportFormat {
    /// The name the CLI and `kindling.json` use.
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Safetensors => "safetensors",
            ExportFormat::Onnx => "onnx",
        }
    }

    /// The format `name` names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "safetensors" => Some(ExportFormat::Safetensors),
            "onnx" => Some(ExportFormat::Onnx),
            _ => None,
        }
    }
}

/// `kindling.json`: how to feed the exported tensors and read their output.
#[derive(Debug, Serialize)]
struct ExportInfo<'a> {
    /// The file's format and name.
    format: &'static str,
    file: &'static str,
    /// The model (a built-in's name or a registered one's) and its config.
    model: &'a str,
    model_config: serde_json::Value,
    /// Classification (with `num_classes`) or regression.
    task: &'a Task,
    /// The output's width: classes, or regression targets.
    outputs: usize,
    /// What the output is: safetensors, `logits` (softmax gives the
    /// probabilities) or `values`; ONNX, `probabilities` or `values`.
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
    /// there) in `format`, with `kindling.json` beside it:
    /// `model.safetensors` (any model linked into this process; the tensors
    /// stream to the file one by one) or `model.onnx` (the built-in
    /// networks, from the weights alone).
    ///
    /// ```no_run
    /// # fn demo(model: kindling::job::TrainedModel) -> Result<(), kindling::job::JobError> {
    /// use kindling::job::ExportFormat;
    /// model.export("exported", ExportFormat::Safetensors)?;
    /// // Python: safetensors.numpy.load_file("exported/model.safetensors")
    /// model.export("exported", ExportFormat::Onnx)?;
    /// // Python: onnxruntime.InferenceSession("exported/model.onnx")
    /// # Ok(()) }
    /// ```
    pub fn export(&self, dir: impl AsRef<Path>, format: ExportFormat) -> Result<(), JobError> {
        let dir = dir.as_ref();
        let mkdir = || {
            std::fs::create_dir_all(dir).map_err(|e| JobError::Io {
                context: format!("create export dir {}", dir.display()),
                source: e,
            })
        };
        let json = match format {
            ExportFormat::Safetensors => {
                let net = self.net.as_ref().ok_or_else(|| JobError::ModelNotLinked {
                    model: self.spec.model.name().to_owned(),
                })?;
                let json = self.export_json(format, net.pytorch_tensors())?;
                mkdir()?;
                // The description rides in the file's header too, so the
                // file alone says what it is.
                let metadata = BTreeMap::from([
                    ("kindling".to_owned(), json.clone()),
                    ("format".to_owned(), "pt".to_owned()),
                ]);
                net.save_safetensors(&dir.join(SAFETENSORS_FILE), &metadata)?;
                json
            }
            ExportFormat::Onnx => {
                let graph = onnx::Graph {
                    model: &self.spec.model,
                    task: &self.spec.task,
                    inputs: &self.meta.inputs,
                    weights: &self.weights,
                    outputs: self.spec.output_dim(),
                    job_id: self.job_id(),
                };
                let (bytes, shapes) = graph.encode()?;
                let json = self.export_json(format, shapes)?;
                mkdir()?;
                write_replacing(&dir.join(ONNX_FILE), &bytes)?;
                json
            }
        };
        write_replacing(&dir.join(INFO_FILE), json.as_bytes())
    }

    fn export_json(
        &self,
        format: ExportFormat,
        tensors: Vec<(String, Vec<usize>)>,
    ) -> Result<String, JobError> {
        let tensors = tensors
            .into_iter()
            .map(|(name, shape)| TensorInfo { name, shape })
            .collect();
        serde_json::to_string_pretty(&self.export_info(format, tensors)).map_err(|e| JobError::Io {
            context: format!("encode {INFO_FILE}"),
            source: e.into(),
        })
    }

    fn export_info(&self, format: ExportFormat, tensors: Vec<TensorInfo>) -> ExportInfo<'_> {
        let spec = &self.spec;
        ExportInfo {
            format: format.name(),
            file: match format {
                ExportFormat::Safetensors => SAFETENSORS_FILE,
                ExportFormat::Onnx => ONNX_FILE,
            },
            model: spec.model.name(),
            model_config: spec.model.config(),
            task: &spec.task,
            outputs: spec.output_dim(),
            output: match (spec.task, format) {
                (Task::Classification { .. }, ExportFormat::Safetensors) => "logits",
                (Task::Classification { .. }, ExportFormat::Onnx) => "probabilities",
                (Task::Regression, _) => "values",
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

/// Writes `bytes` to `path` through a scratch file renamed into place: a
/// reader never sees half a file, and an existing one is replaced whole.
fn write_replacing(path: &Path, bytes: &[u8]) -> Result<(), JobError> {
    let io = |e| JobError::Io {
        context: format!("write {}", path.display()),
        source: e,
    };
    let scratch = path.with_extension("partial");
    std::fs::write(&scratch, bytes).map_err(io)?;
    std::fs::rename(&scratch, path).map_err(io)
}
