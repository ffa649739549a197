//! 2-D convolution on contiguous NCHW `f32` buffers: im2col + one GEMM per image, direct
//! kernels on the padded image (pixels in the vector lanes for small channel counts on wide
//! rows, output channels in the lanes on rows of 7 to 14 pixels), and Winograd's F(2x2, 3x3)
//! for the wide 3x3 layers (`winograd`), each where it measured faster.
//!
//! Every image is computed by one thread with a single-threaded GEMM, so an image's result does
//! not depend on how many threads run; the weight and bias gradients sum over images in groups
//! whose boundaries depend only on the shapes, then add the group sums in group order. The
//! whole computation is therefore bit-identical for any thread count.
//!
//! Replicate padding (PyTorch's `padding_mode="replicate"`) is folded into im2col by clamping
//! coordinates, and its backward adds the border's gradient onto the edge pixels, so no padded
//! copy of the input is ever made.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::batch_norm::{image_moments, MapMoments};
use super::out::OutChunk;
use super::scratch::with_scratch;
use super::simd::Ahead;
use super::{gemm, lane_sum, out_len, relu_in_place, relu_mask, transpose, Gemm, Images, Out};

mod winograd;

/// How a convolution reads outside its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PadMode {
    /// Zeros outside the image (burn's and PyTorch's default).
    Zeros,
    /// The nearest border pixel (PyTorch's `padding_mode="replicate"`).
    Replicate,
}

/// The shapes of one convolution: input `[batch, in_channels, in_h, in_w]`, weight
/// `[out_channels, in_channels, kernel[0], kernel[1]]`, output `[batch, out_channels, out_h,
/// out_w]`. Dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvShape {
    pub batch: usize,
    pub in_channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    /// Symmetric padding: the same number of pixels before and after, per dimension.
    pub padding: [usize; 2],
    pub mode: PadMode,
}

impl ConvShape {
    /// Whether the kernels accept these shapes: non-empty, a kernel that fits the padded
    /// input, a non-zero stride, and an input to replicate from when padding replicates.
    pub fn is_valid(&self) -> bool {
        let fits = |size, i: usize| out_len(size, self.kernel[i], self.stride[i], self.padding[i]).is_some();
        self.in_channels > 0
            && self.out_channels > 0
            && self.in_h > 0
            && self.in_w > 0
            && fits(self.in_h, 0)
            && fits(self.in_w, 1)
    }

    pub fn out_h(&self) -> usize {
        out_len(self.in_h, self.kernel[0], self.stride[0], self.padding[0]).expect("valid conv shape")
    }

    pub fn out_w(&self) -> usize {
        out_len(self.in_w, self.kernel[1], self.stride[1], self.padding[1]).expect("valid conv shape")
    }

    /// Elements of one input image.
    pub fn in_image(&self) -> usize {
        self.in_channels * self.in_h * self.in_w
    }

    /// Elements of one output image.
    pub fn out_image(&self) -> usize {
        self.out_channels * self.out_h() * self.out_w()
    }

    /// Rows of the im2col matrix (= columns of the weight matrix): `in_channels * kh * kw`.
    pub fn patch(&self) -> usize {
        self.in_channels * self.kernel[0] * self.kernel[1]
    }

    /// Output pixels per channel.
    pub fn pixels(&self) -> usize {
        self.out_h() * self.out_w()
    }

    pub fn weight_len(&self) -> usize {
        self.out_channels * self.patch()
    }

    /// A 1x1 convolution with stride 1 and no padding: the image itself is the im2col matrix.
    fn is_pointwise(&self) -> bool {
        self.kernel == [1, 1] && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// Multiply-accumulates of the forward pass.
    pub fn forward_macs(&self) -> usize {
        self.batch * self.out_channels * self.pixels() * self.patch()
    }
}

/// Height and width of the input plus its padding on both sides.
fn padded_size(s: &ConvShape) -> (usize, usize) {
    (s.in_h + 2 * s.padding[0], s.in_w + 2 * s.padding[1])
}

/// The input coordinate that padded coordinate `p` reads, or `None` in zero padding.
fn source(p: usize, pad: usize, size: usize, mode: PadMode) -> Option<usize> {
    let i = p as isize - pad as isize;
    match mode {
        PadMode::Zeros => (0..size as isize).contains(&i).then_some(i as usize),
        PadMode::Replicate => Some(i.clamp(0, size as isize - 1) as usize),
    }
}

/// How the row loops below copy and add short rows: [`Portable`] loops, or AVX-512F masked
/// operations through the [`Avx512`](super::simd::Avx512) token, which only a CPU with the
/// feature yields. Each is safe to call with any slices (lengths are checked).
trait Rows: Copy {
    /// `dst = src` (same length).
    fn copy_row(self, dst: &mut [f32], src: &[f32]);
    /// `dst = src` (same length) into a slice not yet written: every element is.
    fn write_row(self, dst: &mut [MaybeUninit<f32>], src: &[f32]);
    /// `dst += src` (same length).
    fn add_row(self, dst: &mut [f32], src: &[f32]);
    /// `dst[j] = src[j * stride]` for `j < dst.len()` (as far as `src` reaches).
    fn copy_strided(self, dst: &mut [f32], src: &[f32], stride: usize) {
        copy_strided_loop(dst, src, stride)
    }
    /// `dst`'s rows of `width` floats = the rows of `src` that start `pitch` floats apart.
    fn copy_rows(self, dst: &mut [f32], src: &[f32], pitch: usize, width: usize) {
        for (r, row) in dst.chunks_exact_mut(width).enumerate() {
            self.copy_row(row, &src[r * pitch..][..width]);
        }
    }
    /// The `[h, w]` planes of `x` zero-padded by `pad` into `padded`'s planes, whole, when
    /// these operations have a kernel for it (`true`); else nothing is written and the row
    /// loop of [`pad_image_rows`] does it.
    fn pad_zeros(self, _padded: &mut [f32], _x: &[f32], _size: [usize; 2], _pad: [usize; 2]) -> bool {
        false
    }
}

/// [`Rows::copy_strided`] one float at a time.
#[inline(always)]
fn copy_strided_loop(dst: &mut [f32], src: &[f32], stride: usize) {
    for (d, &v) in dst.iter_mut().zip(src.iter().step_by(stride)) {
        *d = v;
    }
}

/// The loops any x86-64 (or other) CPU runs.
#[derive(Clone, Copy, Debug)]
struct Portable;

impl Rows for Portable {
    /// Copies in 8-float blocks: the rows here are 7 to 30 floats, too short for a `memcpy`
    /// call to pay off (ResNet-20's 7-float rows went through one: 4% of its step on an AVX2
    /// machine); rows of 4 to 7 floats as two overlapping 4-float blocks.
    #[inline(always)]
    fn copy_row(self, dst: &mut [f32], src: &[f32]) {
        assert_eq!(dst.len(), src.len(), "copy_row: lengths");
        let len = dst.len();
        if len < 8 {
            if len >= 4 {
                dst[..4].copy_from_slice(&src[..4]);
                dst[len - 4..].copy_from_slice(&src[len - 4..]);
            } else {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s;
                }
            }
            return;
        }
        let (mut d, mut s) = (dst.chunks_exact_mut(8), src.chunks_exact(8));
        for (d, s) in (&mut d).zip(&mut s) {
            d.copy_from_slice(s);
        }
        if len % 8 != 0 {
            // The last 8 floats once more, overlapping the blocks above: one vector copy instead
            // of up to seven scalar ones (flashlight's 14-float rows had six).
            dst[len - 8..].copy_from_slice(&src[len - 8..]);
        }
    }

    #[inline(always)]
    fn write_row(self, dst: &mut [MaybeUninit<f32>], src: &[f32]) {
        assert_eq!(dst.len(), src.len(), "write_row: lengths");
        for (d, &v) in dst.iter_mut().zip(src) {
            d.write(v);
        }
    }

    #[inline(always)]
    fn add_row(self, dst: &mut [f32], src: &[f32]) {
        assert_eq!(dst.len(), src.len(), "add_row: lengths");
        for (d, &s) in dst.iter_mut().zip(src) {
            *d += s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Rows for super::simd::Avx512 {
    #[inline(always)]
    fn copy_row(self, dst: &mut [f32], src: &[f32]) {
        super::simd::Avx512::copy_row(self, dst, src)
    }

    #[inline(always)]
    fn write_row(self, dst: &mut [MaybeUninit<f32>], src: &[f32]) {
        super::simd::Avx512::write_row(self, dst, src)
    }

    #[inline(always)]
    fn add_row(self, dst: &mut [f32], src: &[f32]) {
        super::simd::Avx512::add_row(self, dst, src)
    }

    #[inline(always)]
    fn copy_rows(self, dst: &mut [f32], src: &[f32], pitch: usize, width: usize) {
        super::simd::Avx512::copy_rows(self, dst, src, pitch, width)
    }

    /// Each padded row by whole 16-lane masked loads and stores, up to
    /// [`PAD_MAX_WIDTH`](super::simd::Avx512::PAD_MAX_WIDTH) floats wide.
    #[inline(always)]
    fn pad_zeros(self, padded: &mut [f32], x: &[f32], size: [usize; 2], pad: [usize; 2]) -> bool {
        super::simd::Avx512::pad_zeros(self, padded, x, size, pad)
    }

    /// Stride 2 (ResNet's downsampling layers) 16 floats at a time.
    #[inline(always)]
    fn copy_strided(self, dst: &mut [f32], src: &[f32], stride: usize) {
        if stride == 2 && !dst.is_empty() && src.len() >= 2 * dst.len() - 1 {
            super::simd::Avx512::copy_even(self, dst, src)
        } else {
            copy_strided_loop(dst, src, stride)
        }
    }
}

/// Runs `$name(cpu, ..)` inside a function compiled with AVX-512F when the CPU has it (`cpu`
/// the token that proves it), else `$name(Portable, ..)`, inside a function compiled for AVX2
/// where the CPU has that ([`super::simd::Avx2`]). The row functions hold their loops
/// directly (no closures passed to other functions) and are inlined into each, so the row
/// operations are compiled for the instructions of the function they land in.
macro_rules! dispatch_wide {
    ($name:ident($($arg:ident: $ty:ty),*)) => {{
        match super::simd::Vectors::detect() {
            #[cfg(target_arch = "x86_64")]
            super::simd::Vectors::Avx512(cpu) => {
                #[target_feature(enable = "avx512f")]
                fn wide(cpu: super::simd::Avx512, $($arg: $ty),*) {
                    $name(cpu, $($arg),*)
                }
                // SAFETY: calling a function compiled for AVX-512F needs a CPU that runs it,
                // which `cpu` proves.
                unsafe { wide(cpu, $($arg),*) }
            }
            #[cfg(target_arch = "x86_64")]
            super::simd::Vectors::Avx2(_) => {
                #[target_feature(enable = "avx2,fma")]
                fn wide($($arg: $ty),*) {
                    $name(Portable, $($arg),*)
                }
                // SAFETY: calling a function compiled for AVX2 and FMA needs a CPU that runs
                // them, which the token's `Avx2::detect` checked.
                unsafe { wide($($arg),*) }
            }
            _ => $name(Portable, $($arg),*),
        }
    }};
}

/// Unfolds one image `[in_channels, in_h, in_w]` into `col`, `[patch, pixels]`: through an
/// explicitly padded copy of the image (one small copy, after which unfolding needs no bounds
/// logic) when the convolution pads.
fn im2col(s: &ConvShape, x: &[f32], col: &mut [f32]) {
    im2col_pitched(s, x, col, s.pixels())
}

/// [`im2col`] into rows `pitch` floats apart: patch row `r` of the image lands at
/// `col[r * pitch..][..pixels]`, so that several images unfold side by side into one matrix
/// `[patch, images * pixels]` (each image's part of `col` starting at its column).
fn im2col_pitched(s: &ConvShape, x: &[f32], col: &mut [f32], pitch: usize) {
    if s.padding == [0, 0] {
        return unfold(s, x, col, pitch);
    }
    let (ph_n, pw_n) = padded_size(s);
    with_scratch(3, s.in_channels * ph_n * pw_n, |padded| {
        pad_image(s, x, padded);
        unfold(s, padded, col, pitch)
    })
}

/// The image `[in_channels, in_h, in_w]` with its padding made explicit, `[in_channels, in_h + 2 *
/// ph, in_w + 2 * pw]`: zeros or copies of the border.
#[inline(never)]
fn pad_image(s: &ConvShape, x: &[f32], padded: &mut [f32]) {
    dispatch_wide!(pad_image_rows(s: &ConvShape, x: &[f32], padded: &mut [f32]))
}

#[inline(always)]
fn pad_image_rows<R: Rows>(ops: R, s: &ConvShape, x: &[f32], padded: &mut [f32]) {
    let (ph_n, pw_n) = padded_size(s);
    if s.mode == PadMode::Zeros {
        // The whole planes that both hold, as the row loop below takes them.
        let area = s.in_h * s.in_w;
        let planes = (x.len() / area.max(1)).min(padded.len() / (ph_n * pw_n).max(1));
        let (x, padded) = (&x[..planes * area], &mut padded[..planes * ph_n * pw_n]);
        if ops.pad_zeros(padded, x, [s.in_h, s.in_w], s.padding) {
            return;
        }
    }
    for (plane, dst) in x
        .chunks_exact(s.in_h * s.in_w)
        .zip(padded.chunks_exact_mut(ph_n * pw_n))
    {
        for (r, row) in dst.chunks_exact_mut(pw_n).enumerate() {
            let Some(ih) = source(r, s.padding[0], s.in_h, s.mode) else {
                row.fill(0.0);
                continue;
            };
            let src = &plane[ih * s.in_w..][..s.in_w];
            let pw = s.padding[1];
            let (left, right) = match s.mode {
                PadMode::Zeros => (0.0, 0.0),
                PadMode::Replicate => (src[0], src[s.in_w - 1]),
            };
            row[..pw].fill(left);
            row[pw + s.in_w..].fill(right);
            ops.copy_row(&mut row[pw..pw + s.in_w], src);
        }
    }
}

/// im2col of an image whose padding is explicit (`padded_size`).
#[inline(never)]
fn unfold(s: &ConvShape, padded: &[f32], col: &mut [f32], pitch: usize) {
    dispatch_wide!(unfold_rows(s: &ConvShape, padded: &[f32], col: &mut [f32], pitch: usize))
}

#[inline(always)]
fn unfold_rows<R: Rows>(ops: R, s: &ConvShape, padded: &[f32], col: &mut [f32], pitch: usize) {
    let (oh_n, ow_n, [kh_n, kw_n], [sh, sw]) = (s.out_h(), s.out_w(), s.kernel, s.stride);
    let (ph_n, pw_n) = padded_size(s);
    let mut rows = col.chunks_mut(pitch);
    for plane in padded.chunks_exact(ph_n * pw_n) {
        for kh in 0..kh_n {
            for kw in 0..kw_n {
                let row = &mut rows.next().expect("col holds patch rows")[..oh_n * ow_n];
                if sw == 1 {
                    // Rows of up to 16 floats by whole-vector stores, each overlapping the next
                    // row (rewritten after it): masked stores of 7-float rows cost more. Divan,
                    // one thread, batch 64, fastest ms, 2 alternating runs: 64x7x7 -> 64 input
                    // gradient (the turned forward) 2.77/2.81 -> 2.60/2.65, 64x7x7 -> 128
                    // forward 4.30/4.46 -> 4.07/4.07; 14-float rows unchanged within noise.
                    ops.copy_rows(row, &plane[kh * pw_n + kw..], sh * pw_n, ow_n);
                    continue;
                }
                for (oh, dst) in row.chunks_exact_mut(ow_n).enumerate() {
                    ops.copy_strided(dst, &plane[(oh * sh + kh) * pw_n + kw..], sw);
                }
            }
        }
    }
}

/// Adds `col`, `[patch, pixels]`, back onto the image it was unfolded from (`dx` is
/// overwritten): the adjoint of [`im2col`]. Folds into a padded image first, then adds the
/// padding's share onto the pixels it copied (replicate) or drops it (zeros).
#[cfg(test)]
fn col2im(s: &ConvShape, col: &[f32], dx: &mut [f32]) {
    col2im_pitched(s, col, dx, s.pixels())
}

/// [`col2im`] from rows `pitch` floats apart (as [`im2col_pitched`] writes them).
fn col2im_pitched(s: &ConvShape, col: &[f32], dx: &mut [f32], pitch: usize) {
    if s.padding == [0, 0] {
        return fold(s, col, dx, pitch);
    }
    let (ph_n, pw_n) = padded_size(s);
    with_scratch(3, s.in_channels * ph_n * pw_n, |padded| {
        fold(s, col, padded, pitch);
        unpad(s, padded, dx)
    })
}

/// col2im into an image whose padding is explicit (`padded`, overwritten).
#[inline(never)]
fn fold(s: &ConvShape, col: &[f32], padded: &mut [f32], pitch: usize) {
    dispatch_wide!(fold_rows(s: &ConvShape, col: &[f32], padded: &mut [f32], pitch: usize))
}

#[inline(always)]
fn fold_rows<R: Rows>(ops: R, s: &ConvShape, col: &[f32], padded: &mut [f32], pitch: usize) {
    let (oh_n, ow_n, [kh_n, kw_n], [sh, sw]) = (s.out_h(), s.out_w(), s.kernel, s.stride);
    let (ph_n, pw_n) = padded_size(s);
    padded.fill(0.0);
    let mut rows = col.chunks(pitch);
    for plane in padded.chunks_exact_mut(ph_n * pw_n) {
        for kh in 0..kh_n {
            for kw in 0..kw_n {
                let row = &rows.next().expect("col holds patch rows")[..oh_n * ow_n];
                for (oh, src) in row.chunks_exact(ow_n).enumerate() {
                    let dst = &mut plane[(oh * sh + kh) * pw_n + kw..];
                    if sw == 1 {
                        ops.add_row(&mut dst[..ow_n], src);
                    } else {
                        for (d, &v) in dst.iter_mut().step_by(sw).zip(src) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// `dx` (overwritten) = the image part of `padded`, plus, for replicate padding, each padded
/// position added onto the border pixel it copied.
#[inline(never)]
fn unpad(s: &ConvShape, padded: &[f32], dx: &mut [f32]) {
    dispatch_wide!(unpad_rows(s: &ConvShape, padded: &[f32], dx: &mut [f32]))
}

#[inline(always)]
fn unpad_rows<R: Rows>(ops: R, s: &ConvShape, padded: &[f32], dx: &mut [f32]) {
    let (ph_n, pw_n) = padded_size(s);
    let [ph, pw] = s.padding;
    for (plane, dst) in padded
        .chunks_exact(ph_n * pw_n)
        .zip(dx.chunks_exact_mut(s.in_h * s.in_w))
    {
        for ih in 0..s.in_h {
            ops.copy_row(
                &mut dst[ih * s.in_w..][..s.in_w],
                &plane[(ih + ph) * pw_n + pw..][..s.in_w],
            );
        }
        if s.mode == PadMode::Replicate {
            // Every padded position outside the image read the nearest border pixel.
            for r in 0..ph_n {
                let ih = source(r, ph, s.in_h, s.mode).expect("replicate reads every row");
                let inside_row = (ph..ph + s.in_h).contains(&r);
                for q in 0..pw_n {
                    if inside_row && (pw..pw + s.in_w).contains(&q) {
                        continue;
                    }
                    let iw = source(q, pw, s.in_w, s.mode).expect("replicate reads every column");
                    dst[ih * s.in_w + iw] += plane[r * pw_n + q];
                }
            }
        }
    }
}

/// The vector instruction set of the direct kernels: AVX-512F where they exist, none elsewhere.
#[cfg(target_arch = "x86_64")]
type Simd = super::simd::Avx512;
#[cfg(not(target_arch = "x86_64"))]
type Simd = std::convert::Infallible;

/// The direct convolution ([`super::simd::Avx512::shifted_conv`]) for `s`, when it applies:
/// an AVX-512F CPU, stride 1, a kernel larger than 1x1 (1x1 is a plain GEMM already) and a
/// multiple of 4 output channels. Instead of unfolding each image (`kh * kw` copies of it, then
/// a GEMM that reads them back), it runs on the padded image itself: in the padded row pitch,
/// output pixel `(oh, ow)` at tap `(i, j)` reads padded pixel `(oh + i, ow + j)`, a constant
/// shift `i * pw_n + j` of the output's own position, so each tap is one shifted read of the
/// same buffer. The output is computed in that pitch (`kw - 1` byproduct pixels per row, for
/// all but the last row) and compacted.
#[cfg(target_arch = "x86_64")]
fn direct(s: &ConvShape) -> Option<super::simd::Avx512> {
    let applies = s.stride == [1, 1]
        && s.kernel != [1, 1]
        && s.out_channels % super::simd::CONV_OB == 0
        && s.in_channels >= DIRECT_MIN_CHANNELS
        && s.in_channels * s.kernel[0] * s.kernel[1] <= DIRECT_MAX_TERMS
        && s.out_w() >= DIRECT_MIN_WIDTH
        && s.is_valid();
    applies.then(super::simd::Avx512::detect).flatten()
}

/// Where the direct kernel beats im2col + GEMM (`benches/kernels.rs`, one thread, Zen 4):
/// ResNet-20's 16x28x28 layers (forward 3.2 -> 2.8 ms, input gradient 9.0 -> 6.7 ms at batch
/// 64) and ResNet-18's 64x32x32 ones (forward 55 -> 50 ms, but see [`DIRECT_MAX_TERMS`]). On 14- and 7-pixel rows the
/// padded pitch wastes 12-22% of the work and im2col's GEMM wins (32x14x14: 3.0 vs 3.3 ms);
/// with one input channel (a first layer) the unfolded image is small.
const DIRECT_MIN_WIDTH: usize = 28;
const DIRECT_MIN_CHANNELS: usize = 8;

/// The longest sum the direct kernel may take: each output is one running f32 sum over
/// in_channels x taps terms, in order. At ResNet-18's 64 x 9 = 576 the rounding showed in the
/// parity fixtures (conv1's weight gradient 2.4e-3 from PyTorch's after three steps, 3.4x
/// PyTorch's own float32 error); im2col's GEMM splits its sums into blocks.
const DIRECT_MAX_TERMS: usize = 288;

#[cfg(not(target_arch = "x86_64"))]
fn direct(_: &ConvShape) -> Option<std::convert::Infallible> {
    None
}

/// The direct weight gradient ([`super::simd::Avx512::shifted_weight_grad`]) for `s`, when it
/// applies: an AVX-512F CPU, stride 1, a kernel larger than 1x1 (a 1x1 convolution's input is
/// its own unfolded matrix), a multiple of 4 and at most [`DIRECT_DW_MAX_OUT`] output channels
/// and output rows of at least [`DIRECT_DW_MIN_WIDTH`] pixels. It reads each tap as a shifted
/// view of the padded image, as the direct forward does, instead of unfolding the image into
/// `kh * kw` copies for a GEMM.
#[cfg(target_arch = "x86_64")]
fn direct_weight_grad(s: &ConvShape) -> Option<super::simd::Avx512> {
    let applies = s.stride == [1, 1]
        && s.kernel != [1, 1]
        && s.out_channels % super::simd::CONV_OB == 0
        && s.out_channels <= DIRECT_DW_MAX_OUT
        && s.out_w() >= DIRECT_DW_MIN_WIDTH
        && s.is_valid();
    applies.then(super::simd::Avx512::detect).flatten()
}

#[cfg(not(target_arch = "x86_64"))]
fn direct_weight_grad(_: &ConvShape) -> Option<std::convert::Infallible> {
    None
}

/// Where the direct weight gradient beats im2col + GEMM: few output channels (the GEMM's
/// microkernel runs at one or two vectors wide there) on wide images. `benches/kernels.rs`
/// `conv2d_bwd_weight`, one thread, batch 64, Intel Xeon with AVX-512, fastest of 20 ms, im2col
/// + GEMM -> direct:
///
/// | layer                           | im2col + GEMM | direct |
/// |---------------------------------|---------------|--------|
/// | 16x28x28 -> 16 3x3 (ResNet-20)  | 3.55          | 2.12   |
/// | 1x28x28 -> 32 3x3 (speedrun)    | 1.31          | 1.10   |
/// | 1x28x28 -> 32 3x3 pad 0 (net)   | 1.11          | 0.97   |
/// | 1x28x28 -> 32 5x5 replicate     | 1.70          | 1.53   |
/// | 32x26x26 -> 64 3x3 pad 0        | 11.1          | 12.1   |
/// | 32x14x14 -> 32 3x3              | 2.21          | 2.68   |
/// | 32x14x14 -> 64 3x3              | 3.51          | 5.40   |
/// | 64x32x32 -> 64 3x3 (ResNet-18)  | 39.4          | 39.5   |
/// | 128x16x16 -> 128 3x3            | 32.4          | 48.5   |
const DIRECT_DW_MIN_WIDTH: usize = 24;
const DIRECT_DW_MAX_OUT: usize = 32;

/// One image's share of the weight gradient by the direct kernel: `gw_t[(c * taps + t) * o +
/// oc] += sum dy[oc] * x[c] shifted by tap t`, `dy` being the image's output gradient maps
/// `dy_stride` floats apart. Both go into the padded row pitch first: the image padded, the
/// output gradient with zeros in the `kw - 1` columns per row that hold no output pixel, each
/// of its rows starting on a 64-byte boundary.
#[cfg(target_arch = "x86_64")]
fn direct_weight_image(
    cpu: super::simd::Avx512,
    s: &ConvShape,
    shifts: &[usize],
    x: &[f32],
    dy: &[f32],
    dy_stride: usize,
    gw_t: &mut [f32],
) {
    with_padded(s, x, |padded, plane, pw_n| {
        let n = (s.out_h() - 1) * pw_n + s.out_w();
        let dy_pitch = n.next_multiple_of(16);
        with_scratch(0, s.out_channels * dy_pitch + 15, |rows| {
            // The first float on a 64-byte boundary (`align_offset` counts floats; at most 15).
            let skip = rows.as_ptr().align_offset(64).min(15);
            let rows = &mut rows[skip..][..s.out_channels * dy_pitch];
            spread(s, dy, dy_stride, rows, dy_pitch);
            let grad = super::simd::ShiftedWeightGrad {
                input: padded,
                channels: s.in_channels,
                plane,
                shifts,
                dy: rows,
                dy_pitch,
                out_channels: s.out_channels,
                n,
            };
            cpu.shifted_weight_grad(&grad, gw_t);
        })
    })
}

/// The inverse of [`compact`]: `rows[o * pitch + oh * pw_n + ow] = dy[o * dy_stride + oh *
/// out_w + ow]`, zeros in the columns between (rows `pitch` floats apart).
#[inline(never)]
fn spread(s: &ConvShape, dy: &[f32], dy_stride: usize, rows: &mut [f32], pitch: usize) {
    dispatch_wide!(spread_rows(s: &ConvShape, dy: &[f32], dy_stride: usize, rows: &mut [f32], pitch: usize))
}

#[inline(always)]
fn spread_rows<R: Rows>(ops: R, s: &ConvShape, dy: &[f32], dy_stride: usize, rows: &mut [f32], pitch: usize) {
    let (_, pw_n) = padded_size(s);
    let (oh_n, ow_n) = (s.out_h(), s.out_w());
    for o in 0..s.out_channels {
        let (src, dst) = (
            &dy[o * dy_stride..][..oh_n * ow_n],
            &mut rows[o * pitch..][..pitch],
        );
        for (oh, row) in src.chunks_exact(ow_n).enumerate() {
            ops.copy_row(&mut dst[oh * pw_n..][..ow_n], row);
            if oh + 1 < oh_n {
                dst[oh * pw_n + ow_n..][..pw_n - ow_n].fill(0.0);
            }
        }
        dst[(oh_n - 1) * pw_n + ow_n..].fill(0.0);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn direct_weight_image(
    cpu: std::convert::Infallible,
    _: &ConvShape,
    _: &[usize],
    _: &[f32],
    _: &[f32],
    _: usize,
    _: &mut [f32],
) {
    match cpu {}
}

/// The input-gradient convolution of a zero-padded stride-1 `s`: the output gradient
/// convolved with the kernel turned by 180 degrees and its channels swapped, padded by
/// `k - 1 - p` (`dx` is `s`'s input's size). `None` for replicate padding (its border
/// gradient adds onto the edge pixels) or padding beyond `k - 1`.
fn transposed(s: &ConvShape) -> Option<ConvShape> {
    let fits = s.mode == PadMode::Zeros && (0..2).all(|i| s.padding[i] < s.kernel[i]);
    fits.then(|| ConvShape {
        batch: s.batch,
        in_channels: s.out_channels,
        in_h: s.out_h(),
        in_w: s.out_w(),
        out_channels: s.in_channels,
        kernel: s.kernel,
        stride: [1, 1],
        padding: [s.kernel[0] - 1 - s.padding[0], s.kernel[1] - 1 - s.padding[1]],
        mode: PadMode::Zeros,
    })
}

/// Whether the input gradient of a convolution whose transposed shape is `t` (see
/// [`transposed`]) is faster as `t`'s own forward than through col2im, where neither Winograd
/// nor the direct kernel takes it: at least 64 channels of input gradient (the forward's GEMM
/// then runs its full 4-vector microkernel) on images of at most 8x8 pixels (col2im's folding
/// adds 7-pixel rows back, each a masked read-modify-write). Divan `conv2d_bwd_input`, batch
/// 64, one thread, Intel Xeon with AVX-512, fastest ms, col2im -> turned forward, alternating:
///
/// | layer | col2im | turned forward |
/// |---|---|---|
/// | 64x7x7 -> 64 (ResNet-20 stage 3) | 3.71 / 3.76 | 2.76 / 2.71 |
/// | 64x7x7 -> 128 (speedrun block 3) | 5.40 / 5.58 | 5.28 / 5.18 |
/// | 32x14x14 -> 32 (not taken) | 2.36 / 2.32 | 2.77 / 2.84 |
/// | 32x14x14 -> 64 (not taken) | 3.91 / 4.20 | 5.59 / 5.78 |
/// | 32x26x26 -> 64, no padding (not taken) | 14.0 / 14.4 | 21.0 / 20.2 |
fn turned_forward_pays(t: &ConvShape) -> bool {
    lane_direct(t).is_some() || (t.out_channels >= 64 && t.in_h * t.in_w <= 64 && direct(t).is_none())
}

/// The direct convolution with the output channels in the vector lanes
/// ([`super::simd::Avx512::lane_conv`]) for `s`, when it applies: an AVX-512F CPU, stride 1,
/// a kernel larger than 1x1, a multiple of 32 output channels and output rows of at most
/// [`super::simd::LANE_MAX_WIDTH`] pixels (where [`direct`]'s pixel lanes would be mostly
/// padding). It reads the padded image in place, as [`direct`] does: no unfolded copy.
#[cfg(target_arch = "x86_64")]
fn lane_direct(s: &ConvShape) -> Option<super::simd::Avx512> {
    let applies = lane_rows(s)
        && s.kernel != [1, 1]
        && s.in_channels >= DIRECT_MIN_CHANNELS
        && s.in_channels <= s.out_channels;
    applies.then(super::simd::Avx512::detect).flatten()
}

/// What both lane kernels need and where both measured faster: stride 1, a multiple of 32
/// output channels, at most [`LANE_MAX_IN`] input channels and rows of [`LANE_MIN_WIDTH`] to
/// [`super::simd::LANE_MAX_WIDTH`] pixels.
#[cfg(target_arch = "x86_64")]
fn lane_rows(s: &ConvShape) -> bool {
    s.stride == [1, 1]
        && s.out_channels % 32 == 0
        && s.in_channels <= LANE_MAX_IN
        && (LANE_MIN_WIDTH..=super::simd::LANE_MAX_WIDTH).contains(&s.out_w())
        && s.is_valid()
}

#[cfg(not(target_arch = "x86_64"))]
fn lane_direct(_: &ConvShape) -> Option<std::convert::Infallible> {
    None
}

/// Where the lane kernel beats im2col + GEMM (and the turned forward for input gradients):
/// `benches/kernels.rs`, one thread, batch 64, Intel Xeon with AVX-512, fastest ms, the same
/// binary with the kernel switched off and on back to back:
///
/// | layer | pass | im2col + GEMM | lanes |
/// |---|---|---|---|
/// | 32x14x14 -> 32 (ResNet-20 stage 2) | forward | 2.53 | 1.63 |
/// | | input gradient | 2.49 | 2.19 |
/// | 64x7x7 -> 64 (ResNet-20 stage 3) | forward | 2.49 | 2.06 |
/// | | input gradient | 2.74 | 2.61 |
/// | 32x14x14 -> 64 (speedrun block 2) | forward | 4.22 | 3.16 |
/// | 32x14x14 -> 64 5x5 replicate (flashlight) | forward | 10.6 | 7.93 |
/// | 64x7x7 -> 128 (speedrun block 3) | forward | 4.16 | 3.78 |
///
/// and not taken (an earlier run, summation blocks of 32 channels):
///
/// | layer | pass | im2col + GEMM | lanes |
/// |---|---|---|---|
/// | 64x14x14 -> 32 (block 2's input gradient) | input gradient | 4.40 | 4.72 / 4.73 |
/// | 128x7x7 -> 64 (block 3's input gradient) | input gradient | 5.19 | 6.18 / 6.03 |
/// | 512x4x4 -> 512 (ResNet-18 stage 4) | forward | 35.9 | 59.4 |
///
/// It loses where more input channels than output channels make the GEMM's sums long and its
/// tiles full, and on rows under 7 pixels (a tile of 4 pixels keeps 16 accumulators).
const LANE_MAX_IN: usize = 64;
const LANE_MIN_WIDTH: usize = 7;

/// The weight gradient with the output channels in the vector lanes
/// ([`super::simd::Avx512::lane_weight_grad`]) for `s`, when it applies: an AVX-512F CPU and
/// a 3x3 kernel on the shapes [`lane_rows`] takes. Like [`direct_weight_grad`], it reads the
/// padded image in place instead of unfolding it.
///
/// Where it beats im2col + GEMM: `benches/kernels.rs`
/// `conv2d_bwd_weight`, one thread, batch 64, Intel Xeon with AVX-512, fastest ms, the same
/// binary with the kernel off and on, two runs each:
///
/// | layer | im2col + GEMM | lanes |
/// |---|---|---|
/// | 32x14x14 -> 32 (ResNet-20 stage 2) | 2.85 / 2.96 | 2.10 / 2.02 |
/// | 64x7x7 -> 64 (ResNet-20 stage 3) | 2.71 / 2.70 | 2.32 / 2.33 |
/// | 32x14x14 -> 64 (speedrun block 2) | 4.73 / 5.02 | 4.02 / 4.07 |
/// | 64x7x7 -> 128 (speedrun block 3) | 4.45 / 4.32 | 4.03 / 4.18 |
/// | 256x8x8 -> 256 (ResNet-18 stage 3, not taken) | 47.3 / 47.0 | 41.0 / 47.7 |
/// | 512x4x4 -> 512 (ResNet-18 stage 4, not taken) | 50.2 / 53.3 | 71.2 / 68.3 |
///
/// So it takes the rows [`lane_direct`] takes, up to [`LANE_MAX_IN`] input channels.
#[cfg(target_arch = "x86_64")]
fn lane_weight_grad(s: &ConvShape) -> Option<super::simd::Avx512> {
    (lane_rows(s) && s.kernel == [3, 3])
        .then(super::simd::Avx512::detect)
        .flatten()
}

#[cfg(not(target_arch = "x86_64"))]
fn lane_weight_grad(_: &ConvShape) -> Option<std::convert::Infallible> {
    None
}

/// One image's share of the weight gradient by the lane kernel: `gw_t[(c * 9 + t) * o + oc]
/// += sum dy[oc] * x[c] shifted by tap t`, `dy` being the image's output gradient maps
/// `dy_stride` floats apart, taken pixel-major first.
#[cfg(target_arch = "x86_64")]
fn lane_weight_image(
    cpu: super::simd::Avx512,
    s: &ConvShape,
    x: &[f32],
    dy: &[f32],
    dy_stride: usize,
    gw_t: &mut [f32],
) {
    with_padded(s, x, |padded, plane, pw_n| {
        with_scratch(0, s.out_image(), |pixels| {
            cpu.planes_to_pixels(dy, dy_stride, s.out_channels, pixels);
            let grad = super::simd::LaneWeightGrad {
                input: padded,
                channels: s.in_channels,
                plane,
                row_pitch: pw_n,
                rows: s.out_h(),
                width: s.out_w(),
                dy: pixels,
                out_channels: s.out_channels,
            };
            cpu.lane_weight_grad(&grad, gw_t);
        })
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn lane_weight_image(
    cpu: std::convert::Infallible,
    _: &ConvShape,
    _: &[f32],
    _: &[f32],
    _: usize,
    _: &mut [f32],
) {
    match cpu {}
}

/// Input channels per summation block of [`lane_direct`]'s kernel: its running sums are at
/// most [`LANE_BLOCK_TERMS`] terms long (one channel's taps where a kernel has more).
fn lane_block_channels(s: &ConvShape) -> usize {
    (LANE_BLOCK_TERMS / (s.kernel[0] * s.kernel[1])).max(1)
}

/// The lane kernel's summation block, in terms: 16 channels of a 3x3 kernel. One image of
/// 64x7x7 -> 64 (one thread, the kernel alone, repeated): 25.2 us in one block of 64
/// channels, 26.6 in blocks of 32, 23.8 in blocks of 16 and 23.4 in blocks of 8; 32x14x14 ->
/// 32: 21.1, 19.9, 19.3, 20.5.
const LANE_BLOCK_TERMS: usize = 144;

/// A convolution's weights in the lane kernel's order, `[out / (16 v)][in][taps][16 v]`
/// ([`super::simd::lane_vectors`]), from `get(out_channel, in_channel, tap)`.
fn pack_lanes(s: &ConvShape, get: impl Fn(usize, usize, usize) -> f32) -> Vec<f32> {
    let block = 16 * super::simd::lane_vectors(s.out_channels, s.out_w());
    let taps = s.kernel[0] * s.kernel[1];
    let mut packed = Vec::with_capacity(s.weight_len());
    for ob in 0..s.out_channels / block {
        for c in 0..s.in_channels {
            for t in 0..taps {
                packed.extend((0..block).map(|o| get(ob * block + o, c, t)));
            }
        }
    }
    packed
}

/// One image through the lane kernel: padded copy, convolution into pixel-major scratch, then
/// into `out`'s planes (`[out_channels, out_h, out_w]`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn lane_image<'o>(
    cpu: super::simd::Avx512,
    s: &ConvShape,
    shifts: &[usize],
    x: &[f32],
    packed: &[f32],
    bias: Option<&[f32]>,
    out: OutChunk<'o>,
    ahead: Ahead,
) -> &'o mut [f32] {
    assert_eq!(out.len(), s.out_image(), "conv2d: output length");
    with_padded(s, x, |padded, plane, pw_n| {
        with_scratch(0, s.out_image(), |pixels| {
            let conv = super::simd::LaneConv {
                input: padded,
                channels: s.in_channels,
                plane,
                shifts,
                row_pitch: pw_n,
                rows: s.out_h(),
                width: s.out_w(),
                packed,
                bias,
                out_channels: s.out_channels,
                block_channels: lane_block_channels(s),
                ahead,
            };
            cpu.lane_conv(&conv, pixels);
            // SAFETY: `pixels_to_planes` writes every element of its output.
            unsafe { out.written_by(|out| cpu.pixels_to_planes(pixels, s.out_channels, out)) }
        })
    })
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
fn lane_image<'o>(
    cpu: std::convert::Infallible,
    _: &ConvShape,
    _: &[usize],
    _: &[f32],
    _: &[f32],
    _: Option<&[f32]>,
    _: OutChunk<'o>,
    _: Ahead,
) -> &'o mut [f32] {
    match cpu {}
}

/// A convolution's weights in the direct kernel's order, `[out / 4][in][taps][4]`, from
/// `get(out_channel, in_channel, tap)`.
fn pack_weights(s: &ConvShape, get: impl Fn(usize, usize, usize) -> f32) -> Vec<f32> {
    const OB: usize = super::simd::CONV_OB;
    let taps = s.kernel[0] * s.kernel[1];
    let mut packed = Vec::with_capacity(s.weight_len());
    for ob in 0..s.out_channels / OB {
        for c in 0..s.in_channels {
            for t in 0..taps {
                for o in 0..OB {
                    packed.push(get(ob * OB + o, c, t));
                }
            }
        }
    }
    packed
}

/// Each tap's read offset in the padded image.
fn tap_shifts(s: &ConvShape) -> Vec<usize> {
    let (_, pw_n) = padded_size(s);
    (0..s.kernel[0] * s.kernel[1])
        .map(|t| t / s.kernel[1] * pw_n + t % s.kernel[1])
        .collect()
}

/// `f(padded, plane, pw_n)`: `x` (one image) in the padded planes that the direct kernels read
/// (`plane` floats a channel, rows `pw_n` apart), in a scratch buffer.
fn with_padded<R>(s: &ConvShape, x: &[f32], f: impl FnOnce(&[f32], usize, usize) -> R) -> R {
    let (ph_n, pw_n) = padded_size(s);
    let plane = ph_n * pw_n;
    with_scratch(3, s.in_channels * plane, |padded| {
        pad_image(s, x, padded);
        f(padded, plane, pw_n)
    })
}

/// One image through the direct kernel: padded copy, convolution in the padded row pitch, then
/// the real pixels into `out` (`[out_channels, out_h, out_w]`, written once, never zeroed
/// first), which it returns.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn direct_image<'o>(
    cpu: super::simd::Avx512,
    s: &ConvShape,
    shifts: &[usize],
    x: &[f32],
    packed: &[f32],
    bias: Option<&[f32]>,
    out: OutChunk<'o>,
    ahead: Ahead,
) -> &'o mut [f32] {
    assert_eq!(out.len(), s.out_image(), "conv2d: output length");
    with_padded(s, x, |padded, plane, pw_n| {
        let pitch = s.out_h() * pw_n;
        let n = (s.out_h() - 1) * pw_n + s.out_w();
        with_scratch(0, s.out_channels * pitch, |wide| {
            let conv = super::simd::ShiftedConv {
                input: padded,
                channels: s.in_channels,
                plane,
                shifts,
                packed,
                bias,
                out_channels: s.out_channels,
                n,
                pitch,
                ahead,
            };
            cpu.shifted_conv(&conv, wide);
            // SAFETY: `compact` writes every element of its output (asserted one image long).
            unsafe { out.written_by(|out| compact(s, wide, out)) }
        })
    })
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
fn direct_image<'o>(
    cpu: std::convert::Infallible,
    _: &ConvShape,
    _: &[usize],
    _: &[f32],
    _: &[f32],
    _: Option<&[f32]>,
    _: OutChunk<'o>,
    _: Ahead,
) -> &'o mut [f32] {
    match cpu {}
}

/// `out[o, oh, ow] = rows[o, oh * pw_n + ow]`: the real pixels of rows in the padded pitch.
/// Every element of `out` is written.
///
/// # Panics
/// If `out` is not `[out_channels, out_h, out_w]` or `rows` too short for it.
#[inline(never)]
fn compact(s: &ConvShape, rows: &[f32], out: &mut [MaybeUninit<f32>]) {
    assert_eq!(out.len(), s.out_image(), "compact: output length");
    dispatch_wide!(compact_rows(s: &ConvShape, rows: &[f32], out: &mut [MaybeUninit<f32>]))
}

#[inline(always)]
fn compact_rows<R: Rows>(ops: R, s: &ConvShape, rows: &[f32], out: &mut [MaybeUninit<f32>]) {
    let (_, pw_n) = padded_size(s);
    let (oh_n, ow_n) = (s.out_h(), s.out_w());
    // `chunks_exact_mut` of `out` (a whole number of rows) and a row for each: every output
    // row is written whole, or the slicing of `src` panics.
    for (o, dst) in out.chunks_exact_mut(oh_n * ow_n).enumerate() {
        let src = &rows[o * oh_n * pw_n..];
        for (oh, row) in dst.chunks_exact_mut(ow_n).enumerate() {
            ops.write_row(row, &src[oh * pw_n..][..ow_n]);
        }
    }
}

/// Output channels per forward GEMM call. gemm computes `out^T = col^T . weight^T` and reads
/// `col` in place, without packing a copy of it, when `col`'s rows are a whole number of
/// 16-float vectors and the call has at most 8 x 6 = 48 output channels (gemm-common's
/// single-thread LHS packing threshold times its microkernel width): the forward is then
/// im2col plus FMAs, with no second pass over the unfolded image.
const UNPACKED_COLS: usize = 48;

/// `[0, len)` as consecutive `(start, len)` blocks of `size` and a shorter last one. `size` a
/// multiple of gemm's 6-column microkernel leaves at most one narrow edge tile per row of tiles.
fn blocks(len: usize, size: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(size)
        .map(move |start| (start, size.min(len - start)))
}

/// `out[o, j] (+)= weight[o, :] . col[:, j]` for `o < rows`, `j < cols`: `weight` is `[rows, k]`,
/// `col` `[k, cols]` and `out` `[rows, cols]`, row-major. In blocks of [`UNPACKED_COLS`] rows,
/// the whole 16-float vectors of columns first, then the tail, so that gemm reads `col` in place.
fn weights_times(
    weight: &[f32],
    rows: usize,
    k: usize,
    col: &[f32],
    out: &mut [f32],
    cols: usize,
    accumulate: bool,
) {
    for (o0, on) in blocks(rows, UNPACKED_COLS) {
        for (p0, pn) in [(0, cols / 16 * 16), (cols / 16 * 16, cols % 16)] {
            if pn == 0 {
                continue;
            }
            gemm(Gemm {
                m: on,
                n: pn,
                k,
                dst: &mut out[o0 * cols + p0..],
                dst_rs: cols,
                dst_cs: 1,
                accumulate,
                lhs: &weight[o0 * k..],
                lhs_rs: k,
                lhs_cs: 1,
                rhs: &col[p0..],
                rhs_rs: cols,
                rhs_cs: 1,
            })
        }
    }
}

/// `out = conv(x, weight) + bias`, then `max(out, 0)` when `relu` (NaN stays NaN, as in burn's and
/// PyTorch's ReLU), applied per image while it is still in cache.
///
/// # Shapes
/// - `x`: `[batch, in_channels, in_h, in_w]`
/// - `weight`: `[out_channels, in_channels, kh, kw]`
/// - `bias`: `[out_channels]`
/// - `out`: `[batch, out_channels, out_h, out_w]`, overwritten
pub fn conv2d_forward<'o>(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    out: impl Into<Out<'o>>,
) {
    forward(s, x, weight, bias, relu, out.into(), None)
}

/// [`conv2d_forward`], and the [`MapMoments`] of each output map (`[batch, out_channels]`, what
/// [`super::batch_norm::batch_stats`] takes of a batch norm's input) taken as each image is
/// written, while it is in cache: a batch norm after the convolution then needs no pass of its
/// own over the output for its statistics ([`super::batch_norm::combine_moments`]).
///
/// # Shapes
/// As [`conv2d_forward`]; `moments`: `[batch, out_channels]`, overwritten.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_forward_moments<'o>(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    out: impl Into<Out<'o>>,
    moments: &mut [MapMoments],
) {
    assert_eq!(moments.len(), s.batch * s.out_channels, "conv2d: moments length");
    forward(s, x, weight, bias, relu, out.into(), Some(moments))
}

/// The moments of each of the images in `out` (consecutive output images) into `moments`.
fn moments_of(s: &ConvShape, out: &[f32], moments: Option<&mut [MapMoments]>) {
    if let Some(moments) = moments {
        image_moments(s.pixels(), out, moments);
    }
}

fn forward(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    out: Out<'_>,
    moments: Option<&mut [MapMoments]>,
) {
    assert!(s.is_valid(), "conv2d: invalid shapes {s:?}");
    assert_eq!(x.len(), s.batch * s.in_image(), "conv2d: input length");
    assert_eq!(weight.len(), s.weight_len(), "conv2d: weight length");
    assert_eq!(out.len(), s.batch * s.out_image(), "conv2d: output length");
    if let Some(bias) = bias {
        assert_eq!(bias.len(), s.out_channels, "conv2d: bias length");
    }
    let taps = s.kernel[0] * s.kernel[1];
    let tap = |o: usize, c: usize, t: usize| weight[(o * s.in_channels + c) * taps + t];
    if winograd::applies(s, winograd::Pass::Forward) {
        let u = winograd::transform_weights(s.out_channels, s.in_channels, tap);
        let n = winograd::images_per_call(s);
        return x
            .par_chunks(n * s.in_image())
            .zip(out.par_out_chunks(n * s.out_image()))
            .zip(moment_chunks(s, moments, n))
            .for_each(|((x, out), moments)| {
                let planes = winograd::Planes {
                    data: x,
                    image: s.in_image(),
                    channel: s.in_h * s.in_w,
                };
                let out = winograd::convolve(s, &u, planes, x.len() / s.in_image(), bias, relu, out);
                moments_of(s, out, moments);
            });
    }
    forward_packed(s, x, weight, &Packed::new(s, weight), bias, relu, out, moments)
}

/// A convolution's weights as one of the direct kernels reads them, with its tap shifts:
/// packed once per call, however many chunks of images it then runs (the input gradient's
/// turned forward runs one per few images). `None` for im2col + GEMM, which reads the weights
/// as they are.
struct Packed {
    /// [`direct`]'s pixel-lane kernel, `[out / 4][in][taps][4]` ([`pack_weights`]).
    direct: Option<(Simd, Vec<f32>, Vec<usize>)>,
    /// [`lane_direct`]'s output-channel-lane kernel ([`pack_lanes`]).
    lanes: Option<(Simd, Vec<f32>, Vec<usize>)>,
}

impl Packed {
    fn new(s: &ConvShape, weight: &[f32]) -> Packed {
        let taps = s.kernel[0] * s.kernel[1];
        let tap = |o: usize, c: usize, t: usize| weight[(o * s.in_channels + c) * taps + t];
        let direct = direct(s).map(|cpu| (cpu, pack_weights(s, tap), tap_shifts(s)));
        let lanes = match direct {
            Some(_) => None,
            None => lane_direct(s).map(|cpu| (cpu, pack_lanes(s, tap), tap_shifts(s))),
        };
        Packed { direct, lanes }
    }
}

/// [`forward`] past Winograd (which does not take `s`), with the weights packed for `s` (or
/// for a shape that differs from it only in its batch).
#[allow(clippy::too_many_arguments)]
fn forward_packed<'o>(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    packs: &Packed,
    bias: Option<&[f32]>,
    relu: bool,
    out: Out<'o>,
    moments: Option<&mut [MapMoments]>,
) {
    debug_assert!(!winograd::applies(s, winograd::Pass::Forward));
    assert_eq!(x.len(), s.batch * s.in_image(), "conv2d: input length");
    assert_eq!(out.len(), s.batch * s.out_image(), "conv2d: output length");
    let (patch, pixels) = (s.patch(), s.pixels());
    let (direct, lanes) = (&packs.direct, &packs.lanes);
    let product = |col: &[f32], out: &mut [f32], cols: usize, accumulate: bool| {
        weights_times(weight, s.out_channels, patch, col, out, cols, accumulate)
    };
    // One image, its output written once (zeroed first only for im2col's GEMM), returned.
    let image = |(x, out): (&[f32], OutChunk<'o>), ahead: Ahead| -> &'o mut [f32] {
        let out = if let Some((cpu, packed, shifts)) = direct {
            direct_image(*cpu, s, shifts, x, packed, bias, out, ahead)
        } else if let Some((cpu, packed, shifts)) = lanes {
            lane_image(*cpu, s, shifts, x, packed, bias, out, ahead)
        } else {
            let out = out.zeroed();
            unfolded_image(s, x, weight, bias, relu, out);
            return out;
        };
        if relu {
            relu_in_place(out);
        }
        out
    };
    let together = if direct.is_some() || lanes.is_some() {
        1
    } else {
        images_per_gemm(s)
    };
    if together == 1 {
        // While one image computes, the next one's input and output come into cache.
        let (x_all, out_at, (xi, oi)) = (x, out.as_ptr() as usize, (s.in_image(), s.out_image()));
        return x
            .par_chunks(xi)
            .zip(out.par_out_chunks(oi))
            .zip(moment_chunks(s, moments, 1))
            .enumerate()
            .for_each(|(i, ((x, out), moments))| {
                let ahead = match x_all.get((i + 1) * xi..) {
                    Some(next) if !next.is_empty() => Ahead::at(&[
                        (next.as_ptr(), xi),
                        ((out_at as *const f32).wrapping_add((i + 1) * oi), oi),
                    ]),
                    _ => Ahead::default(),
                };
                let out = image((x, out), ahead);
                moments_of(s, out, moments);
            });
    }
    // Small images: `together` of them unfolded side by side, one GEMM, then each image's
    // columns (plus the bias, ReLU'd) into its place.
    let group = |(x, out): (&[f32], &mut [f32])| {
        let wide = x.len() / s.in_image() * pixels;
        with_scratch(0, patch * wide, |col| {
            for (j, x) in x.chunks_exact(s.in_image()).enumerate() {
                im2col_pitched(s, x, &mut col[j * pixels..], wide);
            }
            with_scratch(1, s.out_channels * wide, |res| {
                product(col, res, wide, false);
                for (j, out) in out.chunks_exact_mut(s.out_image()).enumerate() {
                    for (o, row) in out.chunks_exact_mut(pixels).enumerate() {
                        row.copy_from_slice(&res[o * wide + j * pixels..][..pixels]);
                        if let Some(b) = bias {
                            // The per-image path's `bias + sum`.
                            row.iter_mut().for_each(|v| *v += b[o]);
                        }
                    }
                    if relu {
                        relu_in_place(out);
                    }
                }
            })
        })
    };
    x.par_chunks(together * s.in_image())
        .zip(out.par_chunks_mut(together * s.out_image()))
        .zip(moment_chunks(s, moments, together))
        .for_each(|((x, out), moments)| {
            group((x, &mut *out));
            moments_of(s, out, moments);
        });
}

/// One image by im2col and GEMM (the GEMM alone for a 1x1 convolution), the bias added and
/// ReLU'd when `relu`: `out` is `[out_channels, out_h, out_w]`.
fn unfolded_image(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    out: &mut [f32],
) {
    let (patch, pixels) = (s.patch(), s.pixels());
    if let Some(bias) = bias {
        for (row, &b) in out.chunks_exact_mut(pixels).zip(bias) {
            row.fill(b);
        }
    }
    let product = |col: &[f32], out: &mut [f32]| {
        weights_times(weight, s.out_channels, patch, col, out, pixels, bias.is_some())
    };
    if s.is_pointwise() {
        product(x, out);
    } else {
        with_scratch(0, patch * pixels, |col| {
            im2col(s, x, col);
            product(col, out);
        });
    }
    if relu {
        relu_in_place(out);
    }
}

/// A convolution's output computed again, image by image on the calling thread, instead of
/// stored: the same values as [`conv2d_forward`] writes for those images. For a convolution
/// whose output is large and cheap to compute (a first layer, with few input channels: the
/// speedrun net's 1 -> 32 channels at 28x28 writes 100 KB per image from 3 KB of input with
/// 9 multiply-adds per output element), so that the ops after it read it from cache, not from
/// memory.
#[derive(Clone, Copy)]
pub struct ConvImages<'a> {
    s: ConvShape,
    x: &'a [f32],
    weight: &'a [f32],
    bias: Option<&'a [f32]>,
}

/// The longest dot product per output element ([`ConvShape::patch`]) that [`ConvImages`]
/// computes again: a 3x3 kernel on up to 3 input channels (a first layer).
const RECOMPUTE_MAX_PATCH: usize = 27;

impl<'a> ConvImages<'a> {
    /// `conv(x, weight) + bias` (no ReLU) image by image, where that is worth it: `None` unless
    /// each output element is at most [`RECOMPUTE_MAX_PATCH`] multiply-adds and
    /// [`conv2d_forward`] computes the shape one image at a time by im2col.
    ///
    /// # Panics
    /// If the shape is invalid or a slice's length does not match it.
    pub fn recompute(
        s: &ConvShape,
        x: &'a [f32],
        weight: &'a [f32],
        bias: Option<&'a [f32]>,
    ) -> Option<Self> {
        assert!(s.is_valid(), "conv2d: invalid shapes {s:?}");
        assert_eq!(x.len(), s.batch * s.in_image(), "conv2d: input length");
        assert_eq!(weight.len(), s.weight_len(), "conv2d: weight length");
        if let Some(bias) = bias {
            assert_eq!(bias.len(), s.out_channels, "conv2d: bias length");
        }
        let per_image = !winograd::applies(s, winograd::Pass::Forward)
            && direct(s).is_none()
            && lane_direct(s).is_none()
            && images_per_gemm(s) == 1;
        (per_image && s.patch() <= RECOMPUTE_MAX_PATCH).then_some(Self {
            s: *s,
            x,
            weight,
            bias,
        })
    }

    /// The output of images `first..first + out.len() / out_image` into `out` (every element).
    ///
    /// # Panics
    /// If `out` is not a whole number of output images within the batch.
    pub fn images(&self, first: usize, out: &mut [f32]) {
        let s = &self.s;
        assert_eq!(out.len() % s.out_image(), 0, "conv2d: whole output images");
        let images = out.len() / s.out_image();
        assert!(first + images <= s.batch, "conv2d: images past the batch");
        let x = &self.x[first * s.in_image()..][..images * s.in_image()];
        for (x, out) in x
            .chunks_exact(s.in_image())
            .zip(out.chunks_exact_mut(s.out_image()))
        {
            unfolded_image(s, x, self.weight, self.bias, false, out);
        }
    }
}

/// `moments` in chunks of `images` images' maps, to zip with the output's chunks of as many
/// images; `None` for each chunk when no moments are wanted.
fn moment_chunks<'a>(
    s: &ConvShape,
    moments: Option<&'a mut [MapMoments]>,
    images: usize,
) -> impl IndexedParallelIterator<Item = Option<&'a mut [MapMoments]>> {
    let chunks = s.batch.div_ceil(images.max(1));
    let per_chunk = images * s.out_channels;
    match moments {
        Some(m) => rayon::iter::Either::Left(m.par_chunks_mut(per_chunk.max(1)).map(Some)),
        None => rayon::iter::Either::Right((0..chunks).into_par_iter().map(|_| None)),
    }
}

/// Images unfolded side by side into one GEMM (a function of the shape only). An image of 7x7
/// or 4x4 pixels alone makes a GEMM of 49 or 16 columns, too few to amortise the GEMM's setup
/// and edge tiles; about 1,024 columns (up to 32 images) does. 1x1 convolutions read their
/// input in place, one image at a time.
///
/// 768 columns measured the same (speedrun-256 within 1%), but its summation order put one
/// pre-ReLU element of the ResNet-18 parity fixture (stage 3's first block, image 30, channel
/// 229, within float32 rounding of zero) at +5.7e-7 where one image per GEMM gives 0.0: the
/// ReLU then passes a gradient that PyTorch's stops, and every gradient upstream moved by
/// ~2e-3 (tests/parity.rs). A coin toss of rounding, not an error of the kernel; the fixture
/// holds such a near-tie, so another order may meet it again.
fn images_per_gemm(s: &ConvShape) -> usize {
    const COLUMNS: usize = 1024;
    // From half that many pixels up, one image is a GEMM wide enough, and gathering several
    // (copying the output and its gradient in and out of the side-by-side layout) costs more
    // than it saves: speedrun's 28x28 first layer in pairs spent 6% of a step in memmove.
    if s.is_pointwise() || s.pixels() >= COLUMNS / 2 {
        return 1;
    }
    // The unfolded block is read once per 48 output channels (`UNPACKED_COLS`): kept within
    // 1 MiB (a Zen 4 core's L2) it stays in cache between those passes. ResNet-18's 4x4 stage
    // at 32 images was a 9.4 MB block re-read from memory by each of its 11 passes: its step
    // took 3.00 s instead of 2.70 s, its evaluation 150 instead of 167 images/s. (2 MiB
    // measured alike but flipped the parity fixture's near-zero element, see above.)
    const COL_BYTES: usize = 1 << 20;
    let per_image = s.patch() * s.pixels() * std::mem::size_of::<f32>();
    COLUMNS
        .div_ceil(s.pixels())
        .min(COL_BYTES / per_image)
        .clamp(1, 32)
        .min(s.batch)
}

/// Whether the backward unfolds each group's images all together, a block of input channels at
/// a time ([`unfolded_grads`]), instead of whole images in chunks of [`images_per_gemm`]:
/// where the weight gradient passes [`WEIGHT_BLOCK_BYTES`]. There each chunk's GEMM read and
/// wrote all of it back for a sum over a few images' pixels (ResNet-18's 512x4x4 layer: 9.4 MB
/// for 48 pixels), while a block's rows of it stay in cache over the group's pixels.
/// `benches/kernels.rs`, batch 64, Intel Xeon with AVX-512, fastest ms, the same binary with
/// the blocks off and on, two runs each:
///
/// | layer | pass, threads | whole images | channel blocks |
/// |---|---|---|---|
/// | 256x8x8 -> 256 (ResNet-18 stage 3) | weight gradient, 1 | 41.4 / 39.3 | 36.6 / 38.7 |
/// | | both gradients, 2 | 24.0 / 24.4 | 23.5 / 21.9 |
/// | 512x4x4 -> 512 (stage 4) | weight gradient, 1 | 52.0 / 47.9 | 45.7 / 44.9 |
/// | | both gradients, 2 | 35.8 / 33.4 | 32.1 / 28.8 |
///
/// A whole ResNet-18 step (batch 128, 2 threads) stayed within its run-to-run spread (1950-2020
/// ms either way, three alternating runs each).
fn unfolds_in_channel_blocks(s: &ConvShape) -> bool {
    s.weight_len() * std::mem::size_of::<f32>() > WEIGHT_BLOCK_BYTES
}

/// The largest weight gradient unfolded by whole images, and the most of it one channel block
/// of [`unfolded_grads`] writes.
const WEIGHT_BLOCK_BYTES: usize = 1 << 20;

/// The most bytes of unfolded rows per channel block of [`unfolded_grads`] (blocks of 256
/// KiB and 1 MiB, with weight blocks of half and twice the size, measured alike or slower).
const COL_BLOCK_BYTES: usize = 1 << 19;

/// Input channels per block of [`unfolded_grads`] over `wide` columns: all of them where
/// [`unfolds_in_channel_blocks`] does not hold, else within [`COL_BLOCK_BYTES`] of unfolded
/// rows and [`WEIGHT_BLOCK_BYTES`] of the weight gradient.
fn block_channels(s: &ConvShape, wide: usize) -> usize {
    if !unfolds_in_channel_blocks(s) {
        return s.in_channels;
    }
    let row_bytes = s.kernel[0] * s.kernel[1] * std::mem::size_of::<f32>();
    let by_col = COL_BLOCK_BYTES / (row_bytes * wide).max(1);
    let by_out = WEIGHT_BLOCK_BYTES / (row_bytes * s.out_channels).max(1);
    by_col.min(by_out).clamp(1, s.in_channels.max(1))
}

/// By im2col: the weight gradient (`gw_t`, `[patch, o]`, added onto when its flag is set, else
/// overwritten) and the input gradient (`dx`, overwritten) of the images `x` from their output
/// gradients side by side, `dyw`, `[o, images * pixels]`. In blocks of input channels
/// ([`block_channels`]: all of them unless [`unfolds_in_channel_blocks`]): each block's
/// unfolded rows, then one GEMM over all the images' pixels into the block's rows of `gw_t`;
/// and one from the weights' rows for the block into its channels of `dx`.
fn unfolded_grads(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    dyw: &[f32],
    mut gw_t: Option<(&mut [f32], bool)>,
    mut dx: Option<&mut [f32]>,
) {
    let (patch, pixels, o) = (s.patch(), s.pixels(), s.out_channels);
    let (taps, plane) = (s.kernel[0] * s.kernel[1], s.in_h * s.in_w);
    let wide = x.len() / s.in_image() * pixels;
    for (c0, cn) in blocks(s.in_channels, block_channels(s, wide)) {
        let sub = ConvShape {
            in_channels: cn,
            ..*s
        };
        let (r0, rows) = (c0 * taps, cn * taps);
        if let Some((gw_t, accumulate)) = gw_t.as_mut() {
            with_scratch(0, rows * wide, |col| {
                for (j, x_n) in x.chunks_exact(s.in_image()).enumerate() {
                    im2col_pitched(
                        &sub,
                        &x_n[c0 * plane..][..cn * plane],
                        &mut col[j * pixels..],
                        wide,
                    );
                }
                let gw_rows = &mut gw_t[r0 * o..][..rows * o];
                weight_grad_gemm(dyw, col, [o, rows, wide], gw_rows, *accumulate)
            });
        }
        if let Some(dx) = dx.as_deref_mut() {
            with_scratch(1, rows * wide, |dcol| {
                input_grad_gemm(&weight[r0..], patch, dyw, [o, rows, wide], dcol);
                for (j, dx_n) in dx.chunks_exact_mut(s.in_image()).enumerate() {
                    col2im_pitched(
                        &sub,
                        &dcol[j * pixels..],
                        &mut dx_n[c0 * plane..][..cn * plane],
                        wide,
                    );
                }
            });
        }
    }
}

/// `gw_t[rows, o]` (+)= `col[rows, wide] . dyw[o, wide]^T`, computed as the column-major
/// product `dyw . col^T`: the GEMM then reads `col` where it lies (six sequential streams)
/// instead of packing a transposed copy of it, and packs only the small `dyw`.
fn weight_grad_gemm(
    dyw: &[f32],
    col: &[f32],
    [o, rows, wide]: [usize; 3],
    gw_t: &mut [f32],
    accumulate: bool,
) {
    gemm(Gemm {
        m: o,
        n: rows,
        k: wide,
        dst: gw_t,
        dst_rs: 1,
        dst_cs: o,
        accumulate,
        lhs: dyw,
        lhs_rs: wide,
        lhs_cs: 1,
        rhs: col,
        rhs_rs: 1,
        rhs_cs: wide,
    })
}

/// `dcol[rows, wide]` = `weight[o, rows]^T . dyw[o, wide]`, the weight's rows `patch` floats
/// apart.
fn input_grad_gemm(weight: &[f32], patch: usize, dyw: &[f32], [o, rows, wide]: [usize; 3], dcol: &mut [f32]) {
    gemm(Gemm {
        m: rows,
        n: wide,
        k: o,
        dst: dcol,
        dst_rs: wide,
        dst_cs: 1,
        accumulate: false,
        lhs: weight,
        lhs_rs: 1,
        lhs_cs: patch,
        rhs: dyw,
        rhs_rs: wide,
        rhs_cs: 1,
    })
}

/// Images per group in the weight and bias gradients: a function of the shapes only, never of
/// the thread count. Up to 16 groups, fewer when the per-group partial sums would pass 64 MiB.
fn images_per_group(s: &ConvShape) -> usize {
    let budget = (64 << 20) / (4 * (s.weight_len() + s.out_channels));
    let groups = s.batch.min(16).min(budget.max(1));
    s.batch.div_ceil(groups)
}

/// The transposed convolution ([`transposed`]) whose own forward, in a pass of its own after
/// the weight gradient's, takes `s`'s input gradient (by Winograd or [`turned_forward_pays`]),
/// when one does.
fn turned_input_grad(s: &ConvShape) -> Option<ConvShape> {
    transposed(s).filter(|t| {
        s.stride == [1, 1] && (winograd::applies(t, winograd::Pass::InputGradient) || turned_forward_pays(t))
    })
}

/// Whether [`conv2d_backward_from`] reads each image of its output gradient once (the weight
/// gradient and the input gradient from one read, or no input gradient by the turned forward):
/// an output gradient produced image by image ([`Images::Produce`]) is then produced once.
/// Otherwise the turned forward's pass reads it again, and producing it twice costs more than
/// storing it.
pub fn reads_output_grad_once(s: &ConvShape) -> bool {
    turned_input_grad(s).is_none()
}

/// How the input gradient is taken as the convolution of the output gradient by the turned
/// kernel: Winograd (its transformed weights), or that convolution's own forward (its weights).
enum DxBy {
    Winograd(Vec<f32>),
    /// The turned weights, `[in][out][kh][kw]`, and those packed for the forward's kernel.
    Forward(Vec<f32>, Packed),
}

/// The NCHW output gradient of `s` as Winograd's input planes.
fn planes<'a>(s: &ConvShape, data: &'a [f32]) -> winograd::Planes<'a> {
    winograd::Planes {
        data,
        image: s.out_image(),
        channel: s.pixels(),
    }
}

/// The weights of convolution `t`, `[out][in][taps]`, from `get(out, in, tap)`.
fn pack_rotated(t: &ConvShape, get: impl Fn(usize, usize, usize) -> f32) -> Vec<f32> {
    let taps = t.kernel[0] * t.kernel[1];
    let mut w = Vec::with_capacity(t.weight_len());
    for o in 0..t.out_channels {
        for c in 0..t.in_channels {
            w.extend((0..taps).map(|k| get(o, c, k)));
        }
    }
    w
}

/// One group's partial weight gradient in [`conv2d_backward_from`]: a buffer of at least the
/// gradient's length, kept between calls ([`Partial::give_back`]) instead of allocated zeroed
/// per group and call (that zeroing was 1.2% of a ResNet-18 step, 16.8 MB per group in its
/// 512-channel layers). Its values are whatever the last user left, all initialised: each path
/// overwrites them with its first GEMM or zeroes them first.
struct Partial(Vec<f32>);

/// The buffers [`Partial`] keeps, at most [`KEPT_BYTES`] of them.
static KEPT: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());

/// ResNet-18's two partials of its 512-channel layers' Winograd gradient (one per thread) and
/// room to spare.
const KEPT_BYTES: usize = 64 << 20;

impl Partial {
    /// A buffer of at least `len` floats: the smallest kept one that holds them, else the
    /// largest kept one (or a new one), grown.
    fn take(len: usize) -> Partial {
        if len == 0 {
            return Partial(Vec::new());
        }
        let mut kept = KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let holds = (kept.iter().enumerate())
            .filter(|(_, v)| v.len() >= len)
            .min_by_key(|(_, v)| v.len());
        let pick = holds
            .or_else(|| kept.iter().enumerate().max_by_key(|(_, v)| v.len()))
            .map(|(i, _)| i);
        let mut v = pick.map(|i| kept.swap_remove(i)).unwrap_or_default();
        drop(kept);
        if v.len() < len {
            v.resize(len, 0.0);
        }
        Partial(v)
    }

    /// Kept for the next call, if it fits under [`KEPT_BYTES`].
    fn give_back(self) {
        let mut kept = KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let held: usize = kept.iter().map(Vec::len).sum();
        if !self.0.is_empty() && (held + self.0.len()) * std::mem::size_of::<f32>() <= KEPT_BYTES {
            kept.push(self.0);
        }
    }
}

/// Gradients of [`conv2d_forward`] with respect to the input, the weight and the bias, each
/// computed only when its buffer is given (all are overwritten). `relu_out` is the forward's
/// output when it applied the ReLU: `dy` then passes only where that output is not `<= 0` (burn's
/// and PyTorch's ReLU backward).
///
/// # Shapes
/// - `x`: `[batch, in_channels, in_h, in_w]`, `weight`: `[out_channels, in_channels, kh, kw]`
/// - `dy`, `relu_out`: `[batch, out_channels, out_h, out_w]`
/// - `dx`: like `x`, `dweight`: like `weight`, `dbias`: `[out_channels]`
#[allow(clippy::too_many_arguments)]
pub fn conv2d_backward<'o>(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    dy: &[f32],
    relu_out: Option<&[f32]>,
    dx: Option<impl Into<Out<'o>>>,
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) {
    conv2d_backward_from(s, x, weight, Images::Values(dy), relu_out, dx, dweight, dbias)
}

/// [`conv2d_backward`] with the output gradient `dy` given whole or produced a few images at a
/// time by the op after the convolution (its own backward, [`Images::Produce`]): the same values
/// as [`conv2d_backward`] given the whole of it.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_backward_from<'o>(
    s: &ConvShape,
    x: &[f32],
    weight: &[f32],
    dy: Images<'_>,
    relu_out: Option<&[f32]>,
    dx: Option<impl Into<Out<'o>>>,
    dweight: Option<&mut [f32]>,
    dbias: Option<&mut [f32]>,
) {
    if let Images::Values(dy) = dy {
        assert_eq!(
            dy.len(),
            s.batch * s.out_image(),
            "conv2d backward: output gradient length"
        );
    }
    let dx = dx.map(Into::into);
    assert!(s.is_valid(), "conv2d backward: invalid shapes {s:?}");
    assert_eq!(x.len(), s.batch * s.in_image(), "conv2d backward: input length");
    assert_eq!(weight.len(), s.weight_len(), "conv2d backward: weight length");
    if let Some(y) = relu_out {
        assert_eq!(
            y.len(),
            s.batch * s.out_image(),
            "conv2d backward: ReLU output length"
        );
    }
    let (patch, pixels, o) = (s.patch(), s.pixels(), s.out_channels);
    let (want_w, want_b) = (dweight.is_some(), dbias.is_some());
    let taps = s.kernel[0] * s.kernel[1];
    // The input gradient as a convolution of the output gradient (with the kernel turned and
    // its channels swapped): by Winograd's F(2x2, 3x3) or that convolution's forward in a pass
    // of its own, or by the direct kernel within the groups below, where one applies; else
    // through col2im.
    let rotated = |c: usize, o: usize, k: usize| weight[(o * s.in_channels + c) * taps + (taps - 1 - k)];
    let turned_dx = turned_input_grad(s).filter(|_| dx.is_some()).map(|t| {
        // Where Winograd takes the input gradient only because im2col + col2im is slower
        // still (wide layers on small images), the transposed convolution's own forward
        // (small images side by side, one GEMM reading the unfolded block in place) is
        // faster than either: ResNet-18's 512x4x4 layer at batch 64, 2 threads, 46.8 / 40.5
        // -> 25.4 / 28.0 ms (divan conv2d_bwd_input, alternating). So it is on narrower
        // layers on small images (`turned_forward_pays`).
        let by = if winograd::applies(&t, winograd::Pass::Forward) {
            DxBy::Winograd(winograd::transform_weights(
                t.out_channels,
                t.in_channels,
                rotated,
            ))
        } else {
            let w = pack_rotated(&t, rotated);
            let packs = Packed::new(&t, &w);
            DxBy::Forward(w, packs)
        };
        (by, t)
    });
    let (dx, dx_turned) = match (&turned_dx, dx) {
        (Some(_), Some(dx)) => (None, Some(dx)),
        (_, dx) => (dx, None),
    };
    let direct_dx = transposed(s)
        .filter(|_| s.stride == [1, 1] && dx.is_some())
        .and_then(|t| Some((direct(&t)?, t)))
        .map(|(cpu, t)| {
            let packed = pack_weights(&t, rotated);
            (cpu, packed, tap_shifts(&t), t)
        });
    let direct_dw = direct_weight_grad(s)
        .filter(|_| want_w)
        .map(|cpu| (cpu, tap_shifts(s)));
    let lane_dw = lane_weight_grad(s).filter(|_| want_w);
    // The weight gradient by Winograd's transforms where no direct kernel takes it: each
    // group's sums then stay transformed (`winograd::weight_grad`) until they are added up.
    // ResNet-18's 64x32x32, 128x16x16 and 256x8x8 layers, divan conv2d_bwd_weight, batch 64,
    // one thread, im2col -> Winograd (two alternating runs): 47.5-48.6 -> 36.4-36.7 ms,
    // 39.1-39.9 -> 35.8-36.4, 43.8 -> 38.6-41.9.
    let wino_dw = want_w
        && direct_dw.is_none()
        && lane_dw.is_none()
        && winograd::applies(s, winograd::Pass::WeightGradient);
    let gw_len = match (want_w, wino_dw) {
        (false, _) => 0,
        (true, true) => winograd::transformed_len(o, s.in_channels),
        (true, false) => o * patch,
    };
    let per = images_per_group(s);
    // Large weight gradients: each group's images in one chunk (its sums are the group's),
    // unfolded a block of input channels at a time (`unfolded_grads`).
    let blocked = direct_dx.is_none()
        && direct_dw.is_none()
        && lane_dw.is_none()
        && !s.is_pointwise()
        && (want_w || dx.is_some())
        && unfolds_in_channel_blocks(s);
    let together = if direct_dx.is_some() {
        1
    } else if wino_dw {
        winograd::images_per_call(s).min(per)
    } else if blocked {
        per
    } else {
        images_per_gemm(s)
    };
    let mut dx_groups: Vec<Option<OutChunk<'_>>> = match dx {
        Some(dx) => {
            assert_eq!(dx.len(), x.len(), "conv2d backward: input gradient length");
            dx.chunks(per * s.in_image()).map(Some).collect()
        }
        None => (0..s.batch.div_ceil(per)).map(|_| None).collect(),
    };

    // Per group: the sums of the weight and bias gradients over its images, in image order.
    let group = |g: usize, mut dx: Option<OutChunk<'_>>| -> (Partial, Vec<f64>) {
        let first = g * per;
        let images = per.min(s.batch - first);
        // Kept from earlier calls: the first GEMM of every path but the direct kernels' (which
        // add onto it) overwrites it.
        let mut kept = Partial::take(gw_len);
        let gw = &mut kept.0[..gw_len];
        if direct_dw.is_some() || lane_dw.is_some() {
            gw.fill(0.0);
        }
        let mut gb = if want_b { vec![0.0f64; o] } else { Vec::new() };
        // Chunks of `together` images: their (masked) output gradients side by side as
        // `dyw`, `[o, wide]`, and their unfolded inputs likewise, so that each GEMM spans
        // the chunk.
        for c0 in (0..images).step_by(together) {
            let cn = together.min(images - c0);
            let (n0, wide) = (first + c0, cn * pixels);
            let x_c = &x[n0 * s.in_image()..][..cn * s.in_image()];
            let gather = cn > 1 || relu_out.is_some();
            // This chunk's part of the input gradient, split off the group's.
            let dx_c = dx.take().map(|d| {
                let (c, rest) = d.split_at(cn * s.in_image());
                dx = Some(rest);
                c
            });
            dy.with(s.out_image(), n0, cn, 4, |dy_c| {
                with_scratch(2, if gather { o * wide } else { 0 }, |dyw| {
                    let dyw: &[f32] = if gather {
                        for (j, dy_n) in dy_c.chunks_exact(s.out_image()).enumerate() {
                            for (oc, src) in dy_n.chunks_exact(pixels).enumerate() {
                                let dst = &mut dyw[oc * wide + j * pixels..][..pixels];
                                match relu_out {
                                    Some(y) => {
                                        let at = (n0 + j) * s.out_image() + oc * pixels;
                                        relu_mask(src, &y[at..][..pixels], dst)
                                    }
                                    None => dst.copy_from_slice(src),
                                }
                            }
                        }
                        dyw
                    } else {
                        dy_c
                    };
                    if want_b {
                        for (b, row) in gb.iter_mut().zip(dyw.chunks_exact(wide)) {
                            *b += lane_sum(row, |v| v);
                        }
                    }
                    if want_w {
                        if wino_dw {
                            let x = winograd::Planes {
                                data: x_c,
                                image: s.in_image(),
                                channel: s.in_h * s.in_w,
                            };
                            let dy = winograd::Planes {
                                data: dyw,
                                image: pixels,
                                channel: wide,
                            };
                            winograd::weight_grad(s, x, dy, cn, gw, c0 > 0);
                        } else if s.is_pointwise() {
                            // One image per chunk (`images_per_gemm`): its input is `col`.
                            weight_grad_gemm(dyw, x_c, [o, patch, wide], gw, c0 > 0);
                        } else if let Some((cpu, shifts)) = &direct_dw {
                            for (j, x_n) in x_c.chunks_exact(s.in_image()).enumerate() {
                                direct_weight_image(*cpu, s, shifts, x_n, &dyw[j * pixels..], wide, gw);
                            }
                        } else if let Some(cpu) = lane_dw {
                            for (j, x_n) in x_c.chunks_exact(s.in_image()).enumerate() {
                                lane_weight_image(cpu, s, x_n, &dyw[j * pixels..], wide, gw);
                            }
                        } else {
                            unfolded_grads(s, x_c, weight, dyw, Some((&mut *gw, c0 > 0)), None);
                        }
                    }
                    if let Some(dx_c) = dx_c {
                        if s.is_pointwise() {
                            // The input gradient is its own unfolded matrix.
                            input_grad_gemm(weight, patch, dyw, [o, patch, wide], dx_c.zeroed());
                        } else if let Some((cpu, packed, shifts, t)) = &direct_dx {
                            // One image per chunk (`together` is 1 with the direct kernel):
                            // the next one's input, output gradient and input gradient come
                            // into cache meanwhile.
                            let ahead = if c0 + 1 < images {
                                let (xi, oi) = (s.in_image(), s.out_image());
                                let next_dy = match dy {
                                    Images::Values(dy) => (dy[(n0 + 1) * oi..].as_ptr(), oi),
                                    _ => (std::ptr::null(), 0),
                                };
                                let next_dx = dx_c.as_ptr().wrapping_add(xi);
                                Ahead::at(&[(x[(n0 + 1) * xi..].as_ptr(), xi), next_dy, (next_dx, xi)])
                            } else {
                                Ahead::default()
                            };
                            direct_image(*cpu, t, shifts, dyw, packed, None, dx_c, ahead);
                        } else {
                            unfolded_grads(s, x_c, weight, dyw, None, Some(dx_c.zeroed()));
                        }
                    }
                })
            });
        }
        (kept, gb)
    };
    // The groups' partial sums in waves, added in group order as each wave ends: the same sums
    // as all the groups' at once. A wave is as many groups as fit in 16 MiB of partials, and at
    // least one per thread: ResNet-18's 512-channel layers then keep 2 partials of 9.4 MB alive
    // instead of 7 (its peak RSS 1587-1592 -> 1548-1550 MiB), while small layers run all their
    // groups in one wave (waves of one group per thread everywhere saved 52 MiB but made its
    // step 1-3% slower, 2 A/B runs).
    // The weight gradient's sum is transposed, [patch, o], or transformed, [ξ][in][o] (`wino_dw`).
    let partial_bytes = 4 * gw_len + 8 * o;
    let wave = ((16 << 20) / partial_bytes.max(1))
        .max(rayon::current_num_threads())
        .max(1);
    let mut sum_t = vec![0.0f32; gw_len];
    let mut sum_b = vec![0.0f64; if want_b { o } else { 0 }];
    for (w, groups) in dx_groups.chunks_mut(wave).enumerate() {
        let partials: Vec<(Partial, Vec<f64>)> = groups
            .par_iter_mut()
            .enumerate()
            .map(|(i, dx)| group(w * wave + i, dx.take()))
            .collect();
        for (gw_t, gb) in partials {
            for (d, &v) in sum_t.iter_mut().zip(&gw_t.0[..gw_len]) {
                *d += v;
            }
            for (d, &v) in sum_b.iter_mut().zip(&gb) {
                *d += v;
            }
            gw_t.give_back();
        }
    }

    if let (Some((by, t)), Some(dx)) = (&turned_dx, dx_turned) {
        assert_eq!(dx.len(), x.len(), "conv2d backward: input gradient length");
        let n = match by {
            DxBy::Winograd(_) => winograd::images_per_call(t),
            DxBy::Forward(..) => images_per_gemm(t),
        };
        let convolve = |dy: &[f32], images: usize, dx: OutChunk<'_>| match by {
            DxBy::Winograd(u) => {
                winograd::convolve(t, u, planes(s, dy), images, None, false, dx);
            }
            DxBy::Forward(w, packs) => {
                let chunk = ConvShape { batch: images, ..*t };
                forward_packed(&chunk, dy, w, packs, None, false, dx.into(), None)
            }
        };
        // Chunks written by the convolution: zeroed only where its path needs it.
        dx.par_out_chunks(n * s.in_image())
            .enumerate()
            .for_each(|(g, dx)| {
                let images = dx.len() / s.in_image();
                let at = g * n * s.out_image();
                dy.with(s.out_image(), g * n, images, 4, |dy_c| match relu_out {
                    None => convolve(dy_c, images, dx),
                    Some(y) => with_scratch(2, dy_c.len(), |masked| {
                        relu_mask(dy_c, &y[at..][..dy_c.len()], masked);
                        convolve(masked, images, dx)
                    }),
                })
            });
    }
    if let Some(dw) = dweight {
        assert_eq!(
            dw.len(),
            s.weight_len(),
            "conv2d backward: weight gradient length"
        );
        if wino_dw {
            winograd::weights_from_transformed(o, s.in_channels, &sum_t, dw);
        } else {
            transpose(&sum_t, patch, o, dw);
        }
    }
    if let Some(db) = dbias {
        assert_eq!(db.len(), o, "conv2d backward: bias gradient length");
        for (d, v) in db.iter_mut().zip(sum_b) {
            *d = v as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bias of the wrong length was truncated (or left channels without one) by `zip`.
    #[test]
    #[should_panic(expected = "conv2d: bias length")]
    fn a_bias_of_the_wrong_length_is_refused() {
        let s = ConvShape {
            batch: 1,
            in_channels: 1,
            in_h: 4,
            in_w: 4,
            out_channels: 3,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [0, 0],
            mode: PadMode::Zeros,
        };
        let mut out = vec![0.0; s.out_image()];
        conv2d_forward(
            &s,
            &[0.0; 16],
            &vec![0.0; s.weight_len()],
            Some(&[1.0, 2.0]),
            false,
            &mut out,
        );
    }

    /// Strided copies (unfolding a stride-2 layer) by the AVX-512 permute are the portable
    /// loop's, at every length up to three vectors and with `src` just long enough.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_strided_copies_are_the_portable_loops() {
        let Some(cpu) = super::super::simd::Avx512::detect() else {
            return;
        };
        for stride in [1, 2, 3] {
            for n in 1..=48 {
                let src: Vec<f32> = (0..(n - 1) * stride + 1).map(|i| i as f32 + 0.5).collect();
                let (mut got, mut want) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                Rows::copy_strided(cpu, &mut got, &src, stride);
                Portable.copy_strided(&mut want, &src, stride);
                assert_eq!(got, want, "stride {stride}, {n} floats");
                assert!(want.iter().enumerate().all(|(j, &v)| v == src[j * stride]));
            }
        }
    }

    /// The AVX-512 zero padding writes the portable rows' bits, every float of the padded
    /// planes (NaN before), for narrow, ragged and wide rows and uneven padding; rows past
    /// its widest are left to the portable loop, untouched.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_zero_padding_is_the_portable_rows() {
        let Some(cpu) = super::super::simd::Avx512::detect() else {
            return;
        };
        let cases = [
            (1, 1, 1, [0, 0]),
            (3, 5, 7, [1, 1]),
            (16, 28, 28, [1, 1]),
            (32, 14, 14, [1, 1]),
            (2, 7, 7, [2, 2]),
            (2, 6, 17, [0, 3]),
            (1, 3, 40, [1, 0]),
            (1, 2, 254, [0, 1]),
            (1, 2, 255, [0, 1]),
        ];
        for (c, h, w, padding) in cases {
            let s = ConvShape {
                batch: 1,
                in_channels: c,
                in_h: h,
                in_w: w,
                out_channels: 4,
                kernel: [1, 1],
                stride: [1, 1],
                padding,
                mode: PadMode::Zeros,
            };
            let x: Vec<f32> = (0..c * h * w).map(|i| i as f32 * 0.5 - 3.0).collect();
            let (ph_n, pw_n) = padded_size(&s);
            let mut want = vec![f32::NAN; c * ph_n * pw_n];
            pad_image_rows(Portable, &s, &x, &mut want);
            let mut got = vec![f32::NAN; want.len()];
            let took = cpu.pad_zeros(&mut got, &x, [h, w], padding);
            assert_eq!(took, pw_n <= super::super::simd::Avx512::PAD_MAX_WIDTH, "{s:?}");
            if took {
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{s:?}");
            } else {
                assert!(got.iter().all(|v| v.is_nan()), "{s:?}: written");
            }
        }
    }

    /// A first layer's output computed again ([`ConvImages`]), in any extent from any image, has
    /// the bits [`conv2d_forward`] writes (the ops after it read it in its place); convolutions
    /// that are costly to compute again or take another path are not offered.
    #[test]
    fn images_computed_again_are_the_forwards() {
        let shape = |batch, in_channels, size, out_channels, k, pad| ConvShape {
            batch,
            in_channels,
            in_h: size,
            in_w: size,
            out_channels,
            kernel: [k, k],
            stride: [1, 1],
            padding: [pad, pad],
            mode: PadMode::Zeros,
        };
        let wave =
            |n: usize, salt: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * 0.37 + salt).sin()).collect() };
        for (s, biased) in [
            (shape(5, 1, 28, 32, 3, 1), false), // speedrun block 1
            (shape(3, 3, 32, 16, 3, 1), true),  // a colour first layer
            (shape(4, 1, 28, 16, 3, 1), true),  // ResNet-20's stem
        ] {
            let (x, w, b) = (
                wave(s.batch * s.in_image(), 0.1),
                wave(s.weight_len(), 0.7),
                wave(s.out_channels, 0.3),
            );
            let bias = biased.then_some(&b[..]);
            let mut whole = vec![0.0; s.batch * s.out_image()];
            conv2d_forward(&s, &x, &w, bias, false, &mut whole);
            let images = ConvImages::recompute(&s, &x, &w, bias).expect("a first layer");
            for (first, n) in [(0, s.batch), (1, 2), (s.batch - 1, 1)] {
                let mut part = vec![f32::NAN; n * s.out_image()];
                images.images(first, &mut part);
                let want = &whole[first * s.out_image()..][..part.len()];
                assert!(
                    part.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{s:?}: images {first}..{}",
                    first + n
                );
            }
        }
        for s in [
            shape(2, 32, 14, 64, 3, 1),
            shape(2, 16, 8, 16, 3, 1),
            shape(40, 1, 7, 8, 3, 1),
        ] {
            let (x, w) = (vec![0.0; s.batch * s.in_image()], vec![0.0; s.weight_len()]);
            assert!(ConvImages::recompute(&s, &x, &w, None).is_none(), "{s:?}");
        }
    }

    /// Direct convolution in f64: the definition, for checking the kernels.
    fn reference(s: &ConvShape, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
        let (oh_n, ow_n) = (s.out_h(), s.out_w());
        let mut out = vec![0.0; s.batch * s.out_image()];
        let at = |v: usize, pad: usize, size: usize| -> Option<usize> {
            let i = v as isize - pad as isize;
            match s.mode {
                PadMode::Zeros => (0..size as isize).contains(&i).then_some(i as usize),
                PadMode::Replicate => Some(i.clamp(0, size as isize - 1) as usize),
            }
        };
        for n in 0..s.batch {
            for o in 0..s.out_channels {
                for oh in 0..oh_n {
                    for ow in 0..ow_n {
                        let mut acc = b[o] as f64;
                        for c in 0..s.in_channels {
                            for kh in 0..s.kernel[0] {
                                for kw in 0..s.kernel[1] {
                                    let ih = at(oh * s.stride[0] + kh, s.padding[0], s.in_h);
                                    let iw = at(ow * s.stride[1] + kw, s.padding[1], s.in_w);
                                    if let (Some(ih), Some(iw)) = (ih, iw) {
                                        let xv = x[((n * s.in_channels + c) * s.in_h + ih) * s.in_w + iw];
                                        let wv = w
                                            [((o * s.in_channels + c) * s.kernel[0] + kh) * s.kernel[1] + kw];
                                        acc += xv as f64 * wv as f64;
                                    }
                                }
                            }
                        }
                        out[((n * s.out_channels + o) * oh_n + oh) * ow_n + ow] = acc;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn forward_matches_the_definition_with_replicate_padding_and_stride() {
        let s = ConvShape {
            batch: 2,
            in_channels: 3,
            in_h: 7,
            in_w: 6,
            out_channels: 4,
            kernel: [3, 2],
            stride: [2, 1],
            padding: [2, 1],
            mode: PadMode::Replicate,
        };
        let x: Vec<f32> = (0..s.batch * s.in_image())
            .map(|i| ((i * 7919) % 23) as f32 - 11.0)
            .collect();
        let w: Vec<f32> = (0..s.weight_len())
            .map(|i| ((i * 104729) % 17) as f32 * 0.1 - 0.8)
            .collect();
        let b = [0.5f32, -1.0, 0.25, 2.0];
        let mut out = vec![f32::NAN; s.batch * s.out_image()];
        conv2d_forward(&s, &x, &w, Some(&b), false, &mut out);
        for (got, want) in out.iter().zip(reference(&s, &x, &w, &b)) {
            assert!(
                (*got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
    }

    /// The direct kernels, whatever the size thresholds that choose them in training: forward
    /// against the definition, the weight gradient against the unfolded image's product, and
    /// the input gradient (the transposed convolution) against col2im of the GEMM product, over
    /// small shapes with every padding a kernel allows, odd widths, pitches shorter and longer
    /// than a register tile, 4 and 8 output channels.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn direct_kernel_matches_the_definition_and_im2col() {
        let Some(cpu) = super::super::simd::Avx512::detect() else {
            eprintln!("skipped: this CPU has no AVX-512F (or EMBER_SIMD=portable)");
            return;
        };
        let mut cases = 0;
        for (c, o, h, w, kh, kw) in [
            (1, 4, 5, 5, 3, 3),
            (3, 8, 7, 9, 3, 3),
            (5, 4, 6, 4, 2, 3),
            (9, 8, 11, 13, 3, 3),
            (16, 4, 28, 28, 3, 3),
            (2, 4, 9, 7, 5, 5),
            (4, 8, 3, 3, 3, 1),
            (8, 4, 6, 10, 3, 3),
            (12, 8, 5, 7, 2, 2),
        ] {
            for ph in 0..kh {
                for pw in 0..kw {
                    let s = ConvShape {
                        batch: 1,
                        in_channels: c,
                        in_h: h,
                        in_w: w,
                        out_channels: o,
                        kernel: [kh, kw],
                        stride: [1, 1],
                        padding: [ph, pw],
                        mode: PadMode::Zeros,
                    };
                    if !s.is_valid() {
                        continue;
                    }
                    cases += 1;
                    let x: Vec<f32> = (0..s.in_image())
                        .map(|i| ((i * 7919) % 23) as f32 * 0.1 - 1.1)
                        .collect();
                    let wt: Vec<f32> = (0..s.weight_len())
                        .map(|i| ((i * 104729) % 17) as f32 * 0.1 - 0.8)
                        .collect();
                    let b: Vec<f32> = (0..o).map(|i| i as f32 * 0.25 - 0.5).collect();
                    let taps = kh * kw;
                    let packed = pack_weights(&s, |oc, ic, t| wt[(oc * c + ic) * taps + t]);
                    let mut out = vec![f32::NAN; s.out_image()];
                    // Prefetch hints at unmapped and past-the-end addresses: no fault, no
                    // effect on the values.
                    let wild = Ahead::at(&[
                        (std::ptr::null(), 1000),
                        (x.as_ptr().wrapping_add(x.len() + 4096), 5000),
                        (x.as_ptr(), x.len()),
                    ]);
                    direct_image(
                        cpu,
                        &s,
                        &tap_shifts(&s),
                        &x,
                        &packed,
                        Some(&b),
                        out.as_mut_slice().into(),
                        wild,
                    );
                    for (i, (got, want)) in out.iter().zip(reference(&s, &x, &wt, &b)).enumerate() {
                        assert!(
                            (*got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{s:?} out[{i}]: {got} vs {want}"
                        );
                    }
                    let dy: Vec<f32> = (0..s.out_image())
                        .map(|i| ((i * 31) % 13) as f32 * 0.2 - 1.2)
                        .collect();
                    // The weight gradient by the direct kernel, added onto a start value, vs
                    // dy . col^T (transposed, [patch, o]).
                    let (patch, pixels) = (s.patch(), s.pixels());
                    let mut col = vec![0.0f32; patch * pixels];
                    im2col(&s, &x, &mut col);
                    let mut gw_t = vec![0.5f32; patch * o];
                    direct_weight_image(cpu, &s, &tap_shifts(&s), &x, &dy, pixels, &mut gw_t);
                    for (i, got) in gw_t.iter().enumerate() {
                        let (p, oc) = (i / o, i % o);
                        let want: f64 = 0.5
                            + (0..pixels)
                                .map(|q| dy[oc * pixels + q] as f64 * col[p * pixels + q] as f64)
                                .sum::<f64>();
                        assert!(
                            (*got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{s:?} dw_t[{i}]: {got} vs {want}"
                        );
                    }
                    // dx through the transposed convolution (whose outputs are s's input
                    // channels: a multiple of 4) vs dcol = w^T dy, then col2im.
                    if c % 4 != 0 {
                        continue;
                    }
                    let t = transposed(&s).expect("zero padding below the kernel size");
                    let packed_t = pack_weights(&t, |ic, oc, k| wt[(oc * c + ic) * taps + (taps - 1 - k)]);
                    let mut dx = vec![f32::NAN; s.in_image()];
                    direct_image(
                        cpu,
                        &t,
                        &tap_shifts(&t),
                        &dy,
                        &packed_t,
                        None,
                        dx.as_mut_slice().into(),
                        Ahead::default(),
                    );
                    let mut dcol = vec![0.0f32; patch * pixels];
                    for p in 0..patch {
                        for q in 0..pixels {
                            dcol[p * pixels + q] =
                                (0..o).map(|oc| wt[oc * patch + p] * dy[oc * pixels + q]).sum();
                        }
                    }
                    let mut want = vec![0.0f32; s.in_image()];
                    col2im(&s, &dcol, &mut want);
                    for (i, (got, want)) in dx.iter().zip(&want).enumerate() {
                        assert!(
                            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{s:?} dx[{i}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
        assert!(cases > 30, "{cases} shapes");
    }

    /// The lane kernels (output channels in the vector lanes) against the definition, on every
    /// row width the forward's register tiles take (1-14 pixels with 2 vectors of output
    /// channels, 1-7 with 4), several blocks of 32 or 64 output channels, input channels in
    /// whole and partial summation blocks, zero and replicate padding, non-square images and
    /// kernels; the 3x3 weight gradient on the same shapes.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn lane_kernel_matches_the_definition() {
        let Some(cpu) = super::super::simd::Avx512::detect() else {
            eprintln!("skipped: this CPU has no AVX-512F (or EMBER_SIMD=portable)");
            return;
        };
        let (mut cases, mut weight_grads) = (0, 0);
        let mut widths = [[false; 15]; 2];
        for w in 1..=14 {
            for (c, o, h, kh, kw, pad, mode) in [
                (3, 32, 5, 3, 3, [1, 1], PadMode::Zeros),
                (17, 64, 4, 3, 3, [1, 1], PadMode::Zeros),
                (35, 96, 3, 3, 3, [0, 1], PadMode::Zeros),
                (8, 128, 6, 2, 3, [1, 2], PadMode::Replicate),
                (6, 32, 7, 5, 5, [2, 2], PadMode::Replicate),
            ] {
                let s = ConvShape {
                    batch: 1,
                    in_channels: c,
                    in_h: h,
                    in_w: w + kw - 1 - 2 * pad[1],
                    out_channels: o,
                    kernel: [kh, kw],
                    stride: [1, 1],
                    padding: pad,
                    mode,
                };
                if w + kw - 1 < 2 * pad[1] + 1 || !s.is_valid() || s.out_w() != w {
                    continue;
                }
                cases += 1;
                widths[usize::from(super::super::simd::lane_vectors(o, w) == 4)][w] = true;
                let x: Vec<f32> = (0..s.in_image())
                    .map(|i| ((i * 7919) % 23) as f32 * 0.1 - 1.1)
                    .collect();
                let wt: Vec<f32> = (0..s.weight_len())
                    .map(|i| ((i * 104729) % 17) as f32 * 0.1 - 0.8)
                    .collect();
                let b: Vec<f32> = (0..o).map(|i| i as f32 * 0.25 - 0.5).collect();
                let taps = kh * kw;
                let packed = pack_lanes(&s, |oc, ic, t| wt[(oc * c + ic) * taps + t]);
                if [kh, kw] == [3, 3] {
                    // The weight gradient, added onto a start value, from an output gradient
                    // whose maps lie `stride` floats apart (images side by side), vs dy . col^T.
                    let (patch, pixels) = (s.patch(), s.pixels());
                    let stride = pixels + 5;
                    let dy: Vec<f32> = (0..o * stride)
                        .map(|i| ((i * 31) % 13) as f32 * 0.2 - 1.2)
                        .collect();
                    let mut col = vec![0.0f32; patch * pixels];
                    im2col(&s, &x, &mut col);
                    let mut gw_t = vec![0.5f32; patch * o];
                    lane_weight_image(cpu, &s, &x, &dy, stride, &mut gw_t);
                    for (i, got) in gw_t.iter().enumerate() {
                        let (p, oc) = (i / o, i % o);
                        let want: f64 = 0.5
                            + (0..pixels)
                                .map(|q| dy[oc * stride + q] as f64 * col[p * pixels + q] as f64)
                                .sum::<f64>();
                        assert!(
                            (*got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{s:?} dw_t[{i}]: {got} vs {want}"
                        );
                    }
                    weight_grads += 1;
                }
                for bias in [Some(&b[..]), None] {
                    let mut out = vec![f32::NAN; s.out_image()];
                    let wild = Ahead::at(&[(std::ptr::null(), 1000), (x.as_ptr(), x.len())]);
                    lane_image(
                        cpu,
                        &s,
                        &tap_shifts(&s),
                        &x,
                        &packed,
                        bias,
                        out.as_mut_slice().into(),
                        wild,
                    );
                    let zeros = vec![0.0; o];
                    let want = reference(&s, &x, &wt, bias.unwrap_or(&zeros));
                    for (i, (got, want)) in out.iter().zip(want).enumerate() {
                        assert!(
                            (*got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{s:?} bias {} out[{i}]: {got} vs {want}",
                            bias.is_some()
                        );
                    }
                }
            }
        }
        assert!(
            widths[0][1..].iter().all(|&w| w),
            "2-vector widths: {:?}",
            widths[0]
        );
        assert!(
            widths[1][1..8].iter().all(|&w| w),
            "4-vector widths: {:?}",
            widths[1]
        );
        assert!(
            cases > 40 && weight_grads > 30,
            "{cases} shapes, {weight_grads} weight gradients"
        );
    }

    /// The AVX-512 row loops give the portable ones' results bit for bit, for rows shorter and
    /// longer than a vector (im2col, col2im, padding both ways, stride 1 and 2).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn wide_opsmatch_the_portable_ones() {
        if super::super::simd::Avx512::detect().is_none() {
            eprintln!("skipped: this CPU has no AVX-512F (or EMBER_SIMD=portable)");
            return;
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for mode in [PadMode::Zeros, PadMode::Replicate] {
            for (in_h, in_w) in [(5, 7), (9, 18), (6, 37)] {
                for stride in [1, 2] {
                    for padding in [0, 1, 2] {
                        let s = ConvShape {
                            batch: 1,
                            in_channels: 3,
                            in_h,
                            in_w,
                            out_channels: 1,
                            kernel: [3, 3],
                            stride: [stride, stride],
                            padding: [padding, padding],
                            mode,
                        };
                        let x: Vec<f32> = (0..s.in_image()).map(|i| (i as f32 * 0.37).sin()).collect();
                        let c: Vec<f32> = (0..s.patch() * s.pixels())
                            .map(|i| (i as f32 * 0.53).cos())
                            .collect();
                        let (ph_n, pw_n) = padded_size(&s);
                        let (mut p1, mut p2) = (
                            vec![1.0; s.in_channels * ph_n * pw_n],
                            vec![2.0; s.in_channels * ph_n * pw_n],
                        );
                        pad_image_rows(Portable, &s, &x, &mut p1);
                        pad_image(&s, &x, &mut p2);
                        assert_eq!(bits(&p1), bits(&p2), "pad {s:?}");
                        let (mut c1, mut c2) = (vec![1.0; c.len()], vec![2.0; c.len()]);
                        unfold_rows(Portable, &s, &p1, &mut c1, s.pixels());
                        unfold(&s, &p1, &mut c2, s.pixels());
                        assert_eq!(bits(&c1), bits(&c2), "unfold {s:?}");
                        fold_rows(Portable, &s, &c, &mut p1, s.pixels());
                        fold(&s, &c, &mut p2, s.pixels());
                        assert_eq!(bits(&p1), bits(&p2), "fold {s:?}");
                        let (mut d1, mut d2) = (vec![1.0; x.len()], vec![2.0; x.len()]);
                        unpad_rows(Portable, &s, &p1, &mut d1);
                        unpad(&s, &p1, &mut d2);
                        assert_eq!(bits(&d1), bits(&d2), "unpad {s:?}");
                    }
                }
            }
        }
    }

    /// `copy_rows` gives row-by-row copies, every float of `dst` written: rows narrower than
    /// half a vector (a whole-vector store then spans the next two rows), pitches below 16,
    /// sources that end with the last row or run on, one row and several.
    #[test]
    fn copy_rows_copies_each_row() {
        for width in 1..=20 {
            for pitch in [width, width + 1, width + 2, 16.max(width), 17.max(width)] {
                for rows in 1..=6 {
                    for extra in [0, 3, 20] {
                        let src: Vec<f32> = (0..(rows - 1) * pitch + width + extra)
                            .map(|i| i as f32)
                            .collect();
                        let want: Vec<f32> = (0..rows * width)
                            .map(|i| src[i / width * pitch + i % width])
                            .collect();
                        let mut got = vec![f32::NAN; rows * width];
                        Portable.copy_rows(&mut got, &src, pitch, width);
                        assert_eq!(got, want, "portable, width {width} pitch {pitch} rows {rows}");
                        #[cfg(target_arch = "x86_64")]
                        if let Some(cpu) = super::super::simd::Avx512::detect() {
                            let mut got = vec![f32::NAN; rows * width];
                            cpu.copy_rows(&mut got, &src, pitch, width);
                            assert_eq!(got, want, "AVX-512, width {width} pitch {pitch} rows {rows}");
                        }
                    }
                }
            }
        }
    }

    /// col2im is the adjoint of im2col: <im2col(x), c> = <x, col2im(c)> for any x and c, with
    /// zero and replicate padding and strides 1 and 2.
    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        for mode in [PadMode::Zeros, PadMode::Replicate] {
            for stride in [1, 2] {
                for padding in [0, 1, 2] {
                    let s = ConvShape {
                        batch: 1,
                        in_channels: 2,
                        in_h: 5,
                        in_w: 7,
                        out_channels: 1,
                        kernel: [3, 2],
                        stride: [stride, stride],
                        padding: [padding, padding],
                        mode,
                    };
                    let x: Vec<f32> = (0..s.in_image()).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
                    let c: Vec<f32> = (0..s.patch() * s.pixels())
                        .map(|i| ((i * 53) % 13) as f32 - 6.0)
                        .collect();
                    let mut col = vec![f32::NAN; c.len()];
                    im2col(&s, &x, &mut col);
                    let mut dx = vec![f32::NAN; x.len()];
                    col2im(&s, &c, &mut dx);
                    let lhs: f64 = col.iter().zip(&c).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let rhs: f64 = x.iter().zip(&dx).map(|(&a, &b)| a as f64 * b as f64).sum();
                    assert_eq!(lhs, rhs, "{s:?}");
                }
            }
        }
    }
}
