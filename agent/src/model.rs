//! The burn models a job spec can name: linear/logistic regression, MLP, small CNN.

use std::sync::{Mutex, MutexGuard};

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::{CrossEntropyLossConfig, MseLoss, Reduction};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::tensor::{Device, Int, Tensor};
use kindling_schemas::spec::{JobSpec, ModelSpec, Task};

/// One network for every model kind: optional conv blocks, then dense layers
/// with ReLU between them.
#[derive(Module, Debug)]
pub struct Net {
    convs: Vec<Conv2d>,
    pool: Option<MaxPool2d>,
    dense: Vec<Linear>,
    activation: Relu,
    /// `[channels, height, width]` of the image input, for CNNs.
    #[module(skip)]
    image: Option<[usize; 3]>,
}

/// burn's CPU backend draws every random tensor from one process-wide RNG.
/// Every model construction holds this lock, so a seeded construction
/// ([`Net::seeded`]) cannot have another one (a model built to load weights
/// into, another job's init) draw from the RNG between seeding and building.
static INIT: Mutex<()> = Mutex::new(());

fn init_lock() -> MutexGuard<'static, ()> {
    INIT.lock().unwrap_or_else(|p| p.into_inner())
}

impl Net {
    /// Builds the model `spec` names for inputs of width `input_dim`, with
    /// initial weights from the RNG's current state (use [`Net::seeded`] for
    /// reproducible weights; data-parallel ranks receive rank 0's anyway).
    pub fn new(spec: &JobSpec, input_dim: usize, device: &Device) -> Self {
        let _guard = init_lock();
        Self::build(spec, input_dim, device)
    }

    /// burn initialises parameters lazily, on first use; draw them all now,
    /// while the caller holds the init lock.
    fn materialized(self) -> Self {
        struct Draw;
        impl ModuleVisitor for Draw {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let _ = param.val();
            }
        }
        self.visit(&mut Draw);
        self
    }

    /// The model with the initial weights `seed` gives, on the CPU with
    /// autodiff: the same weights for the same seed whatever else the process
    /// is doing (move them to another device with the record bytes).
    pub fn seeded(spec: &JobSpec, input_dim: usize, seed: u64) -> Self {
        let _guard = init_lock();
        let cpu = Device::flex();
        cpu.seed(seed);
        Self::build(spec, input_dim, &cpu.autodiff())
    }

    fn build(spec: &JobSpec, input_dim: usize, device: &Device) -> Self {
        let out = spec.output_dim();
        let mut widths = vec![input_dim];
        let mut convs = Vec::new();
        let mut pool = None;
        let mut image = None;
        match &spec.model {
            ModelSpec::Linear => {}
            ModelSpec::Mlp { hidden } => widths.extend(hidden),
            ModelSpec::Cnn {
                channels,
                height,
                width,
                conv,
                dense,
            } => {
                let mut c = *channels;
                let (mut h, mut w) = (*height, *width);
                for &next in conv {
                    convs.push(
                        Conv2dConfig::new([c, next], [3, 3])
                            .with_padding(PaddingConfig2d::Same)
                            .init(device),
                    );
                    c = next;
                    h /= 2;
                    w /= 2;
                }
                pool = Some(MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init());
                image = Some([*channels, *height, *width]);
                widths = vec![c * h * w, *dense];
            }
        }
        widths.push(out);
        let dense = widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(device))
            .collect();
        Net {
            convs,
            pool,
            dense,
            activation: Relu::new(),
            image,
        }
        .materialized()
    }

    /// Raw outputs: class logits `[n, classes]` or values `[n, 1]`.
    pub fn forward(&self, input: Tensor<2>) -> Tensor<2> {
        let mut x = input;
        if let (Some([c, h, w]), Some(pool)) = (self.image, &self.pool) {
            let n = x.dims()[0];
            let mut img: Tensor<4> = x.reshape([n, c, h, w]);
            for conv in &self.convs {
                img = pool.forward(self.activation.forward(conv.forward(img)));
            }
            x = img.flatten(1, 3);
        }
        let last = self.dense.len().saturating_sub(1);
        for (i, layer) in self.dense.iter().enumerate() {
            x = layer.forward(x);
            if i < last {
                x = self.activation.forward(x);
            }
        }
        x
    }
}

/// Labels of one batch, in the form the loss wants.
#[derive(Debug, Clone)]
pub enum Targets {
    /// Class indices `[n]`.
    Classes(Tensor<1, Int>),
    /// Regression targets `[n, 1]`.
    Values(Tensor<2>),
}

/// Mean loss of `output` against `targets` for the spec's task.
pub fn mean_loss(task: Task, output: Tensor<2>, targets: Targets, device: &Device) -> Tensor<1> {
    match (task, targets) {
        (Task::Classification { .. }, Targets::Classes(t)) => {
            CrossEntropyLossConfig::new().init(device).forward(output, t)
        }
        (_, Targets::Values(t)) => MseLoss::new().forward(output, t, Reduction::Mean),
        (Task::Regression, Targets::Classes(t)) => {
            let values: Tensor<2> = t.float().unsqueeze_dim(1);
            MseLoss::new().forward(output, values, Reduction::Mean)
        }
    }
}
