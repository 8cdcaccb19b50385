//! End-to-end tests and fixtures: a real Spark Connect server, agents and rendezvous on loopback.

pub mod cluster;
pub mod events;
pub mod http;
pub mod mlflow;
pub mod netns;
pub mod proxy;
pub mod ring;
pub mod spark;
