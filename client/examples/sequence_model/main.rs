//! Your own burn model over variable-length id sequences: an `Embedding`, a
//! 1-D convolution and a masked max over time ([`motif::MotifNet`]), trained
//! in local mode on 2 slots to tell whether a sequence contains the motif
//! `3 1 4`. The sequences are made in Spark as a `List<Int64>` column and
//! declared `.sequence(column, vocabulary, max_len)`; the test accuracy is
//! printed next to the majority class's and that of an order-blind network
//! (embedding mean over the row's positions, [`motif::BagOfIds`]).
//!
//! `cargo run -p kindling --example sequence_model -- [sc://127.0.0.1:15002] [epochs]`
//!
//! Needs the local Spark Connect server (`deploy/local/spark-connect.sh start`).

mod motif;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let epochs = match args.next() {
        Some(e) => e.parse()?,
        None => motif::EPOCHS,
    };
    motif::run(&remote, epochs).await?.print();
    Ok(())
}
