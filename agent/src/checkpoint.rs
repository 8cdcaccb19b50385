//! Checkpoints: weights, optimizer state, epoch and data position, and the
//! spec, in `<root>/<job_id>/attempt-<n>/epoch-<e>/`.
//!
//! A checkpoint is written to a temporary directory and renamed into place,
//! so a directory named `epoch-<e>` is always complete. A job that keeps
//! its best epoch (early stopping with `restore_best`) writes that epoch's
//! weights into every checkpoint beside the last's, so the store keeps the
//! best and the last, and a resumed job still returns the best.

use std::path::{Path, PathBuf};

use kindling_schemas::spec::JobSpec;
use serde::{Deserialize, Serialize};

use crate::error::AgentError;

/// What a checkpoint says about where training stood.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Epochs completed.
    pub epoch: u32,
    /// Attempt that wrote it.
    pub attempt: u32,
    /// Data position: rows trained by all ranks, per completed epoch.
    pub rows_trained_per_epoch: Vec<u64>,
    /// Metrics of the completed epochs (JSON of `EpochMetrics`).
    pub history: Vec<kindling_schemas::action::EpochMetrics>,
    /// The epoch whose weights `best.bpk` holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_epoch: Option<u32>,
}

/// A loaded checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Its metadata.
    pub meta: CheckpointMeta,
    /// burn record bytes of the model.
    pub weights: Vec<u8>,
    /// The optimizer state ([`crate::optim::FlatOptimizer::to_bytes`]).
    pub optimizer: Vec<u8>,
    /// burn record bytes of the best epoch's model (`meta.best_epoch`).
    pub best: Option<Vec<u8>>,
}

/// The checkpoints of one job on this agent.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep_last: u32,
}

impl CheckpointStore {
    /// Checkpoints of `job_id` under `root`.
    pub fn new(root: &Path, job_id: &str, keep_last: u32) -> Self {
        CheckpointStore {
            dir: root.join(job_id),
            keep_last: keep_last.max(1),
        }
    }

    /// The job's checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a checkpoint for `meta.epoch` of `meta.attempt`.
    pub fn save(&self, spec: &JobSpec, ckpt: &Checkpoint) -> Result<PathBuf, AgentError> {
        let attempt_dir = self.dir.join(format!("attempt-{}", ckpt.meta.attempt));
        let final_dir = attempt_dir.join(format!("epoch-{:04}", ckpt.meta.epoch));
        let tmp = attempt_dir.join(format!(".epoch-{:04}.tmp", ckpt.meta.epoch));
        let io = |what: &str, p: &Path, e| AgentError::io(format!("{what} {}", p.display()), e);
        std::fs::create_dir_all(&tmp).map_err(|e| io("create checkpoint dir", &tmp, e))?;
        let write = |name: &str, bytes: &[u8]| {
            let p = tmp.join(name);
            std::fs::write(&p, bytes).map_err(|e| io("write", &p, e))
        };
        write("model.bpk", &ckpt.weights)?;
        write("optimizer.bpk", &ckpt.optimizer)?;
        if let Some(best) = &ckpt.best {
            write("best.bpk", best)?;
        }
        write(
            "meta.json",
            &serde_json::to_vec_pretty(&ckpt.meta).unwrap_or_default(),
        )?;
        write("spec.json", spec.to_json().as_bytes())?;
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| io("replace", &final_dir, e))?;
        }
        std::fs::rename(&tmp, &final_dir).map_err(|e| io("commit checkpoint", &final_dir, e))?;
        self.prune();
        Ok(final_dir)
    }

    /// Complete checkpoints, oldest first: `(epoch, attempt, dir)`.
    pub fn list(&self) -> Vec<(u32, u32, PathBuf)> {
        let mut out = Vec::new();
        let Ok(attempts) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for a in attempts.flatten() {
            let name = a.file_name().to_string_lossy().into_owned();
            let Some(attempt) = name.strip_prefix("attempt-").and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(epochs) = std::fs::read_dir(a.path()) else {
                continue;
            };
            for e in epochs.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(epoch) = name.strip_prefix("epoch-").and_then(|n| n.parse::<u32>().ok()) {
                    out.push((epoch, attempt, e.path()));
                }
            }
        }
        out.sort();
        out
    }

    /// The epoch of the latest complete checkpoint (0 when none).
    pub fn latest_epoch(&self) -> u32 {
        self.list().last().map(|(e, _, _)| *e).unwrap_or(0)
    }

    /// Loads the latest complete checkpoint.
    pub fn load_latest(&self) -> Result<Option<Checkpoint>, AgentError> {
        let Some((_, _, dir)) = self.list().pop() else {
            return Ok(None);
        };
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read(&p).map_err(|e| AgentError::io(format!("read {}", p.display()), e))
        };
        let meta: CheckpointMeta =
            serde_json::from_slice(&read("meta.json")?).map_err(|source| AgentError::CheckpointMeta {
                place: format!("{}/meta.json", dir.display()),
                source,
            })?;
        let best = match meta.best_epoch {
            Some(_) => Some(read("best.bpk")?),
            None => None,
        };
        Ok(Some(Checkpoint {
            meta,
            weights: read("model.bpk")?,
            optimizer: read("optimizer.bpk")?,
            best,
        }))
    }

    fn prune(&self) {
        let all = self.list();
        let excess = all.len().saturating_sub(self.keep_last as usize);
        for (_, _, dir) in all.into_iter().take(excess) {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not prune checkpoint");
            }
        }
    }
}

/// Packs a checkpoint into one byte buffer (for a ring broadcast).
pub fn pack(ckpt: &Checkpoint) -> Vec<u8> {
    let meta = serde_json::to_vec(&ckpt.meta).unwrap_or_default();
    let best = ckpt.best.as_deref().unwrap_or_default();
    let mut out =
        Vec::with_capacity(32 + meta.len() + ckpt.weights.len() + ckpt.optimizer.len() + best.len());
    for part in [meta.as_slice(), &ckpt.weights, &ckpt.optimizer, best] {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// Unpacks [`pack`]'s output.
pub fn unpack(bytes: &[u8]) -> Result<Checkpoint, AgentError> {
    let bad = || AgentError::TruncatedCheckpoint;
    let mut parts = Vec::with_capacity(4);
    let mut rest = bytes;
    for _ in 0..4 {
        let (len, tail) = rest.split_at_checked(8).ok_or_else(bad)?;
        let len = u64::from_le_bytes(len.try_into().map_err(|_| bad())?) as usize;
        let (part, tail) = tail.split_at_checked(len).ok_or_else(bad)?;
        parts.push(part.to_vec());
        rest = tail;
    }
    let best = parts.pop().unwrap_or_default();
    let optimizer = parts.pop().unwrap_or_default();
    let weights = parts.pop().unwrap_or_default();
    let meta: CheckpointMeta =
        serde_json::from_slice(&parts.pop().unwrap_or_default()).map_err(|source| {
            AgentError::CheckpointMeta {
                place: "in a broadcast".into(),
                source,
            }
        })?;
    let best = meta.best_epoch.map(|_| best);
    Ok(Checkpoint {
        meta,
        weights,
        optimizer,
        best,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kindling_schemas::spec::Task;

    fn ckpt(epoch: u32, attempt: u32) -> Checkpoint {
        Checkpoint {
            meta: CheckpointMeta {
                epoch,
                attempt,
                rows_trained_per_epoch: vec![10; epoch as usize],
                history: vec![],
                best_epoch: (epoch > 1).then_some(epoch - 1),
            },
            weights: vec![epoch as u8; 5],
            optimizer: vec![1, 2, 3],
            best: (epoch > 1).then(|| vec![epoch as u8 - 1; 4]),
        }
    }

    #[test]
    fn latest_wins_across_attempts_and_old_ones_are_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = JobSpec::builder()
            .task(Task::Regression)
            .features(["a"])
            .label("y")
            .build()
            .expect("spec");
        let store = CheckpointStore::new(dir.path(), "j", 2);
        assert!(store.load_latest().expect("empty ok").is_none());
        store.save(&spec, &ckpt(1, 1)).expect("save");
        store.save(&spec, &ckpt(2, 1)).expect("save");
        store.save(&spec, &ckpt(3, 2)).expect("save");
        assert_eq!(store.list().len(), 2);
        let latest = store.load_latest().expect("load").expect("some");
        assert_eq!(latest.meta.epoch, 3);
        assert_eq!(latest.weights, vec![3; 5]);
        assert_eq!(latest.meta.best_epoch, Some(2));
        assert_eq!(
            latest.best,
            Some(vec![2; 4]),
            "the best epoch's weights beside the last's"
        );
    }

    #[test]
    fn pack_round_trips_and_truncation_is_an_error() {
        let c = ckpt(4, 1);
        let packed = pack(&c);
        let back = unpack(&packed).expect("unpack");
        assert_eq!(back.meta, c.meta);
        assert_eq!(back.weights, c.weights);
        assert_eq!(back.best, c.best);
        let first = ckpt(1, 1);
        assert_eq!(unpack(&pack(&first)).expect("unpack").best, None);
        assert!(unpack(&packed[..packed.len() - 1]).is_err());
    }
}
