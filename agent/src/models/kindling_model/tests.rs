use std::sync::Arc;

use arrow::array::{Int64Array, ListArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::{Device, Tensor};
use kindling_schemas::schema::{FeatureLayout, StreamKind, validate};
use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};

use super::*;
use crate::optim::FlatOptimizer;

/// A class from a categorical id and a bag of token ids: an embedding each,
/// the tokens mean-pooled over their mask, then one dense layer.
#[derive(Module, Debug)]
struct Bag {
    city: Embedding,
    tokens: Embedding,
    head: Linear,
}

#[derive(Config, Debug)]
struct BagConfig {
    #[config(default = 4)]
    dim: usize,
}

impl KindlingModel for Bag {
    type Config = BagConfig;

    fn validate(config: &BagConfig, _: &JobSpec) -> Result<(), ConfigError> {
        match config.dim {
            0 => Err(ConfigError::new("dim", "must be at least 1")),
            _ => Ok(()),
        }
    }

    fn init(config: &BagConfig, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        let (vocabulary, _) = inputs.sequence("tokens")?;
        Ok(Bag {
            city: EmbeddingConfig::new(inputs.vocabulary("city")?, config.dim).init(device),
            tokens: EmbeddingConfig::new(vocabulary, config.dim).init(device),
            head: LinearConfig::new(2 * config.dim, inputs.outputs()).init(device),
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        let city: Tensor<2> = self
            .city
            .forward(batch.ids("city")?.unsqueeze_dim(1))
            .squeeze_dim(1);
        let seq = batch.sequence("tokens")?;
        let mask = seq.mask.float().unsqueeze_dim::<3>(2);
        let summed = (self.tokens.forward(seq.ids) * mask)
            .sum_dim(1)
            .squeeze_dim::<2>(1);
        let counts = seq.lengths.float().clamp_min(1.0).unsqueeze_dim(1);
        Ok(self.head.forward(Tensor::cat(vec![city, summed / counts], 1)))
    }
}

fn spec(dim: usize) -> JobSpec {
    JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .model(ModelSpec::custom("bag", &BagConfig::new().with_dim(dim)).expect("config"))
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["city", "tokens"])
        .categorical("city", 3)
        .sequence("tokens", 6, 4)
        .label("y")
        .build()
        .expect("spec")
}

/// 60 rows: the class is 1 when token 5 is in the row's bag (city is noise).
fn rows() -> RecordBatch {
    let n = 60i64;
    let tokens: Vec<Vec<i64>> = (0..n)
        .map(|i| {
            (0..(i % 4 + 1))
                .map(|k| if k == 0 && i % 2 == 1 { 5 } else { (i + k) % 5 })
                .collect()
        })
        .collect();
    let y: Vec<i64> = tokens.iter().map(|t| i64::from(t.contains(&5))).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("city", DataType::Int64, false),
        Field::new(
            "tokens",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            false,
        ),
        Field::new("y", DataType::Int64, false),
    ]));
    let lists = ListArray::from_iter_primitive::<Int64Type, _, _>(
        tokens.into_iter().map(|t| Some(t.into_iter().map(Some))),
    );
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 3))),
            Arc::new(lists),
            Arc::new(Int64Array::from(y)),
        ],
    )
    .expect("batch")
}

fn layout(spec: &JobSpec) -> FeatureLayout {
    validate(&rows().schema(), spec, StreamKind::Train).expect("layout")
}

/// A model after [`train`], with its flat weights and its mean loss on
/// `records` before the first step and after the last.
struct Trained {
    model: Box<dyn AnyModel>,
    weights: Vec<f32>,
    first: f32,
    last: f32,
}

/// `steps` full-batch steps on `records` through the erased path, as the
/// trainer takes them on one rank: gradient sums, the flat optimizer step
/// over the rows, the weights written back.
fn train(
    mut model: Box<dyn AnyModel>,
    records: &RecordBatch,
    layout: &FeatureLayout,
    spec: &JobSpec,
    steps: usize,
) -> Trained {
    let device = Device::flex().autodiff();
    let mut weights = model.flat_weights();
    assert_eq!(weights.len(), model.num_params());
    let mut optim = FlatOptimizer::new(&spec.optimizer, weights.len());
    let loss_of = |m: &dyn AnyModel| {
        let buf = m
            .gradients(&Batch::new(records, layout, spec, &device))
            .expect("step");
        assert_eq!(buf.len(), m.num_params() + 3, "gradients, rows, weight, loss sum");
        (buf[buf.len() - 1] / buf[buf.len() - 2], buf)
    };
    let (first, _) = loss_of(model.as_ref());
    for _ in 0..steps {
        let (_, mut buf) = loss_of(model.as_ref());
        let rows = buf[buf.len() - 2];
        buf.truncate(buf.len() - 3);
        optim.step(&mut weights, &buf, 1.0 / rows);
        model = model.load_flat(&weights);
    }
    let (last, _) = loss_of(model.as_ref());
    Trained {
        model,
        weights,
        first,
        last,
    }
}

#[test]
fn sequences_are_padded_to_max_len_with_a_mask_and_lengths() {
    let spec = spec(4);
    let (records, layout, device) = (rows().slice(0, 3), layout(&spec), Device::flex());
    let seq = Batch::new(&records, &layout, &spec, &device)
        .sequence("tokens")
        .expect("sequence");
    assert_eq!(seq.ids.dims(), [3, 4]);
    let ids = seq
        .ids
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .expect("ids");
    assert_eq!(ids, [0, 0, 0, 0, 5, 2, 0, 0, 2, 3, 4, 0]);
    let lengths = seq
        .lengths
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .expect("lengths");
    assert_eq!(lengths, [1, 2, 3]);
    let mask = seq.mask.into_data().try_to_vec::<bool>().expect("mask");
    assert_eq!(mask.iter().filter(|m| **m).count(), 6);
    assert!(mask[4] && mask[5] && !mask[6]);
}

#[test]
fn a_model_of_ones_own_trains_through_the_erased_path() {
    let spec = spec(4);
    let layout = layout(&spec);
    let models = ModelRegistry::builtin().with::<Bag>("bag");
    models.check(&spec).expect("valid config");
    let model = models.build_seeded(&spec, &layout, 3).expect("build");
    let records = rows();
    let Trained {
        model,
        weights,
        first,
        last,
    } = train(model, &records, &layout, &spec, 60);
    assert!(last < first * 0.2, "loss {first} → {last}");
    // The trained weights survive the model table and the record bytes.
    let table = model.to_arrow().expect("table");
    let names: Vec<String> = table
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .expect("names")
        .iter()
        .flatten()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        names,
        ["city.weight", "tokens.weight", "head.weight", "head.bias"]
    );
    let fresh = models.build(&spec, &layout, &Device::flex()).expect("build");
    assert_eq!(
        fresh.from_arrow(&table).expect("load").flat_weights(),
        model.flat_weights()
    );
    let bytes = model.to_record_bytes().expect("bytes");
    let fresh = models.build(&spec, &layout, &Device::flex()).expect("build");
    assert_eq!(
        fresh.from_record_bytes(bytes).expect("load").flat_weights(),
        weights
    );
}

#[test]
fn the_registry_names_the_missing_model_the_bad_field_and_the_wrong_input() {
    let models = ModelRegistry::builtin().with::<Bag>("bag");
    let err = ModelRegistry::builtin()
        .check(&spec(4))
        .expect_err("not registered");
    assert!(
        err.to_string().contains("`bag` is not registered") && err.to_string().contains("cnn, linear, mlp"),
        "{err}"
    );
    let err = models.check(&spec(0)).expect_err("dim 0");
    assert!(
        matches!(&err, AgentError::Model(ModelError::Config { model, field, .. }) if model == "bag" && field == "dim"),
        "{err}"
    );
    let mut bad_json = spec(4);
    bad_json.model = ModelSpec::Custom {
        name: "bag".into(),
        config: serde_json::json!({"dim": "four"}),
    };
    let err = models.check(&bad_json).expect_err("not a number");
    assert!(err.to_string().contains("model `bag`"), "{err}");
    // A model asking a column for a kind the job does not declare.
    let mut undeclared = spec(4);
    undeclared.inputs.remove("city");
    let schema = Schema::new(vec![
        Field::new("city", DataType::Int64, false),
        Field::new(
            "tokens",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            false,
        ),
        Field::new("y", DataType::Int64, false),
    ]);
    undeclared.inputs.remove("tokens");
    let layout = validate(&schema, &undeclared, StreamKind::Train);
    assert!(layout.is_err(), "an undeclared list column is not a float input");
    let mut city_float = spec(4);
    city_float.inputs.remove("city");
    let layout = validate(&rows().schema(), &city_float, StreamKind::Train).expect("city as a float");
    let err = models
        .build(&city_float, &layout, &Device::flex())
        .expect_err("city is not categorical");
    assert!(
        matches!(&err, AgentError::Model(ModelError::InputKind { column, .. }) if column == "city"),
        "{err}"
    );
    // The built-ins read floats only.
    let mut mlp = spec(4);
    mlp.model = ModelSpec::Mlp { hidden: vec![4] };
    let err = models.check(&mlp).expect_err("categorical input to an MLP");
    assert!(err.to_string().contains("inputs.city"), "{err}");
}

/// Several regression targets: a `FixedSizeList<Float32>` label of 2 values
/// per row trains a built-in MLP with 2 outputs, and the predictions are a
/// list of 2 values per row.
#[test]
fn several_targets_train_and_predict_as_lists() {
    use arrow::array::{Array, AsArray, FixedSizeListArray, Float32Array};
    use arrow::datatypes::Float32Type;
    let spec = JobSpec::builder()
        .task(Task::Regression)
        .targets(2)
        .model(ModelSpec::Mlp { hidden: vec![8] })
        .optimizer(OptimizerSpec::adam(0.05))
        .features(["a", "b"])
        .label("y")
        .build()
        .expect("spec");
    let n = 64;
    let a: Vec<f32> = (0..n).map(|i| (i % 8) as f32 / 4.0 - 1.0).collect();
    let b: Vec<f32> = (0..n).map(|i| (i / 8) as f32 / 4.0 - 1.0).collect();
    let y: Vec<f32> = a.iter().zip(&b).flat_map(|(a, b)| [a + b, a - b]).collect();
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Float32, false),
        Field::new("b", DataType::Float32, false),
        Field::new("y", DataType::FixedSizeList(item.clone(), 2), false),
    ]));
    let records = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Float32Array::from(a)),
            Arc::new(Float32Array::from(b)),
            Arc::new(FixedSizeListArray::new(
                item,
                2,
                Arc::new(Float32Array::from(y)),
                None,
            )),
        ],
    )
    .expect("batch");
    let layout = validate(&records.schema(), &spec, StreamKind::Train).expect("layout");
    assert_eq!(layout.outputs, 2);
    let models = ModelRegistry::builtin();
    let model = models.build_seeded(&spec, &layout, 1).expect("build");
    let Trained {
        model, first, last, ..
    } = train(model, &records, &layout, &spec, 150);
    assert!(last < first * 0.1, "loss {first} → {last}");
    let plain = Device::flex();
    let output = model
        .valid()
        .forward(&Batch::new(&records, &layout, &spec, &plain))
        .expect("forward");
    let columns = model.predictions(output, spec.task).expect("predictions");
    assert_eq!(columns.len(), 1);
    let (field, column) = &columns[0];
    assert_eq!(field.name(), "prediction");
    let list = column.as_list::<i32>();
    assert_eq!((list.len(), list.value_length(0)), (n, 2));
    let first_row = list.value(0);
    let first_row = first_row.as_primitive::<Float32Type>().values();
    assert!(
        (first_row[0] - -2.0).abs() < 0.3 && first_row[1].abs() < 0.3,
        "{first_row:?}"
    );
}

#[test]
fn a_model_over_the_parameter_cap_is_refused_before_its_weights_exist() {
    let layout = layout(&spec(4));
    // Bag's embeddings and its 2-class head: 13 × dim + 2 parameters.
    let huge = spec(30_000_000);
    let started = std::time::Instant::now();
    let Err(err) = ModelRegistry::builtin()
        .with::<Bag>("bag")
        .build_seeded(&huge, &layout, 1)
    else {
        panic!("390 M parameters over the default cap were built");
    };
    match &err {
        AgentError::Model(ModelError::TooLarge { model, params, cap }) => {
            assert_eq!(
                (model.as_str(), *params, *cap),
                ("bag", 390_000_002, DEFAULT_MAX_PARAMS)
            );
        }
        other => panic!("{other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("--max-model-params") && text.contains("250000000"),
        "{text}"
    );
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::ResourceExhausted);
    // Counted, not drawn: 1.5 GB of weights would take far longer to fill.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));

    // And before any row: `check` (start_job) counts it the same way.
    assert!(matches!(
        ModelRegistry::builtin().with::<Bag>("bag").check(&huge),
        Err(AgentError::Model(ModelError::TooLarge {
            params: 390_000_002,
            ..
        }))
    ));

    let capped = ModelRegistry::builtin().with::<Bag>("bag").with_max_params(54);
    assert!(
        capped.build_seeded(&spec(4), &layout, 1).is_ok(),
        "54 parameters: at the cap"
    );
    assert!(matches!(
        capped.build(&spec(5), &layout, &Device::flex()).err(),
        Some(AgentError::Model(ModelError::TooLarge {
            params: 67,
            cap: 54,
            ..
        }))
    ));
}

/// The weighted loss is `Σ wᵢ·lᵢ / Σ wᵢ` of each row's loss, computed here
/// in f64 from the definitions: softmax cross-entropy and squared error
/// (averaged over a row's targets).
#[test]
fn weighted_losses_follow_the_definition() {
    let device = Device::default();
    let logits = [
        [2.0f32, -1.0, 0.5],
        [0.1, 0.2, 0.3],
        [-3.0, 1.0, 4.0],
        [0.0, 0.0, 0.0],
    ];
    let labels = [0i64, 2, 1, 1];
    let weights = [1.0f32, 0.5, 3.0, 0.0];
    let output = Tensor::<2>::from_data(burn::tensor::TensorData::new(logits.concat(), [4, 3]), &device);
    let targets = Targets::Classes(Tensor::from_data(
        burn::tensor::TensorData::new(labels.to_vec(), [4]),
        &device,
    ));
    let w = Tensor::<1>::from_data(burn::tensor::TensorData::new(weights.to_vec(), [4]), &device);
    let task = Task::Classification { num_classes: 3 };
    let got = weighted_task_loss(task, output.clone(), targets, Some(w.clone()), &device).into_scalar::<f32>()
        as f64;
    let (mut sum, mut total) = (0f64, 0f64);
    for ((row, &y), &wi) in logits.iter().zip(&labels).zip(&weights) {
        let lse = row.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
        sum += wi as f64 * (lse - row[y as usize] as f64);
        total += wi as f64;
    }
    assert!(
        (got - sum / total).abs() < 1e-6,
        "cross-entropy {got} vs {}",
        sum / total
    );

    let values = [
        [1.0f32, 2.0, 3.0],
        [0.5, 0.5, 0.5],
        [4.0, 0.0, -1.0],
        [9.0, 9.0, 9.0],
    ];
    let t = Tensor::<2>::from_data(burn::tensor::TensorData::new(values.concat(), [4, 3]), &device);
    let got = weighted_task_loss(Task::Regression, output, Targets::Values(t), Some(w), &device)
        .into_scalar::<f32>() as f64;
    let mut sum = 0f64;
    for ((row, target), &wi) in logits.iter().zip(&values).zip(&weights) {
        let se: f64 = row
            .iter()
            .zip(target)
            .map(|(&a, &b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
            / 3.0;
        sum += wi as f64 * se;
    }
    assert!(
        (got - sum / total).abs() < 1e-5,
        "squared error {got} vs {}",
        sum / total
    );
}
