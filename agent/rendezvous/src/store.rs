//! The rendezvous' durable state: one protobuf snapshot
//! (`StateSnapshot`, defined beside the wire messages in `rendezvous.proto`),
//! kept by a [`SnapshotStore`]: the state file `<state dir>/state.pb`
//! ([`StateStore`], one node) or etcd ([`crate::etcd::EtcdStore`], replicas).
//!
//! A change is written before it is acknowledged: the state machine calls
//! [`StateStore::save`] under its lock at the end of every call that changed
//! something durable, and answers UNAVAILABLE (`Storage`) if the write fails.
//! A write is atomic: a temporary file is written and fsynced, renamed over
//! `state.pb`, and the directory fsynced, so a crash at any point leaves
//! either the old or the new snapshot, never a torn one. Writes are skipped
//! when the snapshot did not change (heartbeats never write).
//!
//! One process owns a state directory: `open` takes an exclusive lock on
//! `<state dir>/lock` (holding the owner's pid and host) for the life of
//! the store, and a second rendezvous on the same directory (an evicted pod
//! still running beside its replacement) refuses to start, naming the
//! holder, instead of interleaving writes.
//!
//! The whole state is rewritten each time. It is small — registrations, jobs
//! with their spec summaries and failures — and bounded by the retention of
//! finished jobs; `bench_rendezvous` measures what it costs.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kindling_schemas::pb::rendezvous as pb;
use prost::Message;

use crate::error::{RendezvousError, StorageError};

/// The snapshot format this build writes and reads.
pub const STATE_FORMAT: u32 = 1;

const FILE: &str = "state.pb";
const TMP: &str = ".state.pb.tmp";
const LOCK: &str = "lock";

/// Where the durable state is kept. `save` is called under the state's lock
/// and returns once the snapshot is durable (or fails: the change is then not
/// acknowledged); it may block, as a file's fsync does.
pub trait SnapshotStore: Send + std::fmt::Debug {
    /// Where, for errors and logs: the state file's path, or etcd's key and endpoints.
    fn place(&self) -> String;
    /// Writes `snapshot` unless it equals the last one written.
    fn save(&mut self, snapshot: &pb::StateSnapshot) -> Result<(), RendezvousError>;
}

/// A snapshot read back: refused if it is not one, or one of a newer format.
pub(crate) fn decode(bytes: &[u8]) -> Result<pb::StateSnapshot, StorageError> {
    let snapshot = pb::StateSnapshot::decode(bytes).map_err(|source| StorageError::NotASnapshot {
        bytes: bytes.len(),
        source,
    })?;
    if snapshot.format != STATE_FORMAT {
        return Err(StorageError::Format {
            found: snapshot.format,
            reads: STATE_FORMAT,
        });
    }
    Ok(snapshot)
}

/// The state file: where the snapshot lives, the bytes last written (to
/// skip no-op writes), and the directory's lock, held while the store lives.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    last: Vec<u8>,
    _lock: File,
}

/// Takes the directory's exclusive lock, or says who holds it.
fn lock(dir: &Path) -> Result<File, StorageError> {
    let path = dir.join(LOCK);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |e| (path, Arc::new(e))
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io(&path))
        .map_err(|(path, source)| StorageError::OpenLock { path, source })?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = match holder.trim() {
                "" => "holder unknown",
                h => h,
            };
            return Err(StorageError::InUse {
                holder: holder.to_owned(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => {
            let (path, source) = io(&path)(e);
            return Err(StorageError::Lock { path, source });
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let me = format!("pid {} on {}", std::process::id(), host.trim());
    file.set_len(0)
        .and_then(|()| file.write_all(me.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(io(&path))
        .map_err(|(path, source)| StorageError::WriteLock { path, source })?;
    Ok(file)
}

impl StateStore {
    /// Opens (creating) `dir` and reads the snapshot in it, if any. A leftover
    /// temporary file of an interrupted write is discarded.
    pub fn open(dir: &Path) -> Result<(StateStore, Option<pb::StateSnapshot>), RendezvousError> {
        let storage = |source: StorageError| RendezvousError::Storage {
            place: format!("file `{}`", dir.join(FILE).display()),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| storage(StorageError::CreateDir(Arc::new(e))))?;
        let held = lock(dir).map_err(storage)?;
        match std::fs::remove_file(dir.join(TMP)) {
            Ok(()) => {
                tracing::warn!(dir = %dir.display(), "discarded the temporary file of an interrupted write")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(storage(StorageError::RemoveTemporary(Arc::new(e)))),
        }
        let mut store = StateStore {
            dir: dir.to_owned(),
            last: Vec::new(),
            _lock: held,
        };
        let bytes = match std::fs::read(dir.join(FILE)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((store, None)),
            Err(e) => return Err(storage(StorageError::Read(Arc::new(e)))),
        };
        let snapshot = decode(&bytes).map_err(storage)?;
        store.last = bytes;
        Ok((store, Some(snapshot)))
    }

    /// The snapshot file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }
}

impl SnapshotStore for StateStore {
    fn place(&self) -> String {
        format!("file `{}`", self.path().display())
    }

    fn save(&mut self, snapshot: &pb::StateSnapshot) -> Result<(), RendezvousError> {
        let bytes = snapshot.encode_to_vec();
        if bytes == self.last {
            return Ok(());
        }
        self.write(&bytes).map_err(|e| RendezvousError::Storage {
            place: self.place(),
            source: StorageError::Write {
                bytes: bytes.len(),
                source: Arc::new(e),
            },
        })?;
        self.last = bytes;
        Ok(())
    }
}

impl StateStore {
    fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(TMP);
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.dir.join(FILE))?;
            // The rename itself is durable once the directory is.
            File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn snapshot(agent: &str) -> pb::StateSnapshot {
        pb::StateSnapshot {
            format: STATE_FORMAT,
            agents: vec![pb::AgentInfo {
                agent_id: agent.into(),
                ..Default::default()
            }],
            jobs: Vec::new(),
        }
    }

    #[test]
    fn a_saved_snapshot_is_read_back_and_a_torn_temporary_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, none) = StateStore::open(dir.path()).unwrap();
        assert!(none.is_none());
        store.save(&snapshot("a0")).unwrap();
        // An interrupted later write leaves only its temporary file.
        std::fs::write(dir.path().join(TMP), b"\x0a\xff torn").unwrap();
        drop(store);
        let (_, read) = StateStore::open(dir.path()).unwrap();
        assert_eq!(read.unwrap().agents[0].agent_id, "a0");
        assert!(!dir.path().join(TMP).exists());
    }

    #[test]
    fn a_second_store_on_the_directory_is_refused_naming_the_holder_until_the_first_ends() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = StateStore::open(dir.path()).unwrap();
        let err = StateStore::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("in use by another rendezvous")
                && err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        StateStore::open(dir.path()).expect("free once the first is gone");
    }

    #[test]
    fn an_unchanged_snapshot_is_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = StateStore::open(dir.path()).unwrap();
        store.save(&snapshot("a0")).unwrap();
        std::fs::remove_file(store.path()).unwrap();
        store.save(&snapshot("a0")).unwrap();
        assert!(!store.path().exists(), "the same snapshot was written again");
        store.save(&snapshot("a1")).unwrap();
        assert!(store.path().exists());
    }

    #[test]
    fn garbage_and_newer_formats_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), b"\xff\xff\xff").unwrap();
        let err = StateStore::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("state.pb") && err.contains("not a rendezvous state snapshot"),
            "{err}"
        );
        let newer = pb::StateSnapshot {
            format: STATE_FORMAT + 1,
            ..Default::default()
        };
        std::fs::write(dir.path().join(FILE), newer.encode_to_vec()).unwrap();
        let err = StateStore::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("format 2"), "{err}");
    }

    #[test]
    fn a_failed_write_is_an_error_naming_the_file_and_keeps_the_old_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = StateStore::open(dir.path()).unwrap();
        store.save(&snapshot("a0")).unwrap();
        // A directory where the temporary file goes makes the write fail.
        std::fs::create_dir(dir.path().join(TMP)).unwrap();
        let err = store.save(&snapshot("a1")).unwrap_err();
        assert!(matches!(err, RendezvousError::Storage { .. }), "{err}");
        assert!(err.to_string().contains("state.pb"), "{err}");
        std::fs::remove_dir(dir.path().join(TMP)).unwrap();
        drop(store);
        let (_, read) = StateStore::open(dir.path()).unwrap();
        assert_eq!(read.unwrap().agents[0].agent_id, "a0");
    }
}
