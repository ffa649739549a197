//! Batch normalisation of NCHW `f32` tensors per channel, forward (training and inference) and
//! backward, with an optional fused ReLU.
//!
//! Per-channel sums run one channel per task in a fixed order with `f64` accumulators, so they
//! do not depend on the thread count and stay close to the exact value (a channel of a batch of
//! 256 28x28 maps sums 200,704 terms); the element-wise passes run one image per task.

use rayon::prelude::*;

use super::pool::pool_2x2;
#[cfg(test)]
use super::pool::PoolShape;
use super::simd::{wide, Vectors};
use super::{lane_sum, Images, Out};

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

/// Where [`grad_sums`] adds the last `len % 16` values of a map: after the partial sums, in
/// order (batch norm's backward), or into partial sums `0..len % 16` like every other value
/// (batch norm + pool's, whose loop indexes them `k % 16`). Two orders of the same sum, each
/// kept so that results stay bit-identical to what they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    Apart,
    InLanes,
}

/// Batch norm backward's two sums over one map, `(sum g, sum g * (x - m))` in `f64`, where `g`
/// is `dy` stopped where the fused ReLU's output `y` (when given) is not positive
/// ([`pool_gate`]). Sixteen interleaved partial sums (value `k` into partial sum `k % 16`) over
/// the whole blocks of 16, the last `len % 16` values as `tail` says, and the partial sums added
/// in lane order. With `cpu` other than portable, the partial sums are taken in vectors
/// ([`super::simd::Avx512::bn_grad_lanes`], [`super::simd::Avx2::bn_grad_lanes`]),
/// bit-identical.
pub(crate) fn grad_sums(
    cpu: Vectors,
    x: &[f32],
    dy: &[f32],
    y: Option<&[f32]>,
    m: f64,
    tail: Tail,
) -> (f64, f64) {
    assert!(
        x.len() == dy.len() && y.is_none_or(|y| y.len() == x.len()),
        "batch norm backward sums: lengths"
    );
    let g = |k: usize| y.map_or(f64::from(dy[k]), |y| pool_gate(dy[k], y[k]));
    let blocks = match tail {
        Tail::Apart => x.len() / LANES * LANES,
        Tail::InLanes => x.len(),
    };
    let (sum, dot) = match cpu {
        #[cfg(target_arch = "x86_64")]
        Vectors::Avx512(cpu) => cpu.bn_grad_lanes(&x[..blocks], &dy[..blocks], y.map(|y| &y[..blocks]), m),
        #[cfg(target_arch = "x86_64")]
        Vectors::Avx2(cpu) => cpu.bn_grad_lanes(&x[..blocks], &dy[..blocks], y.map(|y| &y[..blocks]), m),
        _ => {
            let (mut sum, mut dot) = ([0.0f64; LANES], [0.0f64; LANES]);
            for k in 0..blocks {
                let g = g(k);
                sum[k % LANES] += g;
                dot[k % LANES] += g * (f64::from(x[k]) - m);
            }
            (sum, dot)
        }
    };
    let (mut sum_r, mut dot_r) = (0.0, 0.0);
    for k in blocks..x.len() {
        let g = g(k);
        sum_r += g;
        dot_r += g * (f64::from(x[k]) - m);
    }
    match tail {
        Tail::Apart => (sum.iter().sum::<f64>() + sum_r, dot.iter().sum::<f64>() + dot_r),
        Tail::InLanes => (sum.iter().sum::<f64>(), dot.iter().sum::<f64>()),
    }
}

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
        .map(|x| {
            wide(
                #[inline(always)]
                || each(s.channels, |c| f(&x[c * s.plane..][..s.plane])),
            )
        })
        .collect();
    per_image.into_iter().flatten().collect()
}

/// `[f(0), .., f(n - 1)]` by a plain loop that inlines into its caller: `collect` was a call
/// out of [`wide`]'s AVX-512 function, so the closures it ran were compiled for the baseline.
#[inline(always)]
fn each<T>(n: usize, mut f: impl FnMut(usize) -> T) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        v.push(f(i));
    }
    v
}

/// One map's mean and sum of squared deviations from it (`f64`), as [`batch_stats`] combines
/// them: [`map_moments`] of a map, [`combine_moments`] of a batch of them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MapMoments {
    pub mean: f64,
    pub m2: f64,
}

/// The moments of one map, taken while it is in cache: two passes over it in `f64` lane sums.
#[inline(always)]
fn map_moments(m: &[f32]) -> MapMoments {
    let mean = lane_sum(m, |v| v) / m.len() as f64;
    MapMoments {
        mean,
        m2: lane_sum(m, |v| (v - mean) * (v - mean)),
    }
}

/// The moments of each of `moments.len()` maps of `plane` elements laid out one after the other
/// in `maps` (one image's channels): what a kernel that has just written an image (still in
/// cache) hands on to [`combine_moments`], with the same values as [`batch_stats`] takes.
///
/// # Panics
/// If `maps` is not `moments.len() * plane` long.
pub fn image_moments(plane: usize, maps: &[f32], moments: &mut [MapMoments]) {
    assert_eq!(
        maps.len(),
        moments.len() * plane,
        "batch norm: moments of an image"
    );
    if plane == 0 {
        // No elements: `batch_stats`' NaN, whatever the combination.
        moments.fill(MapMoments::default());
        return;
    }
    wide(
        #[inline(always)]
        || {
            for (m, map) in moments.iter_mut().zip(maps.chunks_exact(plane)) {
                *m = map_moments(map);
            }
        },
    )
}

/// `(mean, biased variance)` of each channel from the moments of its maps, `moments[image *
/// channels + channel]`, combined in image order (Chan et al.'s pairwise update): exact to
/// rounding and independent of how the maps were taken.
///
/// # Panics
/// If there are not `s.batch * s.channels` moments.
pub fn combine_moments(s: &BnShape, moments: &[MapMoments]) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(moments.len(), s.batch * s.channels, "batch norm: moments length");
    let plane = s.plane as f64;
    let (mut means, mut vars) = (vec![0.0; s.channels], vec![0.0; s.channels]);
    for c in 0..s.channels {
        let (mut n, mut mean, mut m2) = (0.0f64, 0.0f64, 0.0f64);
        for i in 0..s.batch {
            let MapMoments {
                mean: mean_b,
                m2: m2_b,
            } = moments[i * s.channels + c];
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

/// `(mean, biased variance)` of each channel of `x`, in `f64`.
///
/// One pass over memory: each map's moments are taken while it is in cache ([`map_moments`]),
/// and the maps of a channel are combined in image order ([`combine_moments`]), exact to
/// rounding and independent of the thread count.
pub fn batch_stats(s: &BnShape, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(x.len(), s.len(), "batch norm: input length");
    let maps = per_map(s, x, map_moments);
    combine_moments(s, &maps)
}

/// [`batch_stats`] of an input given whole or produced image by image ([`Images::Produce`]):
/// the same values.
pub fn batch_stats_from(s: &BnShape, x: Images<'_>) -> (Vec<f64>, Vec<f64>) {
    if let Images::Values(x) = x {
        return batch_stats(s, x);
    }
    let mut moments = vec![MapMoments::default(); s.batch * s.channels];
    moments
        .par_chunks_mut(s.channels.max(1))
        .enumerate()
        .for_each(|(n, m)| x.with(s.channels * s.plane, n, 1, 3, |x| image_moments(s.plane, x, m)));
    combine_moments(s, &moments)
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
#[allow(clippy::too_many_arguments)]
pub fn normalise<'o>(
    s: &BnShape,
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    weight: &[f32],
    bias: &[f32],
    relu: bool,
    y: impl Into<Out<'o>>,
) {
    normalise_with(s, x, mean, inv_std, weight, bias, None, relu, y)
}

/// `y = relu((x - mean) * (inv_std * weight) + bias + residual)`: a residual block's end
/// (batch norm, the shortcut's add, the ReLU) in one pass. Each element is rounded as by the
/// three separate ops ([`normalise`], then an `f32` add, then the ReLU), so the values are the
/// same bits.
///
/// # Shapes
/// `x`, `residual`, `y`: `[batch, channels, h, w]` (`s`); the others `[channels]`
#[allow(clippy::too_many_arguments)]
pub fn normalise_add_relu<'o>(
    s: &BnShape,
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    weight: &[f32],
    bias: &[f32],
    residual: &[f32],
    y: impl Into<Out<'o>>,
) {
    assert_eq!(residual.len(), s.len(), "batch norm: residual length");
    normalise_with(s, x, mean, inv_std, weight, bias, Some(residual), true, y)
}

#[allow(clippy::too_many_arguments)]
fn normalise_with<'o>(
    s: &BnShape,
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    weight: &[f32],
    bias: &[f32],
    residual: Option<&[f32]>,
    relu: bool,
    y: impl Into<Out<'o>>,
) {
    let y = y.into();
    assert_eq!(x.len(), s.len(), "batch norm: input length");
    assert_eq!(y.len(), s.len(), "batch norm: output length");
    for v in [mean, inv_std, weight, bias] {
        assert_eq!(v.len(), s.channels, "batch norm: per-channel length");
    }
    if s.is_empty() {
        return;
    }
    let image = s.channels * s.plane;
    // The residual's images beside the others (none: an empty slice per image).
    let residual: Vec<&[f32]> = match residual {
        Some(r) => r.chunks(image).collect(),
        None => vec![&[][..]; s.batch],
    };
    // Each map is written once, never zeroed first (zeroing was 1.7% of a ResNet-20 step).
    y.par_out_chunks(image)
        .zip(x.par_chunks(image))
        .zip(residual.par_iter())
        .for_each(|((y, x), r)| {
            wide(
                #[inline(always)]
                || {
                    let mut rest = y;
                    for c in 0..s.channels {
                        let (y, after) = rest.split_at(s.plane);
                        rest = after;
                        let at = c * s.plane..(c + 1) * s.plane;
                        let (m, a, b) = (mean[c], inv_std[c] * weight[c], bias[c]);
                        let x = &x[at.clone()];
                        if r.is_empty() {
                            y.map(x, |x| normalised(x, m, a, b, relu));
                        } else {
                            y.zip_map(x, &r[at], |x, r| normalised_add(x, m, a, b, r, relu));
                        }
                    }
                },
            )
        });
}

/// One element of [`normalise`]: `(x - m) * a + b`, ReLU'd when `relu`.
#[inline(always)]
fn normalised(x: f32, m: f32, a: f32, b: f32, relu: bool) -> f32 {
    let v = (x - m) * a + b;
    // As `relu_in_place` and PyTorch's ReLU: NaN passes (`max` would drop it).
    if relu && v <= 0.0 {
        0.0
    } else {
        v
    }
}

/// One element of [`normalise_add_relu`]: `((x - m) * a + b) + r`, ReLU'd when `relu`.
#[inline(always)]
fn normalised_add(x: f32, m: f32, a: f32, b: f32, r: f32, relu: bool) -> f32 {
    let v = ((x - m) * a + b) + r;
    if relu && v <= 0.0 {
        0.0
    } else {
        v
    }
}

/// A batch norm whose ReLU'd output goes straight into a 2x2 max pool of stride 2 without
/// padding (the speedrun net's blocks): input `[batch, channels, in_h, in_w]`, pooled output
/// `[batch, channels, in_h / 2, in_w / 2]` (floor rounding, as PyTorch's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BnPoolShape {
    pub batch: usize,
    pub channels: usize,
    pub in_h: usize,
    pub in_w: usize,
}

impl BnPoolShape {
    /// The batch norm + pool over the output of convolution `s`.
    pub fn after(s: &super::conv::ConvShape) -> Self {
        Self {
            batch: s.batch,
            channels: s.out_channels,
            in_h: s.out_h(),
            in_w: s.out_w(),
        }
    }

    /// The batch norm's shape.
    pub fn bn(&self) -> BnShape {
        BnShape {
            batch: self.batch,
            channels: self.channels,
            plane: self.in_h * self.in_w,
        }
    }

    /// Every window lies in the image, and there is at least one.
    pub fn is_valid(&self) -> bool {
        self.batch * self.channels > 0 && self.in_h >= 2 && self.in_w >= 2
    }

    pub fn out_h(&self) -> usize {
        self.in_h / 2
    }

    pub fn out_w(&self) -> usize {
        self.in_w / 2
    }

    pub fn out_plane(&self) -> usize {
        self.out_h() * self.out_w()
    }

    /// Elements of the pooled output.
    pub fn out_len(&self) -> usize {
        self.batch * self.channels * self.out_plane()
    }

    #[cfg(test)]
    fn pool(&self) -> PoolShape {
        PoolShape {
            batch: self.batch,
            channels: self.channels,
            in_h: self.in_h,
            in_w: self.in_w,
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        }
    }
}

/// `max_pool2d(relu(normalise(x)), 2)` in one pass over `x`: each map is normalised into a
/// cache-resident scratch row and pooled from there, so the full-size output is never written.
/// `out` gets the window maxima, `argmax` their index in the input plane (as
/// [`max_pool2d_forward`]'s, same ties and NaN rule) and `x_at` the input there, which the
/// backward's sums read instead of the whole input.
///
/// # Shapes
/// - `x`: `[batch, channels, in_h, in_w]`; `mean`, `inv_std`, `weight`, `bias`: `[channels]`
/// - `out`, `argmax`, `x_at`: `[batch, channels, in_h / 2, in_w / 2]`, overwritten
#[allow(clippy::too_many_arguments)]
pub fn normalise_relu_pool<'o>(
    s: &BnPoolShape,
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    weight: &[f32],
    bias: &[f32],
    out: impl Into<Out<'o>>,
    argmax: impl Into<Out<'o, u32>>,
    x_at: impl Into<Out<'o>>,
) {
    assert_eq!(x.len(), s.bn().len(), "batch norm + pool: input length");
    normalise_relu_pool_from(
        s,
        Images::Values(x),
        mean,
        inv_std,
        weight,
        bias,
        out,
        argmax,
        x_at,
    )
}

/// [`normalise_relu_pool`] with the input given whole or produced image by image
/// ([`Images::Produce`], e.g. a convolution computed again): the same values.
#[allow(clippy::too_many_arguments)]
pub fn normalise_relu_pool_from<'o>(
    s: &BnPoolShape,
    x: Images<'_>,
    mean: &[f32],
    inv_std: &[f32],
    weight: &[f32],
    bias: &[f32],
    out: impl Into<Out<'o>>,
    argmax: impl Into<Out<'o, u32>>,
    x_at: impl Into<Out<'o>>,
) {
    let (out, argmax, x_at) = (out.into(), argmax.into(), x_at.into());
    assert!(s.is_valid(), "batch norm + pool: invalid shape {s:?}");
    let (plane, pooled) = (s.in_h * s.in_w, s.out_plane());
    if let Images::Values(x) = x {
        assert_eq!(x.len(), s.bn().len(), "batch norm + pool: input length");
    }
    for v in [&out, &x_at] {
        assert_eq!(v.len(), s.out_len(), "batch norm + pool: output length");
    }
    assert_eq!(argmax.len(), s.out_len(), "batch norm + pool: argmax length");
    for v in [mean, inv_std, weight, bias] {
        assert_eq!(v.len(), s.channels, "batch norm + pool: per-channel length");
    }
    assert!(plane <= u32::MAX as usize, "batch norm + pool: plane too large");
    let (image, out_image) = (s.channels * plane, s.channels * pooled);
    out.par_chunks_mut(out_image)
        .zip(
            argmax
                .par_chunks_mut(out_image)
                .zip(x_at.par_chunks_mut(out_image)),
        )
        .enumerate()
        .for_each(|(n, (out, (argmax, x_at)))| {
            x.with(image, n, 1, 3, |x| {
                wide(
                    #[inline(always)]
                    || normalise_relu_pool_image(s, x, mean, inv_std, weight, bias, out, argmax, x_at),
                )
            })
        });
}

/// One image of [`normalise_relu_pool`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn normalise_relu_pool_image(
    s: &BnPoolShape,
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    weight: &[f32],
    bias: &[f32],
    out: &mut [f32],
    argmax: &mut [u32],
    x_at: &mut [f32],
) {
    let (plane, pooled) = (s.in_h * s.in_w, s.out_plane());
    let mut y = vec![0.0f32; plane];
    for c in 0..s.channels {
        let x = &x[c * plane..][..plane];
        let at = c * pooled..(c + 1) * pooled;
        let (out, argmax, x_at) = (&mut out[at.clone()], &mut argmax[at.clone()], &mut x_at[at]);
        let (m, a, b) = (mean[c], inv_std[c] * weight[c], bias[c]);
        for (y, &x) in y.iter_mut().zip(x) {
            *y = normalised(x, m, a, b, true);
        }
        pool_2x2(s.in_w, &y, out, argmax, s.out_w());
        for (v, &i) in x_at.iter_mut().zip(&*argmax) {
            *v = x[i as usize];
        }
    }
}

/// Gradients of [`normalise_relu_pool`] with the batch's own statistics (training mode), given
/// the pooled output's gradient `dz`: `dx` (overwritten, every element), `dweight`, `dbias`.
///
/// The same values as [`max_pool2d_backward`] followed by [`batch_norm_backward`] with the
/// ReLU's gate, without their full-size intermediates: the gradient reaching the normalisation
/// is `dz` at each window's maximum where the pooled output is not `<= 0`, and zero elsewhere,
/// so the per-channel sums run over the pooled elements only (`x_at` holds the input there),
/// and `dx` is the zero-gradient formula everywhere, then each maximum's own.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu_pool_backward<'o>(
    s: &BnPoolShape,
    x: &[f32],
    mean: &[f64],
    inv_std: &[f64],
    weight: &[f32],
    dz: &[f32],
    z: &[f32],
    argmax: &[u32],
    x_at: &[f32],
    dx: Option<impl Into<Out<'o>>>,
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) {
    assert_eq!(x.len(), s.bn().len(), "batch norm + pool backward: input length");
    let x = Images::Values(x);
    let grad = bn_pool_input_grad(s, x, mean, inv_std, weight, dz, z, argmax, x_at, dweight, dbias);
    if let Some(dx) = dx {
        grad.all(dx);
    }
}

/// [`batch_norm_relu_pool_backward`]'s input gradient, image by image ([`Self::images`]): what
/// a convolution's backward before the batch norm reads a few images at a time
/// ([`Images::Produce`]) instead of the whole of it from memory.
pub struct BnPoolInputGrad<'a> {
    s: BnPoolShape,
    rules: Vec<DxRule>,
    x: Images<'a>,
    dz: &'a [f32],
    z: &'a [f32],
    argmax: &'a [u32],
}

impl BnPoolInputGrad<'_> {
    /// The whole input gradient into `dx`, images in parallel.
    pub fn all<'o>(&self, dx: impl Into<Out<'o>>) {
        let dx = dx.into();
        assert_eq!(
            dx.len(),
            self.s.bn().len(),
            "batch norm + pool backward: input gradient length"
        );
        let image = self.s.channels * self.s.in_h * self.s.in_w;
        dx.par_chunks_mut(image.max(1))
            .enumerate()
            .for_each(|(n, dx)| self.images(n, dx));
    }

    /// The input gradient of images `first..first + dx.len() / image` into `dx` (every element):
    /// the same values as [`batch_norm_relu_pool_backward`] writes there.
    ///
    /// # Panics
    /// If `dx` is not a whole number of images within the batch.
    pub fn images(&self, first: usize, dx: &mut [f32]) {
        let s = &self.s;
        let (plane, pooled) = (s.in_h * s.in_w, s.out_plane());
        let (image, out_image) = (s.channels * plane, s.channels * pooled);
        assert_eq!(
            dx.len() % image.max(1),
            0,
            "batch norm + pool backward: whole images"
        );
        let images = dx.len() / image.max(1);
        assert!(
            first + images <= s.batch,
            "batch norm + pool backward: images past the batch"
        );
        for (j, dx) in dx.chunks_exact_mut(image).enumerate() {
            let n = first + j;
            let (dz, z, argmax) = (
                &self.dz[n * out_image..][..out_image],
                &self.z[n * out_image..][..out_image],
                &self.argmax[n * out_image..][..out_image],
            );
            self.x.with(image, n, 1, 3, |x| {
                wide(
                    #[inline(always)]
                    || {
                        for (c, rule) in self.rules.iter().enumerate() {
                            let (dx, x) = (&mut dx[c * plane..][..plane], &x[c * plane..][..plane]);
                            // `batch_norm_backward`'s formula with g = 0 ...
                            for (d, &x) in dx.iter_mut().zip(x) {
                                *d = rule.dx(0.0, x);
                            }
                            // ... then at each window's maximum with its own g.
                            let at = c * pooled..(c + 1) * pooled;
                            for ((&d, &y), &i) in dz[at.clone()].iter().zip(&z[at.clone()]).zip(&argmax[at]) {
                                let g = pool_gate(d, y);
                                let i = i as usize;
                                dx[i] = rule.dx(g, x[i]);
                            }
                        }
                    },
                )
            })
        }
    }
}

/// The gradient `dz` that reaches the normalisation through a fused ReLU (batch norm's and the
/// pool's): it passes where the ReLU's (pooled) output `z` is not `<= 0`.
#[inline(always)]
fn pool_gate(dz: f32, z: f32) -> f64 {
    if z <= 0.0 {
        0.0
    } else {
        f64::from(dz)
    }
}

/// [`batch_norm_relu_pool_backward`]'s per-channel sums (over the pooled elements), `dweight`
/// and `dbias` from them, and its input gradient to take image by image. The sums read only the
/// pooled elements (`x_at`); the input `x` (given whole or produced image by image) is read when
/// the input gradient is taken.
#[allow(clippy::too_many_arguments)]
pub fn bn_pool_input_grad<'a>(
    s: &BnPoolShape,
    x: Images<'a>,
    mean: &[f64],
    inv_std: &[f64],
    weight: &[f32],
    dz: &'a [f32],
    z: &'a [f32],
    argmax: &'a [u32],
    x_at: &[f32],
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) -> BnPoolInputGrad<'a> {
    assert!(s.is_valid(), "batch norm + pool backward: invalid shape {s:?}");
    let pooled = s.out_plane();
    if let Images::Values(x) = x {
        assert_eq!(x.len(), s.bn().len(), "batch norm + pool backward: input length");
    }
    for v in [dz, z, x_at] {
        assert_eq!(v.len(), s.out_len(), "batch norm + pool backward: pooled length");
    }
    assert_eq!(
        argmax.len(),
        s.out_len(),
        "batch norm + pool backward: argmax length"
    );
    for v in [mean, inv_std] {
        assert_eq!(
            v.len(),
            s.channels,
            "batch norm + pool backward: per-channel length"
        );
    }
    assert_eq!(
        weight.len(),
        s.channels,
        "batch norm + pool backward: per-channel length"
    );
    let out_image = s.channels * pooled;
    let cpu = Vectors::detect();
    let per_image: Vec<Vec<(f64, f64)>> = dz
        .par_chunks(out_image)
        .zip(z.par_chunks(out_image).zip(x_at.par_chunks(out_image)))
        .map(|(dz, (z, x_at))| {
            wide(
                #[inline(always)]
                || {
                    each(
                        s.channels,
                        #[inline(always)]
                        |c| {
                            let at = c * pooled..(c + 1) * pooled;
                            let (dz, z, x_at) = (&dz[at.clone()], &z[at.clone()], &x_at[at]);
                            grad_sums(cpu, x_at, dz, Some(z), mean[c], Tail::InLanes)
                        },
                    )
                },
            )
        })
        .collect();
    if let Some(db) = &dbias {
        assert_eq!(
            db.len(),
            s.channels,
            "batch norm + pool backward: bias gradient length"
        );
    }
    if let Some(dw) = &dweight {
        assert_eq!(
            dw.len(),
            s.channels,
            "batch norm + pool backward: weight gradient length"
        );
    }
    let maps: Vec<(f64, f64)> = per_image.into_iter().flatten().collect();
    let n = s.bn().count() as f64;
    let rules = dx_rules(&maps, s.channels, n, mean, inv_std, weight, dweight, dbias);
    BnPoolInputGrad {
        s: *s,
        rules,
        x,
        dz,
        z,
        argmax,
    }
}

/// One channel's input gradient, `dx = scale * (g - mean_g - (x - mean) * k)` with
/// `scale = weight * inv_std` and `k = inv_std * mean(g * x_hat)`: each element in `f64` from
/// `f64` statistics and rounded once (see [`batch_norm_backward`]).
#[derive(Clone, Copy)]
struct DxRule {
    scale: f64,
    mean_g: f64,
    mean: f64,
    k: f64,
}

impl DxRule {
    #[inline(always)]
    fn dx(self, g: f64, x: f32) -> f32 {
        (self.scale * (g - self.mean_g - (f64::from(x) - self.mean) * self.k)) as f32
    }
}

/// The backward's per-channel step, shared by both backwards: each channel's sums of `g` and
/// of `g * x_hat` from the per-map sums (`maps[image * channels + c]`, of `g` and of
/// `g * (x - mean)`), in image order; `dbias` and `dweight` from them; and each channel's
/// [`DxRule`] (`n` elements per channel).
#[allow(clippy::too_many_arguments)]
fn dx_rules(
    maps: &[(f64, f64)],
    channels: usize,
    n: f64,
    mean: &[f64],
    inv_std: &[f64],
    weight: &[f32],
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) -> Vec<DxRule> {
    let batch = if channels == 0 { 0 } else { maps.len() / channels };
    let sums: Vec<(f64, f64)> = (0..channels)
        .map(|c| {
            let (mut sum, mut dot) = (0.0, 0.0);
            for i in 0..batch {
                let (a, b) = maps[i * channels + c];
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
    (0..channels)
        .map(|c| DxRule {
            scale: f64::from(weight[c]) * inv_std[c],
            mean_g: sums[c].0 / n,
            mean: mean[c],
            k: inv_std[c] * (sums[c].1 / n),
        })
        .collect()
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
pub fn batch_norm_backward<'o>(
    s: &BnShape,
    x: &[f32],
    mean: &[f64],
    inv_std: &[f64],
    weight: &[f32],
    dy: &[f32],
    relu_out: Option<&[f32]>,
    dx: Option<impl Into<Out<'o>>>,
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) {
    let grad = bn_input_grad(s, x, mean, inv_std, weight, dy, relu_out, dweight, dbias);
    if let Some(dx) = dx {
        grad.all(dx);
    }
}

/// [`batch_norm_backward`]'s first pass, its per-channel sums: `dweight` and `dbias` written,
/// and the input gradient ready to be written whole or a few images at a time (the
/// convolution before the batch norm can take it so, [`super::Images::Produce`], and never
/// store it).
#[allow(clippy::too_many_arguments)]
pub fn bn_input_grad<'a>(
    s: &BnShape,
    x: &'a [f32],
    mean: &[f64],
    inv_std: &[f64],
    weight: &[f32],
    dy: &'a [f32],
    relu_out: Option<&'a [f32]>,
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) -> BnInputGrad<'a> {
    assert_eq!(x.len(), s.len(), "batch norm: input length");
    assert_eq!(dy.len(), s.len(), "batch norm: gradient length");
    if let Some(y) = relu_out {
        assert_eq!(y.len(), s.len(), "batch norm: ReLU output length");
    }
    for v in [mean, inv_std] {
        assert_eq!(v.len(), s.channels, "batch norm: per-channel length");
    }
    assert_eq!(weight.len(), s.channels, "batch norm: per-channel length");
    let y = relu_out.unwrap_or(dy);
    let relu = relu_out.is_some();
    let cpu = Vectors::detect();
    // Per map: sum of g and of g * (x - mean); x and (dy, y) zipped in one pass.
    let image = s.channels * s.plane;
    let maps: Vec<(f64, f64)> = if image == 0 {
        Vec::new()
    } else {
        let per_image: Vec<Vec<(f64, f64)>> = x
            .par_chunks(image)
            .zip(dy.par_chunks(image).zip(y.par_chunks(image)))
            .map(|(x, (dy, y))| {
                wide(
                    #[inline(always)]
                    || {
                        each(
                            s.channels,
                            #[inline(always)]
                            |c| {
                                let at = c * s.plane..(c + 1) * s.plane;
                                let (x, dy, y) = (&x[at.clone()], &dy[at.clone()], &y[at]);
                                let y = relu.then_some(y);
                                grad_sums(cpu, x, dy, y, mean[c], Tail::Apart)
                            },
                        )
                    },
                )
            })
            .collect();
        per_image.into_iter().flatten().collect()
    };
    let rules = dx_rules(
        &maps,
        s.channels,
        s.count() as f64,
        mean,
        inv_std,
        weight,
        dweight,
        dbias,
    );
    BnInputGrad {
        s: *s,
        rules,
        x,
        dy,
        relu_out,
    }
}

/// Batch norm's input gradient once its sums are taken ([`bn_input_grad`]): each element in
/// `f64` from its `x`, `dy` (gated by the fused ReLU's output) and its channel's rule.
pub struct BnInputGrad<'a> {
    s: BnShape,
    rules: Vec<DxRule>,
    x: &'a [f32],
    dy: &'a [f32],
    relu_out: Option<&'a [f32]>,
}

impl BnInputGrad<'_> {
    /// The whole input gradient into `dx`, images in parallel.
    pub fn all<'o>(&self, dx: impl Into<Out<'o>>) {
        let dx = dx.into();
        assert_eq!(dx.len(), self.s.len(), "batch norm: input gradient length");
        if self.s.is_empty() {
            return;
        }
        let image = self.s.channels * self.s.plane;
        dx.par_chunks_mut(image)
            .enumerate()
            .for_each(|(n, dx)| self.images(n, dx));
    }

    /// The input gradient of images `first..first + dx.len() / image` into `dx` (every
    /// element): the same values as [`batch_norm_backward`] writes there.
    ///
    /// # Panics
    /// If `dx` is not a whole number of images within the batch.
    pub fn images(&self, first: usize, dx: &mut [f32]) {
        let s = &self.s;
        let image = s.channels * s.plane;
        if image == 0 {
            return;
        }
        assert_eq!(dx.len() % image, 0, "batch norm backward: whole images");
        assert!(
            first + dx.len() / image <= s.batch,
            "batch norm backward: images past the batch"
        );
        let at = first * image..first * image + dx.len();
        let (x, dy) = (&self.x[at.clone()], &self.dy[at.clone()]);
        let y = self.relu_out.map(|y| &y[at]);
        // The gradient reaching the normalisation: `dy`, stopped where the fused ReLU output 0.
        let gate = |dy: f64, y: f64| if y <= 0.0 { 0.0 } else { dy };
        wide(
            #[inline(always)]
            || {
                for (n, dx) in dx.chunks_exact_mut(image).enumerate() {
                    let at = n * image..(n + 1) * image;
                    let (x, dy) = (&x[at.clone()], &dy[at.clone()]);
                    for (c, rule) in self.rules.iter().enumerate() {
                        let map = c * s.plane..(c + 1) * s.plane;
                        let (dx, x, dy) = (&mut dx[map.clone()], &x[map.clone()], &dy[map.clone()]);
                        match y {
                            Some(y) => {
                                let y = &y[at.clone()][map];
                                for (((d, &x), &dy), &y) in dx.iter_mut().zip(x).zip(dy).zip(y) {
                                    *d = rule.dx(gate(f64::from(dy), f64::from(y)), x);
                                }
                            }
                            None => {
                                for ((d, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
                                    *d = rule.dx(f64::from(dy), x);
                                }
                            }
                        }
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, salt: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ salt) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    }

    /// The vector sums of batch norm's backward are the portable loop's, bit for bit: every
    /// length around the 16-lane blocks, with and without the ReLU gate (`y` with zeros of
    /// both signs, negatives and positives), against a mean that does not round to `f32`.
    #[test]
    fn vector_grad_sums_are_the_portable_ones() {
        let vectors = [
            crate::cpu::simd::Avx512::detect().map(Vectors::Avx512),
            crate::cpu::simd::Avx2::detect().map(Vectors::Avx2),
        ];
        if vectors.iter().all(Option::is_none) {
            eprintln!("no AVX-512F or AVX2 (or EMBER_SIMD=portable): only the portable loop runs");
            return;
        }
        // Gradients of magnitudes 1e-8 to 1e8 side by side: sums whose rounding depends on the
        // order (values of one scale sum exactly in f64).
        let spread = |v: Vec<f32>| -> Vec<f32> {
            let scale = |k: usize| 10f32.powi(4 * (k % 5) as i32 - 8);
            v.into_iter().enumerate().map(|(k, v)| v * scale(k)).collect()
        };
        for n in 0..80 {
            let (x, dy) = (values(n, 1), spread(values(n, 2)));
            let mut y = values(n, 3);
            for (k, v) in y.iter_mut().enumerate() {
                *v = match k % 7 {
                    0 => 0.0,
                    1 => -0.0,
                    _ => *v,
                };
            }
            let cases = [None, Some(&y[..])].map(|y| [Tail::Apart, Tail::InLanes].map(|t| (y, t)));
            for (y, tail) in cases.into_iter().flatten() {
                let m = 0.1 + 1e-12;
                let want = grad_sums(Vectors::Portable, &x, &dy, y, m, tail);
                for cpu in vectors.into_iter().flatten() {
                    let got = grad_sums(cpu, &x, &dy, y, m, tail);
                    let bits = |(a, b): (f64, f64)| (a.to_bits(), b.to_bits());
                    assert_eq!(
                        bits(got),
                        bits(want),
                        "{cpu:?}, n {n}, gated {}, {tail:?}",
                        y.is_some()
                    );
                }
            }
        }
        // The gate bites, and the two tails are two orders (the test would pass trivially with
        // either ignored in both forms).
        let (x, dy, y) = (values(37, 1), spread(values(37, 2)), values(37, 3));
        let sums = |y, tail| grad_sums(Vectors::Portable, &x, &dy, y, 0.1, tail);
        assert_ne!(sums(Some(&y[..]), Tail::Apart), sums(None, Tail::Apart));
        assert_ne!(sums(None, Tail::Apart), sums(None, Tail::InLanes));
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

    /// The fused batch norm + ReLU + 2x2 pool against the three kernels it replaces: the same
    /// pooled values and argmax bit for bit (ties among the ReLU's zeros included), and the
    /// same gradients to rounding, on even and odd sizes (odd ones leave a row and a column
    /// outside every window).
    #[test]
    fn fused_pool_matches_batch_norm_then_pool() {
        use crate::cpu::pool::{max_pool2d_backward, max_pool2d_forward};
        for (batch, channels, in_h, in_w) in [
            (2, 3, 4, 4),
            (3, 2, 7, 7),
            (1, 1, 2, 3),
            (2, 4, 14, 14),
            (2, 2, 5, 9),
        ] {
            let s = BnPoolShape {
                batch,
                channels,
                in_h,
                in_w,
            };
            let bn = s.bn();
            // Values on a coarse grid: equal maxima and many zeros after the ReLU.
            let x: Vec<f32> = values(bn.len(), 11)
                .iter()
                .map(|v| (v * 2.0).round() / 2.0)
                .collect();
            let dz = values(s.out_len(), 5);
            let (w, b): (Vec<f32>, Vec<f32>) = (0..channels)
                // Channel 1's shift puts whole windows below zero: maxima tied at the ReLU's 0.
                .map(|c| {
                    (
                        if c % 2 == 0 { 1.3 } else { -0.8 },
                        if c == 1 { -2.5 } else { 0.1 * c as f32 },
                    )
                })
                .unzip();
            let (mean, var) = batch_stats(&bn, &x);
            let inv = inv_std(&var, 1e-5);
            let (mean32, inv32) = (to_f32(&mean), to_f32(&inv));

            let mut y = vec![0.0; bn.len()];
            normalise(&bn, &x, &mean32, &inv32, &w, &b, true, &mut y);
            let (mut z1, mut a1) = (vec![0.0; s.out_len()], vec![0u32; s.out_len()]);
            max_pool2d_forward(&s.pool(), &y, &mut z1, &mut a1);
            let (mut z2, mut a2, mut x_at) = (
                vec![0.0; s.out_len()],
                vec![0u32; s.out_len()],
                vec![0.0; s.out_len()],
            );
            normalise_relu_pool(&s, &x, &mean32, &inv32, &w, &b, &mut z2, &mut a2, &mut x_at);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&z1), bits(&z2), "{s:?}: pooled values");
            assert_eq!(a1, a2, "{s:?}: argmax");
            if channels > 1 {
                assert!(z1.contains(&0.0), "{s:?}: no window of ReLU zeros");
            }

            let mut dy = vec![0.0; bn.len()];
            max_pool2d_backward(&s.pool(), &dz, &a1, &mut dy);
            let (mut dx1, mut dw1, mut db1) = (vec![0.0; bn.len()], vec![0.0; channels], vec![0.0; channels]);
            batch_norm_backward(
                &bn,
                &x,
                &mean,
                &inv,
                &w,
                &dy,
                Some(&y),
                Some(&mut dx1),
                Some(&mut dw1),
                Some(&mut db1),
            );
            let (mut dx2, mut dw2, mut db2) = (vec![9.0; bn.len()], vec![0.0; channels], vec![0.0; channels]);
            batch_norm_relu_pool_backward(
                &s,
                &x,
                &mean,
                &inv,
                &w,
                &dz,
                &z2,
                &a2,
                &x_at,
                Some(&mut dx2),
                Some(&mut dw2),
                Some(&mut db2),
            );
            for (what, got, want) in [("dx", &dx2, &dx1), ("dweight", &dw2, &dw1), ("dbias", &db2, &db1)] {
                let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    assert!((g - w).abs() <= 1e-6 * scale, "{s:?}: {what}[{i}] {g} vs {w}");
                }
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
