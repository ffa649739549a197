//! Micro-benchmarks of ember's CPU kernels (ember-kernels) on the seed models' hot shapes at
//! batch 64, on plain slices: `cargo bench --bench kernels`. Each convolution reports its
//! multiply-accumulate throughput (divan's "items" are MACs: GFLOP/s = 2 x Gitem/s), with the
//! ReLU fused as the models call it.

use divan::counter::ItemsCount;
use ember_kernels::cpu::batch_norm::{
    batch_norm_backward, batch_norm_relu_pool_backward, batch_stats, batch_stats_from, bn_input_grad,
    bn_pool_input_grad, combine_moments, inv_std, normalise, normalise_add_relu, normalise_relu_pool,
    normalise_relu_pool_from, to_f32, BnPoolShape, BnShape, MapMoments,
};
use ember_kernels::cpu::conv::{
    conv2d_backward, conv2d_backward_from, conv2d_forward, conv2d_forward_moments, ConvImages, ConvShape,
    PadMode,
};
use ember_kernels::cpu::dropout::{dropout_backward, dropout_forward, DropoutMask};
use ember_kernels::cpu::linear::{linear_backward, linear_forward, LinearShape};
use ember_kernels::cpu::optim::{update, Rule};
use ember_kernels::cpu::pool::{max_pool2d_backward, max_pool2d_forward, PoolShape};
use ember_kernels::cpu::Images;

fn main() {
    divan::main();
}

const fn conv(
    in_channels: usize,
    out_channels: usize,
    size: usize,
    k: usize,
    pad: usize,
    mode: PadMode,
) -> ConvShape {
    ConvShape {
        batch: 64,
        in_channels,
        in_h: size,
        in_w: size,
        out_channels,
        kernel: [k, k],
        stride: [1, 1],
        padding: [pad, pad],
        mode,
    }
}

/// (name, shape, whether the input gradient is needed: not for a first layer).
const CONVS: [(&str, ConvShape, bool); 14] = [
    (
        "net.conv1 1x28x28->32 3x3",
        conv(1, 32, 28, 3, 0, PadMode::Zeros),
        false,
    ),
    (
        "net.conv2 32x26x26->64 3x3",
        conv(32, 64, 26, 3, 0, PadMode::Zeros),
        true,
    ),
    (
        "flash.conv1 1x28x28->32 5x5 replicate",
        conv(1, 32, 28, 5, 2, PadMode::Replicate),
        false,
    ),
    (
        "flash.conv2 32x14x14->64 5x5 replicate",
        conv(32, 64, 14, 5, 2, PadMode::Replicate),
        true,
    ),
    // The modern models' 3x3 pad-1 layers (issue 24's scenarios).
    (
        "resnet20.stage1 16x28x28->16 3x3",
        conv(16, 16, 28, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "resnet20.stage2 32x14x14->32 3x3",
        conv(32, 32, 14, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "resnet20.stage3 64x7x7->64 3x3",
        conv(64, 64, 7, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "speedrun.block2 32x14x14->64 3x3",
        conv(32, 64, 14, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "resnet18.stage1 64x32x32->64 3x3",
        conv(64, 64, 32, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "speedrun.block1 1x28x28->32 3x3",
        conv(1, 32, 28, 3, 1, PadMode::Zeros),
        false,
    ),
    (
        "speedrun.block3 64x7x7->128 3x3",
        conv(64, 128, 7, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "resnet18.stage2 128x16x16->128 3x3",
        conv(128, 128, 16, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "resnet18.stage3 256x8x8->256 3x3",
        conv(256, 256, 8, 3, 1, PadMode::Zeros),
        true,
    ),
    (
        "resnet18.stage4 512x4x4->512 3x3",
        conv(512, 512, 4, 3, 1, PadMode::Zeros),
        true,
    ),
];

fn ramp(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

#[divan::bench(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], sample_count = 20)]
fn conv2d_fwd(bencher: divan::Bencher, which: usize) {
    let (_, s, _) = CONVS[which];
    let (x, w, b) = (
        ramp(s.batch * s.in_image()),
        ramp(s.weight_len()),
        ramp(s.out_channels),
    );
    let mut out = vec![0.0; s.batch * s.out_image()];
    bencher
        .counter(ItemsCount::new(s.forward_macs()))
        .bench_local(|| conv2d_forward(&s, &x, &w, Some(&b), true, &mut out));
}

#[divan::bench(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], sample_count = 20)]
fn conv2d_bwd(bencher: divan::Bencher, which: usize) {
    let (_, s, input_grad) = CONVS[which];
    let (x, w, dy) = (
        ramp(s.batch * s.in_image()),
        ramp(s.weight_len()),
        ramp(s.batch * s.out_image()),
    );
    // The fused ReLU's output: the ramp is negative about half the time, like a trained layer's.
    let y = ramp(s.batch * s.out_image());
    let mut dx = vec![0.0; x.len()];
    let (mut dw, mut db) = (vec![0.0; w.len()], vec![0.0; s.out_channels]);
    let macs = s.forward_macs() * if input_grad { 2 } else { 1 };
    bencher.counter(ItemsCount::new(macs)).bench_local(|| {
        let dx = input_grad.then_some(&mut dx[..]);
        conv2d_backward(&s, &x, &w, &dy, Some(&y), dx, Some(&mut dw), Some(&mut db))
    });
}

/// The backward's two halves apart: the weight (and bias) gradient alone, the input gradient alone.
#[divan::bench(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], sample_count = 20)]
fn conv2d_bwd_weight(bencher: divan::Bencher, which: usize) {
    let (_, s, _) = CONVS[which];
    let (x, w, dy) = (
        ramp(s.batch * s.in_image()),
        ramp(s.weight_len()),
        ramp(s.batch * s.out_image()),
    );
    let y = ramp(s.batch * s.out_image());
    let (mut dw, mut db) = (vec![0.0; w.len()], vec![0.0; s.out_channels]);
    bencher
        .counter(ItemsCount::new(s.forward_macs()))
        .bench_local(|| {
            conv2d_backward(
                &s,
                &x,
                &w,
                &dy,
                Some(&y),
                None::<&mut [f32]>,
                Some(&mut dw),
                Some(&mut db),
            )
        });
}

#[divan::bench(args = [1, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13], sample_count = 20)]
fn conv2d_bwd_input(bencher: divan::Bencher, which: usize) {
    let (_, s, _) = CONVS[which];
    let (x, w, dy) = (
        ramp(s.batch * s.in_image()),
        ramp(s.weight_len()),
        ramp(s.batch * s.out_image()),
    );
    let y = ramp(s.batch * s.out_image());
    let mut dx = vec![0.0; x.len()];
    bencher
        .counter(ItemsCount::new(s.forward_macs()))
        .bench_local(|| conv2d_backward(&s, &x, &w, &dy, Some(&y), Some(&mut dx), None, None));
}

/// The seed models' fully connected layers at batch 64: (name, inputs, outputs, ReLU after).
const LINEARS: [(&str, usize, usize, bool); 3] = [
    ("net.fc1 9216->128", 9216, 128, true),
    ("flash.fc1 3136->1024", 3136, 1024, true),
    ("flash.fc2 1024->10", 1024, 10, false),
];

fn linear_shape(which: usize) -> LinearShape {
    let (_, inputs, outputs, _) = LINEARS[which];
    LinearShape {
        batch: 64,
        inputs,
        outputs,
    }
}

#[divan::bench(args = [0, 1, 2], sample_count = 20)]
fn linear_fwd(bencher: divan::Bencher, which: usize) {
    let (s, relu) = (linear_shape(which), LINEARS[which].3);
    let (x, w, b) = (
        ramp(s.batch * s.inputs),
        ramp(s.inputs * s.outputs),
        ramp(s.outputs),
    );
    let mut y = vec![0.0; s.batch * s.outputs];
    bencher
        .counter(ItemsCount::new(s.forward_macs()))
        .bench_local(|| linear_forward(&s, &x, &w, Some(&b), relu, &mut y));
}

/// Input, weight and bias gradients (fc1's input is a hidden layer's, so it needs one).
#[divan::bench(args = [0, 1, 2], sample_count = 20)]
fn linear_bwd(bencher: divan::Bencher, which: usize) {
    let (s, relu) = (linear_shape(which), LINEARS[which].3);
    let (x, w, dy, y) = (
        ramp(s.batch * s.inputs),
        ramp(s.inputs * s.outputs),
        ramp(s.batch * s.outputs),
        ramp(s.batch * s.outputs),
    );
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; s.outputs]);
    bencher
        .counter(ItemsCount::new(2 * s.forward_macs()))
        .bench_local(|| {
            linear_backward(
                &s,
                &x,
                &w,
                &dy,
                relu.then_some(&y[..]),
                Some(&mut dx),
                Some(&mut dw),
                Some(&mut db),
            )
        });
}

const POOLS: [(usize, usize, usize); 4] = [(64, 64, 24), (64, 32, 28), (64, 64, 14), (256, 64, 24)];

fn pool(which: usize) -> PoolShape {
    let (batch, channels, size) = POOLS[which];
    PoolShape {
        batch,
        channels,
        in_h: size,
        in_w: size,
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
    }
}

/// 2x2 max pooling: net (64x24x24), flashlight's two (32x28x28, 64x14x14), net at batch 256.
#[divan::bench(args = [0, 1, 2, 3], sample_count = 20)]
fn max_pool2d_fwd(bencher: divan::Bencher, which: usize) {
    let s = pool(which);
    let x = ramp(s.planes() * s.in_plane());
    let (mut out, mut idx) = (
        vec![0.0; s.planes() * s.out_plane()],
        vec![0u32; s.planes() * s.out_plane()],
    );
    bencher.bench_local(|| max_pool2d_forward(&s, &x, &mut out, &mut idx));
}

#[divan::bench(args = [0, 1, 2, 3], sample_count = 20)]
fn max_pool2d_bwd(bencher: divan::Bencher, which: usize) {
    let s = pool(which);
    let x = ramp(s.planes() * s.in_plane());
    let (mut out, mut idx) = (
        vec![0.0; s.planes() * s.out_plane()],
        vec![0u32; s.planes() * s.out_plane()],
    );
    max_pool2d_forward(&s, &x, &mut out, &mut idx);
    let mut dx = vec![0.0; x.len()];
    bencher.bench_local(|| max_pool2d_backward(&s, &out, &idx, &mut dx));
}

/// One update of the largest parameter of each recipe: fc1.weight, 9216x128 (Adadelta, Adam)
/// and flashlight's 3136x1024 (SGD).
#[divan::bench(args = ["adadelta", "adam", "sgd", "sgd-nesterov"], sample_count = 20)]
fn optimizer(bencher: divan::Bencher, rule: &str) {
    let (rule, n) = match rule {
        "adadelta" => (
            Rule::Adadelta {
                lr: 1.0,
                rho: 0.9,
                eps: 1e-6,
            },
            9216 * 128,
        ),
        "adam" => (
            Rule::Adam {
                lr: 1e-4,
                betas: (0.9, 0.999),
                eps: 1e-8,
                step: 3,
            },
            9216 * 128,
        ),
        "sgd-nesterov" => (
            Rule::Sgd {
                lr: 1e-2,
                momentum: 0.9,
                dampening: 0.0,
                nesterov: true,
                step: 3,
            },
            3136 * 1024,
        ),
        _ => (
            Rule::Sgd {
                lr: 1e-2,
                momentum: 0.0,
                dampening: 0.0,
                nesterov: false,
                step: 3,
            },
            3136 * 1024,
        ),
    };
    let (mut p, mut g, mut a, mut b) = (ramp(n), ramp(n), vec![0.0; n], vec![0.0; n]);
    bencher.bench_local(|| update(rule, 0.0, &mut p, &mut g, &mut a, &mut b));
}

/// Dropout masks applied forward and backward: flashlight's after fc1 (64x1024, p 0.5) and
/// the tch net's after its second pool at batch 256 (256x64x12x12, p 0.25).
#[divan::bench(args = ["flash.fc1 64x1024", "tch.pool2 256x64x12x12"], sample_count = 20)]
fn dropout(bencher: divan::Bencher, which: &str) {
    let (n, keep) = match which {
        "flash.fc1 64x1024" => (64 * 1024, 0.5),
        _ => (256 * 64 * 12 * 12, 0.75),
    };
    let mask = DropoutMask { key: 42, keep };
    let scale = (1.0 / keep) as f32;
    let (x, mut y, mut dx) = (ramp(n), vec![0.0; n], vec![0.0; n]);
    bencher.counter(ItemsCount::new(n)).bench_local(|| {
        dropout_forward(&mask, scale, &x, &mut y);
        dropout_backward(&mask, scale, &x, &mut dx);
    });
}

/// Batch norm at the modern models' hot shapes, batch 128 (issue 24): `[batch, channels, plane]`.
const BATCH_NORMS: [(&str, BnShape); 4] = [
    (
        "resnet20.stage1 128x16x28x28",
        BnShape {
            batch: 128,
            channels: 16,
            plane: 784,
        },
    ),
    (
        "resnet20.stage3 128x64x7x7",
        BnShape {
            batch: 128,
            channels: 64,
            plane: 49,
        },
    ),
    (
        "speedrun.block1 256x32x28x28",
        BnShape {
            batch: 256,
            channels: 32,
            plane: 784,
        },
    ),
    (
        "resnet18.stage1 128x64x32x32",
        BnShape {
            batch: 128,
            channels: 64,
            plane: 1024,
        },
    ),
];

/// Training-mode forward: the batch's statistics, then normalisation with the fused ReLU.
#[divan::bench(args = [0, 1, 2, 3], sample_count = 20)]
fn batch_norm_fwd(bencher: divan::Bencher, which: usize) {
    let (_, s) = BATCH_NORMS[which];
    let x = ramp(s.len());
    let (w, b) = (ramp(s.channels), ramp(s.channels));
    let mut y = vec![0.0; s.len()];
    bencher.counter(ItemsCount::new(s.len())).bench_local(|| {
        let (mean, var) = batch_stats(&s, &x);
        let inv = inv_std(&var, 1e-5);
        normalise(&s, &x, &to_f32(&mean), &to_f32(&inv), &w, &b, true, &mut y);
    });
}

/// Inference's convolution, batch norm and ReLU at ResNet-20's and ResNet-18's first-stage
/// shapes (`CONVS` 4 and 8): as two passes (the convolution, then the batch norm with the ReLU
/// into a fresh output) or with the batch norm folded into the convolution's weights and bias
/// (`nn::conv2d_affine`, what `BatchNorm2d::forward_conv` runs): one pass, the ReLU fused.
#[divan::bench(args = [(4, false), (4, true), (8, false), (8, true)], sample_count = 20)]
fn conv_bn_relu_eval(bencher: divan::Bencher, (which, folded): (usize, bool)) {
    let (_, s, _) = CONVS[which];
    let (x, w) = (ramp(s.batch * s.in_image()), ramp(s.weight_len()));
    let (scale, shift) = (ramp(s.out_channels), ramp(s.out_channels));
    let zeros = vec![0.0; s.out_channels];
    let bn = BnShape {
        batch: s.batch,
        channels: s.out_channels,
        plane: s.out_h() * s.out_w(),
    };
    let len = s.batch * s.out_image();
    bencher
        .counter(ItemsCount::new(s.forward_macs()))
        .bench_local(|| {
            if folded {
                ember_kernels::cpu::fresh(len, |y| conv2d_forward(&s, &x, &w, Some(&shift), true, y))
            } else {
                let c = ember_kernels::cpu::fresh(len, |y| conv2d_forward(&s, &x, &w, None, false, y));
                ember_kernels::cpu::fresh(len, |y| {
                    normalise(&bn, &c, &zeros, &scale, &scale, &shift, true, y)
                })
            }
        });
}

/// A convolution and the training statistics of the batch norm after it, at ResNet-20's first
/// stage and the speedrun net's three blocks (`CONVS` 4, 9, 7, 10), into a fresh output as the
/// models run it: the convolution then a pass over its output (`batch_stats`), or the moments
/// of each map taken by the convolution as it writes the image (`conv2d_forward_moments`, then
/// `combine_moments`).
#[divan::bench(
    args = [(4, false), (4, true), (9, false), (9, true), (7, false), (7, true), (10, false), (10, true)],
    sample_count = 20
)]
fn conv_bn_stats(bencher: divan::Bencher, (which, moments): (usize, bool)) {
    let (_, s, _) = CONVS[which];
    let (x, w) = (ramp(s.batch * s.in_image()), ramp(s.weight_len()));
    let bn = BnShape {
        batch: s.batch,
        channels: s.out_channels,
        plane: s.pixels(),
    };
    let len = s.batch * s.out_image();
    let mut maps = vec![MapMoments::default(); s.batch * s.out_channels];
    bencher
        .counter(ItemsCount::new(s.forward_macs()))
        .bench_local(|| {
            if moments {
                let y = ember_kernels::cpu::fresh(len, |y| {
                    conv2d_forward_moments(&s, &x, &w, None, false, y, &mut maps)
                });
                (y, combine_moments(&bn, &maps))
            } else {
                let y = ember_kernels::cpu::fresh(len, |y| conv2d_forward(&s, &x, &w, None, false, y));
                let stats = batch_stats(&bn, &y);
                (y, stats)
            }
        });
}

/// The forward of a convolution followed by batch norm (training), ReLU and 2x2 max pool at the
/// speedrun net's first block (`CONVS` 9), as the one node runs it: the convolution stored
/// with its moments, then the normalise + pool pass reading it back; or (`again`) its output
/// computed again image by image for the statistics and for the normalise + pool pass
/// (`ConvImages`), never stored.
#[divan::bench(args = [false, true], sample_count = 20)]
fn conv_bn_pool_fwd(bencher: divan::Bencher, again: bool) {
    let (_, s, _) = CONVS[9];
    let (x, w) = (ramp(s.batch * s.in_image()), ramp(s.weight_len()));
    let sh = BnPoolShape::after(&s);
    let (g, beta) = (ramp(s.out_channels), ramp(s.out_channels));
    let n = sh.out_len();
    let normalise_pool = |y: Images<'_>, (mean, var): (Vec<f64>, Vec<f64>)| {
        let (mean, inv) = (to_f32(&mean), to_f32(&inv_std(&var, 1e-5)));
        let (mut z, mut argmax) = (vec![0.0; n], vec![0u32; n]);
        let x_at = ember_kernels::cpu::fresh(n, |x_at| {
            normalise_relu_pool_from(&sh, y, &mean, &inv, &g, &beta, &mut z, &mut argmax, x_at)
        });
        (z, argmax, x_at)
    };
    let images = ConvImages::recompute(&s, &x, &w, None).expect("a first layer");
    bencher
        .counter(ItemsCount::new(s.forward_macs()))
        .bench_local(|| {
            if again {
                let produce = |first: usize, y: &mut [f32]| images.images(first, y);
                let y = Images::Produce(&produce);
                normalise_pool(y, batch_stats_from(&sh.bn(), y))
            } else {
                let mut maps = vec![MapMoments::default(); s.batch * s.out_channels];
                let y = ember_kernels::cpu::fresh(s.batch * s.out_image(), |y| {
                    conv2d_forward_moments(&s, &x, &w, None, false, y, &mut maps)
                });
                normalise_pool(Images::Values(&y), combine_moments(&sh.bn(), &maps))
            }
        });
}

/// The backward of a convolution followed by batch norm, ReLU and 2x2 max pool, at the speedrun
/// net's first two blocks (`CONVS` 9, 7; the first without an input gradient, as in the model):
/// as two ops (`batch_norm_relu_pool_backward` writes the batch norm's full-size input
/// gradient, `conv2d_backward` reads it) or as the one node runs it (`bn_pool_input_grad`, then
/// `conv2d_backward_from` with the gradient produced a few images at a time in cache).
#[divan::bench(args = [(9, false), (9, true), (7, false), (7, true)], sample_count = 20)]
fn conv_bn_pool_bwd(bencher: divan::Bencher, (which, one_node): (usize, bool)) {
    let (_, s, input_grad) = CONVS[which];
    let (x, w) = (ramp(s.batch * s.in_image()), ramp(s.weight_len()));
    let y = ember_kernels::cpu::fresh(s.batch * s.out_image(), |y| {
        conv2d_forward(&s, &x, &w, None, false, y)
    });
    let sh = BnPoolShape::after(&s);
    let (g, beta) = (ramp(s.out_channels), ramp(s.out_channels));
    let (mean, var) = batch_stats(&sh.bn(), &y);
    let inv = inv_std(&var, 1e-5);
    let n = sh.out_len();
    let (mut z, mut argmax, mut x_at) = (vec![0.0; n], vec![0u32; n], vec![0.0; n]);
    normalise_relu_pool(
        &sh,
        &y,
        &to_f32(&mean),
        &to_f32(&inv),
        &g,
        &beta,
        &mut z,
        &mut argmax,
        &mut x_at,
    );
    let dz = ramp(n);
    let (mut dw, mut db, mut dg, mut dbeta) = (
        vec![0.0; s.weight_len()],
        vec![0.0; s.out_channels],
        vec![0.0; s.out_channels],
        vec![0.0; s.out_channels],
    );
    let mut dx = vec![0.0; if input_grad { x.len() } else { 0 }];
    bencher
        .counter(ItemsCount::new(s.forward_macs() * if input_grad { 2 } else { 1 }))
        .bench_local(|| {
            let dx = input_grad.then_some(&mut dx[..]);
            if one_node {
                // The node computes a first layer's output again instead of reading it.
                let again = ConvImages::recompute(&s, &x, &w, None);
                let produce_y = |first: usize, y: &mut [f32]| {
                    if let Some(again) = &again {
                        again.images(first, y)
                    }
                };
                let y = match again {
                    Some(_) => Images::Produce(&produce_y),
                    None => Images::Values(&y),
                };
                let grad = bn_pool_input_grad(
                    &sh,
                    y,
                    &mean,
                    &inv,
                    &g,
                    &dz,
                    &z,
                    &argmax,
                    &x_at,
                    Some(&mut dg),
                    Some(&mut dbeta),
                );
                let produce = |first: usize, dy: &mut [f32]| grad.images(first, dy);
                conv2d_backward_from(
                    &s,
                    &x,
                    &w,
                    Images::Produce(&produce),
                    None,
                    dx,
                    Some(&mut dw),
                    Some(&mut db),
                );
            } else {
                let dy = ember_kernels::cpu::fresh(y.len(), |dy| {
                    batch_norm_relu_pool_backward(
                        &sh,
                        &y,
                        &mean,
                        &inv,
                        &g,
                        &dz,
                        &z,
                        &argmax,
                        &x_at,
                        Some(dy),
                        Some(&mut dg),
                        Some(&mut dbeta),
                    )
                });
                conv2d_backward(&s, &x, &w, &dy, None, dx, Some(&mut dw), Some(&mut db));
            }
        });
}

/// A convolution's and the batch norm + ReLU after it's backward at ResNet-20's first stage
/// (`CONVS` 4), as two nodes run it (`batch_norm_backward` writes the convolution's output
/// gradient, `conv2d_backward` reads it) or as the one node runs it (`bn_input_grad`, then
/// `conv2d_backward_from` with the gradient produced a few images at a time in cache).
#[divan::bench(args = [(4, false), (4, true)], sample_count = 20)]
fn conv_bn_bwd(bencher: divan::Bencher, (which, one_node): (usize, bool)) {
    let (_, s, _) = CONVS[which];
    let (x, w) = (ramp(s.batch * s.in_image()), ramp(s.weight_len()));
    let y = ember_kernels::cpu::fresh(s.batch * s.out_image(), |y| {
        conv2d_forward(&s, &x, &w, None, false, y)
    });
    let sh = BnShape {
        batch: s.batch,
        channels: s.out_channels,
        plane: s.pixels(),
    };
    let (g, beta) = (ramp(s.out_channels), ramp(s.out_channels));
    let (mean, var) = batch_stats(&sh, &y);
    let inv = inv_std(&var, 1e-5);
    let mut z = vec![0.0; y.len()];
    normalise(&sh, &y, &to_f32(&mean), &to_f32(&inv), &g, &beta, true, &mut z);
    let dz = ramp(y.len());
    let (mut dw, mut db, mut dg, mut dbeta) = (
        vec![0.0; s.weight_len()],
        vec![0.0; s.out_channels],
        vec![0.0; s.out_channels],
        vec![0.0; s.out_channels],
    );
    let mut dx = vec![0.0; x.len()];
    bencher
        .counter(ItemsCount::new(2 * s.forward_macs()))
        .bench_local(|| {
            if one_node {
                let grad = bn_input_grad(
                    &sh,
                    &y,
                    &mean,
                    &inv,
                    &g,
                    &dz,
                    Some(&z),
                    Some(&mut dg),
                    Some(&mut dbeta),
                );
                let produce = |first: usize, dy: &mut [f32]| grad.images(first, dy);
                let dy = Images::Produce(&produce);
                conv2d_backward_from(&s, &x, &w, dy, None, Some(&mut dx), Some(&mut dw), Some(&mut db));
            } else {
                let dy = ember_kernels::cpu::fresh(y.len(), |dy| {
                    batch_norm_backward(
                        &sh,
                        &y,
                        &mean,
                        &inv,
                        &g,
                        &dz,
                        Some(&z),
                        Some(dy),
                        Some(&mut dg),
                        Some(&mut dbeta),
                    )
                });
                conv2d_backward(&s, &x, &w, &dy, None, Some(&mut dx), Some(&mut dw), Some(&mut db));
            }
        });
}

/// A residual block's end, `relu(normalise(x) + residual)` (training forward's second pass,
/// and the whole of inference), into a fresh output as the model runs it: not zeroed ahead.
#[divan::bench(args = [0, 1, 2, 3], sample_count = 20)]
fn batch_norm_add_relu(bencher: divan::Bencher, which: usize) {
    let (_, s) = BATCH_NORMS[which];
    let (x, r) = (ramp(s.len()), ramp(s.len()));
    let (w, b) = (ramp(s.channels), ramp(s.channels));
    let (mean, var) = batch_stats(&s, &x);
    let (mean, inv) = (to_f32(&mean), to_f32(&inv_std(&var, 1e-5)));
    bencher.counter(ItemsCount::new(s.len())).bench_local(|| {
        ember_kernels::cpu::fresh(s.len(), |y| {
            normalise_add_relu(&s, &x, &mean, &inv, &w, &b, &r, y)
        })
    });
}

/// Backward through the fused ReLU: input, scale and shift gradients.
#[divan::bench(args = [0, 1, 2, 3], sample_count = 20)]
fn batch_norm_bwd(bencher: divan::Bencher, which: usize) {
    let (_, s) = BATCH_NORMS[which];
    let (x, dy, y) = (ramp(s.len()), ramp(s.len()), ramp(s.len()));
    let w = ramp(s.channels);
    let (mean, var) = batch_stats(&s, &x);
    let inv = inv_std(&var, 1e-5);
    let mut dx = vec![0.0; s.len()];
    let (mut dw, mut db) = (vec![0.0; s.channels], vec![0.0; s.channels]);
    bencher.counter(ItemsCount::new(s.len())).bench_local(|| {
        batch_norm_backward(
            &s,
            &x,
            &mean,
            &inv,
            &w,
            &dy,
            Some(&y),
            Some(&mut dx),
            Some(&mut dw),
            Some(&mut db),
        )
    });
}
