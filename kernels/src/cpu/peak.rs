//! The machine's measured arithmetic peak, to say how far a workload is from it.

use std::time::Instant;

use rayon::prelude::*;

use super::{gemm, Gemm};

/// GFLOP/s of f32 GEMM that this machine reaches with every thread of the current rayon pool
/// busy: each thread multiplies its own 384x384 matrices (single-threaded GEMM, the way the
/// convolution kernels call it); best of five rounds. About 50 ms.
pub fn gemm_peak_gflops() -> f64 {
    const N: usize = 384;
    const REPS: usize = 4;
    let threads = rayon::current_num_threads();
    let a: Vec<f32> = (0..N * N).map(|i| (i % 17) as f32 * 0.01).collect();
    let mut outs = vec![vec![0.0f32; N * N]; threads];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        outs.par_iter_mut().with_max_len(1).for_each(|out| {
            for _ in 0..REPS {
                gemm(Gemm {
                    m: N,
                    n: N,
                    k: N,
                    dst: out,
                    dst_rs: N,
                    dst_cs: 1,
                    accumulate: false,
                    lhs: &a,
                    lhs_rs: N,
                    lhs_cs: 1,
                    rhs: &a,
                    rhs_rs: N,
                    rhs_cs: 1,
                });
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    (2 * N * N * N * REPS * threads) as f64 / best / 1e9
}
