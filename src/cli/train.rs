//! `ember train`: a fresh run from a recipe and flags, or `--resume` of a run directory.

use std::path::PathBuf;

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;
use clap::Args;

use super::DataArgs;
use crate::backend::{self, BackendTask, DeviceArg, DeviceInfo};
use crate::checkpoint::RunDir;
use crate::config::{Recipe, TrainConfig};
use crate::data::Mnist;
use crate::model::ModelKind;
use crate::optim::OptimizerKind;
use crate::train::Splits;

/// `ember train`. Flag names follow PyTorch's MNIST example.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Seed run to reproduce; the flags below override its settings.
    #[arg(long, value_enum, default_value_t = Recipe::PytorchExample)]
    pub recipe: Recipe,
    /// Model [default: the recipe's].
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// Optimizer [default: the recipe's].
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerKind>,
    /// Input batch size for training [pytorch-example: 64, tch: 256, flashlight: 64].
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Input batch size for testing [default: 1000].
    #[arg(long)]
    pub test_batch_size: Option<usize>,
    /// Number of epochs to train [pytorch-example: 14, tch: 50, flashlight: 100].
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Learning rate [pytorch-example: 1.0, tch: 1e-4, flashlight: 1e-2].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Learning rate step gamma (StepLR, per epoch) [pytorch-example: 0.7, others: 1.0].
    #[arg(long)]
    pub gamma: Option<f64>,
    /// Epochs between learning rate decays [default: 1].
    #[arg(long)]
    pub step_size: Option<usize>,
    /// L2 weight decay, as torch.optim's weight_decay [default: 0].
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Random seed: initial weights, shuffling and dropout [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Input normalisation mean, on the 0..1 pixel scale: x = (pixel / 255 - mean) / std
    /// [pytorch-example: 0.1307, tch: 0, flashlight: 127/255].
    #[arg(long)]
    pub mean: Option<f32>,
    /// Input normalisation standard deviation [pytorch-example: 0.3081, others: 1].
    #[arg(long)]
    pub std: Option<f32>,
    /// Hold out the first N training images for validation [flashlight: 5000, others: 0].
    #[arg(long, value_name = "N")]
    pub valid_size: Option<usize>,
    /// Train on the first N training images only (after the validation split).
    #[arg(long, value_name = "N")]
    pub limit_train: Option<usize>,
    /// Evaluate on the first N test images only.
    #[arg(long, value_name = "N")]
    pub limit_test: Option<usize>,
    /// Check the training loss every N batches (a device sync each time): printed as a line
    /// when stderr is not a terminal, shown in the progress bar when it is [default: 10 with a
    /// progress bar, else 100, not printed].
    #[arg(long, value_name = "N")]
    pub log_interval: Option<usize>,
    /// Write the model checkpoint into the run directory after each epoch (--save-model=false: don't).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub save_model: bool,
    /// Where config and checkpoints go; must not exist or be empty [default: runs/<recipe>-<UTC time>].
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Continue the run in DIR from its last checkpoint, with its own settings (--epochs N
    /// extends it).
    #[arg(long, value_name = "DIR", conflicts_with_all = [
        "recipe", "model", "optimizer", "batch_size", "test_batch_size", "lr", "gamma", "step_size",
        "weight_decay", "seed", "mean", "std", "valid_size", "limit_train", "limit_test", "run_dir", "dataset",
    ])]
    pub resume: Option<PathBuf>,
    /// Print only the final result (no progress bars, no per-epoch lines).
    #[arg(long, short)]
    pub quiet: bool,
    /// auto, cpu, cuda or cuda:N [default: auto: the first CUDA device if compiled in and present, else cpu].
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    #[command(flatten)]
    pub data: DataArgs,
}

impl TrainArgs {
    /// The recipe's settings with this command line's overrides.
    pub fn config(&self) -> TrainConfig {
        let mut c = self.recipe.config();
        macro_rules! set {
            ($($field:ident),*) => {$( if let Some(v) = self.$field { c.$field = v; } )*};
        }
        set!(
            model,
            batch_size,
            test_batch_size,
            epochs,
            lr,
            gamma,
            step_size,
            seed,
            valid_size
        );
        if let Some(kind) = self.optimizer {
            c.optimizer = crate::optim::OptimizerConfig::new(kind);
        }
        if let Some(wd) = self.weight_decay {
            c.optimizer.weight_decay = wd;
        }
        if let Some(d) = self.data.dataset {
            c.dataset = d;
        }
        if let Some(mean) = self.mean {
            c.normalization.mean = mean;
        }
        if let Some(std) = self.std {
            c.normalization.std = std;
        }
        c.limit_train = self.limit_train;
        c.limit_test = self.limit_test;
        c
    }
}

pub fn run(args: TrainArgs) -> Result<()> {
    match &args.resume {
        Some(dir) => resume(dir, &args),
        None => fresh(&args),
    }
}

/// A new run: the recipe with the flags' overrides, in a new run directory.
fn fresh(args: &TrainArgs) -> Result<()> {
    let config = args.config();
    config.validate()?;
    // A wrong --device fails before data is read or a run directory is made.
    backend::resolve(args.device)?;
    let run = match &args.run_dir {
        Some(dir) => RunDir::create(dir.clone())?,
        None => RunDir::fresh_default(config.recipe.name())?,
    };
    let data = match Mnist::load(&args.data.source(config.dataset)) {
        Ok(data) => data,
        Err(e) => {
            // Nothing was written into the new run directory yet: do not leave it behind.
            let _ = std::fs::remove_dir(&run.path);
            return Err(e.into());
        }
    };
    run.save_config(&config)?;
    dispatch(args, config, data, run, false)
}

/// `--resume DIR`: the run's own settings; `--epochs N` extends it.
fn resume(dir: &std::path::Path, args: &TrainArgs) -> Result<()> {
    let run = RunDir::open(dir)?;
    let mut config = run.load_config()?;
    if let Some(epochs) = args.epochs {
        config.epochs = epochs;
        run.save_config(&config)?;
    }
    config.validate()?;
    backend::resolve(args.device)?;
    let data = Mnist::load(&args.data.source(config.dataset))?;
    dispatch(args, config, data, run, true)
}

fn dispatch(args: &TrainArgs, config: TrainConfig, data: Mnist, run: RunDir, resume: bool) -> Result<()> {
    crate::run::install_interrupt_handler();
    let task = TrainTask {
        config,
        data,
        run,
        resume,
        save_model: args.save_model,
        output: crate::run::Output::new(args.quiet, args.log_interval.unwrap_or(0)),
    };
    backend::dispatch(args.device, task)?
}

struct TrainTask {
    config: TrainConfig,
    data: Mnist,
    run: RunDir,
    resume: bool,
    save_model: bool,
    output: crate::run::Output,
}

impl BackendTask for TrainTask {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let Self {
            config,
            data,
            run,
            resume,
            save_model,
            output,
        } = self;
        let splits = Splits::<B::InnerBackend>::upload(&data, &config, &device)?;
        drop(data);
        let start = if resume {
            crate::run::Start::<B>::resume(&run, &config, &device)?
        } else {
            crate::run::Start::<B>::fresh(&config, &device)
        };
        if !output.quiet {
            println!(
                "{}",
                crate::run::header(&config, &start.model, &splits, &info.to_string(), &run)
            );
            if resume {
                println!(
                    "resuming after {} completed epochs ({} steps)",
                    start.progress.epoch, start.progress.global_step
                );
            }
        }
        crate::run::train(&config, &splits, &run, start, save_model, output)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn flags_override_the_recipe() {
        let cli = Cli::try_parse_from([
            "ember",
            "train",
            "--recipe",
            "flashlight",
            "--epochs",
            "1",
            "--lr",
            "0.05",
            "--optimizer",
            "adam",
            "--weight-decay",
            "0.01",
            "--valid-size",
            "0",
            "--limit-train",
            "1000",
        ])
        .unwrap();
        let Command::Train(args) = cli.command else {
            panic!()
        };
        let c = args.config();
        assert_eq!(
            (c.epochs, c.lr, c.optimizer.kind, c.optimizer.weight_decay),
            (1, 0.05, OptimizerKind::Adam, 0.01)
        );
        assert_eq!((c.valid_size, c.limit_train, c.batch_size), (0, Some(1000), 64));
        assert_eq!(c.model, ModelKind::FlashlightCnn);
        assert!(args.save_model);
    }

    #[test]
    fn save_model_accepts_pytorch_style_and_false() {
        for (argv, want) in [
            (&["--save-model"][..], true),
            (&["--save-model=false"][..], false),
            (&[][..], true),
        ] {
            let cli = Cli::try_parse_from(["ember", "train"].iter().chain(argv)).unwrap();
            let Command::Train(args) = cli.command else {
                panic!()
            };
            assert_eq!(args.save_model, want, "{argv:?}");
        }
    }
}
