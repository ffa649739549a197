//! A small, fast CNN for the "99% on MNIST in the least wall time" recipe.
//!
//! Design: three conv-BN-ReLU-max-pool blocks that halve the image each time (28 → 14 → 7 → 3)
//! while the width doubles, then one linear layer on the flattened 3x3 maps. Batch norm lets a
//! one-cycle schedule use a high rate from the first epoch; the pooling keeps the cost low: at
//! widths 32/64/128 a forward pass is 7.5 M multiply-adds per image, 1.6x fewer than PyTorch's
//! example net (12 M), with 104,426 parameters instead of 1.2 M. No dropout: the run is too short
//! to over-fit, and augmentation does that job.
//!
//! Parameter names are those of `benches/pytorch/models.py`'s `SpeedrunNet`.

use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::{backend::Backend, Tensor};

use ember_kernels::nn;

use crate::batch_norm::{BatchNorm2d, BatchNorm2dConfig};
use crate::{Classifier, Output};

/// `max_pool2d(relu(bn(conv(x))), 2)` with a 3x3 convolution, padding 1, no bias.
#[derive(Module, Debug)]
pub struct ConvBlock<B: Backend> {
    pub conv: Conv2d<B>,
    pub bn: BatchNorm2d<B>,
}

impl<B: Backend> ConvBlock<B> {
    fn new(cin: usize, cout: usize, device: &B::Device) -> Self {
        Self {
            conv: Conv2dConfig::new([cin, cout], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .with_bias(false)
                .init(device),
            bn: BatchNorm2dConfig::new(cout).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>, pool: &MaxPool2d) -> Tensor<B, 4> {
        if is_pool2(pool) {
            return self.bn.forward_conv_relu_pool2(&self.conv, x);
        }
        nn::max_pool2d(pool, self.bn.forward_relu(nn::conv2d(&self.conv, x)))
    }
}

/// Whether `pool` is the 2x2, stride-2 max pool without padding that batch norm fuses.
fn is_pool2(pool: &MaxPool2d) -> bool {
    pool.kernel_size == [2, 2]
        && pool.stride == [2, 2]
        && pool.dilation == [1, 1]
        && !pool.ceil_mode
        && matches!(
            pool.padding,
            PaddingConfig2d::Valid | PaddingConfig2d::Explicit(0, 0, 0, 0)
        )
}

#[derive(Config, Debug)]
pub struct SpeedrunNetConfig {
    #[config(default = 1)]
    pub in_channels: usize,
    #[config(default = 10)]
    pub num_classes: usize,
    /// Channels of the three blocks.
    #[config(default = "[32, 64, 128]")]
    pub widths: [usize; 3],
    /// `[height, width]` of the input: each block halves it (rounding down), and the classifier
    /// takes what is left. At least 8x8.
    #[config(default = "[28, 28]")]
    pub image_size: [usize; 2],
}

impl SpeedrunNetConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> SpeedrunNet<B> {
        let [a, b, c] = self.widths;
        let [h, w] = self.image_size.map(|s| s / 2 / 2 / 2);
        assert!(h > 0 && w > 0, "speedrun-net needs images of at least 8x8");
        SpeedrunNet {
            block1: ConvBlock::new(self.in_channels, a, device),
            block2: ConvBlock::new(a, b, device),
            block3: ConvBlock::new(b, c, device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc: LinearConfig::new(c * h * w, self.num_classes).init(device),
        }
    }
}

#[derive(Module, Debug)]
pub struct SpeedrunNet<B: Backend> {
    pub block1: ConvBlock<B>,
    pub block2: ConvBlock<B>,
    pub block3: ConvBlock<B>,
    pub pool: MaxPool2d,
    pub fc: Linear<B>,
}

impl<B: Backend> Classifier<B> for SpeedrunNet<B> {
    /// # Shapes
    /// - `images`: `[batch, in_channels, height, width]` (the configured `image_size`)
    /// - output: `[batch, num_classes]`, logits
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.block1.forward(images, &self.pool); // [batch, 32, 14, 14]
        let x = self.block2.forward(x, &self.pool); // [batch, 64, 7, 7]
        let x = self.block3.forward(x, &self.pool); // [batch, 128, 3, 3]
        nn::linear(&self.fc, x.flatten(1, 3)) // [batch, 10]
    }

    fn output(&self) -> Output {
        Output::Logits
    }

    fn trainable_params(&self) -> usize {
        let buffers: usize = [&self.block1, &self.block2, &self.block3]
            .iter()
            .map(|b| b.bn.buffer_len())
            .sum();
        self.num_params() - buffers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TestBackend;

    #[test]
    fn parameter_count_equals_pytorchs() {
        let device = Default::default();
        let net = SpeedrunNetConfig::new().init::<TestBackend>(&device);
        // sum(p.numel() for p in models.SpeedrunNet().parameters()), benches/pytorch/models.py
        assert_eq!(net.trainable_params(), 104_426);
        assert_eq!(net.num_params(), 104_426 + 451);
        assert_eq!(
            net.forward(Tensor::zeros([2, 1, 28, 28], &device)).dims(),
            [2, 10]
        );
        let colour = SpeedrunNetConfig::new()
            .with_in_channels(3)
            .with_num_classes(100)
            .with_image_size([32, 32])
            .init::<TestBackend>(&device);
        // 32 -> 16 -> 8 -> 4: the classifier takes 128 x 4 x 4.
        assert_eq!(colour.fc.weight.dims(), [2048, 100]);
        assert_eq!(
            colour.forward(Tensor::zeros([2, 3, 32, 32], &device)).dims(),
            [2, 100]
        );
    }
}
