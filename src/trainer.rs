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
use crate::data::{Data, LoadOptions, PerChannel};
use crate::model::{EmberModel, ModelName, Trainable};
use crate::run::Output;
use crate::tasks::{Given, TrainJob};
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
    data_dir: Option<PathBuf>,
    offline: bool,
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
            data_dir: None,
            offline: false,
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
        self.data_dir = Some(dir.into());
        self
    }

    /// Never download a missing dataset.
    pub fn offline(mut self, offline: bool) -> Self {
        self.offline = offline;
        self
    }

    /// Trains `model` on the configured dataset (`config().dataset`, MNIST by default), on the
    /// device [`Trainer::device`] picks.
    pub fn fit<D: Trains>(self, model: D) -> Result<Fitted> {
        let device = backend::resolve(self.device)?;
        let data = crate::data::load(&self.config.dataset, &self.load_options(&device))?;
        self.fit_loaded(model, data, false)
    }

    /// Trains `model` on the user's own `data` ([`Data::from_memory`]): its class names and
    /// per-channel statistics are recorded in the run's `config.json`.
    pub fn fit_data<D: Trains>(self, model: D, data: Data) -> Result<Fitted> {
        self.fit_loaded(model, data, true)
    }

    fn fit_loaded<D: Trains>(mut self, model: D, data: Data, own_data: bool) -> Result<Fitted> {
        let (job, _lock) = self.start(&model, data, own_data)?;
        let run = job.run.clone();
        let device = self.device;
        crate::run::install_interrupt_handler();
        let test = backend::dispatch_model(device, &model, job)??;
        Ok(Fitted { run, test })
    }

    /// Trains `model` on backend `B` and returns the trained network as well.
    pub fn fit_on<B: AutodiffBackend, D: EmberModel>(
        mut self,
        model: &D,
        data: Data,
        own_data: bool,
        device: &B::Device,
    ) -> Result<(D::Net<B>, Fitted)>
    where
        D::Net<B>: Trainable<B>,
    {
        let (job, _lock) = self.start(model, data, own_data)?;
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
    /// `epochs` epochs when given (a step schedule only; others have a fixed length). `data`:
    /// the user's own, as the run was started with; `None` reads the run's dataset again.
    pub fn resume<D: Trains>(
        model: D,
        dir: &Path,
        epochs: Option<usize>,
        data: Option<Data>,
        device: DeviceArg,
    ) -> Result<Fitted> {
        let run = RunDir::open(dir)?;
        let _lock = run.lock()?;
        let mut config = run.load_config()?;
        anyhow::ensure!(
            config.model.name() == model.name(),
            "{}: the run trained {}, not {}",
            dir.display(),
            config.model,
            model.name()
        );
        if let Some(epochs) = epochs {
            config.epochs = epochs;
        }
        config.validate()?;
        config.check_input(|input| model.fits(input))?;
        let trainer = Self::from_config(config.clone()).device(device);
        let data = match data {
            Some(data) => data,
            None => crate::data::load(&config.dataset, &trainer.load_options(&backend::resolve(device)?))?,
        };
        anyhow::ensure!(
            data.train.shape == config.input,
            "the run was trained on {} images and the data now reads as {}",
            config.input,
            data.train.shape
        );
        if epochs.is_some() {
            run.save_config(&config)?;
        }
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

    /// A new run directory for `model` with its `config.json`, fitted to `data`.
    fn start<D: EmberModel>(&mut self, model: &D, data: Data, own_data: bool) -> Result<(TrainJob, RunLock)> {
        self.config.model = ModelName::new(model.name());
        self.config.validate()?;
        let run = match &self.run_dir {
            Some(dir) => RunDir::create(dir.clone())?,
            None => RunDir::fresh_default(model.name())?,
        };
        let lock = run.lock()?;
        if let Some(dir) = &self.data_dir {
            self.config.data_dir = std::path::absolute(dir).ok();
        }
        let given = Given {
            own_data,
            ..self.given
        };
        if let Err(e) =
            crate::tasks::fit_to_data(&mut self.config, &data, |i| model.fits(i), given, self.quiet)
        {
            // Nothing was written into the new run directory yet: do not leave it behind.
            lock.remove();
            let _ = std::fs::remove_dir(&run.path);
            return Err(e);
        }
        run.save_config(&self.config)?;
        let job = TrainJob {
            config: self.config.clone(),
            data,
            run,
            resume: false,
            save_model: self.save_model,
            output: Output::new(self.quiet, self.log_interval),
        };
        Ok((job, lock))
    }

    fn load_options(&self, device: &backend::Resolved) -> LoadOptions {
        let (max_memory, memory_source) = crate::tasks::default_memory_budget(device);
        let input = self.config.input;
        LoadOptions {
            dir: self
                .data_dir
                .clone()
                .or_else(|| self.config.data_dir.clone())
                .filter(|_| self.config.dataset.uses_data_dir()),
            download: !self.offline,
            image_size: None,
            fallback_size: [input.height, input.width],
            channels: None,
            val_fraction: self.config.val_fraction,
            skip_bad_images: self.config.skip_bad_images,
            max_image_pixels: crate::data::DEFAULT_MAX_IMAGE_PIXELS,
            max_memory,
            memory_source,
            progress: !self.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        }
    }
}
