//! What one training step of a type-erased model yields: its micro-batch's
//! share kept on the device ([`DeviceShare`]) or why its gradients could not
//! be computed ([`StepError`]).

use burn::tensor::{DType, Tensor};

use super::Batch;
use crate::error::{AgentError, TrainingError};

/// Why a training step's gradients could not be computed.
#[derive(Debug)]
pub enum StepError {
    /// The batch could not become tensors (or the model refused it).
    Agent(AgentError),
    /// The loss became this non-finite value.
    NonFinite(f64),
}

impl From<AgentError> for StepError {
    fn from(e: AgentError) -> Self {
        StepError::Agent(e)
    }
}

impl StepError {
    /// The agent error for this failure at `epoch`, `step`.
    pub fn at(self, epoch: u32, step: u64) -> AgentError {
        match self {
            StepError::Agent(e) => e,
            StepError::NonFinite(loss) => TrainingError::Diverged { loss, epoch, step }.into(),
        }
    }
}

/// `t` in `f32` (a mixed-precision model's outputs).
pub(super) fn in_f32<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    if t.dtype() == DType::F32 {
        t
    } else {
        t.cast(DType::F32)
    }
}

/// The batch's share of a step: its rows, or its rows' weight.
pub(super) fn batch_weight(batch: &Batch<'_>) -> Result<f64, AgentError> {
    Ok(match batch.row_weights()? {
        Some(w) => w.iter().map(|&v| v as f64).sum::<f64>(),
        None => batch.rows() as f64,
    })
}

/// A micro-batch's share of a step kept on the device.
#[derive(Debug)]
pub struct DeviceShare {
    /// Its rows.
    pub rows: u64,
    /// Its rows' weight (the rows when the job weights none).
    pub weight: f64,
    /// Its weighted loss sum, on the device (none when it weighs nothing).
    pub loss_sum: Option<Tensor<1>>,
}
