//! Training-time augmentation on the device: random translation (torchvision's
//! `RandomCrop(size, padding=p)` with a black border) and horizontal flip
//! (`RandomHorizontalFlip()`, applied after the crop, as in a `Compose` of the two).
//!
//! Each image's draw comes from `(seed, epoch)` and its position in the epoch's order, so a run
//! resumed at any step boundary draws what an uninterrupted one would. The draws of an epoch are
//! uploaded once, with the epoch's permutation; each batch is then moved by a gather on the
//! device: no image crosses to the host.

use std::ops::Range;

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::seed::mix_seed;

/// What a recipe's training images go through; the default is nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Augment {
    /// Shift each image by up to this many pixels in each direction, filling with black
    /// (`RandomCrop(28, padding=translate)`); 0: none.
    pub translate: usize,
    /// Mirror half of the images left to right (off for digits).
    pub flip: bool,
}

/// One epoch's draws, by position in the epoch's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Draws {
    /// Rows and columns to shift by, in `-translate..=translate`.
    pub dy: Vec<i64>,
    pub dx: Vec<i64>,
    /// 1: mirrored.
    pub flip: Vec<i64>,
}

impl Augment {
    pub fn is_none(&self) -> bool {
        self.translate == 0 && !self.flip
    }

    /// The draws of epoch `epoch` for `len` images.
    pub fn draws(&self, seed: u64, epoch: usize, len: usize) -> Draws {
        let mut rng = rand::rngs::StdRng::seed_from_u64(mix_seed(seed ^ 0xA5A5_0F0F_3C3C_9696, epoch as u64));
        let t = self.translate as i64;
        let mut d = Draws {
            dy: Vec::with_capacity(len),
            dx: Vec::with_capacity(len),
            flip: Vec::with_capacity(len),
        };
        for _ in 0..len {
            d.dy.push(rng.random_range(-t..=t));
            d.dx.push(rng.random_range(-t..=t));
            d.flip.push(i64::from(self.flip && rng.random_bool(0.5)));
        }
        d
    }
}

/// An epoch's draws on the device.
pub struct DeviceDraws<B: Backend> {
    dy: Tensor<B, 1, Int>,
    dx: Tensor<B, 1, Int>,
    flip: Tensor<B, 1, Int>,
    /// Each pixel's row-major index, `[1, h * w]`: built once, since `arange` is an upload on
    /// some backends and a step must not upload.
    pixel: Tensor<B, 2, Int>,
    /// The value of a black pixel after normalisation, per channel.
    fill: Fill<B>,
}

/// Black after normalisation: one value for all channels, or one per channel (`[1, c, 1]`).
enum Fill<B: Backend> {
    Same(f32),
    PerChannel(Tensor<B, 3>),
}

impl<B: Backend> DeviceDraws<B> {
    /// The draws for images of `size` (`[h, w]`); `fill`: each channel's black, or one value.
    pub fn upload(draws: &Draws, fill: &[f32], size: [usize; 2], device: &B::Device) -> Self {
        let up = |v: &[i64]| {
            Tensor::from_data(
                TensorData::new(v.to_vec(), [v.len()]).convert::<B::IntElem>(),
                device,
            )
        };
        Self {
            dy: up(&draws.dy),
            dx: up(&draws.dx),
            flip: up(&draws.flip),
            pixel: Tensor::<B, 1, Int>::arange(0..(size[0] * size[1]) as i64, device)
                .reshape([1, size[0] * size[1]]),
            fill: if fill.iter().all(|&f| f == fill[0]) {
                Fill::Same(fill[0])
            } else {
                Fill::PerChannel(Tensor::<B, 1>::from_floats(fill, device).reshape([1, fill.len(), 1]))
            },
        }
    }

    /// `images` (the batch at positions `at` of the epoch) moved by their draws:
    /// `out[y, x] = in[y + dy, x' + dx]` with `x' = w - 1 - x` when mirrored, black outside.
    ///
    /// # Shapes
    /// - `images`: `[batch, channels, h, w]`, `batch == at.len()`
    /// - output: the same
    pub fn apply(&self, images: Tensor<B, 4>, at: Range<usize>) -> Tensor<B, 4> {
        let [batch, channels, h, w] = images.dims();
        assert_eq!(
            self.pixel.dims()[1],
            h * w,
            "augmentation draws made for another image size"
        );
        let column = |t: &Tensor<B, 1, Int>| t.clone().slice(at.clone()).reshape([batch, 1]);
        let (dy, dx, flip) = (column(&self.dy), column(&self.dx), column(&self.flip));
        let pixel = self.pixel.clone();
        let ys = pixel.clone().div_scalar(w as i64); // [1, h*w]
        let xs = pixel.remainder_scalar(w as i64);
        // x' = x + flip * (w - 1 - 2x)
        let mirrored = xs.clone().mul_scalar(-2).add_scalar(w as i64 - 1);
        let src_x = xs.add(flip.mul(mirrored)).add(dx); // [batch, h*w]
        let src_y = ys.add(dy);
        let outside = src_y
            .clone()
            .lower_elem(0)
            .bool_or(src_y.clone().greater_equal_elem(h as i64))
            .bool_or(src_x.clone().lower_elem(0))
            .bool_or(src_x.clone().greater_equal_elem(w as i64));
        let index = src_y
            .clamp(0, h as i64 - 1)
            .mul_scalar(w as i64)
            .add(src_x.clamp(0, w as i64 - 1));
        let per_channel = [batch, channels, h * w];
        let moved = images
            .reshape(per_channel)
            .gather(2, index.unsqueeze_dim::<3>(1).expand(per_channel));
        let outside = outside.unsqueeze_dim::<3>(1).expand(per_channel);
        let moved = match &self.fill {
            Fill::Same(v) => moved.mask_fill(outside, *v),
            Fill::PerChannel(v) => moved.mask_where(outside, v.clone().expand(per_channel)),
        };
        moved.reshape([batch, channels, h, w])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    type TB = NdArray<f32>;

    /// The same move on the host, pixel by pixel, as the docs define it.
    fn reference(img: &[f32], h: usize, w: usize, dy: i64, dx: i64, flip: bool, fill: f32) -> Vec<f32> {
        let mut out = vec![fill; h * w];
        for y in 0..h as i64 {
            for x in 0..w as i64 {
                let xm = if flip { w as i64 - 1 - x } else { x };
                let (sy, sx) = (y + dy, xm + dx);
                if (0..h as i64).contains(&sy) && (0..w as i64).contains(&sx) {
                    out[(y * w as i64 + x) as usize] = img[(sy * w as i64 + sx) as usize];
                }
            }
        }
        out
    }

    #[test]
    fn moves_each_image_by_its_draw() {
        let (h, w, channels) = (5, 4, 2);
        let draws = Draws {
            dy: vec![0, 2, -1, 1],
            dx: vec![0, -1, 3, 0],
            flip: vec![0, 1, 0, 1],
        };
        let batch = 3;
        let pixels: Vec<f32> = (0..batch * channels * h * w).map(|i| i as f32).collect();
        let device = Default::default();
        let images =
            Tensor::<TB, 4>::from_data(TensorData::new(pixels.clone(), [batch, channels, h, w]), &device);
        // One black for every channel, and one per channel (normalised with per-channel means).
        for fill in [vec![-0.5], vec![-0.5, -2.0]] {
            let on_device = DeviceDraws::<TB>::upload(&draws, &fill, [h, w], &device);
            // The batch is positions 1..4 of the epoch.
            let moved: Vec<f32> = on_device
                .apply(images.clone(), 1..4)
                .into_data()
                .to_vec()
                .unwrap();
            for b in 0..batch {
                for c in 0..channels {
                    let at = (b * channels + c) * h * w;
                    let want = reference(
                        &pixels[at..at + h * w],
                        h,
                        w,
                        draws.dy[b + 1],
                        draws.dx[b + 1],
                        draws.flip[b + 1] == 1,
                        fill[c.min(fill.len() - 1)],
                    );
                    assert_eq!(
                        &moved[at..at + h * w],
                        &want[..],
                        "image {b} channel {c}, fill {fill:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn draws_depend_on_seed_and_epoch_only() {
        let a = Augment {
            translate: 2,
            flip: true,
        };
        let d = a.draws(7, 3, 1000);
        assert_eq!(d, a.draws(7, 3, 1000));
        assert_ne!(d, a.draws(7, 4, 1000));
        assert!(d.dy.iter().chain(&d.dx).all(|v| (-2..=2).contains(v)));
        for v in -2..=2 {
            assert!(d.dx.contains(&v), "shift {v} never drawn");
        }
        let flips = d.flip.iter().sum::<i64>();
        assert!((400..600).contains(&flips), "{flips} of 1000 mirrored");
        let no_flip = Augment {
            translate: 1,
            flip: false,
        }
        .draws(7, 3, 100);
        assert!(no_flip.flip.iter().all(|&f| f == 0));
    }
}
