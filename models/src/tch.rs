use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Relu};
use burn::tensor::{backend::Backend, Tensor};

use ember_kernels::nn;

use crate::{Classifier, Output};

/// The tch-rs variant of the PyTorch example from the seed write-up: no ReLU after `conv2`,
/// element-wise dropout after the pool, logits out. 1,199,882 parameters.
#[derive(Module, Debug)]
pub struct TchNet<B: Backend> {
    pub conv1: Conv2d<B>,
    pub conv2: Conv2d<B>,
    pub pool: MaxPool2d,
    pub dropout1: Dropout,
    pub fc1: Linear<B>,
    pub dropout2: Dropout,
    pub fc2: Linear<B>,
    /// The ReLUs, applied fused with the layers they follow (`nn::*_relu`); a field so that
    /// records keep the layout they had.
    pub activation: Relu,
}

#[derive(Config, Debug)]
pub struct TchNetConfig {
    #[config(default = 10)]
    pub num_classes: usize,
    #[config(default = 0.5)]
    pub dropout1: f64,
    #[config(default = 0.5)]
    pub dropout2: f64,
}

impl TchNetConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> TchNet<B> {
        TchNet {
            conv1: Conv2dConfig::new([1, 32], [3, 3]).init(device),
            conv2: Conv2dConfig::new([32, 64], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            dropout1: DropoutConfig::new(self.dropout1).init(),
            fc1: LinearConfig::new(9216, 128).init(device),
            dropout2: DropoutConfig::new(self.dropout2).init(),
            fc2: LinearConfig::new(128, self.num_classes).init(device),
            activation: Relu::new(),
        }
    }
}

impl<B: Backend> Classifier<B> for TchNet<B> {
    /// # Shapes
    /// - `images`: `[batch, 1, 28, 28]`
    /// - output: `[batch, num_classes]`, logits
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = nn::conv2d_relu(&self.conv1, images); // [batch, 32, 26, 26]
        let x = nn::conv2d(&self.conv2, x); // [batch, 64, 24, 24]
        let x = nn::max_pool2d(&self.pool, x); // [batch, 64, 12, 12]
        let x = nn::dropout(&self.dropout1, x);
        let x = x.flatten::<2>(1, 3); // [batch, 9216]
        let x = nn::linear_relu(&self.fc1, x); // [batch, 128]
        let x = nn::dropout(&self.dropout2, x);
        nn::linear(&self.fc2, x) // [batch, num_classes]
    }

    fn output(&self) -> Output {
        Output::Logits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TestBackend;

    #[test]
    fn parameter_count_equals_pytorch() {
        // Same layers as the PyTorch example: 320 + 18,496 + 1,179,776 + 1,290.
        let model = TchNetConfig::new().init::<TestBackend>(&Default::default());
        assert_eq!(model.num_params(), 1_199_882);
    }

    #[test]
    fn outputs_logits_per_image() {
        let device = Default::default();
        let model = TchNetConfig::new().init::<TestBackend>(&device);
        let x = Tensor::<TestBackend, 4>::zeros([2, 1, 28, 28], &device);
        assert_eq!(model.forward(x).dims(), [2, 10]);
    }
}
