//! Models: the [`KindlingModel`](model::KindlingModel) trait every trained
//! model implements and its registry, the built-in networks, the device a
//! job's tensors live on, weights as flat buffers and Arrow, and Arrow
//! batches as tensors. Rooms, lowest first: `device` · `params` · `tensorize`
//! · `model`/`builtin`.

pub mod builtin;
pub mod device;
pub mod model;
pub mod params;
pub mod tensorize;
