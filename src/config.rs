//! Recipes: the seed runs' full training settings, every value overridable, and the resolved
//! [`TrainConfig`] that a run saves as `config.json`.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::augment::Augment;
use crate::data::{DatasetSpec, ImageShape, Normalization};
use crate::model::{DoesNotFit, ModelKind, ModelName};
use crate::optim::{OneCycle, OptimizerConfig, OptimizerKind, RunSchedule, Schedule, StepLr};

/// The seed benchmark runs ember reproduces. Their settings live in [`Recipe::config`] only:
/// the command line's help and `--recipe`'s value descriptions are generated from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recipe {
    PytorchExample,
    Tch,
    Flashlight,
    ResnetFashion,
    Speedrun,
}

impl ValueEnum for Recipe {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            Self::PytorchExample,
            Self::Tch,
            Self::Flashlight,
            Self::ResnetFashion,
            Self::Speedrun,
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.summary()))
    }
}

impl Recipe {
    pub fn name(self) -> &'static str {
        match self {
            Self::PytorchExample => "pytorch-example",
            Self::Tch => "tch",
            Self::Flashlight => "flashlight",
            Self::ResnetFashion => "resnet-fashion",
            Self::Speedrun => "speedrun",
        }
    }

    /// Where the recipe comes from and its settings, e.g. "PyTorch's MNIST example:
    /// pytorch-example-net, adadelta lr 1, StepLR gamma 0.7, batch 64, 14 epochs, mean 0.1307
    /// std 0.3081".
    pub fn summary(self) -> String {
        let origin = match self {
            Self::PytorchExample => "PyTorch's MNIST example",
            Self::Tch => "the tch-rs port",
            Self::Flashlight => "flashlight's MNIST",
            Self::ResnetFashion => "ResNet-20 on Fashion-MNIST",
            Self::Speedrun => "99% on MNIST in the least time",
        };
        let c = self.config();
        let optimizer = c.optimizer.kind.to_possible_value().expect("no skipped values");
        let mut facts = vec![
            c.model.name().to_string(),
            format!("{} lr {}", optimizer.get_name(), c.lr),
        ];
        let o = &c.optimizer;
        if o.momentum != 0.0 {
            let nesterov = if o.nesterov { " nesterov" } else { "" };
            facts.push(format!("momentum {}{nesterov}", o.momentum));
        }
        if o.weight_decay != 0.0 {
            let which = if o.no_decay_1d {
                " (not on 1-D parameters)"
            } else {
                ""
            };
            facts.push(format!("weight decay {}{which}", o.weight_decay));
        }
        if c.gamma != 1.0 {
            facts.push(format!("StepLR gamma {}", c.gamma));
        }
        if c.schedule != crate::optim::Schedule::Step {
            facts.push(format!("{} schedule", c.schedule.name()));
        }
        if c.label_smoothing != 0.0 {
            facts.push(format!("label smoothing {}", c.label_smoothing));
        }
        if c.augment.translate != 0 {
            facts.push(format!("random shifts of up to {} px", c.augment.translate));
        }
        if c.augment.flip {
            facts.push("random flips".into());
        }
        if c.dataset != DatasetSpec::MNIST {
            facts.push(c.dataset.to_string());
        }
        facts.push(format!("batch {}", c.batch_size));
        facts.push(format!("{} epochs", c.epochs));
        facts.push(if c.normalization == Normalization::unit() {
            "x/255".to_string()
        } else {
            format!("mean {} std {}", c.normalization.mean, c.normalization.std)
        });
        if c.valid_size > 0 {
            facts.push(format!(
                "first {} training images held out for validation",
                c.valid_size
            ));
        }
        if let Some(target) = c.target_accuracy {
            facts.push(format!("stops at {target}% test accuracy"));
        }
        format!("{origin}: {}", facts.join(", "))
    }

    /// The recipe that trains `model` (its data normalisation, optimizer): the recipe whose
    /// model it is, else the modern one (`resnet-fashion`: Nesterov SGD, one-cycle, weight decay
    /// kept off batch norm), which suits ResNet-18 and models from outside ember.
    pub fn of_model(model: impl Into<ModelName>) -> Self {
        let model = model.into();
        Self::value_variants()
            .iter()
            .copied()
            .find(|r| r.config().model == model)
            .unwrap_or(Self::ResnetFashion)
    }

    /// The seed run's settings.
    pub fn config(self) -> TrainConfig {
        let base = TrainConfig {
            recipe: self,
            model: ModelKind::PytorchExampleNet.into(),
            dataset: DatasetSpec::MNIST,
            input: ImageShape::MNIST,
            classes: Vec::new(),
            val_fraction: DEFAULT_VAL_FRACTION,
            skip_bad_images: false,
            data_dir: None,
            optimizer: OptimizerConfig::new(OptimizerKind::Adadelta),
            lr: 1.0,
            schedule: Schedule::Step,
            gamma: 1.0,
            step_size: 1,
            label_smoothing: 0.0,
            augment: Augment::default(),
            target_accuracy: None,
            batch_size: 64,
            test_batch_size: 1000,
            epochs: 14,
            seed: 1,
            normalization: Normalization::mnist(),
            valid_size: 0,
            limit_train: None,
            limit_test: None,
        };
        match self {
            Self::PytorchExample => TrainConfig { gamma: 0.7, ..base },
            Self::Tch => TrainConfig {
                model: ModelKind::TchNet.into(),
                optimizer: OptimizerConfig::new(OptimizerKind::Adam),
                lr: 1e-4,
                batch_size: 256,
                epochs: 50,
                normalization: Normalization::unit(),
                ..base
            },
            Self::Flashlight => TrainConfig {
                model: ModelKind::FlashlightCnn.into(),
                optimizer: OptimizerConfig::new(OptimizerKind::Sgd),
                lr: 1e-2,
                epochs: 100,
                normalization: Normalization::unit(),
                valid_size: 5000,
                ..base
            },
            Self::ResnetFashion => TrainConfig {
                model: ModelKind::Resnet20.into(),
                dataset: DatasetSpec::FASHION_MNIST,
                lr: 0.1,
                augment: Augment {
                    translate: 2,
                    flip: true,
                },
                batch_size: 128,
                epochs: 30,
                normalization: Normalization::fashion_mnist(),
                ..modern(base)
            },
            Self::Speedrun => TrainConfig {
                model: ModelKind::SpeedrunNet.into(),
                lr: 0.2,
                augment: Augment {
                    translate: 2,
                    flip: false,
                },
                batch_size: 256,
                epochs: 3,
                target_accuracy: Some(99.0),
                ..modern(base)
            },
        }
    }
}

/// `base` with what the two modern recipes share: SGD with Nesterov momentum 0.9 (moved by
/// one-cycle between 0.95 and 0.85) and weight decay 5e-4 on the weights only, a one-cycle
/// schedule 25% up, label smoothing 0.1.
fn modern(base: TrainConfig) -> TrainConfig {
    TrainConfig {
        optimizer: OptimizerConfig {
            momentum: 0.9,
            nesterov: true,
            weight_decay: 5e-4,
            no_decay_1d: true,
            ..OptimizerConfig::new(OptimizerKind::Sgd)
        },
        schedule: Schedule::OneCycle(OneCycle {
            pct_start: 0.25,
            ..OneCycle::default()
        }),
        label_smoothing: 0.1,
        ..base
    }
}

/// Everything that determines a training run, saved with its checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub recipe: Recipe,
    /// ember's or a user's model (the registry, `src/registry.rs`, resolves the name).
    pub model: ModelName,
    pub dataset: DatasetSpec,
    /// The images as the model takes them (after any resizing); runs saved before datasets
    /// other than MNIST's format have none and are 1x28x28.
    #[serde(default)]
    pub input: ImageShape,
    /// Class names, label order; empty: the MNIST-format dataset's ten.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    /// Fraction of each class held out as the test set of a folder without `test/` or `val/`.
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
    /// Unreadable images in a folder are skipped (and counted) instead of stopping the run.
    #[serde(default)]
    pub skip_bad_images: bool,
    /// The folder an MNIST-format or CIFAR dataset was read from, so that `eval` and `--resume`
    /// find it again from any working folder (`--data-dir` still overrides it); absent in runs
    /// saved before ember recorded it, and for image folders (their path is the dataset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<std::path::PathBuf>,
    pub optimizer: OptimizerConfig,
    /// Learning rate of the first epoch.
    pub lr: f64,
    /// How the rate moves: StepLR per epoch (from `gamma`, `step_size`) or per step.
    #[serde(default)]
    pub schedule: Schedule,
    /// StepLR's decay factor (1.0: constant rate).
    pub gamma: f64,
    /// StepLR's period in epochs.
    pub step_size: usize,
    /// `F.cross_entropy`'s `label_smoothing` in the training loss (0: none).
    #[serde(default)]
    pub label_smoothing: f64,
    /// Random translation and flips of the training images (none by default).
    #[serde(default)]
    pub augment: Augment,
    /// Stop after the first epoch whose test accuracy (percent) reaches this.
    #[serde(default)]
    pub target_accuracy: Option<f64>,
    pub batch_size: usize,
    pub test_batch_size: usize,
    pub epochs: usize,
    pub seed: u64,
    pub normalization: Normalization,
    /// The first `valid_size` training images are held out for validation.
    pub valid_size: usize,
    /// Train on the first N remaining training images only.
    pub limit_train: Option<usize>,
    /// Evaluate on the first N test images only.
    #[serde(default)]
    pub limit_test: Option<usize>,
}

/// `--val-fraction`'s default: torchvision users' usual 10%.
pub const DEFAULT_VAL_FRACTION: f64 = 0.1;

/// The smallest normalisation standard deviation: pixels in [0, 1] divided by less reach 1e6.
pub const MIN_STD: f64 = 1e-6;

/// The most channels and the longest side of a run's images that `config.json` may name.
pub const MAX_CHANNELS: usize = 4;
pub const MAX_INPUT_SIDE: usize = 4096;

/// `message` about flags (`--batch-size must be ...`) said of `config.json`'s fields instead
/// (`batch_size must be ...`), for an error in a run's file rather than on the command line.
pub fn as_fields(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("--") {
        out += &rest[..at];
        let tail = &rest[at + 2..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
            .unwrap_or(tail.len());
        let flag = &tail[..end];
        rest = &tail[end..];
        if flag.is_empty() {
            out += "--";
            continue;
        }
        let field = flag.replace('-', "_");
        out += &match flag {
            "std" | "mean" => format!("normalization.{field}"),
            "weight-decay" | "momentum" | "dampening" | "nesterov" => format!("optimizer.{field}"),
            "translate" => format!("augment.{field}"),
            "pct-start" | "div-factor" | "final-div-factor" | "base-momentum" | "max-momentum"
            | "cycle-momentum" | "warmup-steps" => format!("schedule.{field}"),
            _ => field,
        };
    }
    out + rest
}

fn default_val_fraction() -> f64 {
    DEFAULT_VAL_FRACTION
}

/// A setting that cannot work, named as its flag.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("{flag} must be at least 1, got {value}")]
    Zero { flag: &'static str, value: usize },
    #[error("{flag} must be a positive finite number, got {value}")]
    NotPositive { flag: &'static str, value: f64 },
    #[error("{flag} must be at least {limit}, got {value}")]
    TooSmall {
        flag: &'static str,
        value: f64,
        limit: f64,
    },
    #[error("{flag} must be a finite number, got {value}")]
    NotFinite { flag: &'static str, value: f64 },
    #[error("{flag} must be zero or a positive finite number, got {value}")]
    Negative { flag: &'static str, value: f64 },
    #[error("--valid-size {valid} leaves no training images out of {train}")]
    NoTrainingData { valid: usize, train: usize },
    #[error("{flag} must be between {low} and {high}, got {value}")]
    OutOfRange {
        flag: &'static str,
        value: f64,
        low: f64,
        high: f64,
    },
    #[error("{flag} {value} must be below {limit}")]
    TooLarge {
        flag: &'static str,
        value: usize,
        limit: usize,
    },
    #[error("--mean has {mean} values and --std {std}, for images of {channels} channels: give one value, or one per channel")]
    Channels {
        mean: usize,
        std: usize,
        channels: usize,
    },
    #[error(transparent)]
    Model(#[from] DoesNotFit),
    #[error("{dataset}: {found}, and the run was trained on {trained}: the labels would not match the model's outputs")]
    OtherClasses {
        dataset: String,
        found: String,
        trained: String,
    },
    #[error("input {shape}: {reason}")]
    BadInput { shape: ImageShape, reason: &'static str },
    #[error(
        "the data has one class ({0}): nothing to learn, a classifier needs images of two classes or more"
    )]
    OneClass(String),
    #[error(
        "{model} on {input} images needs about {per_image} an image in {what}: {batch_flag} {batch} needs {need}, \
         and {device} has {available} beside the dataset ({data}); {advice}"
    )]
    ActivationMemory {
        model: String,
        input: ImageShape,
        /// "a training step" or "evaluation".
        what: &'static str,
        per_image: String,
        batch_flag: &'static str,
        batch: usize,
        need: String,
        device: String,
        available: String,
        data: String,
        advice: String,
    },
    #[error("{flag} applies to --schedule {needs} only")]
    OtherSchedule { flag: &'static str, needs: String },
    #[error("{flag} applies to --optimizer sgd only, not {optimizer}")]
    OtherOptimizer { flag: &'static str, optimizer: String },
    #[error(
        "--nesterov needs a momentum (--momentum above 0, or one-cycle's --cycle-momentum) and --dampening 0"
    )]
    Nesterov,
    #[error("--schedule one-cycle with --cycle-momentum moves the momentum, and --optimizer {0} has none: use --cycle-momentum=false")]
    NoMomentumToCycle(String),
    #[error("--epochs {asked}: this run's --schedule {schedule} spans its {epochs} epochs step by step and cannot be stretched; start a new run")]
    FixedLength {
        asked: usize,
        epochs: usize,
        schedule: &'static str,
    },
    #[error("--warmup-steps {warmup} must be fewer than the run's {total} optimizer steps")]
    WarmupTooLong { warmup: usize, total: usize },
    #[error("--pct-start {pct} puts one-cycle's peak on the first of the run's {total} steps, where OneCycleLR divides by zero: change --pct-start or the run's length")]
    OneCyclePeakAtStart { pct: f64, total: usize },
}

impl TrainConfig {
    /// The number of classes the model tells apart.
    pub fn num_classes(&self) -> usize {
        if self.classes.is_empty() {
            crate::data::NUM_CLASSES
        } else {
            self.classes.len()
        }
    }

    /// Class names, label order: the saved ones, or the MNIST-format dataset's.
    pub fn class_names(&self) -> Vec<String> {
        if !self.classes.is_empty() {
            return self.classes.clone();
        }
        let d = self.dataset.idx().unwrap_or(crate::data::Dataset::Mnist);
        (0..crate::data::NUM_CLASSES).map(|c| d.label(c)).collect()
    }

    /// Class `c` as `ember predict` prints it: "7" for MNIST, "3 (Dress)" for Fashion-MNIST, the
    /// folder's (or CIFAR's) name otherwise.
    pub fn class_text(&self, c: usize) -> String {
        match (self.dataset.idx(), self.classes.get(c)) {
            (Some(d), _) => d.class_name(c),
            (None, Some(name)) => name.clone(),
            (None, None) => c.to_string(),
        }
    }

    /// The run's learning-rate schedule, for epochs of `steps_per_epoch` optimizer steps.
    pub fn schedule(&self, steps_per_epoch: usize) -> RunSchedule {
        let step_lr = StepLr {
            base_lr: self.lr,
            gamma: self.gamma,
            step_size: self.step_size,
        };
        RunSchedule::new(self.schedule.clone(), step_lr, self.epochs, steps_per_epoch)
    }

    /// Checks the settings that do not depend on the data.
    /// Whether `train` training images leave any after the validation split.
    /// Whether data read now, with `classes` (sorted folder names, CIFAR's or a dataset's own),
    /// has the classes this run was trained on: the same names in the same order when the run
    /// recorded them (folders, CIFAR, in-memory data), else the same number. A class folder
    /// renamed, added or removed after training would shift every label.
    pub fn check_classes(&self, classes: &[String]) -> Result<(), ConfigError> {
        let list = |names: &[String]| {
            let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
            let more = if names.len() > 8 { ", ..." } else { "" };
            format!("{} classes ({}{more})", names.len(), shown.join(", "))
        };
        let same = if self.classes.is_empty() {
            classes.len() == self.num_classes()
        } else {
            classes == self.classes.as_slice()
        };
        if same {
            return Ok(());
        }
        let mut found = list(classes);
        if !self.classes.is_empty() {
            let missing: Vec<&str> = self
                .classes
                .iter()
                .filter(|c| !classes.contains(c))
                .map(String::as_str)
                .collect();
            let new: Vec<&str> = classes
                .iter()
                .filter(|c| !self.classes.contains(c))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                found += &format!(", without {}", missing.join(", "));
            }
            if !new.is_empty() {
                found += &format!(", with {} new", new.join(", "));
            }
        }
        Err(ConfigError::OtherClasses {
            dataset: self.dataset.to_string(),
            found: format!("its images now read as {found}"),
            trained: if self.classes.is_empty() {
                format!("{} classes", self.num_classes())
            } else {
                list(&self.classes)
            },
        })
    }

    pub fn check_train_size(&self, train: usize) -> Result<(), ConfigError> {
        if self.valid_size >= train {
            return Err(ConfigError::NoTrainingData {
                valid: self.valid_size,
                train,
            });
        }
        let mut used = train - self.valid_size;
        if let Some(n) = self.limit_train {
            used = used.min(n);
        }
        let total = self.epochs * used.div_ceil(self.batch_size);
        match &self.schedule {
            Schedule::WarmupCosine { warmup_steps } if *warmup_steps >= total => {
                Err(ConfigError::WarmupTooLong {
                    warmup: *warmup_steps,
                    total,
                })
            }
            Schedule::OneCycle(c) if c.pct_start * total as f64 == 1.0 => {
                Err(ConfigError::OneCyclePeakAtStart {
                    pct: c.pct_start,
                    total,
                })
            }
            _ => Ok(()),
        }
    }

    /// Checks the settings that depend on the images: the model takes their shape, the
    /// normalisation has one value or one per channel, the shifts fit in them.
    pub fn check_input(
        &self,
        fits: impl FnOnce(ImageShape) -> Result<(), DoesNotFit>,
    ) -> Result<(), ConfigError> {
        self.check_shape()?;
        fits(self.input)?;
        let side = self.input.height.min(self.input.width);
        if self.augment.translate >= side {
            return Err(ConfigError::TooLarge {
                flag: "--translate",
                value: self.augment.translate,
                limit: side,
            });
        }
        Ok(())
    }

    /// Refuses batches whose activations would not fit in the device's memory beside the
    /// dataset: `per_image` is the model's estimate ([`crate::model::EmberModel::activation_bytes`];
    /// nothing is checked without one), `data` the dataset's bytes on the device, `memory` the
    /// device's memory and its name, `images` the training and the largest evaluated split's
    /// sizes (a batch is no larger than its split). A batch past it would abort the process on an
    /// allocation once training or evaluation reached it; the error names the batch size that fits.
    pub fn check_activation_memory(
        &self,
        per_image: Option<crate::model::ActivationBytes>,
        data: u64,
        memory: Option<(u64, String)>,
        images: (usize, usize),
    ) -> Result<(), ConfigError> {
        let (Some(per_image), Some((memory, device))) = (per_image, memory) else {
            return Ok(());
        };
        let available = memory.saturating_sub(data);
        let checks = [
            (
                "a training step",
                "a batch of",
                "--batch-size",
                self.batch_size,
                per_image.train,
            ),
            (
                "evaluation",
                "a --test-batch-size of",
                "--test-batch-size",
                self.test_batch_size,
                per_image.eval,
            ),
        ];
        for ((what, batch_flag, flag, batch, bytes), images) in checks.into_iter().zip([images.0, images.1]) {
            let batch = batch.min(images);
            let need = (batch as u64).saturating_mul(bytes.max(1));
            if need <= available {
                continue;
            }
            let fits = available / bytes.max(1);
            let advice = if fits == 0 {
                "not one image fits: lower --image-size".to_string()
            } else {
                format!("{flag} {fits} fits, or lower --image-size")
            };
            use crate::memory::bytes as b;
            return Err(ConfigError::ActivationMemory {
                model: self.model.to_string(),
                input: self.input,
                what,
                per_image: b(bytes),
                batch_flag,
                batch,
                need: b(need),
                device,
                available: b(available),
                data: b(data),
                advice,
            });
        }
        Ok(())
    }

    /// Checks a run's `config.json` as read back: [`TrainConfig::validate`] and an image shape
    /// that ember's readers can produce and a batch of which can be allocated (a file edited to
    /// 0 or 2 channels, or 100000x100000 images, fails here, not in a panic or an abort).
    pub fn check_saved(&self) -> Result<(), ConfigError> {
        self.validate()?;
        self.check_shape()
    }

    /// The image shape's bounds, and normalisation values for its channels.
    fn check_shape(&self) -> Result<(), ConfigError> {
        let shape = self.input;
        let reason = if !(1..=MAX_CHANNELS).contains(&shape.channels) {
            Some("the channels must be 1 (grey) to 4")
        } else if shape.height == 0 || shape.width == 0 || shape.height.max(shape.width) > MAX_INPUT_SIDE {
            Some("the sides must be 1 to 4096 pixels")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ConfigError::BadInput { shape, reason });
        }
        if !self.normalization.fits(shape.channels) {
            return Err(ConfigError::Channels {
                mean: self.normalization.mean.values().len(),
                std: self.normalization.std.values().len(),
                channels: shape.channels,
            });
        }
        Ok(())
    }

    /// Checks the settings that do not depend on the data (see also [`TrainConfig::check_input`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (flag, value) in [
            ("--batch-size", self.batch_size),
            ("--test-batch-size", self.test_batch_size),
            ("--epochs", self.epochs),
            ("--step-size", self.step_size),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { flag, value });
            }
        }
        if self.limit_train == Some(0) {
            return Err(ConfigError::Zero {
                flag: "--limit-train",
                value: 0,
            });
        }
        if self.limit_test == Some(0) {
            return Err(ConfigError::Zero {
                flag: "--limit-test",
                value: 0,
            });
        }
        let stds = self
            .normalization
            .std
            .values()
            .iter()
            .map(|&v| ("--std", f64::from(v)));
        for (flag, value) in [("--lr", self.lr), ("--gamma", self.gamma)]
            .into_iter()
            .chain(stds)
        {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigError::NotPositive { flag, value });
            }
        }
        for &std in self.normalization.std.values() {
            // Pixels in [0, 1] divided by less would overflow f32 in the first layers' sums.
            if f64::from(std) < MIN_STD {
                return Err(ConfigError::TooSmall {
                    flag: "--std",
                    value: f64::from(std),
                    limit: MIN_STD,
                });
            }
        }
        for &mean in self.normalization.mean.values() {
            if !mean.is_finite() {
                return Err(ConfigError::NotFinite {
                    flag: "--mean",
                    value: f64::from(mean),
                });
            }
        }
        if !(self.val_fraction >= 0.0 && self.val_fraction < 1.0) {
            return Err(ConfigError::OutOfRange {
                flag: "--val-fraction",
                value: self.val_fraction,
                low: 0.0,
                high: 1.0,
            });
        }
        let o = &self.optimizer;
        for (flag, value) in [
            ("--weight-decay", o.weight_decay),
            ("--momentum", o.momentum),
            ("--dampening", o.dampening),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(ConfigError::Negative { flag, value });
            }
        }
        if let Some(target) = self.target_accuracy {
            if !(target > 0.0 && target <= 100.0) {
                return Err(ConfigError::OutOfRange {
                    flag: "--target-accuracy",
                    value: target,
                    low: 0.0,
                    high: 100.0,
                });
            }
        }
        if !(0.0..=1.0).contains(&self.label_smoothing) {
            return Err(ConfigError::OutOfRange {
                flag: "--label-smoothing",
                value: self.label_smoothing,
                low: 0.0,
                high: 1.0,
            });
        }
        let optimizer = || {
            o.kind
                .to_possible_value()
                .expect("no skipped values")
                .get_name()
                .to_string()
        };
        if o.kind != OptimizerKind::Sgd {
            for (flag, set) in [
                ("--momentum", o.momentum != 0.0),
                ("--dampening", o.dampening != 0.0),
                ("--nesterov", o.nesterov),
            ] {
                if set {
                    return Err(ConfigError::OtherOptimizer {
                        flag,
                        optimizer: optimizer(),
                    });
                }
            }
        }
        let cycled = matches!(&self.schedule, Schedule::OneCycle(c) if c.cycle_momentum);
        if o.nesterov && (o.dampening != 0.0 || (o.momentum == 0.0 && !cycled)) {
            return Err(ConfigError::Nesterov);
        }
        if let Schedule::OneCycle(c) = &self.schedule {
            if c.cycle_momentum && o.kind == OptimizerKind::Adadelta {
                return Err(ConfigError::NoMomentumToCycle(optimizer()));
            }
            if !(0.0..=1.0).contains(&c.pct_start) {
                return Err(ConfigError::OutOfRange {
                    flag: "--pct-start",
                    value: c.pct_start,
                    low: 0.0,
                    high: 1.0,
                });
            }
            for (flag, value) in [
                ("--div-factor", c.div_factor),
                ("--final-div-factor", c.final_div_factor),
            ] {
                if !(value.is_finite() && value > 0.0) {
                    return Err(ConfigError::NotPositive { flag, value });
                }
            }
            for (flag, value) in [
                ("--base-momentum", c.base_momentum),
                ("--max-momentum", c.max_momentum),
            ] {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(ConfigError::Negative { flag, value });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_checked_against_the_memory_beside_the_data() {
        use crate::model::ActivationBytes;
        let mut config = Recipe::ResnetFashion.config();
        config.input = ImageShape {
            channels: 1,
            height: 448,
            width: 448,
        };
        assert_eq!((config.batch_size, config.test_batch_size), (128, 1000));
        let per_image = Some(ActivationBytes {
            train: 400 << 20,
            eval: 40 << 20,
        });
        let memory = || Some((24u64 << 30, "this machine".to_string()));
        let err = config
            .check_activation_memory(per_image, 1 << 30, memory(), (60_000, 10_000))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "resnet20 on 1x448x448 images needs about 400 MiB an image in a training step: a batch \
             of 128 needs 50.00 GiB, and this machine has 23.00 GiB beside the dataset (1.00 GiB); \
             --batch-size 58 fits, or lower --image-size"
        );
        config.batch_size = 58;
        let err = config
            .check_activation_memory(per_image, 1 << 30, memory(), (60_000, 10_000))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("in evaluation: a --test-batch-size of 1000 needs 39.06 GiB")
                && err.ends_with("--test-batch-size 588 fits, or lower --image-size"),
            "{err}"
        );
        // A batch is no larger than its split.
        config
            .check_activation_memory(per_image, 1 << 30, memory(), (60_000, 500))
            .unwrap();
        config.batch_size = 1_000_000;
        config
            .check_activation_memory(per_image, 1 << 30, memory(), (58, 500))
            .unwrap();
        // Not one image.
        let huge = Some(ActivationBytes {
            train: 30 << 30,
            eval: 1,
        });
        let err = config
            .check_activation_memory(huge, 1 << 30, memory(), (58, 500))
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("a batch of 58 needs 1.70 TiB, and this machine has 23.00 GiB beside the dataset (1.00 GiB); not one image fits: lower --image-size"), "{err}");
        // Without an estimate, or where the memory is unknown, nothing is checked.
        config
            .check_activation_memory(None, 1 << 30, memory(), (58, 500))
            .unwrap();
        config
            .check_activation_memory(huge, 1 << 30, None, (58, 500))
            .unwrap();
    }

    #[test]
    fn flags_are_said_as_config_json_fields() {
        assert_eq!(
            as_fields("--batch-size must be at least 1, got 0"),
            "batch_size must be at least 1, got 0"
        );
        assert_eq!(
            as_fields("--std must be at least 0.000001, got 1e-45"),
            "normalization.std must be at least 0.000001, got 1e-45"
        );
        assert_eq!(
            as_fields("--nesterov needs a momentum (--momentum above 0, or one-cycle's --cycle-momentum)"),
            "optimizer.nesterov needs a momentum (optimizer.momentum above 0, or one-cycle's schedule.cycle_momentum)"
        );
        assert_eq!(as_fields("no flags -- here"), "no flags -- here");
    }

    #[test]
    fn recipes_match_the_seed_runs() {
        let p = Recipe::PytorchExample.config();
        assert_eq!(
            (
                p.model,
                p.optimizer.kind,
                p.lr,
                p.gamma,
                p.batch_size,
                p.test_batch_size,
                p.epochs,
                p.seed
            ),
            (
                ModelName::from(ModelKind::PytorchExampleNet),
                OptimizerKind::Adadelta,
                1.0,
                0.7,
                64,
                1000,
                14,
                1
            )
        );
        assert_eq!(p.normalization, Normalization::mnist());
        let t = Recipe::Tch.config();
        assert_eq!(
            (t.model, t.optimizer.kind, t.lr, t.batch_size, t.epochs),
            (
                ModelName::from(ModelKind::TchNet),
                OptimizerKind::Adam,
                1e-4,
                256,
                50
            )
        );
        let f = Recipe::Flashlight.config();
        assert_eq!(
            (
                f.model,
                f.optimizer.kind,
                f.lr,
                f.batch_size,
                f.epochs,
                f.valid_size
            ),
            (
                ModelName::from(ModelKind::FlashlightCnn),
                OptimizerKind::Sgd,
                1e-2,
                64,
                100,
                5000
            )
        );
        assert_eq!(f.normalization, Normalization::unit());
        for r in Recipe::value_variants() {
            r.config().validate().unwrap();
        }
    }

    #[test]
    fn rejects_settings_naming_the_flag() {
        let mut c = Recipe::PytorchExample.config();
        c.batch_size = 0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "--batch-size must be at least 1, got 0"
        );
        let mut c = Recipe::PytorchExample.config();
        c.lr = f64::NAN;
        assert!(c.validate().unwrap_err().to_string().starts_with("--lr"));
    }

    /// --std 0 trained at loss 2.30 for ever (the NaNs hidden by ReLU), and a negative weight
    /// decay or a NaN mean were taken as given.
    #[test]
    fn rejects_normalisation_and_decay_that_cannot_train() {
        let error = |edit: fn(&mut TrainConfig)| {
            let mut c = Recipe::PytorchExample.config();
            edit(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert_eq!(
            error(|c| c.normalization.std = 0.0.into()),
            "--std must be a positive finite number, got 0"
        );
        assert_eq!(
            error(|c| c.normalization.std = (-1.0).into()),
            "--std must be a positive finite number, got -1"
        );
        assert_eq!(
            error(|c| c.normalization.mean = f32::NAN.into()),
            "--mean must be a finite number, got NaN"
        );
        assert_eq!(
            error(|c| c.optimizer.weight_decay = -1.0),
            "--weight-decay must be zero or a positive finite number, got -1"
        );
    }

    #[test]
    fn config_round_trips_through_json() {
        let c = Recipe::Flashlight.config();
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"recipe\":\"flashlight\""), "{json}");
        assert_eq!(serde_json::from_str::<TrainConfig>(&json).unwrap(), c);
    }
}
