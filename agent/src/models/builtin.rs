//! The built-in networks — linear/logistic regression, an MLP, a small CNN —
//! as [`KindlingModel`] implementors registered like any user model
//! ([`ModelRegistry::builtin`]). They read the float features concatenated.

use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::tensor::{Device, Tensor};
use kindling_schemas::spec::JobSpec;

use crate::error::AgentError;
use crate::models::kindling_model::{Batch, ConfigError, Inputs, KindlingModel, ModelRegistry};

impl ModelRegistry {
    /// The built-in networks: `linear`, `mlp` and `cnn` (what
    /// `ModelSpec::Linear`, `Mlp` and `Cnn` name). Add your own with
    /// [`with`](ModelRegistry::with).
    pub fn builtin() -> Self {
        ModelRegistry::empty()
            .with::<LinearModel>("linear")
            .with::<MlpModel>("mlp")
            .with::<CnnModel>("cnn")
    }
}

/// The built-ins read float features only.
fn floats_only(name: &str, spec: &JobSpec) -> Result<(), ConfigError> {
    match spec.inputs.keys().next() {
        None => Ok(()),
        Some(column) => Err(ConfigError::new(
            format!("inputs.{column}"),
            format!(
                "the built-in `{name}` reads float features only; register a model of your own for \
                 categorical or sequence inputs"
            ),
        )),
    }
}

fn dense_stack(widths: &[usize], device: &Device) -> Vec<Linear> {
    widths
        .windows(2)
        .map(|w| LinearConfig::new(w[0], w[1]).init(device))
        .collect()
}

/// Dense layers with ReLU between them (none after the last).
fn forward_dense(dense: &[Linear], activation: &Relu, mut x: Tensor<2>) -> Tensor<2> {
    let last = dense.len().saturating_sub(1);
    for (i, layer) in dense.iter().enumerate() {
        x = layer.forward(x);
        if i < last {
            x = activation.forward(x);
        }
    }
    x
}

/// Config of [`LinearModel`]: nothing to set.
#[derive(Config, Debug)]
pub struct LinearModelConfig {}

/// One dense layer: linear regression, or logistic (softmax) regression.
#[derive(Module, Debug)]
pub struct LinearModel {
    dense: Vec<Linear>,
}

impl KindlingModel for LinearModel {
    type Config = LinearModelConfig;

    fn validate(_: &Self::Config, spec: &JobSpec) -> Result<(), ConfigError> {
        floats_only("linear", spec)
    }

    fn init(_: &Self::Config, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        Ok(LinearModel {
            dense: dense_stack(&[inputs.float_width(), inputs.outputs()], device),
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        Ok(forward_dense(&self.dense, &Relu::new(), batch.features()?))
    }
}

/// Config of [`MlpModel`].
#[derive(Config, Debug)]
pub struct MlpModelConfig {
    /// Widths of the hidden layers.
    pub hidden: Vec<usize>,
}

/// A multi-layer perceptron with ReLU between the layers.
#[derive(Module, Debug)]
pub struct MlpModel {
    dense: Vec<Linear>,
    activation: Relu,
}

impl KindlingModel for MlpModel {
    type Config = MlpModelConfig;

    fn validate(_: &Self::Config, spec: &JobSpec) -> Result<(), ConfigError> {
        floats_only("mlp", spec)
    }

    fn init(config: &Self::Config, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        let widths: Vec<usize> = std::iter::once(inputs.float_width())
            .chain(config.hidden.iter().copied())
            .chain([inputs.outputs()])
            .collect();
        Ok(MlpModel {
            dense: dense_stack(&widths, device),
            activation: Relu::new(),
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        Ok(self.forward_features(batch.features()?))
    }
}

impl MlpModel {
    /// The outputs for float features `[n, float_width]`.
    pub fn forward_features(&self, x: Tensor<2>) -> Tensor<2> {
        forward_dense(&self.dense, &self.activation, x)
    }
}

/// Config of [`CnnModel`] (the fields of `ModelSpec::Cnn`).
#[derive(Config, Debug)]
pub struct CnnModelConfig {
    /// Input channels.
    pub channels: usize,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
    /// Output channels of each 3×3 conv (+ReLU +2×2 max-pool) block.
    pub conv: Vec<usize>,
    /// Hidden width of the dense layer after the convolutions.
    pub dense: usize,
}

/// A small CNN over one image feature laid out `channels × height × width`.
#[derive(Module, Debug)]
pub struct CnnModel {
    convs: Vec<Conv2d>,
    pool: MaxPool2d,
    dense: Vec<Linear>,
    activation: Relu,
    #[module(skip)]
    image: [usize; 3],
}

impl KindlingModel for CnnModel {
    type Config = CnnModelConfig;

    fn validate(_: &Self::Config, spec: &JobSpec) -> Result<(), ConfigError> {
        floats_only("cnn", spec)
    }

    fn init(config: &Self::Config, inputs: &Inputs<'_>, device: &Device) -> Result<Self, AgentError> {
        let mut c = config.channels;
        let (mut h, mut w) = (config.height, config.width);
        let mut convs = Vec::with_capacity(config.conv.len());
        for &next in &config.conv {
            convs.push(
                Conv2dConfig::new([c, next], [3, 3])
                    .with_padding(PaddingConfig2d::Same)
                    .init(device),
            );
            c = next;
            h /= 2;
            w /= 2;
        }
        Ok(CnnModel {
            convs,
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            dense: dense_stack(&[c * h * w, config.dense, inputs.outputs()], device),
            activation: Relu::new(),
            image: [config.channels, config.height, config.width],
        })
    }

    fn forward(&self, batch: &Batch<'_>) -> Result<Tensor<2>, AgentError> {
        let x = batch.features()?;
        let n = x.dims()[0];
        let [c, h, w] = self.image;
        let mut img: Tensor<4> = x.reshape([n, c, h, w]);
        for conv in &self.convs {
            img = self.pool.forward(self.activation.forward(conv.forward(img)));
        }
        Ok(forward_dense(&self.dense, &self.activation, img.flatten(1, 3)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use arrow::datatypes::{DataType, Field, Schema};
    use burn::tensor::Device;
    use kindling_schemas::schema::{StreamKind, validate};
    use kindling_schemas::spec::{JobSpec, ModelSpec, OptimizerSpec, Task};

    use crate::models::kindling_model::ModelRegistry;

    /// Another thread building models the whole time (as a second job's
    /// agent, or a model built to load weights into) must not change what a
    /// seed gives: the RNG they draw from is process-wide.
    #[test]
    fn a_seed_gives_the_same_weights_while_other_models_are_built() {
        let spec = JobSpec::builder()
            .task(Task::Classification { num_classes: 3 })
            .model(ModelSpec::Mlp { hidden: vec![16] })
            .optimizer(OptimizerSpec::adam(0.01))
            .features(["x"])
            .label("y")
            .build()
            .expect("spec");
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let schema = Schema::new(vec![
            Field::new("x", DataType::FixedSizeList(item, 8), false),
            Field::new("y", DataType::Int32, false),
        ]);
        let layout = validate(&schema, &spec, StreamKind::Train).expect("layout");
        let models = ModelRegistry::builtin();
        let seeded = |seed| {
            models
                .build_seeded(&spec, &layout, seed)
                .expect("build")
                .flat_weights()
        };
        let expected = seeded(42);
        let stop = Arc::new(AtomicBool::new(false));
        let (first_built, first_model) = std::sync::mpsc::channel();
        let noise = {
            let (spec, layout, models, stop) = (spec.clone(), layout.clone(), models.clone(), stop.clone());
            std::thread::spawn(move || {
                let device = Device::flex();
                let mut built = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let model = models.build(&spec, &layout, &device).expect("build");
                    std::hint::black_box(model.flat_weights());
                    built += 1;
                    if built == 1 {
                        let _ = first_built.send(());
                    }
                }
                built
            })
        };
        // On a busy machine the other thread may not run at all during the
        // seeded builds below unless they wait for it to get going.
        let _ = first_model.recv();
        let mut differing = 0;
        for _ in 0..200 {
            if seeded(42) != expected {
                differing += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let built = noise.join().expect("noise thread");
        assert!(built > 0, "the other thread built no model");
        assert_eq!(
            differing, 0,
            "of 200 seeded builds while {built} others were built"
        );
        assert_ne!(seeded(43), expected, "another seed gives other weights");
    }
}
