//! The flat optimizer against burn's optimizers and its own invariants.

use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};

use super::FlatOptimizer;

/// Gradients at step `s`: of a quadratic, plus a drift per step.
fn grads(w: &[f32], s: usize) -> Vec<f32> {
    w.iter()
        .enumerate()
        .map(|(i, x)| 2.0 * x + (i + s) as f32 * 0.01)
        .collect()
}

fn run(spec: &OptimizerSpec, steps: usize) -> (Vec<f32>, FlatOptimizer) {
    let mut w: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut opt = FlatOptimizer::new(spec, w.len());
    for s in 0..steps {
        let g = grads(&w, s);
        opt.step(&mut w, &g, 0.5);
    }
    (w, opt)
}

pub(super) fn every_rule() -> Vec<OptimizerSpec> {
    vec![
        OptimizerSpec::adam(0.05),
        OptimizerSpec::adam(0.05).with_weight_decay(0.1),
        OptimizerSpec::adamw(0.05, 0.1),
        OptimizerSpec::sgd_momentum(0.1, 0.9),
        OptimizerSpec::sgd(0.1),
        OptimizerSpec::Sgd {
            learning_rate: 0.1,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.01,
        },
        OptimizerSpec::rmsprop(0.01),
        OptimizerSpec::RmsProp {
            learning_rate: 0.01,
            alpha: 0.9,
            epsilon: 1e-5,
            momentum: 0.5,
            centered: true,
            weight_decay: 0.05,
        },
    ]
}

#[test]
fn every_rule_reduces_a_quadratic_and_resumes_exactly_from_bytes() {
    for spec in every_rule() {
        let norm = |w: &[f32]| w.iter().map(|x| x * x).sum::<f32>();
        let (start, _) = run(&spec, 0);
        let (ten, opt) = run(&spec, 10);
        assert!(
            norm(&ten) < norm(&start) * 0.8,
            "{spec:?}: {} → {}",
            norm(&start),
            norm(&ten)
        );
        assert_eq!(opt.steps(), 10);

        // Five steps, state through bytes, five more == ten straight.
        let (mut w, first) = run(&spec, 5);
        let mut resumed = FlatOptimizer::new(&spec, w.len());
        resumed.load_bytes(&first.to_bytes()).expect("load");
        for s in 5..10 {
            let g = grads(&w, s);
            resumed.step(&mut w, &g, 0.5);
        }
        assert_eq!(w, ten, "{spec:?}");

        // The same ten steps taken in uneven parts (as buckets arrive)
        // are bitwise the same.
        let mut w: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut parts = FlatOptimizer::new(&spec, w.len());
        for s in 0..10 {
            let g = grads(&w, s);
            parts.begin_step();
            for (a, b) in [(0, 5), (5, 6), (6, 30), (30, 37)] {
                parts.step_part(a, &mut w[a..b], &g[a..b], 0.5);
            }
        }
        assert_eq!(w, ten, "{spec:?} in parts");
    }
}

/// The flat step follows burn's optimizers: an MLP stepped for 100 steps
/// by burn's `ModuleOptimizer` and by [`FlatOptimizer`] from the same
/// batches keeps the same weights to 1e-6.
#[test]
fn steps_like_burns_optimizers_for_100_steps_on_a_real_model() {
    use burn::nn::loss::CrossEntropyLossConfig;
    use burn::nn::{Linear, LinearConfig, Relu};
    use burn::optim::decay::WeightDecayConfig;
    use burn::optim::momentum::MomentumConfig;
    use burn::optim::{AdamConfig, AdamWConfig, GradientsParams, RmsPropConfig, SgdConfig};
    use burn::tensor::{Device, Int, Tensor, TensorData};

    use crate::models::params;

    /// A 4 → 8 → 3 MLP as a plain list of layers.
    fn forward(model: &[Linear], x: Tensor<2>) -> Tensor<2> {
        model[1].forward(Relu::new().forward(model[0].forward(x)))
    }
    let momentum = |momentum: f64, nesterov: bool| {
        Some(MomentumConfig {
            momentum,
            dampening: 0.0,
            nesterov,
        })
    };
    let cases = vec![
        (OptimizerSpec::adam(0.01), AdamConfig::new().init()),
        (
            OptimizerSpec::adam(0.01).with_weight_decay(0.05),
            AdamConfig::new()
                .with_weight_decay(Some(WeightDecayConfig::new(0.05)))
                .init(),
        ),
        (
            OptimizerSpec::adamw(0.01, 0.1),
            AdamWConfig::new().with_weight_decay(0.1).init(),
        ),
        (
            OptimizerSpec::sgd_momentum(0.05, 0.9),
            SgdConfig::new().with_momentum(momentum(0.9, false)).init(),
        ),
        (
            OptimizerSpec::Sgd {
                learning_rate: 0.05,
                momentum: 0.9,
                nesterov: true,
                weight_decay: 0.01,
            },
            SgdConfig::new()
                .with_momentum(momentum(0.9, true))
                .with_weight_decay(Some(WeightDecayConfig::new(0.01)))
                .init(),
        ),
        (
            OptimizerSpec::RmsProp {
                learning_rate: 0.005,
                alpha: 0.99,
                epsilon: 1e-5,
                momentum: 0.0,
                centered: false,
                weight_decay: 0.0,
            },
            RmsPropConfig::new().with_momentum(0.0).init(),
        ),
        (
            OptimizerSpec::RmsProp {
                learning_rate: 0.005,
                alpha: 0.9,
                epsilon: 1e-5,
                momentum: 0.5,
                centered: true,
                weight_decay: 0.05,
            },
            RmsPropConfig::new()
                .with_alpha(0.9)
                .with_momentum(0.5)
                .with_centered(true)
                .with_weight_decay(Some(WeightDecayConfig::new(0.05)))
                .init(),
        ),
    ];
    for (spec_opt, mut burn_opt) in cases {
        let spec = JobSpec::builder()
            .task(Task::Classification { num_classes: 3 })
            .model(ModelSpec::Mlp { hidden: vec![8] })
            .optimizer(spec_opt.clone())
            .batch_size(16)
            .features(["a", "b", "c", "d"])
            .label("y")
            .build()
            .expect("spec");
        let device = Device::flex().autodiff();
        // Drawn under the registry's init lock: a seeded build in another
        // test of this process must not see these draws.
        let mut ours = crate::models::params::drawn(|| {
            vec![
                LinearConfig::new(4, 8).init(&device),
                LinearConfig::new(8, 3).init(&device),
            ]
        });
        let mut theirs = ours.clone();
        let mut weights = params::flat_weights(&ours);
        let mut flat = FlatOptimizer::for_job(&spec, &params::layout(&ours)).expect("optimizer");
        let lr = spec.optimizer.learning_rate();
        for step in 0..100 {
            let x: Vec<f32> = (0..64)
                .map(|i| ((i * 7 + step * 3) % 11) as f32 / 5.0 - 1.0)
                .collect();
            let y: Vec<i64> = (0..16).map(|i| (i + step) as i64 % 3).collect();
            let batch = |model: &Vec<Linear>| {
                let x = Tensor::<2>::from_data(TensorData::new(x.clone(), [16, 4]), &device);
                let y = Tensor::<1, Int>::from_data(TensorData::new(y.clone(), [16]), &device);
                let loss = CrossEntropyLossConfig::new()
                    .init(&device)
                    .forward(forward(model, x), y);
                GradientsParams::from_grads(loss.backward(), model)
            };
            let grads = batch(&ours);
            flat.step(&mut weights, &params::flatten_grads(&ours, &grads), 1.0);
            ours = params::load_flat(ours, &weights);
            let grads = batch(&theirs);
            theirs = burn_opt.step(lr, theirs, grads);
        }
        let diff = params::flat_weights(&ours)
            .iter()
            .zip(params::flat_weights(&theirs))
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-6, "{spec_opt:?}: max |Δw| after 100 steps {diff}");
    }
}

/// With `no_weight_decay`, the matched parameters step as with no decay
/// and the others as with it, bitwise (the update is per weight).
#[test]
fn parameter_groups_take_decay_by_path() {
    let layout = vec![
        ("hidden.0.weight".to_owned(), 6),
        ("hidden.0.bias".to_owned(), 3),
        ("norm.gamma".to_owned(), 3),
        ("output.weight".to_owned(), 6),
        ("output.bias".to_owned(), 2),
    ];
    let spec = |decay: f64, exempt: &[&str]| {
        JobSpec::builder()
            .features(["a"])
            .label("y")
            .optimizer(OptimizerSpec::adamw(0.1, decay))
            .no_weight_decay(exempt.iter().copied())
            .build()
            .expect("spec")
    };
    // Gradients that do not depend on the weights, so runs compare per weight.
    let run = |spec: &JobSpec| {
        let mut opt = FlatOptimizer::for_job(spec, &layout).expect("optimizer");
        let mut w: Vec<f32> = (0..20).map(|i| (i as f32 * 0.7).cos()).collect();
        for s in 0..50 {
            let g: Vec<f32> = (0..20).map(|i| ((i * 3 + s) as f32 * 0.13).sin()).collect();
            opt.step(&mut w, &g, 1.0);
        }
        (w, opt.undecayed())
    };
    let (grouped, undecayed) = run(&spec(0.5, &["bias", "norm"]));
    assert_eq!(undecayed, 3 + 3 + 2);
    let (all, _) = run(&spec(0.5, &[]));
    let (none, _) = run(&spec(0.0, &[]));
    let decayed = [
        [true; 6].as_slice(),
        &[false; 3],
        &[false; 3],
        &[true; 6],
        &[false; 2],
    ]
    .concat();
    for (i, decays) in decayed.into_iter().enumerate() {
        let expected = if decays { all[i] } else { none[i] };
        assert_eq!(grouped[i], expected, "weight {i} (decays: {decays})");
    }
    assert_ne!(all, none, "decay changes the weights");

    let err = FlatOptimizer::for_job(&spec(0.5, &["bias", "bais"]), &layout).expect_err("typo");
    let msg = err.to_string();
    assert!(
        msg.contains("no_weight_decay[1]") && msg.contains("`bais`"),
        "{msg}"
    );
    assert!(msg.contains("hidden.0.bias"), "names the parameters: {msg}");
}

/// Clipping by value clamps each averaged gradient before the rule.
#[test]
fn value_clipping_clamps_each_gradient() {
    let spec = JobSpec::builder()
        .features(["a"])
        .label("y")
        .optimizer(OptimizerSpec::sgd(1.0))
        .clip(kindling_schemas::spec::GradientClip::Value { max_value: 0.25 })
        .build()
        .expect("spec");
    let mut opt = FlatOptimizer::for_job(&spec, &[("w".into(), 4)]).expect("optimizer");
    let mut w = vec![0.0f32; 4];
    opt.step(&mut w, &[2.0, -2.0, 0.2, -0.1], 0.5);
    assert_eq!(w, vec![-0.25, 0.25, -0.1, 0.05]);
}

#[test]
fn state_for_another_optimizer_or_model_is_refused() {
    let adam = OptimizerSpec::adam(0.01);
    let (_, opt) = run(&adam, 2);
    let bytes = opt.to_bytes();
    let sgd = OptimizerSpec::sgd_momentum(0.1, 0.9);
    let err = FlatOptimizer::new(&sgd, 37)
        .load_bytes(&bytes)
        .expect_err("other rule");
    assert!(err.to_string().contains("optimizer"), "{err}");
    let err = FlatOptimizer::new(&OptimizerSpec::adamw(0.01, 0.1), 37)
        .load_bytes(&bytes)
        .expect_err("adamw is another rule");
    assert!(err.to_string().contains("optimizer"), "{err}");
    let err = FlatOptimizer::new(&adam, 36)
        .load_bytes(&bytes)
        .expect_err("other size");
    assert!(err.to_string().contains("37 weights"), "{err}");
    let err = FlatOptimizer::new(&adam, 37)
        .load_bytes(&bytes[..20])
        .expect_err("short");
    assert!(err.to_string().contains("not written"), "{err}");
    let err = FlatOptimizer::new(&adam, 37)
        .load_bytes(&bytes[..bytes.len() - 4])
        .expect_err("truncated");
    assert!(err.to_string().contains("bytes of state"), "{err}");
}
