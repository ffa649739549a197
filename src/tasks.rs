//! What each command does with a model, as library functions generic over the model: training
//! (fresh or resumed), evaluation, prediction, benchmarks and import. The CLI parses flags into
//! these and prints; `trainer::Trainer` calls the same code; the registry (`src/registry.rs`) runs them
//! for a model named at run time.

use std::path::PathBuf;

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;

use crate::backend::{DeviceInfo, ModelTask};
use crate::checkpoint::{RunDir, RunLock};
use crate::config::{ConfigError, TrainConfig};
use crate::data::{Data, DeviceSplit, LoadOptions, Normalization};
use crate::model::{DoesNotFit, EmberModel, ImageShape, Trainable};
use crate::run::{Output, Start};
use crate::train::{self, EvalStats, Splits};

/// Half the device's memory: the rest is for the model, activations and the allocator.
pub fn default_memory_budget(device: &crate::backend::Resolved) -> (u64, String) {
    match device_memory(device) {
        Some((total, what)) => (
            total / 2,
            format!("default: half of {what}'s {}", crate::memory::bytes(total)),
        ),
        None => (u64::MAX, "default: no limit, the memory size is unknown".into()),
    }
}

/// The memory of `device` and its name ("this machine", "cuda:0"); `None` when unknown.
pub fn device_memory(device: &crate::backend::Resolved) -> Option<(u64, String)> {
    use crate::backend::Resolved;
    match device {
        Resolved::Cuda { index, .. } => {
            crate::backend::total_memory(*index).map(|n| (n as u64, format!("cuda:{index}")))
        }
        Resolved::Cpu => crate::memory::physical_memory().map(|n| (n, "this machine".to_string())),
    }
}

/// The checks of a new run on `device`, for [`start_run`]: the model takes the images (`fits`,
/// [`TrainConfig::check_input`]) and its batches' activations (`activation_bytes`, the model's
/// estimate) fit beside the data ([`TrainConfig::check_activation_memory`]; not checked where
/// `device` is `None`).
pub fn check_new_run(
    config: &TrainConfig,
    data: &Data,
    fits: impl FnOnce(ImageShape) -> Result<(), DoesNotFit>,
    activation_bytes: impl FnOnce(ImageShape) -> Option<crate::model::ActivationBytes>,
    device: Option<&crate::backend::Resolved>,
) -> Result<()> {
    config.check_input(fits)?;
    let data_bytes = [&data.train, &data.test]
        .iter()
        .map(|s| crate::data::dataset_bytes(s.len(), s.shape))
        .sum();
    config.check_activation_memory(
        activation_bytes(config.input),
        data_bytes,
        device.and_then(device_memory),
        (
            config
                .limit_train
                .map_or(data.train.len(), |n| n.min(data.train.len())),
            data.test.len().max(config.valid_size),
        ),
    )?;
    Ok(())
}

/// How a run's dataset is read, as the user set it (`ember`'s data flags; [`Default`]: as
/// `ember train` reads it without any).
#[derive(Clone, Debug, Default)]
pub struct DataFlags {
    /// The folder of an MNIST-format or CIFAR dataset's files [default: the run's, else found].
    pub data_dir: Option<PathBuf>,
    /// Never download.
    pub offline: bool,
    /// Resize to `[height, width]` (a new run only).
    pub image_size: Option<[usize; 2]>,
    /// 1 or 3 channels (a new run only).
    pub channels: Option<usize>,
    pub max_image_pixels: Option<u64>,
    pub max_dataset_memory: Option<u64>,
}

impl DataFlags {
    /// How to read `config.dataset` for a run on `device`. A new run (`fresh`) takes the
    /// shape flags; a saved run reads its images as it was trained on them.
    pub fn options(
        &self,
        config: &TrainConfig,
        device: &crate::backend::Resolved,
        fresh: bool,
    ) -> LoadOptions {
        let (max_memory, memory_source) = match self.max_dataset_memory {
            Some(n) => (n, "given".to_string()),
            None => default_memory_budget(device),
        };
        let input = config.input;
        LoadOptions {
            dir: self
                .data_dir
                .clone()
                .or_else(|| config.data_dir.clone())
                .filter(|_| config.dataset.uses_data_dir()),
            download: !self.offline,
            image_size: if fresh {
                self.image_size
            } else {
                Some([input.height, input.width])
            },
            fallback_size: [input.height, input.width],
            channels: if fresh {
                self.channels
            } else {
                Some(input.channels)
            },
            val_fraction: config.val_fraction,
            skip_bad_images: config.skip_bad_images,
            max_image_pixels: self
                .max_image_pixels
                .unwrap_or(crate::data::DEFAULT_MAX_IMAGE_PIXELS),
            max_memory,
            memory_source,
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            stop: Some(&crate::run::INTERRUPTED),
        }
    }
}

/// A new run of `config`: its directory (`run_dir`, else `runs/<default_name>-<UTC time>`)
/// created and locked, its data read by `load`, the config fitted to it ([`fit_to_data`]) and
/// written as `config.json`. When reading or fitting fails, nothing is left of the directory.
/// The lock is held until the returned guard is dropped.
pub fn start_run(
    mut config: TrainConfig,
    run_dir: Option<PathBuf>,
    default_name: &str,
    check: impl FnOnce(&TrainConfig, &Data) -> Result<()>,
    given: Given,
    quiet: bool,
    load: impl FnOnce(&TrainConfig) -> Result<Data>,
) -> Result<(TrainConfig, RunDir, RunLock, Data)> {
    let run = match run_dir {
        Some(dir) => RunDir::create(dir)?,
        None => RunDir::fresh_default(default_name)?,
    };
    let lock = run.lock()?;
    crate::faults::point("run:locked");
    let loaded = load(&config).and_then(|data| {
        fit_to_data(&mut config, &data, check, given, quiet)?;
        Ok(data)
    });
    let data = match loaded {
        Ok(data) => data,
        Err(e) => {
            // Nothing was written into the new run directory yet: do not leave it behind.
            lock.remove();
            let _ = std::fs::remove_dir(&run.path);
            return Err(e);
        }
    };
    crate::faults::point("data:loaded");
    run.save_config(&config)?;
    Ok((config, run, lock, data))
}

/// The run in `dir`, to resume: locked, its own settings (to `epochs` epochs when given: a step
/// schedule only, others have a fixed length), checked by `check` (the model it names exists
/// and takes its images: [`TrainConfig::check_input`]), its data read by `load` as it was
/// trained on. A new length is written to `config.json` only once everything else holds.
pub fn resume_run(
    dir: &std::path::Path,
    epochs: Option<usize>,
    check: impl FnOnce(&TrainConfig) -> Result<()>,
    load: impl FnOnce(&TrainConfig) -> Result<Data>,
) -> Result<(TrainConfig, RunDir, RunLock, Data)> {
    let run = RunDir::open(dir)?;
    let lock = run.lock()?;
    crate::faults::point("run:locked");
    let mut config = run.load_config()?;
    if let Some(epochs) = epochs {
        if epochs != config.epochs && config.schedule != crate::optim::Schedule::Step {
            return Err(ConfigError::FixedLength {
                asked: epochs,
                epochs: config.epochs,
                schedule: config.schedule.name(),
            }
            .into());
        }
        config.epochs = epochs;
    }
    config.validate()?;
    check(&config)?;
    let data = load(&config)?;
    crate::faults::point("data:loaded");
    config.check_classes(&data.classes)?;
    if data.train.shape != config.input {
        anyhow::bail!(
            "{}: the run was trained on {} images and the data now reads as {}",
            config.dataset,
            config.input,
            data.train.shape
        );
    }
    // Only a resume that can start records its new length.
    if epochs.is_some() {
        run.save_config(&config)?;
    }
    Ok((config, run, lock, data))
}

/// The images `--skip-bad-images` skipped, one `PATH<TAB>REASON` line each.
pub const SKIPPED_FILE: &str = "skipped.txt";

/// What [`fit_to_data`] keeps of a run's settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Given {
    /// `--mean`/`--std` were given: not measured from the images.
    pub mean: bool,
    pub std: bool,
    /// The data is not `config.dataset`'s as read from files but a user's own
    /// ([`Data::from_memory`]): its classes and statistics are recorded whatever the dataset.
    pub own_data: bool,
}

/// Completes a new run's settings from its data: the image shape and class names, and the
/// normalisation statistics of CIFAR, folders and in-memory data (from the images trained on)
/// unless given. Then checks what depends on them with `check` (the model taking the images and
/// the batches fitting in memory: [`check_new_run`]).
pub fn fit_to_data(
    config: &mut TrainConfig,
    data: &Data,
    check: impl FnOnce(&TrainConfig, &Data) -> Result<()>,
    given: Given,
    quiet: bool,
) -> Result<()> {
    let (keep_mean, keep_std) = (given.mean, given.std);
    if !quiet {
        if let Some(line) = data.report.summary() {
            println!(
                "{}",
                crate::files::printable(&format!("{}: {line}", config.dataset))
            );
        }
        if let Some(line) = data.report.skipped_line() {
            println!("{line}");
        }
    }
    config.input = data.train.shape;
    if let [only] = &data.classes[..] {
        return Err(ConfigError::OneClass(only.clone()).into());
    }
    if config.dataset.idx().is_none() || given.own_data {
        config.classes = data.classes.clone();
        let (_, mut train) = data.train.clone().split_at(config.valid_size);
        if let Some(n) = config.limit_train {
            train.truncate(n);
        }
        if !(keep_mean && keep_std) {
            let measured = Normalization::of(&train);
            if !keep_mean {
                config.normalization.mean = measured.mean;
            }
            if !keep_std {
                config.normalization.std = measured.std;
            }
            if !quiet {
                println!(
                    "normalisation from the {} training images: mean {} std {} (saved in config.json)",
                    train.len(),
                    config.normalization.mean,
                    config.normalization.std
                );
            }
        }
    }
    check(config, data)?;
    config.check_train_size(data.train.len())?;
    if !given.own_data && config.dataset.uses_data_dir() && config.data_dir.is_none() {
        let dir = config.dataset.default_dir();
        config.data_dir = std::path::absolute(&dir).ok();
    }
    Ok(())
}

/// A run to train: fresh (its `config.json` written) or resumed from its last checkpoint.
pub struct TrainJob {
    pub config: TrainConfig,
    pub data: Data,
    pub run: RunDir,
    pub resume: bool,
    pub save_model: bool,
    pub output: Output,
}

impl TrainJob {
    /// Trains `model` on backend `B`; returns the trained network and its final test evaluation.
    pub fn train_on<B: AutodiffBackend, D: EmberModel>(
        self,
        model: &D,
        device: &B::Device,
        info: &DeviceInfo,
    ) -> Result<(D::Net<B>, EvalStats)>
    where
        D::Net<B>: Trainable<B>,
    {
        let Self {
            config,
            data,
            run,
            resume,
            save_model,
            output,
        } = self;
        if !data.report.skipped.is_empty() {
            let list: String = data
                .report
                .skipped
                .iter()
                .map(|(path, why)| {
                    format!(
                        "{}\t{}\n",
                        crate::files::shown(path),
                        crate::files::printable(why)
                    )
                })
                .collect();
            let path = run.file(SKIPPED_FILE);
            std::fs::write(&path, list).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        let splits = Splits::<B::InnerBackend>::upload(&data, &config, device)?;
        let skipped = data.report.skipped_line();
        drop(data);
        let start = if resume {
            Start::<B, D::Net<B>>::resume(model, &run, &config, device)?
        } else {
            Start::<B, D::Net<B>>::fresh(model, &config, device)
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
        let result = crate::run::train(&config, &splits, &run, start, save_model, output);
        if let Some(line) = skipped {
            if !output.quiet {
                println!("{line}; listed in {}", run.file(SKIPPED_FILE).display());
            }
        }
        Ok(result?)
    }
}

impl<D: EmberModel> ModelTask<D> for TrainJob {
    type Output = Result<EvalStats>;

    fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, info: DeviceInfo) -> Self::Output
    where
        D::Net<B>: Trainable<B>,
    {
        self.train_on::<B, D>(model, &device, &info).map(|(_, test)| test)
    }
}

/// A checkpoint's test loss and accuracy (`ember eval`), printed.
pub struct EvalJob {
    pub config: TrainConfig,
    pub data: Data,
    pub run: RunDir,
}

impl<D: EmberModel> ModelTask<D> for EvalJob {
    type Output = Result<EvalStats>;

    fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, info: DeviceInfo) -> Self::Output
    where
        D::Net<B>: Trainable<B>,
    {
        let Self { config, data, run } = self;
        // Its errors name the file at fault, inside the run directory.
        let net = run.load_model_of::<B::InnerBackend, D>(model, &config, &device)?;
        let mut test = data.test;
        if let Some(n) = config.limit_test {
            test.truncate(n);
        }
        let test = DeviceSplit::<B::InnerBackend>::upload(&test, &config.normalization, &device);
        let stats = train::evaluate(&net, &test, config.test_batch_size);
        println!(
            "ember eval: {} ({}, {} test), {info}",
            run.path.display(),
            config.model.name(),
            config.dataset
        );
        println!(
            "test loss {:.4}  accuracy {}  {:.2} s  {:.0} img/s",
            stats.loss,
            stats.accuracy_text(),
            stats.seconds,
            stats.images_per_sec()
        );
        Ok(stats)
    }
}

/// Classifies image files with a checkpoint (`ember predict`), printed as text or JSON.
pub struct PredictJob {
    pub config: TrainConfig,
    pub run: RunDir,
    pub json: bool,
    pub images: Vec<PathBuf>,
}

impl<D: EmberModel> ModelTask<D> for PredictJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, _info: DeviceInfo) -> Self::Output
    where
        D::Net<B>: Trainable<B>,
    {
        use crate::predict;
        let Self {
            config,
            run,
            json,
            images,
        } = self;
        let prepare = predict::Prepare::of(&config);
        let channels = prepare.shape().channels;
        anyhow::ensure!(
            matches!(channels, 1 | 3),
            "{}: the run's images have {channels} channels (input {}); ember predict reads image files as grey (1) or RGB (3)",
            run.file(crate::checkpoint::CONFIG_FILE).display(),
            config.input
        );
        let net = run.load_model_of::<B::InnerBackend, D>(model, &config, &device)?;
        let loaded: Vec<Result<_, predict::PredictError>> =
            images.iter().map(|p| predict::load_as(p, prepare)).collect();
        let good: Vec<Vec<u8>> = loaded.iter().filter_map(|r| r.as_ref().ok().cloned()).collect();
        let mut probs =
            predict::probabilities(&net, &good, prepare.shape(), &config.normalization, &device).into_iter();
        let mut entries = Vec::new();
        let mut failed = Vec::new();
        for (path, result) in images.iter().zip(&loaded) {
            let file = path.display().to_string();
            match result {
                Ok(_) => {
                    let names = config.class_names();
                    let name = |c: usize| names.get(c).cloned().unwrap_or_else(|| c.to_string());
                    let p = predict::top3(&file, &probs.next().expect("one row per image"), name);
                    if !json {
                        println!("{}", p.text(&config));
                    }
                    entries.push(serde_json::to_value(&p)?);
                }
                Err(e) => {
                    failed.push(e.to_string());
                    entries.push(serde_json::json!({ "file": file, "error": e.to_string() }));
                }
            }
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&entries)?);
        }
        // One line for all of them, after the files that could be classified.
        anyhow::ensure!(
            failed.is_empty(),
            "{} of {} files could not be classified: {}",
            failed.len(),
            images.len(),
            failed.join("; ")
        );
        Ok(())
    }
}

/// Times a scenario's training steps and evaluation with a model (`ember bench`).
pub struct BenchJob {
    pub scenario: crate::bench::Scenario,
    pub settings: crate::bench::Settings,
    pub data: Data,
}

impl<D: EmberModel> ModelTask<D> for BenchJob {
    type Output = crate::bench::BenchRecord;

    fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, info: DeviceInfo) -> Self::Output
    where
        D::Net<B>: Trainable<B>,
    {
        let gpu = info.cuda.and_then(crate::gpu::GpuMonitor::new);
        crate::bench::run_model::<B, D>(
            model,
            self.scenario,
            self.settings,
            self.data,
            &device,
            &info,
            gpu,
        )
    }
}

/// A PyTorch `state_dict` into a new run directory (`ember import`); returns the model's
/// trained parameter count.
pub struct ImportJob {
    pub config: TrainConfig,
    pub file: PathBuf,
    pub out: PathBuf,
}

impl<D: EmberModel> ModelTask<D> for ImportJob {
    type Output = Result<usize>;

    fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, _info: DeviceInfo) -> Self::Output
    where
        D::Net<B>: Trainable<B>,
    {
        let Self { config, file, out } = self;
        let net = crate::import::from_pytorch_file_of::<B::InnerBackend, D>(
            model,
            config.input,
            config.num_classes(),
            &file,
            &device,
        )?;
        let run = RunDir::create(out)?;
        run.save_config(&config)?;
        run.save_checkpoint(&net, None, &crate::progress::Progress::default())?;
        Ok(ember_models::Classifier::trainable_params(&net))
    }
}

/// A run's latest weights under PyTorch's parameter names (`ember export`), as safetensors:
/// the PyTorch twin loads them with `load_state_dict(strict=True)`. Returns the tensor count.
pub struct ExportJob {
    pub config: TrainConfig,
    pub run: RunDir,
    pub out: PathBuf,
}

impl<D: EmberModel> ModelTask<D> for ExportJob {
    type Output = Result<usize>;

    fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, _info: DeviceInfo) -> Self::Output
    where
        D::Net<B>: Trainable<B>,
    {
        let Self { config, run, out } = self;
        let net = run.load_model_of::<B::InnerBackend, D>(model, &config, &device)?;
        let state = run.load_state()?;
        let metadata = [
            ("model", config.model.name().to_string()),
            ("input", config.input.to_string()),
            ("classes", config.num_classes().to_string()),
            ("epoch", state.progress.epoch.to_string()),
            ("step", state.progress.global_step.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let bytes = crate::import::to_safetensors(&net, metadata);
        crate::files::write_atomic(&out, &bytes)?;
        Ok(crate::import::to_pytorch_tensors(&net).len())
    }
}
