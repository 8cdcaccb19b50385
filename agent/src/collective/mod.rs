//! The ring collective between agents: all-reduce (reduce-scatter +
//! all-gather) of `f32` buffers, in `f32` or `bf16` on the wire, and
//! broadcast of bytes.
//!
//! The bytes travel on the ring data plane ([`kindling_schemas::ring`]): each
//! rank of a job attempt holds one long-lived TCP (or TLS) connection to the
//! next rank's agent, opened on the agent's own port and checked there —
//! credential, job, attempt — before any value is read ([`serve`], the
//! [`Inbox`]). Frames are written from and read into buffers the ring keeps
//! for its life; a received part is reduced into the caller's buffer as it
//! lands, and forwarded in the next ring step as soon as it is reduced, so
//! the steps overlap and no step waits for the previous one's tail.
//!
//! A rank only ever sends to the next rank and reads from the previous one,
//! so a ring of `W` ranks moves `2(W-1)/W` of the buffer per rank, whatever `W`.

mod inbox;
mod io;
mod link;
mod plan;
mod ring;

use inbox::Inbound;
pub use inbox::{
    HELLO_TIMEOUT, Inbox, MAX_RING_CONNECTIONS, MAX_RING_HELLOS, MAX_RING_HELLOS_PER_ADDRESS, RingPeers,
    UNJOINED_LINK_TTL, UNJOINED_LINKS, serve,
};
use link::Outbound;
pub use plan::{bf16_to_f32, f32_to_bf16};
use ring::CAUSE_WAIT;
pub use ring::{
    ALL_REDUCE_SECONDS, CONNECTION_WINDOW_BYTES, MAX_FRAME_BYTES, PART_BYTES, PART_VALUES, Precision, Ring,
    RingConfig, RingStats, STREAM_WINDOW_BYTES, listen, server_builder,
};

/// A ring's connections: to the next rank, from the previous one.
type Links = (Outbound, Inbound);
pub use crate::error::RingError;
