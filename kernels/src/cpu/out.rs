//! Kernel outputs that are not zeroed ahead of the kernel.
//!
//! A kernel's output used to be allocated as zeros ([`super::zeroed`]) and then overwritten: one
//! pass over the whole buffer to write zeros to memory, and a second, the kernel's, to read the
//! lines back and write the values. In a ResNet-20 training step the zeroing alone was ~10.5% of
//! the profile (the threads' `repeat_n` collect), in its evaluation ~14%. An [`Out`] hands the kernel
//! its output in parallel chunks instead, each zeroed by the thread that receives it just before
//! it fills it, while the chunk is in that core's cache; a fresh buffer ([`fresh`]) is never
//! written before that. The kernel sees zeros exactly as before, so its results are the same bits.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

/// A kernel's output: an existing slice, or a fresh buffer from [`fresh`] whose values are
/// written first when a chunk of it is handed out.
///
/// Invariant: `values` is only ever written with initialised values (zeros, then whatever the
/// kernel stores through the `&mut [T]` chunks), so a slice that was initialised stays so, and an
/// element of a fresh buffer is initialised once its chunk has been handed out (counted in
/// `handed`).
pub struct Out<'a, T = f32> {
    values: &'a mut [MaybeUninit<T>],
    /// Elements handed out (zeroed) so far, for a fresh buffer.
    handed: Option<&'a AtomicUsize>,
}

impl<'a, T> From<&'a mut [T]> for Out<'a, T> {
    fn from(values: &'a mut [T]) -> Self {
        let len = values.len();
        // SAFETY: `MaybeUninit<T>` has `T`'s size and alignment, so the pointer and length
        // describe the same memory; the slice is initialised, and `Out` only writes initialised
        // values into it (its invariant), so it is still initialised when the borrow ends.
        let values = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), len) };
        Out { values, handed: None }
    }
}

impl<'a, T> From<&'a mut Vec<T>> for Out<'a, T> {
    fn from(values: &'a mut Vec<T>) -> Self {
        Out::from(values.as_mut_slice())
    }
}

impl<'a, T> From<OutChunk<'a, T>> for Out<'a, T> {
    /// The chunk as an output of its own: counted as its parts are handed out.
    fn from(chunk: OutChunk<'a, T>) -> Self {
        Out {
            values: chunk.values,
            handed: chunk.handed,
        }
    }
}

impl<'a, T> From<&'a mut [T]> for OutChunk<'a, T> {
    fn from(values: &'a mut [T]) -> Self {
        let Out { values, handed } = Out::from(values);
        OutChunk { values, handed }
    }
}

impl<'a, T, const N: usize> From<&'a mut [T; N]> for Out<'a, T> {
    fn from(values: &'a mut [T; N]) -> Self {
        Out::from(values.as_mut_slice())
    }
}

/// `chunk` zeroed (as `T::default()`), then as initialised values.
fn zeroed_chunk<T: Copy + Default>(chunk: &mut [MaybeUninit<T>]) -> &mut [T] {
    chunk.fill(MaybeUninit::new(T::default()));
    // SAFETY: every element was just written.
    unsafe { assume_written(chunk) }
}

impl<'a, T: Copy + Default + Send + Sync> Out<'a, T> {
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Where the output starts (for prefetch hints, never read through).
    pub fn as_ptr(&self) -> *const T {
        self.values.as_ptr().cast()
    }

    /// The output in parallel chunks of `n` elements (the last may be shorter), each zeroed by
    /// the thread that receives it, just before.
    pub fn par_chunks_mut(self, n: usize) -> impl IndexedParallelIterator<Item = &'a mut [T]> {
        let handed = self.handed;
        self.values.par_chunks_mut(n).map(move |chunk| {
            let chunk = zeroed_chunk(chunk);
            if let Some(h) = handed {
                h.fetch_add(chunk.len(), Ordering::Relaxed);
            }
            chunk
        })
    }

    /// The output in parallel chunks of `n` elements (the last may be shorter), not yet
    /// written: for a kernel that writes every element through [`OutChunk::map`] or
    /// [`OutChunk::zip_map`] (or takes a chunk [`OutChunk::zeroed`]).
    pub fn par_out_chunks(self, n: usize) -> impl IndexedParallelIterator<Item = OutChunk<'a, T>> {
        let handed = self.handed;
        self.values
            .par_chunks_mut(n)
            .map(move |values| OutChunk { values, handed })
    }

    /// The whole output zeroed, on the calling thread (for small outputs).
    pub fn zeroed(self) -> &'a mut [T] {
        if let Some(h) = self.handed {
            h.fetch_add(self.values.len(), Ordering::Relaxed);
        }
        zeroed_chunk(self.values)
    }
}

/// One chunk of an [`Out`], not yet written: the thread that takes it either zeroes it
/// ([`OutChunk::zeroed`]) or writes every element ([`OutChunk::map`], [`OutChunk::zip_map`]),
/// and only then counts it as written.
pub struct OutChunk<'a, T = f32> {
    values: &'a mut [MaybeUninit<T>],
    handed: Option<&'a AtomicUsize>,
}

impl<'a, T: Copy + Default> OutChunk<'a, T> {
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Where the chunk starts (for prefetch hints, never read through).
    pub fn as_ptr(&self) -> *const T {
        self.values.as_ptr().cast()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The chunk zeroed, for a kernel that adds into its output or writes only part of it.
    pub fn zeroed(self) -> &'a mut [T] {
        self.count();
        zeroed_chunk(self.values)
    }

    /// The first `mid` elements and the rest, each still to be written.
    ///
    /// # Panics
    /// If `mid > len`.
    pub fn split_at(self, mid: usize) -> (Self, Self) {
        let (a, b) = self.values.split_at_mut(mid);
        let handed = self.handed;
        (OutChunk { values: a, handed }, OutChunk { values: b, handed })
    }

    /// `out[i] = f(x[i])` for every element, never zeroed first: one pass over the output
    /// instead of two.
    ///
    /// # Panics
    /// If `x` is not the chunk's length.
    #[inline(always)]
    pub fn map(self, x: &[T], mut f: impl FnMut(T) -> T) -> &'a mut [T] {
        assert_eq!(x.len(), self.values.len(), "OutChunk::map: lengths");
        for (o, &x) in self.values.iter_mut().zip(x) {
            o.write(f(x));
        }
        self.count();
        // SAFETY: the loop wrote every element (the lengths are equal), and `MaybeUninit<T>`
        // has `T`'s layout.
        unsafe { assume_written(self.values) }
    }

    /// `out[i] = f(x[i], y[i])` for every element, never zeroed first.
    ///
    /// # Panics
    /// If `x` or `y` is not the chunk's length.
    #[inline(always)]
    pub fn zip_map(self, x: &[T], y: &[T], mut f: impl FnMut(T, T) -> T) -> &'a mut [T] {
        let n = self.values.len();
        assert!(x.len() == n && y.len() == n, "OutChunk::zip_map: lengths");
        for ((o, &x), &y) in self.values.iter_mut().zip(x).zip(y) {
            o.write(f(x, y));
        }
        self.count();
        // SAFETY: as in `map`.
        unsafe { assume_written(self.values) }
    }

    /// The chunk written by `write`, which is handed it as it is (unwritten, for a fresh buffer).
    ///
    /// # Safety
    /// `write` writes every element of the slice it is given (or panics).
    #[inline(always)]
    pub unsafe fn written_by(self, write: impl FnOnce(&mut [MaybeUninit<T>])) -> &'a mut [T] {
        write(&mut *self.values);
        self.count();
        // SAFETY: the caller's guarantee.
        unsafe { assume_written(self.values) }
    }

    /// Counts the chunk as written, for [`fresh`]'s check (each chunk is counted once, by the
    /// method that consumes it and writes all of it).
    fn count(&self) {
        if let Some(h) = self.handed {
            h.fetch_add(self.values.len(), Ordering::Relaxed);
        }
    }
}

/// `values` as initialised.
///
/// # Safety
/// Every element of `values` has been written.
#[inline(always)]
unsafe fn assume_written<T>(values: &mut [MaybeUninit<T>]) -> &mut [T] {
    let len = values.len();
    // SAFETY: the caller's guarantee; `MaybeUninit<T>` has `T`'s size and alignment.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), len) }
}

impl<'a, T: Copy + Default + Send + Sync> Out<'a, T> {
    /// The output in chunks of `n` elements (the last may be shorter), not yet written: each is
    /// zeroed when taken ([`OutChunk::zeroed`]), so that a kernel can hand them to its threads
    /// in an order of its own.
    pub fn chunks(self, n: usize) -> impl Iterator<Item = OutChunk<'a, T>> {
        let handed = self.handed;
        self.values
            .chunks_mut(n)
            .map(move |values| OutChunk { values, handed })
    }
}

/// `len` values that `kernel` writes through the [`Out`] it is given, without zeroing them first.
///
/// # Panics
/// If `kernel` returns without having taken every element through [`Out::par_chunks_mut`] or
/// [`Out::zeroed`] (a kernel bug: its output would have undefined values).
pub fn fresh<T: Copy + Default + Send + Sync>(len: usize, kernel: impl FnOnce(Out<'_, T>)) -> Vec<T> {
    let mut values = Box::<[T]>::new_uninit_slice(len);
    let handed = AtomicUsize::new(0);
    kernel(Out {
        values: &mut values,
        handed: Some(&handed),
    });
    // Chunks are disjoint and each is counted once, after it was written, so `len` handed out
    // means every element is initialised.
    assert_eq!(
        handed.load(Ordering::Relaxed),
        len,
        "a kernel left part of its output unwritten"
    );
    // SAFETY: see the assertion above; `Out` writes only initialised values.
    unsafe { values.assume_init() }.into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_hands_out_zeros_then_keeps_the_kernels_values() {
        let v = fresh::<f32>(10, |out| {
            out.par_chunks_mut(3).enumerate().for_each(|(i, c)| {
                assert!(c.iter().all(|&v| v == 0.0));
                c[0] = i as f32 + 1.0;
            })
        });
        assert_eq!(v, [1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 3.0, 0.0, 0.0, 4.0]);
        assert_eq!(fresh::<u32>(4, |out| out.zeroed()[3] = 7), [0, 0, 0, 7]);
    }

    #[test]
    #[should_panic(expected = "left part of its output unwritten")]
    fn fresh_refuses_a_kernel_that_skips_chunks() {
        fresh::<f32>(10, |out| out.par_chunks_mut(3).take(2).for_each(|_| ()));
    }

    #[test]
    fn chunks_taken_in_any_order_fill_a_fresh_buffer() {
        let v = fresh::<f32>(5, |out| {
            let mut chunks: Vec<_> = out.chunks(2).collect();
            chunks.reverse();
            for (i, c) in chunks.into_iter().enumerate() {
                c.zeroed()[0] = i as f32 + 1.0;
            }
        });
        assert_eq!(v, [3.0, 0.0, 2.0, 0.0, 1.0]);
    }

    #[test]
    #[should_panic(expected = "left part of its output unwritten")]
    fn a_chunk_never_taken_is_refused() {
        fresh::<f32>(5, |out| {
            out.chunks(2).take(2).for_each(|c| {
                c.zeroed();
            })
        });
    }

    #[test]
    fn mapped_chunks_fill_a_fresh_buffer_without_zeros() {
        let x: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let v = fresh::<f32>(10, |out| {
            out.par_out_chunks(4).zip(x.par_chunks(4)).for_each(|(c, x)| {
                let (a, b) = c.split_at(1);
                a.map(&x[..1], |x| -x);
                b.zip_map(&x[1..], &x[1..], |x, y| x * y);
            })
        });
        assert_eq!(v, [-0.0, 1.0, 4.0, 9.0, -4.0, 25.0, 36.0, 49.0, -8.0, 81.0]);
    }

    #[test]
    #[should_panic(expected = "left part of its output unwritten")]
    fn a_split_part_never_written_is_refused() {
        fresh::<f32>(4, |out| {
            out.par_out_chunks(4).for_each(|c| {
                c.split_at(3).0.map(&[1.0; 3], |x| x);
            })
        });
    }

    #[test]
    #[should_panic(expected = "OutChunk::map: lengths")]
    fn a_map_from_a_shorter_input_is_refused() {
        fresh::<f32>(4, |out| {
            out.par_out_chunks(4).for_each(|c| {
                c.map(&[1.0; 3], |x| x);
            })
        });
    }

    #[test]
    fn an_existing_slice_is_zeroed_where_handed_out() {
        let mut v = vec![5.0f32; 4];
        Out::from(&mut v).par_chunks_mut(2).for_each(|c| c[1] = 1.0);
        assert_eq!(v, [0.0, 1.0, 0.0, 1.0]);
    }
}
