use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Relu};
use burn::tensor::activation::log_softmax;
use burn::tensor::{backend::Backend, Tensor};

use ember_kernels::nn;

use crate::{ChannelDropout, Classifier, Output};

/// The CNN of PyTorch's official MNIST example (`pytorch/examples`, `mnist/main.py`), as the seed
/// benchmark ran it: 1,199,882 parameters, output `log_softmax`.
#[derive(Module, Debug)]
pub struct PytorchExampleNet<B: Backend> {
    pub conv1: Conv2d<B>,
    pub conv2: Conv2d<B>,
    pub pool: MaxPool2d,
    pub dropout1: ChannelDropout,
    pub fc1: Linear<B>,
    pub dropout2: Dropout,
    pub fc2: Linear<B>,
    /// The ReLUs, applied fused with the layers they follow (`nn::*_relu`); a field so that
    /// records keep the layout they had.
    pub activation: Relu,
}

#[derive(Config, Debug)]
pub struct PytorchExampleNetConfig {
    #[config(default = 10)]
    pub num_classes: usize,
    /// `Dropout2d` after the pool (whole channels).
    #[config(default = 0.25)]
    pub dropout1: f64,
    /// `Dropout` after `fc1`.
    #[config(default = 0.5)]
    pub dropout2: f64,
}

impl PytorchExampleNetConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> PytorchExampleNet<B> {
        PytorchExampleNet {
            conv1: Conv2dConfig::new([1, 32], [3, 3]).init(device),
            conv2: Conv2dConfig::new([32, 64], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            dropout1: ChannelDropout::new(self.dropout1),
            fc1: LinearConfig::new(9216, 128).init(device),
            dropout2: DropoutConfig::new(self.dropout2).init(),
            fc2: LinearConfig::new(128, self.num_classes).init(device),
            activation: Relu::new(),
        }
    }
}

impl<B: Backend> Classifier<B> for PytorchExampleNet<B> {
    /// # Shapes
    /// - `images`: `[batch, 1, 28, 28]`
    /// - output: `[batch, num_classes]`, log-probabilities
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = nn::conv2d_relu(&self.conv1, images); // [batch, 32, 26, 26]
        let x = nn::conv2d_relu(&self.conv2, x); // [batch, 64, 24, 24]
        let x = nn::max_pool2d(&self.pool, x); // [batch, 64, 12, 12]
        let x = self.dropout1.forward(x);
        let x = x.flatten::<2>(1, 3); // [batch, 9216]
        let x = nn::linear_relu(&self.fc1, x); // [batch, 128]
        let x = nn::dropout(&self.dropout2, x);
        let x = nn::linear(&self.fc2, x); // [batch, num_classes]
        log_softmax(x, 1)
    }

    fn output(&self) -> Output {
        Output::LogProbs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TestBackend;

    #[test]
    fn parameter_count_equals_pytorch() {
        // sum(p.numel() for p in Net().parameters()) in pytorch/examples mnist/main.py
        let model = PytorchExampleNetConfig::new().init::<TestBackend>(&Default::default());
        assert_eq!(model.num_params(), 1_199_882);
    }

    #[test]
    fn outputs_log_probabilities_per_image() {
        let device = Default::default();
        let model = PytorchExampleNetConfig::new().init::<TestBackend>(&device);
        let x =
            Tensor::<TestBackend, 4>::random([3, 1, 28, 28], burn::tensor::Distribution::Default, &device);
        let y = model.forward(x);
        assert_eq!(y.dims(), [3, 10]);
        let sums = y.exp().sum_dim(1).into_data().to_vec::<f32>().unwrap();
        for s in sums {
            assert!((s - 1.0).abs() < 1e-5, "probabilities sum to {s}");
        }
    }
}
