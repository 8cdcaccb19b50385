//! Exact distributed evaluation and weighted training, end to end on a real
//! Spark Connect server and real agents: every epoch's eval metrics (over
//! both ranks' eval rows) and `TrainedModel::evaluate` equal scikit-learn's
//! on the same predictions, with a sample-weight column; class weights
//! train exactly as the same weights given per row; bad weights are refused
//! naming the column and the row.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Float64Type, Int32Type};
use futures::TryStreamExt;
use kindling::job::{JobError, ProgressMode, TrainedModel, TrainingJob, TrainingJobBuilder};
use kindling::{DataFrame, ModelSpec, OptimizerSpec, Report, SparkSession, Task};
use kindling_tests::spark::spark_remote;
use serde_json::{Value, json};

use crate::python_common;

const EVAL_FRACTION: f64 = 0.3;
const SEED: u64 = 3;

/// `rows` rows of `x1`, `x2` in [-1, 1), a row weight `w` in {0.5, 1.5,
/// 2.5} and `extra` (SQL over those) as further columns.
async fn data(spark: &SparkSession, rows: usize, extra: &str) -> DataFrame {
    spark
        .sql(&format!(
            "SELECT x1, x2, {extra} FROM (SELECT CAST(rand(11) * 2 - 1 AS DOUBLE) AS x1, \
             CAST(rand(12) * 2 - 1 AS DOUBLE) AS x2, rand(13) AS noise, \
             CAST(floor(rand(14) * 3) + 0.5 AS DOUBLE) AS w FROM range(0, {rows}, 1, 4))"
        ))
        .await
        .expect("sql")
}

fn job(task: Task) -> TrainingJobBuilder {
    TrainingJob::builder()
        .model(ModelSpec::Mlp { hidden: vec![16] })
        .task(task)
        .optimizer(OptimizerSpec::adam(0.02))
        .features(["x1", "x2"])
        .label("y")
        .num_slots(2)
        .batch_size(64)
        .epochs(3)
        .eval_fraction(EVAL_FRACTION)
        .seed(SEED)
        .local_mode(true)
        .progress(ProgressMode::Silent)
}

/// The eval rows `fit` held out: the same columns, split the same way (a
/// persisted query keeps its rows' order in the split).
fn eval_rows(df: &DataFrame, model: &TrainedModel) -> DataFrame {
    let weights = [1.0 - EVAL_FRACTION, EVAL_FRACTION];
    let mut parts = df
        .select(model.spec().columns())
        .random_split_in_order(&weights, SEED as i64)
        .expect("split");
    parts.pop().expect("eval part")
}

fn floats(batch: &RecordBatch, name: &str) -> Vec<f64> {
    let c = batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("column {name}"));
    match c.data_type() {
        arrow::datatypes::DataType::Float64 => c.as_primitive::<Float64Type>().values().to_vec(),
        arrow::datatypes::DataType::Float32 => c
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        arrow::datatypes::DataType::Int32 => c
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        t => panic!("{name}: {t}"),
    }
}

/// The model's predictions for `rows`, with their input columns.
async fn predictions(model: &TrainedModel, rows: &DataFrame) -> Vec<RecordBatch> {
    model
        .predict(rows)
        .await
        .expect("predict")
        .try_collect()
        .await
        .expect("predictions")
}

/// scikit-learn's metrics on the model's predictions for `rows`.
async fn sklearn(model: &TrainedModel, rows: &DataFrame) -> Value {
    let predicted = predictions(model, rows).await;
    let (mut y, mut w, mut out) = (Vec::new(), Vec::new(), Vec::new());
    for b in &predicted {
        y.extend(floats(b, "y"));
        w.extend(floats(b, "w"));
        match b.column_by_name("probabilities") {
            Some(p) => {
                let list = p.as_list::<i32>();
                for i in 0..list.len() {
                    let row = list.value(i);
                    out.push(json!(row.as_primitive::<Float32Type>().values().to_vec()));
                }
            }
            None => out.extend(floats(b, "prediction").into_iter().map(|v| json!([v]))),
        }
    }
    let task = match model.spec().task {
        Task::Classification { .. } => "classes",
        Task::Regression => "values",
    };
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let body = json!({
        "task": task, "y": y, "w": w, "top_k": model.spec().top_k,
        "proba": out, "pred": out,
    });
    std::fs::write(file.path(), body.to_string()).expect("write");
    python_common::run_script("sklearn_metrics.py", &json!({ "file": file.path() })).await
}

/// Every metric scikit-learn computed equals ours to 1e-6, in the last
/// epoch's history (the agents' distributed eval) and in `evaluate`.
fn assert_equal(reference: &Value, report: &Report, model: &TrainedModel) {
    let last = model.history().last().expect("an epoch");
    let names: Vec<&String> = reference.as_object().expect("object").keys().collect();
    assert!(names.len() >= 4, "{reference}");
    for name in names.into_iter().filter(|n| *n != "confusion") {
        let want = reference[name].as_f64().expect("number");
        let epoch = match name.as_str() {
            "eval_accuracy" => last.eval_accuracy,
            other => last.metrics.get(other).copied(),
        };
        let evaluated = report.metrics.get(name).copied();
        for (what, got) in [("evaluate", evaluated), ("epoch", epoch)] {
            let got = got.unwrap_or_else(|| panic!("{what} has no {name}: {:?}", report.metrics));
            assert!(
                (got - want).abs() <= 1e-6,
                "{what} {name}: {got} vs scikit-learn {want}"
            );
        }
    }
    if let Some(cm) = reference.get("confusion") {
        let ours = report.confusion.as_ref().expect("confusion matrix");
        let theirs: Vec<Vec<f64>> = serde_json::from_value(cm.clone()).expect("matrix");
        for (a, b) in ours.iter().flatten().zip(theirs.iter().flatten()) {
            assert!((a - b).abs() < 1e-6, "confusion {ours:?} vs {theirs:?}");
        }
    }
}

/// Three classes, rows weighted by `w`, label noise: accuracy, log loss,
/// macro/micro precision, recall and F1, top-2 accuracy and the confusion
/// matrix, over the eval rows of both ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn class_metrics_equal_scikit_learns_on_the_same_weighted_predictions() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = data(
        &spark,
        3000,
        "w, CAST(CASE WHEN noise < 0.15 THEN floor(noise * 20) % 3 \
         WHEN x1 + x2 > 0.3 THEN 2 WHEN x1 - x2 > 0.2 THEN 1 ELSE 0 END AS INT) AS y",
    )
    .await;
    let model = job(Task::Classification { num_classes: 3 })
        .sample_weight("w")
        .top_k(2)
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    let rows = eval_rows(&df, &model);
    let report = model.evaluate(&rows).await.expect("evaluate");
    assert_eq!(report.rows as i64, rows.count().await.expect("count"));
    let reference = sklearn(&model, &rows).await;
    assert_equal(&reference, &report, &model);
    let accuracy = report.get(kindling::Metric::EvalAccuracy).expect("accuracy");
    assert!(
        accuracy > 0.5 && accuracy < 1.0,
        "a model that learned, with noise: {accuracy}"
    );
}

/// Two classes: AUC-ROC and average precision as well, exact over every
/// rank's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_auc_and_pr_auc_equal_scikit_learns() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = data(
        &spark,
        2000,
        "w, CAST(CASE WHEN noise < 0.2 THEN noise < 0.1 ELSE x1 + 2 * x2 > 0.1 END AS INT) AS y",
    )
    .await;
    let model = job(Task::Classification { num_classes: 2 })
        .sample_weight("w")
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    let rows = eval_rows(&df, &model);
    let report = model.evaluate(&rows).await.expect("evaluate");
    let reference = sklearn(&model, &rows).await;
    assert!(reference.get("eval_auc_roc").is_some());
    assert_equal(&reference, &report, &model);
}

/// Regression: RMSE, MAE, R² and MAPE, weighted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn regression_metrics_equal_scikit_learns() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = data(&spark, 2000, "w, 3 + 2 * x1 - x2 + 0.2 * noise AS y").await;
    let model = job(Task::Regression)
        .sample_weight("w")
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    let rows = eval_rows(&df, &model);
    let report = model.evaluate(&rows).await.expect("evaluate");
    let reference = sklearn(&model, &rows).await;
    assert_equal(&reference, &report, &model);
}

/// `class_weights` [1, 3, 0.5] train exactly as a sample-weight column
/// holding each row's class weight — and differently from no weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn class_weights_train_as_the_same_weights_per_row() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let label = "CAST(CASE WHEN x1 + x2 > 0.3 THEN 2 WHEN x1 - x2 > 0.2 THEN 1 ELSE 0 END AS INT)";
    let df = data(
        &spark,
        1500,
        &format!("{label} AS y, CASE {label} WHEN 0 THEN 1.0D WHEN 1 THEN 3.0D ELSE 0.5D END AS cw"),
    )
    .await;
    let three = Task::Classification { num_classes: 3 };
    let fit = async |builder: TrainingJobBuilder| builder.build().expect("job").fit(&df).await.expect("fit");
    let by_class = fit(job(three).class_weights([1.0, 3.0, 0.5])).await;
    let by_row = fit(job(three).sample_weight("cw")).await;
    let plain = fit(job(three)).await;
    let losses = |m: &TrainedModel| -> Vec<f64> { m.history().iter().map(|e| e.train_loss).collect() };
    assert_eq!(losses(&by_class), losses(&by_row), "the same weighted loss");
    assert_eq!(
        by_class.weights().expect("weights"),
        by_row.weights().expect("weights"),
        "the same weights after 3 epochs"
    );
    assert_ne!(losses(&by_class), losses(&plain), "weights change training");
}

/// A negative weight fails the job naming the column, the row and the
/// value; a missing weight column is named before anything starts; class
/// weights of the wrong length are refused when the job is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_weights_are_refused_naming_the_column() {
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = data(
        &spark,
        400,
        "CASE WHEN x1 > 0.9 THEN -2.0D ELSE w END AS w, CAST(x1 > 0 AS INT) AS y",
    )
    .await;
    let two = Task::Classification { num_classes: 2 };
    let err = job(two)
        .sample_weight("w")
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect_err("negative");
    let msg = err.to_string();
    assert!(
        msg.contains("sample-weight column `w` has the negative weight -2 at row"),
        "{msg}"
    );
    let err = job(two)
        .sample_weight("weight")
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect_err("missing");
    assert!(matches!(err, JobError::Spark(_) | JobError::Data(_)), "{err:?}");
    assert!(err.to_string().contains("weight"), "{err}");
    let err = job(two)
        .class_weights([1.0])
        .build()
        .expect_err("length")
        .to_string();
    assert!(
        err.contains("`class_weights`: needs one weight per class: 2, got 1"),
        "{err}"
    );
    let err = job(two)
        .class_weights([1.0, -1.0])
        .build()
        .expect_err("negative")
        .to_string();
    assert!(
        err.contains("`class_weights[1]`: must be a finite number > 0, got -1"),
        "{err}"
    );
    let err = job(Task::Regression)
        .class_weights([1.0])
        .build()
        .expect_err("task")
        .to_string();
    assert!(err.contains("class weights need a classification task"), "{err}");
}

/// A linear classifier of one's own that adds the Brier score (the mean
/// over rows of Σ_c (p_c − [c = y])²) and the mean top probability as
/// metrics of its own, through sums Kindling adds over the ranks.
mod briered {
    use burn::config::Config;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::activation::softmax;
    use burn::tensor::{Device, Tensor};
    use kindling_agent::error::AgentError;
    use kindling_agent::models::kindling_model::{Batch, Inputs, KindlingModel, Targets};

    #[derive(Config, Debug)]
    pub struct BrieredConfig {}

    #[derive(Module, Debug)]
    pub struct Briered {
        linear: Linear,
    }

    impl KindlingModel for Briered {
        type Config = BrieredConfig;
        const METRICS: &'static [&'static str] = &["brier", "confidence"];

        fn init(_: &BrieredConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
            Ok(Briered {
                linear: LinearConfig::new(inputs.float_width(), inputs.outputs()).init(device),
            })
        }

        fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
            Ok(self.linear.forward(batch.features()?))
        }

        fn metric_sums(&self, output: &Tensor<2>, batch: &Batch<'_>) -> Result<Vec<(f64, f64)>, AgentError> {
            let Targets::Classes(labels) = batch.targets()? else {
                return Ok(Vec::new());
            };
            let [n, classes] = output.dims();
            let p = softmax(output.clone(), 1);
            let onehot = labels.one_hot(classes).float();
            let brier = (p.clone() - onehot).powf_scalar(2.0).sum().into_scalar::<f32>() as f64;
            let confidence = p.max_dim(1).sum().into_scalar::<f32>() as f64;
            Ok(vec![(brier, n as f64), (confidence, n as f64)])
        }
    }
}

/// A model's own metrics are summed over both ranks' eval rows: the epoch's
/// Brier score equals the one computed from the final model's predictions
/// on the same rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_models_own_metrics_are_exact_over_all_ranks() {
    use kindling::model::ModelRegistry;
    let spark = SparkSession::connect(&spark_remote()).await.expect("connect");
    let df = data(
        &spark,
        1500,
        "CAST(CASE WHEN x1 + x2 > 0.3 THEN 2 WHEN x1 - x2 > 0.2 THEN 1 ELSE 0 END AS INT) AS y",
    )
    .await;
    let model = job(Task::Classification { num_classes: 3 })
        .model(ModelSpec::custom("briered", &briered::BrieredConfig {}).expect("config"))
        .models(ModelRegistry::builtin().with::<briered::Briered>("briered"))
        .build()
        .expect("job")
        .fit(&df)
        .await
        .expect("fit");
    let rows = eval_rows(&df, &model);
    let predicted = predictions(&model, &rows).await;
    let (mut brier, mut confidence, mut n) = (0f64, 0f64, 0f64);
    for b in &predicted {
        let y = floats(b, "y");
        let list = b
            .column_by_name("probabilities")
            .expect("probabilities")
            .as_list::<i32>();
        for (i, &label) in y.iter().enumerate() {
            let row = list.value(i);
            let p = row.as_primitive::<Float32Type>().values();
            brier += p
                .iter()
                .enumerate()
                .map(|(c, &v)| (v as f64 - if c == label as usize { 1.0 } else { 0.0 }).powi(2))
                .sum::<f64>();
            confidence += p.iter().fold(0f32, |m, &v| m.max(v)) as f64;
            n += 1.0;
        }
    }
    let last = model.history().last().expect("epoch");
    let got = |name: &str| {
        *last
            .metrics
            .get(name)
            .unwrap_or_else(|| panic!("{name}: {:?}", last.metrics))
    };
    assert!(
        (got("eval_brier") - brier / n).abs() < 1e-5,
        "{} vs {}",
        got("eval_brier"),
        brier / n
    );
    assert!((got("eval_confidence") - confidence / n).abs() < 1e-5);
}
