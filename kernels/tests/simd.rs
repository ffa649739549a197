//! Batch norm's passes give the same bits on the AVX-512 path (`simd::wide`, where the CPU has
//! it) as on the portable x86-64 baseline (`EMBER_SIMD=portable`). The setting is read once per
//! process, so the test runs itself a second time with the other setting and compares digests.
//! On a CPU without AVX-512F both runs are portable and agree trivially.

use std::process::Command;

use ember_kernels::cpu::batch_norm::{
    batch_norm_backward, batch_norm_relu_pool_backward, batch_stats, inv_std, normalise, normalise_add_relu,
    normalise_relu_pool, to_f32,
};
use ember_kernels::{BnPoolShape, BnShape};

const CHILD: &str = "EMBER_SIMD_TEST_CHILD";
const NAME: &str = "batch_norm_is_bit_identical_with_and_without_avx512";

/// Deterministic values in about [-2, 3): a hash of the index, not a ramp, so that sums cancel
/// unevenly and every rounding shows.
fn values(n: usize, salt: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let h = (i ^ (salt << 32))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
            (h >> 40) as f32 / (1u64 << 24) as f32 * 5.0 - 2.0
        })
        .collect()
}

/// FNV-1a over the bits of every output.
fn digest(outputs: &[&[f32]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for out in outputs {
        for v in out.iter() {
            for b in v.to_bits().to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    h
}

/// Every batch-norm entry point on odd sizes (planes not a multiple of 16: the loops' tails).
fn run_all() -> u64 {
    let mut outs: Vec<Vec<f32>> = Vec::new();
    for (batch, channels, h, w) in [(3, 5, 7, 9), (2, 16, 14, 14), (4, 3, 5, 4)] {
        let s = BnShape {
            batch,
            channels,
            plane: h * w,
        };
        let x = values(s.len(), 1);
        let (weight, bias) = (values(channels, 2), values(channels, 3));
        let (mean, var) = batch_stats(&s, &x);
        let inv = inv_std(&var, 1e-5);
        outs.push(mean.iter().chain(&var).map(|&v| v as f32).collect());
        outs.push(
            mean.iter()
                .chain(&var)
                .map(|&v| (v - f64::from(v as f32)) as f32)
                .collect(),
        );
        for relu in [false, true] {
            let mut y = vec![0.0; s.len()];
            normalise(
                &s,
                &x,
                &to_f32(&mean),
                &to_f32(&inv),
                &weight,
                &bias,
                relu,
                &mut y,
            );
            let dy = values(s.len(), 4);
            let (mut dx, mut dw, mut db) = (vec![0.0; s.len()], vec![0.0; channels], vec![0.0; channels]);
            batch_norm_backward(
                &s,
                &x,
                &mean,
                &inv,
                &weight,
                &dy,
                relu.then_some(&y[..]),
                Some(&mut dx),
                Some(&mut dw),
                Some(&mut db),
            );
            outs.extend([y, dx, dw, db]);
        }
        let residual = values(s.len(), 6);
        let mut y = vec![0.0; s.len()];
        normalise_add_relu(
            &s,
            &x,
            &to_f32(&mean),
            &to_f32(&inv),
            &weight,
            &bias,
            &residual,
            &mut y,
        );
        outs.push(y);
        let p = BnPoolShape {
            batch,
            channels,
            in_h: h,
            in_w: w,
        };
        let n = p.out_len();
        let (mut z, mut argmax, mut x_at) = (vec![0.0; n], vec![0u32; n], vec![0.0; n]);
        normalise_relu_pool(
            &p,
            &x,
            &to_f32(&mean),
            &to_f32(&inv),
            &weight,
            &bias,
            &mut z,
            &mut argmax,
            &mut x_at,
        );
        let dz = values(n, 5);
        let (mut dx, mut dw, mut db) = (vec![0.0; s.len()], vec![0.0; channels], vec![0.0; channels]);
        batch_norm_relu_pool_backward(
            &p,
            &x,
            &mean,
            &inv,
            &weight,
            &dz,
            &z,
            &argmax,
            &x_at,
            Some(&mut dx),
            Some(&mut dw),
            Some(&mut db),
        );
        outs.push(argmax.iter().map(|&i| i as f32).collect());
        outs.extend([z, x_at, dx, dw, db]);
    }
    digest(&outs.iter().map(|v| &v[..]).collect::<Vec<_>>())
}

#[test]
fn batch_norm_is_bit_identical_with_and_without_avx512() {
    let here = run_all();
    if std::env::var_os(CHILD).is_some() {
        println!("digest={here}");
        return;
    }
    let other = if ember_kernels::simd_in_use() == "portable" {
        "auto"
    } else {
        "portable"
    };
    let out = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("EMBER_SIMD", other)
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child run failed: {stdout}");
    let theirs: u64 = stdout
        .lines()
        .find_map(|l| l.split("digest=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no digest in the child's output: {stdout}"))
        .parse()
        .expect("a digest");
    eprintln!(
        "vector instructions here: {}, child: EMBER_SIMD={other}; digests {here:x} / {theirs:x}",
        ember_kernels::simd_in_use()
    );
    assert_eq!(
        here, theirs,
        "batch norm's results differ between EMBER_SIMD settings"
    );
}
