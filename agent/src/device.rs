//! Where a job trains: burn's `flex` CPU backend, or burn-wgpu when the job
//! sets `use_gpu` and the agent is built with the `gpu` cargo feature.
//!
//! The wgpu runtime is initialised once per process, the first time a GPU is
//! asked for (a job with `use_gpu`, or [`gpu`] at agent start to fill the
//! registry's `has_gpu`); the adapter found (or the reason none was) is kept
//! for the life of the process. The adapter is wgpu's default choice: a
//! high-performance GPU first, on Vulkan where the machine has a Vulkan driver,
//! else another graphics API; on a machine without a GPU that is Mesa's
//! software Vulkan device, lavapipe. `CUBECL_WGPU_DEFAULT_DEVICE`
//! (`DiscreteGpu(1)`, `IntegratedGpu(0)`, `Cpu`, …) picks another adapter.
//! The shaders are WGSL (burn's `wgpu` feature): SPIR-V (`vulkan`) crashes on
//! lavapipe, the device the GPU path is tested on.

use burn::tensor::Device;
use kindling_schemas::spec::JobSpec;

use crate::error::AgentError;

/// Whether this agent was built with the `gpu` feature (burn-wgpu).
pub const GPU_COMPILED: bool = cfg!(feature = "gpu");

/// The GPU adapter the agent trains `use_gpu` jobs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Adapter name, e.g. `NVIDIA A10G` or `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// Graphics API, e.g. `Vulkan`.
    pub api: String,
    /// Adapter kind as wgpu reports it: `DiscreteGpu`, `IntegratedGpu`,
    /// `VirtualGpu`, `Cpu` (a software implementation such as lavapipe) or `Other`.
    pub kind: String,
    /// Driver and its version, e.g. `llvmpipe` / `Mesa 22.3.6`.
    pub driver: String,
}

impl GpuInfo {
    /// Whether the adapter is a software implementation running on the CPU.
    pub fn is_software(&self) -> bool {
        self.kind == "Cpu"
    }
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, {}, {})", self.name, self.api, self.kind, self.driver)
    }
}

/// The GPU device and its adapter, initialising the wgpu runtime on first use.
///
/// Errors (the same every call) when the agent was built without the `gpu`
/// feature or wgpu found no adapter.
pub fn gpu() -> Result<(Device, GpuInfo), AgentError> {
    imp::gpu()
}

/// A label for the device a spec trains on: `cpu (flex)` or `gpu (wgpu: <adapter>)`.
pub fn label(spec: &JobSpec) -> Result<String, AgentError> {
    if spec.use_gpu {
        let (_, info) = gpu()?;
        Ok(format!("gpu (wgpu: {info})"))
    } else {
        Ok("cpu (flex)".into())
    }
}

/// The burn device for a spec (without autodiff): the wgpu device for
/// `use_gpu`, else `flex`. The error names `use_gpu` and what is missing.
pub fn for_spec(spec: &JobSpec) -> Result<Device, AgentError> {
    if spec.use_gpu {
        Ok(gpu()?.0)
    } else {
        Ok(Device::flex())
    }
}

#[cfg(not(feature = "gpu"))]
mod imp {
    use super::*;

    pub(super) fn gpu() -> Result<(Device, GpuInfo), AgentError> {
        Err(AgentError::GpuUnavailable(
            "`use_gpu` is set but this agent was built without the `gpu` cargo feature: \
             run an agent built with `--features gpu` (the `-gpu` image), or unset `use_gpu`"
                .into(),
        ))
    }
}

#[cfg(feature = "gpu")]
mod imp {
    use std::sync::OnceLock;

    use super::*;

    static GPU: OnceLock<Result<(Device, GpuInfo), String>> = OnceLock::new();

    pub(super) fn gpu() -> Result<(Device, GpuInfo), AgentError> {
        GPU.get_or_init(init).clone().map_err(AgentError::GpuUnavailable)
    }

    fn init() -> Result<(Device, GpuInfo), String> {
        let (device, setup) = Device::wgpu_options().init_with_setup().map_err(|e| {
            format!(
                "`use_gpu` is set but wgpu found no usable GPU adapter on this node ({e}); \
                 install the GPU's Vulkan driver (in containers: NVIDIA_DRIVER_CAPABILITIES \
                 with `graphics`), or Mesa's `mesa-vulkan-drivers` for a software device"
            )
        })?;
        let a = setup.adapter.get_info();
        let info = GpuInfo {
            name: a.name,
            api: format!("{:?}", a.backend),
            kind: format!("{:?}", a.device_type),
            driver: [a.driver, a.driver_info]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" "),
        };
        tracing::info!(adapter = %info, "wgpu device ready");
        if info.is_software() {
            tracing::warn!(adapter = %info, "the GPU adapter is a software implementation running on the CPU");
        }
        Ok((device, info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(use_gpu: bool) -> JobSpec {
        JobSpec::builder()
            .features(["x"])
            .label("y")
            .use_gpu(use_gpu)
            .build()
            .expect("valid spec")
    }

    #[test]
    fn cpu_jobs_train_on_flex() {
        let spec = spec(false);
        assert_eq!(label(&spec).expect("label"), "cpu (flex)");
        assert!(for_spec(&spec).is_ok());
    }

    #[cfg(not(feature = "gpu"))]
    #[test]
    fn a_gpu_job_without_the_feature_names_the_setting_and_the_feature() {
        let err = for_spec(&spec(true)).expect_err("no gpu feature").to_string();
        assert!(
            err.contains("`use_gpu`") && err.contains("`gpu` cargo feature"),
            "{err}"
        );
    }
}
