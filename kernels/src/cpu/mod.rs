//! The kernels themselves, on plain contiguous `f32` slices: no burn types, so each can be
//! tested and benchmarked alone.

use rayon::prelude::*;

pub mod batch_norm;
pub mod conv;
pub mod dropout;
pub mod linear;
pub mod optim;
pub mod out;
pub mod peak;
pub mod pool;
mod simd;

pub use out::{fresh, Out};

/// A batch of images' values that a kernel reads: given whole, or produced a few images at a
/// time by the op that computes them (a backward's gradient, a convolution's output computed
/// again), so that the whole batch is never stored and each part is read while it is in cache.
#[derive(Clone, Copy)]
pub enum Images<'a> {
    Values(&'a [f32]),
    /// `produce(first, out)` writes the values of images `first..first + out.len() / image`
    /// into `out` (every element): the same values for the same images whatever the call's
    /// extent, on the calling thread.
    Produce(&'a (dyn Fn(usize, &mut [f32]) + Sync)),
}

impl Images<'_> {
    /// `f` on the values of `images` images from `first`, `image` elements each: a slice of
    /// the values, or this thread's scratch `slot` filled by the producer.
    pub(crate) fn with<R>(
        self,
        image: usize,
        first: usize,
        images: usize,
        slot: usize,
        f: impl FnOnce(&[f32]) -> R,
    ) -> R {
        match self {
            Images::Values(v) => f(&v[first * image..][..images * image]),
            Images::Produce(produce) => scratch::with_scratch(slot, images * image, |v| {
                produce(first, v);
                f(v)
            }),
        }
    }
}

/// The vector instructions the CPU kernels run here ([`simd::in_use`]).
pub(crate) fn simd_in_use() -> &'static str {
    simd::in_use()
}

/// Output length of a window of `kernel` moved by `stride` over `size` padded by `pad` on each
/// side (floor rounding), or `None` when the window does not fit or cannot move.
pub(crate) fn out_len(size: usize, kernel: usize, stride: usize, pad: usize) -> Option<usize> {
    let padded = size + 2 * pad;
    (kernel >= 1 && stride >= 1 && padded >= kernel).then(|| (padded - kernel) / stride + 1)
}

/// `len` zeros, written by the thread pool in fixed blocks rather than by `calloc` on the
/// calling thread. At these sizes glibc reuses freed heap memory and clears it with one
/// thread's `memset`, which flash64's profile put at ~3.7 ms of a 53 ms training step, with the
/// other thread idle. Small buffers are not worth a trip through the pool.
pub(crate) fn zeroed<T: Copy + Default + Send>(len: usize) -> Vec<T> {
    const BLOCK_BYTES: usize = 128 << 10;
    let block = (BLOCK_BYTES / std::mem::size_of::<T>().max(1)).max(1);
    if len < 2 * block {
        return vec![T::default(); len];
    }
    // rayon's indexed collect writes the pieces in place, in parallel, without zeroing first.
    rayon::iter::repeat_n(T::default(), len)
        .with_min_len(block)
        .collect()
}

/// The sum of `f(v)` over `row` in `f64`, in sixteen interleaved partial sums: the loop
/// vectorises (a single sum would wait on each addition's latency), and the order of the
/// additions depends only on the length (the last `len % 16` values, then the partial sums).
#[inline(always)]
pub(crate) fn lane_sum(row: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    const LANES: usize = 16;
    let mut acc = [0.0f64; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest: f64 = chunks.remainder().iter().map(|&v| f(f64::from(v))).sum();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f(f64::from(v));
        }
    }
    acc.iter().sum::<f64>() + rest
}

/// One single-threaded GEMM on row-major slices: `dst[m, n] (+)= lhs[m, k] . rhs[k, n]`, each
/// operand addressed through its row and column strides (a transpose is a swap of strides).
pub(crate) struct Gemm<'a> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dst: &'a mut [f32],
    pub dst_rs: usize,
    pub dst_cs: usize,
    /// Add onto `dst` instead of overwriting it.
    pub accumulate: bool,
    pub lhs: &'a [f32],
    pub lhs_rs: usize,
    pub lhs_cs: usize,
    pub rhs: &'a [f32],
    pub rhs_rs: usize,
    pub rhs_cs: usize,
}

/// The last element `rows x cols` addressed with strides `rs`, `cs` touches, plus one; `None`
/// when that overflows `usize` (no slice is that long).
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

pub(crate) fn gemm(g: Gemm<'_>) {
    assert!(
        extent(g.m, g.n, g.dst_rs, g.dst_cs).is_some_and(|e| e <= g.dst.len()),
        "gemm: dst too short"
    );
    assert!(
        extent(g.m, g.k, g.lhs_rs, g.lhs_cs).is_some_and(|e| e <= g.lhs.len()),
        "gemm: lhs too short"
    );
    assert!(
        extent(g.k, g.n, g.rhs_rs, g.rhs_cs).is_some_and(|e| e <= g.rhs.len()),
        "gemm: rhs too short"
    );
    let strides = [g.dst_rs, g.dst_cs, g.lhs_rs, g.lhs_cs, g.rhs_rs, g.rhs_cs];
    assert!(
        strides.iter().all(|&s| isize::try_from(s).is_ok()),
        "gemm: a stride past isize::MAX"
    );
    if g.m == 0 || g.n == 0 {
        return;
    }
    // SAFETY: the asserts above keep every address the strides reach inside its slice (the
    // extents are computed without overflow) and every stride representable as the `isize`
    // the call takes; `dst` is a unique borrow that aliases neither operand.
    unsafe {
        gemm::gemm(
            g.m,
            g.n,
            g.k,
            g.dst.as_mut_ptr(),
            g.dst_cs as isize,
            g.dst_rs as isize,
            g.accumulate,
            g.lhs.as_ptr(),
            g.lhs_cs as isize,
            g.lhs_rs as isize,
            g.rhs.as_ptr(),
            g.rhs_cs as isize,
            g.rhs_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            // The callers parallelise over images or planes: one thread per GEMM keeps each
            // image's arithmetic independent of the thread count and avoids nested rayon.
            gemm::Parallelism::None,
        )
    }
}

/// `dst[c, r] = src[r, c]` for a `rows x cols` row-major `src`: eight source rows at a time, so
/// each destination write is eight contiguous floats and the eight reads per column come from
/// lines already in cache. Eight, not sixteen: rows 4 KiB apart (flashlight's fc1 weight) fall
/// into one L1 set, and sixteen of them thrashed it (flash.fc1 backward 7.1 -> 5.7 ms).
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    const B: usize = 8;
    let (src, dst) = (&src[..rows * cols], &mut dst[..rows * cols]);
    let whole = rows / B * B;
    for r0 in (0..whole).step_by(B) {
        let block = &src[r0 * cols..(r0 + B) * cols];
        for c in 0..cols {
            let d = &mut dst[c * rows + r0..][..B];
            for (i, v) in d.iter_mut().enumerate() {
                *v = block[i * cols + c];
            }
        }
    }
    for r in whole..rows {
        for c in 0..cols {
            dst[c * rows + r] = src[r * cols + c];
        }
    }
}

/// `max(v, 0)` in place. `<=` keeps NaN, like burn's `mask_fill(x <= 0, 0)`; a select, so it
/// vectorises.
pub(crate) fn relu_in_place(values: &mut [f32]) {
    for v in values {
        *v = if *v <= 0.0 { 0.0 } else { *v };
    }
}

/// `masked = dy` where the ReLU's output `y` is not `<= 0`, else 0: burn's and PyTorch's ReLU
/// backward.
pub(crate) fn relu_mask(dy: &[f32], y: &[f32], masked: &mut [f32]) {
    assert!(
        dy.len() == y.len() && masked.len() == y.len(),
        "relu_mask: lengths"
    );
    for ((m, &d), &y) in masked.iter_mut().zip(dy).zip(y) {
        *m = relu_masked(d, y);
    }
}

/// One element of [`relu_mask`].
#[inline(always)]
fn relu_masked(dy: f32, y: f32) -> f32 {
    if y <= 0.0 {
        0.0
    } else {
        dy
    }
}

/// [`relu_mask`] into a new buffer, in parallel blocks.
pub(crate) fn par_relu_mask(dy: &[f32], y: &[f32]) -> Vec<f32> {
    const BLOCK: usize = 32 << 10;
    assert_eq!(dy.len(), y.len(), "relu_mask: lengths");
    fresh(y.len(), |out| {
        out.par_out_chunks(BLOCK)
            .zip(dy.par_chunks(BLOCK).zip(y.par_chunks(BLOCK)))
            .for_each(|(m, (dy, y))| {
                m.zip_map(dy, y, relu_masked);
            })
    })
}

pub(crate) mod scratch {
    use std::cell::RefCell;

    thread_local! {
        static SLOTS: [RefCell<Vec<f32>>; 5] = const { [const { RefCell::new(Vec::new()) }; 5] };
    }

    /// Runs `f` on this thread's scratch buffer `slot` (0 to 4) of at least `len` elements,
    /// kept between calls so that steady-state steps allocate nothing. Its contents are
    /// whatever the last user left.
    ///
    /// Re-entrant: `f` may run rayon work (`linear_backward` holds a slot across a `par_iter`),
    /// and a thread waiting in it can steal a job that asks for the same slot; that call gets
    /// a buffer of its own instead of a `BorrowMutError` panic.
    pub fn with_scratch<R>(slot: usize, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let mut f = Some(f);
        let kept = SLOTS.with(|slots| {
            let Ok(mut buf) = slots[slot].try_borrow_mut() else {
                return None;
            };
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            Some((f.take().expect("not yet called"))(&mut buf[..len]))
        });
        match kept {
            Some(result) => result,
            None => (f.take().expect("not yet called"))(&mut vec![0.0; len]),
        }
    }

    #[cfg(test)]
    #[test]
    fn a_slot_in_use_on_this_thread_gives_a_buffer_of_its_own() {
        let out = with_scratch(2, 4, |outer| {
            outer.fill(1.0);
            let inner = with_scratch(2, 3, |inner| {
                inner.fill(2.0);
                inner.iter().sum::<f32>()
            });
            (outer.iter().sum::<f32>(), inner)
        });
        assert_eq!(out, (4.0, 6.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strides whose extent wraps around `usize` (in release builds, silently) are refused
    /// before the unsafe call: `2 * (usize::MAX / 2 + 1)` wrapped to 0 and passed the check.
    #[test]
    fn gemm_refuses_strides_whose_extent_overflows() {
        assert_eq!(extent(2, 3, 3, 1), Some(6));
        assert_eq!(extent(0, 3, usize::MAX, 1), Some(0));
        assert_eq!(extent(3, 1, usize::MAX / 2 + 1, 1), None);
        let huge = usize::MAX / 2 + 1;
        let wrapped = std::panic::catch_unwind(|| {
            let mut dst = [0f32; 4];
            gemm(Gemm {
                m: 3,
                n: 1,
                k: 1,
                dst: &mut dst,
                dst_rs: huge,
                dst_cs: 1,
                accumulate: false,
                lhs: &[1.0; 3],
                lhs_rs: 1,
                lhs_cs: 1,
                rhs: &[1.0],
                rhs_rs: 1,
                rhs_cs: 1,
            })
        });
        let message = wrapped.unwrap_err();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"gemm: dst too short"));
    }
}
