//! LeNet-5 as PyTorch users write it today: LeCun et al.'s layout (two 5x5 convolutions with
//! 6 and 16 channels, three fully connected layers of 120, 84 and the classes) with ReLU and max
//! pooling, the first convolution padded by 2 so that MNIST's 28x28 images keep LeNet's 32x32
//! geometry. Its PyTorch twin is `LeNet5` in benches/pytorch/models.py.

use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::{backend::Backend, Tensor};

use ember_kernels::nn;

use crate::{ActivationBytes, Classifier, DoesNotFit, EmberModel, ImageShape, Output};

/// # Shapes (1x28x28 in)
/// - input: `[batch, channels, h, w]`
/// - output: `[batch, classes]` (logits)
#[derive(Module, Debug)]
pub struct LeNet5<B: Backend> {
    pub conv1: Conv2d<B>,
    pub conv2: Conv2d<B>,
    pub pool: MaxPool2d,
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
    pub fc3: Linear<B>,
}

#[derive(Config, Debug)]
pub struct LeNet5Config {
    #[config(default = 1)]
    pub in_channels: usize,
    #[config(default = 10)]
    pub num_classes: usize,
    /// `[height, width]` of the input images: the first linear layer's width follows it.
    #[config(default = "[28, 28]")]
    pub image_size: [usize; 2],
}

/// The side after conv1 (padding 2 keeps it), pool, conv2 (5x5) and pool.
fn feature_side(side: usize) -> usize {
    (side / 2).saturating_sub(4) / 2
}

impl LeNet5Config {
    pub fn init<B: Backend>(&self, device: &B::Device) -> LeNet5<B> {
        let [h, w] = self.image_size.map(feature_side);
        LeNet5 {
            conv1: Conv2dConfig::new([self.in_channels, 6], [5, 5])
                .with_padding(PaddingConfig2d::Explicit(2, 2, 2, 2))
                .init(device),
            conv2: Conv2dConfig::new([6, 16], [5, 5]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc1: LinearConfig::new(16 * h * w, 120).init(device),
            fc2: LinearConfig::new(120, 84).init(device),
            fc3: LinearConfig::new(84, self.num_classes).init(device),
        }
    }
}

impl<B: Backend> Classifier<B> for LeNet5<B> {
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = nn::conv2d_relu(&self.conv1, images); // [batch, 6, 28, 28]
        let x = nn::max_pool2d(&self.pool, x); // [batch, 6, 14, 14]
        let x = nn::conv2d_relu(&self.conv2, x); // [batch, 16, 10, 10]
        let x = nn::max_pool2d(&self.pool, x); // [batch, 16, 5, 5]
        let x = x.flatten::<2>(1, 3); // [batch, 400]
        let x = nn::linear_relu(&self.fc1, x); // [batch, 120]
        let x = nn::linear_relu(&self.fc2, x); // [batch, 84]
        nn::linear(&self.fc3, x) // [batch, classes]
    }

    fn output(&self) -> Output {
        Output::Logits
    }
}

/// LeNet-5 for ember: `--model lenet5`, any channels, images from 12x12.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeNet5Model;

impl EmberModel for LeNet5Model {
    type Net<B: Backend> = LeNet5<B>;

    fn name(&self) -> &str {
        "lenet5"
    }

    fn about(&self) -> &str {
        "LeNet-5 with ReLU and max pooling (61,706 parameters at 1x28x28)"
    }

    fn init<B: Backend>(&self, input: ImageShape, classes: usize, device: &B::Device) -> LeNet5<B> {
        LeNet5Config::new()
            .with_in_channels(input.channels)
            .with_num_classes(classes)
            .with_image_size([input.height, input.width])
            .init(device)
    }

    fn fits(&self, input: ImageShape) -> Result<(), DoesNotFit> {
        if input.height >= 12 && input.width >= 12 {
            return Ok(());
        }
        Err(DoesNotFit {
            model: self.name().to_string(),
            takes: ImageShape {
                channels: input.channels,
                height: 12,
                width: 12,
            },
            got: input,
        })
    }

    fn forward_macs_per_image(&self, input: ImageShape) -> Option<u64> {
        Some(layers(input).iter().map(|l| l.0).sum())
    }

    fn activation_bytes(&self, input: ImageShape) -> Option<ActivationBytes> {
        Some(ActivationBytes::from_outputs(input, layers(input).map(|l| l.1)))
    }
}

/// (multiply-accumulates, output elements) of each convolution and linear layer for one image
/// of `input` (10 classes).
fn layers(input: ImageShape) -> [(u64, u64); 5] {
    let (h, w) = (input.height as u64, input.width as u64);
    let (h2, w2) = ((h / 2).saturating_sub(4), (w / 2).saturating_sub(4));
    let (h3, w3) = (
        feature_side(input.height) as u64,
        feature_side(input.width) as u64,
    );
    [
        (6 * input.channels as u64 * 25 * h * w, 6 * h * w),
        (16 * 6 * 25 * h2 * w2, 16 * h2 * w2),
        (16 * h3 * w3 * 120, 120),
        (120 * 84, 84),
        (84 * 10, 10),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TestBackend;

    #[test]
    fn parameter_count_equals_pytorch() {
        // sum(p.numel() for p in models.LeNet5().parameters()) in benches/pytorch/models.py.
        let model = LeNet5Model.init::<TestBackend>(ImageShape::MNIST, 10, &Default::default());
        assert_eq!(model.num_params(), 61_706);
    }

    #[test]
    fn takes_any_channels_and_sizes_from_12() {
        let device = Default::default();
        let rgb = ImageShape {
            channels: 3,
            height: 32,
            width: 32,
        };
        let model = LeNet5Model.init::<TestBackend>(rgb, 100, &device);
        let x = Tensor::<TestBackend, 4>::zeros([2, 3, 32, 32], &device);
        assert_eq!(model.forward(x).dims(), [2, 100]);
        let small = ImageShape {
            channels: 1,
            height: 11,
            width: 28,
        };
        assert!(LeNet5Model.fits(small).is_err());
        // conv1 117,600 + conv2 240,000 + fc1 48,000 + fc2 10,080 + fc3 840.
        assert_eq!(
            LeNet5Model.forward_macs_per_image(ImageShape::MNIST),
            Some(416_520)
        );
    }
}
