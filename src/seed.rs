//! Seeds derived from a run's seed, so that what a step or an epoch draws depends only on the
//! run's seed and its index.

/// SplitMix64 of `seed` and `index`: independent streams per epoch (shuffles, augmentation) and
/// per step (dropout), so that a run resumed at any step boundary draws what an uninterrupted
/// one would.
pub fn mix_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ (index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
