//! Choosing a model's options on one ETL: a Spark query runs once, its rows
//! are held in two local agents' caches, and sixteen trials — learning rate
//! and hidden layer drawn at random — train on them, four at a time, ASHA
//! stopping the weak ones after their first epoch. Prints the trials'
//! table and saves the best trial's model.
//!
//! ```text
//! deploy/local/spark-connect.sh start
//! cargo run -p kindling --features local --example search -- sc://127.0.0.1:15002 [models/best]
//! ```

use kindling::SparkSession;
use kindling::job::{ProgressMode, Search, SearchSpace, TrainingJob};
use kindling_schemas::spec::{ModelSpec, Task};
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let output = args.next().unwrap_or_else(|| "models/search-best".into());
    let spark = SparkSession::connect(&remote).await?;
    // The ETL: two features and a label from a rule the model can learn.
    let df = spark
        .sql(
            "SELECT x1, x2, CAST(x1 * x1 + x2 > 0.3 AS INT) AS y FROM \
             (SELECT rand(1) * 2 - 1 AS x1, rand(2) * 2 - 1 AS x2 FROM range(0, 100000, 1, 4))",
        )
        .await?;
    let job = TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![16] })
        .task(Task::Classification { num_classes: 2 })
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .epochs(9)
        .batch_size(128)
        .eval_fraction(0.2)
        .local_mode(true)
        .progress(ProgressMode::Log)
        .build()?;
    let space = SearchSpace::new()
        .log_uniform("lr", 1e-4, 1e-1)
        .choice("hidden", [json!([8]), json!([32]), json!([64, 32])]);
    let search = Search::new(space).trials(16).seed(1).asha(1, 3).parallel(4);
    let result = job.search(&df, &search).await?;
    println!("{}", result.table());
    let best = result.best_trial().expect("a trial finished");
    println!(
        "best: trial {} {}",
        best.trial,
        serde_json::to_string(&best.options)?
    );
    if let Some(model) = &best.model {
        model.save(&output)?;
        println!("model saved to {output}");
    }
    Ok(())
}
