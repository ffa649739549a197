//! `torch.optim`'s single-tensor update rules as one in-place pass over each parameter.
//!
//! Each loop performs, per element, exactly the `f32` operations, in exactly the order, of the
//! tensor-op version in ember's `optim` module (which follows `torch.optim` line by line), with
//! the `f64` hyper-parameters rounded to `f32` where the tensor version rounds them. Rust never
//! contracts `a * b + c` into a fused multiply-add, so the results are bit-identical to it.
//! Elements are independent, so splitting the work across threads cannot change them.

use rayon::prelude::*;

/// Elements per parallel task: large enough that small tensors (biases) stay on one thread.
const CHUNK: usize = 1 << 15;

/// The update rule and its hyper-parameters for one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// `torch.optim.SGD`; `step` is 1 on the first update, when the momentum buffer starts as a
    /// copy of the gradient. Momentum 0 keeps no buffer.
    Sgd {
        lr: f64,
        momentum: f64,
        dampening: f64,
        nesterov: bool,
        step: usize,
    },
    /// `torch.optim.Adam`; `step` is 1 on the first update.
    Adam {
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        step: usize,
    },
    /// `torch.optim.Adadelta`.
    Adadelta { lr: f64, rho: f64, eps: f64 },
}

impl Rule {
    /// How many state buffers the rule keeps: `first` only (SGD with momentum), or `first` and
    /// `second`.
    pub fn buffers(&self) -> usize {
        match self {
            Rule::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
            Rule::Adam { .. } | Rule::Adadelta { .. } => 2,
        }
    }
}

/// Updates `param` in place from `grad` (itself updated in place by the weight decay), and the
/// rule's state `first`/`second` (Adam: `exp_avg`/`exp_avg_sq`; Adadelta:
/// `square_avg`/`acc_delta`; SGD: `momentum_buffer`/unused). Unused buffers may be empty slices.
pub fn update(
    rule: Rule,
    weight_decay: f64,
    param: &mut [f32],
    grad: &mut [f32],
    first: &mut [f32],
    second: &mut [f32],
) {
    let n = param.len();
    assert_eq!(grad.len(), n, "optimizer: gradient length");
    if rule.buffers() >= 1 {
        assert_eq!(first.len(), n, "optimizer: first state length");
    }
    if rule.buffers() >= 2 {
        assert_eq!(second.len(), n, "optimizer: second state length");
    }
    let wd = weight_decay as f32;
    let decay = |p: &[f32], g: &mut [f32]| {
        if weight_decay != 0.0 {
            // grad = grad.add(param.mul_scalar(weight_decay))
            for (g, &p) in g.iter_mut().zip(p) {
                *g += p * wd;
            }
        }
    };
    match rule {
        Rule::Sgd {
            lr,
            momentum,
            dampening,
            nesterov,
            step,
        } if momentum != 0.0 => {
            let neg_lr = (-lr) as f32;
            let momentum = momentum as f32;
            let one_minus_dampening = (1.0 - dampening) as f32;
            param
                .par_chunks_mut(CHUNK)
                .zip(grad.par_chunks_mut(CHUNK))
                .zip(first.par_chunks_mut(CHUNK))
                .for_each(|((p, g), buf)| {
                    decay(p, g);
                    for ((p, &g), b) in p.iter_mut().zip(g.iter()).zip(buf) {
                        // buf = clone(grad) on the first step, then
                        // buf = buf * momentum + grad * (1 - dampening)
                        *b = if step == 1 {
                            g
                        } else {
                            *b * momentum + g * one_minus_dampening
                        };
                        // nesterov: grad = grad + buf * momentum; else grad = buf
                        let g = if nesterov { g + *b * momentum } else { *b };
                        *p += g * neg_lr;
                    }
                });
        }
        Rule::Sgd { lr, .. } => {
            let neg_lr = (-lr) as f32;
            param
                .par_chunks_mut(CHUNK)
                .zip(grad.par_chunks_mut(CHUNK))
                .for_each(|(p, g)| {
                    decay(p, g);
                    for (p, &g) in p.iter_mut().zip(g.iter()) {
                        *p += g * neg_lr;
                    }
                });
        }
        Rule::Adam {
            lr,
            betas: (beta1, beta2),
            eps,
            step,
        } => {
            let one_minus_beta1 = (1.0 - beta1) as f32;
            let beta2_f = beta2 as f32;
            let one_minus_beta2 = (1.0 - beta2) as f32;
            let bias_correction1 = 1.0 - beta1.powi(step as i32);
            let bias_correction2 = 1.0 - beta2.powi(step as i32);
            let neg_step_size = (-(lr / bias_correction1)) as f32;
            let bc2_sqrt = bias_correction2.sqrt() as f32;
            let eps = eps as f32;
            param
                .par_chunks_mut(CHUNK)
                .zip(grad.par_chunks_mut(CHUNK))
                .zip(first.par_chunks_mut(CHUNK).zip(second.par_chunks_mut(CHUNK)))
                .for_each(|((p, g), (m, v))| {
                    decay(p, g);
                    for (((p, &g), m), v) in p.iter_mut().zip(g.iter()).zip(m).zip(v) {
                        // exp_avg = exp_avg + (grad - exp_avg) * (1 - beta1)
                        *m += (g - *m) * one_minus_beta1;
                        // exp_avg_sq = exp_avg_sq * beta2 + (grad * (1 - beta2)) * grad
                        *v = *v * beta2_f + g * one_minus_beta2 * g;
                        let denom = v.sqrt() / bc2_sqrt + eps;
                        // param = param + (exp_avg * -step_size) / denom
                        *p += *m * neg_step_size / denom;
                    }
                });
        }
        Rule::Adadelta { lr, rho, eps } => {
            let rho_f = rho as f32;
            let one_minus_rho = (1.0 - rho) as f32;
            let eps = eps as f32;
            let neg_lr = (-lr) as f32;
            param
                .par_chunks_mut(CHUNK)
                .zip(grad.par_chunks_mut(CHUNK))
                .zip(first.par_chunks_mut(CHUNK).zip(second.par_chunks_mut(CHUNK)))
                .for_each(|((p, g), (sq, acc))| {
                    decay(p, g);
                    for (((p, &g), sq), acc) in p.iter_mut().zip(g.iter()).zip(sq).zip(acc) {
                        // square_avg = square_avg * rho + (grad * (1 - rho)) * grad
                        *sq = *sq * rho_f + g * one_minus_rho * g;
                        let std = (*sq + eps).sqrt();
                        // delta = sqrt(acc_delta + eps) / std * grad
                        let delta = (*acc + eps).sqrt() / std * g;
                        // acc_delta = acc_delta * rho + (delta * (1 - rho)) * delta
                        *acc = *acc * rho_f + delta * one_minus_rho * delta;
                        *p += delta * neg_lr;
                    }
                });
        }
    }
}
