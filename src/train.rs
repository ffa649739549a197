//! The training loop, written once for every model and backend.
//!
//! The whole dataset is uploaded to the device before the first step. Each epoch draws an index
//! permutation from `(seed, epoch)` on the host (a few hundred KB), uploads it, and gathers each
//! batch on the device with `select`; no image crosses the host-device boundary after start-up.
//! Losses and accuracy counts accumulate on the device and are read once per epoch, so the
//! device is only synchronised where a number is reported.

use std::time::Instant;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsParams, Optimizer as _};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use ember_models::{Classifier, Output};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::augment::DeviceDraws;
use crate::config::{ConfigError, TrainConfig};
use crate::data::{indices, Data, DeviceSplit};
use crate::model::{EmberModel, Trainable};
use crate::optim::{Optimizer, RunSchedule};
use crate::progress::Progress;

/// Mean negative log-likelihood of `targets` under the model's output; cross-entropy when the
/// output is logits. Matches `F.nll_loss` / `F.cross_entropy` with `reduction="mean"`, and
/// `F.cross_entropy`'s `label_smoothing` (0: none): `(1 - s) * nll + s / classes * mean(-sum of
/// the log-probabilities)`, the terms in ATen's order.
///
/// # Shapes
/// - `output`: `[batch, classes]`
/// - `targets`: `[batch]`
/// - returns `[1]`
pub fn loss<B: Backend>(
    output: Tensor<B, 2>,
    kind: Output,
    targets: Tensor<B, 1, Int>,
    label_smoothing: f64,
) -> Tensor<B, 1> {
    let [batch, classes] = output.dims();
    let log_probs = log_probs(output, kind);
    let nll = nll_of(log_probs.clone(), targets).div_scalar(batch as f64);
    if label_smoothing == 0.0 {
        return nll;
    }
    let smooth = log_probs.sum().neg().div_scalar(batch as f64); // mean over the batch of -sum_c
    nll.mul_scalar(1.0 - label_smoothing)
        .add(smooth.mul_scalar(label_smoothing / classes as f64))
}

fn log_probs<B: Backend>(output: Tensor<B, 2>, kind: Output) -> Tensor<B, 2> {
    match kind {
        Output::LogProbs => output,
        Output::Logits => log_softmax(output, 1),
    }
}

/// Summed negative log-likelihood of `targets`, `[1]`.
fn nll_of<B: Backend>(log_probs: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    log_probs.gather(1, targets.unsqueeze_dim(1)).sum().neg()
}

/// Summed negative log-likelihood, `[1]`.
fn nll_sum<B: Backend>(output: Tensor<B, 2>, kind: Output, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    nll_of(log_probs(output, kind), targets)
}

/// The train/valid/test splits of a run, on the device (inner backend: no autodiff graph).
pub struct Splits<B: Backend> {
    pub train: DeviceSplit<B>,
    pub valid: Option<DeviceSplit<B>>,
    pub test: DeviceSplit<B>,
}

impl<B: Backend> Splits<B> {
    /// Holds out the first `valid_size` training images, keeps `limit_train` of the rest, and
    /// uploads all three splits.
    pub fn upload(data: &Data, config: &TrainConfig, device: &B::Device) -> Result<Self, ConfigError> {
        config.check_train_size(data.train.len())?;
        let (valid, mut train) = data.train.clone().split_at(config.valid_size);
        if let Some(n) = config.limit_train {
            train.truncate(n);
        }
        let mut test = data.test.clone();
        if let Some(n) = config.limit_test {
            test.truncate(n);
        }
        let norm = &config.normalization;
        Ok(Self {
            train: DeviceSplit::upload(&train, norm, device),
            valid: (!valid.is_empty()).then(|| DeviceSplit::upload(&valid, norm, device)),
            test: DeviceSplit::upload(&test, norm, device),
        })
    }
}

pub use crate::seed::mix_seed;

/// Seed of epoch `epoch`'s shuffle.
pub fn epoch_seed(seed: u64, epoch: usize) -> u64 {
    mix_seed(seed, epoch as u64)
}

/// Seed of the dropout masks of optimizer step `global_step`.
pub fn step_seed(seed: u64, global_step: usize) -> u64 {
    mix_seed(seed ^ 0xD1B5_4A32_D192_ED03, global_step as u64)
}

/// The order in which epoch `epoch` visits `len` training examples.
pub fn epoch_permutation(seed: u64, epoch: usize, len: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(epoch_seed(seed, epoch)));
    order
}

/// A new built-in model for `config` (one of [`crate::model::ModelKind`]'s), its parameters
/// drawn from `config.seed`; [`init`] for any model.
///
/// # Panics
/// When `config.model` names no built-in model.
pub fn init_model<B: Backend>(config: &TrainConfig, device: &B::Device) -> crate::model::Model<B> {
    let kind = crate::model::ModelKind::from_name(config.model.name())
        .unwrap_or_else(|| panic!("{} is not one of ember's built-in models", config.model));
    init::<B, _>(&kind, config, device)
}

/// `model` for `config`'s images and classes, to load a record into (nothing seeded or drawn).
pub fn init_unseeded<B: Backend, D: EmberModel>(
    model: &D,
    config: &TrainConfig,
    device: &B::Device,
) -> D::Net<B> {
    model.init::<B>(config.input, config.num_classes(), device)
}

/// A new `model` for `config`'s images and classes, its parameters drawn from `config.seed`.
pub fn init<B: Backend, D: EmberModel>(model: &D, config: &TrainConfig, device: &B::Device) -> D::Net<B> {
    B::seed(device, config.seed);
    let model = init_unseeded::<B, D>(model, config, device);
    // burn draws parameters lazily, on first use; drawing them now, right after seeding, keeps
    // the initial weights a function of the seed alone, whatever else draws from the backend's
    // generator later (dropout does not: its masks are keyed per step).
    model.visit(&mut Materialize);
    model
}

struct Materialize;

impl<B: Backend> ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}

/// Where a training step stands, for progress reporting.
#[derive(Clone, Copy, Debug)]
pub struct StepInfo {
    /// 0-based epoch.
    pub epoch: usize,
    /// 1-based step within the epoch.
    pub step: usize,
    pub steps: usize,
    /// Training examples seen so far this epoch.
    pub seen: usize,
    pub total: usize,
    /// This step's loss, read from the device only when the caller asked for it.
    pub loss: Option<f64>,
}

/// Outcome of one training epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochStats {
    /// Mean of the per-batch mean losses.
    pub loss: f64,
    pub steps: usize,
    pub images: usize,
    /// Wall time of the epoch's steps (of both parts, for a resumed epoch), device synchronised.
    pub seconds: f64,
}

impl EpochStats {
    pub fn images_per_sec(&self) -> f64 {
        self.images as f64 / self.seconds
    }
}

/// Where an epoch starts and how it is watched.
pub struct EpochControl<'a> {
    /// The epoch to train and the steps of it already done (an interrupted epoch resumed).
    pub from: &'a Progress,
    /// Read the loss and check it is finite every this many steps (each a device sync);
    /// it is always checked at the end of the epoch.
    pub check_every: usize,
    /// Called after every step; the loss is read on the steps where it is checked.
    pub on_step: &'a mut dyn FnMut(StepInfo),
    /// Polled after every step; true stops the epoch there.
    pub stop: &'a dyn Fn() -> bool,
}

/// How an epoch ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EpochEnd {
    Done(EpochStats),
    /// Stopped by `stop` after `steps_done` steps of the epoch.
    Stopped {
        steps_done: usize,
        loss_sum: f64,
        seconds: f64,
    },
    /// The loss of this step (1-based, within the epoch) was NaN or infinite.
    NonFinite {
        step: usize,
        steps: usize,
    },
}

/// Value of [`EpochSteps`]' first-bad-step tensor while every loss has been finite.
const NO_BAD_STEP: f32 = f32::MAX;

/// The steps of one training epoch exactly as `ember train` runs them, so that `ember bench`
/// times the same work: the epoch's permutation (from `(seed, epoch)`) and augmentation draws
/// uploaded once, then per step a gather on the device, the step's dropout key (a host-side
/// integer from `(seed, global step)`, see [`ember_kernels::begin_dropout_step`]), the optimizer
/// step, and the running loss sum and non-finite check kept on the device. Nothing in
/// [`EpochSteps::step`] reads from the device, uploads, or synchronises it.
pub struct EpochSteps<'a, B: AutodiffBackend> {
    train: &'a DeviceSplit<B::InnerBackend>,
    config: &'a TrainConfig,
    epoch: usize,
    order: Tensor<B::InnerBackend, 1, Int>,
    augment: Option<DeviceDraws<B::InnerBackend>>,
    loss_sum: Tensor<B::InnerBackend, 1>,
    /// The first (1-based) step whose loss was NaN or infinite, or [`NO_BAD_STEP`].
    first_bad: Tensor<B::InnerBackend, 1>,
}

impl<'a, B: AutodiffBackend> EpochSteps<'a, B> {
    /// Epoch `epoch` (from 0) of `train`, its loss sum starting at `loss_sum` (the done steps'
    /// of an interrupted epoch).
    pub fn new(
        train: &'a DeviceSplit<B::InnerBackend>,
        config: &'a TrainConfig,
        epoch: usize,
        loss_sum: f64,
    ) -> Self {
        let device = train.images.device();
        let len = train.len();
        let order = indices::<B::InnerBackend>(&epoch_permutation(config.seed, epoch, len), &device);
        let augment = (!config.augment.is_none()).then(|| {
            let draws = config.augment.draws(config.seed, epoch, len);
            let [_, _, h, w] = train.images.dims();
            let channels = train.images.dims()[1];
            let black: Vec<f32> = (0..channels).map(|c| config.normalization.apply(0, c)).collect();
            DeviceDraws::<B::InnerBackend>::upload(&draws, &black, [h, w], &device)
        });
        Self {
            train,
            config,
            epoch,
            order,
            augment,
            loss_sum: Tensor::from_floats([loss_sum as f32], &device),
            first_bad: Tensor::from_floats([NO_BAD_STEP], &device),
        }
    }

    /// Steps in the epoch; the last one is partial when the batch size does not divide the split.
    pub fn steps(&self) -> usize {
        self.train.len().div_ceil(self.config.batch_size)
    }

    /// The examples (positions in the epoch's order) of 0-based step `step`.
    pub fn batch(&self, step: usize) -> std::ops::Range<usize> {
        let begin = step * self.config.batch_size;
        begin..(begin + self.config.batch_size).min(self.train.len())
    }

    /// Runs 0-based step `step` of the epoch, the run's optimizer step `global_step`, at the rate
    /// (and momentum) `schedule` gives it. Returns the updated model and the batch's mean loss,
    /// still on the device.
    pub fn step<M: Trainable<B>>(
        &mut self,
        model: M,
        optim: &mut Optimizer<M, B>,
        schedule: &RunSchedule,
        step: usize,
        global_step: usize,
    ) -> (M, Tensor<B::InnerBackend, 1>) {
        let batch = self.batch(step);
        let (mut images, targets) = self.train.gather(self.order.clone().slice(batch.clone()));
        if let Some(augment) = &self.augment {
            images = augment.apply(images, batch);
        }
        ember_kernels::begin_dropout_step(step_seed(self.config.seed, global_step));
        let hyper = schedule.at(self.epoch, global_step);
        if let Some(momentum) = hyper.momentum {
            optim.optim().set_momentum(momentum);
        }
        let (model, batch_loss) = train_step(
            model,
            optim,
            images,
            targets,
            hyper.lr,
            self.config.label_smoothing,
        );
        // x - x is NaN exactly when x is NaN or infinite.
        let non_finite = batch_loss.clone().sub(batch_loss.clone()).is_nan();
        let unset = self.first_bad.clone().equal_elem(NO_BAD_STEP);
        self.first_bad = self
            .first_bad
            .clone()
            .mask_fill(non_finite.bool_and(unset), (step + 1) as f32);
        self.loss_sum = self.loss_sum.clone() + batch_loss.clone();
        (model, batch_loss)
    }

    /// The first (1-based) step whose loss was not finite, if any (a device read).
    pub fn first_bad_step(&self) -> Option<usize> {
        let step = scalar(self.first_bad.clone());
        (step < NO_BAD_STEP as f64).then_some(step as usize)
    }

    /// The sum of the batch losses so far (a device read).
    pub fn loss_sum(&self) -> f64 {
        scalar(self.loss_sum.clone())
    }
}

/// Trains `model` for epoch `control.from.epoch`, from its first step not yet done on, each step
/// at the learning rate (and momentum) `schedule` gives it, through [`EpochSteps`].
///
/// Dropout masks are keyed by `(seed, global step)` and the epoch's order comes from
/// `(seed, epoch)`: resuming at any step boundary reproduces the uninterrupted run. Non-finite
/// losses are caught on the device (the first bad step is kept in a one-element tensor) and read
/// at the checks, so between checks no step waits for the device.
pub fn train_epoch<B: AutodiffBackend, M: Trainable<B>>(
    mut model: M,
    optim: &mut Optimizer<M, B>,
    train: &DeviceSplit<B::InnerBackend>,
    config: &TrainConfig,
    schedule: &RunSchedule,
    control: EpochControl<'_>,
) -> (M, EpochEnd) {
    let from = control.from;
    let epoch = from.epoch;
    let start = Instant::now();
    let len = train.len();
    let mut run = EpochSteps::<B>::new(train, config, epoch, from.partial_loss_sum);
    let steps = run.steps();
    for step in from.step_in_epoch..steps {
        let (trained, batch_loss) = run.step(model, optim, schedule, step, from.global_step_at(step));
        model = trained;
        crate::faults::point("train:step");
        let check = control.check_every > 0 && (step + 1) % control.check_every == 0;
        (control.on_step)(StepInfo {
            epoch,
            step: step + 1,
            steps,
            seen: run.batch(step).end,
            total: len,
            loss: check.then(|| scalar(batch_loss)),
        });
        if check {
            if let Some(step) = run.first_bad_step() {
                return (model, EpochEnd::NonFinite { step, steps });
            }
        }
        if (control.stop)() && step + 1 < steps {
            let seconds = from.partial_seconds + start.elapsed().as_secs_f64();
            return (
                model,
                EpochEnd::Stopped {
                    steps_done: step + 1,
                    loss_sum: run.loss_sum(),
                    seconds,
                },
            );
        }
    }
    if let Some(step) = run.first_bad_step() {
        return (model, EpochEnd::NonFinite { step, steps });
    }
    let loss = run.loss_sum() / steps as f64;
    let stats = EpochStats {
        loss,
        steps,
        images: len,
        seconds: from.partial_seconds + start.elapsed().as_secs_f64(),
    };
    (model, EpochEnd::Done(stats))
}

/// One whole epoch without progress reporting or stopping: [`train_epoch`] from its first step,
/// with `config`'s schedule. `epoch` counts from 0, as in [`train_epoch`]: epoch 0 is a run's
/// first epoch, with its shuffle and dropout seeds.
pub fn train_whole_epoch<B: AutodiffBackend, M: Trainable<B>>(
    model: M,
    optim: &mut Optimizer<M, B>,
    train: &DeviceSplit<B::InnerBackend>,
    config: &TrainConfig,
    epoch: usize,
) -> (M, EpochEnd) {
    let steps = train.len().div_ceil(config.batch_size);
    let from = Progress::at_epoch(epoch, steps);
    let schedule = config.schedule(steps);
    let control = EpochControl {
        from: &from,
        check_every: 0,
        on_step: &mut |_| {},
        stop: &|| false,
    };
    train_epoch(model, optim, train, config, &schedule, control)
}

/// One optimizer step on a batch already on the device. Returns the updated model and the
/// batch's mean loss (label-smoothed as asked), still on the device (reading it is a sync).
pub fn train_step<B: AutodiffBackend, M: Trainable<B>>(
    model: M,
    optim: &mut Optimizer<M, B>,
    images: Tensor<B::InnerBackend, 4>,
    targets: Tensor<B::InnerBackend, 1, Int>,
    lr: f64,
    label_smoothing: f64,
) -> (M, Tensor<B::InnerBackend, 1>) {
    let output = model.forward(Tensor::from_inner(images));
    let batch_loss = loss(
        output,
        model.output(),
        Tensor::from_inner(targets),
        label_smoothing,
    );
    let grads = GradientsParams::from_grads(batch_loss.backward(), &model);
    (optim.step(lr, model, grads), batch_loss.inner())
}

/// Test-set style evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalStats {
    /// Mean negative log-likelihood per example.
    pub loss: f64,
    pub correct: usize,
    pub total: usize,
    pub seconds: f64,
}

impl EvalStats {
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.total as f64
    }

    pub fn images_per_sec(&self) -> f64 {
        self.total as f64 / self.seconds
    }

    /// "98.59% (9859/10000)".
    pub fn accuracy_text(&self) -> String {
        format!(
            "{:.2}% ({}/{})",
            100.0 * self.accuracy(),
            self.correct,
            self.total
        )
    }
}

/// Evaluates `model` (no autodiff) on `split` in batches of `batch_size`, as the PyTorch
/// example's `test()`: summed NLL over the split divided by its size, and argmax accuracy.
pub fn evaluate<B: Backend, M: Classifier<B>>(
    model: &M,
    split: &DeviceSplit<B>,
    batch_size: usize,
) -> EvalStats {
    let start = Instant::now();
    let device = split.images.device();
    let len = split.len();
    let kind = model.output();
    let mut loss_sum = Tensor::<B, 1>::zeros([1], &device);
    let mut correct = Tensor::<B, 1, Int>::zeros([1], &device);
    for begin in (0..len).step_by(batch_size) {
        let end = (begin + batch_size).min(len);
        let (images, targets) = split.range(begin, end);
        let output = model.forward(images);
        let predicted = output.clone().argmax(1).squeeze_dim::<1>(1);
        correct = correct + predicted.equal(targets.clone()).int().sum();
        loss_sum = loss_sum + nll_sum(output, kind, targets);
        crate::faults::point("eval:batch");
    }
    let correct = correct.into_scalar();
    let loss = scalar(loss_sum) / len as f64;
    EvalStats {
        loss,
        correct: burn::tensor::ElementConversion::elem::<i64>(correct) as usize,
        total: len,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// Reads a one-element tensor (a device sync).
pub fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    burn::tensor::ElementConversion::elem::<f64>(t.into_scalar())
}

/// Evaluates an autodiff model without building a graph.
pub fn evaluate_trained<B: AutodiffBackend, M: Trainable<B>>(
    model: &M,
    split: &DeviceSplit<B::InnerBackend>,
    batch_size: usize,
) -> EvalStats {
    evaluate(&model.valid(), split, batch_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::tensor::TensorData;

    type TB = NdArray<f32>;

    #[test]
    fn nll_and_cross_entropy_match_pytorch() {
        // torch.nn.functional.cross_entropy(torch.tensor([[1., 2., 3.], [1., -1., 0.]]),
        //                                   torch.tensor([2, 0])).item() = 0.40760600566864014
        let device = Default::default();
        let logits =
            Tensor::<TB, 2>::from_data(TensorData::new(vec![1f32, 2., 3., 1., -1., 0.], [2, 3]), &device);
        let targets =
            Tensor::<TB, 1, Int>::from_data(TensorData::new(vec![2i64, 0], [2]).convert::<i32>(), &device);
        let ce = scalar(loss(logits.clone(), Output::Logits, targets.clone(), 0.0));
        assert!((ce - 0.407_606_005_668_640_14).abs() < 1e-6, "{ce}");
        let nll = scalar(loss(
            log_softmax(logits.clone(), 1),
            Output::LogProbs,
            targets.clone(),
            0.0,
        ));
        assert!((nll - ce).abs() < 1e-7);
        // F.cross_entropy(same, label_smoothing=0.1).item() = 0.507606029510498
        let smoothed = scalar(loss(logits.clone(), Output::Logits, targets.clone(), 0.1));
        assert!((smoothed - 0.507_606_029_510_498).abs() < 1e-6, "{smoothed}");
        // The same from log-probabilities (PyTorch's example net ends in log_softmax).
        let from_log_probs = scalar(loss(log_softmax(logits, 1), Output::LogProbs, targets, 0.1));
        assert!((from_log_probs - smoothed).abs() < 1e-6);
    }

    #[test]
    fn permutations_are_seeded_per_epoch() {
        let a = epoch_permutation(1, 0, 1000);
        assert_eq!(a, epoch_permutation(1, 0, 1000));
        assert_ne!(a, epoch_permutation(1, 1, 1000));
        assert_ne!(a, epoch_permutation(2, 0, 1000));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
    }
}
