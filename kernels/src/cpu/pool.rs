//! 2-D max pooling on contiguous NCHW `f32` buffers, with the argmax that its backward needs.
//!
//! Ties and NaNs follow PyTorch's CPU kernel: a window's scan starts at its first in-image
//! element and moves to a later one only when that one is greater or NaN, so the first of equal
//! maxima wins and a NaN propagates. Padding never wins (it is `-inf`).

use rayon::prelude::*;

use super::{out_len, Out};

/// Input `[batch, channels, in_h, in_w]`, output `[batch, channels, out_h, out_w]`; dilation 1,
/// floor rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolShape {
    pub batch: usize,
    pub channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl PoolShape {
    /// Non-empty, a padded input the window fits, padding at most half the window (PyTorch's
    /// rule, so that every window holds an image element), and a stride.
    pub fn is_valid(&self) -> bool {
        let ok = |size, i: usize| {
            2 * self.padding[i] <= self.kernel[i]
                && out_len(size, self.kernel[i], self.stride[i], self.padding[i]).is_some()
        };
        self.batch * self.channels > 0
            && self.in_h > 0
            && self.in_w > 0
            && ok(self.in_h, 0)
            && ok(self.in_w, 1)
    }

    pub fn out_h(&self) -> usize {
        out_len(self.in_h, self.kernel[0], self.stride[0], self.padding[0]).expect("valid pool shape")
    }

    pub fn out_w(&self) -> usize {
        out_len(self.in_w, self.kernel[1], self.stride[1], self.padding[1]).expect("valid pool shape")
    }

    pub fn in_plane(&self) -> usize {
        self.in_h * self.in_w
    }

    pub fn out_plane(&self) -> usize {
        self.out_h() * self.out_w()
    }

    pub fn planes(&self) -> usize {
        self.batch * self.channels
    }
}

/// The in-image range `[start, end)` of the window at output `o`.
fn window(o: usize, stride: usize, pad: usize, kernel: usize, size: usize) -> (usize, usize) {
    let start = (o * stride) as isize - pad as isize;
    let end = (start + kernel as isize).min(size as isize);
    (start.max(0) as usize, end as usize)
}

/// `out` = the window maxima, `argmax` = the index of each maximum within its input plane.
pub fn max_pool2d_forward<'o>(
    s: &PoolShape,
    x: &[f32],
    out: impl Into<Out<'o>>,
    argmax: impl Into<Out<'o, u32>>,
) {
    let (out, argmax) = (out.into(), argmax.into());
    assert!(s.is_valid(), "max_pool2d: invalid shapes {s:?}");
    assert_eq!(x.len(), s.planes() * s.in_plane(), "max_pool2d: input length");
    assert_eq!(out.len(), s.planes() * s.out_plane(), "max_pool2d: output length");
    assert_eq!(argmax.len(), out.len(), "max_pool2d: argmax length");
    assert!(
        s.in_plane() <= u32::MAX as usize,
        "max_pool2d: plane too large for u32 indices"
    );
    let (oh_n, ow_n) = (s.out_h(), s.out_w());
    x.par_chunks(s.in_plane())
        .zip(out.par_chunks_mut(s.out_plane()))
        .zip(argmax.par_chunks_mut(s.out_plane()))
        .for_each(|((x, out), argmax)| {
            if s.kernel == [2, 2] && s.stride == [2, 2] && s.padding == [0, 0] {
                return pool_2x2(s.in_w, x, out, argmax, ow_n);
            }
            for oh in 0..oh_n {
                let (h0, h1) = window(oh, s.stride[0], s.padding[0], s.kernel[0], s.in_h);
                for ow in 0..ow_n {
                    let (w0, w1) = window(ow, s.stride[1], s.padding[1], s.kernel[1], s.in_w);
                    let mut best_i = h0 * s.in_w + w0;
                    let mut best = x[best_i];
                    for h in h0..h1 {
                        for (w, &v) in x[h * s.in_w + w0..h * s.in_w + w1].iter().enumerate() {
                            if v > best || v.is_nan() {
                                best = v;
                                best_i = h * s.in_w + w0 + w;
                            }
                        }
                    }
                    out[oh * ow_n + ow] = best;
                    argmax[oh * ow_n + ow] = best_i as u32;
                }
            }
        });
}

/// Moves the running maximum to `(v, i)` when `v` is greater or NaN (PyTorch's rule), without
/// a branch: on real-valued activations the comparison is a coin toss, and a mispredicted
/// branch per element made this loop the slowest of a TchNet step.
#[inline(always)]
fn pick((best, at): (f32, u32), (v, i): (f32, u32)) -> (f32, u32) {
    #[allow(clippy::eq_op)]
    let take = (v > best) | (v != v);
    (if take { v } else { best }, if take { i } else { at })
}

/// The seed models' 2x2 stride-2 pooling of one plane, with the general scan's order and rule.
pub(crate) fn pool_2x2(in_w: usize, x: &[f32], out: &mut [f32], argmax: &mut [u32], ow_n: usize) {
    for (oh, (out, argmax)) in out
        .chunks_exact_mut(ow_n)
        .zip(argmax.chunks_exact_mut(ow_n))
        .enumerate()
    {
        let top = &x[2 * oh * in_w..][..in_w];
        let bottom = &x[(2 * oh + 1) * in_w..][..in_w];
        let (base, w) = ((2 * oh * in_w) as u32, in_w as u32);
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = super::simd::Avx512::detect() {
            cpu.pool_2x2_row(top, bottom, base, w, out, argmax);
            continue;
        }
        pool_2x2_row(top, bottom, base, w, out, argmax);
    }
}

/// One output row of [`pool_2x2`]: windows at columns `2j, 2j + 1` of `top` and `bottom`;
/// `base` is `top`'s offset in its plane.
fn pool_2x2_row(top: &[f32], bottom: &[f32], base: u32, w: u32, out: &mut [f32], argmax: &mut [u32]) {
    for (ow, (o, a)) in out.iter_mut().zip(argmax.iter_mut()).enumerate() {
        let (c, ci) = (2 * ow, 2 * ow as u32);
        let m = pick((top[c], ci), (top[c + 1], ci + 1));
        let m = pick(m, (bottom[c], w + ci));
        let (best, at) = pick(m, (bottom[c + 1], w + ci + 1));
        *o = best;
        *a = base + at;
    }
}

/// `dx` (overwritten) = `dy` routed back to each window's maximum; overlapping windows add up.
pub fn max_pool2d_backward<'o>(s: &PoolShape, dy: &[f32], argmax: &[u32], dx: impl Into<Out<'o>>) {
    let dx = dx.into();
    assert_eq!(
        dy.len(),
        s.planes() * s.out_plane(),
        "max_pool2d backward: output gradient length"
    );
    assert_eq!(argmax.len(), dy.len(), "max_pool2d backward: argmax length");
    assert_eq!(
        dx.len(),
        s.planes() * s.in_plane(),
        "max_pool2d backward: input gradient length"
    );
    dx.par_chunks_mut(s.in_plane())
        .zip(dy.par_chunks(s.out_plane()))
        .zip(argmax.par_chunks(s.out_plane()))
        .for_each(|((dx, dy), argmax)| {
            // `dx` comes zeroed.
            for (&g, &i) in dy.iter().zip(argmax) {
                dx[i as usize] += g;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 row and the portable row agree bit for bit, on ties, NaNs, infinities and
    /// signed zeros, for every row length up to two vector widths and odd input widths.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn wide_2x2_row_matches_the_portable_one() {
        let Some(cpu) = super::super::simd::Avx512::detect() else {
            eprintln!("skipped: this CPU has no AVX-512F (or EMBER_SIMD=portable)");
            return;
        };
        let special = [
            0.0,
            -0.0,
            1.0,
            1.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -3.5,
        ];
        let mut state = 0x2545_f491_u32;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        for n in 1..=40 {
            for extra in [0, 1] {
                let in_w = 2 * n + extra;
                let row = |next: &mut dyn FnMut() -> u32| -> Vec<f32> {
                    (0..in_w).map(|_| special[(next() % 8) as usize]).collect()
                };
                let (top, bottom) = (row(&mut next), row(&mut next));
                let (mut o1, mut a1) = (vec![0.0; n], vec![0u32; n]);
                let (mut o2, mut a2) = (vec![0.0; n], vec![0u32; n]);
                pool_2x2_row(&top, &bottom, 7 * in_w as u32, in_w as u32, &mut o1, &mut a1);
                cpu.pool_2x2_row(&top, &bottom, 7 * in_w as u32, in_w as u32, &mut o2, &mut a2);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&o1), bits(&o2), "values, in_w {in_w}");
                assert_eq!(a1, a2, "argmax, in_w {in_w}");
            }
        }
    }

    #[test]
    fn first_of_equal_maxima_wins_and_nan_propagates() {
        // torch.nn.functional.max_pool2d(torch.tensor([[[[1., 3., 3., 0.], [3., 2., nan, 5.]]]]),
        //     2, return_indices=True) -> values [[3., nan]], indices [[1, 6]]
        let s = PoolShape {
            batch: 1,
            channels: 1,
            in_h: 2,
            in_w: 4,
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        };
        let x = [1.0, 3.0, 3.0, 0.0, 3.0, 2.0, f32::NAN, 5.0];
        let (mut out, mut idx) = ([0.0; 2], [0u32; 2]);
        max_pool2d_forward(&s, &x, &mut out, &mut idx);
        assert_eq!(out[0], 3.0);
        assert!(out[1].is_nan());
        assert_eq!(idx, [1, 6]);
    }

    #[test]
    fn padding_never_wins_and_overlaps_add_up_in_backward() {
        // max_pool2d(x, 3, stride=1, padding=1) on an all -1 row: windows overlap at each pixel.
        let s = PoolShape {
            batch: 1,
            channels: 1,
            in_h: 1,
            in_w: 3,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
        };
        let x = [-1.0, -2.0, -1.0];
        let (mut out, mut idx) = ([0.0; 3], [0u32; 3]);
        max_pool2d_forward(&s, &x, &mut out, &mut idx);
        assert_eq!(out, [-1.0, -1.0, -1.0]);
        assert_eq!(idx, [0, 0, 2]);
        let mut dx = [9.0; 3];
        max_pool2d_backward(&s, &[1.0, 10.0, 100.0], &idx, &mut dx);
        assert_eq!(dx, [11.0, 0.0, 100.0]);
    }
}
