//! What a `TrainingJob` reported: its `Fed` events and its final eval
//! accuracy; what its model's `transform` predicted.

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use kindling::job::{PushedPartition, TrainedModel, TrainingEvent};
use tokio::sync::mpsc::Receiver;

/// What one `Fed` event said.
#[derive(Debug)]
pub struct Fed {
    pub split: &'static str,
    pub feed: &'static str,
    pub rows_per_shard: Vec<u64>,
    pub client_bytes: u64,
    pub queries: usize,
    pub partitions: Vec<PushedPartition>,
}

/// The `Fed` events received so far, in order (other events are dropped).
pub fn fed_events(rx: &mut Receiver<TrainingEvent>) -> Vec<Fed> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        if let TrainingEvent::Fed {
            split,
            rows_per_shard,
            feed,
            client_bytes,
            queries,
            partitions,
            ..
        } = e
        {
            out.push(Fed {
                split,
                feed,
                rows_per_shard,
                client_bytes,
                queries,
                partitions,
            });
        }
    }
    out
}

/// The eval accuracy after the last epoch.
pub fn accuracy(m: &TrainedModel) -> f64 {
    m.history()
        .last()
        .and_then(|h| h.eval_accuracy)
        .expect("eval accuracy")
}

/// Every transformed row's prediction and probabilities, checked against
/// `predict_batch` of its own features (the first two columns) in this
/// process, to 1e-6; returns the rows checked.
pub fn assert_same_as_predict(model: &TrainedModel, batches: &[RecordBatch]) -> usize {
    let mut rows = 0;
    for b in batches {
        let features = b.project(&[0, 1]).expect("features");
        let expected = model.predict_batch(&features).expect("predict");
        let got_class = b
            .column_by_name("prediction")
            .expect("prediction")
            .as_primitive::<Int64Type>();
        let want_class = expected
            .column_by_name("prediction")
            .expect("prediction")
            .as_primitive::<Int64Type>();
        assert_eq!(got_class, want_class);
        let got = b
            .column_by_name("probabilities")
            .expect("probabilities")
            .as_list::<i32>();
        let want = expected
            .column_by_name("probabilities")
            .expect("probabilities")
            .as_list::<i32>();
        for i in 0..b.num_rows() {
            let (g, w) = (got.value(i), want.value(i));
            let (g, w) = (g.as_primitive::<Float32Type>(), w.as_primitive::<Float32Type>());
            assert_eq!(g.len(), 2);
            for k in 0..g.len() {
                assert!((g.value(k) - w.value(k)).abs() <= 1e-6, "row {i}: {g:?} vs {w:?}");
            }
        }
        rows += b.num_rows();
    }
    rows
}
