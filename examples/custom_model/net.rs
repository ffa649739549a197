//! A model ember does not ship, written as a user would in their own crate: a small residual
//! CNN with batch norm and global average pooling. Only `impl EmberModel` at the end is
//! ember-specific; the rest is plain burn.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{backend::Backend, Tensor};
use ember::model::{Classifier, EmberModel, ImageShape};
use ember_kernels::nn;
use ember_models::{BatchNorm2d, BatchNorm2dConfig, Output};

/// `relu(bn(conv(x)))`, the convolution 3x3 with padding 1.
#[derive(Module, Debug)]
pub struct ConvBn<B: Backend> {
    conv: Conv2d<B>,
    bn: BatchNorm2d<B>,
}

impl<B: Backend> ConvBn<B> {
    fn new(cin: usize, cout: usize, stride: usize, device: &B::Device) -> Self {
        let conv = Conv2dConfig::new([cin, cout], [3, 3])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .with_bias(false)
            .init(device);
        Self {
            conv,
            bn: BatchNorm2dConfig::new(cout).init(device),
        }
    }

    /// `bn(conv(x))`, with the ReLU after it when `relu`. `ember_kernels::nn::conv2d` and
    /// ember's `BatchNorm2d` run ember's CPU kernels on the flex backend, burn's ops elsewhere.
    fn forward(&self, x: Tensor<B, 4>, relu: bool) -> Tensor<B, 4> {
        let y = nn::conv2d(&self.conv, x);
        if relu {
            self.bn.forward_relu(y)
        } else {
            self.bn.forward(y)
        }
    }
}

/// stem → pool → residual block → strided conv → global average pool → linear.
///
/// # Shapes
/// - input: `[batch, channels, h, w]`
/// - output: `[batch, classes]` (logits)
#[derive(Module, Debug)]
pub struct ResidualNet<B: Backend> {
    stem: ConvBn<B>,
    pool: MaxPool2d,
    block1: ConvBn<B>,
    block2: ConvBn<B>,
    down: ConvBn<B>,
    head: Linear<B>,
}

impl<B: Backend> Classifier<B> for ResidualNet<B> {
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.stem.forward(x, true); // [batch, 32, h, w]
        let x = nn::max_pool2d(&self.pool, x); // [batch, 32, h/2, w/2]
        let y = self.block1.forward(x.clone(), true);
        let x = relu(self.block2.forward(y, false) + x); // residual add
        let x = self.down.forward(x, true); // [batch, 64, h/4, w/4]
        let x = x.mean_dim(3).mean_dim(2).flatten(1, 3); // global average pool: [batch, 64]
        nn::linear(&self.head, x)
    }

    fn output(&self) -> Output {
        Output::Logits
    }
}

/// The model's identity for ember: its name, and how to build it for a dataset.
#[derive(Clone, Copy, Debug)]
pub struct Residual;

impl EmberModel for Residual {
    type Net<B: Backend> = ResidualNet<B>;

    fn name(&self) -> &str {
        "residual-net"
    }

    fn about(&self) -> &str {
        "a residual CNN with batch norm and global average pooling (examples/custom_model)"
    }

    fn init<B: Backend>(&self, input: ImageShape, classes: usize, device: &B::Device) -> ResidualNet<B> {
        ResidualNet {
            stem: ConvBn::new(input.channels, 32, 1, device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            block1: ConvBn::new(32, 32, 1, device),
            block2: ConvBn::new(32, 32, 1, device),
            down: ConvBn::new(32, 64, 2, device),
            head: LinearConfig::new(64, classes).init(device),
        }
    }
}
