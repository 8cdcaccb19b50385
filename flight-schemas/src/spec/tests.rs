//! The job spec's validation, JSON form and summary.

use super::*;

fn base() -> JobSpecBuilder {
    JobSpec::builder()
        .task(Task::Classification { num_classes: 2 })
        .features(["a", "b"])
        .label("y")
}

#[test]
fn json_round_trip_keeps_every_field() {
    let spec = base()
        .model(ModelSpec::Mlp { hidden: vec![16, 8] })
        .optimizer(OptimizerSpec::sgd_momentum(0.1, 0.9))
        .epochs(3)
        .batch_size(32)
        .num_slots(4)
        .use_gpu(true)
        .precision(Precision::Bf16)
        .seed(7)
        .build()
        .expect("valid");
    let back = JobSpec::from_json(&spec.to_json()).expect("parses");
    assert_eq!(back, spec);
    assert!(
        spec.to_json().contains(r#""precision":"bf16""#),
        "{}",
        spec.to_json()
    );
    let cnn = base()
        .features(["img"])
        .model(ModelSpec::Cnn {
            channels: 1,
            height: 8,
            width: 8,
            conv: vec![4, 8],
            dense: 16,
        })
        .build()
        .expect("valid cnn");
    assert_eq!(JobSpec::from_json(&cnn.to_json()).expect("parses"), cnn);
    let custom = base()
        .model(ModelSpec::custom("tab-net", &serde_json::json!({"embedding": 8})).expect("custom"))
        .categorical("a", 12)
        .sequence("b", 100, 20)
        .build()
        .expect("valid custom");
    let back = JobSpec::from_json(&custom.to_json()).expect("parses");
    assert_eq!(back, custom);
    assert_eq!(
        back.inputs["b"],
        InputType::Sequence {
            vocabulary: 100,
            max_len: 20
        }
    );
}

#[test]
fn errors_name_the_field() {
    let cases: Vec<(JobSpecBuilder, &str)> = vec![
        (base().features(Vec::<String>::new()), "features"),
        (base().features(["a", "a"]), "features[1]"),
        // bf16 runs on the GPU only.
        (base().precision(Precision::Bf16), "precision"),
        (base().features(["a", "y"]), "features[1]"),
        (base().label(""), "label"),
        (base().epochs(0), "epochs"),
        (base().batch_size(0), "batch_size"),
        (base().num_slots(0), "num_slots"),
        (
            base().optimizer(OptimizerSpec::adam(f64::NAN)),
            "optimizer.learning_rate",
        ),
        (
            base().task(Task::Classification { num_classes: 1 }),
            "task.num_classes",
        ),
        (base().loss(Loss::Mse), "loss"),
        (base().model(ModelSpec::Mlp { hidden: vec![] }), "model.hidden"),
        (
            base().model(ModelSpec::Mlp { hidden: vec![4, 0] }),
            "model.hidden[1]",
        ),
        (
            base().model(ModelSpec::Cnn {
                channels: 1,
                height: 4,
                width: 4,
                conv: vec![2, 2, 2],
                dense: 4,
            }),
            "model.conv[2]",
        ),
        (base().targets(2), "targets"),
        (
            base().optimizer(OptimizerSpec::adamw(1e-3, -0.1)),
            "optimizer.weight_decay",
        ),
        (
            base().optimizer(OptimizerSpec::Sgd {
                learning_rate: 0.1,
                momentum: 0.0,
                nesterov: true,
                weight_decay: 0.0,
            }),
            "optimizer.nesterov",
        ),
        (base().no_weight_decay(["bias"]), "no_weight_decay"),
        (
            base().epochs(2).schedule(Schedule::Cosine {
                warmup_epochs: 3.0,
                min_factor: 0.0,
            }),
            "schedule.warmup_epochs",
        ),
        (
            base().epochs(4).schedule(Schedule::Step {
                warmup_epochs: 1.0,
                every_epochs: 4.0,
                gamma: 0.5,
            }),
            "schedule.every_epochs",
        ),
        (
            base().task(Task::Regression).schedule(Schedule::Plateau {
                monitor: Metric::EvalAccuracy,
                factor: 0.5,
                patience: 1,
                min_delta: 0.0,
                min_factor: 0.0,
            }),
            "schedule.monitor",
        ),
        (base().clip(GradientClip::Norm { max_norm: 0.0 }), "clip.max_norm"),
        (base().accumulate(0), "accumulate"),
        (
            base()
                .task(Task::Regression)
                .early_stopping(EarlyStopping::new(Metric::EvalAccuracy, 2)),
            "early_stopping.monitor",
        ),
        (
            base().early_stopping(EarlyStopping::new(Metric::EvalLoss, 0)),
            "early_stopping.patience",
        ),
        (base().categorical("z", 10), "inputs.z"),
        (base().categorical("y", 10), "inputs.y"),
        (base().categorical("a", 0), "inputs.a.vocabulary"),
        (base().sequence("b", 10, 0), "inputs.b.max_len"),
        (
            base().model(ModelSpec::Custom {
                name: "My Net".into(),
                config: serde_json::json!({}),
            }),
            "model.name",
        ),
        (
            base().model(ModelSpec::Custom {
                name: "net".into(),
                config: serde_json::json!([1, 2]),
            }),
            "model.config",
        ),
    ];
    for (builder, field) in cases {
        let err = builder.build().expect_err(field);
        assert_eq!(err.field, field, "{err}");
        assert!(err.to_string().contains(field));
    }
}

#[test]
fn training_options_round_trip_and_old_specs_parse_unchanged() {
    let spec = base()
        .optimizer(OptimizerSpec::adamw(3e-3, 0.05))
        .no_weight_decay(["bias", "*norm*"])
        .epochs(10)
        .schedule(Schedule::Cosine {
            warmup_epochs: 0.5,
            min_factor: 0.01,
        })
        .clip(GradientClip::Norm { max_norm: 1.0 })
        .accumulate(4)
        .early_stopping(EarlyStopping::new(Metric::EvalAccuracy, 3))
        .build()
        .expect("valid");
    assert_eq!(JobSpec::from_json(&spec.to_json()).expect("parses"), spec);
    assert_eq!(
        spec.summary(),
        "linear, 2-class · adamw lr 0.003 · weight decay 0.05 (not bias, *norm*) · cosine after 0.5 \
         warmup epochs · clip norm 1 · 10 epochs of batch 64 × 4 accumulated on 1 slot(s) · early \
         stopping on eval_accuracy (patience 3)"
    );
    // The defaults are not written, so a spec without options reads as before.
    let plain = base().build().expect("valid");
    let json = plain.to_json();
    for absent in [
        "schedule",
        "clip",
        "accumulate",
        "early_stopping",
        "no_weight_decay",
    ] {
        assert!(!json.contains(absent), "{absent} in {json}");
    }
}

#[test]
fn from_json_rejects_unknown_model_and_invalid_values() {
    let err = JobSpec::from_json(r#"{"model":{"kind":"transformer"}}"#).expect_err("unknown");
    assert_eq!(err.field, "<json>");
    let mut v: serde_json::Value =
        serde_json::from_str(&base().build().expect("ok").to_json()).expect("json");
    v["epochs"] = 0.into();
    assert_eq!(
        JobSpec::from_json(&v.to_string()).expect_err("epochs").field,
        "epochs"
    );
}

#[test]
fn a_dataset_and_its_readers_say_so_and_cannot_be_both() {
    let mut dataset = base().build().expect("valid");
    assert_eq!(dataset.kind(), JobKind::Train);
    dataset.set_kind(JobKind::Dataset);
    assert!(dataset.holds_rows && dataset.rows_from.is_none());
    assert_eq!(dataset.kind(), JobKind::Dataset);
    dataset.validate().expect("a dataset is a valid spec");
    assert!(
        dataset.summary().starts_with("a dataset: holds its rows"),
        "{}",
        dataset.summary()
    );
    let mut reader = base().build().expect("valid");
    reader.set_kind(JobKind::Trial {
        dataset: "search-data",
    });
    assert_eq!(reader.rows_from.as_deref(), Some("search-data"));
    assert_eq!(
        reader.kind(),
        JobKind::Trial {
            dataset: "search-data"
        }
    );
    assert_eq!(JobSpec::from_json(&reader.to_json()).expect("parses"), reader);
    assert!(reader.summary().ends_with("on the rows of dataset `search-data`"));
    reader.holds_rows = true;
    assert_eq!(reader.validate().expect_err("both").field, "rows_from");
    reader.holds_rows = false;
    reader.rows_from = Some("../x".into());
    assert_eq!(reader.validate().expect_err("a bad id").field, "rows_from");
    // Neither is written when unset: older agents read the spec as before.
    let json = base().build().expect("valid").to_json();
    assert!(
        !json.contains("rows_from") && !json.contains("holds_rows"),
        "{json}"
    );
}

#[test]
fn an_eval_split_by_a_column_is_recorded_and_checked() {
    let spec = base()
        .eval_split(EvalSplit::new("user_id", 0.25))
        .build()
        .expect("valid");
    assert!(
        spec.to_json()
            .contains(r#""eval_split":{"by":"user_id","fraction":0.25}"#),
        "{}",
        spec.to_json()
    );
    assert_eq!(JobSpec::from_json(&spec.to_json()).expect("parses"), spec);
    // A quarter of 2^24 buckets; a fraction that is not a whole number of
    // buckets rounds to the nearest.
    assert_eq!(EvalSplit::new("k", 0.25).eval_buckets(), 1 << 22);
    assert_eq!(EvalSplit::new("k", 0.1).eval_buckets(), 1_677_722);
    for (split, field) in [
        (EvalSplit::new(" ", 0.2), "eval_split.by"),
        (EvalSplit::new("k", 0.0), "eval_split.fraction"),
        (EvalSplit::new("k", 0.9), "eval_split.fraction"),
        (EvalSplit::new("k", f64::NAN), "eval_split.fraction"),
    ] {
        let err = base().eval_split(split).build().expect_err(field);
        assert_eq!(err.field, field, "{err}");
    }
    // Not written when unset: older agents read the spec as before.
    assert!(!base().build().expect("valid").to_json().contains("eval_split"));
}
