//! Train with executor push: the Spark tasks stream their partitions straight
//! into the agents; this program only sends the plan and reads one summary row
//! per partition. No Python here — only the executors need Python with pyarrow.
//!
//! ```text
//! deploy/local/spark-connect.sh start
//! cargo run -p kindling --example executor_push -- sc://127.0.0.1:15002 [executor python, default 3.11]
//! ```

use kindling::SparkSession;
use kindling::job::{ExecutorPush, Feed, ProgressMode, TrainingEvent, TrainingJob};
use kindling_schemas::spec::{ModelSpec, OptimizerSpec, Task};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let remote = args.next().unwrap_or_else(|| "sc://127.0.0.1:15002".into());
    let python = args.next().unwrap_or_else(|| "3.11".into());

    let spark = SparkSession::connect(&remote).await?;
    // 50 000 rows in 4 partitions: label = x1 + 2·x2 > 0.1.
    let df = spark
        .sql(
            "SELECT x1, x2, CAST(x1 + 2 * x2 > 0.1 AS INT) AS y FROM \
             (SELECT CAST(rand(1) * 2 - 1 AS FLOAT) AS x1, CAST(rand(2) * 2 - 1 AS FLOAT) AS x2 \
              FROM range(0, 50000, 1, 4))",
        )
        .await?;

    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let model = TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![16] })
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.02))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .epochs(5)
        .eval_fraction(0.2)
        .local_mode(true)
        .progress(ProgressMode::Log)
        .events(tx)
        .feed(Feed::ExecutorPush(ExecutorPush::new().python_version(python)))
        .build()?
        .fit(&df)
        .await?;

    while let Ok(event) = rx.try_recv() {
        if let TrainingEvent::Fed {
            split,
            client_bytes,
            partitions,
            ..
        } = event
        {
            println!("{split}: {client_bytes} bytes through this client");
            for p in partitions {
                println!(
                    "  partition {} (attempt {}) → shard {:?}: {} rows",
                    p.partition, p.attempt, p.shard, p.rows
                );
            }
        }
    }
    let last = model.history().last().expect("epochs");
    println!("eval accuracy {:?}", last.eval_accuracy);
    Ok(())
}
