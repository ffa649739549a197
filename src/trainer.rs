//! The library entry point: train any model (an [`EmberModel`]) from a user's own crate, with
//! everything `ember train` has: the dataset on the device, a recipe's PyTorch-exact optimizer
//! and schedule, `metrics.csv` and `curves.png`, checkpoints every epoch and on Ctrl-C/SIGTERM,
//! bit-identical `--resume`, the NaN guard. `ember train` runs the same code
//! ([`crate::tasks`]).
//!
//! ```no_run
//! # use ember::model::{ModelKind, ImageShape};
//! use ember::{config::Recipe, trainer::Trainer};
//! // Any EmberModel: ember's own (here the PyTorch example CNN) or yours.
//! let fitted = Trainer::new(Recipe::PytorchExample)
//!     .epochs(2)
//!     .run_dir("runs/example")
//!     .fit(ModelKind::PytorchExampleNet)?;
//! println!("{}", fitted.test.accuracy_text());
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::path::{Path, PathBuf};

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;

use crate::backend::{self, DeviceArg, DeviceInfo, Trains};
use crate::checkpoint::{RunDir, RunLock};
use crate::config::{Recipe, TrainConfig};
use crate::data::{Data, PerChannel};
use crate::model::{EmberModel, ModelName, Trainable};
use crate::run::Output;
use crate::tasks::{DataFlags, Given, TrainJob};
use crate::train::EvalStats;

/// A finished (or stopped) run: its directory and the final test evaluation.
#[derive(Debug)]
pub struct Fitted {
    pub run: RunDir,
    pub test: EvalStats,
}

/// Trains models with a recipe's settings, changed as asked.
#[derive(Clone, Debug)]
pub struct Trainer {
    config: TrainConfig,
    run_dir: Option<PathBuf>,
    device: DeviceArg,
    save_model: bool,
    quiet: bool,
    log_interval: usize,
    data: DataFlags,
    given: Given,
}

impl Trainer {
    /// `recipe`'s settings (optimizer, schedule, batch size, epochs, data, normalisation) as the
    /// starting point.
    pub fn new(recipe: Recipe) -> Self {
        Self::from_config(recipe.config())
    }

    /// Every setting given: a `config.json` of an earlier run, or a recipe's changed field by field.
    pub fn from_config(config: TrainConfig) -> Self {
        Self {
            config,
            run_dir: None,
            device: DeviceArg::Auto,
            save_model: true,
            quiet: false,
            log_interval: 0,
            data: DataFlags::default(),
            given: Given::default(),
        }
    }

    /// The settings, to change any of them (`trainer.config_mut().label_smoothing = 0.1`).
    pub fn config_mut(&mut self) -> &mut TrainConfig {
        &mut self.config
    }

    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    pub fn epochs(mut self, epochs: usize) -> Self {
        self.config.epochs = epochs;
        self
    }

    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.config.batch_size = batch_size;
        self
    }

    pub fn lr(mut self, lr: f64) -> Self {
        self.config.lr = lr;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// Train on the first `n` training images only.
    pub fn limit_train(mut self, n: usize) -> Self {
        self.config.limit_train = Some(n);
        self
    }

    /// Evaluate on the first `n` test images only.
    pub fn limit_test(mut self, n: usize) -> Self {
        self.config.limit_test = Some(n);
        self
    }

    /// Input normalisation, one value or one per channel, instead of the recipe's (MNIST) or
    /// the one measured on the training images (other data).
    pub fn normalization(mut self, mean: Vec<f32>, std: Vec<f32>) -> Self {
        self.config.normalization.mean = PerChannel(mean);
        self.config.normalization.std = PerChannel(std);
        self.given.mean = true;
        self.given.std = true;
        self
    }

    /// Where config, checkpoints and metrics go; it must not exist or be empty
    /// (default: `runs/<model>-<UTC time>`).
    pub fn run_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.run_dir = Some(dir.into());
        self
    }

    /// `auto` (the first CUDA device when compiled in and present, else the CPU), `cpu`, `cuda:N`.
    pub fn device(mut self, device: DeviceArg) -> Self {
        self.device = device;
        self
    }

    /// Print only the final result.
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// Check the loss (a device sync) and print it every `n` steps.
    pub fn log_interval(mut self, n: usize) -> Self {
        self.log_interval = n;
        self
    }

    /// Write checkpoints (on by default).
    pub fn save_model(mut self, save: bool) -> Self {
        self.save_model = save;
        self
    }

    /// The folder of an MNIST-format or CIFAR dataset's files [default: found as `ember train`
    /// finds it].
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data.data_dir = Some(dir.into());
        self
    }

    /// Never download a missing dataset.
    pub fn offline(mut self, offline: bool) -> Self {
        self.data.offline = offline;
        self
    }

    /// Trains `model` on the configured dataset (`config().dataset`, MNIST by default), on the
    /// device [`Trainer::device`] picks.
    pub fn fit<D: Trains>(self, model: D) -> Result<Fitted> {
        let device = backend::resolve(self.device)?;
        let flags = self.data.clone();
        self.fit_with(model, false, |c| {
            Ok(crate::data::load(&c.dataset, &flags.options(c, &device, true))?)
        })
    }

    /// Trains `model` on the user's own `data` ([`Data::from_memory`]): its class names and
    /// per-channel statistics are recorded in the run's `config.json`.
    pub fn fit_data<D: Trains>(self, model: D, data: Data) -> Result<Fitted> {
        self.fit_with(model, true, move |_| Ok(data))
    }

    fn fit_with<D: Trains>(
        self,
        model: D,
        own_data: bool,
        load: impl FnOnce(&TrainConfig) -> Result<Data>,
    ) -> Result<Fitted> {
        let device = self.device;
        let resolved = backend::resolve(device).ok();
        let (job, _lock) = self.start(&model, own_data, resolved, load)?;
        let run = job.run.clone();
        crate::run::install_interrupt_handler();
        let test = backend::dispatch_model(device, &model, job)??;
        Ok(Fitted { run, test })
    }

    /// Trains `model` on backend `B` and returns the trained network as well. `data` is the
    /// user's own when `own_data` (as [`Trainer::fit_data`]), else `config().dataset` read.
    pub fn fit_on<B: AutodiffBackend, D: EmberModel>(
        self,
        model: &D,
        data: Data,
        own_data: bool,
        device: &B::Device,
    ) -> Result<(D::Net<B>, Fitted)>
    where
        D::Net<B>: Trainable<B>,
    {
        // B's device is the caller's: its memory is not known here.
        let (job, _lock) = self.start(model, own_data, None, move |_| Ok(data))?;
        let run = job.run.clone();
        let info = DeviceInfo {
            backend: std::any::type_name::<B>(),
            device: format!("{device:?}"),
            cuda: None,
        };
        let (net, test) = job.train_on::<B, D>(model, device, &info)?;
        Ok((net, Fitted { run, test }))
    }

    /// Continues the run in `dir` from its last checkpoint, with its own settings, to
    /// `epochs` epochs when given (a step schedule only; others have a fixed length), as
    /// `ember train --resume` does. `data`: the user's own, as the run was started with; `None`
    /// reads the run's dataset again, as it was trained on.
    pub fn resume<D: Trains>(
        model: D,
        dir: &Path,
        epochs: Option<usize>,
        data: Option<Data>,
        device: DeviceArg,
    ) -> Result<Fitted> {
        let check = |c: &TrainConfig| {
            anyhow::ensure!(
                c.model.name() == model.name(),
                "{}: the run trained {}, not {}",
                dir.display(),
                c.model,
                model.name()
            );
            Ok(c.check_input(|input| model.fits(input))?)
        };
        let load = |c: &TrainConfig| match data {
            Some(data) => Ok(data),
            None => {
                let options = DataFlags::default().options(c, &backend::resolve(device)?, false);
                Ok(crate::data::load(&c.dataset, &options)?)
            }
        };
        let (config, run, _lock, data) = crate::tasks::resume_run(dir, epochs, check, load)?;
        let job = TrainJob {
            config,
            data,
            run: run.clone(),
            resume: true,
            save_model: true,
            output: Output::new(false, 0),
        };
        crate::run::install_interrupt_handler();
        let test = backend::dispatch_model(device, &model, job)??;
        Ok(Fitted { run, test })
    }

    /// A new run directory for `model` with its `config.json`, fitted to the data `load` reads
    /// ([`crate::tasks::start_run`], as `ember train`).
    /// `device`: where the run trains, for the memory check (none where unknown).
    fn start<D: EmberModel>(
        mut self,
        model: &D,
        own_data: bool,
        device: Option<backend::Resolved>,
        load: impl FnOnce(&TrainConfig) -> Result<Data>,
    ) -> Result<(TrainJob, RunLock)> {
        self.config.model = ModelName::new(model.name());
        if let Some(dir) = &self.data.data_dir {
            self.config.data_dir = std::path::absolute(dir).ok();
        }
        self.config.validate()?;
        let given = Given {
            own_data,
            ..self.given
        };
        let (config, run, lock, data) = crate::tasks::start_run(
            self.config,
            self.run_dir,
            model.name(),
            |c, data| {
                crate::tasks::check_new_run(
                    c,
                    data,
                    |input| model.fits(input),
                    |input| model.activation_bytes(input),
                    device.as_ref(),
                )
            },
            given,
            self.quiet,
            load,
        )?;
        let job = TrainJob {
            config,
            data,
            run,
            resume: false,
            save_model: self.save_model,
            output: Output::new(self.quiet, self.log_interval),
        };
        Ok((job, lock))
    }
}
