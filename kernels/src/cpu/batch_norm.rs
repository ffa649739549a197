//! Batch normalisation of NCHW `f32` tensors per channel, forward (training and inference) and
//! backward, with an optional fused ReLU.
//!
//! Per-channel sums run one channel per task in a fixed order with `f64` accumulators, so they
//! do not depend on the thread count and stay close to the exact value (a channel of a batch of
//! 256 28x28 maps sums 200,704 terms); the element-wise passes run one image per task.

use rayon::prelude::*;

use super::lane_sum;

/// `batch` images of `channels` maps of `plane` (height x width) elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BnShape {
    pub batch: usize,
    pub channels: usize,
    pub plane: usize,
}

impl BnShape {
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.plane
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements per channel.
    pub fn count(&self) -> usize {
        self.batch * self.plane
    }

    /// The `plane` elements of channel `c` in image `n`.
    #[cfg(test)]
    fn map<'a>(&self, x: &'a [f32], n: usize, c: usize) -> &'a [f32] {
        let at = (n * self.channels + c) * self.plane;
        &x[at..at + self.plane]
    }
}

const LANES: usize = 16;

/// `f` of each `plane`-long map of `x` (image x channel), images in parallel, indexed
/// `[image * channels + channel]`, so that the per-channel combinations below run in image
/// order whatever the thread count.
fn per_map<T: Send>(s: &BnShape, x: &[f32], f: impl Fn(&[f32]) -> T + Sync) -> Vec<T> {
    let image = s.channels * s.plane;
    if image == 0 {
        return Vec::new();
    }
    let per_image: Vec<Vec<T>> = x
        .par_chunks(image)
        .map(|x| x.chunks_exact(s.plane).map(&f).collect())
        .collect();
    per_image.into_iter().flatten().collect()
}

/// `(mean, biased variance)` of each channel of `x`, in `f64`.
///
/// One pass over memory: each map's mean and sum of squared deviations are taken while it is in
/// cache (two passes over the map, in `f64` lane sums), and the maps of a channel are combined
/// in image order (Chan et al.'s pairwise update), exact to rounding and independent of the
/// thread count.
pub fn batch_stats(s: &BnShape, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(x.len(), s.len(), "batch norm: input length");
    let plane = s.plane as f64;
    let maps = per_map(s, x, |m| {
        let mean = lane_sum(m, |v| v) / plane;
        (mean, lane_sum(m, |v| (v - mean) * (v - mean)))
    });
    let (mut means, mut vars) = (vec![0.0; s.channels], vec![0.0; s.channels]);
    for c in 0..s.channels {
        let (mut n, mut mean, mut m2) = (0.0f64, 0.0f64, 0.0f64);
        for i in 0..s.batch {
            let (mean_b, m2_b) = maps[i * s.channels + c];
            let total = n + plane;
            let delta = mean_b - mean;
            mean += delta * plane / total;
            m2 += m2_b + delta * delta * n * plane / total;
            n = total;
        }
        means[c] = mean;
        vars[c] = if n > 0.0 { m2 / n } else { f64::NAN };
    }
    (means, vars)
}

/// `1 / sqrt(var + eps)` per channel.
pub fn inv_std(var: &[f64], eps: f64) -> Vec<f64> {
    var.iter().map(|&v| 1.0 / (v + eps).sqrt()).collect()
}

/// `values` rounded to `f32`.
pub fn to_f32(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

/// `y = (x - mean) * (inv_std * weight) + bias` per channel, then ReLU'd when `relu` (0 where
/// `y <= 0`; NaN stays NaN).
pub fn normalise(
    s: &BnShape,
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    weight: &[f32],
    bias: &[f32],
    relu: bool,
    y: &mut [f32],
) {
    assert_eq!(x.len(), s.len(), "batch norm: input length");
    assert_eq!(y.len(), s.len(), "batch norm: output length");
    for v in [mean, inv_std, weight, bias] {
        assert_eq!(v.len(), s.channels, "batch norm: per-channel length");
    }
    if s.is_empty() {
        return;
    }
    let image = s.channels * s.plane;
    y.par_chunks_mut(image)
        .zip(x.par_chunks(image))
        .for_each(|(y, x)| {
            for c in 0..s.channels {
                let (m, a, b) = (mean[c], inv_std[c] * weight[c], bias[c]);
                let at = c * s.plane..(c + 1) * s.plane;
                for (y, &x) in y[at.clone()].iter_mut().zip(&x[at]) {
                    let v = (x - m) * a + b;
                    // As `relu_in_place` and PyTorch's ReLU: NaN passes (`max` would drop it).
                    *y = if relu && v <= 0.0 { 0.0 } else { v };
                }
            }
        });
}

/// Gradients of [`normalise`] with the batch's own statistics (training mode): `dx`, `dweight`,
/// `dbias`. `relu_out` is the forward's output when a ReLU was fused (its zeros stop `dy`).
///
/// `dx = weight * inv_std * (g - mean(g) - x_hat * mean(g * x_hat))` sums to zero over each
/// channel, and the convolution before it relies on that: its weight gradient multiplies `dx` by
/// inputs with a large common part (MNIST's background), which cancels only if `dx`'s sum does.
/// Rounding `mean(g)` or the batch mean to `f32` once would shift every element of a channel the
/// same way and add up over its 200,000 elements, so each element is computed in `f64` from
/// `f64` statistics and rounded once.
pub fn batch_norm_backward(
    s: &BnShape,
    x: &[f32],
    mean: &[f64],
    inv_std: &[f64],
    weight: &[f32],
    dy: &[f32],
    relu_out: Option<&[f32]>,
    dx: Option<&mut [f32]>,
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) {
    assert_eq!(x.len(), s.len(), "batch norm: input length");
    assert_eq!(dy.len(), s.len(), "batch norm: gradient length");
    if let Some(y) = relu_out {
        assert_eq!(y.len(), s.len(), "batch norm: ReLU output length");
    }
    for v in [mean, inv_std] {
        assert_eq!(v.len(), s.channels, "batch norm: per-channel length");
    }
    assert_eq!(weight.len(), s.channels, "batch norm: per-channel length");
    // The gradient reaching the normalisation: `dy`, stopped where the fused ReLU output 0.
    let gate = |dy: f64, y: f64| if y <= 0.0 { 0.0 } else { dy };
    let y = relu_out.unwrap_or(dy);
    let relu = relu_out.is_some();
    // Per map: sum of g and of g * (x - mean); x and (dy, y) zipped in one pass.
    let image = s.channels * s.plane;
    let maps: Vec<(f64, f64)> = if image == 0 {
        Vec::new()
    } else {
        let per_image: Vec<Vec<(f64, f64)>> = x
            .par_chunks(image)
            .zip(dy.par_chunks(image).zip(y.par_chunks(image)))
            .map(|(x, (dy, y))| {
                (0..s.channels)
                    .map(|c| {
                        let at = c * s.plane..(c + 1) * s.plane;
                        let (x, dy, y) = (&x[at.clone()], &dy[at.clone()], &y[at]);
                        let m = mean[c];
                        let (mut sum, mut dot) = ([0.0f64; LANES], [0.0f64; LANES]);
                        let mut k = 0;
                        while k + LANES <= x.len() {
                            for l in 0..LANES {
                                let d = f64::from(dy[k + l]);
                                let g = if relu { gate(d, f64::from(y[k + l])) } else { d };
                                sum[l] += g;
                                dot[l] += g * (f64::from(x[k + l]) - m);
                            }
                            k += LANES;
                        }
                        let (mut sum_r, mut dot_r) = (0.0, 0.0);
                        for k in k..x.len() {
                            let d = f64::from(dy[k]);
                            let g = if relu { gate(d, f64::from(y[k])) } else { d };
                            sum_r += g;
                            dot_r += g * (f64::from(x[k]) - m);
                        }
                        (sum.iter().sum::<f64>() + sum_r, dot.iter().sum::<f64>() + dot_r)
                    })
                    .collect()
            })
            .collect();
        per_image.into_iter().flatten().collect()
    };
    // Per channel, in image order: sum of g and of g * x_hat.
    let sums: Vec<(f64, f64)> = (0..s.channels)
        .map(|c| {
            let (mut sum, mut dot) = (0.0, 0.0);
            for i in 0..s.batch {
                let (a, b) = maps[i * s.channels + c];
                sum += a;
                dot += b;
            }
            (sum, dot * inv_std[c])
        })
        .collect();
    if let Some(db) = dbias {
        for (d, (sum, _)) in db.iter_mut().zip(&sums) {
            *d = *sum as f32;
        }
    }
    if let Some(dw) = dweight {
        for (d, (_, dot)) in dw.iter_mut().zip(&sums) {
            *d = *dot as f32;
        }
    }
    let Some(dx) = dx else { return };
    assert_eq!(dx.len(), s.len(), "batch norm: input gradient length");
    if s.is_empty() {
        return;
    }
    let n = s.count() as f64;
    dx.par_chunks_mut(image)
        .zip(
            x.par_chunks(image)
                .zip(dy.par_chunks(image).zip(y.par_chunks(image))),
        )
        .for_each(|(dx, (x, (dy, y)))| {
            for c in 0..s.channels {
                let (m, inv) = (mean[c], inv_std[c]);
                let scale = f64::from(weight[c]) * inv;
                let (mean_g, mean_gx) = (sums[c].0 / n, sums[c].1 / n);
                // dx = scale * (g - mean_g - (x - m) * inv * mean_gx), each element in f64
                // from f64 statistics and rounded once.
                let k = inv * mean_gx;
                let at = c * s.plane..(c + 1) * s.plane;
                for (((d, &x), &dy), &y) in dx[at.clone()]
                    .iter_mut()
                    .zip(&x[at.clone()])
                    .zip(&dy[at.clone()])
                    .zip(&y[at])
                {
                    let dy = f64::from(dy);
                    let g = if relu { gate(dy, f64::from(y)) } else { dy };
                    *d = (scale * (g - mean_g - (f64::from(x) - m) * k)) as f32;
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, salt: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ salt) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    }

    /// The fused ReLU keeps NaN as PyTorch's ReLU and `relu_in_place` do (an imported
    /// variance below zero, a diverged run): `f32::max(NaN, 0.0)` would report 0.
    #[test]
    fn fused_relu_passes_nan_and_zeroes_negatives() {
        let s = BnShape {
            batch: 1,
            channels: 2,
            plane: 3,
        };
        let x = [f32::NAN, -1.0, 2.0, 1.0, 1.0, 1.0];
        let inv = [1.0f32, f32::NAN];
        let mut y = [9.0f32; 6];
        normalise(&s, &x, &[0.0, 0.0], &inv, &[1.0, 1.0], &[0.0, 0.0], true, &mut y);
        assert!(y[0].is_nan(), "{y:?}");
        assert_eq!(y[1..3], [0.0, 2.0]);
        assert!(y[3..].iter().all(|v| v.is_nan()), "{y:?}");
        let mut z = [f32::NAN, -1.0, 2.0];
        crate::cpu::relu_in_place(&mut z);
        assert!(z[0].is_nan() && z[1..] == [0.0, 2.0]);
    }

    /// The gradients against central differences of `sum(y * r)` in f64.
    #[test]
    fn backward_matches_finite_differences() {
        let s = BnShape {
            batch: 3,
            channels: 2,
            plane: 5,
        };
        let (x, r) = (values(s.len(), 1), values(s.len(), 7));
        let (w, b) = (vec![1.5f32, -0.7], vec![0.2f32, 0.1]);
        for relu in [false, true] {
            let loss = |x: &[f32], w: &[f32], b: &[f32]| -> f64 {
                let (mean, var) = batch_stats(&s, x);
                let inv = to_f32(&inv_std(&var, 1e-5));
                let mut y = vec![0.0; s.len()];
                normalise(&s, x, &to_f32(&mean), &inv, w, b, relu, &mut y);
                y.iter().zip(&r).map(|(a, b)| f64::from(a * b)).sum()
            };
            let (mean, var) = batch_stats(&s, &x);
            let inv = inv_std(&var, 1e-5);
            let mut y = vec![0.0; s.len()];
            normalise(&s, &x, &to_f32(&mean), &to_f32(&inv), &w, &b, relu, &mut y);
            let (mut dx, mut dw, mut db) = (vec![0.0; s.len()], vec![0.0; 2], vec![0.0; 2]);
            let relu_out = relu.then_some(&y[..]);
            batch_norm_backward(
                &s,
                &x,
                &mean,
                &inv,
                &w,
                &r,
                relu_out,
                Some(&mut dx),
                Some(&mut dw),
                Some(&mut db),
            );
            let h = 1e-2f32;
            let numeric = |f: &dyn Fn(f32) -> f64| (f(h) - f(-h)) / (2.0 * f64::from(h));
            for i in 0..s.len() {
                let d = numeric(&|e| {
                    let mut x2 = x.clone();
                    x2[i] += e;
                    loss(&x2, &w, &b)
                });
                assert!(
                    (d - f64::from(dx[i])).abs() < 2e-2,
                    "relu {relu}: dx[{i}] {} vs {d}",
                    dx[i]
                );
            }
            for c in 0..2 {
                let d = numeric(&|e| {
                    let mut w2 = w.clone();
                    w2[c] += e;
                    loss(&x, &w2, &b)
                });
                assert!(
                    (d - f64::from(dw[c])).abs() < 2e-2,
                    "dweight[{c}] {} vs {d}",
                    dw[c]
                );
                let d = numeric(&|e| {
                    let mut b2 = b.clone();
                    b2[c] += e;
                    loss(&x, &w, &b2)
                });
                assert!((d - f64::from(db[c])).abs() < 2e-2, "dbias[{c}] {} vs {d}", db[c]);
            }
        }
    }

    #[test]
    fn statistics_are_the_biased_mean_and_variance() {
        let s = BnShape {
            batch: 2,
            channels: 1,
            plane: 2,
        };
        let (mean, var) = batch_stats(&s, &[1.0, 2.0, 3.0, 6.0]);
        assert_eq!((mean, var), (vec![3.0], vec![3.5]));
    }

    /// The gradient of a channel sums to zero to within rounding of its elements, even when the
    /// incoming gradient has a large common part.
    #[test]
    fn input_gradient_sums_to_zero() {
        let s = BnShape {
            batch: 32,
            channels: 2,
            plane: 784,
        };
        let x: Vec<f32> = values(s.len(), 3).iter().map(|v| 3.0 + v).collect();
        let dy: Vec<f32> = values(s.len(), 5).iter().map(|v| 1e-3 + 1e-5 * v).collect();
        let (mean, var) = batch_stats(&s, &x);
        let mut dx = vec![0.0; s.len()];
        let inv = inv_std(&var, 1e-5);
        batch_norm_backward(
            &s,
            &x,
            &mean,
            &inv,
            &[0.7, 1.3],
            &dy,
            None,
            Some(&mut dx),
            None,
            None,
        );
        for c in 0..2 {
            let (sum, size): (f64, f64) = (0..32)
                .flat_map(|i| s.map(&dx, i, c).to_vec())
                .fold((0.0, 0.0), |(s, a), v| (s + f64::from(v), a + f64::from(v.abs())));
            assert!(
                sum.abs() < 1e-6 * size,
                "channel {c}: sum {sum:e} of |dx| sum {size:e}"
            );
        }
    }
}
