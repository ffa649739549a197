//! The kernels themselves, on plain contiguous `f32` slices: no burn types, so each can be
//! tested and benchmarked alone.

use rayon::prelude::*;

pub mod batch_norm;
pub mod conv;
pub mod dropout;
pub mod linear;
pub mod optim;
pub mod peak;
pub mod pool;
mod simd;

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
    let mut v = Vec::with_capacity(len);
    v.spare_capacity_mut()[..len]
        .par_chunks_mut(block)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(T::default())));
    // SAFETY: the capacity is at least `len` and the loop above wrote each of the first `len`.
    unsafe { v.set_len(len) };
    v
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

/// The last element `rows x cols` addressed with strides `rs`, `cs` touches, plus one.
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

pub(crate) fn gemm(g: Gemm<'_>) {
    assert!(
        extent(g.m, g.n, g.dst_rs, g.dst_cs) <= g.dst.len(),
        "gemm: dst too short"
    );
    assert!(
        extent(g.m, g.k, g.lhs_rs, g.lhs_cs) <= g.lhs.len(),
        "gemm: lhs too short"
    );
    assert!(
        extent(g.k, g.n, g.rhs_rs, g.rhs_cs) <= g.rhs.len(),
        "gemm: rhs too short"
    );
    if g.m == 0 || g.n == 0 {
        return;
    }
    // SAFETY: the asserts above keep every address the strides reach inside its slice, and
    // `dst` is a unique borrow that aliases neither operand.
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
        *m = if y <= 0.0 { 0.0 } else { d };
    }
}

pub(crate) mod scratch {
    use std::cell::RefCell;

    thread_local! {
        static SLOTS: [RefCell<Vec<f32>>; 4] = const { [const { RefCell::new(Vec::new()) }; 4] };
    }

    /// Runs `f` on this thread's scratch buffer `slot` (0 to 3) of at least `len` elements,
    /// kept between calls so that steady-state steps allocate nothing. Its contents are
    /// whatever the last user left.
    pub fn with_scratch<R>(slot: usize, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        SLOTS.with(|slots| {
            let mut buf = slots[slot].borrow_mut();
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            f(&mut buf[..len])
        })
    }
}
