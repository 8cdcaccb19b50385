//! What a `TrainingJob` reported: its `Fed` events and its final eval accuracy.

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
