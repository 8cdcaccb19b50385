//! The two "your own model" examples, run as they are: the test compiles each
//! example's module (`client/examples/<name>/`) and calls the same `run` its
//! `main` calls, against the local Spark Connect server, then checks the
//! network beats its baseline by a wide margin.

#[path = "../../client/examples/sequence_model/motif.rs"]
mod motif;
#[path = "../../client/examples/tabular_embeddings/tabular.rs"]
mod tabular;

use kindling_tests::spark::spark_remote;

/// One example at a time: each trains 2 local agents on this machine's cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The embedding network on diamonds: scikit-learn's one-hot linear
/// regression on the same test rows stays well behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tabular_embeddings_beats_one_hot_linear_regression() {
    let _one = ONE_AT_A_TIME.lock().await;
    let outcome = tabular::run(&spark_remote(), tabular::EPOCHS)
        .await
        .expect("tabular_embeddings");
    outcome.print();
    let b = &outcome.baselines;
    assert_eq!(
        outcome.vocabularies,
        [("cut".into(), 5), ("color".into(), 7), ("clarity".into(), 8)],
        "Spark's indexing of the string columns"
    );
    assert_eq!(
        b.train_rows + b.test_rows,
        53_940,
        "every row in one of the splits"
    );
    assert!(
        outcome.net < 0.85 * b.linear,
        "the network's RMSE {:.4} is not clearly below one-hot linear regression's {:.4}",
        outcome.net,
        b.linear
    );
    assert!(
        outcome.net < 0.2 * b.mean,
        "the network's RMSE {:.4} against predicting the mean's {:.4}",
        outcome.net,
        b.mean
    );
}

/// The convolution finds the motif; an order-blind network cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequence_model_beats_the_majority_class() {
    let _one = ONE_AT_A_TIME.lock().await;
    let outcome = motif::run(&spark_remote(), motif::EPOCHS)
        .await
        .expect("sequence_model");
    outcome.print();
    assert_eq!(outcome.train_rows + outcome.test_rows, motif::ROWS);
    assert!(
        outcome.net > outcome.majority + 0.3,
        "MotifNet {:.4} against the majority class {:.4}",
        outcome.net,
        outcome.majority
    );
    assert!(
        outcome.net > outcome.bag + 0.3,
        "MotifNet {:.4} against the order-blind BagOfIds {:.4}",
        outcome.net,
        outcome.bag
    );
}
