use std::sync::Arc;

use arrow::array::{Float32Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema};
use kindling_schemas::spec::{JobSpec, Task};

use super::*;
use crate::cache::{MemoryBudget, ShardCache};

fn batch(start: i64, n: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Float32, false),
        Field::new("y", DataType::Int64, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Float32Array::from_iter_values(
                (start..start + n).map(|v| v as f32),
            )),
            Arc::new(Int64Array::from_iter_values(start..start + n)),
        ],
    )
    .expect("batch")
}

fn start() -> StartJob {
    StartJob {
        job_id: "kept-1".into(),
        spec: JobSpec::builder()
            .task(Task::Regression)
            .features(["a"])
            .label("y")
            .build()
            .expect("spec"),
        rendezvous: "http://127.0.0.1:1".into(),
        initial_weights: None,
    }
}

fn origin(producer: &str, seq: u64) -> Option<Origin> {
    Some(Origin {
        producer: Arc::from(producer),
        seq,
    })
}

/// Three train batches (the last spilled past a one-batch budget) from two
/// producers and one eval batch, as a job's splits hold them.
fn snapshot(spill: &Path) -> (Snapshot, Vec<RecordBatch>) {
    let one = kindling_schemas::schema::batch_bytes(&batch(0, 100));
    let mut cache = ShardCache::new(spill, MemoryBudget::new(one * 2));
    let train = [batch(0, 100), batch(100, 100), batch(200, 100)];
    for b in &train {
        cache.append(1, b.clone()).expect("append");
    }
    cache.commit(1);
    let batches = cache.snapshot();
    assert!(
        matches!(batches[2].as_ref(), CachedBatch::Disk { .. }),
        "the last train batch is spilled"
    );
    let origins = vec![origin("p0", 0), origin("p1", 0), origin("p0", 1)];
    let positions = BTreeMap::from([("p0".to_owned(), (2, 200)), ("p1".to_owned(), (1, 100))]);
    let mut eval = ShardCache::new(spill.join("eval"), MemoryBudget::new(u64::MAX));
    eval.append(1, batch(1000, 10)).expect("append");
    eval.commit(1);
    let eval_positions = BTreeMap::from([("p0".to_owned(), (1, 10))]);
    let snap = Snapshot {
        start: start(),
        incarnation: 7,
        splits: [
            (batches, origins, positions, true),
            (eval.snapshot(), vec![origin("p0", 0)], eval_positions, true),
        ],
        known: KeptFiles::new(),
    };
    let mut all = train.to_vec();
    all.push(batch(1000, 10));
    (snap, all)
}

fn load(path: &Path) -> RecordBatch {
    let file = std::fs::File::open(path).expect("open");
    FileReader::try_new(file, None)
        .expect("reader")
        .next()
        .expect("a batch")
        .expect("decode")
}

#[test]
fn kept_rows_read_back_whole_with_their_origins_and_positions() {
    let dir = tempfile::tempdir().expect("dir");
    let (snap, batches) = snapshot(&dir.path().join("spill"));
    let disk = DiskBudget::unbounded();
    let root = dir.path().join("kept");
    let kept = write(&root, snap, &disk).expect("kept");
    let answer = &kept.answer;
    assert_eq!(answer.rows, 310);
    assert_eq!(
        disk.used(),
        answer.bytes,
        "the copy is reserved below the watermark"
    );
    assert_eq!(
        answer.train.producers,
        BTreeMap::from([("p0".to_owned(), 200), ("p1".to_owned(), 100)]),
        "the rows of each producer: the shards it holds"
    );
    assert_eq!(answer.eval.producers, BTreeMap::from([("p0".to_owned(), 10)]));
    assert!(answer.train.ended && answer.eval.ended);
    assert_eq!(answer.start, start(), "what starts an agent that joins the job");
    let record = read(&root.join("kept-1")).expect("reads back");
    assert_eq!(
        (record.incarnation, record.rows(), record.bytes()),
        (7, 310, kept.answer.bytes)
    );
    assert_eq!(record.start, start());
    let files: Vec<&KeptBatch> = record.train.batches.iter().chain(&record.eval.batches).collect();
    for (b, want) in files.iter().zip(&batches) {
        assert_eq!(
            &load(&root.join("kept-1").join(&b.file.name)),
            want,
            "{}",
            b.file.name
        );
    }
    let origins: Vec<(Option<&str>, u64)> = record
        .train
        .batches
        .iter()
        .map(|b| (b.producer.as_deref(), b.seq))
        .collect();
    assert_eq!(origins, [(Some("p0"), 0), (Some("p1"), 0), (Some("p0"), 1)]);
    assert_eq!(record.train.producers["p0"], (2, 200));
    assert_eq!(record.eval.producers["p0"], (1, 10));
    assert!(record.train.ended && record.eval.ended);
    drop(kept);
    assert_eq!(disk.used(), 0, "given back with the job");
}

#[test]
fn a_torn_or_flipped_kept_file_or_an_unreadable_record_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    for what in ["flipped", "torn", "record"] {
        let root = dir.path().join(format!("kept-{what}"));
        let job = root.join("kept-1");
        let file = job.join("train/batch-00000001.arrow");
        let (snap, _) = snapshot(&dir.path().join(format!("spill-{what}")));
        write(&root, snap, &DiskBudget::unbounded()).expect("kept");
        read(&job).expect("whole before the damage");
        damage(what, &job, &file);
        let e = read(&job).expect_err(what);
        match (what, &e) {
            ("record", KeptError::Meta { .. }) => {}
            (_, KeptError::Corrupt { place, .. }) => assert_eq!(place, &file, "{e}"),
            _ => panic!("{what}: {e}"),
        }
    }
}

/// Damages a kept copy: a byte of `file` flipped, its end torn off, or the
/// record cut short.
fn damage(what: &str, job: &Path, file: &Path) {
    match what {
        "flipped" => {
            let mut bytes = std::fs::read(file).expect("read");
            let mid = bytes.len() / 2;
            bytes[mid] ^= 1;
            std::fs::write(file, bytes).expect("write");
        }
        "torn" => {
            let bytes = std::fs::read(file).expect("read");
            std::fs::write(file, &bytes[..bytes.len() - 3]).expect("write");
        }
        _ => std::fs::write(job.join(RECORD), b"{\"start\": ").expect("write"),
    }
}

/// A first copy of [`snapshot`] in `<dir>/kept/kept-1`, and the snapshot
/// of the job restored from it once p1's rows were handed over and p2's
/// fed: its train batches are the copy's files (their digests as the
/// record gave them) and one new batch in memory. Also the batches.
fn restored_and_changed(dir: &Path, disk: &Arc<DiskBudget>) -> (Snapshot, Vec<Arc<CachedBatch>>) {
    let (snap, _) = snapshot(&dir.join("spill"));
    let root = dir.join("kept");
    let place = root.join("kept-1");
    drop(write(&root, snap, disk).expect("kept"));
    let first = read(&place).expect("first copy");
    let mut cached = Vec::new();
    let mut origins = Vec::new();
    let mut known = KeptFiles::new();
    for b in first
        .train
        .batches
        .iter()
        .filter(|b| b.producer.as_deref() != Some("p1"))
    {
        let path = place.join(&b.file.name);
        known.insert(path.clone(), b.file.clone());
        cached.push(Arc::new(CachedBatch::Disk {
            path,
            bytes: b.file.len,
            rows: b.rows as usize,
            reserved: disk.reserve(b.file.len).expect("reserve"),
        }));
        origins.push(origin("p0", b.seq));
    }
    let mut more = ShardCache::new(dir.join("spill-2"), MemoryBudget::new(u64::MAX));
    more.append(2, batch(500, 7)).expect("append");
    more.commit(2);
    cached.extend(more.snapshot());
    origins.push(origin("p2", 0));
    let held = cached.clone();
    let positions = BTreeMap::from([("p0".to_owned(), (2, 200)), ("p2".to_owned(), (1, 7))]);
    let again = Snapshot {
        start: start(),
        incarnation: 7,
        splits: [
            (cached, origins, positions, true),
            (Vec::new(), Vec::new(), BTreeMap::new(), true),
        ],
        known,
    };
    (again, held)
}

/// A job restored from its copy (its batches the copy's files) hands
/// producer `p1`'s rows over and takes a new batch: the copy written again
/// names the files the job reads as they are, writes the new batch, drops
/// `p1`'s file and reads back whole; the job's files are never touched.
#[test]
fn a_copy_written_again_keeps_the_files_a_restored_job_reads_and_drops_the_rows_handed_over() {
    let dir = tempfile::tempdir().expect("dir");
    let disk = DiskBudget::unbounded();
    let (again, held) = restored_and_changed(dir.path(), &disk);
    let root = dir.path().join("kept");
    let place = root.join("kept-1");
    let kept = write(&root, again, &disk).expect("written again");
    assert_eq!(kept.answer.rows, 207);
    assert_eq!(
        kept.answer.train.producers,
        BTreeMap::from([("p0".to_owned(), 200), ("p2".to_owned(), 7)])
    );
    let record = read(&place).expect("reads back whole");
    let names: Vec<&str> = record
        .train
        .batches
        .iter()
        .map(|b| b.file.name.as_str())
        .collect();
    assert_eq!(
        &names[..2],
        ["train/batch-00000000.arrow", "train/batch-00000002.arrow"],
        "the job's files as they are"
    );
    assert!(
        names[2].starts_with("train/batch-") && names[2] != "train/batch-00000002.arrow",
        "{names:?}"
    );
    assert_eq!(load(&place.join(names[2])), batch(500, 7));
    assert!(
        !place.join("train/batch-00000001.arrow").exists(),
        "p1's rows are gone"
    );
    assert!(
        !place.join("eval/batch-00000000.arrow").exists(),
        "so are the eval rows no longer held"
    );
    for b in &held[..2] {
        let CachedBatch::Disk { path, .. } = b.as_ref() else {
            panic!("on disk")
        };
        assert!(path.exists(), "{} is the job's", path.display());
    }
}

/// The copy written again names the restored job's files with the digests
/// their record gave them, not read again: a file damaged since (a byte
/// flipped on the disk) is found damaged when the copy is taken back, not
/// recorded anew as whole.
#[test]
fn a_kept_file_damaged_after_its_restore_stays_found_damaged_when_the_copy_is_written_again() {
    let dir = tempfile::tempdir().expect("dir");
    let disk = DiskBudget::unbounded();
    let (again, _held) = restored_and_changed(dir.path(), &disk);
    let root = dir.path().join("kept");
    let place = root.join("kept-1");
    let file = place.join("train/batch-00000002.arrow");
    damage("flipped", &place, &file);
    write(&root, again, &disk).expect("written again");
    let e = read(&place).expect_err("the damaged file");
    assert!(
        matches!(&e, KeptError::Corrupt { place, reason } if place == &file && reason.contains("SHA-256")),
        "{e}"
    );
}

#[test]
fn a_copy_past_the_watermark_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let (snap, _) = snapshot(&dir.path().join("spill"));
    let disk = DiskBudget::new(1000, 0);
    let root = dir.path().join("kept");
    let e = write(&root, snap, &disk).expect_err("past the watermark");
    assert!(
        matches!(e, KeptError::Disk { ref job_id, .. } if job_id == "kept-1"),
        "{e}"
    );
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.to_string().contains("the job is not detached"), "{e}");
    assert_eq!(disk.used(), 0);
    assert_eq!(
        std::fs::read_dir(&root).expect("root").count(),
        0,
        "nothing written"
    );
}

#[test]
fn a_write_a_crash_cut_short_is_removed_and_a_whole_copy_listed() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("kept");
    let (snap, _) = snapshot(&dir.path().join("spill"));
    write(&root, snap, &DiskBudget::unbounded()).expect("kept");
    let cut = root.join(format!("{TEMPORARY}kept-2-x"));
    std::fs::create_dir_all(cut.join("train")).expect("dir");
    let found = list(&root);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, root.join("kept-1"));
    assert!(found[0].1.is_ok());
    assert!(!cut.exists(), "the cut-short write is removed");
}
