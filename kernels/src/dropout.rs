//! Dropout masks keyed by the training loop, not by a backend's global generator.
//!
//! burn's `Dropout` draws from the backend's generator, and the only way to make a resumed run
//! draw what an uninterrupted one would is to reseed that generator every step. On burn's
//! fusion backend (CUDA) `Backend::seed` is a blocking round trip to the fusion server that
//! drains the stream first (burn-fusion 0.21 `backend.rs`: `client.sync(|| B::seed(..))`), so
//! the host would wait on the device queue every step. Here the loop names each step's masks
//! instead ([`begin_dropout_step`], a host-side integer), each dropout layer takes the next key of
//! that step ([`next_dropout_key`]), and the mask is a hash of `(key, element index)`:
//! - on `Autodiff<Flex>` with ember's kernels, computed on the host by [`crate::cpu::dropout`];
//! - on any other backend, computed on the device from tensor ops by [`keep_mask`], with no
//!   upload and no read: the element indices come from `ones().cumsum()` and the hash is a
//!   Feistel network whose intermediates stay below 2^31, so `i32` (CUDA) and `i64` (ndarray,
//!   flex) integers give the same masks.

use std::cell::Cell;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor};

use crate::cpu::dropout::mix;

thread_local! {
    /// The current step's key and how many masks it has keyed so far. Per thread, like the
    /// autodiff graph a forward pass builds: parallel tests each draw their own stream.
    static STREAM: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Starts the masks of one training step: until the next call, the `n`-th dropout layer run on
/// this thread draws its mask from `(key, n)`. A host-side integer store, no device work.
pub fn begin_dropout_step(key: u64) {
    STREAM.with(|s| s.set((key, 0)));
}

/// The key of the next dropout mask on this thread (see [`begin_dropout_step`]).
pub fn next_dropout_key() -> u64 {
    STREAM.with(|s| {
        let (key, drawn) = s.get();
        s.set((key, drawn + 1));
        mix(key ^ (drawn + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    })
}

const ROUNDS: usize = 8;
/// Odd multipliers below 2^15: a 16-bit value times one stays below 2^31.
const MULTIPLIERS: [i64; 4] = [0x6A5D, 0x4F1B, 0x7C2D, 0x58E3];
/// Masks are built over a grid of at most `DIGIT^3` elements.
const DIGIT: usize = 1024;

/// The largest mask [`keep_mask`] builds: 2^30 elements (4 GiB of `f32`).
pub const MAX_MASK_ELEMENTS: usize = DIGIT * DIGIT * DIGIT;

/// A `[shape]` tensor of 1.0 where an element is kept and 0.0 where it is dropped, each kept
/// with probability `keep`, decided by a hash of `(key, i)` for the element's row-major index
/// `i`. Built on `device` from tensor ops only: nothing is uploaded and nothing read back.
///
/// # Panics
/// If the shape has more than [`MAX_MASK_ELEMENTS`] elements.
pub fn keep_mask<B: Backend, const D: usize>(
    shape: [usize; D],
    key: u64,
    keep: f64,
    device: &B::Device,
) -> Tensor<B, D> {
    let n: usize = shape.iter().product();
    assert!(
        n <= MAX_MASK_ELEMENTS,
        "dropout mask of {n} elements: at most {MAX_MASK_ELEMENTS} are supported"
    );
    let index = element_index::<B>(n, device);
    let int = |v: i64| -> B::IntElem { v.elem() };
    // The 32-bit index as two 16-bit halves, through a balanced Feistel network: a bijection of
    // the 32-bit counter for every key, so distinct elements never share a draw.
    let mut left = index.clone().bitwise_right_shift_scalar(int(16));
    let mut right = index.bitwise_and_scalar(int(0xFFFF));
    let round_keys = round_keys(key);
    for (round, &k) in round_keys.iter().enumerate() {
        let product = right
            .clone()
            .bitwise_xor_scalar(int(k))
            .mul_scalar(MULTIPLIERS[round % MULTIPLIERS.len()]);
        // Fold the product's high bits into its low 16: the rounds' only nonlinearity besides
        // the carries of the multiplication.
        let f = product
            .clone()
            .bitwise_xor(product.bitwise_right_shift_scalar(int(15)))
            .bitwise_and_scalar(int(0xFFFF));
        let next = left.bitwise_xor(f);
        left = right;
        right = next;
    }
    // 24 uniform bits, compared with keep * 2^24.
    let bits = left
        .bitwise_left_shift_scalar(int(8))
        .bitwise_or(right.bitwise_right_shift_scalar(int(8)));
    let threshold = (keep.clamp(0.0, 1.0) * (1u64 << 24) as f64).round() as i64;
    bits.lower_elem(threshold).float().reshape(shape)
}

/// Sixteen-bit round keys from the 64-bit key.
fn round_keys(key: u64) -> [i64; ROUNDS] {
    let (a, b) = (mix(key), mix(key ^ 0xA076_1D64_78BD_642F));
    std::array::from_fn(|r| {
        let word = if r < 4 { a } else { b };
        ((word >> (16 * (r % 4))) & 0xFFFF) as i64
    })
}

/// `[0, 1, ..., n - 1]` built on the device: `arange` uploads from the host on burn's CUDA
/// backend, and its `cumsum` is quadratic in the summed dimension, so the index is the sum of
/// three broadcast digit vectors, each a cumsum over at most 1,024 ones.
fn element_index<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 1, Int> {
    let d0 = n.clamp(1, DIGIT);
    let d1 = n.div_ceil(DIGIT).clamp(1, DIGIT);
    let d2 = n.div_ceil(DIGIT * DIGIT).max(1);
    let digit = |len: usize, weight: usize, shape: [usize; 3]| {
        Tensor::<B, 1, Int>::ones([len], device)
            .cumsum(0)
            .sub_scalar(1)
            .mul_scalar(weight as i64)
            .reshape(shape)
    };
    let grid = digit(d2, DIGIT * DIGIT, [d2, 1, 1]) + digit(d1, DIGIT, [1, d1, 1]) + digit(d0, 1, [1, 1, d0]);
    grid.reshape([d2 * d1 * d0]).slice(0..n)
}

/// burn's `Dropout` arithmetic (`(x * mask) * (1 / keep)`, so a dropped NaN stays NaN) with the
/// mask from [`keep_mask`] and the next key of this thread's step. The identity without autodiff
/// or with `prob == 0`, as in burn.
///
/// # Shapes
/// - `x`: any
/// - output: the same
pub fn keyed_dropout<B: Backend, const D: usize>(x: Tensor<B, D>, prob: f64) -> Tensor<B, D> {
    let device = x.device();
    if !B::ad_enabled(&device) || prob == 0.0 {
        return x;
    }
    let keep = 1.0 - prob;
    let mask = keep_mask::<B, D>(x.dims(), next_dropout_key(), keep, &device);
    (x * mask).mul_scalar(1.0 / keep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};

    type B = NdArray<f32>;

    fn mask(n: usize, key: u64, keep: f64) -> Vec<f32> {
        keep_mask::<B, 1>([n], key, keep, &Default::default())
            .into_data()
            .to_vec::<f32>()
            .unwrap()
    }

    #[test]
    fn element_index_counts_across_digit_boundaries() {
        for n in [1, 7, 1024, 1025, 5000, DIGIT * DIGIT + 3] {
            let got = element_index::<B>(n, &Default::default())
                .into_data()
                .to_vec::<i64>()
                .unwrap();
            assert_eq!(got.len(), n);
            assert!(got.iter().enumerate().all(|(i, &v)| v == i as i64), "n = {n}");
        }
    }

    #[test]
    fn keeps_the_asked_fraction() {
        let n = 1 << 20;
        // Fine thresholds test the low bits of the 24 compared, coarse ones the high bits.
        for keep in [1.0 / 4096.0, 0.1, 0.3, 0.5, 0.75, 0.9, 1.0 - 1.0 / 1024.0] {
            let kept = mask(n, 42, keep).iter().filter(|&&m| m == 1.0).count() as f64;
            // 5 standard deviations of a binomial count.
            let sd = (n as f64 * keep * (1.0 - keep)).sqrt();
            assert!(
                (kept - n as f64 * keep).abs() < 5.0 * sd,
                "keep {keep}: {kept} of {n}"
            );
        }
        assert!(mask(1000, 3, 1.0).iter().all(|&m| m == 1.0));
        assert!(mask(1000, 3, 0.0).iter().all(|&m| m == 0.0));
    }

    /// Joint frequencies of neighbouring elements, of elements 1,024 apart (the index grid's
    /// digits) and of the same element under consecutive keys are those of independent draws.
    #[test]
    fn draws_look_independent() {
        let n = 1 << 18;
        let keep = 0.5;
        let a = mask(n, 1, keep);
        let b = mask(n, 2, keep);
        let both =
            |x: &[f32], y: &[f32]| x.iter().zip(y).filter(|(p, q)| **p == 1.0 && **q == 1.0).count() as f64;
        let pairs = [
            (both(&a[..n - 1], &a[1..]), n - 1),
            (both(&a[..n - 1024], &a[1024..]), n - 1024),
            (both(&a, &b), n),
        ];
        for (i, (count, len)) in pairs.into_iter().enumerate() {
            let p = keep * keep;
            let sd = (len as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (count - len as f64 * p).abs() < 5.0 * sd,
                "pair {i}: {count} of {len}"
            );
        }
    }

    #[test]
    fn the_same_on_flex_as_on_ndarray() {
        type F = burn::backend::Flex;
        let n = 70_000;
        let flex = keep_mask::<F, 1>([n], 9, 0.3, &Default::default())
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(flex, mask(n, 9, 0.3));
    }

    #[test]
    fn keys_follow_the_step_and_the_order_of_drawing() {
        begin_dropout_step(5);
        let first = (next_dropout_key(), next_dropout_key());
        begin_dropout_step(5);
        assert_eq!(first, (next_dropout_key(), next_dropout_key()));
        assert_ne!(first.0, first.1);
        begin_dropout_step(6);
        assert_ne!(first.0, next_dropout_key());
    }

    #[test]
    fn dropout_scales_kept_elements_and_is_off_without_autodiff() {
        let device = Default::default();
        let x = Tensor::<Autodiff<B>, 2>::ones([64, 100], &device);
        begin_dropout_step(1);
        let y = keyed_dropout(x, 0.25).into_data().to_vec::<f32>().unwrap();
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        let plain = Tensor::<B, 2>::ones([4, 4], &device);
        assert_eq!(
            keyed_dropout(plain, 0.5).into_data().to_vec::<f32>().unwrap(),
            vec![1.0; 16]
        );
    }
}
