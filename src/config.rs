//! Recipes: the seed runs' full training settings, every value overridable, and the resolved
//! [`TrainConfig`] that a run saves as `config.json`.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::data::{Dataset, Normalization};
use crate::model::ModelKind;
use crate::optim::{OptimizerConfig, OptimizerKind, StepLr};

/// The seed benchmark runs ember reproduces. Their settings live in [`Recipe::config`] only:
/// the command line's help and `--recipe`'s value descriptions are generated from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recipe {
    PytorchExample,
    Tch,
    Flashlight,
}

impl ValueEnum for Recipe {
    fn value_variants<'a>() -> &'a [Self] {
        &[Self::PytorchExample, Self::Tch, Self::Flashlight]
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
        };
        let c = self.config();
        let optimizer = c.optimizer.kind.to_possible_value().expect("no skipped values");
        let mut facts = vec![
            c.model.name().to_string(),
            format!("{} lr {}", optimizer.get_name(), c.lr),
        ];
        if c.gamma != 1.0 {
            facts.push(format!("StepLR gamma {}", c.gamma));
        }
        facts.push(format!("batch {}", c.batch_size));
        facts.push(format!("{} epochs", c.epochs));
        facts.push(if c.normalization == Normalization::UNIT {
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
        format!("{origin}: {}", facts.join(", "))
    }

    /// The recipe that trains `model` in the seed runs (its data normalisation, optimizer).
    pub fn of_model(model: ModelKind) -> Self {
        match model {
            ModelKind::PytorchExampleNet => Self::PytorchExample,
            ModelKind::TchNet => Self::Tch,
            ModelKind::FlashlightCnn => Self::Flashlight,
        }
    }

    /// The seed run's settings.
    pub fn config(self) -> TrainConfig {
        let base = TrainConfig {
            recipe: self,
            model: ModelKind::PytorchExampleNet,
            dataset: Dataset::Mnist,
            optimizer: OptimizerConfig::new(OptimizerKind::Adadelta),
            lr: 1.0,
            gamma: 1.0,
            step_size: 1,
            batch_size: 64,
            test_batch_size: 1000,
            epochs: 14,
            seed: 1,
            normalization: Normalization::MNIST,
            valid_size: 0,
            limit_train: None,
            limit_test: None,
        };
        match self {
            Self::PytorchExample => TrainConfig { gamma: 0.7, ..base },
            Self::Tch => TrainConfig {
                model: ModelKind::TchNet,
                optimizer: OptimizerConfig::new(OptimizerKind::Adam),
                lr: 1e-4,
                batch_size: 256,
                epochs: 50,
                normalization: Normalization::UNIT,
                ..base
            },
            Self::Flashlight => TrainConfig {
                model: ModelKind::FlashlightCnn,
                optimizer: OptimizerConfig::new(OptimizerKind::Sgd),
                lr: 1e-2,
                epochs: 100,
                normalization: Normalization::UNIT,
                valid_size: 5000,
                ..base
            },
        }
    }
}

/// Everything that determines a training run, saved with its checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    pub recipe: Recipe,
    pub model: ModelKind,
    pub dataset: Dataset,
    pub optimizer: OptimizerConfig,
    /// Learning rate of the first epoch.
    pub lr: f64,
    /// StepLR's decay factor (1.0: constant rate).
    pub gamma: f64,
    /// StepLR's period in epochs.
    pub step_size: usize,
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

/// A setting that cannot work, named as its flag.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("{flag} must be at least 1, got {value}")]
    Zero { flag: &'static str, value: usize },
    #[error("{flag} must be a positive finite number, got {value}")]
    NotPositive { flag: &'static str, value: f64 },
    #[error("{flag} must be a finite number, got {value}")]
    NotFinite { flag: &'static str, value: f64 },
    #[error("{flag} must be zero or a positive finite number, got {value}")]
    Negative { flag: &'static str, value: f64 },
    #[error("--valid-size {valid} leaves no training images out of {train}")]
    NoTrainingData { valid: usize, train: usize },
}

impl TrainConfig {
    pub fn schedule(&self) -> StepLr {
        StepLr {
            base_lr: self.lr,
            gamma: self.gamma,
            step_size: self.step_size,
        }
    }

    /// Checks the settings that do not depend on the data.
    /// Whether `train` training images leave any after the validation split.
    pub fn check_train_size(&self, train: usize) -> Result<(), ConfigError> {
        if self.valid_size >= train {
            return Err(ConfigError::NoTrainingData {
                valid: self.valid_size,
                train,
            });
        }
        Ok(())
    }

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
        let std = f64::from(self.normalization.std);
        for (flag, value) in [("--lr", self.lr), ("--gamma", self.gamma), ("--std", std)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigError::NotPositive { flag, value });
            }
        }
        let mean = f64::from(self.normalization.mean);
        if !mean.is_finite() {
            return Err(ConfigError::NotFinite {
                flag: "--mean",
                value: mean,
            });
        }
        let decay = self.optimizer.weight_decay;
        if !(decay.is_finite() && decay >= 0.0) {
            return Err(ConfigError::Negative {
                flag: "--weight-decay",
                value: decay,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                ModelKind::PytorchExampleNet,
                OptimizerKind::Adadelta,
                1.0,
                0.7,
                64,
                1000,
                14,
                1
            )
        );
        assert_eq!(p.normalization, Normalization::MNIST);
        let t = Recipe::Tch.config();
        assert_eq!(
            (t.model, t.optimizer.kind, t.lr, t.batch_size, t.epochs),
            (ModelKind::TchNet, OptimizerKind::Adam, 1e-4, 256, 50)
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
            (ModelKind::FlashlightCnn, OptimizerKind::Sgd, 1e-2, 64, 100, 5000)
        );
        assert_eq!(f.normalization, Normalization::UNIT);
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
            error(|c| c.normalization.std = 0.0),
            "--std must be a positive finite number, got 0"
        );
        assert_eq!(
            error(|c| c.normalization.std = -1.0),
            "--std must be a positive finite number, got -1"
        );
        assert_eq!(
            error(|c| c.normalization.mean = f32::NAN),
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
