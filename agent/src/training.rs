//! Training: the data-parallel loop over a job's epochs and what it steps
//! with — the learning-rate schedule, a step's gradient exchange, the job's
//! log and its checkpoints. Rooms, lowest first: `schedule` · `joblog` ·
//! `checkpoint` · `gradients` · `trainer`.

pub mod checkpoint;
pub mod gradients;
pub(crate) mod joblog;
pub mod schedule;
pub mod trainer;
