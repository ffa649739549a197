use serde::{Deserialize, Serialize};

/// `torch.optim.lr_scheduler.StepLR`, stepped once per epoch: the learning rate is multiplied
/// by `gamma` every `step_size` epochs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLr {
    pub base_lr: f64,
    pub gamma: f64,
    pub step_size: usize,
}

impl StepLr {
    /// The learning rate used during epoch `epoch` (0-based), i.e. after `epoch` calls of
    /// `scheduler.step()`. PyTorch multiplies the previous rate by `gamma` at each decay
    /// (its "chainable" form), so the product is formed the same way, left to right in `f64`,
    /// to give the same bits rather than `base_lr * gamma.powi(k)`.
    pub fn lr(&self, epoch: usize) -> f64 {
        let decays = epoch / self.step_size;
        (0..decays).fold(self.base_lr, |lr, _| lr * self.gamma)
    }
}
