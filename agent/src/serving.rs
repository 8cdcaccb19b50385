//! Serving: predictions from a trained or served model, and the
//! `DoExchange` stream that carries them. Rooms, lowest first: `served` ·
//! `predict`.

pub mod predict;
pub(crate) mod served;
