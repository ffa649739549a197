//! A split that lives on the device: uploaded once, batches gathered there by index.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::{Split, IMAGE_SIDE};

/// Pixel normalisation `(x / 255 - mean) / std`, computed in `f32` in that order as
/// torchvision's `ToTensor` then `Normalize` do.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Normalization {
    pub mean: f32,
    pub std: f32,
}

impl Normalization {
    /// The PyTorch example's MNIST mean and standard deviation.
    pub const MNIST: Self = Self {
        mean: 0.1307,
        std: 0.3081,
    };
    /// Fashion-MNIST's training-set mean and standard deviation, as commonly quoted.
    pub const FASHION_MNIST: Self = Self {
        mean: 0.2860,
        std: 0.3530,
    };
    /// Plain `x / 255` (flashlight, tch).
    pub const UNIT: Self = Self { mean: 0.0, std: 1.0 };

    pub fn apply(self, pixel: u8) -> f32 {
        (pixel as f32 / 255.0 - self.mean) / self.std
    }
}

/// Images and labels of a split on the device.
#[derive(Clone, Debug)]
pub struct DeviceSplit<B: Backend> {
    /// `[len, 1, 28, 28]`, normalised.
    pub images: Tensor<B, 4>,
    /// `[len]`, class indices.
    pub labels: Tensor<B, 1, Int>,
}

impl<B: Backend> DeviceSplit<B> {
    /// Normalises `split` on the host and copies it to `device`: the only host-to-device copy
    /// of image data in a run.
    pub fn upload(split: &Split, norm: Normalization, device: &B::Device) -> Self {
        let len = split.len();
        let pixels: Vec<f32> = split.images.iter().map(|&p| norm.apply(p)).collect();
        let images = Tensor::from_data(TensorData::new(pixels, [len, 1, IMAGE_SIDE, IMAGE_SIDE]), device);
        let labels: Vec<i64> = split.labels.iter().map(|&l| l as i64).collect();
        let labels = Tensor::from_data(TensorData::new(labels, [len]).convert::<B::IntElem>(), device);
        Self { images, labels }
    }

    pub fn len(&self) -> usize {
        self.labels.dims()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gathers the examples at `indices` on the device.
    ///
    /// # Shapes
    /// - `indices`: `[batch]`
    /// - output: `([batch, 1, 28, 28], [batch])`
    pub fn gather(&self, indices: Tensor<B, 1, Int>) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        (
            self.images.clone().select(0, indices.clone()),
            self.labels.clone().select(0, indices),
        )
    }

    /// The contiguous examples `start..end`, without copying on backends that slice by view.
    pub fn range(&self, start: usize, end: usize) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        (
            self.images.clone().slice(start..end),
            self.labels.clone().slice(start..end),
        )
    }
}

/// Uploads an index permutation (or any list of indices) as an int tensor.
pub fn indices<B: Backend>(indices: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let data: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Tensor::from_data(
        TensorData::new(data, [indices.len()]).convert::<B::IntElem>(),
        device,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::IMAGE_PIXELS;
    use burn::backend::NdArray;

    #[test]
    fn normalisation_matches_torchvision() {
        // transforms.Normalize((0.1307,), (0.3081,))(transforms.ToTensor()(img)) at 0 and 255:
        // (0 - 0.1307) / 0.3081 = -0.42421296, (1 - 0.1307) / 0.3081 = 2.8214867
        assert!((Normalization::MNIST.apply(0) - -0.424_212_96).abs() < 1e-6);
        assert!((Normalization::MNIST.apply(255) - 2.821_486_7).abs() < 1e-6);
        assert_eq!(Normalization::UNIT.apply(51), 0.2);
    }

    #[test]
    fn gathers_the_requested_examples() {
        let split = Split {
            images: (0..3 * IMAGE_PIXELS)
                .map(|i| (i / IMAGE_PIXELS) as u8 * 10)
                .collect(),
            labels: vec![4, 5, 6],
        };
        let device = Default::default();
        let on_device = DeviceSplit::<NdArray>::upload(&split, Normalization::UNIT, &device);
        let (x, y) = on_device.gather(indices::<NdArray>(&[2, 0], &device));
        assert_eq!(x.dims(), [2, 1, 28, 28]);
        let first_pixels: Vec<f32> = x.slice([0..2, 0..1, 0..1, 0..1]).into_data().to_vec().unwrap();
        assert_eq!(first_pixels, vec![20.0 / 255.0, 0.0]);
        let labels: Vec<i64> = y.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(labels, vec![6, 4]);
    }
}
