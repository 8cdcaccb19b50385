//! Models: the [`KindlingModel`](kindling_model::KindlingModel) trait every trained
//! model implements and its registry, the built-in networks, the backend a
//! job's tensors live on, weights as flat buffers and Arrow, weights as
//! safetensors files, and Arrow batches as tensors. Rooms, lowest first:
//! `backend` · `params` · `interchange` · `tensorize` · `kindling_model`/`builtin`.

pub mod backend;
pub mod builtin;
pub mod interchange;
pub mod kindling_model;
pub mod params;
pub mod tensorize;
