//! Residual networks of basic blocks (He et al. 2016), CIFAR-style: a 3x3 stem without
//! down-sampling, stages of basic blocks whose first block halves the size (stride 2) with a 1x1
//! stride-2 projection shortcut, global average pooling and one linear layer. ResNet-20 is the
//! paper's CIFAR network (with projections, "option B"); ResNet-18 is the same design at
//! ImageNet-ResNet-18's widths and depths, as CIFAR benchmarks train it.
//!
//! Parameter names are those of `benches/pytorch/models.py`'s `ResNet`, so that `ember import`
//! reads its `state_dict`: `conv1`, `bn1`, `stages.{s}.{b}.{conv1,bn1,conv2,bn2}`,
//! `stages.{s}.{b}.shortcut.{conv,bn}`, `fc`.

use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::{backend::Backend, Tensor};

use ember_kernels::nn;

use crate::batch_norm::{BatchNorm2d, BatchNorm2dConfig};
use crate::{Classifier, Output};

/// A 3x3 convolution without bias (the batch norm after it has one), padding 1.
fn conv3x3<B: Backend>(cin: usize, cout: usize, stride: usize, device: &B::Device) -> Conv2d<B> {
    Conv2dConfig::new([cin, cout], [3, 3])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .with_bias(false)
        .init(device)
}

/// The 1x1 convolution and batch norm that bring a block's input to its output's shape.
#[derive(Module, Debug)]
pub struct Projection<B: Backend> {
    pub conv: Conv2d<B>,
    pub bn: BatchNorm2d<B>,
}

/// `relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`, where the shortcut is `x` itself or,
/// when the block changes the size or width, a [`Projection`].
#[derive(Module, Debug)]
pub struct BasicBlock<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: BatchNorm2d<B>,
    pub conv2: Conv2d<B>,
    pub bn2: BatchNorm2d<B>,
    pub shortcut: Option<Projection<B>>,
}

impl<B: Backend> BasicBlock<B> {
    pub fn new(cin: usize, cout: usize, stride: usize, device: &B::Device) -> Self {
        let shortcut = (stride != 1 || cin != cout).then(|| Projection {
            conv: Conv2dConfig::new([cin, cout], [1, 1])
                .with_stride([stride, stride])
                .with_bias(false)
                .init(device),
            bn: BatchNorm2dConfig::new(cout).init(device),
        });
        Self {
            conv1: conv3x3(cin, cout, stride, device),
            bn1: BatchNorm2dConfig::new(cout).init(device),
            conv2: conv3x3(cout, cout, 1, device),
            bn2: BatchNorm2dConfig::new(cout).init(device),
            shortcut,
        }
    }

    /// # Shapes
    /// - `x`: `[batch, cin, h, w]`
    /// - output: `[batch, cout, ceil(h / stride), ceil(w / stride)]`
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let out = self.bn1.forward_conv_relu(&self.conv1, x.clone());

        let identity = match &self.shortcut {
            Some(p) => p.bn.forward_conv(&p.conv, x),
            None => x,
        };
        self.bn2.forward_conv_add_relu(&self.conv2, out, identity)
    }
}

#[derive(Config, Debug)]
pub struct ResNetConfig {
    /// Channels of the input images (1: grey, 3: colour).
    #[config(default = 1)]
    pub in_channels: usize,
    #[config(default = 10)]
    pub num_classes: usize,
    /// Channels of each stage; the stem has the first stage's.
    pub widths: Vec<usize>,
    /// Basic blocks in each stage.
    pub depths: Vec<usize>,
}

impl ResNetConfig {
    /// ResNet-20: three stages of three blocks, 16/32/64 channels (272,186 parameters with
    /// projection shortcuts, 1 input channel, 10 classes).
    pub fn resnet20() -> Self {
        Self::new(vec![16, 32, 64], vec![3, 3, 3])
    }

    /// ResNet-18's widths and depths (64/128/256/512, two blocks each) on the CIFAR stem.
    pub fn resnet18() -> Self {
        Self::new(vec![64, 128, 256, 512], vec![2, 2, 2, 2])
    }

    pub fn init<B: Backend>(&self, device: &B::Device) -> ResNet<B> {
        assert_eq!(self.widths.len(), self.depths.len(), "one depth per stage width");
        let mut cin = self.widths[0];
        let stages = self
            .widths
            .iter()
            .zip(&self.depths)
            .enumerate()
            .map(|(s, (&width, &depth))| {
                (0..depth)
                    .map(|b| {
                        // Every stage but the first halves the size in its first block.
                        let stride = if s > 0 && b == 0 { 2 } else { 1 };
                        let block = BasicBlock::new(cin, width, stride, device);
                        cin = width;
                        block
                    })
                    .collect()
            })
            .collect();
        ResNet {
            conv1: conv3x3(self.in_channels, self.widths[0], 1, device),
            bn1: BatchNorm2dConfig::new(self.widths[0]).init(device),
            stages,
            fc: LinearConfig::new(cin, self.num_classes).init(device),
        }
    }
}

#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: BatchNorm2d<B>,
    pub stages: Vec<Vec<BasicBlock<B>>>,
    pub fc: Linear<B>,
}

impl<B: Backend> Classifier<B> for ResNet<B> {
    /// # Shapes
    /// - `images`: `[batch, in_channels, h, w]` (any size: the pooling is global)
    /// - output: `[batch, num_classes]`, logits
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = self.bn1.forward_conv_relu(&self.conv1, images); // [batch, 16, 28, 28]
        for block in self.stages.iter().flatten() {
            x = block.forward(x); // ResNet-20 at 28x28: [batch, 16|32|64, 28|14|7, 28|14|7]
        }
        let [batch, channels, h, w] = x.dims();
        let pooled = x
            .reshape([batch, channels, h * w])
            .mean_dim(2)
            .reshape([batch, channels]); // [batch, 64]
        nn::linear(&self.fc, pooled)
    }

    fn output(&self) -> Output {
        Output::Logits
    }

    fn trainable_params(&self) -> usize {
        let blocks = self.stages.iter().flatten();
        let buffers: usize = blocks
            .flat_map(|b| [Some(&b.bn1), Some(&b.bn2), b.shortcut.as_ref().map(|p| &p.bn)])
            .flatten()
            .map(BatchNorm2d::buffer_len)
            .sum::<usize>()
            + self.bn1.buffer_len();
        self.num_params() - buffers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TestBackend;

    #[test]
    fn parameter_counts_equal_pytorchs() {
        let device = Default::default();
        // sum(p.numel() for p in m.parameters()) and the same over m.buffers() for
        // models.resnet20() and models.resnet18() of benches/pytorch/models.py.
        let r20 = ResNetConfig::resnet20().init::<TestBackend>(&device);
        assert_eq!(r20.trainable_params(), 272_186);
        assert_eq!(r20.num_params(), 272_186 + 1_589);
        let r18 = ResNetConfig::resnet18().init::<TestBackend>(&device);
        assert_eq!(r18.trainable_params(), 11_172_810);
        assert_eq!(r18.num_params(), 11_172_810 + 9_620);
    }

    #[test]
    fn shapes_through_the_stages() {
        let device = Default::default();
        let model = ResNetConfig::resnet20().init::<TestBackend>(&device);
        let out = model.forward(Tensor::zeros([2, 1, 28, 28], &device));
        assert_eq!(out.dims(), [2, 10]);
        let colour = ResNetConfig::resnet20()
            .with_in_channels(3)
            .init::<TestBackend>(&device);
        assert_eq!(
            colour.forward(Tensor::zeros([1, 3, 32, 32], &device)).dims(),
            [1, 10]
        );
    }
}
