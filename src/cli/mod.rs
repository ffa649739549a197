//! The command line: one module per subcommand, each with its arguments (clap derive), its
//! handler `run`, and the backend task it dispatches; this file holds what they share.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::backend::Resolved;
use crate::config::TrainConfig;
use crate::data::{Dataset, DatasetSpec, LoadOptions, Source};

pub mod bench;
pub mod compare;
pub mod data;
pub mod eval;
pub mod export;
pub mod import;
pub mod info;
pub mod plot;
pub mod predict;
pub mod train;

pub use bench::{BenchArgs, MeasureArgs};
pub use compare::CompareArgs;
pub use data::DataCmdArgs;
pub use eval::EvalArgs;
pub use export::ExportArgs;
pub use import::{ImportArgs, ImportFormat};
pub use info::InfoArgs;
pub use plot::PlotArgs;
pub use predict::PredictArgs;
pub use train::TrainArgs;

/// Train and evaluate CNNs with burn on MNIST-format data, CIFAR or folders of images, the
/// dataset kept on the device.
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
    /// Write a checkpoint's weights under PyTorch's parameter names (safetensors), for
    /// `load_state_dict(strict=True)` of the PyTorch twin.
    Export(ExportArgs),
    /// Classify image files (PNG, JPEG) with a checkpoint: class and top-3 probabilities.
    Predict(PredictArgs),
    /// Read a dataset as `ember train` would and describe it: classes, shape, splits,
    /// normalisation, device memory and decode time.
    Data(DataCmdArgs),
    /// Redraw curves.png from runs' metrics.csv; several runs are overlaid.
    Plot(PlotArgs),
    /// Show the compiled backends and the device a run would use.
    Info(InfoArgs),
}

/// Where the data comes from and how images are read.
#[derive(Debug, Args)]
pub struct DataArgs {
    /// mnist, fashion-mnist, cifar10, cifar100, or folder:PATH: one sub-folder of PNG/JPEG
    /// images per class, or train/ with test/ or val/ folders of them [default: the recipe's or
    /// checkpoint's, mnist].
    #[arg(long, value_name = "DATASET")]
    pub dataset: Option<DatasetSpec>,
    /// Folder with an MNIST-format dataset's four IDX files (.gz or raw), or CIFAR's binary
    /// release [default: data/<dataset>].
    #[arg(long, env = "EMBER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Never download: a missing file is an error that says where to put it. EMBER_OFFLINE takes
    /// true/false, 1/0, yes/no or on/off.
    #[arg(long, env = "EMBER_OFFLINE", value_parser = clap::builder::BoolishValueParser::new())]
    pub offline: bool,
    /// Resize every image to SIZE (28) or HEIGHTxWIDTH (32x48), bilinear [default: the images'
    /// own size when they all share one, else the recipe's 28x28].
    #[arg(long, value_name = "SIZE", value_parser = parse_image_size)]
    pub image_size: Option<[usize; 2]>,
    /// 1 (grey, as luma) or 3 (RGB) [default: 3 when any image has colour, else the dataset's].
    #[arg(long, value_name = "N", value_parser = parse_channels)]
    pub channels: Option<usize>,
    /// A folder without test/ or val/: the fraction of each class held out as the test set
    /// [default: 0.1].
    #[arg(long, value_name = "FRACTION")]
    pub val_fraction: Option<f64>,
    /// Skip images that cannot be read, count them and list them in the run directory
    /// (skipped.txt), instead of stopping at the first with its name.
    #[arg(long)]
    pub skip_bad_images: bool,
    /// The most pixels one image may have, checked from its header before it is decoded
    /// [default: 89478485, PIL's limit].
    #[arg(long, value_name = "N")]
    pub max_image_pixels: Option<u64>,
    /// The most memory the dataset may take on the device as f32, e.g. 8G or 512M, checked
    /// before decoding [default: half the GPU's memory, or half the machine's on the CPU].
    #[arg(long, value_name = "SIZE", value_parser = crate::memory::parse_bytes)]
    pub max_dataset_memory: Option<u64>,
}

fn parse_image_size(text: &str) -> Result<[usize; 2], String> {
    let side = |s: &str| match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_IMAGE_SIZE).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a side between 1 and {MAX_IMAGE_SIZE}")),
    };
    match text.split_once(['x', 'X']) {
        Some((h, w)) => Ok([side(h)?, side(w)?]),
        None => side(text).map(|n| [n, n]),
    }
}

/// The largest `--image-size` side.
const MAX_IMAGE_SIZE: usize = 4096;

fn parse_channels(text: &str) -> Result<usize, String> {
    match text {
        "1" => Ok(1),
        "3" => Ok(3),
        _ => Err(format!("'{text}': 1 (grey) or 3 (RGB)")),
    }
}

impl DataArgs {
    pub(crate) fn source(&self, dataset: Dataset) -> Source {
        Source {
            dataset,
            dir: self.data_dir.clone().unwrap_or_else(|| dataset.default_dir()),
            download: !self.offline,
        }
    }

    /// The flags as the library takes them.
    pub(crate) fn flags(&self) -> crate::tasks::DataFlags {
        crate::tasks::DataFlags {
            data_dir: self.data_dir.clone(),
            offline: self.offline,
            image_size: self.image_size,
            channels: self.channels,
            max_image_pixels: self.max_image_pixels,
            max_dataset_memory: self.max_dataset_memory,
        }
    }

    /// How to read `config.dataset` for a run on `device` ([`crate::tasks::DataFlags::options`]).
    pub(crate) fn options(&self, config: &TrainConfig, device: &Resolved, fresh: bool) -> LoadOptions {
        self.flags().options(config, device, fresh)
    }
}

/// Restores SIGPIPE's default action, so that `ember info | head -1` ends quietly, as Unix tools
/// do, when the reader closes the pipe: Rust starts with SIGPIPE ignored, and `println!` to a
/// closed pipe then panics ("failed printing to stdout"). Sockets are unaffected (std writes to
/// them with MSG_NOSIGNAL). Call first thing in `main`.
pub fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: changes one signal's disposition before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// ember's command line with `registry`'s models next to (or instead of) ember's own: what
/// `ember`'s `main` is, for a user's binary (`ember::cli::main_with(Registry::builtin().with(MyNet))`).
/// Run directories written by it name their model in `config.json`, and its `eval`, `predict`
/// and `train --resume` find that model again. Exits the process: 1 on an error (printed as
/// `Error: ...`), 130 after Ctrl-C.
pub fn main_with(registry: crate::registry::Registry) -> ! {
    default_sigpipe();
    crate::run::mark_process_start();
    crate::memory::keep_freed_memory();
    crate::registry::install(registry);
    if let Err(e) = ember_kernels::check_env().and_then(|()| crate::faults::check_env()) {
        eprintln!("Error: {}", crate::files::printable(&e));
        std::process::exit(1);
    }
    let cli = <Cli as Parser>::parse();
    if let Err(err) = run(cli) {
        // One line whatever a file or folder name holds: control characters escaped.
        eprintln!("Error: {}", crate::files::printable(&format!("{err:#}")));
        // 128 + SIGINT, as a shell reports a process stopped by Ctrl-C.
        let interrupted = matches!(err.downcast_ref(), Some(crate::run::RunError::Interrupted { .. }))
            || matches!(err.downcast_ref(), Some(crate::data::DataError::Interrupted));
        std::process::exit(if interrupted { 130 } else { 1 });
    }
    std::process::exit(0)
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Import(args) => import::run(args),
        Command::Export(args) => export::run(args),
        Command::Predict(args) => predict::run(args),
        Command::Data(args) => data::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Info(args) => info::run(args),
    }
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
    fn unknown_values_are_errors() {
        assert!(Cli::try_parse_from(["ember", "train", "--recipe", "keras"]).is_err());
        assert!(Cli::try_parse_from(["ember", "train", "--device", "gpu"]).is_err());
        assert!(Cli::try_parse_from(["ember", "train", "--dataset", "cifar"]).is_err());
        assert!(Cli::try_parse_from(["ember", "train", "--channels", "2"]).is_err());
        assert!(Cli::try_parse_from(["ember", "train", "--image-size", "0"]).is_err());
        assert!(Cli::try_parse_from(["ember", "train", "--max-dataset-memory", "lots"]).is_err());
    }

    #[test]
    fn image_sizes_are_a_side_or_height_x_width() {
        assert_eq!(parse_image_size("32"), Ok([32, 32]));
        assert_eq!(parse_image_size("24x48"), Ok([24, 48]));
        assert!(parse_image_size("24x").is_err());
    }
}
