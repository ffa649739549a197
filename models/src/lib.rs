//! ember's models: burn `Module`s generic over the backend. The CNNs that the seed benchmarks
//! trained in PyTorch, tch-rs and flashlight (layer for layer, 1x28x28 in), ResNet-20/18 and
//! the speedrun net (any channels and size), PyTorch-exact batch norm.
//!
//! Every model maps a batch of images, `[batch, channels, height, width]`, to one score per
//! class, `[batch, classes]`. [`Classifier::output`] says whether those scores are already
//! log-probabilities (PyTorch's example ends in `log_softmax`) or raw logits, so the trainer picks
//! NLL or cross-entropy without knowing the model.
//!
//! [`EmberModel`] is what ember needs to know of a model to train, evaluate, checkpoint and
//! import it: its name, how to build it for a dataset's images and classes, which images it
//! takes, its cost. ember's own models implement it exactly as a user's model does.

mod batch_norm;
mod dropout;
mod flashlight;
mod lenet;
mod pytorch_example;
mod resnet;
mod speedrun;
mod tch;

pub use batch_norm::{BatchNorm2d, BatchNorm2dConfig};
pub use dropout::ChannelDropout;
pub use flashlight::{pad_replicate, FlashlightCnn, FlashlightCnnConfig};
pub use lenet::{LeNet5, LeNet5Config, LeNet5Model};
pub use pytorch_example::{PytorchExampleNet, PytorchExampleNetConfig};
pub use resnet::{BasicBlock, Projection, ResNet, ResNetConfig};
pub use speedrun::{SpeedrunNet, SpeedrunNetConfig};
pub use tch::{TchNet, TchNetConfig};

use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

/// What a classifier's output holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `log_softmax` already applied: the loss is the negative log-likelihood.
    LogProbs,
    /// Unnormalised scores: the loss is cross-entropy (log_softmax, then NLL).
    Logits,
}

/// A model that classifies a batch of images.
pub trait Classifier<B: Backend>: Module<B> {
    /// # Shapes
    /// - `images`: `[batch, channels, height, width]`, as [`EmberModel::init`] was asked for
    /// - output: `[batch, classes]`
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2>;

    /// Whether [`Classifier::forward`] returns log-probabilities or logits.
    fn output(&self) -> Output;

    /// Trained parameters, as PyTorch's `sum(p.numel() for p in model.parameters())`: burn's
    /// `num_params` also counts batch norm's running statistics.
    fn trainable_params(&self) -> usize {
        self.num_params()
    }
}

/// The shape of one image as a model sees it: channels (1 grey, 3 RGB), height, width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, burn::serde::Serialize, burn::serde::Deserialize)]
#[serde(crate = "burn::serde")]
pub struct ImageShape {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
}

impl ImageShape {
    /// MNIST's and Fashion-MNIST's single-channel 28x28.
    pub const MNIST: Self = Self {
        channels: 1,
        height: 28,
        width: 28,
    };

    /// Values per image.
    pub fn len(&self) -> usize {
        self.channels * self.height * self.width
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for ImageShape {
    fn default() -> Self {
        Self::MNIST
    }
}

impl core::fmt::Display for ImageShape {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}x{}x{}", self.channels, self.height, self.width)
    }
}

/// A dataset whose images a model cannot take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoesNotFit {
    /// The model's name.
    pub model: String,
    /// The nearest shape it takes.
    pub takes: ImageShape,
    pub got: ImageShape,
}

impl core::fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The built-ins that adapt to other shapes, less this one (speedrun-net from 8x8).
        let others: Vec<&str> = ["resnet20", "resnet18", "speedrun-net"]
            .into_iter()
            .filter(|m| *m != self.model)
            .collect();
        let others = match others.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        write!(
            f,
            "{} takes {} images and this dataset's are {}: use --channels {} --image-size {} to convert them, \
             or a model that adapts to other shapes (--model {others})",
            self.model, self.takes, self.got, self.takes.channels, self.takes.height
        )
    }
}

impl std::error::Error for DoesNotFit {}

/// Memory one image costs beyond the weights, estimated in bytes
/// ([`EmberModel::activation_bytes`]): in a training step (what the backward pass keeps) and in
/// an evaluation batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivationBytes {
    pub train: u64,
    pub eval: u64,
}

impl ActivationBytes {
    /// The estimate from the elements of a network's layer outputs for one image of `input`.
    /// Training keeps about 2.5 float32 tensors per layer output; evaluation about 3.5 of the
    /// largest at a time. Measured as the growth of peak RSS with the batch on the CPU backend:
    /// ResNet-20 at 1x112x112 and 1x224x224 took 22.8 and 92.1 MB an image in training
    /// (estimated 24.7 and 98.8), 10.5 MB an image in evaluation at 224x224 (estimated 11.2).
    pub fn from_outputs(input: ImageShape, outputs: impl IntoIterator<Item = u64>) -> Self {
        let pixels = input.len() as u64;
        let (mut sum, mut largest) = (pixels, pixels);
        for n in outputs {
            sum = sum.saturating_add(n);
            largest = largest.max(n);
        }
        Self {
            train: sum.saturating_mul(10),
            eval: largest.saturating_mul(14),
        }
    }
}

/// A model ember can train, evaluate, checkpoint, import and benchmark: one declaration of its
/// facts. The value is the model's identity (a unit struct, or a config when one type serves
/// several models, as ResNet-20 and ResNet-18 share [`ResNet`]).
///
/// ```ignore
/// #[derive(Clone)]
/// struct Small;
/// impl EmberModel for Small {
///     type Net<B: Backend> = SmallNet<B>;
///     fn name(&self) -> &str { "small" }
///     fn init<B: Backend>(&self, input: ImageShape, classes: usize, device: &B::Device) -> SmallNet<B> {
///         SmallNetConfig::new(input.channels, classes).init(device)
///     }
/// }
/// ```
pub trait EmberModel: Clone + Send + Sync + 'static {
    /// The network on backend `B`: a burn `Module` (`#[derive(Module)]`) that classifies.
    type Net<B: Backend>: Classifier<B>;

    /// The name on the command line (`--model NAME`) and in a run's `config.json`: lowercase,
    /// digits and `-`.
    fn name(&self) -> &str;

    /// Other names `--model` accepts for it.
    fn aliases(&self) -> Vec<String> {
        Vec::new()
    }

    /// One line for `--help` and listings.
    fn about(&self) -> &str {
        ""
    }

    /// A new network, PyTorch-style initialised, for images of `input` and `classes` classes.
    /// Parameters are drawn from the backend's generator, which the trainer seeds first.
    fn init<B: Backend>(&self, input: ImageShape, classes: usize, device: &B::Device) -> Self::Net<B>;

    /// Whether the network can take images of `input`; the error names the nearest shape it takes.
    fn fits(&self, input: ImageShape) -> Result<(), DoesNotFit> {
        let _ = input;
        Ok(())
    }

    /// Multiply-accumulates of one forward pass over one image of `input` (convolutions and
    /// linear layers), for `ember bench`'s FLOP rate; `None` when not counted.
    fn forward_macs_per_image(&self, input: ImageShape) -> Option<u64> {
        let _ = input;
        None
    }

    /// Memory one image of `input` costs a training step and an evaluation beyond the weights,
    /// estimated ([`ActivationBytes::from_outputs`] from the layers' output sizes); `None` when
    /// not estimated. ember refuses a batch whose estimate does not fit in the device's memory
    /// before it trains, instead of aborting on an allocation later.
    fn activation_bytes(&self, input: ImageShape) -> Option<ActivationBytes> {
        let _ = input;
        None
    }

    /// The network with every dropout probability 0 (deterministic in training mode), for
    /// comparing its gradients with PyTorch's; a network without dropout is just [`EmberModel::init`]'s.
    fn init_without_dropout<B: Backend>(
        &self,
        input: ImageShape,
        classes: usize,
        device: &B::Device,
    ) -> Self::Net<B> {
        self.init(input, classes, device)
    }

    /// The model a saved record holds, where the record tells (ember's seed models share one
    /// record type whose variant names the model); checked against the run's `config.json`
    /// for checkpoints written before `state.json` named the model.
    #[doc(hidden)]
    fn record_name<B: Backend>(&self, record: &<Self::Net<B> as Module<B>>::Record) -> Option<String> {
        let _ = record;
        None
    }
}

// Generated by benches/pytorch/layer_reference.py; kept byte for byte as written.
#[cfg(test)]
#[rustfmt::skip]
mod torch_reference;
#[cfg(test)]
use torch_reference as reference;

#[cfg(test)]
pub(crate) mod test_util {
    use burn::backend::{Autodiff, NdArray};
    pub type TestBackend = NdArray<f32>;
    pub type TestAutodiff = Autodiff<TestBackend>;
}

#[cfg(test)]
mod does_not_fit_tests {
    use super::*;

    /// A model never suggests itself (speedrun-net's size error said "or speedrun-net").
    #[test]
    fn the_suggested_models_leave_out_the_one_that_does_not_fit() {
        let shape = |side| ImageShape {
            channels: 1,
            height: side,
            width: side,
        };
        let err = DoesNotFit {
            model: "speedrun-net".into(),
            takes: shape(8),
            got: shape(4),
        }
        .to_string();
        assert!(err.ends_with("(--model resnet20 or resnet18)"), "{err}");
        let err = DoesNotFit {
            model: "lenet5".into(),
            takes: shape(12),
            got: shape(4),
        }
        .to_string();
        assert!(
            err.ends_with("(--model resnet20, resnet18 or speedrun-net)"),
            "{err}"
        );
    }
}
