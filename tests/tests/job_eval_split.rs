//! The eval split by a column (`eval_split_by`), end to end on a real Spark
//! Connect server and real local agents: the same rows in three orders —
//! as generated, `ORDER BY rand()`, and that repartitioned and pushed by
//! the executors — put exactly the same rows in eval (recorded by the
//! agents' model as it evaluates them), the ones the documented hash
//! names, about the asked fraction of them; the column, its type and its
//! nulls are checked before anything starts.

use std::collections::BTreeSet;

use kindling::job::{ExecutorPush, Feed, JobError, ProgressMode, SplitProblem, TrainingEvent, TrainingJob};
use kindling::model::ModelRegistry;
use kindling::{DataFrame, ModelSpec, OptimizerSpec, SparkSession, Task};
use kindling_tests::events::fed_events;
use kindling_tests::spark::spark_remote;

const ROWS: i64 = 4_000;
const FRACTION: f64 = 0.25;
const SEED: u64 = 7;

/// `ROWS` rows: an `id` (a feature the recording model reads but does not
/// train on), a feature `x1`, the label `y`, and the split column `key`, a
/// string that is no feature.
fn base_sql() -> String {
    format!(
        "SELECT CAST(id AS DOUBLE) AS id, CAST(rand(3) * 2 - 1 AS DOUBLE) AS x1, \
         concat('row-', CAST(id AS STRING)) AS key FROM range(0, {ROWS}, 1, 4)"
    )
}

async fn rows(spark: &SparkSession, order: &str) -> DataFrame {
    let sql = format!(
        "SELECT id, x1, CAST(x1 > 0 AS INT) AS y, key FROM ({}) {order}",
        base_sql()
    );
    spark.sql(&sql).await.expect("sql")
}

fn job() -> kindling::job::TrainingJobBuilder {
    TrainingJob::builder()
        .model(ModelSpec::custom("eval-recorder", &recorder::RecorderConfig {}).expect("config"))
        .models(ModelRegistry::builtin().with::<recorder::Recorder>("eval-recorder"))
        .task(Task::Classification { num_classes: 2 })
        .optimizer(OptimizerSpec::adam(0.02))
        .features(["x1", "id"])
        .label("y")
        .num_slots(2)
        .batch_size(128)
        .epochs(1)
        .eval_fraction(FRACTION)
        .seed(SEED)
        .local_mode(true)
        .progress(ProgressMode::Silent)
}

/// Trains `job` on `df`: the ids of the rows both agents evaluated (each
/// once), and the rows fed as train and as eval.
async fn eval_ids(job: kindling::job::TrainingJobBuilder, df: &DataFrame) -> (BTreeSet<i64>, u64, u64) {
    let _only = RECORDING.lock().await;
    recorder::take();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let model = job.events(tx).build().expect("job").fit(df).await.expect("fit");
    assert_eq!(model.history().len(), 1);
    let recorded = recorder::take();
    let ids: BTreeSet<i64> = recorded.iter().copied().collect();
    assert_eq!(ids.len(), recorded.len(), "an eval row was evaluated twice");
    let fed = fed_events(&mut rx);
    let rows = |split: &str| -> u64 {
        fed.iter()
            .filter(|f| f.split == split)
            .flat_map(|f| f.rows_per_shard.iter())
            .sum()
    };
    (ids, rows("train"), rows("eval"))
}

/// The `id`s of `df`'s rows, in the order Spark returns them.
async fn ids_of(df: &DataFrame) -> Vec<i64> {
    let mut ids = Vec::new();
    for b in df.select(["id"]).collect().await.expect("ids") {
        let c = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Int64).expect("cast");
        let c = c
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .expect("Int64");
        ids.extend(c.values().iter());
    }
    ids
}

/// One fit at a time records eval rows.
static RECORDING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_eval_split_by_a_column_does_not_move_with_the_rows_order() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let generated = rows(&spark, "").await;
    let shuffled = rows(&spark, "ORDER BY rand(5)").await;

    // The two orders really differ, and Spark's random split moves with
    // them (what eval_split_by is for).
    assert_ne!(ids_of(&generated).await, ids_of(&shuffled).await);
    let random_eval = |df: &DataFrame| {
        let parts = df
            .random_split(&[1.0 - FRACTION, FRACTION], SEED as i64)
            .expect("split");
        async move { ids_of(&parts[1]).await.into_iter().collect::<BTreeSet<_>>() }
    };
    assert_ne!(random_eval(&generated).await, random_eval(&shuffled).await);

    let (by_generated, train, eval) = eval_ids(job().eval_split_by("key"), &generated).await;
    assert_eq!(train + eval, ROWS as u64, "every row fed once");
    assert_eq!(by_generated.len() as u64, eval, "every eval row evaluated once");

    // Not persisted, the shuffled query runs once for the train rows and
    // once for the eval rows: each row still lands on exactly one side.
    let (by_shuffled, train_shuffled, eval_shuffled) =
        eval_ids(job().eval_split_by("key").persist(false), &shuffled).await;
    assert_eq!((train_shuffled, eval_shuffled), (train, eval));
    assert_eq!(by_shuffled, by_generated, "the eval rows moved with the order");

    // Executor push of the shuffled rows in 3 partitions: the same rows.
    let pushed = Feed::ExecutorPush(ExecutorPush::new());
    let (by_pushed, train_pushed, eval_pushed) =
        eval_ids(job().eval_split_by("key").feed(pushed), &shuffled.repartition(3)).await;
    assert_eq!((train_pushed, eval_pushed), (train, eval));
    assert_eq!(by_pushed, by_generated, "executor push split differently");

    // They are the rows the documented hash names: bucket
    // pmod(hash(CAST(seed AS BIGINT), key), 2^24) below 0.25 · 2^24.
    let named = spark
        .sql(&format!(
            "SELECT CAST(id AS BIGINT) AS id FROM ({}) \
             WHERE pmod(hash(CAST({SEED} AS BIGINT), key), 16777216) < 4194304",
            base_sql()
        ))
        .await
        .expect("sql");
    let named: BTreeSet<i64> = ids_of(&named).await.into_iter().collect();
    assert_eq!(by_generated, named);

    // About the fraction asked: with distinct keys each row is an eval row
    // with probability 0.25 independently of the others (the hash spreads
    // distinct values uniformly over its buckets), so the count is
    // binomial(4000, 0.25): mean 1000, standard deviation 27.4. Five
    // deviations (137 rows) are passed by chance once in ~10^6 seeds.
    let (mean, sd) = (
        ROWS as f64 * FRACTION,
        (ROWS as f64 * FRACTION * (1.0 - FRACTION)).sqrt(),
    );
    assert!(
        (eval as f64 - mean).abs() <= 5.0 * sd,
        "{eval} eval rows of {ROWS}, expected {mean} ± {}",
        5.0 * sd
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_column_that_cannot_split_is_refused_naming_it_before_anything_starts() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("spark");
    let df = spark
        .sql(
            "SELECT CAST(id AS DOUBLE) AS id, CAST(rand(3) AS DOUBLE) AS x1, CAST(id % 2 AS INT) AS y, \
             rand(4) AS score, CASE WHEN id % 97 = 5 THEN NULL ELSE CAST(id AS STRING) END AS maybe \
             FROM range(0, 1000, 1, 2)",
        )
        .await
        .expect("sql");
    let refused = |column: &'static str| {
        let df = df.clone();
        async move {
            let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
            let err = job()
                .eval_split_by(column)
                .events(tx)
                .build()
                .expect("job")
                .fit(&df)
                .await
                .expect_err(column);
            let mut started = false;
            while let Ok(e) = rx.try_recv() {
                started |= matches!(e, TrainingEvent::Started { .. } | TrainingEvent::Fed { .. });
            }
            assert!(!started, "{column}: the job started before the refusal");
            let text = err.to_string();
            assert!(text.contains(&format!("`{column}`")), "{text}");
            match err {
                JobError::SplitColumn { column: c, problem } if c == column => problem,
                other => panic!("{column}: {other:?}"),
            }
        }
    };
    assert!(matches!(refused("nope").await, SplitProblem::Missing { columns } if columns.contains("score")));
    assert_eq!(
        refused("score").await,
        SplitProblem::Type {
            found: arrow::datatypes::DataType::Float64
        }
    );
    // ids 5, 102, …, 970: 11 rows.
    assert_eq!(refused("maybe").await, SplitProblem::Nulls { count: 11 });

    let err = job()
        .eval_fraction(0.0)
        .eval_split_by("id")
        .build()
        .expect_err("no eval split to draw");
    assert!(
        matches!(
            err,
            JobError::Setting {
                setting: "eval_split_by",
                ..
            }
        ),
        "{err:?}"
    );
}

/// A linear classifier over `x1` alone that records the `id` of every row
/// it evaluates, on every rank (local agents share this process).
mod recorder {
    use std::sync::{Mutex, PoisonError};

    use arrow::datatypes::DataType;
    use burn::config::Config;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{Device, Tensor};
    use kindling_agent::error::AgentError;
    use kindling_agent::models::kindling_model::{Batch, Inputs, KindlingModel};

    static EVALUATED: Mutex<Vec<i64>> = Mutex::new(Vec::new());

    /// The ids recorded since the last call.
    pub fn take() -> Vec<i64> {
        std::mem::take(&mut *EVALUATED.lock().unwrap_or_else(PoisonError::into_inner))
    }

    #[derive(Config, Debug)]
    pub struct RecorderConfig {}

    #[derive(Module, Debug)]
    pub struct Recorder {
        linear: Linear,
    }

    impl KindlingModel for Recorder {
        type Config = RecorderConfig;

        fn init(_: &RecorderConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
            Ok(Recorder {
                linear: LinearConfig::new(inputs.float("x1")?, inputs.outputs()).init(device),
            })
        }

        fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
            Ok(self.linear.forward(batch.float("x1")?))
        }

        fn metric_sums(&self, _: &Tensor<2>, batch: &Batch<'_>) -> Result<Vec<(f64, f64)>, AgentError> {
            let id = batch.records().column_by_name("id").expect("an id column");
            let id = arrow::compute::cast(id, &DataType::Int64).expect("ids as integers");
            let id = id
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .expect("Int64");
            EVALUATED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(id.values().iter());
            Ok(Vec::new())
        }
    }
}
