//! Models: the [`KindlingModel`](kindling_model::KindlingModel) trait every trained
//! model implements and its registry, the built-in networks, the device a
//! job's tensors live on, weights as flat buffers and Arrow, weights as
//! safetensors files, and Arrow batches as tensors. Rooms, lowest first:
//! `device` · `params` · `interchange` · `tensorize` · `kindling_model`/`builtin`.

pub mod builtin;
pub mod device;
pub mod interchange;
pub mod kindling_model;
pub mod params;
pub mod tensorize;
