use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

/// PyTorch's `Dropout2d`: zeroes whole channels of a `[batch, channels, h, w]` tensor with
/// probability `prob` and scales the kept ones by `1 / (1 - prob)`.
///
/// burn's `Dropout` drops single elements; the PyTorch example the seed benchmark ran drops
/// feature maps, which regularises differently, so the recipe needs this one.
/// Like burn's `Dropout`, it is active only on an autodiff backend (training).
#[derive(Module, Clone, Debug)]
pub struct ChannelDropout {
    /// Probability of dropping a channel.
    pub prob: f64,
}

impl ChannelDropout {
    /// A channel dropout with drop probability `prob` in `[0, 1]`.
    pub fn new(prob: f64) -> Self {
        assert!(
            (0.0..=1.0).contains(&prob),
            "dropout probability must be in [0, 1], got {prob}"
        );
        Self { prob }
    }

    /// # Shapes
    /// - `input`: `[batch, channels, height, width]`
    /// - output: the same
    pub fn forward<B: Backend>(&self, input: Tensor<B, 4>) -> Tensor<B, 4> {
        if !B::ad_enabled(&input.device()) || self.prob == 0.0 {
            return input;
        }
        let [batch, channels, _, _] = input.dims();
        let keep = 1.0 - self.prob;
        // One draw per (sample, channel), broadcast over the feature map, keyed by the training
        // step (`ember_kernels::begin_dropout_step`) rather than the backend's generator.
        let mask = ember_kernels::keep_mask::<B, 4>(
            [batch, channels, 1, 1],
            ember_kernels::next_dropout_key(),
            keep,
            &input.device(),
        )
        .mul_scalar(1.0 / keep);
        input * mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{TestAutodiff, TestBackend};

    #[test]
    fn drops_whole_channels_and_rescales_the_rest() {
        let device = Default::default();
        ember_kernels::begin_dropout_step(7);
        let x = Tensor::<TestAutodiff, 4>::ones([8, 16, 5, 5], &device);
        let y = ChannelDropout::new(0.25).forward(x);
        let data = y.into_data().to_vec::<f32>().unwrap();
        let (mut dropped, mut kept) = (0, 0);
        for channel in data.chunks(25) {
            // A channel is either all zero or all 1/(1-p): never mixed.
            if channel.iter().all(|&v| v == 0.0) {
                dropped += 1;
            } else {
                assert!(
                    channel.iter().all(|&v| (v - 1.0 / 0.75).abs() < 1e-6),
                    "{channel:?}"
                );
                kept += 1;
            }
        }
        assert_eq!(dropped + kept, 8 * 16);
        // 128 Bernoulli(0.25) draws: expect 32 dropped; 10..60 is far outside chance.
        assert!((10..60).contains(&dropped), "dropped {dropped} of 128");
    }

    #[test]
    fn is_identity_without_autodiff() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 4>::ones([2, 3, 4, 4], &device);
        let y = ChannelDropout::new(0.5).forward(x.clone());
        y.into_data().assert_eq(&x.into_data(), true);
    }
}
