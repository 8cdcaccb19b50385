//! `kindling export`: a saved model written in a format other tools read
//! (`TrainedModel::export`).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kindling::job::{ExportFormat, TrainedModel};

/// Arguments of `kindling export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Model directory written by `kindling train`.
    #[arg(long)]
    pub model: PathBuf,
    /// `safetensors`: the weights with PyTorch's `state_dict` names and
    /// layouts; `onnx`: a built-in model (linear, mlp, cnn) as an ONNX graph
    /// (opset 17). `kindling.json` is written beside either.
    #[arg(long, default_value = "safetensors")]
    pub format: String,
    /// The directory to write into (created if missing).
    #[arg(long, short)]
    pub output: PathBuf,
}

/// Runs `kindling export`.
pub fn export(args: ExportArgs) -> Result<()> {
    let Some(format) = ExportFormat::parse(&args.format) else {
        bail!("--format must be `safetensors` or `onnx`, got `{}`", args.format);
    };
    let model = TrainedModel::load(&args.model)
        .with_context(|| format!("loading the model in {}", args.model.display()))?;
    model
        .export(&args.output, format)
        .with_context(|| format!("exporting to {}", args.output.display()))?;
    println!(
        "exported to {} ({}, {})",
        args.output.display(),
        match format {
            ExportFormat::Safetensors => kindling::job::SAFETENSORS_FILE,
            ExportFormat::Onnx => kindling::job::ONNX_FILE,
        },
        kindling::job::INFO_FILE
    );
    Ok(())
}
