//! What a job that asks for a GPU is refused with: [`NoGpu`], carried whole
//! in the agent's error (`AgentError::GpuUnavailable`).

/// Why a job cannot have the GPU it asks for (cloneable: the first probe of
/// the adapter is kept for the agent's life).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoGpu {
    /// The agent was built without a GPU feature.
    #[error(
        "`use_gpu` is set but this agent was built without the `gpu` cargo feature: \
         run an agent built with `--features gpu` (the `-gpu` image), or unset `use_gpu`"
    )]
    NotBuilt,
    /// wgpu found no adapter it could use (its message).
    #[error(
        "`use_gpu` is set but wgpu found no usable GPU adapter on this node ({0}); \
         install the GPU's Vulkan driver (in containers: NVIDIA_DRIVER_CAPABILITIES \
         with `graphics`), or Mesa's `mesa-vulkan-drivers` for a software device"
    )]
    NoAdapter(String),
    /// SPIR-V kernels on Mesa's software device, whose JIT crashes compiling them.
    #[error(
        "`use_gpu` is set but this agent's SPIR-V kernels cannot run on the software \
         Vulkan device {0}: Mesa's lavapipe crashes compiling them. Run an agent built \
         with `--features gpu-wgsl` (WGSL kernels) on this node, or give it a GPU"
    )]
    SoftwareSpirv(String),
    /// `precision: bf16` on a CPU job.
    #[error("`precision: bf16` computes on the GPU only: set `use_gpu`, or leave `precision` at f32")]
    MixedPrecisionOffGpu,
    /// `precision: bf16` on an adapter with neither half type.
    #[error("`precision: bf16` but the GPU {0} supports neither bf16 nor f16: leave `precision` at f32")]
    NoHalfPrecision(String),
}
