//! Learning-rate schedules with `torch.optim.lr_scheduler`'s arithmetic: the same `f64`
//! operations in the same order, so that a rate is the same bits as PyTorch's.

use serde::{Deserialize, Serialize};
use std::f64::consts::PI;

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

/// How the rate moves between two values over one phase of a cycle (`anneal_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Anneal {
    /// Half a cosine wave (`OneCycleLR._annealing_cos`).
    Cos,
    /// A straight line (`OneCycleLR._annealing_linear`).
    Linear,
}

impl Anneal {
    fn between(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            Self::Cos => {
                let cos_out = (PI * pct).cos() + 1.0;
                end + (start - end) / 2.0 * cos_out
            }
            Self::Linear => (end - start) * pct + start,
        }
    }
}

/// `torch.optim.lr_scheduler.OneCycleLR`'s settings other than `max_lr` (the run's `--lr`) and
/// `total_steps` (the run's steps), with PyTorch's defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OneCycle {
    pub pct_start: f64,
    pub anneal: Anneal,
    /// Whether SGD's momentum (Adam's first beta) moves against the rate, between
    /// `max_momentum` and `base_momentum`.
    pub cycle_momentum: bool,
    pub base_momentum: f64,
    pub max_momentum: f64,
    /// `initial_lr = max_lr / div_factor`.
    pub div_factor: f64,
    /// `min_lr = initial_lr / final_div_factor`.
    pub final_div_factor: f64,
    pub three_phase: bool,
}

impl Default for OneCycle {
    fn default() -> Self {
        Self {
            pct_start: 0.3,
            anneal: Anneal::Cos,
            cycle_momentum: true,
            base_momentum: 0.85,
            max_momentum: 0.95,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
}

/// How the learning rate moves during a run, saved in `config.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Schedule {
    /// `StepLR` once per epoch, from the run's `gamma` and `step_size`.
    #[default]
    Step,
    /// `OneCycleLR` stepped after every optimizer step, over all the run's steps.
    OneCycle(OneCycle),
    /// A linear warm-up over `warmup_steps` steps, then half a cosine down to 0 at the run's last
    /// step, stepped every optimizer step: PyTorch's `LambdaLR` with
    /// `lambda s: (s + 1) / warmup_steps if s < warmup_steps else
    ///  0.5 * (1 + math.cos(math.pi * (s - warmup_steps) / (total_steps - warmup_steps)))`.
    WarmupCosine { warmup_steps: usize },
}

impl Schedule {
    /// The name `--schedule` takes.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Step => "step",
            Self::OneCycle(_) => "one-cycle",
            Self::WarmupCosine { .. } => "warmup-cosine",
        }
    }
}

/// The learning rate of one optimizer step, and SGD's momentum (Adam's first beta) where the
/// schedule sets it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hyper {
    pub lr: f64,
    pub momentum: Option<f64>,
}

/// A [`Schedule`] for one run: its base rate and length fixed.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSchedule {
    schedule: Schedule,
    step_lr: StepLr,
    total_steps: usize,
}

impl RunSchedule {
    /// `schedule` over `epochs` epochs of `steps_per_epoch` steps from `lr` (OneCycle's
    /// `max_lr`); `gamma` and `step_size` serve [`Schedule::Step`].
    pub fn new(schedule: Schedule, step_lr: StepLr, epochs: usize, steps_per_epoch: usize) -> Self {
        Self {
            schedule,
            step_lr,
            total_steps: epochs * steps_per_epoch,
        }
    }

    /// The settings of optimizer step `global_step` (0-based over the run), in epoch `epoch`.
    pub fn at(&self, epoch: usize, global_step: usize) -> Hyper {
        let base = self.step_lr.base_lr;
        match &self.schedule {
            Schedule::Step => Hyper {
                lr: self.step_lr.lr(epoch),
                momentum: None,
            },
            Schedule::WarmupCosine { warmup_steps } => {
                let (s, w, total) = (global_step as f64, *warmup_steps as f64, self.total_steps as f64);
                let factor = if global_step < *warmup_steps {
                    (s + 1.0) / w
                } else {
                    0.5 * (1.0 + (PI * (s - w) / (total - w)).cos())
                };
                Hyper {
                    lr: base * factor,
                    momentum: None,
                }
            }
            Schedule::OneCycle(c) => one_cycle(c, base, self.total_steps, global_step),
        }
    }
}

/// `OneCycleLR.get_lr` at `last_epoch == step`, line by line.
fn one_cycle(c: &OneCycle, max_lr: f64, total_steps: usize, step: usize) -> Hyper {
    let initial_lr = max_lr / c.div_factor;
    let min_lr = initial_lr / c.final_div_factor;
    let total = total_steps as f64;
    // (end_step, start_lr, end_lr, start_momentum, end_momentum)
    let (top, bottom) = (c.max_momentum, c.base_momentum);
    let phases: Vec<(f64, f64, f64, f64, f64)> = if c.three_phase {
        vec![
            (c.pct_start * total - 1.0, initial_lr, max_lr, top, bottom),
            (2.0 * c.pct_start * total - 2.0, max_lr, initial_lr, bottom, top),
            (total - 1.0, initial_lr, min_lr, top, top),
        ]
    } else {
        vec![
            (c.pct_start * total - 1.0, initial_lr, max_lr, top, bottom),
            (total - 1.0, max_lr, min_lr, bottom, top),
        ]
    };
    let step_num = step as f64;
    let mut start_step = 0.0;
    for (i, &(end_step, start_lr, end_lr, start_m, end_m)) in phases.iter().enumerate() {
        if step_num <= end_step || i == phases.len() - 1 {
            let pct = (step_num - start_step) / (end_step - start_step);
            return Hyper {
                lr: c.anneal.between(start_lr, end_lr, pct),
                momentum: c.cycle_momentum.then(|| c.anneal.between(start_m, end_m, pct)),
            };
        }
        start_step = end_step;
    }
    unreachable!("the last phase always matches")
}
