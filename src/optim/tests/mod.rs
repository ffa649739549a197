//! Checks against `torch.optim`, numbers from `benches/pytorch/optim_reference.py`.

#[allow(dead_code)]
mod torch_reference;

use burn::backend::NdArray;
use burn::optim::SimpleOptimizer;
use burn::tensor::{Tensor, TensorData};

use super::*;
use torch_reference as reference;

type TB = NdArray<f32>;

fn tensor(values: &[f32]) -> Tensor<TB, 1> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), &Default::default())
}

/// Runs three steps of `config` from PyTorch's starting point and compares every step.
fn assert_matches_torch(config: OptimizerConfig, lr: f64, expected: &[[f32; 6]; 3], name: &str) {
    let optim = config.build();
    let mut param = tensor(&reference::PARAM);
    let mut state = None;
    // Largest magnitude each component has taken so far, torch's trajectory.
    let mut scale: Vec<f32> = reference::PARAM.iter().map(|v| v.abs()).collect();
    for (step, (grad, want)) in reference::GRADS.iter().zip(expected).enumerate() {
        let (p, s) = SimpleOptimizer::<TB>::step(&optim, lr, param, tensor(grad), state);
        param = p;
        state = s;
        let got: Vec<f32> = param.clone().into_data().to_vec().unwrap();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            // Four ulps of the component's largest magnitude so far: PyTorch's kernels may fuse
            // a multiply-add where burn rounds twice, which shows where an update cancels the
            // parameter (SGD with weight decay, step 2, param[4]: 0.040005 - 0.040020), and
            // that one-ulp difference carries into later steps.
            scale[i] = scale[i].max(w.abs());
            let tol = 4.0 * f32::EPSILON * scale[i];
            assert!(
                (g - w).abs() <= tol,
                "{name} step {}: param[{i}] = {g:e}, torch has {w:e} (diff {:e})",
                step + 1,
                (g - w).abs()
            );
        }
    }
    assert_eq!(state.unwrap().step, 3);
}

fn with_decay(kind: OptimizerKind, weight_decay: f64) -> OptimizerConfig {
    OptimizerConfig {
        weight_decay,
        ..OptimizerConfig::new(kind)
    }
}

#[test]
fn sgd_matches_torch() {
    assert_matches_torch(OptimizerConfig::new(OptimizerKind::Sgd), 0.1, &reference::SGD, "SGD");
    assert_matches_torch(with_decay(OptimizerKind::Sgd, 0.05), 0.01, &reference::SGD_WD, "SGD wd");
}

#[test]
fn adam_matches_torch() {
    assert_matches_torch(OptimizerConfig::new(OptimizerKind::Adam), 1e-3, &reference::ADAM, "Adam");
    assert_matches_torch(with_decay(OptimizerKind::Adam, 0.1), 0.05, &reference::ADAM_WD, "Adam wd");
}

#[test]
fn adadelta_matches_torch() {
    assert_matches_torch(OptimizerConfig::new(OptimizerKind::Adadelta), 1.0, &reference::ADADELTA, "Adadelta");
    assert_matches_torch(with_decay(OptimizerKind::Adadelta, 0.05), 0.5, &reference::ADADELTA_WD, "Adadelta wd");
}

#[test]
fn defaults_are_pytorchs() {
    assert_eq!(OptimizerConfig::new(OptimizerKind::Adam).eps(), 1e-8);
    assert_eq!(OptimizerConfig::new(OptimizerKind::Adadelta).eps(), 1e-6);
    let adam = OptimizerConfig::new(OptimizerKind::Adam);
    assert_eq!((adam.betas, adam.weight_decay), ((0.9, 0.999), 0.0));
    assert_eq!(OptimizerConfig::new(OptimizerKind::Adadelta).rho, 0.9);
}

#[test]
fn step_lr_matches_torch_bit_for_bit() {
    let example = StepLr { base_lr: 1.0, gamma: 0.7, step_size: 1 };
    let ours: Vec<f64> = (0..14).map(|e| example.lr(e)).collect();
    assert_eq!(ours, reference::STEP_LR_EXAMPLE);
    let every3 = StepLr { base_lr: 0.1, gamma: 0.5, step_size: 3 };
    let ours: Vec<f64> = (0..10).map(|e| every3.lr(e)).collect();
    assert_eq!(ours, reference::STEP_LR_3);
}
