//! Pending connections counted per peer address, so that one address holds
//! at most [`MAX_PENDING_PER_PEER`] of a listener's handshakes.

use std::sync::Arc;

use super::MAX_PENDING_PER_PEER;

/// Pending connections per peer address (an entry only while one is held,
/// so at most [`super::MAX_PENDING_CONNECTIONS`] entries). Counted by hand: tower's
/// and tokio's limits are global, not per peer.
#[derive(Debug, Default)]
pub(super) struct PeerSlots(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One pending connection of `ip`, given back when dropped.
pub(super) struct PeerSlot {
    slots: Arc<PeerSlots>,
    ip: std::net::IpAddr,
}

impl PeerSlots {
    pub(super) fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<PeerSlot> {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(ip).or_insert(0);
        if *n >= MAX_PENDING_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            slots: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.slots.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}
