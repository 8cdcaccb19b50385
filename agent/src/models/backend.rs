//! The backend a job trains on: burn's `flex` CPU backend, or burn's wgpu runtime when
//! the job sets `use_gpu` and the agent is built with a GPU cargo feature.
//!
//! `gpu` builds burn's `vulkan` backend: cubecl's SPIR-V kernels on Vulkan
//! adapters (NVIDIA, AMD, Intel), which can use cooperative matrices (tensor
//! cores) and subgroups where the driver offers them; an adapter that lacks
//! what SPIR-V needs, or a non-Vulkan one, runs WGSL instead. `gpu-wgsl`
//! builds the WGSL kernels only, for the one device the SPIR-V ones cannot
//! serve: Mesa's software Vulkan device, lavapipe, whose JIT crashes compiling
//! them, so a `gpu` agent refuses it with that reason. CUDA is not offered:
//! burn's CUDA backend downloads an LLVM archive at build time, which an
//! offline build cannot.
//!
//! The wgpu runtime is initialised once per process, the first time a GPU is
//! asked for (a job with `use_gpu`, or [`gpu`] at agent start to fill the
//! registry's `has_gpu`); the adapter found (or the reason none was) is kept
//! for the life of the process. The adapter is wgpu's default choice: a
//! high-performance GPU first, on Vulkan where the machine has a Vulkan driver,
//! else another graphics API; on a machine without a GPU that is lavapipe.
//! `CUBECL_WGPU_DEFAULT_DEVICE` (`DiscreteGpu(1)`, `IntegratedGpu(0)`, `Cpu`,
//! …) picks another adapter.

use burn::tensor::{DType, Device};
use kindling_schemas::spec::{JobSpec, Precision};

use crate::error::AgentError;
pub use crate::error::NoGpu;

/// Whether this agent was built with a GPU feature (`gpu` or `gpu-wgsl`).
pub const GPU_COMPILED: bool = cfg!(feature = "wgpu-runtime");

/// The GPU adapter the agent trains `use_gpu` jobs on, and what it can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Adapter name, e.g. `NVIDIA H100 80GB HBM3` or `llvmpipe (LLVM 19.1.7, 256 bits)`.
    pub name: String,
    /// Graphics API, e.g. `Vulkan`.
    pub api: String,
    /// Adapter kind as wgpu reports it: `DiscreteGpu`, `IntegratedGpu`,
    /// `VirtualGpu`, `Cpu` (a software implementation such as lavapipe) or `Other`.
    pub kind: String,
    /// Driver and its version, e.g. `llvmpipe` / `Mesa 25.0.7`.
    pub driver: String,
    /// The runtime and the shader compiler it chose: `wgpu<spirv>` or `wgpu<wgsl>`.
    pub compiler: String,
    /// The largest device-local memory heap, where the API states one.
    pub memory_bytes: Option<u64>,
    /// Cooperative matrix multiply-accumulate (tensor cores) usable by the compiler.
    pub tensor_cores: bool,
    /// Subgroup (warp) operations.
    pub subgroups: bool,
    /// bf16 tensors supported.
    pub bf16: bool,
    /// f16 tensors supported.
    pub f16: bool,
}

impl GpuInfo {
    /// Whether the adapter is a software implementation running on the CPU.
    pub fn is_software(&self) -> bool {
        self.kind == "Cpu"
    }

    /// The capabilities, one `name: value` per line, as `--check-gpu` prints them.
    pub fn report(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        let memory = self
            .memory_bytes
            .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "not stated by the API".into());
        format!(
            "adapter: {}\napi: {}\nkind: {}{}\ndriver: {}\ncompiler: {}\nmemory: {memory}\n\
             tensor cores (cooperative matrix): {}\nsubgroups: {}\nbf16: {}\nf16: {}",
            self.name,
            self.api,
            self.kind,
            if self.is_software() {
                " (software, runs on the CPU)"
            } else {
                ""
            },
            self.driver,
            self.compiler,
            yes(self.tensor_cores),
            yes(self.subgroups),
            yes(self.bf16),
            yes(self.f16),
        )
    }
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {}, {}, {})",
            self.name, self.api, self.kind, self.driver, self.compiler
        )
    }
}

/// The GPU device and its adapter, initialising the wgpu runtime on first use.
///
/// Errors (the same every call) when the agent was built without the `gpu`
/// feature or wgpu found no adapter.
pub fn gpu() -> Result<(Device, GpuInfo), AgentError> {
    imp::gpu()
}

/// Whether `device` (with or without autodiff) is the GPU: there every read
/// back waits for the device, so the trainer reads each step's gradients and
/// loss back as one buffer ([`crate::models::params::flatten_grads_and`]).
pub fn is_gpu(device: &Device) -> bool {
    #[cfg(feature = "wgpu-runtime")]
    {
        matches!(
            device.clone().without_autodiff().as_dispatch(),
            burn_dispatch::DispatchDevice::Cube(_)
        )
    }
    #[cfg(not(feature = "wgpu-runtime"))]
    {
        let _ = device;
        false
    }
}

/// The float dtype a job computes in on its device: `None` for `f32`; for
/// `precision: bf16` on the GPU `bf16`, or `f16` where the adapter has no
/// `bf16`. Refused, naming `precision`, off the GPU or on an adapter with
/// neither.
pub fn compute_dtype(spec: &JobSpec) -> Result<Option<DType>, AgentError> {
    match spec.precision {
        Precision::F32 => Ok(None),
        Precision::Bf16 if !spec.use_gpu => Err(NoGpu::MixedPrecisionOffGpu.into()),
        Precision::Bf16 => {
            let (_, info) = gpu()?;
            match (info.bf16, info.f16) {
                (true, _) => Ok(Some(DType::BF16)),
                (false, true) => Ok(Some(DType::F16)),
                (false, false) => Err(NoGpu::NoHalfPrecision(info.to_string()).into()),
            }
        }
    }
}

/// A label for the device a spec trains on: `cpu (flex)` or `gpu (wgpu:
/// <adapter>)`, with `, bf16 compute` (or `, f16 compute (no bf16 on this
/// adapter)`) for a mixed-precision job. Errs as [`compute_dtype`] and
/// [`gpu`] do.
pub fn label(spec: &JobSpec) -> Result<String, AgentError> {
    if !spec.use_gpu {
        return Ok("cpu (flex)".into());
    }
    let (_, info) = gpu()?;
    let precision = match compute_dtype(spec)? {
        None => "",
        Some(DType::BF16) => ", bf16 compute",
        Some(_) => ", f16 compute (no bf16 on this adapter)",
    };
    Ok(format!("gpu (wgpu: {info}){precision}"))
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

#[cfg(not(feature = "wgpu-runtime"))]
mod imp {
    use super::*;

    pub(super) fn gpu() -> Result<(Device, GpuInfo), AgentError> {
        Err(NoGpu::NotBuilt.into())
    }
}

#[cfg(feature = "wgpu-runtime")]
mod imp {
    use std::sync::OnceLock;

    use super::*;

    static GPU: OnceLock<Result<(Device, GpuInfo), NoGpu>> = OnceLock::new();

    pub(super) fn gpu() -> Result<(Device, GpuInfo), AgentError> {
        Ok(GPU.get_or_init(init).clone()?)
    }

    fn init() -> Result<(Device, GpuInfo), NoGpu> {
        let (device, setup) = Device::wgpu_options()
            .init_with_setup()
            .map_err(|e| NoGpu::NoAdapter(e.to_string()))?;
        let a = setup.adapter.get_info();
        let features = setup.adapter.features();
        let (compiler, memory_bytes, tensor_cores) = match device.as_dispatch() {
            burn_dispatch::DispatchDevice::Cube(cube) => {
                let client = cube.client();
                let props = client.properties();
                (
                    client.name().to_owned(),
                    props.memory.max_memory(),
                    !props.features.matmul.cmma.is_empty(),
                )
            }
            #[allow(unreachable_patterns)]
            _ => ("wgpu".to_owned(), None, false),
        };
        let info = GpuInfo {
            name: a.name,
            api: format!("{:?}", a.backend),
            kind: format!("{:?}", a.device_type),
            driver: [a.driver, a.driver_info]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" "),
            compiler,
            memory_bytes,
            tensor_cores,
            subgroups: features.contains(burn::tensor::wgpu::wgpu::Features::SUBGROUP),
            bf16: device.supports_dtype(DType::BF16),
            f16: device.supports_dtype(DType::F16),
        };
        if info.is_software() && info.compiler.contains("spirv") {
            // Refused before any kernel runs: compiling cubecl's SPIR-V
            // matmul kernels crashes lavapipe's JIT (a SIGSEGV inside the
            // driver that would take the agent down with every job on it).
            return Err(NoGpu::SoftwareSpirv(info.to_string()));
        }
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

    #[cfg(not(feature = "wgpu-runtime"))]
    #[test]
    fn a_gpu_job_without_the_feature_names_the_setting_and_the_feature() {
        let err = for_spec(&spec(true)).expect_err("no gpu feature").to_string();
        assert!(
            err.contains("`use_gpu`") && err.contains("`gpu` cargo feature"),
            "{err}"
        );
    }
}
