use std::sync::Arc;

use arrow::array::Int64Array;
use arrow::datatypes::{DataType, Field, Schema};

use super::*;

fn batch(start: i64, n: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(start..start + n))],
    )
    .expect("batch")
}

#[test]
fn spills_past_the_budget_and_reads_back_identically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = kindling_schemas::schema::batch_bytes(&batch(0, 1000));
    let budget = MemoryBudget::new(one * 2);
    let mut cache = ShardCache::new(dir.path().join("s"), budget.clone());
    for i in 0..5 {
        cache.append(1, batch(i * 1000, 1000)).expect("append");
    }
    let (mem, disk) = cache.bytes();
    assert!(mem <= one * 2, "memory {mem} over budget");
    assert!(disk > 0, "nothing spilled");
    assert_eq!(cache.committed_rows(), 0, "uncommitted rows are invisible");
    cache.commit(1);
    let loaded: Vec<RecordBatch> = cache.snapshot().iter().map(|b| b.load().expect("load")).collect();
    for (i, b) in loaded.iter().enumerate() {
        assert_eq!(b, &batch(i as i64 * 1000, 1000));
    }
    cache.clear();
    assert_eq!(budget.used(), 0);
    assert_eq!(
        std::fs::read_dir(dir.path().join("s")).expect("dir").count(),
        0,
        "spill files removed"
    );
}

/// A batch decoded from IPC keeps all its columns in one message buffer:
/// it must be charged for its values once, not once per column, or a
/// shard well inside the budget spills.
#[test]
fn an_ipc_decoded_batch_is_charged_once_not_per_column() {
    let columns: Vec<Field> = (0..8)
        .map(|i| Field::new(format!("c{i}"), DataType::Int64, false))
        .collect();
    let schema = Arc::new(Schema::new(columns));
    let arrays = (0..8)
        .map(|i| Arc::new(Int64Array::from_iter_values(i * 10_000..(i + 1) * 10_000)) as _)
        .collect();
    let original = RecordBatch::try_new(schema.clone(), arrays).expect("batch");
    let mut encoded = Vec::new();
    {
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut encoded, &schema).expect("writer");
        w.write(&original).expect("write");
        w.finish().expect("finish");
    }
    let decoded = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(encoded), None)
        .expect("reader")
        .next()
        .expect("one batch")
        .expect("decode");
    assert_eq!(decoded, original);
    let values = 8 * 10_000 * 8;
    assert_eq!(kindling_schemas::schema::batch_bytes(&decoded), values);
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = MemoryBudget::new(2 * values);
    let mut cache = ShardCache::new(dir.path(), budget.clone());
    assert_eq!(cache.append(1, decoded).expect("append"), values);
    let (memory, disk) = cache.bytes();
    assert_eq!(disk, 0, "fits the budget: nothing spills");
    // Charged what it holds: the one body (and an array's bookkeeping),
    // not eight bodies.
    assert!(
        (values..values + 1024).contains(&memory),
        "charged {memory} for {values}"
    );
    assert_eq!(budget.used(), memory);
}

/// A one-row batch whose value sits in a 16 MiB allocation, as a
/// Flight message padded by its sender decodes: kept, it would hold the
/// 16 MiB while charged 8 bytes. The cache keeps a copy of its values.
#[test]
fn a_batch_padded_far_past_its_values_is_kept_as_a_copy_and_charged_for_it() {
    let body = arrow::buffer::Buffer::from_vec(vec![7i64; 2 << 20]);
    let padded = Int64Array::new(arrow::buffer::ScalarBuffer::new(body, 0, 1), None);
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(padded)]).expect("batch");
    assert!(held(&batch) >= 16 << 20, "the fixture holds the body");
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = MemoryBudget::new(1 << 30);
    let mut cache = ShardCache::new(dir.path(), budget.clone());
    assert_eq!(cache.append(1, batch.clone()).expect("append"), 8);
    cache.commit(1);
    let kept = cache.snapshot()[0].load().expect("load");
    assert_eq!(kept, batch, "the same row");
    assert!(held(&kept) < 1 << 10, "still holds {} bytes", held(&kept));
    assert_eq!(budget.used(), held(&kept).max(8), "charged what the copy holds");
    // A batch that owns its buffers is kept as it is, not copied.
    let plain = self::batch(0, 1000);
    let (kept, bytes, charge) = owned(plain.clone());
    assert_eq!(bytes, 8000);
    assert!(
        (8000..8000 + 1024).contains(&charge),
        "charged {charge}: its buffers and no more"
    );
    assert_eq!(
        kept.column(0).to_data().buffers()[0].as_ptr(),
        plain.column(0).to_data().buffers()[0].as_ptr()
    );
}

/// Padded below the copy threshold (a one-row batch in a 512 KiB body):
/// kept as it is, and charged the 512 KiB it holds, not its 8 bytes.
#[test]
fn a_batch_padded_below_the_copy_threshold_is_charged_what_it_holds() {
    let body = arrow::buffer::Buffer::from_vec(vec![7i64; (512 << 10) / 8]);
    let padded = Int64Array::new(arrow::buffer::ScalarBuffer::new(body, 0, 1), None);
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(padded)]).expect("batch");
    let (_, values, charge) = owned(batch.clone());
    assert_eq!(values, 8);
    assert!(charge >= 512 << 10, "charged {charge}");
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = MemoryBudget::new(3 << 19);
    let mut cache = ShardCache::new(dir.path(), budget.clone());
    for _ in 0..6 {
        assert_eq!(
            cache.append(1, batch.clone()).expect("append"),
            8,
            "acks say the values"
        );
    }
    let (memory, disk) = cache.bytes();
    assert!(
        memory <= 3 << 19 && disk > 0,
        "memory {memory}, disk {disk}: the padding must cost budget"
    );
}

#[test]
fn abort_drops_only_that_streams_uncommitted_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cache = ShardCache::new(dir.path(), MemoryBudget::new(u64::MAX));
    cache.append(1, batch(0, 10)).expect("append");
    cache.append(2, batch(10, 5)).expect("append");
    cache.commit(1);
    cache.append(1, batch(20, 7)).expect("append");
    cache.abort(2);
    cache.abort(1);
    assert_eq!(cache.committed_rows(), 10);
    assert_eq!(cache.snapshot().len(), 1);
}

/// Batches are visible in commit order, so an index into the committed
/// batches never moves while later streams commit (a trainer reading the
/// shard as it arrives would otherwise see one batch twice, another never).
#[test]
fn committed_batches_keep_their_index_when_an_older_stream_commits_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cache = ShardCache::new(dir.path(), MemoryBudget::new(u64::MAX));
    cache.append(1, batch(0, 10)).expect("append");
    cache.append(2, batch(100, 10)).expect("append");
    cache.commit(2);
    let first = cache.committed_since(0);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].load().expect("load"), batch(100, 10));
    cache.commit(1);
    let later = cache.committed_since(1);
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].load().expect("load"), batch(0, 10));
    assert_eq!(cache.committed_rows(), 20);
    assert!(cache.committed_since(5).is_empty());
}
