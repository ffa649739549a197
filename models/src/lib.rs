//! ember's models: burn `Module`s generic over the backend, layer for layer the CNNs that the
//! seed benchmarks trained in PyTorch, tch-rs and flashlight.
//!
//! Every model maps a batch of single-channel 28x28 images, `[batch, 1, 28, 28]`, to ten scores,
//! `[batch, 10]`. [`Classifier::output`] says whether those scores are already log-probabilities
//! (PyTorch's example ends in `log_softmax`) or raw logits, so the trainer picks NLL or
//! cross-entropy without knowing the model.

mod dropout;
mod flashlight;
mod pytorch_example;
mod tch;

pub use dropout::ChannelDropout;
pub use flashlight::{pad_replicate, FlashlightCnn, FlashlightCnnConfig};
pub use pytorch_example::{PytorchExampleNet, PytorchExampleNetConfig};
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
    /// - `images`: `[batch, 1, 28, 28]`
    /// - output: `[batch, classes]`
    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2>;

    /// Whether [`Classifier::forward`] returns log-probabilities or logits.
    fn output(&self) -> Output;
}

#[cfg(test)]
pub(crate) mod test_util {
    use burn::backend::{Autodiff, NdArray};
    pub type TestBackend = NdArray<f32>;
    pub type TestAutodiff = Autodiff<TestBackend>;
}
