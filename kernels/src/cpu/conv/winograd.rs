//! Winograd's minimal filtering F(2x2, 3x3) for 3x3 convolutions with stride 1 and one pixel of
//! zero padding (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015).
//!
//! The output is cut into 2x2 tiles; each reads a 4x4 tile of the padded input. Per tile and
//! channel the input becomes `V = Bᵀ d B`, per output and input channel the kernel `U = G g Gᵀ`
//! (both 4x4), and the 16 element positions ξ of these 4x4 tiles are 16 independent GEMMs,
//! `M_ξ[out, tiles] = U_ξ[out, in] . V_ξ[in, tiles]`; `Y = Aᵀ M A` turns each tile's 16 sums into
//! its 2x2 outputs. The GEMMs take 16 multiply-adds per 4 outputs and input channel, against 36
//! for the direct sum: 2.25x fewer, at the price of the transforms (additions only, a few passes
//! over data the size of the input and output).
//!
//! Rounding: every value is the f32 result of a fixed sequence of operations that depends only
//! on the shapes (the transforms elementwise, the GEMMs single-threaded per group of images
//! whose size depends on the shapes), so results are bit-identical for any thread count and,
//! the transforms being plain additions that auto-vectorise without reordering, for the
//! AVX-512 and portable builds of the loops. The transforms add and subtract values of the
//! input's and kernel's own scale, so the error stays within a small multiple of the direct
//! sum's (checked against f64 in the tests).
//!
//! The weight gradient ([`weight_grad`]) sums `(A dY Aᵀ) ⊙ V` over the tiles in the same
//! transformed domain, 16 GEMMs of `out x in` over the tiles, and turns the sums into the 3x3
//! kernel's gradient once per backward, `Gᵀ M G` in f64.
//!
//! F(4x4, 3x3) (6x6 tiles, 36 GEMMs per 16 outputs: 4x fewer multiply-adds than the direct sum) was
//! built and measured (divan `conv2d_fwd`, batch 64, one thread, Intel Xeon with AVX-512): 64x32x32
//! 36.6 -> 31.6 ms, 128x16x16 31.4 -> 22.9, 256x8x8 30.7 -> 21.6, with its transforms over all of a
//! call's tiles at once and its kernel transform in parallel; a ResNet-18 step about 4-8% faster
//! (five alternating pairs on a VM that drifted 15-20%). But its transforms scale values by up to 8
//! and 1/24, and its rounding error put ResNet-18's `grad.conv1.weight` 2.6e-3 from the float64
//! reference, 15 times float32 PyTorch's own error, which `tests/parity.rs` rejects; F(4x4, 3x3)
//! forward with F(2x2, 3x3) for the input gradient did the same (2.6e-3), and so did F(3x3, 3x3)
//! forward (points 0, ±1, 2: 6.9e-3). Against the direct sum in f64 (the test below), the worst
//! error in units of the terms' magnitudes was 1.3e-7 for F(2x2, 3x3), 5.7e-7 for F(3x3, 3x3) and
//! 1.3e-6 for F(4x4, 3x3): the first layer's weight gradient, a sum that cancels heavily, magnifies
//! them by three to four orders of magnitude. So F(2x2, 3x3) stays; a larger tile would need
//! transforms that keep its error near F(2x2, 3x3)'s, and would have to pass that test first.

use std::mem::MaybeUninit;

use crate::cpu::out::OutChunk;
use crate::cpu::relu_in_place;
use crate::cpu::scratch::with_scratch;

use super::{weights_times, ConvShape, PadMode};

/// Positions in a 4x4 transformed tile: one GEMM each.
const XI: usize = 16;

/// Where the transforms pay off. With few channels each GEMM is too small to amortise the
/// transforms, and on small odd images the padded tiles waste up to a third of the work: there
/// the direct kernel wins. Measured in `benches/kernels.rs` (`conv2d_fwd`, `conv2d_bwd_input`,
/// one thread, batch 64, Intel Xeon with AVX-512, median ms direct → Winograd):
///
/// | layer               | forward       | input gradient |
/// |---------------------|---------------|----------------|
/// | 16x28x28  -> 16     | 2.37 → 4.30   | 2.12 → 4.81    |
/// | 32x14x14  -> 32     | 2.44 → 3.05   | 2.03 → 3.44    |
/// | 64x7x7    -> 64     | 2.24 → 3.55   | 3.20 → 3.73    |
/// | 32x14x14  -> 64     | 3.93 → 4.77   | 3.32 → 5.84    |
/// | 64x7x7    -> 128    | 3.60 → 5.90   | 4.66 → 6.33    |
/// | 64x32x32  -> 64     | 46.7 → 29.1   | 35.4 → 32.3    |
/// | 128x16x16 -> 128    | 32.6 → 28.2   | 33.6 → 28.4    |
/// | 256x8x8   -> 256    | 26.7 → 25.2   | 38.7 → 26.0    |
/// | 512x4x4   -> 512    | 29.5 → 36.8   | 85.1 → 37.5    |
///
/// Hence: at least [`MIN_CHANNELS`] on both sides and an output of at least [`MIN_SIDE`]
/// pixels a side, or, for the input gradient, at least [`MIN_CHANNELS_ANY_SIDE`] channels. The
/// weight gradient takes the forward's bounds where no direct kernel computes it (measured on
/// ResNet-18's 64x32x32 to 256x8x8 layers, 8-24% faster than im2col; not on smaller ones).
const MIN_CHANNELS: usize = 64;
const MIN_SIDE: usize = 8;
const MIN_CHANNELS_ANY_SIDE: usize = 256;

/// About this many tiles per call: enough columns for each GEMM to run at full width.
const TILES_PER_CALL: usize = 512;

/// At most this many bytes of transformed input per call (and as many of products): the
/// thread's scratch buffers are kept between steps, so this bounds what they hold.
const MAX_SCRATCH_BYTES: usize = 4 << 20;

/// Which pass a convolution computes: the forward, the input gradient as the forward of the
/// transposed shape, or the weight gradient ([`weight_grad`], on the same shapes as the
/// forward).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Pass {
    Forward,
    InputGradient,
    WeightGradient,
}

/// Whether Winograd F(2x2, 3x3) computes `s` in `pass`: a 3x3 kernel, stride 1, one pixel of
/// zero padding (the output the input's size), and a size where it measured faster (see
/// [`MIN_CHANNELS`]).
pub(super) fn applies(s: &ConvShape, pass: Pass) -> bool {
    let channels = s.in_channels.min(s.out_channels);
    let pays = channels >= MIN_CHANNELS
        && (s.in_h.min(s.in_w) >= MIN_SIDE
            || (pass == Pass::InputGradient && channels >= MIN_CHANNELS_ANY_SIDE));
    s.kernel == [3, 3]
        && s.stride == [1, 1]
        && s.padding == [1, 1]
        && s.mode == PadMode::Zeros
        && pays
        && s.is_valid()
}

/// Tile rows and columns: `ceil(out / 2)` each (the output is the input's size).
fn tiles(s: &ConvShape) -> (usize, usize) {
    (s.in_h.div_ceil(2), s.in_w.div_ceil(2))
}

/// Images per call ([`convolve`]): a function of the shapes only.
pub(super) fn images_per_call(s: &ConvShape) -> usize {
    let (th, tw) = tiles(s);
    let per_image = th * tw;
    let widest = s.in_channels.max(s.out_channels);
    let by_bytes = MAX_SCRATCH_BYTES / (XI * widest * per_image * std::mem::size_of::<f32>());
    TILES_PER_CALL
        .div_ceil(per_image)
        .min(by_bytes)
        .clamp(1, s.batch.max(1))
}

/// The kernels transformed, `u[ξ][o][c]` = `(G g Gᵀ)[ξ]` of the 3x3 kernel `g[t] = get(o, c, t)`
/// (`t` row-major over the taps), each computed in f64 and rounded once.
pub(super) fn transform_weights(
    out_channels: usize,
    in_channels: usize,
    get: impl Fn(usize, usize, usize) -> f32,
) -> Vec<f32> {
    const G: [[f64; 3]; 4] = [
        [1.0, 0.0, 0.0],
        [0.5, 0.5, 0.5],
        [0.5, -0.5, 0.5],
        [0.0, 0.0, 1.0],
    ];
    let plane = out_channels * in_channels;
    let mut u = vec![0.0f32; XI * plane];
    for o in 0..out_channels {
        for c in 0..in_channels {
            let g: [f64; 9] = std::array::from_fn(|t| f64::from(get(o, c, t)));
            // gg = G g, [4, 3]; then U = gg Gᵀ, [4, 4].
            let gg: [[f64; 3]; 4] = std::array::from_fn(|i| {
                std::array::from_fn(|l| (0..3).map(|k| G[i][k] * g[k * 3 + l]).sum())
            });
            for i in 0..4 {
                for j in 0..4 {
                    let v: f64 = (0..3).map(|l| gg[i][l] * G[j][l]).sum();
                    u[(i * 4 + j) * plane + o * in_channels + c] = v as f32;
                }
            }
        }
    }
    u
}

/// Input images addressed by strides: channel `c` of image `j` is the `in_h x in_w` plane at
/// `data[j * image + c * channel..]` (NCHW is `image = in_channels * plane`, `channel = plane`;
/// the backward's side-by-side gradients are `image = plane`, `channel = images * plane`).
#[derive(Clone, Copy)]
pub(super) struct Planes<'a> {
    pub data: &'a [f32],
    pub image: usize,
    pub channel: usize,
}

/// `out = conv(x, g) + bias`, then `max(out, 0)` when `relu`, for `images` images (`out` NCHW,
/// `images` whole images, written once, never zeroed first); `u` from [`transform_weights`] of
/// `s`'s kernel. Returns the output.
pub(super) fn convolve<'o>(
    s: &ConvShape,
    u: &[f32],
    x: Planes<'_>,
    images: usize,
    bias: Option<&[f32]>,
    relu: bool,
    out: OutChunk<'o>,
) -> &'o mut [f32] {
    let (th, tw) = tiles(s);
    let tiles = images * th * tw;
    let (ci, co) = (s.in_channels, s.out_channels);
    assert_eq!(u.len(), XI * co * ci, "winograd: transformed weight length");
    assert_eq!(out.len(), images * s.out_image(), "winograd: output length");
    let plane = s.in_h * s.in_w;
    if images > 0 {
        let last = (images - 1) * x.image + (ci - 1) * x.channel + plane;
        assert!(x.data.len() >= last, "winograd: input too short");
    }
    if let Some(b) = bias {
        assert_eq!(b.len(), co, "winograd: bias length");
    }
    let (v_pitch, m_pitch) = (pitch(ci, tiles), pitch(co, tiles));
    with_scratch(0, XI * v_pitch, |v| {
        transform_input(s, x, images, v);
        with_scratch(1, XI * m_pitch, |m| {
            for (u, (v, m)) in u
                .chunks_exact(co * ci)
                .zip(v.chunks_exact(v_pitch).zip(m.chunks_exact_mut(m_pitch)))
            {
                weights_times(u, co, ci, &v[..ci * tiles], &mut m[..co * tiles], tiles, false);
            }
            // SAFETY: `transform_output` writes every element of its output (both of its
            // paths visit every output plane of the `images` images, and every pixel of each).
            unsafe { out.written_by(|out| transform_output(s, m, images, bias, relu, out)) }
        })
    })
}

/// Elements from one transformed plane `ξ` (`rows` channels of `tiles` tiles) to the next: the
/// plane rounded up to an odd number of cache lines. The transforms write (and read) all 16
/// planes of a tile at once; planes a multiple of 4 KiB apart (64 channels x 512 tiles is 128
/// KiB) fall in the same L1 and L2 cache sets and evict each other, while an odd number of
/// lines puts the 16 planes in 16 different sets (about 1 ms of ResNet-18's 19 ms 64x32x32
/// layer at batch 64). The padding only moves data: the values are the same.
fn pitch(rows: usize, tiles: usize) -> usize {
    const LINE: usize = 16;
    ((rows * tiles).div_ceil(LINE) | 1) * LINE
}

/// `V = Bᵀ d B` of every tile, into `v[ξ][c][tile]` (planes `ξ` [`pitch`] apart; tiles numbered
/// image, tile row, tile column).
#[inline(never)]
fn transform_input(s: &ConvShape, x: Planes<'_>, images: usize, v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = crate::cpu::simd::Avx512::detect() {
        #[target_feature(enable = "avx512f")]
        fn wide(cpu: crate::cpu::simd::Avx512, s: &ConvShape, x: Planes<'_>, images: usize, v: &mut [f32]) {
            transform_input_loops(s, x, images, v, |rows, out, pitch| {
                cpu.winograd_input_row(rows, out, pitch)
            })
        }
        // SAFETY: a function compiled for AVX-512F needs a CPU that runs it, which `detect`
        // checked.
        return unsafe { wide(cpu, s, x, images, v) };
    }
    let mut t = Vec::new();
    transform_input_loops(s, x, images, v, |rows, out, pitch| {
        input_row(rows, out, pitch, &mut t)
    })
}

/// [`Avx512::winograd_input_row`](crate::cpu::simd::Avx512::winograd_input_row)'s sums, the
/// same operations in the same order: Bᵀ d down the columns gives four rows t_i over the padded
/// columns (padded column p is column p - 1; columns 0 and w + 1.. stay zero), in `t`; the tile
/// at tile column k reads t_i[2k..2k + 4], and [`input_cols`] combines those across.
fn input_row(rows: [&[f32]; 4], out: &mut [f32], pitch: usize, t: &mut Vec<f32>) {
    let w = rows[0].len();
    let tw = w.div_ceil(2);
    t.clear();
    t.resize(2 * tw + 2, 0.0);
    let [r0, r1, r2, r3] = rows;
    for i in 0..4 {
        // Bᵀ's rows: t0 = d0 - d2, t1 = d1 + d2, t2 = d2 - d1, t3 = d1 - d3.
        let (a, b) = match i {
            0 => (r0, r2),
            1 | 2 => (r1, r2),
            _ => (r1, r3),
        };
        let pairs = t[1..=w].iter_mut().zip(a.iter().zip(b));
        match i {
            0 | 3 => pairs.for_each(|(t, (a, b))| *t = a - b),
            1 => pairs.for_each(|(t, (a, b))| *t = a + b),
            _ => pairs.for_each(|(t, (a, b))| *t = b - a),
        }
        input_cols(t, four_planes(out, pitch, i, 0, tw));
    }
}

/// The sums across of one row `t` of [`input_row`]: v_i0 = X0 - X2, v_i1 = X1 + X2,
/// v_i2 = X2 - X1, v_i3 = X1 - X3 with X0..X3 = t[2k..2k + 4], one tile at a time.
fn input_cols(t: &[f32], [v0, v1, v2, v3]: [&mut [f32]; 4]) {
    for (k, (((v0, v1), v2), v3)) in v0.iter_mut().zip(v1).zip(v2).zip(v3).enumerate() {
        let [x0, x1, x2, x3] = [t[2 * k], t[2 * k + 1], t[2 * k + 2], t[2 * k + 3]];
        (*v0, *v1, *v2, *v3) = (x0 - x2, x1 + x2, x2 - x1, x1 - x3);
    }
}

/// The four outputs at `at` (`len` floats) of the transformed planes `4 i..4 i + 4`, [`pitch`]
/// `plane` apart (split off in place: built by `array::from_fn`, the slices were a call of
/// their own per row, 6% of the weight gradient's time).
#[inline(always)]
fn four_planes(v: &mut [f32], plane: usize, i: usize, at: usize, len: usize) -> [&mut [f32]; 4] {
    let (p0, rest) = v[4 * i * plane..].split_at_mut(plane);
    let (p1, rest) = rest.split_at_mut(plane);
    let (p2, p3) = rest.split_at_mut(plane);
    [p0, p1, p2, p3].map(|p| &mut p[at..][..len])
}

/// Every tile row of every channel through `row` (its four image rows, zeros outside the
/// image; the tile row's first tile of plane 0, and the planes' pitch).
#[inline(always)]
fn transform_input_loops(
    s: &ConvShape,
    x: Planes<'_>,
    images: usize,
    v: &mut [f32],
    mut row_of: impl FnMut([&[f32]; 4], &mut [f32], usize),
) {
    let (h, w) = (s.in_h, s.in_w);
    let (th, tw) = tiles(s);
    let (ci, tiles) = (s.in_channels, images * th * tw);
    let v_pitch = pitch(ci, tiles);
    let zeros = vec![0.0f32; w];
    for j in 0..images {
        for c in 0..ci {
            let plane = &x.data[j * x.image + c * x.channel..][..h * w];
            let row = |r: usize| -> &[f32] {
                // Padded row r is input row r - 1.
                if (1..=h).contains(&r) {
                    &plane[(r - 1) * w..][..w]
                } else {
                    &zeros
                }
            };
            for ty in 0..th {
                let rows = [row(2 * ty), row(2 * ty + 1), row(2 * ty + 2), row(2 * ty + 3)];
                let first = (j * th + ty) * tw;
                row_of(rows, &mut v[c * tiles + first..], v_pitch);
            }
        }
    }
}

/// `Y = Aᵀ M A` of every tile, plus the bias, then `max(Y, 0)` when `relu`, into `out` (NCHW,
/// the 2x2 outputs that fall inside the image): every element of `out` is written.
///
/// # Panics
/// If `out` is not `images` output images.
#[inline(never)]
fn transform_output(
    s: &ConvShape,
    m: &[f32],
    images: usize,
    bias: Option<&[f32]>,
    relu: bool,
    out: &mut [MaybeUninit<f32>],
) {
    assert_eq!(out.len(), images * s.out_image(), "winograd: output length");
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = crate::cpu::simd::Avx512::detect() {
        #[target_feature(enable = "avx512f")]
        fn wide(
            cpu: crate::cpu::simd::Avx512,
            s: &ConvShape,
            m: &[f32],
            images: usize,
            bias: Option<&[f32]>,
            relu: bool,
            out: &mut [MaybeUninit<f32>],
        ) {
            output_planes(cpu, s, m, images, bias, relu, out)
        }
        // SAFETY: as in `transform_input`.
        return unsafe { wide(cpu, s, m, images, bias, relu, out) };
    }
    transform_output_loops(s, m, images, bias, relu, out)
}

/// [`transform_output`] by
/// [`Avx512::winograd_output_plane`](crate::cpu::simd::Avx512::winograd_output_plane), one
/// output plane at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn output_planes(
    cpu: crate::cpu::simd::Avx512,
    s: &ConvShape,
    m: &[f32],
    images: usize,
    bias: Option<&[f32]>,
    relu: bool,
    out: &mut [MaybeUninit<f32>],
) {
    let (th, tw) = tiles(s);
    let (co, tiles) = (s.out_channels, images * th * tw);
    let m_pitch = pitch(co, tiles);
    for (j, image) in out.chunks_exact_mut(s.out_image()).enumerate() {
        for (o, plane) in image.chunks_exact_mut(s.in_h * s.in_w).enumerate() {
            let b = bias.map_or(0.0, |b| b[o]);
            let m = &m[o * tiles + j * th * tw..];
            cpu.winograd_output_plane(m, m_pitch, [s.in_h, s.in_w], b, relu, plane);
        }
    }
}

/// `row[2k] = a[k]`, `row[2k + 1] = b[k]` for every index inside `row`.
fn interleave(row: &mut [MaybeUninit<f32>], a: &[f32], b: &[f32]) {
    let (pairs, last) = row.split_at_mut(row.len() / 2 * 2);
    for ((p, &a), &b) in pairs.chunks_exact_mut(2).zip(a).zip(b) {
        p[0].write(a);
        p[1].write(b);
    }
    if let Some(l) = last.first_mut() {
        l.write(a[pairs.len() / 2]);
    }
}

/// [`transform_output`] a tile row at a time, the operations of
/// [`Avx512::winograd_output_plane`](crate::cpu::simd::Avx512::winograd_output_plane) in the
/// same order.
fn transform_output_loops(
    s: &ConvShape,
    m: &[f32],
    images: usize,
    bias: Option<&[f32]>,
    relu: bool,
    out: &mut [MaybeUninit<f32>],
) {
    let (h, w) = (s.in_h, s.in_w);
    let (th, tw) = tiles(s);
    let (co, tiles) = (s.out_channels, images * th * tw);
    let m_pitch = pitch(co, tiles);
    // Aᵀ's rows: s0 = m0 + m1 + m2, s1 = m1 - m2 - m3 (down, then the same across).
    let mut rows = vec![0.0f32; 8 * tw];
    let mut y = vec![0.0f32; 4 * tw];
    for (j, image) in out.chunks_exact_mut(s.out_image()).enumerate() {
        for (o, dst) in image.chunks_exact_mut(h * w).enumerate() {
            let b = bias.map_or(0.0, |b| b[o]);
            for ty in 0..th {
                let first = (j * th + ty) * tw;
                let m = |xi: usize| &m[xi * m_pitch + o * tiles + first..][..tw];
                // rows[a * 4 + col] = (Aᵀ M)[a][col], each over the tile row's tiles.
                for col in 0..4 {
                    let (m0, m1, m2, m3) = (m(col), m(4 + col), m(8 + col), m(12 + col));
                    let (s0, s1) = rows.split_at_mut(4 * tw);
                    let s0 = &mut s0[col * tw..][..tw];
                    let s1 = &mut s1[col * tw..][..tw];
                    for k in 0..tw {
                        s0[k] = m0[k] + m1[k] + m2[k];
                        s1[k] = m1[k] - m2[k] - m3[k];
                    }
                }
                for a in 0..2 {
                    let r = &rows[a * 4 * tw..][..4 * tw];
                    let (c0, c1, c2, c3) = (&r[..tw], &r[tw..2 * tw], &r[2 * tw..3 * tw], &r[3 * tw..]);
                    let (y0, y1) = y[a * 2 * tw..][..2 * tw].split_at_mut(tw);
                    for k in 0..tw {
                        y0[k] = c0[k] + c1[k] + c2[k] + b;
                        y1[k] = c1[k] - c2[k] - c3[k] + b;
                    }
                }
                if relu {
                    relu_in_place(&mut y);
                }
                // Interleave into the (up to) two output rows.
                for a in 0..2 {
                    let oh = 2 * ty + a;
                    if oh >= h {
                        break;
                    }
                    let (y0, y1) = y[a * 2 * tw..][..2 * tw].split_at(tw);
                    interleave(&mut dst[oh * w..][..w], y0, y1);
                }
            }
        }
    }
}

/// Elements of the transformed weight gradient [`weight_grad`] sums into: 16 planes of
/// `in_channels x out_channels`.
pub(super) fn transformed_len(out_channels: usize, in_channels: usize) -> usize {
    XI * out_channels * in_channels
}

/// The weight gradient's sums in the transformed domain, `m[ξ][c][o]` (+)= `Σ_tiles
/// (A dy Aᵀ)[ξ][tile][o] (Bᵀ x B)[ξ][c][tile]` over `images` images, added onto `m` when
/// `accumulate`, else overwriting it; [`weights_from_transformed`] turns the sums into the
/// gradient, `Gᵀ m G`.
///
/// The forward's tile is `Y = Aᵀ [U ⊙ V] A` with `U = G g Gᵀ`, so a tile's contribution to the
/// kernel's gradient is `Gᵀ [(A dY Aᵀ) ⊙ V] G`: exactly the direct sum's (the forward being exact
/// for any kernel), with 16 multiply-adds per tile and channel pair instead of 36 (four outputs
/// of 9 taps). The output gradient is zero outside the image, the input zero in the padding.
/// `A dy Aᵀ` is stored tile-major with the output channels contiguous ([`transform_grad`]), so
/// that each GEMM reads its left operand column by column and only packs the transformed input;
/// with both operands along the tiles, the GEMM's packing gathered across 64+ rows and the
/// weight gradient measured slower than im2col's.
///
/// # Shapes
/// - `x`: the input planes of `s` (`in_channels` of `in_h x in_w`), `dy`: the output gradient's
///   (`out_channels` planes of the same size)
/// - `m`: [`transformed_len`]
pub(super) fn weight_grad(
    s: &ConvShape,
    x: Planes<'_>,
    dy: Planes<'_>,
    images: usize,
    m: &mut [f32],
    accumulate: bool,
) {
    let (th, tw) = tiles(s);
    let tiles = images * th * tw;
    let (ci, co, plane) = (s.in_channels, s.out_channels, s.in_h * s.in_w);
    assert_eq!(
        m.len(),
        transformed_len(co, ci),
        "winograd: weight gradient length"
    );
    if images > 0 {
        let last =
            |p: &Planes<'_>, channels: usize| (images - 1) * p.image + (channels - 1) * p.channel + plane;
        assert!(x.data.len() >= last(&x, ci), "winograd: input too short");
        assert!(
            dy.data.len() >= last(&dy, co),
            "winograd: output gradient too short"
        );
    }
    let (v_pitch, d_pitch) = (pitch(ci, tiles), pitch(co, tiles));
    with_scratch(0, XI * v_pitch, |v| {
        transform_input(s, x, images, v);
        with_scratch(1, XI * d_pitch, |d| {
            transform_grad(s, dy, images, d);
            for (m, (v, d)) in m
                .chunks_exact_mut(co * ci)
                .zip(v.chunks_exact(v_pitch).zip(d.chunks_exact(d_pitch)))
            {
                crate::cpu::gemm(crate::cpu::Gemm {
                    m: co,
                    n: ci,
                    k: tiles,
                    dst: m,
                    dst_rs: 1,
                    dst_cs: co,
                    accumulate,
                    lhs: &d[..co * tiles],
                    lhs_rs: 1,
                    lhs_cs: co,
                    rhs: &v[..ci * tiles],
                    rhs_rs: 1,
                    rhs_cs: tiles,
                })
            }
        })
    });
}

/// `dw[o][c][t]` = `(Gᵀ m G)` of the transformed sums `m[ξ][c][o]` ([`weight_grad`]), each
/// computed in f64 and rounded once. The output channels run innermost, so that the 16 planes
/// are each read in order (read per weight, they were 16 lines 4 * in * out bytes apart: a
/// tenth of a 64-channel layer's weight gradient).
pub(super) fn weights_from_transformed(out_channels: usize, in_channels: usize, m: &[f32], dw: &mut [f32]) {
    let plane = out_channels * in_channels;
    assert_eq!(m.len(), XI * plane, "winograd: transformed gradient length");
    assert_eq!(dw.len(), 9 * plane, "winograd: weight gradient length");
    for c in 0..in_channels {
        for o in 0..out_channels {
            let at = |xi: usize| f64::from(m[xi * plane + c * out_channels + o]);
            // mg = m G, [4, 3], with G's rows (1, 0, 0), (½, ½, ½), (½, -½, ½), (0, 0, 1).
            let mut mg = [[0.0f64; 3]; 4];
            for (i, mg) in mg.iter_mut().enumerate() {
                let [m0, m1, m2, m3] = [at(4 * i), at(4 * i + 1), at(4 * i + 2), at(4 * i + 3)];
                *mg = [
                    m0 + 0.5 * m1 + 0.5 * m2,
                    0.5 * m1 - 0.5 * m2,
                    0.5 * m1 + 0.5 * m2 + m3,
                ];
            }
            // Gᵀ mg, [3, 3].
            let dw = &mut dw[(o * in_channels + c) * 9..][..9];
            for l in 0..3 {
                let [a, b, c, d] = [mg[0][l], mg[1][l], mg[2][l], mg[3][l]];
                dw[l] = (a + 0.5 * b + 0.5 * c) as f32;
                dw[3 + l] = (0.5 * b - 0.5 * c) as f32;
                dw[6 + l] = (0.5 * b + 0.5 * c + d) as f32;
            }
        }
    }
}

/// `D = A dy Aᵀ` of every tile's 2x2 output gradient (zero outside the image), into
/// `d[ξ][tile][o]` (planes `ξ` [`pitch`] apart; tiles numbered as in [`transform_input`]): per
/// tile row, every channel's row of tiles into `rows[ξ][o][k]`, then each plane transposed.
#[inline(never)]
fn transform_grad(s: &ConvShape, dy: Planes<'_>, images: usize, d: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(cpu) = crate::cpu::simd::Avx512::detect() {
        #[target_feature(enable = "avx512f")]
        fn wide(cpu: crate::cpu::simd::Avx512, s: &ConvShape, dy: Planes<'_>, images: usize, d: &mut [f32]) {
            let to_pixels = |rows: &[f32], tw: usize, co: usize, d: &mut [f32]| {
                if co % 16 == 0 {
                    cpu.planes_to_pixels(rows, tw, co, d)
                } else {
                    crate::cpu::transpose(rows, co, tw, d)
                }
            };
            let row = |a: &[f32], b: Option<&[f32]>, out: &mut [f32], pitch: usize| {
                cpu.winograd_grad_row(a, b, out, pitch)
            };
            transform_grad_loops(s, dy, images, d, row, to_pixels)
        }
        // SAFETY: as in `transform_input`.
        return unsafe { wide(cpu, s, dy, images, d) };
    }
    transform_grad_loops(s, dy, images, d, grad_row, |rows, tw, co, d| {
        crate::cpu::transpose(rows, co, tw, d)
    })
}

/// [`Avx512::winograd_grad_row`](crate::cpu::simd::Avx512::winograd_grad_row)'s sums, the
/// same operations in the same order, one tile at a time (`0 - b` and `0 - o` as there, so
/// that a zero's sign is the same).
fn grad_row(a: &[f32], b: Option<&[f32]>, out: &mut [f32], pitch: usize) {
    let w = a.len();
    let col = |row: &[f32], c: usize| row.get(c).copied().unwrap_or(0.0);
    for k in 0..w.div_ceil(2) {
        let (ae, ao) = (col(a, 2 * k), col(a, 2 * k + 1));
        let (be, bo) = b.map_or((0.0, 0.0), |b| (col(b, 2 * k), col(b, 2 * k + 1)));
        let rows = [
            (ae, ao),
            (ae + be, ao + bo),
            (ae - be, ao - bo),
            (0.0 - be, 0.0 - bo),
        ];
        for (i, (e, o)) in rows.into_iter().enumerate() {
            for (c, v) in [e, e + o, e - o, 0.0 - o].into_iter().enumerate() {
                out[(4 * i + c) * pitch + k] = v;
            }
        }
    }
}

#[inline(always)]
fn transform_grad_loops(
    s: &ConvShape,
    dy: Planes<'_>,
    images: usize,
    d: &mut [f32],
    row: impl Fn(&[f32], Option<&[f32]>, &mut [f32], usize),
    to_pixels: impl Fn(&[f32], usize, usize, &mut [f32]),
) {
    let (h, w) = (s.in_h, s.in_w);
    let (th, tw) = tiles(s);
    let (co, tiles) = (s.out_channels, images * th * tw);
    let d_pitch = pitch(co, tiles);
    let mut rows = vec![0.0f32; XI * co * tw];
    for j in 0..images {
        for ty in 0..th {
            let first = (j * th + ty) * tw;
            for o in 0..co {
                let plane = &dy.data[j * dy.image + o * dy.channel..][..h * w];
                let a = &plane[2 * ty * w..][..w];
                let b = plane.get((2 * ty + 1) * w..(2 * ty + 2) * w);
                row(a, b, &mut rows[o * tw..], co * tw);
            }
            for (xi, rows) in rows.chunks_exact(co * tw).enumerate() {
                to_pixels(rows, tw, co, &mut d[xi * d_pitch + first * co..][..tw * co]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No two of the 16 transformed planes start in the same 4 KiB-periodic cache set, whatever
    /// the plane's size (ResNet-18's 64 channels x 512 tiles was 128 KiB a plane: all 16 in one).
    #[test]
    fn transformed_planes_do_not_alias() {
        for rows in [1, 3, 16, 64, 128, 256, 512] {
            for tiles in (1..=1100).chain([2048, 4096]) {
                let p = pitch(rows, tiles);
                let bytes = p * std::mem::size_of::<f32>();
                let sets: std::collections::HashSet<usize> = (0..XI).map(|xi| xi * bytes % 4096).collect();
                assert_eq!(sets.len(), XI, "{rows} x {tiles}");
                assert!(p >= rows * tiles && p < rows * tiles + 32, "{rows} x {tiles}");
            }
        }
    }

    /// `rows` rows of `w` values in one buffer, each between NaNs, so that a kernel reading a
    /// column outside a row reads a NaN: row 0 zeros, the others test values with zeros among
    /// them.
    fn fenced_rows(w: usize, rows: usize) -> Vec<f32> {
        let mut buf = vec![f32::NAN; rows * (w + 1) + 1];
        for r in 0..rows {
            for i in 0..w {
                buf[r * (w + 1) + 1 + i] = match (r, (i + r) % 7) {
                    (0, _) | (_, 3) => 0.0,
                    _ => ((i * 7919 + r * 31) % 1013) as f32 / 97.0 - 5.0,
                };
            }
        }
        buf
    }

    /// Row `r` of [`fenced_rows`].
    fn fenced(buf: &[f32], w: usize, r: usize) -> &[f32] {
        &buf[r * (w + 1) + 1..][..w]
    }

    /// A row of `tw` tiles' 16 planes written by the portable kernel and by the AVX-512 one into
    /// NaN-filled planes with room to spare: the same bits, and nothing written past the tiles.
    fn same_tile_rows(
        tw: usize,
        what: &str,
        portable: impl FnOnce(&mut [f32], usize),
        avx512: impl FnOnce(&mut [f32], usize),
    ) {
        let pitch = tw + 3;
        let (mut want, mut got) = (vec![f32::NAN; 16 * pitch], vec![f32::NAN; 16 * pitch]);
        portable(&mut want, pitch);
        avx512(&mut got, pitch);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{what}");
        assert!(
            got.chunks(pitch).all(|p| p[tw..].iter().all(|v| v.is_nan())),
            "{what}: written past the tiles"
        );
    }

    /// The AVX-512 input tile row is the portable one bit for bit, for rows of 1 to 70 columns
    /// (odd ones end in a half tile; past one and two vectors), zero rows among them, and writes
    /// nothing outside its 16 planes' tiles.
    #[test]
    fn avx512_input_row_is_the_portable_one() {
        let Some(cpu) = crate::cpu::simd::Avx512::detect() else {
            return;
        };
        for w in 1..=70usize {
            let tw = w.div_ceil(2);
            // Rows 1-4 of test values, row 0 zeros.
            let buf = fenced_rows(w, 5);
            let row = |r: usize| fenced(&buf, w, r);
            for rows in [
                [row(1), row(2), row(3), row(4)],
                [row(0), row(2), row(3), row(0)],
                [row(4), row(1), row(0), row(0)],
            ] {
                same_tile_rows(
                    tw,
                    &format!("{w} columns"),
                    |out, pitch| input_row(rows, out, pitch, &mut Vec::new()),
                    |out, pitch| cpu.winograd_input_row(rows, out, pitch),
                );
            }
        }
    }

    /// The AVX-512 output-gradient tile row is the portable one bit for bit (zeros' signs
    /// included), for rows of 1 to 70 columns (odd ones end in a half tile), with and without a
    /// second row, and writes nothing outside its 16 planes' tiles.
    #[test]
    fn avx512_grad_row_is_the_portable_one() {
        let Some(cpu) = crate::cpu::simd::Avx512::detect() else {
            return;
        };
        for w in 1..=70usize {
            let tw = w.div_ceil(2);
            let buf = fenced_rows(w, 3);
            let a = fenced(&buf, w, 1);
            for b in [Some(fenced(&buf, w, 2)), None] {
                same_tile_rows(
                    tw,
                    &format!("{w} columns, second row {}", b.is_some()),
                    |out, pitch| grad_row(a, b, out, pitch),
                    |out, pitch| cpu.winograd_grad_row(a, b, out, pitch),
                );
            }
        }
    }

    /// The AVX-512 output transform is the portable one bit for bit, for planes of 1 to 20
    /// rows and columns (odd ones end in half tiles; tile rows of 1 to 10 tiles, so that a
    /// vector of 16 tiles spans up to 16 of them) and a few wider ones, with and without bias
    /// and ReLU (NaN and negative sums among the values), and writes every output and nothing
    /// past them.
    #[test]
    fn avx512_output_transform_is_the_portable_one() {
        let Some(cpu) = crate::cpu::simd::Avx512::detect() else {
            return;
        };
        let sizes = (1..=20usize).flat_map(|h| (1..=20usize).map(move |w| (h, w)));
        for (h, w) in sizes.chain([(32, 32), (33, 31), (16, 48), (2, 70)]) {
            let (images, co) = (2, 3);
            let s = padded_3x3(images, 1, co, h, w);
            let (th, tw) = tiles(&s);
            let mut m = ramp(XI * pitch(co, images * th * tw), h * 31 + w);
            m[5] = f32::NAN;
            let bias = [0.5f32, -0.25, 0.0];
            for (bias, relu) in [(None, false), (Some(&bias[..]), true), (Some(&bias[..]), false)] {
                let n = images * s.out_image();
                let unset = f32::from_bits(0x7fc0_1234);
                let (mut want, mut got) = (vec![unset; n + 17], vec![unset; n + 17]);
                let uninit = |v: &mut Vec<f32>| -> Vec<MaybeUninit<f32>> {
                    v.iter().map(|&x| MaybeUninit::new(x)).collect()
                };
                let (mut w_out, mut g_out) = (uninit(&mut want), uninit(&mut got));
                transform_output_loops(&s, &m, images, bias, relu, &mut w_out[..n]);
                output_planes(cpu, &s, &m, images, bias, relu, &mut g_out[..n]);
                // SAFETY: every element was initialised by `uninit`, and written values only
                // since.
                let bits = |v: &[MaybeUninit<f32>]| -> Vec<u32> {
                    v.iter().map(|x| unsafe { x.assume_init() }.to_bits()).collect()
                };
                let what = format!("{h}x{w}, bias {}, relu {relu}", bias.is_some());
                assert_eq!(bits(&g_out), bits(&w_out), "{what}");
                assert!(
                    bits(&g_out[..n]).iter().all(|&b| b != unset.to_bits()),
                    "{what}: an output left unwritten"
                );
                assert!(
                    bits(&g_out[n..]).iter().all(|&b| b == unset.to_bits()),
                    "{what}: written past the output"
                );
            }
        }
    }

    /// `n` values in [-1, 1] that differ with `seed`.
    fn ramp(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// A 3x3 convolution with stride 1 and one pixel of zero padding.
    fn padded_3x3(
        batch: usize,
        in_channels: usize,
        out_channels: usize,
        in_h: usize,
        in_w: usize,
    ) -> ConvShape {
        ConvShape {
            batch,
            in_channels,
            in_h,
            in_w,
            out_channels,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            mode: PadMode::Zeros,
        }
    }

    /// The direct 3x3 sum in f64 (zero padding of one pixel), and per output the sum of the
    /// terms' magnitudes (the scale that f32 rounding errors are measured against).
    fn direct(s: &ConvShape, x: &[f32], g: &[f32], bias: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (h, w, ci, co) = (s.in_h, s.in_w, s.in_channels, s.out_channels);
        let (mut y, mut scale) = (vec![0.0; s.batch * co * h * w], vec![0.0; s.batch * co * h * w]);
        for j in 0..s.batch {
            for o in 0..co {
                for r in 0..h {
                    for q in 0..w {
                        let at = ((j * co + o) * h + r) * w + q;
                        let (mut sum, mut abs) = (f64::from(bias[o]), f64::from(bias[o]).abs());
                        for c in 0..ci {
                            for t in 0..9 {
                                let (rr, qq) = ((r + t / 3).wrapping_sub(1), (q + t % 3).wrapping_sub(1));
                                if rr < h && qq < w {
                                    let term = f64::from(x[((j * ci + c) * h + rr) * w + qq])
                                        * f64::from(g[(o * ci + c) * 9 + t]);
                                    sum += term;
                                    abs += term.abs();
                                }
                            }
                        }
                        y[at] = sum;
                        scale[at] = abs;
                    }
                }
            }
        }
        (y, scale)
    }

    /// `convolve` itself, whatever `applies` picks: 1x1 and 2x2 images (every tile mostly
    /// padding), odd and even heights and widths (the last tile row or column half outside the
    /// image), channel counts off the GEMM's 48-row and 16-column blocks, several images per call
    /// (tiles of different images side by side), with and without bias and ReLU, and the input
    /// read through strides that are not NCHW's (as the backward passes it).
    #[test]
    fn convolve_matches_the_direct_sum() {
        for (case, &(images, ci, co, h, w, relu)) in [
            (1, 1, 1, 1, 1, false),
            (2, 3, 5, 2, 2, true),
            (3, 17, 49, 1, 5, false),
            (2, 50, 20, 5, 4, true),
            (4, 16, 16, 6, 7, false),
            (1, 64, 65, 9, 9, true),
            (5, 8, 3, 11, 2, false),
            (3, 33, 64, 8, 8, false),
        ]
        .iter()
        .enumerate()
        {
            let s = padded_3x3(images, ci, co, h, w);
            let x = ramp(images * ci * h * w, case);
            let g = ramp(co * ci * 9, case + 100);
            let bias = ramp(co, case + 200);
            let (want, scale) = direct(&s, &x, &g, &bias);
            let u = transform_weights(co, ci, |o, c, t| g[(o * ci + c) * 9 + t]);
            // The same images channel-major (`image = plane`, `channel = images * plane`).
            let plane = h * w;
            let mut x_t = vec![0.0f32; x.len()];
            for j in 0..images {
                for c in 0..ci {
                    x_t[(c * images + j) * plane..][..plane]
                        .copy_from_slice(&x[(j * ci + c) * plane..][..plane]);
                }
            }
            let layouts = [
                Planes {
                    data: &x,
                    image: ci * plane,
                    channel: plane,
                },
                Planes {
                    data: &x_t,
                    image: plane,
                    channel: images * plane,
                },
            ];
            for planes in layouts {
                let mut got = vec![f32::NAN; want.len()];
                convolve(
                    &s,
                    &u,
                    planes,
                    images,
                    Some(&bias),
                    relu,
                    got.as_mut_slice().into(),
                );
                for (i, (&got, (&want, &scale))) in got.iter().zip(want.iter().zip(&scale)).enumerate() {
                    let want = if relu { want.max(0.0) } else { want };
                    let err = (f64::from(got) - want).abs() / scale.max(1e-30);
                    assert!(
                        err <= 1e-5,
                        "case {case} ({images}x{ci}x{h}x{w} -> {co}, relu {relu}), output {i}: \
                         {got} against {want}, error {err:e} of the terms' magnitudes"
                    );
                }
            }
        }
    }

    /// The weight gradient by [`weight_grad`] and [`weights_from_transformed`] against the direct
    /// sum `dw[o][c][t] = Σ dy[o][p] x[c][p + t]` in f64, relative to the terms' magnitudes: odd
    /// and even sizes (half-outside tiles, whose output gradient must count as zero), 1x1 and 2x2
    /// images, channel counts off the GEMM's blocks, the images in calls of different sizes added
    /// up (`accumulate`), and the output gradient side by side as the backward passes it.
    #[test]
    fn weight_grad_matches_the_direct_sum() {
        for (case, &(images, ci, co, h, w)) in [
            (1, 1, 1, 1, 1),
            (2, 3, 5, 2, 2),
            (3, 17, 49, 1, 5),
            (2, 50, 20, 5, 4),
            (4, 16, 16, 6, 7),
            (1, 64, 65, 9, 9),
            (5, 8, 3, 11, 2),
            (3, 33, 64, 8, 8),
        ]
        .iter()
        .enumerate()
        {
            let s = padded_3x3(images, ci, co, h, w);
            let plane = h * w;
            let x = ramp(images * ci * plane, case);
            let dy = ramp(images * co * plane, case + 100);
            let (mut want, mut scale) = (vec![0.0f64; co * ci * 9], vec![0.0f64; co * ci * 9]);
            for j in 0..images {
                for o in 0..co {
                    for c in 0..ci {
                        for t in 0..9 {
                            for r in 0..h {
                                for q in 0..w {
                                    let (rr, qq) = ((r + t / 3).wrapping_sub(1), (q + t % 3).wrapping_sub(1));
                                    if rr < h && qq < w {
                                        let term = f64::from(dy[((j * co + o) * h + r) * w + q])
                                            * f64::from(x[((j * ci + c) * h + rr) * w + qq]);
                                        want[(o * ci + c) * 9 + t] += term;
                                        scale[(o * ci + c) * 9 + t] += term.abs();
                                    }
                                }
                            }
                        }
                    }
                }
            }
            // The output gradient side by side (`image = plane`, `channel = images * plane`).
            let mut dy_t = vec![0.0f32; dy.len()];
            for j in 0..images {
                for o in 0..co {
                    dy_t[(o * images + j) * plane..][..plane]
                        .copy_from_slice(&dy[(j * co + o) * plane..][..plane]);
                }
            }
            // All images in one call, and the first image alone then the rest added on.
            for split in [images, 1] {
                let mut m = vec![f32::NAN; transformed_len(co, ci)];
                let mut done = 0;
                for n in [split, images - split] {
                    if n == 0 {
                        continue;
                    }
                    let xs = Planes {
                        data: &x[done * ci * plane..],
                        image: ci * plane,
                        channel: plane,
                    };
                    let part = ConvShape { batch: n, ..s };
                    let mut side = vec![0.0f32; n * co * plane];
                    for o in 0..co {
                        side[o * n * plane..][..n * plane]
                            .copy_from_slice(&dy_t[(o * images + done) * plane..][..n * plane]);
                    }
                    let dys = Planes {
                        data: &side,
                        image: plane,
                        channel: n * plane,
                    };
                    weight_grad(&part, xs, dys, n, &mut m, done > 0);
                    done += n;
                }
                let mut got = vec![f32::NAN; want.len()];
                weights_from_transformed(co, ci, &m, &mut got);
                for (i, (&got, (&want, &scale))) in got.iter().zip(want.iter().zip(&scale)).enumerate() {
                    let err = (f64::from(got) - want).abs() / scale.max(1e-30);
                    assert!(
                        err <= 1e-5,
                        "case {case} ({images}x{ci}x{h}x{w} -> {co}, first call {split} images), \
                         weight {i}: {got} against {want}, error {err:e} of the terms' magnitudes"
                    );
                }
            }
        }
    }
}
