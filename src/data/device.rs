//! A split that lives on the device: uploaded once, batches gathered there by index.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::Split;

/// Pixel normalisation `(x / 255 - mean[c]) / std[c]` per channel `c`, computed in `f32` in
/// that order as torchvision's `ToTensor` then `Normalize` do. One value applies to every
/// channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Normalization {
    pub mean: PerChannel,
    pub std: PerChannel,
}

/// One value per channel, or one for all. Saved as a number when there is one, so that
/// single-channel runs' `config.json` reads as before.
#[derive(Clone, Debug, PartialEq)]
pub struct PerChannel(pub Vec<f32>);

impl PerChannel {
    /// The value for channel `c`.
    pub fn at(&self, c: usize) -> f32 {
        if self.0.len() == 1 {
            self.0[0]
        } else {
            self.0[c]
        }
    }

    pub fn values(&self) -> &[f32] {
        &self.0
    }
}

impl From<f32> for PerChannel {
    fn from(v: f32) -> Self {
        Self(vec![v])
    }
}

impl std::fmt::Display for PerChannel {
    /// `0.1307`, or `0.4914,0.4822,0.4465` as `--mean` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(f32::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

impl Serialize for PerChannel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for PerChannel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(f32),
            Many(Vec<f32>),
        }
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(v) => Self(vec![v]),
            OneOrMany::Many(v) if !v.is_empty() => Self(v),
            OneOrMany::Many(_) => return Err(serde::de::Error::custom("an empty list of channel values")),
        })
    }
}

impl Normalization {
    fn same(mean: f32, std: f32) -> Self {
        Self {
            mean: mean.into(),
            std: std.into(),
        }
    }

    /// The PyTorch example's MNIST mean and standard deviation.
    pub fn mnist() -> Self {
        Self::same(0.1307, 0.3081)
    }

    /// Fashion-MNIST's training-set mean and standard deviation, as commonly quoted.
    pub fn fashion_mnist() -> Self {
        Self::same(0.2860, 0.3530)
    }

    /// Plain `x / 255` (flashlight, tch).
    pub fn unit() -> Self {
        Self::same(0.0, 1.0)
    }

    /// Channel `c`'s value for `pixel`.
    pub fn apply(&self, pixel: u8, c: usize) -> f32 {
        (pixel as f32 / 255.0 - self.mean.at(c)) / self.std.at(c)
    }

    /// Each channel's mean and (population) standard deviation of `split` on the 0..1 scale,
    /// as torchvision users compute them for `Normalize`: over every pixel of every image.
    pub fn of(split: &Split) -> Self {
        let channels = split.shape.channels;
        let plane = split.shape.height * split.shape.width;
        let mut sum = vec![0u64; channels];
        let mut squares = vec![0u64; channels];
        for image in split.images.chunks_exact(split.shape.len()) {
            for (c, values) in image.chunks_exact(plane).enumerate() {
                for &v in values {
                    sum[c] += u64::from(v);
                    squares[c] += u64::from(v) * u64::from(v);
                }
            }
        }
        let n = (split.len() * plane).max(1) as f64;
        let (mut mean, mut std) = (Vec::new(), Vec::new());
        for c in 0..channels {
            let m = sum[c] as f64 / n;
            let var = (squares[c] as f64 / n - m * m).max(0.0);
            mean.push((m / 255.0) as f32);
            // A constant channel would divide by zero: leave its scale alone.
            let s = var.sqrt() / 255.0;
            std.push(if s > 0.0 { s as f32 } else { 1.0 });
        }
        Self {
            mean: PerChannel(mean),
            std: PerChannel(std),
        }
    }

    /// The channel counts this normalisation fits: 1 value fits any.
    pub fn fits(&self, channels: usize) -> bool {
        [&self.mean, &self.std]
            .iter()
            .all(|v| v.0.len() == 1 || v.0.len() == channels)
    }
}

/// Images and labels of a split on the device.
#[derive(Clone, Debug)]
pub struct DeviceSplit<B: Backend> {
    /// `[len, channels, height, width]`, normalised.
    pub images: Tensor<B, 4>,
    /// `[len]`, class indices.
    pub labels: Tensor<B, 1, Int>,
}

impl<B: Backend> DeviceSplit<B> {
    /// Normalises `split` on the host and copies it to `device`: the only host-to-device copy
    /// of image data in a run.
    pub fn upload(split: &Split, norm: &Normalization, device: &B::Device) -> Self {
        let len = split.len();
        let shape = split.shape;
        let plane = shape.height * shape.width;
        let pixels: Vec<f32> = split
            .images
            .iter()
            .enumerate()
            .map(|(i, &p)| norm.apply(p, i / plane % shape.channels))
            .collect();
        let images = Tensor::from_data(
            TensorData::new(pixels, [len, shape.channels, shape.height, shape.width]),
            device,
        );
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
    /// - output: `([batch, channels, height, width], [batch])`
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
        assert!((Normalization::mnist().apply(0, 0) - -0.424_212_96).abs() < 1e-6);
        assert!((Normalization::mnist().apply(255, 0) - 2.821_486_7).abs() < 1e-6);
        assert_eq!(Normalization::unit().apply(51, 0), 0.2);
    }

    #[test]
    fn channel_statistics_match_numpy() {
        // Two 3x1x2 images; numpy: x = imgs / 255; x.mean(axis=(0, 2, 3)), x.std(axis=(0, 2, 3)).
        let split = Split {
            images: vec![0, 255, 10, 20, 7, 7, 255, 0, 30, 40, 7, 7],
            labels: vec![0, 1],
            shape: crate::data::ImageShape {
                channels: 3,
                height: 1,
                width: 2,
            },
        };
        let n = Normalization::of(&split);
        // channel 0: [0, 255, 255, 0] / 255 -> mean 0.5, std 0.5; channel 1: [10, 20, 30, 40]
        // -> mean 25 / 255, std sqrt(125) / 255; channel 2 constant: std 1 by convention.
        assert_eq!(n.mean.values()[0], 0.5);
        assert!((n.std.values()[0] - 0.5).abs() < 1e-7);
        assert!((n.mean.values()[1] - 25.0 / 255.0).abs() < 1e-7);
        assert!((n.std.values()[1] - 125f32.sqrt() / 255.0).abs() < 1e-7);
        assert_eq!(n.std.values()[2], 1.0);
        let on_device = DeviceSplit::<NdArray>::upload(&split, &n, &Default::default());
        assert_eq!(on_device.images.dims(), [2, 3, 1, 2]);
        let first: Vec<f32> = on_device
            .images
            .slice([0..1, 0..3, 0..1, 0..1])
            .into_data()
            .to_vec()
            .unwrap();
        assert_eq!(first, vec![-1.0, n.apply(10, 1), 0.0]);
    }

    #[test]
    fn config_values_read_as_a_number_or_a_list() {
        let one: Normalization = serde_json::from_str(r#"{"mean": 0.1307, "std": 0.3081}"#).unwrap();
        assert_eq!(one, Normalization::mnist());
        assert_eq!(
            serde_json::to_string(&one).unwrap(),
            r#"{"mean":0.1307,"std":0.3081}"#
        );
        let three: Normalization = serde_json::from_str(r#"{"mean": [0.5, 0.4, 0.3], "std": 0.25}"#).unwrap();
        assert!(three.fits(3) && !three.fits(2));
        assert_eq!(three.mean.to_string(), "0.5,0.4,0.3");
    }

    #[test]
    fn gathers_the_requested_examples() {
        let split = Split {
            images: (0..3 * IMAGE_PIXELS)
                .map(|i| (i / IMAGE_PIXELS) as u8 * 10)
                .collect(),
            labels: vec![4, 5, 6],
            shape: crate::data::ImageShape::MNIST,
        };
        let device = Default::default();
        let on_device = DeviceSplit::<NdArray>::upload(&split, &Normalization::unit(), &device);
        let (x, y) = on_device.gather(indices::<NdArray>(&[2, 0], &device));
        assert_eq!(x.dims(), [2, 1, 28, 28]);
        let first_pixels: Vec<f32> = x.slice([0..2, 0..1, 0..1, 0..1]).into_data().to_vec().unwrap();
        assert_eq!(first_pixels, vec![20.0 / 255.0, 0.0]);
        let labels: Vec<i64> = y.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(labels, vec![6, 4]);
    }
}
