//! Connections counted per peer address, so that one address holds at most
//! its share of a listener's handshakes ([`super::MAX_PENDING_PER_PEER`]),
//! of its open gRPC connections ([`super::MAX_GRPC_PER_PEER`]) or of a
//! port's HTTP connections (the ops crate's web server).

use std::sync::Arc;

/// Connections per peer address (an entry only while one is held, so no
/// more entries than the listener's cap). Counted by hand: tower's and
/// tokio's limits are global, not per peer.
#[derive(Debug)]
pub struct PeerSlots {
    cap: usize,
    held: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One connection of `ip`, given back when dropped.
#[derive(Debug)]
pub struct PeerSlot {
    slots: Arc<PeerSlots>,
    ip: std::net::IpAddr,
}

impl PeerSlots {
    /// At most `cap` connections per address.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(PeerSlots {
            cap,
            held: std::sync::Mutex::default(),
        })
    }

    /// A connection of `ip`, unless it holds the cap already.
    pub fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<PeerSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(ip).or_insert(0);
        if *n >= self.cap {
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
        let mut held = self.slots.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}
