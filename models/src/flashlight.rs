use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Relu};
use burn::tensor::ops::PadMode;
use burn::tensor::{backend::Backend, Tensor};

use ember_kernels::nn;

use crate::{Classifier, Output};

/// Pads height and width by `pad` on every side by repeating the border pixels, like PyTorch's
/// `padding_mode="replicate"` (burn's convolutions only pad with zeros).
///
/// # Shapes
/// - `x`: `[batch, channels, h, w]`
/// - output: `[batch, channels, h + 2 * pad, w + 2 * pad]`
pub fn pad_replicate<B: Backend>(x: Tensor<B, 4>, pad: usize) -> Tensor<B, 4> {
    x.pad([(pad, pad), (pad, pad)], PadMode::Edge)
}

/// flashlight's MNIST CNN (`examples/Mnist.cpp`) as replicated in PyTorch by the seed write-up:
/// 5x5 convolutions with 2 pixels of replicate padding, 3,274,634 parameters, logits out.
#[derive(Module, Debug)]
pub struct FlashlightCnn<B: Backend> {
    pub conv1: Conv2d<B>,
    pub conv2: Conv2d<B>,
    pub pool: MaxPool2d,
    pub fc1: Linear<B>,
    pub dropout: Dropout,
    pub fc2: Linear<B>,
    /// The ReLUs, applied fused with the layers they follow (`nn::*_relu`); a field so that
    /// records keep the layout they had.
    pub activation: Relu,
}

#[derive(Config, Debug)]
pub struct FlashlightCnnConfig {
    #[config(default = 10)]
    pub num_classes: usize,
    #[config(default = 0.5)]
    pub dropout: f64,
}

impl FlashlightCnnConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> FlashlightCnn<B> {
        FlashlightCnn {
            // Valid convolutions; `forward` pads their input by replicating the border.
            conv1: Conv2dConfig::new([1, 32], [5, 5]).init(device),
            conv2: Conv2dConfig::new([32, 64], [5, 5]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc1: LinearConfig::new(7 * 7 * 64, 1024).init(device),
            dropout: DropoutConfig::new(self.dropout).init(),
            fc2: LinearConfig::new(1024, self.num_classes).init(device),
            activation: Relu::new(),
        }
    }
}

impl<B: Backend> Classifier<B> for FlashlightCnn<B> {
    /// # Shapes
    /// - `images`: `[batch, 1, 28, 28]`
    /// - output: `[batch, num_classes]`, logits
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        // Replicate padding and the ReLU are folded into the convolution: no padded copy of the
        // input, no separate activation pass.
        let x = nn::conv2d_replicate_relu(&self.conv1, images, 2); // [batch, 32, 28, 28]
        let x = nn::max_pool2d(&self.pool, x); // [batch, 32, 14, 14]
        let x = nn::conv2d_replicate_relu(&self.conv2, x, 2); // [batch, 64, 14, 14]
        let x = nn::max_pool2d(&self.pool, x); // [batch, 64, 7, 7]
        let x = x.flatten::<2>(1, 3); // [batch, 3136]
        let x = nn::linear_relu(&self.fc1, x); // [batch, 1024]
        let x = nn::dropout(&self.dropout, x);
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
    use burn::tensor::TensorData;

    #[test]
    fn parameter_count_equals_pytorch() {
        // 832 + 51,264 + 3,212,288 + 10,250
        let model = FlashlightCnnConfig::new().init::<TestBackend>(&Default::default());
        assert_eq!(model.num_params(), 3_274_634);
    }

    #[test]
    fn replicate_padding_repeats_border_pixels() {
        // torch.nn.functional.pad(torch.tensor([[[[1., 2.], [3., 4.]]]]), (2, 2, 2, 2), mode="replicate")
        let device = Default::default();
        let x = Tensor::<TestBackend, 4>::from_data(
            TensorData::new(vec![1f32, 2., 3., 4.], [1, 1, 2, 2]),
            &device,
        );
        let y = pad_replicate(x, 2);
        #[rustfmt::skip]
        let expected = TensorData::new(vec![
            1f32, 1., 1., 2., 2., 2.,
            1., 1., 1., 2., 2., 2.,
            1., 1., 1., 2., 2., 2.,
            3., 3., 3., 4., 4., 4.,
            3., 3., 3., 4., 4., 4.,
            3., 3., 3., 4., 4., 4.,
        ], [1, 1, 6, 6]);
        y.into_data().assert_eq(&expected, true);
    }

    #[test]
    fn keeps_spatial_size_through_padded_convolutions() {
        let device = Default::default();
        let model = FlashlightCnnConfig::new().init::<TestBackend>(&device);
        let x = Tensor::<TestBackend, 4>::zeros([2, 1, 28, 28], &device);
        assert_eq!(model.forward(x).dims(), [2, 10]);
    }
}
