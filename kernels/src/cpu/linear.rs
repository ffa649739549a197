//! Fully connected layer `y = x . w + b` on contiguous row-major `f32` buffers, in burn's `Linear`
//! layout (`w` is `[inputs, outputs]`), and its gradients.
//!
//! Each product is cut into at most `BLOCKS` independent single-threaded GEMMs whose bounds
//! depend only on the shapes, each writing its own part of the result, so the results are
//! bit-identical for any thread count. The GEMMs read `w` where it lies (gemm
//! packs what it must); only the input gradient of wide layers transposes each weight block
//! first (see `TRANSPOSE_FROM`).

use rayon::prelude::*;

use super::scratch::with_scratch;
use super::{gemm, relu_in_place, relu_mask, transpose, Gemm};

/// Blocks per product: enough for any core count this targets, few enough that each GEMM stays
/// large.
const BLOCKS: usize = 16;

/// From this many outputs on, the input gradient transposes each weight block before its GEMM:
/// gemm would pack `w[block, :]^T` by gathering down its columns, one row of `w` (4 KiB and
/// more) per element, which measured ~1.6x slower for flashlight's 3136x1024 fc1; for net's
/// 9216x128 (512-byte rows) gemm's own packing measured faster than the transpose.
const TRANSPOSE_FROM: usize = 512;

/// The shapes of one fully connected layer: input `[batch, inputs]`, weight `[inputs, outputs]`,
/// output `[batch, outputs]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinearShape {
    pub batch: usize,
    pub inputs: usize,
    pub outputs: usize,
}

impl LinearShape {
    pub fn is_valid(&self) -> bool {
        self.batch > 0 && self.inputs > 0 && self.outputs > 0
    }

    /// Multiply-accumulates of the forward pass.
    pub fn forward_macs(&self) -> usize {
        self.batch * self.inputs * self.outputs
    }
}

/// `[0, len)` in about `len / min` (at most `BLOCKS`, at least one) consecutive `(start, len)`
/// blocks of equal length, a multiple of `align`, except a shorter last one.
fn split(len: usize, align: usize, min: usize) -> Vec<(usize, usize)> {
    let count = (len / min.max(1)).clamp(1, BLOCKS);
    let size = len.div_ceil(count).next_multiple_of(align).max(align);
    (0..len)
        .step_by(size)
        .map(|start| (start, size.min(len - start)))
        .collect()
}

/// Fills `dst`, `[rows, cols]` row-major, by column blocks: `block(c0, cn, part)` computes
/// `dst[:, c0..c0 + cn]` into its own `[rows, cn]` buffer, the blocks in parallel, and each is
/// then copied into place (column ranges of `dst` are not disjoint slices).
fn by_column_blocks(
    dst: &mut [f32],
    cols: usize,
    blocks: &[(usize, usize)],
    block: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    let rows = dst.len() / cols;
    let parts: Vec<Vec<f32>> = blocks
        .par_iter()
        .map(|&(c0, cn)| {
            let mut part = vec![0.0f32; rows * cn];
            block(c0, cn, &mut part);
            part
        })
        .collect();
    for (part, &(c0, cn)) in parts.iter().zip(blocks) {
        for (dst, src) in dst.chunks_exact_mut(cols).zip(part.chunks_exact(cn)) {
            dst[c0..c0 + cn].copy_from_slice(src);
        }
    }
}

/// `y = x . w + b`, then `max(y, 0)` when `relu` (NaN stays NaN, as in burn's ReLU).
///
/// The outputs are split into column blocks, each a whole-depth GEMM: every weight element is
/// read once, by one thread, and no partial sums are added up afterwards. (Splitting the inner
/// dimension instead, with a partial product per block added in block order, measured 3.4-3.6
/// ms for flashlight's fc1 at batch 64 against 2.7-2.9 ms for this.)
///
/// # Shapes
/// - `x`: `[batch, inputs]`, `w`: `[inputs, outputs]`, `b`: `[outputs]`
/// - `y`: `[batch, outputs]`, overwritten
pub fn linear_forward(s: &LinearShape, x: &[f32], w: &[f32], b: Option<&[f32]>, relu: bool, y: &mut [f32]) {
    assert!(s.is_valid(), "linear: invalid shapes {s:?}");
    assert_eq!(x.len(), s.batch * s.inputs, "linear: input length");
    assert_eq!(w.len(), s.inputs * s.outputs, "linear: weight length");
    assert_eq!(y.len(), s.batch * s.outputs, "linear: output length");
    if let Some(b) = b {
        assert_eq!(b.len(), s.outputs, "linear: bias length");
    }
    let (n, k) = (s.outputs, s.inputs);
    // y[:, block]^T = w[:, block]^T . x^T: the weight block is gemm's left operand in the
    // column-major layout gemm packs from contiguous reads, x^T its narrow right operand.
    by_column_blocks(y, n, &split(n, 16, 64), |n0, nn, part| {
        gemm(Gemm {
            m: nn,
            n: s.batch,
            k,
            dst: part,
            dst_rs: 1,
            dst_cs: nn,
            accumulate: false,
            lhs: &w[n0..],
            lhs_rs: 1,
            lhs_cs: n,
            rhs: x,
            rhs_rs: 1,
            rhs_cs: k,
        })
    });
    if let Some(b) = b {
        for row in y.chunks_exact_mut(n) {
            for (v, &b) in row.iter_mut().zip(b) {
                *v += b;
            }
        }
    }
    if relu {
        relu_in_place(y);
    }
}

/// Gradients of [`linear_forward`] with respect to the input, the weight and the bias, each
/// computed only when its buffer is given (all are overwritten). `relu_out` is the forward's
/// output when it applied the ReLU: `dy` then passes only where that output is not `<= 0`.
///
/// # Shapes
/// - `x`: `[batch, inputs]`, `w`: `[inputs, outputs]`, `dy`, `relu_out`: `[batch, outputs]`
/// - `dx`: like `x`, `dw`: like `w`, `db`: `[outputs]`
#[allow(clippy::too_many_arguments)]
pub fn linear_backward(
    s: &LinearShape,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    relu_out: Option<&[f32]>,
    dx: Option<&mut [f32]>,
    dw: Option<&mut [f32]>,
    db: Option<&mut [f32]>,
) {
    assert!(s.is_valid(), "linear backward: invalid shapes {s:?}");
    assert_eq!(x.len(), s.batch * s.inputs, "linear backward: input length");
    assert_eq!(w.len(), s.inputs * s.outputs, "linear backward: weight length");
    assert_eq!(
        dy.len(),
        s.batch * s.outputs,
        "linear backward: output gradient length"
    );
    let (n, k) = (s.outputs, s.inputs);
    with_scratch(2, if relu_out.is_some() { dy.len() } else { 0 }, |masked| {
        let dy = match relu_out {
            Some(y) => {
                assert_eq!(y.len(), dy.len(), "linear backward: ReLU output length");
                relu_mask(dy, y, masked);
                &*masked
            }
            None => dy,
        };
        if let Some(db) = db {
            assert_eq!(db.len(), n, "linear backward: bias gradient length");
            let mut sum = vec![0.0f64; n];
            for row in dy.chunks_exact(n) {
                for (a, &v) in sum.iter_mut().zip(row) {
                    *a += v as f64;
                }
            }
            for (d, v) in db.iter_mut().zip(sum) {
                *d = v as f32;
            }
        }
        // Both products are cut along `inputs`: dx's columns, dw's rows.
        let blocks = split(k, 16, 64);
        if let Some(dx) = dx {
            assert_eq!(dx.len(), x.len(), "linear backward: input gradient length");
            // dx[:, block] = dy . w[block, :]^T.
            by_column_blocks(dx, k, &blocks, |k0, kn, part| {
                let product = |rhs: &[f32], rhs_rs, rhs_cs, part: &mut [f32]| {
                    gemm(Gemm {
                        m: s.batch,
                        n: kn,
                        k: n,
                        dst: part,
                        dst_rs: kn,
                        dst_cs: 1,
                        accumulate: false,
                        lhs: dy,
                        lhs_rs: n,
                        lhs_cs: 1,
                        rhs,
                        rhs_rs,
                        rhs_cs,
                    })
                };
                if n >= TRANSPOSE_FROM {
                    with_scratch(1, kn * n, |w_t| {
                        transpose(&w[k0 * n..(k0 + kn) * n], kn, n, w_t);
                        product(w_t, kn, 1, part);
                    });
                } else {
                    product(&w[k0 * n..], 1, n, part);
                }
            });
        }
        if let Some(dw) = dw {
            assert_eq!(dw.len(), w.len(), "linear backward: weight gradient length");
            // dw[block, :]^T = dy^T . x[:, block]: contiguous row ranges of dw, written as the
            // columns of a column-major result so that gemm's tiles store contiguous runs.
            dw.par_chunks_mut(blocks[0].1 * n)
                .zip(&blocks)
                .for_each(|(dst, &(k0, kn))| {
                    gemm(Gemm {
                        m: n,
                        n: kn,
                        k: s.batch,
                        dst,
                        dst_rs: 1,
                        dst_cs: n,
                        accumulate: false,
                        lhs: dy,
                        lhs_rs: 1,
                        lhs_cs: n,
                        rhs: &x[k0..],
                        rhs_rs: k,
                        rhs_cs: 1,
                    })
                });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bias of the wrong length was truncated by `zip`.
    #[test]
    #[should_panic(expected = "linear: bias length")]
    fn a_bias_of_the_wrong_length_is_refused() {
        let s = LinearShape {
            batch: 2,
            inputs: 3,
            outputs: 4,
        };
        linear_forward(&s, &[0.0; 6], &[0.0; 12], Some(&[1.0; 3]), false, &mut [0.0; 8]);
    }

    #[test]
    fn split_covers_the_range_in_aligned_blocks() {
        for len in [1, 15, 16, 100, 128, 3136, 9216] {
            for (align, min) in [(16, 64), (16, 128), (1, 1)] {
                let blocks = split(len, align, min);
                assert!(blocks.len() <= BLOCKS);
                let mut next = 0;
                for (i, &(start, n)) in blocks.iter().enumerate() {
                    assert_eq!(start, next);
                    assert!(n > 0);
                    if i + 1 < blocks.len() {
                        assert_eq!(n % align, 0, "len {len} align {align}");
                    }
                    next += n;
                }
                assert_eq!(next, len);
            }
        }
    }

    /// `y = relu(x . w + b)` and its gradients against the definition in f64, with a batch and
    /// sizes that leave partial blocks.
    #[test]
    fn matches_the_definition() {
        let s = LinearShape {
            batch: 3,
            inputs: 37,
            outputs: 5,
        };
        let val = |i: usize, m: usize| ((i * m) % 23) as f32 / 11.0 - 1.0;
        let x: Vec<f32> = (0..s.batch * s.inputs).map(|i| val(i, 7919)).collect();
        let w: Vec<f32> = (0..s.inputs * s.outputs).map(|i| val(i, 104729)).collect();
        let b: Vec<f32> = (0..s.outputs).map(|i| val(i, 31)).collect();
        let dy: Vec<f32> = (0..s.batch * s.outputs).map(|i| val(i, 17)).collect();
        let mut y = vec![f32::NAN; s.batch * s.outputs];
        linear_forward(&s, &x, &w, Some(&b), true, &mut y);
        let mut want = vec![0.0f64; y.len()];
        for r in 0..s.batch {
            for o in 0..s.outputs {
                let z = b[o] as f64
                    + (0..s.inputs)
                        .map(|i| x[r * s.inputs + i] as f64 * w[i * s.outputs + o] as f64)
                        .sum::<f64>();
                want[r * s.outputs + o] = z.max(0.0);
            }
        }
        for (g, w) in y.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-5, "{g} vs {w}");
        }
        let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; s.outputs]);
        linear_backward(
            &s,
            &x,
            &w,
            &dy,
            Some(&y),
            Some(&mut dx),
            Some(&mut dw),
            Some(&mut db),
        );
        let g: Vec<f64> = dy
            .iter()
            .zip(&want)
            .map(|(&d, &y)| if y > 0.0 { d as f64 } else { 0.0 })
            .collect();
        for r in 0..s.batch {
            for i in 0..s.inputs {
                let want: f64 = (0..s.outputs)
                    .map(|o| g[r * s.outputs + o] * w[i * s.outputs + o] as f64)
                    .sum();
                assert!((dx[r * s.inputs + i] as f64 - want).abs() < 1e-5);
            }
        }
        for i in 0..s.inputs {
            for o in 0..s.outputs {
                let want: f64 = (0..s.batch)
                    .map(|r| x[r * s.inputs + i] as f64 * g[r * s.outputs + o])
                    .sum();
                assert!((dw[i * s.outputs + o] as f64 - want).abs() < 1e-5);
            }
        }
        for o in 0..s.outputs {
            let want: f64 = (0..s.batch).map(|r| g[r * s.outputs + o]).sum();
            assert!((db[o] as f64 - want).abs() < 1e-5);
        }
    }
}
