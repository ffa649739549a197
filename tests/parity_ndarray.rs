//! ember against PyTorch on the ndarray backend (see tests/common/parity.rs for the method).

#[path = "common/parity.rs"]
mod parity;

use burn::backend::{Autodiff, NdArray};
use ember::model::ModelKind;
use parity::{assert_parity, check, EXACT};

// ndarray runs in f64. In f32 it fails the gradient bound on conv1.bias (1.2e-4 to 2.0e-4,
// varying run to run, against PyTorch's own f32 error of 4e-6 from the f64 result): burn
// computes a convolution's bias gradient as one `sum_dim` over batch x height x width
// (21,632 terms for conv1) and burn-ndarray accumulates that sum sequentially in f32.
// In f64 ndarray is a near-exact reference, so these tests check ember's models and
// optimizers against PyTorch without that rounding; `parity_every_builtin_model_flex` checks the f32
// backend ember trains with, under the same bounds.
type Reference = Autodiff<NdArray<f64>>;

/// ndarray's float64 convolutions are slow: ResNet-18 (0.56 GMACs an image) takes 384 s here
/// on the 2-core VM, ResNet-20 28 s. Models above this many MACs an image are replayed by
/// `parity_large_models_ndarray` (ignored: `cargo test --release --test parity_ndarray --
/// --ignored`), and on float32 by tests/parity.rs like every other.
const LARGE_MACS: u64 = 200_000_000;

fn replay_kinds(large: bool) -> Vec<&'static str> {
    let mut replayed = Vec::new();
    for kind in <ModelKind as clap::ValueEnum>::value_variants() {
        if (kind.forward_macs_per_image() > LARGE_MACS) != large {
            continue;
        }
        let start = std::time::Instant::now();
        assert_parity::<Reference>(*kind, EXACT, &Default::default());
        eprintln!("{}: {:.1} s", kind.name(), start.elapsed().as_secs_f64());
        replayed.push(kind.name());
    }
    replayed
}

/// Every model of [`ModelKind`] (its variants, not a list here) up to [`LARGE_MACS`]: the seed
/// CNNs; batch norm (train mode, running statistics), residual blocks with projections, global
/// average pooling and Nesterov SGD with weight decay on the weights only (ResNet-20); the
/// speedrun net. A fixture missing fails.
#[test]
fn parity_every_model_kind_ndarray() {
    let replayed = replay_kinds(false);
    assert!(replayed.len() >= 5, "{replayed:?}");
}

/// The models above [`LARGE_MACS`] (ResNet-18: 384 s).
#[test]
#[ignore = "ResNet-18 in float64 on ndarray takes about 6 minutes; tests/parity.rs replays it on float32"]
fn parity_large_models_ndarray() {
    let replayed = replay_kinds(true);
    assert!(replayed.contains(&"resnet18"), "{replayed:?}");
}

#[test]
fn parity_check_names_the_first_diverging_tensor() {
    // TchNet's weights and batch through PytorchExampleNet (same shapes, a ReLU after conv2 and
    // log_softmax): a wrong model must fail at the first output.
    let err = check::<Reference>(
        "tch-net",
        ModelKind::PytorchExampleNet,
        EXACT,
        &Default::default(),
    )
    .unwrap_err();
    assert!(err.starts_with("logits: relative error"), "{err}");
}
