//! A detached job's rows kept on the agent's disk (`keep_rows`), so that
//! the agent, restarted on its node after a crash (its container
//! restarted, its process SIGKILLed), takes its place in the job again
//! with no client to feed it: each split's committed batches in commit
//! order with their origins, the producers' positions and the job's start,
//! under `<work-dir>/kept/<agent>/<job>/`. Crash-safe as checkpoints are:
//! every file flushed to the disk, a temporary directory renamed into
//! place, `kept.json` recording each file's length and SHA-256, so a torn
//! copy is found at restart and passed over. Written by hand: the layout
//! is the shard cache's own (origins, positions), which no format knows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use kindling_schemas::action::{AgentJobState, KeepRowsResponse, KeptSplitRows, StartJob};
use kindling_schemas::descriptor::Split;
use kindling_schemas::schema::{self, StreamKind};
use kindling_schemas::spec::JobKind;
use serde::{Deserialize, Serialize};

use crate::cache::{CachedBatch, DiskBudget, Origin, Reservation};
use crate::error::{AgentError, KeptError};
use crate::jobs::job::Job;
use crate::training::checkpoint::{FileDigest, sync_dir, write_durably};

/// The record of what a kept job's directory holds.
const RECORD: &str = "kept.json";
/// What a directory being written is named until it is renamed into place.
const TEMPORARY: &str = ".writing-";

/// What a kept job's directory holds: the job's start, which job under
/// its id, and both splits.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeptRecord {
    /// The job's start, as the agent took it (spec, rendezvous, initial weights).
    pub start: StartJob,
    /// Which job under the id: the rendezvous' incarnation.
    pub incarnation: u64,
    /// The train split.
    pub train: KeptSplit,
    /// The eval split.
    pub eval: KeptSplit,
}

/// One split's kept batches, in commit order, and its producers' positions.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct KeptSplit {
    /// The batches, in commit order.
    pub batches: Vec<KeptBatch>,
    /// Each producer's committed position: `(next sequence number, rows)`.
    pub producers: BTreeMap<String, (u64, u64)>,
    /// Whether the split ended (a job with no eval split never ends it).
    #[serde(default)]
    pub ended: bool,
}

/// The kept files a restored job's batches are, by path, with their
/// digests as the copy's record gave them: a later copy names them
/// without reading them again, and a file damaged since stays found
/// damaged instead of recorded anew.
pub type KeptFiles = std::collections::HashMap<PathBuf, FileDigest>;

/// One kept batch: its file, what it holds, and where it came from.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeptBatch {
    /// The file (its name relative to the job's directory), its length and
    /// SHA-256, recorded as a checkpoint's files are.
    #[serde(flatten)]
    pub file: FileDigest,
    /// Rows in it.
    pub rows: u64,
    /// The producer that sent it (none for a batch staged without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// Its sequence number there.
    #[serde(default)]
    pub seq: u64,
}

impl KeptRecord {
    /// Rows kept, both splits.
    pub fn rows(&self) -> u64 {
        self.splits()
            .map(|(_, s)| s.batches.iter().map(|b| b.rows).sum::<u64>())
            .sum()
    }

    /// Bytes the kept batches' files take.
    pub fn bytes(&self) -> u64 {
        self.splits()
            .map(|(_, s)| s.batches.iter().map(|b| b.file.len).sum::<u64>())
            .sum()
    }

    fn splits(&self) -> impl Iterator<Item = (Split, &KeptSplit)> {
        [(Split::Train, &self.train), (Split::Eval, &self.eval)].into_iter()
    }

    /// `keep_rows`' answer for this copy.
    pub fn answer(&self) -> KeepRowsResponse {
        let rows = |s: &KeptSplit| KeptSplitRows {
            producers: s
                .producers
                .iter()
                .map(|(p, &(_, rows))| (p.clone(), rows))
                .collect(),
            ended: s.ended,
        };
        KeepRowsResponse {
            job_id: self.start.job_id.clone(),
            rows: self.rows(),
            bytes: self.bytes(),
            train: rows(&self.train),
            eval: rows(&self.eval),
            start: self.start.clone(),
        }
    }
}

/// What a job's rows are kept as on this agent: `keep_rows`' answer, and
/// the disk the copy takes below the watermark (given back when the job is
/// removed or its copy is rewritten).
#[derive(Debug)]
pub struct Kept {
    /// What was kept.
    pub answer: KeepRowsResponse,
    /// The copy's bytes below the disk watermark (none when the job's
    /// cached batches are the kept files themselves: after a restart).
    _reserved: Option<Reservation>,
}

impl Kept {
    /// A job restored from its kept files, whose batches are those files.
    pub fn restored(record: &KeptRecord) -> Self {
        Kept {
            answer: record.answer(),
            _reserved: None,
        }
    }
}

/// Takes `job`'s kept copy back because its rows change (a split reopened:
/// rows handed over to an agent that joined, or fed again): the record goes
/// from the disk first, so an agent that restarts before the copy is
/// written again does not take back rows it no longer holds. The files stay
/// (a job restored from them reads them) until the next copy or the job's
/// removal.
pub fn forget(job: &Job) -> Result<(), KeptError> {
    if job
        .kept
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .is_none()
    {
        return Ok(());
    }
    remove_record(&job.kept_place())
}

/// Removes the record of the copy in `place` (none there is fine), the
/// directory flushed: its files are no longer a copy a restart takes back.
fn remove_record(place: &Path) -> Result<(), KeptError> {
    let record = place.join(RECORD);
    let io = |context: String| move |source| KeptError::Io { context, source };
    match std::fs::remove_file(&record) {
        Ok(()) => sync_dir(place).map_err(io(format!("flush {}", place.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(format!("remove {}", record.display()))(e)),
    }
}

/// One split's committed batches and origins, its producers' positions,
/// and whether it ended.
type SplitCopy = (
    Vec<Arc<CachedBatch>>,
    Vec<Option<Origin>>,
    BTreeMap<String, (u64, u64)>,
    bool,
);

/// A job's rows as they stand, to write outside the job's lock.
pub struct Snapshot {
    start: StartJob,
    incarnation: u64,
    splits: [SplitCopy; 2],
    known: KeptFiles,
}

/// The job's rows as they stand, once the train split ended and the eval
/// split too if it has rows: only a job that trains on rows of its own
/// keeps them.
pub fn snapshot(job: &Job) -> Result<Snapshot, AgentError> {
    if job.spec.kind() != JobKind::Train {
        return Err(AgentError::wrong_state(
            &job.job_id,
            job.lock().state,
            "only a job that trains on rows of its own keeps them",
        ));
    }
    let initial_weights = job
        .initial_table()
        .map(kindling_schemas::model_serving::encode_weights)
        .transpose()
        .map_err(|e| crate::error::ModelError::Table(format!("initial weights: {e}")))?;
    let d = job.lock();
    // A job that succeeded holds its rows until it is removed; one that
    // failed or was cancelled dropped them.
    if matches!(d.state, AgentJobState::Failed | AgentJobState::Cancelled) {
        return Err(AgentError::wrong_state(&job.job_id, d.state, "its rows are gone"));
    }
    let copy = |split: Split| -> Result<SplitCopy, AgentError> {
        let s = d.ingest.split(split);
        // A job fed no eval split never ends it.
        let none = split == Split::Eval && s.committed_rows() == 0 && s.cache.staged_bytes() == 0;
        if !s.ended() && !none {
            return Err(AgentError::wrong_state(
                &job.job_id,
                d.state,
                format!(
                    "its {} split has not ended: rows are kept once every row is fed (end_of_data)",
                    split.as_str()
                ),
            ));
        }
        let batches = s.cache.snapshot();
        let origins = s.cache.origins(batches.len());
        let positions = s
            .positions()
            .map(|(p, pos)| (p.to_owned(), (pos.next_seq, pos.rows)))
            .collect();
        Ok((batches, origins, positions, s.ended()))
    };
    let splits = [copy(Split::Train)?, copy(Split::Eval)?];
    Ok(Snapshot {
        start: StartJob {
            job_id: job.job_id.clone(),
            spec: job.spec.clone(),
            rendezvous: job.rendezvous.clone(),
            initial_weights,
        },
        incarnation: job.incarnation,
        splits,
        known: job.kept_files.clone(),
    })
}

/// Writes `snap` under `root` (crash-safe; blocking I/O), its bytes
/// reserved below `disk`'s watermark first: a copy that does not fit is
/// refused before anything is written. The first copy is written aside and
/// renamed into place; a later one (the job's rows changed) is written in
/// its place — with no record until it is whole, keeping the files the job
/// reads from there — and the files no longer named are removed.
pub fn write(root: &Path, snap: Snapshot, disk: &Arc<DiskBudget>) -> Result<Kept, KeptError> {
    let job_id = snap.start.job_id.clone();
    let io = |context: String| move |source| KeptError::Io { context, source };
    let place = root.join(&job_id);
    // Each batch's Arrow size, give or take the IPC framing: what the copy
    // takes beyond the files already in place.
    let (mut needed, mut reused) = (0u64, 0u64);
    for (batches, ..) in &snap.splits {
        for b in batches {
            match b.as_ref() {
                // Reserved already, by the job that reads it.
                CachedBatch::Disk { path, bytes, .. } if path.starts_with(&place) => reused += *bytes,
                CachedBatch::Memory { bytes, .. } | CachedBatch::Disk { bytes, .. } => needed += *bytes,
            }
        }
    }
    let refused = |source| KeptError::Disk {
        job_id: job_id.clone(),
        needed,
        source,
    };
    std::fs::create_dir_all(root).map_err(io(format!("create {}", root.display())))?;
    disk.check_free(root, needed).map_err(refused)?;
    let reserved = disk.reserve(needed).map_err(refused)?;
    let record = if place.is_dir() {
        rewrite(&place, snap)?
    } else {
        let tmp = root.join(format!("{TEMPORARY}{job_id}-{}", uuid::Uuid::new_v4()));
        let record = match write_into(&tmp, snap, "") {
            Ok(record) => record,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        std::fs::rename(&tmp, &place).map_err(io(format!("rename into {}", place.display())))?;
        sync_dir(root).map_err(io(format!("flush {}", root.display())))?;
        record
    };
    Ok(Kept {
        answer: record.answer(),
        _reserved: Some(reserved.resize(record.bytes().saturating_sub(reused))),
    })
}

/// Writes `snap` again in `place`, which holds an earlier copy: its record
/// goes first, the batches the job reads from `place` (restored there) are
/// named as they are, the others written under new names, the record
/// written whole and renamed into place, and the files it does not name
/// removed.
fn rewrite(place: &Path, snap: Snapshot) -> Result<KeptRecord, KeptError> {
    remove_record(place)?;
    let generation = uuid::Uuid::new_v4().simple().to_string();
    let record = write_into(place, snap, &generation[..8])?;
    let named: std::collections::HashSet<PathBuf> = record
        .splits()
        .flat_map(|(_, s)| s.batches.iter().map(|b| place.join(&b.file.name)))
        .collect();
    for split in [Split::Train, Split::Eval] {
        let Ok(entries) = std::fs::read_dir(place.join(split.as_str())) else {
            continue;
        };
        for e in entries.flatten() {
            if !named.contains(&e.path()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(record)
}

/// Writes every batch and then the record into `dir`, each file flushed:
/// a batch read from a file in `dir` already is named as it is, the others
/// are written as `<split>/batch-[<generation>-]<n>.arrow`.
fn write_into(dir: &Path, snap: Snapshot, generation: &str) -> Result<KeptRecord, KeptError> {
    let io = |context: String| move |source| KeptError::Io { context, source };
    let job_id = snap.start.job_id.clone();
    let mut kept = [KeptSplit::default(), KeptSplit::default()];
    for ((split, (batches, origins, producers, ended)), out) in [Split::Train, Split::Eval]
        .into_iter()
        .zip(snap.splits)
        .zip(&mut kept)
    {
        let sub = dir.join(split.as_str());
        std::fs::create_dir_all(&sub).map_err(io(format!("create {}", sub.display())))?;
        for (i, (batch, origin)) in batches.iter().zip(origins).enumerate() {
            let (file, rows) = match batch.as_ref() {
                CachedBatch::Disk { path, rows, .. } if path.starts_with(dir) => {
                    let file = match snap.known.get(path) {
                        Some(file) => file.clone(),
                        None => {
                            let name = path.strip_prefix(dir).unwrap_or(path).to_string_lossy();
                            let bytes =
                                std::fs::read(path).map_err(io(format!("read {}", path.display())))?;
                            FileDigest::of(&name, &bytes)
                        }
                    };
                    (file, *rows as u64)
                }
                _ => {
                    let loaded = batch.load().map_err(|e| KeptError::Io {
                        context: format!("read job `{job_id}`'s batch to keep"),
                        source: std::io::Error::other(e.to_string()),
                    })?;
                    let bytes = ipc_file(&loaded).map_err(|source| KeptError::Arrow {
                        job_id: job_id.clone(),
                        source,
                    })?;
                    let file = match generation {
                        "" => format!("{}/batch-{i:08}.arrow", split.as_str()),
                        g => format!("{}/batch-{g}-{i:08}.arrow", split.as_str()),
                    };
                    let path = dir.join(&file);
                    write_durably(&path, &bytes).map_err(io(format!("write {}", path.display())))?;
                    (FileDigest::of(&file, &bytes), loaded.num_rows() as u64)
                }
            };
            out.batches.push(KeptBatch {
                file,
                rows,
                producer: origin.as_ref().map(|o| o.producer.to_string()),
                seq: origin.map_or(0, |o| o.seq),
            });
        }
        out.producers = producers;
        out.ended = ended;
        sync_dir(&sub).map_err(io(format!("flush {}", sub.display())))?;
    }
    let [train, eval] = kept;
    let record = KeptRecord {
        start: snap.start,
        incarnation: snap.incarnation,
        train,
        eval,
    };
    let json = serde_json::to_vec_pretty(&record).map_err(|source| KeptError::Meta {
        dir: dir.to_owned(),
        source,
    })?;
    // Whole or absent: written aside, then renamed into place.
    let (aside, path) = (dir.join(format!("{RECORD}.tmp")), dir.join(RECORD));
    write_durably(&aside, &json).map_err(io(format!("write {}", aside.display())))?;
    std::fs::rename(&aside, &path).map_err(io(format!("rename into {}", path.display())))?;
    sync_dir(dir).map_err(io(format!("flush {}", dir.display())))?;
    Ok(record)
}

/// `batch` as an Arrow IPC file.
fn ipc_file(batch: &RecordBatch) -> Result<Vec<u8>, arrow::error::ArrowError> {
    let mut w = FileWriter::try_new(Vec::new(), &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    w.into_inner()
}

/// Every kept job's directory under `root`, with its record read and every
/// file checked against it; leftovers of a write a crash cut short are
/// removed.
pub fn list(root: &Path) -> Vec<(PathBuf, Result<KeptRecord, KeptError>)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if e.file_name().to_string_lossy().starts_with(TEMPORARY) {
            let _ = std::fs::remove_dir_all(&path);
        } else if path.is_dir() {
            let read = read(&path);
            found.push((path, read));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The record in `dir`, every file it names checked: length and digest.
pub fn read(dir: &Path) -> Result<KeptRecord, KeptError> {
    let path = dir.join(RECORD);
    let json = std::fs::read(&path).map_err(|source| KeptError::Io {
        context: format!("read {}", path.display()),
        source,
    })?;
    let record: KeptRecord = serde_json::from_slice(&json).map_err(|source| KeptError::Meta {
        dir: dir.to_owned(),
        source,
    })?;
    for (_, split) in record.splits() {
        for b in &split.batches {
            let place = dir.join(&b.file.name);
            let corrupt = |reason: String| KeptError::Corrupt {
                place: place.clone(),
                reason,
            };
            if b.file.name.contains("..") || Path::new(&b.file.name).is_absolute() {
                return Err(corrupt("names a file outside its directory".into()));
            }
            let bytes = std::fs::read(&place).map_err(|e| corrupt(e.to_string()))?;
            let got = FileDigest::of(&b.file.name, &bytes);
            if got.len != b.file.len {
                return Err(corrupt(format!(
                    "{} bytes, the record says {}",
                    got.len, b.file.len
                )));
            }
            if got.sha256 != b.file.sha256 {
                return Err(corrupt("its SHA-256 differs from the record's".into()));
            }
        }
    }
    Ok(record)
}

/// Puts the kept rows in `dir` (`record`) into `job`'s splits as committed
/// batches — the kept files themselves, read as spill files are, each
/// reserved below `disk`'s watermark — with their origins and producers'
/// positions, ends both splits, sets the job's layout from the first
/// batch's schema and notes the files' digests ([`Job::kept_files`]).
pub fn restore_into(
    job: &mut Job,
    dir: &Path,
    record: &KeptRecord,
    disk: &Arc<DiskBudget>,
) -> Result<(), AgentError> {
    job.kept_files = record
        .splits()
        .flat_map(|(_, s)| s.batches.iter())
        .map(|b| (dir.join(&b.file.name), b.file.clone()))
        .collect();
    let mut first: Option<PathBuf> = None;
    let mut d = job.lock();
    let stream = d.ingest.open_stream();
    for (name, kept) in record.splits() {
        let split = d.ingest.split_mut(name);
        for b in &kept.batches {
            let path = dir.join(&b.file.name);
            first.get_or_insert_with(|| path.clone());
            let reserved = disk.reserve(b.file.len)?;
            let origin = b.producer.as_deref().map(|p| Origin {
                producer: Arc::from(p),
                seq: b.seq,
            });
            let batch = CachedBatch::Disk {
                path,
                bytes: b.file.len,
                rows: b.rows as usize,
                reserved,
            };
            split.cache.stage_from(stream, origin, batch);
        }
        split.cache.commit(stream);
        for (producer, &(next_seq, rows)) in &kept.producers {
            split.advance(producer, next_seq, rows);
        }
        if kept.ended {
            split.end();
        }
    }
    let first = first.ok_or_else(|| KeptError::Corrupt {
        place: dir.to_owned(),
        reason: "no rows kept".into(),
    })?;
    let schema = FileReader::try_new(
        std::fs::File::open(&first).map_err(|source| KeptError::Io {
            context: format!("open {}", first.display()),
            source,
        })?,
        None,
    )
    .map_err(|source| KeptError::Arrow {
        job_id: job.job_id.clone(),
        source,
    })?
    .schema();
    d.layout = Some(schema::validate(&schema, &job.spec, StreamKind::Train)?);
    Ok(())
}

#[cfg(test)]
mod tests;
