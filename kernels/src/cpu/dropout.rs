//! Dropout masks from a counter-based generator: whether element `i` is kept is a hash of
//! `(key, i)`. The mask is built in parallel with no shared generator and no lock (burn's
//! `Dropout` draws one Bernoulli sample per element from flex's global, mutex-held RNG on the
//! calling thread), is the same for any thread count, and is recomputed by the backward pass
//! instead of stored.

use rayon::prelude::*;

use super::Out;

/// Elements per parallel block: a function of nothing but the length.
const BLOCK: usize = 1 << 14;

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser (Steele, Lea, Flood 2014): consecutive counters give independent-looking
/// 64-bit outputs.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One dropout mask: element `i` is kept with probability `keep`, decided by `key` and `i`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    pub key: u64,
    pub keep: f64,
}

impl DropoutMask {
    /// 1 where element `i` is kept, else 0: the high 32 bits of SplitMix64's `i`-th output for
    /// seed `key`, below `keep * 2^32`.
    #[inline(always)]
    fn factor(&self, i: usize, threshold: u64) -> f32 {
        let state = self
            .key
            .wrapping_add((i as u64).wrapping_add(1).wrapping_mul(GOLDEN_GAMMA));
        if mix(state) >> 32 < threshold {
            1.0
        } else {
            0.0
        }
    }

    fn threshold(&self) -> u64 {
        (self.keep.clamp(0.0, 1.0) * 4_294_967_296.0) as u64
    }

    /// The mask itself, for tests.
    pub fn factors(&self, len: usize) -> Vec<f32> {
        let t = self.threshold();
        (0..len).map(|i| self.factor(i, t)).collect()
    }
}

/// `out[i] = (x[i] * m[i]) * scale`, in the order of burn's `Dropout` (`input * mask`, then
/// `* (1 / keep)`), so that a dropped NaN stays NaN as it does there.
pub fn dropout_forward<'o>(mask: &DropoutMask, scale: f32, x: &[f32], out: impl Into<Out<'o>>) {
    let out = out.into();
    assert_eq!(x.len(), out.len(), "dropout: lengths");
    let t = mask.threshold();
    out.par_chunks_mut(BLOCK)
        .zip(x.par_chunks(BLOCK))
        .enumerate()
        .for_each(|(b, (out, x))| {
            for (j, (o, &v)) in out.iter_mut().zip(x).enumerate() {
                *o = (v * mask.factor(b * BLOCK + j, t)) * scale;
            }
        });
}

/// `dx[i] = (dy[i] * scale) * m[i]`: the gradient through burn's two multiplications, in their
/// order.
pub fn dropout_backward<'o>(mask: &DropoutMask, scale: f32, dy: &[f32], dx: impl Into<Out<'o>>) {
    let dx = dx.into();
    assert_eq!(dy.len(), dx.len(), "dropout backward: lengths");
    let t = mask.threshold();
    dx.par_chunks_mut(BLOCK)
        .zip(dy.par_chunks(BLOCK))
        .enumerate()
        .for_each(|(b, (dx, dy))| {
            for (j, (d, &g)) in dx.iter_mut().zip(dy).enumerate() {
                *d = (g * scale) * mask.factor(b * BLOCK + j, t);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_asked_fraction_and_scales_what_it_keeps() {
        for keep in [0.1, 0.5, 0.75] {
            let mask = DropoutMask { key: 12345, keep };
            let n = 200_000;
            let x: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32).collect();
            let mut y = vec![f32::NAN; n];
            let scale = (1.0 / keep) as f32;
            dropout_forward(&mask, scale, &x, &mut y);
            let kept = y.iter().filter(|&&v| v != 0.0).count();
            // Binomial(n, keep): 6 standard deviations either side.
            let sd = (n as f64 * keep * (1.0 - keep)).sqrt();
            assert!(
                ((kept as f64) - n as f64 * keep).abs() < 6.0 * sd,
                "keep {keep}: kept {kept} of {n}"
            );
            for (&v, &x) in y.iter().zip(&x) {
                assert!(v == 0.0 || v == x * scale, "{v} from {x}");
            }
        }
    }

    #[test]
    fn the_backward_pass_uses_the_forward_mask() {
        let mask = DropoutMask { key: 7, keep: 0.5 };
        let n = 50_000;
        let ones = vec![1.0f32; n];
        let (mut y, mut dx) = (vec![0.0; n], vec![0.0; n]);
        dropout_forward(&mask, 2.0, &ones, &mut y);
        dropout_backward(&mask, 2.0, &ones, &mut dx);
        assert_eq!(y, dx);
        assert_eq!(
            y,
            mask.factors(n)
                .iter()
                .map(|m| (1.0 * m) * 2.0)
                .collect::<Vec<f32>>()
        );
    }

    #[test]
    fn masks_differ_by_key_and_neighbouring_elements_are_independent() {
        let n = 100_000;
        let a = DropoutMask { key: 1, keep: 0.5 }.factors(n);
        let b = DropoutMask { key: 2, keep: 0.5 }.factors(n);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        // Independent masks agree on about half the elements.
        assert!(
            (same as f64 - n as f64 / 2.0).abs() < 6.0 * (n as f64 / 4.0).sqrt(),
            "{same}"
        );
        // Pairs of neighbours: each of the four outcomes about a quarter of the time.
        let mut pairs = [0usize; 4];
        for w in a.windows(2) {
            pairs[(w[0] as usize) * 2 + w[1] as usize] += 1;
        }
        for count in pairs {
            let expected = (n - 1) as f64 / 4.0;
            assert!(
                (count as f64 - expected).abs() < 6.0 * expected.sqrt(),
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn the_mask_does_not_depend_on_the_thread_count() {
        let mask = DropoutMask { key: 99, keep: 0.3 };
        let x: Vec<f32> = (0..3 * BLOCK + 17).map(|i| i as f32).collect();
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![0.0; x.len()];
            pool.install(|| dropout_forward(&mask, 1.5, &x, &mut y));
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(3));
    }
}
