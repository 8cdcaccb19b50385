//! The burn models a job spec can name: linear/logistic regression, MLP, small CNN.

use burn::module::Module;
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

impl Net {
    /// Builds the model `spec` names for inputs of width `input_dim`.
    ///
    /// Initial weights come from the device's RNG: seed it
    /// ([`Device::seed`]) for reproducible weights; data-parallel ranks
    /// receive rank 0's weights anyway.
    pub fn new(spec: &JobSpec, input_dim: usize, device: &Device) -> Self {
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
