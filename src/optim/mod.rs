//! Optimizers and learning-rate schedules with PyTorch's semantics, operation for operation.
//!
//! burn has no Adadelta, and its Adam defaults differ from PyTorch's (epsilon 1e-5 vs 1e-8), so
//! ember carries one [`SimpleOptimizer`] that follows `torch.optim`'s single-tensor code paths
//! for SGD, Adam and Adadelta. One state record type serves all three, so checkpoints and resume
//! do not depend on which rule a recipe picked.

mod schedule;

pub use schedule::{Anneal, Hyper, OneCycle, RunSchedule, Schedule, StepLr};

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{LearningRate, SimpleOptimizer};
use burn::record::Record;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use clap::ValueEnum;
use ember_kernels::optim::Rule;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The update rules ember implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// torch.optim.SGD, with momentum, dampening and Nesterov as set (none by default).
    Sgd,
    /// torch.optim.Adam (betas 0.9, 0.999; eps 1e-8).
    Adam,
    /// torch.optim.Adadelta (rho 0.9, eps 1e-6).
    Adadelta,
}

/// Hyper-parameters of one optimizer, PyTorch's defaults unless set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    pub kind: OptimizerKind,
    /// L2 penalty added to the gradient, as `torch.optim`'s `weight_decay`.
    pub weight_decay: f64,
    /// Adam's `betas`.
    pub betas: (f64, f64),
    /// Adadelta's `rho`.
    pub rho: f64,
    /// Adam's or Adadelta's `eps`; `None` takes PyTorch's default for the rule.
    pub eps: Option<f64>,
    /// SGD's `momentum` (0: no momentum buffer). A schedule may change it per step
    /// ([`TorchOptim::set_momentum`]), as `OneCycleLR` with `cycle_momentum` does.
    #[serde(default)]
    pub momentum: f64,
    /// SGD's `dampening`.
    #[serde(default)]
    pub dampening: f64,
    /// SGD's `nesterov`.
    #[serde(default)]
    pub nesterov: bool,
    /// Leave 1-D parameters (biases, BatchNorm's weight and bias) out of the weight decay, as a
    /// PyTorch recipe does with two parameter groups split on `p.ndim <= 1`.
    #[serde(default)]
    pub no_decay_1d: bool,
}

impl OptimizerConfig {
    pub fn new(kind: OptimizerKind) -> Self {
        Self {
            kind,
            weight_decay: 0.0,
            betas: (0.9, 0.999),
            rho: 0.9,
            eps: None,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            no_decay_1d: false,
        }
    }

    pub fn eps(&self) -> f64 {
        self.eps.unwrap_or(match self.kind {
            OptimizerKind::Sgd => 0.0,
            OptimizerKind::Adam => 1e-8,
            OptimizerKind::Adadelta => 1e-6,
        })
    }

    pub fn build(&self) -> TorchOptim {
        TorchOptim {
            kind: self.kind,
            weight_decay: self.weight_decay,
            betas: self.betas,
            rho: self.rho,
            eps: self.eps(),
            momentum: Arc::new(AtomicU64::new(
                match self.kind {
                    OptimizerKind::Adam => self.betas.0,
                    _ => self.momentum,
                }
                .to_bits(),
            )),
            dampening: self.dampening,
            nesterov: self.nesterov,
            no_decay_1d: self.no_decay_1d,
        }
    }

    /// The optimizer for a whole module, stepping every parameter.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> Optimizer<M, B> {
        OptimizerAdaptor::from(self.build())
    }
}

/// ember's optimizer over a module `M`.
pub type Optimizer<M, B> = OptimizerAdaptor<TorchOptim, M, B>;

/// One of `torch.optim`'s update rules, applied per parameter tensor.
#[derive(Clone, Debug)]
pub struct TorchOptim {
    kind: OptimizerKind,
    weight_decay: f64,
    betas: (f64, f64),
    rho: f64,
    eps: f64,
    /// SGD's momentum or Adam's first beta (what `OneCycleLR`'s `cycle_momentum` moves) as
    /// `f64` bits, shared so that a schedule can set it between steps: burn's
    /// `OptimizerAdaptor` only lends the rule by `&`.
    momentum: Arc<AtomicU64>,
    dampening: f64,
    nesterov: bool,
    no_decay_1d: bool,
}

impl TorchOptim {
    /// SGD's momentum (Adam's first beta) for the following steps.
    pub fn set_momentum(&self, momentum: f64) {
        self.momentum.store(momentum.to_bits(), Ordering::Relaxed);
    }

    pub fn momentum(&self) -> f64 {
        f64::from_bits(self.momentum.load(Ordering::Relaxed))
    }
}

/// Per-parameter state. For Adam `first`/`second` are `exp_avg`/`exp_avg_sq`; for Adadelta
/// `square_avg`/`acc_delta`; SGD keeps its `momentum_buffer` in `first` when it has momentum.
#[derive(Record, Clone)]
pub struct TorchOptimState<B: Backend, const D: usize> {
    pub step: usize,
    pub first: Option<Tensor<B, D>>,
    pub second: Option<Tensor<B, D>>,
}

impl<B: Backend> SimpleOptimizer<B> for TorchOptim {
    type State<const D: usize> = TorchOptimState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        param: Tensor<B, D>,
        mut grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let step = state.as_ref().map_or(0, |s| s.step) + 1;
        let weight_decay = if D == 1 && self.no_decay_1d {
            0.0
        } else {
            self.weight_decay
        };
        let momentum = self.momentum();
        if ember_kernels::optim::supports(&param) {
            // One in-place pass per parameter with the same f32 operations in the same order as
            // the tensor ops below: bit-identical results, one read and write of each buffer.
            let rule = match self.kind {
                OptimizerKind::Sgd => Rule::Sgd {
                    lr,
                    momentum,
                    dampening: self.dampening,
                    nesterov: self.nesterov,
                    step,
                },
                OptimizerKind::Adam => Rule::Adam {
                    lr,
                    betas: (momentum, self.betas.1),
                    eps: self.eps,
                    step,
                },
                OptimizerKind::Adadelta => Rule::Adadelta {
                    lr,
                    rho: self.rho,
                    eps: self.eps,
                },
            };
            let buffers = state.map_or((None, None), |s| (s.first, s.second));
            let (param, (first, second)) =
                ember_kernels::optim::update(rule, weight_decay, param, grad, buffers);
            return (param, Some(TorchOptimState { step, first, second }));
        }
        if weight_decay != 0.0 {
            grad = grad.add(param.clone().mul_scalar(weight_decay));
        }
        if self.kind == OptimizerKind::Sgd {
            let first = if momentum == 0.0 {
                None
            } else {
                let buf = match state.and_then(|s| s.first) {
                    // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                    Some(buf) if step > 1 => buf
                        .mul_scalar(momentum)
                        .add(grad.clone().mul_scalar(1.0 - self.dampening)),
                    // torch.clone(grad).detach()
                    _ => grad.clone(),
                };
                grad = if self.nesterov {
                    // grad.add(buf, alpha=momentum)
                    grad.add(buf.clone().mul_scalar(momentum))
                } else {
                    buf.clone()
                };
                Some(buf)
            };
            // param.add_(grad, alpha=-lr)
            let param = param.add(grad.mul_scalar(-lr));
            let state = TorchOptimState {
                step,
                first,
                second: None,
            };
            return (param, Some(state));
        }
        // torch.optim creates its buffers as zeros on the first step.
        let zeros = || param.zeros_like();
        let (first, second) = match state {
            Some(TorchOptimState {
                first: Some(f),
                second: Some(s),
                ..
            }) => (f, s),
            _ => (zeros(), zeros()),
        };
        match self.kind {
            OptimizerKind::Sgd => unreachable!("SGD returned above"),
            OptimizerKind::Adam => {
                let (beta1, beta2) = (momentum, self.betas.1);
                // exp_avg.lerp_(grad, 1 - beta1): weight < 0.5 takes the `self + w * (end - self)` branch.
                let exp_avg = first.clone().add(grad.clone().sub(first).mul_scalar(1.0 - beta1));
                // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                let exp_avg_sq = second
                    .mul_scalar(beta2)
                    .add(grad.clone().mul_scalar(1.0 - beta2).mul(grad));
                let bias_correction1 = 1.0 - beta1.powi(step as i32);
                let bias_correction2 = 1.0 - beta2.powi(step as i32);
                let step_size = lr / bias_correction1;
                let denom = exp_avg_sq
                    .clone()
                    .sqrt()
                    .div_scalar(bias_correction2.sqrt())
                    .add_scalar(self.eps);
                // param.addcdiv_(exp_avg, denom, value=-step_size)
                let param = param.add(exp_avg.clone().mul_scalar(-step_size).div(denom));
                let state = TorchOptimState {
                    step,
                    first: Some(exp_avg),
                    second: Some(exp_avg_sq),
                };
                (param, Some(state))
            }
            OptimizerKind::Adadelta => {
                let rho = self.rho;
                // square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
                let square_avg = first
                    .mul_scalar(rho)
                    .add(grad.clone().mul_scalar(1.0 - rho).mul(grad.clone()));
                let std = square_avg.clone().add_scalar(self.eps).sqrt();
                // delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
                let delta = second.clone().add_scalar(self.eps).sqrt().div(std).mul(grad);
                // acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
                let acc_delta = second
                    .mul_scalar(rho)
                    .add(delta.clone().mul_scalar(1.0 - rho).mul(delta.clone()));
                // param.add_(delta, alpha=-lr)
                let param = param.add(delta.mul_scalar(-lr));
                let state = TorchOptimState {
                    step,
                    first: Some(square_avg),
                    second: Some(acc_delta),
                };
                (param, Some(state))
            }
        }
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        TorchOptimState {
            step: state.step,
            first: state.first.map(|t| t.to_device(device)),
            second: state.second.map(|t| t.to_device(device)),
        }
    }
}

#[cfg(test)]
mod tests;
