//! The command line: argument definitions (clap derive) and what each command does.

use std::path::PathBuf;

use anyhow::{Context, Result};
use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use clap::{Args, Parser, Subcommand};

use crate::backend::{self, BackendTask, DeviceArg, DeviceInfo};
use crate::checkpoint::RunDir;
use crate::config::{Recipe, TrainConfig};
use crate::data::{Dataset, DeviceSplit, Mnist, Source};
use crate::model::ModelKind;
use crate::optim::OptimizerKind;
use crate::train::{self, Splits};

/// Train and evaluate CNNs on MNIST-format data with burn, the dataset kept on the device.
#[derive(Debug, Parser)]
#[command(name = "ember", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a model with a recipe of the seed benchmarks; every setting can be overridden.
    Train(TrainArgs),
    /// Evaluate a saved checkpoint on the test set.
    Eval(EvalArgs),
    /// Time training steps, epochs and evaluation of a seed scenario (JSON record + one line).
    Bench(BenchArgs),
    /// Run `ember bench` and PyTorch's twin side by side; write a table, JSON and charts.
    Compare(CompareArgs),
    /// Convert a PyTorch state_dict (`torch.save(model.state_dict(), PATH)`) into a checkpoint.
    Import(ImportArgs),
    /// Classify image files (PNG, JPEG) with a checkpoint: digit and top-3 probabilities.
    Predict(PredictArgs),
    /// Redraw curves.png from runs' metrics.csv; several runs are overlaid.
    Plot(PlotArgs),
    /// Show the compiled backends and the device a run would use.
    Info(InfoArgs),
}

/// `ember predict`.
#[derive(Debug, Args)]
pub struct PredictArgs {
    /// Run directory with the checkpoint to use.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Print one JSON array instead of text.
    #[arg(long)]
    pub json: bool,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// Images to classify, any size or colour; light backgrounds are inverted.
    #[arg(required = true, value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
}

/// `ember plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Run directories (each with metrics.csv).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,
    /// Output PNG [default: RUN_DIR/curves.png for one run; curves.png for several].
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

/// Where the data comes from.
#[derive(Debug, Args)]
pub struct DataArgs {
    /// Dataset [default: the recipe's or checkpoint's, mnist].
    #[arg(long, value_enum)]
    pub dataset: Option<Dataset>,
    /// Folder with the dataset's four IDX files (.gz or raw) [default: data/<dataset>].
    #[arg(long, env = "EMBER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Never download: a missing file is an error that says where to put it.
    #[arg(long, env = "EMBER_OFFLINE")]
    pub offline: bool,
}

impl DataArgs {
    fn source(&self, dataset: Dataset) -> Source {
        Source {
            dataset,
            dir: self.data_dir.clone().unwrap_or_else(|| dataset.default_dir()),
            download: !self.offline,
        }
    }
}

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

/// `ember eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Run directory written by `ember train` or `ember import` (its latest checkpoint).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Input batch size for testing [default: the checkpoint's].
    #[arg(long)]
    pub test_batch_size: Option<usize>,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    #[command(flatten)]
    pub data: DataArgs,
}

/// How much `ember bench` and `ember compare` measure.
#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// Untimed training steps before timing.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Training steps per timed repeat.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Timed repeats (median, min and max are over these).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Timed passes over the test set for evaluation throughput.
    #[arg(long, default_value_t = 3)]
    pub eval_repeats: usize,
    /// Also time one full training epoch instead of estimating it from the step time.
    #[arg(long)]
    pub full_epoch: bool,
}

impl MeasureArgs {
    fn settings(&self) -> Result<crate::bench::Settings> {
        for (flag, v) in [("--steps", self.steps), ("--repeats", self.repeats)] {
            anyhow::ensure!(v > 0, "{flag} must be at least 1");
        }
        Ok(crate::bench::Settings {
            warmup_steps: self.warmup,
            timed_steps: self.steps,
            repeats: self.repeats,
            eval_repeats: self.eval_repeats,
            full_epoch: self.full_epoch,
        })
    }
}

/// `ember bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum)]
    pub scenario: crate::bench::Scenario,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    #[command(flatten)]
    pub measure: MeasureArgs,
    /// Write the record (benches/schema.json) to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub data: DataArgs,
}

/// `ember compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// auto, cpu, cuda or cuda:N; PyTorch runs on the same device.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// Scenarios, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "net64,net256,flash64"
    )]
    pub scenarios: Vec<crate::bench::Scenario>,
    /// Python interpreter with torch and numpy.
    #[arg(long, env = "EMBER_PYTHON", default_value = "python3")]
    pub python: String,
    /// The PyTorch benchmark script.
    #[arg(long, default_value = "benches/pytorch/bench.py", value_name = "PATH")]
    pub pytorch_script: PathBuf,
    /// Results folder [default: benches/results/<date>-<host>-<device>].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub measure: MeasureArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

/// Formats `ember import` reads.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ImportFormat {
    /// A `torch.save`d state_dict (.pt/.pth), read without libtorch.
    Pytorch,
}

/// `ember import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Format of FILE.
    #[arg(long, value_enum)]
    pub from: ImportFormat,
    /// The file to convert.
    pub file: PathBuf,
    /// The model whose state_dict FILE holds (its parameter names and shapes must match).
    #[arg(long, value_enum)]
    pub model: ModelKind,
    /// Recipe whose settings (data normalisation, batch sizes) the checkpoint records [default: the model's].
    #[arg(long, value_enum)]
    pub recipe: Option<Recipe>,
    /// Dataset the checkpoint is evaluated on [default: mnist].
    #[arg(long, value_enum)]
    pub dataset: Option<Dataset>,
    /// Checkpoint directory to create (must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// `ember info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The --device value to resolve.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => train_command(args),
        Command::Eval(args) => eval_command(args),
        Command::Bench(args) => bench_command(args),
        Command::Compare(args) => compare_command(args),
        Command::Import(args) => import_command(args),
        Command::Predict(args) => predict_command(args),
        Command::Plot(args) => plot_command(args),
        Command::Info(args) => info_command(args),
    }
}

fn plot_command(args: PlotArgs) -> Result<()> {
    let mut runs = Vec::new();
    for dir in &args.runs {
        let rows = crate::metrics::read(dir)?;
        let name = dir
            .file_name()
            .map_or(dir.display().to_string(), |n| n.to_string_lossy().to_string());
        runs.push((name, rows));
    }
    let out = args.out.clone().unwrap_or_else(|| match args.runs.as_slice() {
        [one] => one.join(crate::metrics::CURVES_FILE),
        _ => PathBuf::from(crate::metrics::CURVES_FILE),
    });
    crate::metrics::draw_curves(&out, &runs)?;
    println!("{}", out.display());
    Ok(())
}

fn predict_command(args: PredictArgs) -> Result<()> {
    let run = RunDir::open(&args.checkpoint)?;
    let config = run.load_config()?;
    backend::resolve(args.device)?;
    backend::dispatch(
        args.device,
        PredictTask {
            config,
            run,
            json: args.json,
            images: args.images,
        },
    )?
}

struct PredictTask {
    config: TrainConfig,
    run: RunDir,
    json: bool,
    images: Vec<PathBuf>,
}

impl BackendTask for PredictTask {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device, _info: DeviceInfo) -> Result<()> {
        use crate::predict;
        let Self {
            config,
            run,
            json,
            images,
        } = self;
        let model = run.load_model::<B::InnerBackend>(&config, &device)?;
        let loaded: Vec<Result<_, predict::PredictError>> = images.iter().map(|p| predict::load(p)).collect();
        let good: Vec<_> = loaded.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
        let mut probs = predict::probabilities(&model, &good, config.normalization, &device).into_iter();
        let mut entries = Vec::new();
        let mut failed = 0;
        for (path, result) in images.iter().zip(&loaded) {
            let file = path.display().to_string();
            match result {
                Ok(_) => {
                    let p = predict::top3(&file, &probs.next().expect("one row per image"));
                    if !json {
                        let guesses: Vec<String> = p
                            .top3
                            .iter()
                            .map(|g| {
                                format!(
                                    "{}: {:.2}%",
                                    config.dataset.class_name(g.class),
                                    100.0 * g.probability
                                )
                            })
                            .collect();
                        println!(
                            "{file}: {}  ({})",
                            config.dataset.class_name(p.prediction),
                            guesses.join(", ")
                        );
                    }
                    entries.push(serde_json::to_value(&p)?);
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("Error: {e}");
                    entries.push(serde_json::json!({ "file": file, "error": e.to_string() }));
                }
            }
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&entries)?);
        }
        anyhow::ensure!(
            failed == 0,
            "{failed} of {} files could not be classified",
            images.len()
        );
        Ok(())
    }
}

fn bench_command(args: BenchArgs) -> Result<()> {
    let settings = args.measure.settings()?;
    backend::resolve(args.device)?;
    let data = Mnist::load(&args.data.source(Dataset::Mnist))?;
    let record = backend::dispatch(
        args.device,
        BenchTask {
            scenario: args.scenario,
            settings,
            data,
        },
    )?;
    println!("{}", record.line());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&record)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

struct BenchTask {
    scenario: crate::bench::Scenario,
    settings: crate::bench::Settings,
    data: Mnist,
}

impl BackendTask for BenchTask {
    type Output = crate::bench::BenchRecord;

    fn run<B: AutodiffBackend>(self, device: B::Device, info: DeviceInfo) -> Self::Output {
        let gpu = info.cuda.and_then(crate::gpu::GpuMonitor::new);
        crate::bench::run::<B>(self.scenario, self.settings, &self.data, &device, &info, gpu)
    }
}

fn compare_command(args: CompareArgs) -> Result<()> {
    let options = crate::compare::CompareOptions {
        device: args.device,
        scenarios: args.scenarios,
        settings: args.measure.settings()?,
        python: args.python,
        script: args.pytorch_script,
        data_dir: args
            .data
            .data_dir
            .clone()
            .unwrap_or_else(|| Dataset::Mnist.default_dir()),
        out: args.out,
    };
    // Fail on missing data here, before any child process starts.
    Mnist::load(&args.data.source(Dataset::Mnist))?;
    crate::compare::run(&options)?;
    Ok(())
}

fn import_command(args: ImportArgs) -> Result<()> {
    let ImportFormat::Pytorch = args.from;
    let mut config = args.recipe.unwrap_or(args.model.recipe()).config();
    config.model = args.model;
    if let Some(d) = args.dataset {
        config.dataset = d;
    }
    let device = Default::default();
    let model = crate::import::from_pytorch_file::<backend::Cpu>(args.model, &args.file, &device)?;
    let run = RunDir::create(args.out.clone())?;
    run.save_config(&config)?;
    run.save_checkpoint(&model, None, crate::checkpoint::TrainState::default())?;
    println!(
        "imported {} ({}, {} parameters) into {}",
        args.file.display(),
        args.model.name(),
        model.num_params(),
        run.path.display()
    );
    Ok(())
}

fn train_command(args: TrainArgs) -> Result<()> {
    let (config, run) = match &args.resume {
        Some(dir) => {
            let run = RunDir::open(dir)?;
            let mut config = run.load_config()?;
            if let Some(epochs) = args.epochs {
                config.epochs = epochs;
                run.save_config(&config)?;
            }
            (config, run)
        }
        None => {
            let config = args.config();
            config.validate()?;
            // A wrong --device fails before data is read or a run directory is made.
            backend::resolve(args.device)?;
            let run = match &args.run_dir {
                Some(dir) => RunDir::create(dir.clone())?,
                None => RunDir::fresh_default(config.recipe.name())?,
            };
            (config, run)
        }
    };
    config.validate()?;
    backend::resolve(args.device)?;
    let data = match Mnist::load(&args.data.source(config.dataset)) {
        Ok(data) => data,
        Err(e) => {
            // Nothing was written into a new run directory yet: do not leave it behind.
            if args.resume.is_none() {
                let _ = std::fs::remove_dir(&run.path);
            }
            return Err(e.into());
        }
    };
    if args.resume.is_none() {
        run.save_config(&config)?;
    }
    crate::run::install_interrupt_handler();
    let task = TrainTask {
        config,
        data,
        run,
        resume: args.resume.is_some(),
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
                    start.state.epoch, start.state.global_step
                );
            }
        }
        crate::run::train(&config, &splits, &run, start, save_model, output)?;
        Ok(())
    }
}

fn eval_command(args: EvalArgs) -> Result<()> {
    let run = RunDir::open(&args.checkpoint)?;
    let mut config = run.load_config()?;
    if let Some(n) = args.test_batch_size {
        config.test_batch_size = n;
    }
    config.validate()?;
    let dataset = args.data.dataset.unwrap_or(config.dataset);
    backend::resolve(args.device)?;
    let data = Mnist::load(&args.data.source(dataset))?;
    backend::dispatch(args.device, EvalTask { config, data, run })?
}

struct EvalTask {
    config: TrainConfig,
    data: Mnist,
    run: RunDir,
}

impl BackendTask for EvalTask {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device, info: DeviceInfo) -> Result<()> {
        let Self { config, data, run } = self;
        let model = run
            .load_model::<B::InnerBackend>(&config, &device)
            .with_context(|| format!("loading the checkpoint in {}", run.path.display()))?;
        let mut test = data.test;
        if let Some(n) = config.limit_test {
            test.truncate(n);
        }
        let test = DeviceSplit::<B::InnerBackend>::upload(&test, config.normalization, &device);
        let stats = train::evaluate(&model, &test, config.test_batch_size);
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
        Ok(())
    }
}

fn info_command(args: InfoArgs) -> Result<()> {
    println!("ember {}", env!("CARGO_PKG_VERSION"));
    println!("burn 0.21.0");
    println!("compiled backends: {}", backend::compiled().join(", "));
    println!("cpu threads: {}", backend::cpu_threads());
    let resolved = backend::resolve(args.device)?;
    let device = match resolved {
        backend::Resolved::Cpu => format!("cpu ({} backend)", backend::CPU_BACKEND),
        backend::Resolved::Cuda { index, name } => format!("cuda:{index} ({name})"),
    };
    println!("--device {} uses: {device}", args.device);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

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

    #[test]
    fn unknown_values_are_errors() {
        assert!(Cli::try_parse_from(["ember", "train", "--recipe", "keras"]).is_err());
        assert!(Cli::try_parse_from(["ember", "train", "--device", "gpu"]).is_err());
        assert!(Cli::try_parse_from(["ember", "train", "--dataset", "cifar"]).is_err());
    }
}
