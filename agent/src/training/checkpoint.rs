//! Checkpoints: weights, optimizer state, epoch and data position, and the
//! spec, in `<root>/<job_id>/attempt-<n>/epoch-<e>/` after `e` epochs, or
//! `epoch-<e>-step-<s>/` after `s` steps of epoch `e + 1` (a checkpoint
//! inside an epoch: the rest of that epoch trains from it).
//!
//! A checkpoint is written to a temporary directory, every file and the
//! directory flushed to the disk (fsync), and renamed into place, the parent
//! flushed too; only then are older checkpoints pruned, so the previous one
//! stays until the new one is durable. `meta.json` records each file's
//! length and SHA-256: a checkpoint whose files do not match (a torn write,
//! a full disk, bit rot) is passed over with a warning for the one before
//! it, and a crash's leftover temporary directories are removed. A job that keeps
//! its best epoch (early stopping with `restore_best`) writes that epoch's
//! weights into every checkpoint beside the last's, so the store keeps the
//! best and the last, and a resumed job still returns the best.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use kindling_schemas::spec::JobSpec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use crate::error::CheckpointError;

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
    /// Steps done of epoch `epoch + 1` (a checkpoint inside it; 0 at an
    /// epoch's end). Where every rank is in that epoch's order follows:
    /// `step × batch_size × accumulate` rows of its shard (or all of them),
    /// the order being the shard's own for the epoch and the seed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub step: u64,
    /// What the steps of that epoch summed so far, for its metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialEpoch>,
    /// Each data file's name, length and SHA-256 (hex), checked on load
    /// (empty in checkpoints from before they were recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileDigest>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The sums of an epoch's first steps, which its metrics need at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PartialEpoch {
    /// Summed (weighted) loss of the steps.
    pub loss_sum: f64,
    /// Their rows' total weight.
    pub weight_total: f64,
    /// Rows all ranks trained.
    pub rows_total: f64,
    /// Seconds the steps took.
    pub secs: f64,
    /// The gang's size when it was written (0: not recorded). Its ranks'
    /// orders hold only for a gang of that size over the same shards: after
    /// a shrink or a growth the job resumes from the epoch's start instead.
    #[serde(default)]
    pub world: u32,
}

/// Where a checkpoint stands: `epoch` epochs done and `step` steps of the
/// next. Orders checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Epochs completed.
    pub epoch: u32,
    /// Steps done of the next epoch.
    pub step: u64,
}

impl Position {
    /// The checkpoint directory's name.
    fn dir_name(self) -> String {
        match self.step {
            0 => format!("epoch-{:04}", self.epoch),
            s => format!("epoch-{:04}-step-{s:08}", self.epoch),
        }
    }

    /// Parses a checkpoint directory's name.
    fn parse(name: &str) -> Option<Position> {
        let rest = name.strip_prefix("epoch-")?;
        let (epoch, step) = match rest.split_once("-step-") {
            Some((e, s)) => (e.parse().ok()?, s.parse().ok()?),
            None => (rest.parse().ok()?, 0),
        };
        Some(Position { epoch, step })
    }
}

impl CheckpointMeta {
    /// Where the checkpoint stands.
    /// Whether a gang of `world` ranks can resume from here: any can from
    /// an epoch's end; inside an epoch, one of the size that wrote it.
    pub fn fits(&self, world: u32) -> bool {
        self.step == 0 || self.partial.is_none_or(|p| p.world == 0 || p.world == world)
    }

    pub fn position(&self) -> Position {
        Position {
            epoch: self.epoch,
            step: self.step,
        }
    }
}

/// What a checkpoint file must hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// File name in the checkpoint directory.
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// SHA-256 of its bytes, lower-case hex.
    pub sha256: String,
}

impl FileDigest {
    /// `bytes`' length and SHA-256, as the file `name` must hold them.
    pub(crate) fn of(name: &str, bytes: &[u8]) -> FileDigest {
        let digest = Sha256::digest(bytes);
        FileDigest {
            name: name.to_owned(),
            len: bytes.len() as u64,
            sha256: digest.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}

/// Writes `bytes` to `path` and flushes them to the disk.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Flushes a directory's entries (a rename into it) to the disk.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
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

    /// Writes a checkpoint for `meta.epoch` of `meta.attempt`, durably
    /// (see the module docs), then prunes the oldest beyond `keep_last`.
    pub fn save(&self, spec: &JobSpec, ckpt: &Checkpoint) -> Result<PathBuf, CheckpointError> {
        let attempt_dir = self.dir.join(format!("attempt-{}", ckpt.meta.attempt));
        let name = ckpt.meta.position().dir_name();
        let final_dir = attempt_dir.join(&name);
        let tmp = attempt_dir.join(format!(".{name}.tmp"));
        let io = |what: &str, p: &Path, source| CheckpointError::Io {
            context: format!("{what} {}", p.display()),
            source,
        };
        std::fs::create_dir_all(&tmp).map_err(|e| io("create checkpoint dir", &tmp, e))?;
        let spec_json = spec.to_json();
        let mut files: Vec<(&str, &[u8])> = vec![
            ("model.bpk", &ckpt.weights),
            ("optimizer.bpk", &ckpt.optimizer),
            ("spec.json", spec_json.as_bytes()),
        ];
        if let Some(best) = &ckpt.best {
            files.push(("best.bpk", best));
        }
        let mut meta = ckpt.meta.clone();
        meta.files = files
            .iter()
            .map(|(name, bytes)| FileDigest::of(name, bytes))
            .collect();
        let meta_json = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        files.push(("meta.json", &meta_json));
        for (name, bytes) in files {
            let p = tmp.join(name);
            write_durably(&p, bytes).map_err(|e| io("write", &p, e))?;
        }
        sync_dir(&tmp).map_err(|e| io("flush", &tmp, e))?;
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| io("replace", &final_dir, e))?;
        }
        std::fs::rename(&tmp, &final_dir).map_err(|e| io("commit checkpoint", &final_dir, e))?;
        sync_dir(&attempt_dir).map_err(|e| io("flush", &attempt_dir, e))?;
        self.prune();
        Ok(final_dir)
    }

    /// Removes the temporary directories of checkpoints a crash left half
    /// written (`.epoch-*.tmp`); returns how many.
    pub fn clean_leftovers(&self) -> usize {
        let mut removed = 0;
        let Ok(attempts) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        for a in attempts.flatten() {
            let Ok(entries) = std::fs::read_dir(a.path()) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(".epoch-") && name.ends_with(".tmp") {
                    match std::fs::remove_dir_all(e.path()) {
                        Ok(()) => removed += 1,
                        Err(err) => tracing::warn!(dir = %e.path().display(), error = %err,
                            "could not remove a half-written checkpoint"),
                    }
                }
            }
        }
        if removed > 0 {
            tracing::warn!(dir = %self.dir.display(), removed, "removed half-written checkpoints of a crash");
        }
        removed
    }

    /// Complete checkpoints, oldest first: `(position, attempt, dir)`.
    pub fn list(&self) -> Vec<(Position, u32, PathBuf)> {
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
                if let Some(at) = Position::parse(&name) {
                    out.push((at, attempt, e.path()));
                }
            }
        }
        out.sort();
        out
    }

    /// Loads the latest checkpoint whose files match their metadata; a
    /// newer one that does not is passed over with a warning.
    pub fn load_latest(&self) -> Result<Option<Checkpoint>, CheckpointError> {
        self.load_latest_for(0)
    }

    /// [`load_latest`](Self::load_latest) for a gang of `world` ranks: a
    /// checkpoint inside an epoch written by a gang of another size is
    /// passed over (its ranks' places in their orders mean nothing to this
    /// gang), so the job resumes from the start of that epoch. `0`: any.
    pub fn load_latest_for(&self, world: u32) -> Result<Option<Checkpoint>, CheckpointError> {
        for (at, attempt, dir) in self.list().into_iter().rev() {
            match read_checkpoint(&dir) {
                Ok(c) if world != 0 && !c.meta.fits(world) => tracing::info!(
                    epoch = at.epoch,
                    step = at.step,
                    world,
                    written_by = c.meta.partial.map_or(0, |p| p.world),
                    "checkpoint inside an epoch written by a gang of another size: resuming from the epoch's start"
                ),
                Ok(c) => return Ok(Some(c)),
                Err(e) => tracing::warn!(
                    epoch = at.epoch, step = at.step, attempt, dir = %dir.display(), error = %e,
                    "checkpoint unreadable or corrupt: falling back to the one before it"
                ),
            }
        }
        Ok(None)
    }

    /// Removes the oldest checkpoints beyond `keep_last`, but never the
    /// newest at an epoch's end: a gang that changes size resumes from it.
    fn prune(&self) {
        let all = self.list();
        let excess = all.len().saturating_sub(self.keep_last as usize);
        let epoch_end = all.iter().rposition(|(at, _, _)| at.step == 0);
        for (i, (_, _, dir)) in all.into_iter().enumerate().take(excess) {
            if Some(i) == epoch_end {
                continue;
            }
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not prune checkpoint");
            }
        }
    }
}

/// At agent start, what a crashed agent of the same id left behind: its
/// spill files (no job survives a restart, so they hold nothing anyone can
/// read), `.removing-*` directories of jobs it was deleting, and
/// half-written checkpoints. Complete checkpoints stay: jobs resume from
/// them. Returns how many entries went.
pub fn clean_after_crash(spill_dir: &Path, checkpoint_dir: &Path) -> usize {
    let remove = |p: &Path| match std::fs::remove_dir_all(p) {
        Ok(()) => 1,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "could not remove a crash's leftover");
            0
        }
    };
    let mut removed = remove(spill_dir);
    if let Ok(entries) = std::fs::read_dir(checkpoint_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".removing-") {
                removed += remove(&e.path());
            } else if e.path().is_dir() {
                removed += CheckpointStore::new(checkpoint_dir, &name, 1).clean_leftovers();
            }
        }
    }
    if removed > 0 {
        tracing::warn!(spill = %spill_dir.display(), checkpoints = %checkpoint_dir.display(), removed,
            "removed what a previous agent process left behind");
    }
    removed
}

/// Reads the checkpoint in `dir`, checking every file against the lengths
/// and digests its metadata recorded.
fn read_checkpoint(dir: &Path) -> Result<Checkpoint, CheckpointError> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read(&p).map_err(|source| CheckpointError::Io {
            context: format!("read {}", p.display()),
            source,
        })
    };
    let meta: CheckpointMeta =
        serde_json::from_slice(&read("meta.json")?).map_err(|source| CheckpointError::Meta {
            place: format!("{}/meta.json", dir.display()),
            source,
        })?;
    let checked = |name: &str| -> Result<Vec<u8>, CheckpointError> {
        let bytes = read(name)?;
        if let Some(want) = meta.files.iter().find(|f| f.name == name) {
            let got = FileDigest::of(name, &bytes);
            if got != *want {
                return Err(CheckpointError::Corrupt {
                    place: format!("{}/{name}", dir.display()),
                    reason: format!(
                        "{} bytes with SHA-256 {}…, its metadata recorded {} bytes with {}…",
                        got.len,
                        &got.sha256[..12],
                        want.len,
                        &want.sha256[..want.sha256.len().min(12)]
                    ),
                });
            }
        }
        Ok(bytes)
    };
    let best = match meta.best_epoch {
        Some(_) => Some(checked("best.bpk")?),
        None => None,
    };
    Ok(Checkpoint {
        weights: checked("model.bpk")?,
        optimizer: checked("optimizer.bpk")?,
        best,
        meta,
    })
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
pub fn unpack(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let mut parts = Vec::with_capacity(4);
    let mut rest = bytes;
    for name in ["metadata", "weights", "optimizer state", "best epoch's weights"] {
        let cut =
            |part: String, claimed: u64, left: usize| CheckpointError::Truncated { part, claimed, left };
        let (len, tail) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| cut(format!("the length of the {name}"), 8, rest.len()))?;
        let len = u64::from_le_bytes(*len);
        // A length past the bytes left is refused before anything is copied.
        let (part, tail) = usize::try_from(len)
            .ok()
            .and_then(|n| tail.split_at_checked(n))
            .ok_or_else(|| cut(format!("the {name}"), len, tail.len()))?;
        parts.push(part.to_vec());
        rest = tail;
    }
    let best = parts.pop().unwrap_or_default();
    let optimizer = parts.pop().unwrap_or_default();
    let weights = parts.pop().unwrap_or_default();
    let meta: CheckpointMeta =
        serde_json::from_slice(&parts.pop().unwrap_or_default()).map_err(|source| CheckpointError::Meta {
            place: "in a broadcast".into(),
            source,
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
                step: 0,
                partial: None,
                files: Vec::new(),
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

    fn spec() -> JobSpec {
        JobSpec::builder()
            .task(Task::Regression)
            .features(["a"])
            .label("y")
            .build()
            .expect("spec")
    }

    /// A latest checkpoint torn at any offset, with a flipped byte, or with
    /// unreadable metadata is passed over for the one before it; with none
    /// whole, there is none.
    #[test]
    fn a_corrupt_latest_checkpoint_falls_back_to_the_one_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::new(dir.path(), "j", 3);
        let mut big = ckpt(1, 1);
        big.weights = (0..4096u32).map(|i| (i % 251) as u8).collect();
        store.save(&spec(), &big).expect("save 1");
        big.meta.epoch = 2;
        let latest = store.save(&spec(), &big).expect("save 2");
        let model = latest.join("model.bpk");
        let whole = std::fs::read(&model).expect("read");
        for cut in [0, 1, whole.len() / 2, whole.len() - 1] {
            std::fs::write(&model, &whole[..cut]).expect("truncate");
            let got = store.load_latest().expect("load").expect("the one before");
            assert_eq!(got.meta.epoch, 1, "torn at {cut} bytes");
        }
        let mut flipped = whole.clone();
        flipped[100] ^= 1;
        std::fs::write(&model, &flipped).expect("flip");
        assert_eq!(store.load_latest().expect("load").expect("one").meta.epoch, 1);
        match read_checkpoint(&latest) {
            Err(CheckpointError::Corrupt { place, reason }) => {
                assert!(place.ends_with("model.bpk"), "{place}");
                assert!(reason.contains("its metadata recorded"), "{reason}");
            }
            other => panic!("a flipped byte is a corrupt checkpoint, got {other:?}"),
        }
        std::fs::write(&model, &whole).expect("restore");
        assert_eq!(store.load_latest().expect("load").expect("one").meta.epoch, 2);
        std::fs::write(latest.join("meta.json"), b"{\"epoch\": 2").expect("tear meta");
        assert!(matches!(
            read_checkpoint(&latest),
            Err(CheckpointError::Meta { .. })
        ));
        assert_eq!(store.load_latest().expect("load").expect("one").meta.epoch, 1);
        let first = &store.list()[0].2;
        std::fs::remove_file(first.join("optimizer.bpk")).expect("remove");
        assert!(
            store.load_latest().expect("load").is_none(),
            "nothing whole is left"
        );
    }

    /// What a crash leaves is cleaned at start: half-written checkpoints,
    /// `.removing-*` directories and the spill files; whole checkpoints stay.
    #[test]
    fn a_crashs_leftovers_are_cleaned_and_whole_checkpoints_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (spill, checkpoints) = (dir.path().join("spill"), dir.path().join("checkpoints"));
        let store = CheckpointStore::new(&checkpoints, "j", 2);
        let kept = store.save(&spec(), &ckpt(1, 1)).expect("save");
        let torn = kept.with_file_name(".epoch-0002.tmp");
        std::fs::create_dir_all(&torn).expect("torn");
        std::fs::write(torn.join("model.bpk"), b"half").expect("half");
        let removing = checkpoints.join(".removing-old-1234");
        std::fs::create_dir_all(removing.join("attempt-1")).expect("removing");
        std::fs::create_dir_all(spill.join("j").join("train")).expect("spill");
        assert_eq!(clean_after_crash(&spill, &checkpoints), 3);
        assert!(!torn.exists() && !removing.exists() && !spill.exists());
        assert_eq!(store.load_latest().expect("load").expect("kept").meta.epoch, 1);
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
        let cut = unpack(&packed[..packed.len() - 1]).expect_err("a cut broadcast is refused");
        assert!(matches!(cut, CheckpointError::Truncated { .. }), "{cut}");
        assert!(
            cut.to_string().contains("the best epoch's weights takes"),
            "{cut}"
        );
    }

    #[test]
    fn a_checkpoint_inside_an_epoch_orders_after_the_epoch_before_and_before_the_next() {
        let dir = tempfile::tempdir().expect("dir");
        let store = CheckpointStore::new(dir.path(), "j", 3);
        let spec = spec();
        let at = |epoch, step| {
            let mut c = ckpt(epoch, 1);
            c.meta.step = step;
            c.meta.partial = (step > 0).then_some(PartialEpoch {
                loss_sum: 1.5,
                weight_total: 8.0,
                rows_total: 8.0,
                secs: 0.25,
                world: 2,
            });
            c
        };
        store.save(&spec, &at(1, 0)).expect("epoch 1");
        store.save(&spec, &at(1, 20)).expect("20 steps into epoch 2");
        store.save(&spec, &at(1, 5)).expect("5 steps into epoch 2");
        let latest = store.load_latest().expect("load").expect("one");
        assert_eq!(latest.meta.position(), Position { epoch: 1, step: 20 });
        assert_eq!(latest.meta.partial.map(|p| p.rows_total), Some(8.0));
        store.save(&spec, &at(2, 0)).expect("epoch 2");
        let listed: Vec<Position> = store.list().into_iter().map(|(at, _, _)| at).collect();
        // Three kept: the oldest (epoch 1's end) pruned.
        let want = [(1, 5), (1, 20), (2, 0)].map(|(epoch, step)| Position { epoch, step });
        assert_eq!(listed, want);
        assert_eq!(
            store.load_latest().expect("load").expect("one").meta.partial,
            None
        );
    }

    /// A gang of another size resumes from the newest epoch's end, which
    /// pruning keeps while checkpoints inside the next epoch are newer.
    #[test]
    fn a_gang_of_another_size_resumes_from_the_epochs_end_which_pruning_keeps() {
        let dir = tempfile::tempdir().expect("dir");
        let store = CheckpointStore::new(dir.path(), "j", 2);
        let spec = spec();
        let at = |step, world| {
            let mut c = ckpt(1, 1);
            c.meta.step = step;
            c.meta.partial = (step > 0).then_some(PartialEpoch {
                rows_total: 8.0,
                world,
                ..PartialEpoch::default()
            });
            c
        };
        for (step, world) in [(0, 0), (10, 2), (20, 2), (30, 2)] {
            store.save(&spec, &at(step, world)).expect("save");
        }
        let listed: Vec<u64> = store.list().into_iter().map(|(at, _, _)| at.step).collect();
        assert_eq!(listed, [0, 20, 30], "keep_last 2 and the epoch's end");
        let resume = |world| {
            store
                .load_latest_for(world)
                .expect("load")
                .expect("one")
                .meta
                .position()
        };
        assert_eq!(resume(2), Position { epoch: 1, step: 30 });
        assert_eq!(resume(3), Position { epoch: 1, step: 0 }, "a grown gang");
        assert_eq!(resume(1), Position { epoch: 1, step: 0 }, "a shrunk gang");
        // Written before the size was recorded: any gang resumes inside.
        store.save(&spec, &at(40, 0)).expect("save");
        assert_eq!(resume(3), Position { epoch: 1, step: 40 });
    }
}
