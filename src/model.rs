//! ember's built-in models and the name a run's `config.json` gives its model.
//!
//! Every model, ember's and a user's, is an [`EmberModel`]: the training loop, checkpoints,
//! evaluation, prediction, import and benchmarks are generic over it (the registry, `src/registry.rs`, maps
//! `--model NAME` to one). The six models of the seed benchmarks and the recipes after them are
//! one [`EmberModel`], [`ModelKind`], whose network is the [`Model`] enum: their checkpoints
//! have been written as that enum's record since the first run, and stay loadable. A model
//! added after them is its own [`EmberModel`] (its file in `models/`) and one line in
//! `Registry::builtin` (`src/registry.rs`).

use std::borrow::Cow;
use std::fmt;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use clap::ValueEnum;
pub use ember_models::Classifier;
pub use ember_models::{ActivationBytes, DoesNotFit, EmberModel, ImageShape};
use ember_models::{
    FlashlightCnn, FlashlightCnnConfig, Output, PytorchExampleNet, PytorchExampleNetConfig, ResNet,
    ResNetConfig, SpeedrunNet, SpeedrunNetConfig, TchNet, TchNetConfig,
};
use serde::{Deserialize, Serialize};

/// A network the training loop trains on autodiff backend `B`: a burn module that classifies,
/// whose copy without autodiff (`valid()`, for evaluation) classifies too. Every
/// `#[derive(Module)]` struct with `impl<B: Backend> Classifier<B>` is one, on every backend.
pub trait Trainable<B: AutodiffBackend>:
    AutodiffModule<B, InnerModule: Classifier<B::InnerBackend>> + Classifier<B>
{
}

impl<B, M> Trainable<B> for M
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Classifier<B>,
    M::InnerModule: Classifier<B::InnerBackend>,
{
}

/// Classes of the MNIST-format datasets (the seed models' default output count).
const NUM_CLASSES: usize = 10;

/// The name of a run's model, as `--model` and `config.json` spell it: one of ember's
/// ([`ModelKind`]) or a user's ([`EmberModel::name`]). The registry (`src/registry.rs`) resolves it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelName(pub Cow<'static, str>);

impl ModelName {
    pub fn name(&self) -> &str {
        &self.0
    }

    pub fn new(name: impl Into<String>) -> Self {
        Self(Cow::Owned(name.into()))
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ModelName {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<ModelKind> for ModelName {
    fn from(kind: ModelKind) -> Self {
        Self(Cow::Borrowed(kind.name()))
    }
}

impl PartialEq<ModelKind> for ModelName {
    fn eq(&self, kind: &ModelKind) -> bool {
        self.0 == kind.name()
    }
}

impl PartialEq<ModelName> for ModelKind {
    fn eq(&self, name: &ModelName) -> bool {
        name == self
    }
}

/// The models of the seed benchmarks, and the ResNets and speedrun net of the recipes after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// PyTorch's official MNIST example CNN (1.2M parameters, log_softmax out).
    #[value(alias = "pytorch-example")]
    PytorchExampleNet,
    /// The tch-rs variant of it (logits out).
    #[value(alias = "tch")]
    TchNet,
    /// flashlight's MNIST CNN (3.3M parameters, replicate padding).
    #[value(alias = "flashlight")]
    FlashlightCnn,
    /// ResNet-20 with projection shortcuts and batch norm (272,186 parameters, logits out).
    Resnet20,
    /// ResNet-18's widths and depths on a CIFAR stem (11.2M parameters).
    Resnet18,
    /// The speedrun recipe's conv-BN-ReLU-pool net (104,426 parameters).
    #[value(alias = "speedrun")]
    SpeedrunNet,
}

impl ModelKind {
    /// A freshly initialised model for MNIST's 1x28x28 images and 10 classes (PyTorch's
    /// default initialisation).
    pub fn init<B: Backend>(self, device: &B::Device) -> Model<B> {
        self.init_for(ImageShape::MNIST, NUM_CLASSES, device)
    }

    /// A freshly initialised model for images of `input` and `classes` classes. The seed CNNs
    /// keep their exact layout (1x28x28 only, see [`ModelKind::fits`]) and change only their
    /// number of outputs; the ResNets take any channels and size, speedrun-net any size from
    /// 8x8.
    pub fn init_for<B: Backend>(self, input: ImageShape, classes: usize, device: &B::Device) -> Model<B> {
        match self {
            Self::PytorchExampleNet => Model::PytorchExample(
                PytorchExampleNetConfig::new()
                    .with_num_classes(classes)
                    .init(device),
            ),
            Self::TchNet => Model::Tch(TchNetConfig::new().with_num_classes(classes).init(device)),
            Self::FlashlightCnn => {
                Model::Flashlight(FlashlightCnnConfig::new().with_num_classes(classes).init(device))
            }
            Self::Resnet20 | Self::Resnet18 => {
                let config = match self {
                    Self::Resnet20 => ResNetConfig::resnet20(),
                    _ => ResNetConfig::resnet18(),
                };
                Model::ResNet(
                    config
                        .with_in_channels(input.channels)
                        .with_num_classes(classes)
                        .init(device),
                )
            }
            Self::SpeedrunNet => Model::Speedrun(
                SpeedrunNetConfig::new()
                    .with_in_channels(input.channels)
                    .with_num_classes(classes)
                    .with_image_size([input.height, input.width])
                    .init(device),
            ),
        }
    }

    /// Whether the model can take images of `input`.
    pub fn fits(self, input: ImageShape) -> Result<(), DoesNotFit> {
        let takes = match self {
            Self::PytorchExampleNet | Self::TchNet | Self::FlashlightCnn => ImageShape::MNIST,
            Self::SpeedrunNet if input.height < 8 || input.width < 8 => ImageShape {
                channels: input.channels,
                height: 8,
                width: 8,
            },
            Self::Resnet20 | Self::Resnet18 | Self::SpeedrunNet => return Ok(()),
        };
        if input == takes {
            return Ok(());
        }
        Err(DoesNotFit {
            model: self.name().to_string(),
            takes,
            got: input,
        })
    }

    /// The built-in seed model named `name` (or one of its aliases).
    pub fn from_name(name: &str) -> Option<Self> {
        <Self as ValueEnum>::from_str(name, false).ok()
    }

    /// The name used on the command line and in `config.json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::PytorchExampleNet => "pytorch-example-net",
            Self::TchNet => "tch-net",
            Self::FlashlightCnn => "flashlight-cnn",
            Self::Resnet20 => "resnet20",
            Self::Resnet18 => "resnet18",
            Self::SpeedrunNet => "speedrun-net",
        }
    }

    /// The model with every dropout probability 0: deterministic in training mode, for
    /// comparing gradients with PyTorch.
    pub fn init_without_dropout<B: Backend>(self, device: &B::Device) -> Model<B> {
        match self {
            Self::PytorchExampleNet => Model::PytorchExample(
                PytorchExampleNetConfig::new()
                    .with_dropout1(0.0)
                    .with_dropout2(0.0)
                    .init(device),
            ),
            Self::TchNet => Model::Tch(
                TchNetConfig::new()
                    .with_dropout1(0.0)
                    .with_dropout2(0.0)
                    .init(device),
            ),
            Self::FlashlightCnn => {
                Model::Flashlight(FlashlightCnnConfig::new().with_dropout(0.0).init(device))
            }
            Self::Resnet20 | Self::Resnet18 | Self::SpeedrunNet => self.init(device),
        }
    }

    /// Multiply-accumulates of one forward pass over one 1x28x28 image, counting convolutions and
    /// linear layers only (activations, pooling and padding are bandwidth, not FLOPs).
    /// A training step costs about three forward passes: forward, gradient w.r.t. inputs and
    /// w.r.t. weights.
    pub fn forward_macs_per_image(self) -> u64 {
        self.layers(ImageShape::MNIST)
            .expect("every built-in takes 1x28x28")
            .iter()
            .map(|l| l.macs)
            .sum()
    }

    /// The convolutions and linear layers of one forward pass over one image of `input` (10
    /// classes), in order; `None` for a shape the model does not take.
    pub fn layers(self, input: ImageShape) -> Option<Vec<Layer>> {
        self.fits(input).ok()?;
        let (c, mut h, mut w) = (input.channels as u64, input.height as u64, input.width as u64);
        Some(match self {
            // conv1 32x1x3x3 at 26x26, conv2 64x32x3x3 at 24x24, fc1 9216x128, fc2 128x10
            Self::PytorchExampleNet | Self::TchNet => vec![
                Layer::conv(32, 1, 3, 26, 26),
                Layer::conv(64, 32, 3, 24, 24),
                Layer::linear(9216, 128),
                Layer::linear(128, 10),
            ],
            // conv1 32x1x5x5 at 28x28, conv2 64x32x5x5 at 14x14, fc1 3136x1024, fc2 1024x10
            Self::FlashlightCnn => vec![
                Layer::conv(32, 1, 5, 28, 28),
                Layer::conv(64, 32, 5, 14, 14),
                Layer::linear(3136, 1024),
                Layer::linear(1024, 10),
            ],
            Self::Resnet20 | Self::Resnet18 => {
                let config = match self {
                    Self::Resnet20 => ResNetConfig::resnet20(),
                    _ => ResNetConfig::resnet18(),
                };
                // The stem, then per stage: the first block's conv1 (stride 2 after the first
                // stage) and projection, the other 3x3 convolutions at the stage's size.
                let mut cin = config.widths[0] as u64;
                let mut layers = vec![Layer::conv(cin, c, 3, h, w)];
                for (s, (&width, &depth)) in config.widths.iter().zip(&config.depths).enumerate() {
                    let width = width as u64;
                    if s > 0 {
                        (h, w) = (h.div_ceil(2), w.div_ceil(2));
                    }
                    layers.push(Layer::conv(width, cin, 3, h, w));
                    if cin != width {
                        layers.push(Layer::conv(width, cin, 1, h, w));
                    }
                    for _ in 1..2 * depth {
                        layers.push(Layer::conv(width, width, 3, h, w));
                    }
                    cin = width;
                }
                layers.push(Layer::linear(cin, 10));
                layers
            }
            // Three conv-BN-ReLU blocks, each followed by 2x2 pooling; at 1x28x28: 32x1x3x3 at
            // 28, 64x32x3x3 at 14, 128x64x3x3 at 7, fc 1152x10.
            Self::SpeedrunNet => {
                let mut layers = Vec::new();
                let mut cin = c;
                for width in [32, 64, 128] {
                    layers.push(Layer::conv(width, cin, 3, h, w));
                    (h, w) = (h / 2, w / 2);
                    cin = width;
                }
                layers.push(Layer::linear(cin * h * w, 10));
                layers
            }
        })
    }
}

/// One convolution or linear layer's work on one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layer {
    pub macs: u64,
    /// Elements of its output.
    pub outputs: u64,
}

impl Layer {
    /// A `k`x`k` convolution from `cin` to `cout` channels with an `h`x`w` output.
    pub fn conv(cout: u64, cin: u64, k: u64, h: u64, w: u64) -> Self {
        Self {
            macs: cout * cin * k * k * h * w,
            outputs: cout * h * w,
        }
    }

    pub fn linear(inputs: u64, outputs: u64) -> Self {
        Self {
            macs: inputs * outputs,
            outputs,
        }
    }
}

/// The seed models as one [`EmberModel`]: the value says which, the network is [`Model`].
impl EmberModel for ModelKind {
    type Net<B: Backend> = Model<B>;

    fn name(&self) -> &str {
        ModelKind::name(*self)
    }

    fn aliases(&self) -> Vec<String> {
        // The `#[value(alias = ..)]`s above: one declaration for clap and the registry.
        self.to_possible_value()
            .map(|v| v.get_name_and_aliases().skip(1).map(str::to_string).collect())
            .unwrap_or_default()
    }

    fn about(&self) -> &str {
        match self {
            Self::PytorchExampleNet => {
                "PyTorch's official MNIST example CNN (1.2M parameters, log_softmax out)"
            }
            Self::TchNet => "the tch-rs variant of it (logits out)",
            Self::FlashlightCnn => "flashlight's MNIST CNN (3.3M parameters, replicate padding)",
            Self::Resnet20 => {
                "ResNet-20 with projection shortcuts and batch norm (272,186 parameters at 1x28x28)"
            }
            Self::Resnet18 => "ResNet-18's widths and depths on a CIFAR stem (11.2M parameters)",
            Self::SpeedrunNet => {
                "the speedrun recipe's conv-BN-ReLU-pool net (104,426 parameters at 1x28x28)"
            }
        }
    }

    fn init<B: Backend>(&self, input: ImageShape, classes: usize, device: &B::Device) -> Model<B> {
        self.init_for(input, classes, device)
    }

    fn fits(&self, input: ImageShape) -> Result<(), DoesNotFit> {
        ModelKind::fits(*self, input)
    }

    fn init_without_dropout<B: Backend>(
        &self,
        input: ImageShape,
        classes: usize,
        device: &B::Device,
    ) -> Model<B> {
        assert_eq!(
            (input, classes),
            (ImageShape::MNIST, NUM_CLASSES),
            "the seed models' parity fixtures are MNIST's"
        );
        ModelKind::init_without_dropout(*self, device)
    }

    fn forward_macs_per_image(&self, input: ImageShape) -> Option<u64> {
        Some(self.layers(input)?.iter().map(|l| l.macs).sum())
    }

    fn activation_bytes(&self, input: ImageShape) -> Option<ember_models::ActivationBytes> {
        let layers = self.layers(input)?;
        Some(ember_models::ActivationBytes::from_outputs(
            input,
            layers.iter().map(|l| l.outputs),
        ))
    }

    fn record_name<B: Backend>(&self, record: &ModelRecord<B>) -> Option<String> {
        Some(record_kind(record).name().to_string())
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One of [`ModelKind`]'s models.
#[derive(Module, Debug)]
pub enum Model<B: Backend> {
    PytorchExample(PytorchExampleNet<B>),
    Tch(TchNet<B>),
    Flashlight(FlashlightCnn<B>),
    ResNet(ResNet<B>),
    Speedrun(SpeedrunNet<B>),
}

impl<B: Backend> Model<B> {
    pub fn kind(&self) -> ModelKind {
        match self {
            Self::PytorchExample(_) => ModelKind::PytorchExampleNet,
            Self::Tch(_) => ModelKind::TchNet,
            Self::Flashlight(_) => ModelKind::FlashlightCnn,
            Self::ResNet(m) => resnet_kind(m.stages.len()),
            Self::Speedrun(_) => ModelKind::SpeedrunNet,
        }
    }
}

/// ResNet-20 has three stages, the ResNet-18 variant four.
fn resnet_kind(stages: usize) -> ModelKind {
    if stages == 3 {
        ModelKind::Resnet20
    } else {
        ModelKind::Resnet18
    }
}

/// The model a record holds: a record of another model than the one it is loaded into is an
/// error to report, not a panic (burn's `load_record` panics on a variant mismatch).
pub fn record_kind<B: Backend>(record: &ModelRecord<B>) -> ModelKind {
    match record {
        ModelRecord::PytorchExample(_) => ModelKind::PytorchExampleNet,
        ModelRecord::Tch(_) => ModelKind::TchNet,
        ModelRecord::Flashlight(_) => ModelKind::FlashlightCnn,
        ModelRecord::ResNet(r) => resnet_kind(r.stages.len()),
        ModelRecord::Speedrun(_) => ModelKind::SpeedrunNet,
    }
}

impl<B: Backend> Classifier<B> for Model<B> {
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        match self {
            Self::PytorchExample(m) => m.forward(images),
            Self::Tch(m) => m.forward(images),
            Self::Flashlight(m) => m.forward(images),
            Self::ResNet(m) => m.forward(images),
            Self::Speedrun(m) => m.forward(images),
        }
    }

    fn output(&self) -> Output {
        match self {
            Self::PytorchExample(m) => m.output(),
            Self::Tch(m) => m.output(),
            Self::Flashlight(m) => m.output(),
            Self::ResNet(m) => m.output(),
            Self::Speedrun(m) => m.output(),
        }
    }

    fn trainable_params(&self) -> usize {
        match self {
            Self::PytorchExample(m) => m.trainable_params(),
            Self::Tch(m) => m.trainable_params(),
            Self::Flashlight(m) => m.trainable_params(),
            Self::ResNet(m) => m.trainable_params(),
            Self::Speedrun(m) => m.trainable_params(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    #[test]
    fn kinds_build_their_models() {
        let device = Default::default();
        for kind in ModelKind::value_variants() {
            assert_eq!((*kind).init::<NdArray>(&device).kind(), *kind);
        }
    }

    #[test]
    fn seed_cnns_take_mnist_shapes_only_and_others_adapt() {
        let rgb32 = ImageShape {
            channels: 3,
            height: 32,
            width: 32,
        };
        let err = ModelKind::PytorchExampleNet.fits(rgb32).unwrap_err().to_string();
        assert!(
            err.starts_with("pytorch-example-net takes 1x28x28 images and this dataset's are 3x32x32: use --channels 1 --image-size 28"),
            "{err}"
        );
        assert!(ModelKind::PytorchExampleNet.fits(ImageShape::MNIST).is_ok());
        let device = Default::default();
        for kind in [ModelKind::Resnet20, ModelKind::SpeedrunNet] {
            assert!(kind.fits(rgb32).is_ok());
            let model = kind.init_for::<NdArray>(rgb32, 100, &device);
            assert_eq!(
                model.forward(Tensor::zeros([2, 3, 32, 32], &device)).dims(),
                [2, 100]
            );
        }
        let tiny = ImageShape {
            channels: 1,
            height: 6,
            width: 6,
        };
        assert!(ModelKind::SpeedrunNet.fits(tiny).is_err());
        let five = ModelKind::TchNet.init_for::<NdArray>(ImageShape::MNIST, 5, &device);
        assert_eq!(
            five.forward(Tensor::zeros([1, 1, 28, 28], &device)).dims(),
            [1, 5]
        );
    }

    #[test]
    fn mac_counts() {
        // 194,688 + 10,616,832 + 1,179,648 + 1,280
        assert_eq!(ModelKind::PytorchExampleNet.forward_macs_per_image(), 11_992_448);
        // 627,200 + 10,035,200 + 3,211,264 + 10,240
        assert_eq!(ModelKind::FlashlightCnn.forward_macs_per_image(), 13_883_904);
        // 225,792 + 3,612,672 + 3,612,672 + 11,520
        assert_eq!(ModelKind::SpeedrunNet.forward_macs_per_image(), 7_462_656);
        // Forward hooks on models.resnet20() / resnet18() of benches/pytorch/models.py at 1x28x28:
        // sum over Conv2d of out.numel() * in_channels * k * k, plus Linear in * out.
        assert_eq!(ModelKind::Resnet20.forward_macs_per_image(), 31_021_952);
        assert_eq!(ModelKind::Resnet18.forward_macs_per_image(), 455_800_832);
    }

    #[test]
    fn layer_counts() {
        // benches/pytorch/layer_counts.py: (MACs, output elements of every Conv2d and Linear).
        let shape = |channels, side| ImageShape {
            channels,
            height: side,
            width: side,
        };
        use ModelKind::*;
        for (kind, input, macs, outputs) in [
            (Resnet20, shape(1, 28), 31_021_952, 153_674),
            (Resnet20, shape(3, 32), 40_813_184, 200_714),
            (Resnet20, shape(1, 112), 496_341_632, 2_458_634),
            (Resnet18, shape(1, 28), 455_800_832, 480_010),
            (Resnet18, shape(3, 32), 555_422_720, 614_410),
            (Resnet18, shape(1, 112), 6_789_420_032, 7_526_410),
            (PytorchExampleNet, shape(1, 28), 11_992_448, 58_634),
            (FlashlightCnn, shape(1, 28), 13_883_904, 38_666),
            (SpeedrunNet, shape(1, 28), 7_462_656, 43_914),
        ] {
            let layers = kind.layers(input).unwrap();
            let counted = (
                layers.iter().map(|l| l.macs).sum::<u64>(),
                layers.iter().map(|l| l.outputs).sum::<u64>(),
            );
            assert_eq!(counted, (macs, outputs), "{kind} at {input}");
            assert_eq!(EmberModel::forward_macs_per_image(&kind, input), Some(macs));
            // Training keeps 2.5 float32 values per output and input pixel.
            let bytes = EmberModel::activation_bytes(&kind, input).unwrap();
            assert_eq!(bytes.train, 10 * (outputs + input.len() as u64));
        }
        // ResNet-20 at 224x224 (calibration in ActivationBytes::from_outputs): 98.8 MB an image
        // in training, 11.2 MB in evaluation (16x224x224 the largest output).
        let bytes = EmberModel::activation_bytes(&Resnet20, shape(1, 224)).unwrap();
        assert_eq!((bytes.train, bytes.eval), (98_846_820, 11_239_424));
        // A shape the model does not take has no count.
        assert!(TchNet.layers(shape(3, 32)).is_none());
        assert!(EmberModel::activation_bytes(&TchNet, shape(3, 32)).is_none());
    }
}
