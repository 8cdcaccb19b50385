//! The agent's disk watermark: the bytes every job's spill files hold
//! together, bounded by `--disk-watermark`, and the free space the work
//! volume keeps (`--min-free-disk`). A batch that would spill past either
//! is refused before it is written (`RESOURCE_EXHAUSTED`), so no producer
//! can fill the volume, whose size limit would evict the pod and every job
//! on it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::SpillError;

/// Default of `--disk-watermark`: four fifths of the manifests' 50 GiB
/// work volume, the rest left to checkpoints.
pub const DEFAULT_DISK_WATERMARK: u64 = 40 << 30;

/// Default of `--min-free-disk`: what a spill leaves free on the work
/// volume's file system at least.
pub const DEFAULT_MIN_FREE_DISK: u64 = 1 << 30;

/// The bytes all jobs' spill files hold on this agent, against the
/// watermark, and the free space a spill must leave.
#[derive(Debug)]
pub struct DiskBudget {
    watermark: u64,
    min_free: u64,
    used: AtomicU64,
}

impl DiskBudget {
    /// Spill files up to `watermark` bytes, each leaving `min_free` bytes
    /// free on its file system.
    pub fn new(watermark: u64, min_free: u64) -> Arc<Self> {
        Arc::new(DiskBudget {
            watermark,
            min_free,
            used: AtomicU64::new(0),
        })
    }

    /// No bound (a cache of its own, in tests and benchmarks).
    pub fn unbounded() -> Arc<Self> {
        Self::new(u64::MAX, 0)
    }

    /// Bytes the spill files hold (and the spills being written reserved).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The watermark.
    pub fn watermark(&self) -> u64 {
        self.watermark
    }

    /// Reserves `bytes` for a spill file below the watermark, or says how
    /// far past it they would take the spill files.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, SpillError> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let would = used.saturating_add(bytes);
                (would <= self.watermark).then_some(would)
            })
            .map(|_| Reservation {
                disk: self.clone(),
                bytes,
            })
            .map_err(|held| SpillError::Watermark {
                needed: bytes,
                held,
                watermark: self.watermark,
            })
    }

    /// Whether writing `bytes` into `dir` leaves its file system the
    /// minimum free (one `statvfs`, next to the file write it guards).
    pub fn check_free(&self, dir: &Path, bytes: u64) -> Result<(), SpillError> {
        if self.min_free == 0 {
            return Ok(());
        }
        let stat = rustix::fs::statvfs(dir).map_err(|e| SpillError::Io {
            context: format!("free space of {}", dir.display()),
            source: e.into(),
        })?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free.saturating_sub(bytes) < self.min_free {
            return Err(SpillError::DiskLow {
                dir: dir.to_owned(),
                free,
                needed: bytes,
                min_free: self.min_free,
            });
        }
        Ok(())
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes reserved below the watermark for one spill file, given back when
/// it is dropped (with the file, or when the spill fails).
#[derive(Debug)]
pub struct Reservation {
    disk: Arc<DiskBudget>,
    bytes: u64,
}

impl Reservation {
    /// The reservation resized to what the written file takes (the batch's
    /// Arrow size give or take the IPC framing).
    pub fn resize(mut self, bytes: u64) -> Self {
        if bytes > self.bytes {
            self.disk.used.fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else {
            self.disk.release(self.bytes - bytes);
        }
        self.bytes = bytes;
        self
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.disk.release(self.bytes);
    }
}
