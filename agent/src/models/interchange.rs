//! Weights in the format the field exchanges them in, through burn-store:
//! a model's parameters written as safetensors under the names and in the
//! layouts PyTorch's `state_dict` of the equivalent `nn.Module` has them
//! (a `Linear`'s weight `[out, in]`, a `Conv2d`'s `[out, in, kh, kw]`), and
//! read back from such a file only when every tensor fits the model by name,
//! shape and dtype. Nothing here knows a model: burn's module tree names
//! and shapes every parameter, burn-store's adapter renames and transposes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::DType;
use burn_store::burn_pack::Tensor as PackTensor;
use burn_store::{
    BurnToPyTorchAdapter, ModuleSnapshot, ModuleStore, PyTorchToBurnAdapter, PytorchStore, SafetensorsStore,
};

/// Why weights could not be written to or taken from a file; every variant
/// names the file, and the tensor where one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum WeightsFileError {
    /// The file's format is not one Kindling reads.
    #[error(
        "{path}: Kindling reads pretrained weights from safetensors files (`.safetensors`) and \
         PyTorch state dicts saved by `torch.save` (`.pt`, `.pth`), told apart by the extension"
    )]
    Format {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be read in its format (missing, truncated, a bad header).
    #[error("{path}: not a readable {format} file: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// `safetensors` or `PyTorch`.
        format: &'static str,
        /// What the reader said.
        reason: String,
    },
    /// The file holds no tensors.
    #[error("{path}: the file holds no tensors")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A tensor the model has is not in the file.
    #[error("{path}: tensor `{tensor}` of the model is missing from the file{hint}")]
    Missing {
        /// The file.
        path: PathBuf,
        /// The tensor (PyTorch's name).
        tensor: String,
        /// The file's tensors that the model lacks, when there are any.
        hint: String,
    },
    /// The file has a tensor the model does not.
    #[error("{path}: tensor `{tensor}` in the file is not a tensor of the model (it has: {model})")]
    Extra {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The model's tensors.
        model: String,
    },
    /// A tensor of the wrong shape.
    #[error("{path}: tensor `{tensor}` has shape {found:?}; the model's is {expected:?}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The model's shape (PyTorch's layout).
        expected: Vec<usize>,
        /// The file's.
        found: Vec<usize>,
    },
    /// A tensor of the wrong element type.
    #[error("{path}: tensor `{tensor}` is {found}; the model's weights are {expected}")]
    DType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The model's dtype.
        expected: String,
        /// The file's.
        found: String,
    },
    /// burn-store refused to load a tensor that passed the checks above.
    #[error("{path}: loading the weights failed: {reason}")]
    Load {
        /// The file.
        path: PathBuf,
        /// burn-store's account.
        reason: String,
    },
    /// The file could not be written.
    #[error("{path}: cannot write the weights: {reason}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// A weights file format Kindling reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsFormat {
    /// `.safetensors`.
    Safetensors,
    /// A PyTorch state dict saved by `torch.save` (`.pt`, `.pth`): read by
    /// burn-store's reader, which parses the pickle without running it.
    Pytorch,
}

impl WeightsFormat {
    /// The name a spec records (`init_from.format`).
    pub fn name(self) -> &'static str {
        match self {
            WeightsFormat::Safetensors => "safetensors",
            WeightsFormat::Pytorch => "pytorch",
        }
    }
}

/// The weights file format of `path`, by its extension.
pub fn check_format(path: &Path) -> Result<WeightsFormat, WeightsFileError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => Ok(WeightsFormat::Safetensors),
        Some("pt" | "pth") => Ok(WeightsFormat::Pytorch),
        _ => Err(WeightsFileError::Format {
            path: path.to_owned(),
        }),
    }
}

/// Writes `model`'s weights to `path` as safetensors with PyTorch's names
/// and layouts and `metadata` in the header. Streams: each tensor is read
/// from the model as the writer reaches it, into a scratch file renamed into
/// place once whole (an existing file is replaced).
pub fn save_safetensors<M: Module>(
    model: &M,
    path: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<(), WeightsFileError> {
    let mut store = SafetensorsStore::from_file(path)
        .with_to_adapter(BurnToPyTorchAdapter)
        .overwrite(true);
    for (key, value) in metadata {
        store = store.metadata(key.clone(), value.clone());
    }
    model.save_into(&mut store).map_err(|e| WeightsFileError::Write {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Each of `model`'s tensors as the safetensors file of
/// [`save_safetensors`] names and shapes it (no values read).
pub fn pytorch_tensors<M: Module>(model: &M) -> Vec<(String, Vec<usize>)> {
    model
        .collect(None, Some(Box::new(BurnToPyTorchAdapter)), false)
        .into_iter()
        .map(|t| (t.name.clone(), t.shape.to_vec()))
        .collect()
}

/// `model` with the weights of the file at `path` (safetensors, or a
/// PyTorch state dict, by its extension): every tensor of the model must be
/// in the file under PyTorch's name, shape and dtype, and the file must
/// hold no other; the first that does not fit is named and `model` is
/// dropped untouched by it.
pub fn load_weights<M: Module>(model: M, path: &Path) -> Result<M, WeightsFileError> {
    match check_format(path)? {
        WeightsFormat::Safetensors => load_checked(
            model,
            path,
            "safetensors",
            SafetensorsStore::from_file(path).with_from_adapter(PyTorchToBurnAdapter),
        ),
        // The PyTorch store applies PyTorch's adapter itself.
        WeightsFormat::Pytorch => load_checked(model, path, "PyTorch", PytorchStore::from_file(path)),
    }
}

fn load_checked<M: Module, S: ModuleStore>(
    mut model: M,
    path: &Path,
    format: &'static str,
    mut store: S,
) -> Result<M, WeightsFileError>
where
    S::Error: std::fmt::Display,
{
    let expected = model.collect(None, Some(Box::new(BurnToPyTorchAdapter)), false);
    let found = store.get_all_tensors().map_err(|e| WeightsFileError::Read {
        path: path.to_owned(),
        format,
        reason: e.to_string(),
    })?;
    check_fits(path, &expected, found)?;
    let result = model.load_from(&mut store).map_err(|e| WeightsFileError::Load {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    if !result.errors.is_empty() || !result.missing.is_empty() || !result.unused.is_empty() {
        return Err(WeightsFileError::Load {
            path: path.to_owned(),
            reason: result.to_string(),
        });
    }
    Ok(model)
}

/// The file's tensors `found` against the model's `expected` (both in
/// PyTorch's names and layouts): the model's in its order first, then the
/// file's extra ones in name order.
fn check_fits(
    path: &Path,
    expected: &[PackTensor],
    found: &BTreeMap<String, PackTensor>,
) -> Result<(), WeightsFileError> {
    let path = || path.to_owned();
    if found.is_empty() {
        return Err(WeightsFileError::Empty { path: path() });
    }
    let names: Vec<&str> = expected.iter().map(|t| t.name.as_str()).collect();
    let extra: Vec<&str> = found
        .keys()
        .map(String::as_str)
        .filter(|name| !names.contains(name))
        .collect();
    for want in expected {
        let Some(have) = found.get(&want.name) else {
            let hint = match extra.is_empty() {
                true => String::new(),
                false => format!(" (the file has {} that the model lacks)", quoted(&extra)),
            };
            return Err(WeightsFileError::Missing {
                path: path(),
                tensor: want.name.clone(),
                hint,
            });
        };
        if have.dtype != want.dtype {
            return Err(WeightsFileError::DType {
                path: path(),
                tensor: want.name.clone(),
                expected: dtype_name(want.dtype),
                found: dtype_name(have.dtype),
            });
        }
        if have.shape.to_vec() != want.shape.to_vec() {
            return Err(WeightsFileError::Shape {
                path: path(),
                tensor: want.name.clone(),
                expected: want.shape.to_vec(),
                found: have.shape.to_vec(),
            });
        }
    }
    match extra.first() {
        Some(tensor) => Err(WeightsFileError::Extra {
            path: path(),
            tensor: (*tensor).to_owned(),
            model: quoted(&names),
        }),
        None => Ok(()),
    }
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A dtype as safetensors and numpy write it (`F32`, `F16`, `I64`, …).
fn dtype_name(dtype: DType) -> String {
    format!("{dtype:?}").to_uppercase()
}

#[cfg(test)]
mod tests;
