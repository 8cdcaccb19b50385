//! The agent process: its metrics, the Flight service, starting and stopping
//! the server (Flight and the collective on one port) and the command line.
//! Rooms, lowest first: `metrics` · `reads` · `flight` · `server` · `launch`.

pub(crate) mod flight;
pub(crate) mod launch;
pub(crate) mod metrics;
pub mod reads;
pub mod server;
