//! `ember train`: a fresh run from a recipe and flags, or `--resume` of a run directory.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use super::DataArgs;
use crate::backend::{self, DeviceArg};
use crate::checkpoint::RunDir;
use crate::config::{ConfigError, Recipe, TrainConfig};
use crate::data::{Data, PerChannel};
use crate::model::ModelName;
use crate::optim::{Anneal, OneCycle, OptimizerKind, Schedule};
use crate::registry;
use crate::tasks::TrainJob;
pub use crate::tasks::SKIPPED_FILE;

/// A flag's help with every recipe's value of the setting it overrides: `TEXT [pytorch-example:
/// 64, tch: 256, flashlight: 64]`, or `TEXT [default: 1000]` when the recipes agree. Generated
/// from [`Recipe::config`], the one source of the recipes' settings.
fn per_recipe(text: &str, value: impl Fn(&TrainConfig) -> String) -> String {
    let values: Vec<(Recipe, String)> = Recipe::value_variants()
        .iter()
        .map(|&r| (r, value(&r.config())))
        .collect();
    let stated = if values.iter().all(|(_, v)| *v == values[0].1) {
        format!("default: {}", values[0].1)
    } else {
        let each: Vec<String> = values.iter().map(|(r, v)| format!("{}: {v}", r.name())).collect();
        each.join(", ")
    };
    format!("{text} [{stated}]")
}

/// The command-line spelling of a value.
fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .expect("no skipped values")
        .get_name()
        .to_string()
}

/// `ember train`. Flag names follow PyTorch's MNIST example.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Seed run to reproduce; the flags below override its settings.
    #[arg(long, value_enum, default_value_t = Recipe::PytorchExample)]
    pub recipe: Recipe,
    #[arg(long, value_parser = registry::parse_model, help = per_recipe("Model (`ember info` lists them)", |c| c.model.name().into()))]
    pub model: Option<ModelName>,
    #[arg(long, value_enum, help = per_recipe("Optimizer", |c| value_name(c.optimizer.kind)))]
    pub optimizer: Option<OptimizerKind>,
    #[arg(long, help = per_recipe("Input batch size for training", |c| c.batch_size.to_string()))]
    pub batch_size: Option<usize>,
    #[arg(long, help = per_recipe("Input batch size for testing", |c| c.test_batch_size.to_string()))]
    pub test_batch_size: Option<usize>,
    #[arg(long, help = per_recipe("Number of epochs to train", |c| c.epochs.to_string()))]
    pub epochs: Option<usize>,
    #[arg(long, help = per_recipe("Learning rate", |c| c.lr.to_string()))]
    pub lr: Option<f64>,
    #[arg(long, help = per_recipe("Learning rate step gamma (StepLR, per epoch)", |c| c.gamma.to_string()))]
    pub gamma: Option<f64>,
    #[arg(long, help = per_recipe("Epochs between learning rate decays", |c| c.step_size.to_string()))]
    pub step_size: Option<usize>,
    #[arg(long, help = per_recipe("L2 weight decay, as torch.optim's weight_decay", |c| c.optimizer.weight_decay.to_string()))]
    pub weight_decay: Option<f64>,
    /// Leave 1-D parameters (biases, BatchNorm's weight and bias) out of --weight-decay
    /// (--no-decay-1d=false: decay them too) [default: as the recipe].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_decay_1d: Option<bool>,
    #[arg(long, help = per_recipe("SGD momentum (0: none); one-cycle's --cycle-momentum sets it per step", |c| c.optimizer.momentum.to_string()))]
    pub momentum: Option<f64>,
    /// SGD dampening of the momentum [default: 0].
    #[arg(long)]
    pub dampening: Option<f64>,
    /// SGD with Nesterov momentum (--nesterov=false: plain momentum) [default: as the recipe].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub nesterov: Option<bool>,
    #[arg(long, help = per_recipe("Label smoothing of the training loss, as F.cross_entropy's", |c| c.label_smoothing.to_string()))]
    pub label_smoothing: Option<f64>,
    #[arg(long, value_name = "PIXELS", help = per_recipe(
        "Shift each training image by up to this many pixels, as RandomCrop(28, padding=PIXELS)",
        |c| c.augment.translate.to_string(),
    ))]
    pub translate: Option<usize>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, help = per_recipe(
        "Mirror half the training images left to right (--flip=false: don't)",
        |c| c.augment.flip.to_string(),
    ))]
    pub flip: Option<bool>,
    /// Stop after the first epoch whose test accuracy reaches PERCENT, and print the time since
    /// the process started [speedrun: 99, others: none].
    #[arg(long, value_name = "PERCENT")]
    pub target_accuracy: Option<f64>,
    #[arg(long, value_enum, help = per_recipe(
        "Learning-rate schedule: step (StepLR per epoch, --gamma, --step-size), one-cycle (OneCycleLR per step, --lr is max_lr), warmup-cosine (linear warm-up over --warmup-steps, then cosine to 0)",
        |c| value_name(ScheduleKind::of(&c.schedule)),
    ))]
    pub schedule: Option<ScheduleKind>,
    /// warmup-cosine: optimizer steps of linear warm-up [default: 0].
    #[arg(long, value_name = "N")]
    pub warmup_steps: Option<usize>,
    /// one-cycle: fraction of the steps spent raising the rate [default: 0.3].
    #[arg(long)]
    pub pct_start: Option<f64>,
    /// one-cycle: how the rate moves between its values [default: cos].
    #[arg(long, value_enum)]
    pub anneal: Option<Anneal>,
    /// one-cycle: the first rate is --lr / div-factor [default: 25].
    #[arg(long)]
    pub div_factor: Option<f64>,
    /// one-cycle: the last rate is the first / final-div-factor [default: 10000].
    #[arg(long)]
    pub final_div_factor: Option<f64>,
    /// one-cycle: a third phase back down to the first rate before the final one [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub three_phase: Option<bool>,
    /// one-cycle: move SGD's momentum (Adam's beta1) against the rate, between --max-momentum and
    /// --base-momentum (--cycle-momentum=false: keep --momentum) [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub cycle_momentum: Option<bool>,
    /// one-cycle: the momentum at the rate's peak [default: 0.85].
    #[arg(long)]
    pub base_momentum: Option<f64>,
    /// one-cycle: the momentum at the rate's lowest [default: 0.95].
    #[arg(long)]
    pub max_momentum: Option<f64>,
    #[arg(long, help = per_recipe("Random seed: initial weights, shuffling and dropout", |c| c.seed.to_string()))]
    pub seed: Option<u64>,
    #[arg(long, value_delimiter = ',', value_name = "MEAN[,MEAN,MEAN]", help = per_recipe(
        "Input normalisation mean, on the 0..1 pixel scale, one value or one per channel: x = (pixel / 255 - mean) / std. \
         CIFAR and folders: computed from the training images unless given",
        |c| c.normalization.mean.to_string(),
    ))]
    pub mean: Option<Vec<f32>>,
    #[arg(long, value_delimiter = ',', value_name = "STD[,STD,STD]", help = per_recipe(
        "Input normalisation standard deviation, one value or one per channel",
        |c| c.normalization.std.to_string(),
    ))]
    pub std: Option<Vec<f32>>,
    #[arg(long, value_name = "N", help = per_recipe(
        "Hold out the first N training images for validation",
        |c| c.valid_size.to_string(),
    ))]
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
        "no_decay_1d", "momentum", "dampening", "nesterov", "label_smoothing", "schedule", "warmup_steps",
        "pct_start", "anneal", "div_factor", "final_div_factor", "three_phase", "cycle_momentum",
        "base_momentum", "max_momentum", "translate", "flip", "target_accuracy", "image_size", "channels",
        "val_fraction", "skip_bad_images",
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

/// `--schedule`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScheduleKind {
    Step,
    OneCycle,
    WarmupCosine,
}

impl ScheduleKind {
    pub fn of(schedule: &Schedule) -> Self {
        match schedule {
            Schedule::Step => Self::Step,
            Schedule::OneCycle(_) => Self::OneCycle,
            Schedule::WarmupCosine { .. } => Self::WarmupCosine,
        }
    }
}

impl TrainArgs {
    /// The recipe's settings with this command line's overrides. A flag that belongs to another
    /// schedule than the run's is an error, not ignored.
    pub fn config(&self) -> Result<TrainConfig, ConfigError> {
        let mut c = self.recipe.config();
        macro_rules! set {
            ($($field:ident),*) => {$( if let Some(v) = self.$field { c.$field = v; } )*};
        }
        if let Some(model) = &self.model {
            c.model = model.clone();
        }
        set!(
            batch_size,
            test_batch_size,
            epochs,
            lr,
            gamma,
            step_size,
            seed,
            valid_size,
            label_smoothing
        );
        if let Some(kind) = self.optimizer {
            if kind != c.optimizer.kind {
                c.optimizer = crate::optim::OptimizerConfig::new(kind);
            }
        }
        let o = &mut c.optimizer;
        macro_rules! set_optim {
            ($($field:ident),*) => {$( if let Some(v) = self.$field { o.$field = v; } )*};
        }
        set_optim!(weight_decay, no_decay_1d, momentum, dampening, nesterov);
        if let Some(d) = &self.data.dataset {
            c.dataset = d.clone().absolute();
        }
        if let Some(f) = self.data.val_fraction {
            c.val_fraction = f;
        }
        c.skip_bad_images = self.data.skip_bad_images;
        if let Some(t) = self.translate {
            c.augment.translate = t;
        }
        if let Some(f) = self.flip {
            c.augment.flip = f;
        }
        if self.target_accuracy.is_some() {
            c.target_accuracy = self.target_accuracy;
        }
        if let Some(mean) = &self.mean {
            c.normalization.mean = PerChannel(mean.clone());
        }
        if let Some(std) = &self.std {
            c.normalization.std = PerChannel(std.clone());
        }
        c.limit_train = self.limit_train;
        c.limit_test = self.limit_test;
        self.set_schedule(&mut c.schedule)?;
        Ok(c)
    }

    fn set_schedule(&self, schedule: &mut Schedule) -> Result<(), ConfigError> {
        if let Some(kind) = self.schedule {
            if kind != ScheduleKind::of(schedule) {
                *schedule = match kind {
                    ScheduleKind::Step => Schedule::Step,
                    ScheduleKind::OneCycle => Schedule::OneCycle(OneCycle::default()),
                    ScheduleKind::WarmupCosine => Schedule::WarmupCosine { warmup_steps: 0 },
                };
            }
        }
        let wrong = |flag: &'static str, needs: ScheduleKind| ConfigError::OtherSchedule {
            flag,
            needs: value_name(needs),
        };
        if let Some(n) = self.warmup_steps {
            match schedule {
                Schedule::WarmupCosine { warmup_steps } => *warmup_steps = n,
                _ => return Err(wrong("--warmup-steps", ScheduleKind::WarmupCosine)),
            }
        }
        macro_rules! one_cycle {
            ($($field:ident => $flag:literal),*) => {$(
                if let Some(v) = self.$field {
                    match schedule {
                        Schedule::OneCycle(c) => c.$field = v,
                        _ => return Err(wrong($flag, ScheduleKind::OneCycle)),
                    }
                }
            )*};
        }
        one_cycle!(
            pct_start => "--pct-start",
            anneal => "--anneal",
            div_factor => "--div-factor",
            final_div_factor => "--final-div-factor",
            three_phase => "--three-phase",
            cycle_momentum => "--cycle-momentum",
            base_momentum => "--base-momentum",
            max_momentum => "--max-momentum"
        );
        Ok(())
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
    let mut config = args.config()?;
    if let Some(dir) = &args.data.data_dir {
        config.data_dir = std::path::absolute(dir).ok();
    }
    config.validate()?;
    let model = registry::global().get(config.model.name())?;
    // A wrong --device fails before data is read or a run directory is made.
    let device = backend::resolve(args.device)?;
    let given = crate::tasks::Given {
        mean: args.mean.is_some(),
        std: args.std.is_some(),
        own_data: false,
    };
    let name = config.recipe.name();
    // Ctrl-C or SIGTERM while the images are read stops reading, and the new run directory is
    // removed (exit 130, as during training).
    crate::run::install_interrupt_handler();
    let (config, run, _lock, data) = crate::tasks::start_run(
        config,
        args.run_dir.clone(),
        name,
        |c, data| {
            crate::tasks::check_new_run(
                c,
                data,
                |input| model.fits(input),
                |input| model.activation_bytes(input),
                Some(&device),
            )
        },
        given,
        args.quiet,
        |c| {
            Ok(crate::data::load(
                &c.dataset,
                &args.data.options(c, &device, true),
            )?)
        },
    )?;
    dispatch(args, config, data, run, false)
}

/// `--resume DIR`: the run's own settings; `--epochs N` extends it.
fn resume(dir: &std::path::Path, args: &TrainArgs) -> Result<()> {
    let check = |c: &TrainConfig| {
        let model = registry::global().get(c.model.name())?;
        Ok(c.check_input(|input| model.fits(input))?)
    };
    crate::run::install_interrupt_handler();
    let (config, run, _lock, data) = crate::tasks::resume_run(dir, args.epochs, check, |c| {
        let device = backend::resolve(args.device)?;
        Ok(crate::data::load(
            &c.dataset,
            &args.data.options(c, &device, false),
        )?)
    })?;
    dispatch(args, config, data, run, true)
}

fn dispatch(args: &TrainArgs, config: TrainConfig, data: Data, run: RunDir, resume: bool) -> Result<()> {
    crate::run::install_interrupt_handler();
    let model = registry::global().get(config.model.name())?;
    let job = TrainJob {
        config,
        data,
        run,
        resume,
        save_model: args.save_model,
        output: crate::run::Output::new(args.quiet, args.log_interval.unwrap_or(0)),
    };
    model.train(args.device, job)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::model::ModelKind;

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
        let c = args.config().unwrap();
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

    /// Every recipe's value of the setting that `flag` overrides, as the help and README state it.
    fn setting(flag: &str, c: &TrainConfig) -> String {
        match flag {
            "model" => c.model.name().into(),
            "optimizer" => value_name(c.optimizer.kind),
            "batch_size" => c.batch_size.to_string(),
            "test_batch_size" => c.test_batch_size.to_string(),
            "epochs" => c.epochs.to_string(),
            "lr" => c.lr.to_string(),
            "gamma" => c.gamma.to_string(),
            "step_size" => c.step_size.to_string(),
            "weight_decay" => c.optimizer.weight_decay.to_string(),
            "seed" => c.seed.to_string(),
            "mean" => c.normalization.mean.to_string(),
            "std" => c.normalization.std.to_string(),
            "valid_size" => c.valid_size.to_string(),
            "momentum" => c.optimizer.momentum.to_string(),
            "label_smoothing" => c.label_smoothing.to_string(),
            "schedule" => value_name(ScheduleKind::of(&c.schedule)),
            "translate" => c.augment.translate.to_string(),
            "flip" => c.augment.flip.to_string(),
            _ => panic!("no recipe setting behind --{flag}"),
        }
    }

    /// The `[name: value, ...]` at the end of a help text, by recipe name ("default" for all).
    fn stated(help: &str) -> Vec<(String, String)> {
        let open = help
            .rfind('[')
            .unwrap_or_else(|| panic!("no [..] default in {help:?}"));
        let inner = help[open + 1..].strip_suffix(']').expect("help ends with ]");
        inner
            .split(", ")
            .map(|pair| {
                let (name, value) = pair
                    .split_once(": ")
                    .unwrap_or_else(|| panic!("{pair:?} in {help:?}"));
                (name.to_string(), value.to_string())
            })
            .collect()
    }

    /// Numbers compare as numbers ("1.0" states 1), names as text.
    fn same(a: &str, b: &str) -> bool {
        match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(x), Ok(y)) => x == y,
            _ => a == b,
        }
    }

    #[test]
    fn help_states_each_recipes_defaults() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        let train = cli.find_subcommand_mut("train").unwrap();
        // `ember train --help`, whitespace squashed: clap wraps lines to the terminal.
        let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let rendered = squash(&train.render_long_help().to_string());
        let flags = [
            "model",
            "optimizer",
            "batch_size",
            "test_batch_size",
            "epochs",
            "lr",
            "gamma",
            "step_size",
            "weight_decay",
            "seed",
            "mean",
            "std",
            "valid_size",
            "momentum",
            "label_smoothing",
            "schedule",
            "translate",
            "flip",
        ];
        for flag in flags {
            let arg = train.get_arguments().find(|a| a.get_id() == flag).unwrap();
            let help = arg.get_help().unwrap().to_string();
            assert!(
                rendered.contains(&squash(&help)),
                "--{flag}'s help is not in `ember train --help`: {help:?}"
            );
            for recipe in Recipe::value_variants() {
                let want = setting(flag, &recipe.config());
                let says = stated(&help)
                    .into_iter()
                    .find(|(name, _)| name == recipe.name() || name == "default")
                    .unwrap_or_else(|| panic!("--{flag}: {help:?} says nothing about {}", recipe.name()));
                assert!(
                    same(&says.1, &want),
                    "--{flag}: the help says {} for {}, the recipe has {want}",
                    says.1,
                    recipe.name()
                );
            }
        }
        // --recipe's value descriptions.
        for recipe in Recipe::value_variants() {
            let c = recipe.config();
            let summary = recipe.summary();
            for fact in [
                format!("{} lr {}", value_name(c.optimizer.kind), c.lr),
                format!("batch {}", c.batch_size),
                format!("{} epochs", c.epochs),
                c.model.name().to_string(),
            ] {
                assert!(
                    summary.contains(&fact),
                    "{}: {summary:?} lacks {fact:?}",
                    recipe.name()
                );
            }
            assert!(
                rendered.contains(&squash(&summary)),
                "`ember train --help` lacks {summary:?}"
            );
        }
    }

    /// README.md's recipe table, row by row, against the recipes.
    #[test]
    fn readme_recipe_table_matches_the_recipes() {
        let readme = include_str!("../../README.md");
        for recipe in Recipe::value_variants() {
            let c = recipe.config();
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", recipe.name())))
                .unwrap_or_else(|| panic!("README has no table row for {}", recipe.name()));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            // | recipe | model | parameters | optimizer | batch | epochs | data |
            let (optimizer, batch, epochs, data) = (cells[4], cells[5], cells[6], cells[7]);
            let name = recipe.name();
            assert!(
                optimizer
                    .to_lowercase()
                    .starts_with(&value_name(c.optimizer.kind)),
                "{name}: README says {optimizer:?}"
            );
            let lr = optimizer
                .split("lr ")
                .nth(1)
                .unwrap()
                .split([',', ' '])
                .next()
                .unwrap();
            assert!(
                same(lr, &c.lr.to_string()),
                "{name}: README lr {lr}, recipe {}",
                c.lr
            );
            let gamma = optimizer
                .split("γ ")
                .nth(1)
                .map_or("1", |g| g.split([',', ' ']).next().unwrap());
            assert!(
                same(gamma, &c.gamma.to_string()),
                "{name}: README γ {gamma}, recipe {}",
                c.gamma
            );
            assert!(
                same(batch, &c.batch_size.to_string()),
                "{name}: README batch {batch}"
            );
            let (count, target) = match epochs.split_once(", stops at ") {
                Some((count, rest)) => (count, rest.split('%').next()),
                None => (epochs, None),
            };
            assert!(
                same(count, &c.epochs.to_string()),
                "{name}: README epochs {epochs}"
            );
            assert_eq!(
                target.map(|t| t.parse::<f64>().unwrap()),
                c.target_accuracy,
                "{name}: README epochs {epochs:?}"
            );
            let params = cells[3].replace(',', "");
            let builtin = registry::Registry::builtin();
            let model = builtin.get(c.model.name()).unwrap();
            assert_eq!(
                params,
                model.trainable_params(c.input, c.num_classes()).to_string(),
                "{name}: README parameters"
            );
            let (mean, std) = match data.split_once("mean ") {
                Some((_, rest)) => {
                    let mean = rest.split(',').next().unwrap();
                    let std = rest
                        .split("std ")
                        .nth(1)
                        .unwrap()
                        .split([',', ' '])
                        .next()
                        .unwrap();
                    (mean.to_string(), std.to_string())
                }
                None => {
                    assert!(data.starts_with("x/255"), "{name}: README data {data:?}");
                    ("0".into(), "1".into())
                }
            };
            assert!(
                same(&mean, &c.normalization.mean.to_string()),
                "{name}: README mean {mean}"
            );
            assert!(
                same(&std, &c.normalization.std.to_string()),
                "{name}: README std {std}"
            );
            let held_out = match data.split_once("k/") {
                Some((_, rest)) => rest.split('k').next().unwrap().parse::<usize>().unwrap() * 1000,
                None => 0,
            };
            assert_eq!(held_out, c.valid_size, "{name}: README data {data:?}");
        }
    }

    /// `--resume` continues a run with its own settings: every flag that would change one must
    /// be refused with it, including flags added later.
    #[test]
    fn resume_refuses_every_setting_of_the_run() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        cli.build();
        let train = cli.find_subcommand("train").unwrap();
        let resume = train.get_arguments().find(|a| a.get_id() == "resume").unwrap();
        let refused: Vec<&str> = train
            .get_arg_conflicts_with(resume)
            .iter()
            .map(|a| a.get_id().as_str())
            .collect();
        // How long it runs, what it prints and saves, where it runs, where the data is read and
        // the memory guards on reading it.
        let allowed = [
            "max_image_pixels",
            "max_dataset_memory",
            "resume",
            "epochs",
            "save_model",
            "quiet",
            "log_interval",
            "device",
            "data_dir",
            "offline",
            "help",
            "version",
        ];
        for arg in train.get_arguments() {
            let id = arg.get_id().as_str();
            assert!(
                allowed.contains(&id) != refused.contains(&id),
                "--{id}: {} with --resume",
                if allowed.contains(&id) {
                    "allowed but refused"
                } else {
                    "accepted"
                }
            );
        }
    }
}
