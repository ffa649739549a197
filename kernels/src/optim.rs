//! The fused optimizer updates ([`crate::cpu::optim`]) on burn tensors.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

pub use crate::cpu::optim::Rule;

/// Whether [`update`] takes tensors like `param`: `f32` on flex (optimizers step the inner,
/// non-autodiff backend).
pub fn supports<B: Backend, const D: usize>(param: &Tensor<B, D>) -> bool {
    crate::is_flex::<B>() && param.dtype() == DType::F32
}

/// A rule's state buffers (see [`Rule::buffers`]); `None` where the rule keeps none, or before
/// its first step.
pub type Buffers<B, const D: usize> = (Option<Tensor<B, D>>, Option<Tensor<B, D>>);

/// One step of `rule` on `param`, in place where the buffers are not shared. `state` is the
/// rule's buffers from the last step (`None` on the first: zeros, as `torch.optim` starts);
/// returns the new parameter and the buffers the rule keeps.
///
/// # Panics
/// When [`supports`] is false for `param`.
pub fn update<B: Backend, const D: usize>(
    rule: Rule,
    weight_decay: f64,
    param: Tensor<B, D>,
    grad: Tensor<B, D>,
    state: Buffers<B, D>,
) -> (Tensor<B, D>, Buffers<B, D>) {
    assert!(
        supports(&param),
        "optim::update: this backend or dtype has no fused update"
    );
    #[cfg(feature = "flex")]
    {
        crate::flex::optim_update(rule, weight_decay, param, grad, state)
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (rule, weight_decay, grad, state);
        unreachable!("supports() is false without the flex feature")
    }
}
