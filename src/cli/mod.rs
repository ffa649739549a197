//! The command line: one module per subcommand, each with its arguments (clap derive), its
//! handler `run`, and the backend task it dispatches; this file holds what they share.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::data::{Dataset, Source};

pub mod bench;
pub mod compare;
pub mod eval;
pub mod import;
pub mod info;
pub mod plot;
pub mod predict;
pub mod train;

pub use bench::{BenchArgs, MeasureArgs};
pub use compare::CompareArgs;
pub use eval::EvalArgs;
pub use import::{ImportArgs, ImportFormat};
pub use info::InfoArgs;
pub use plot::PlotArgs;
pub use predict::PredictArgs;
pub use train::TrainArgs;

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

/// Where the data comes from.
#[derive(Debug, Args)]
pub struct DataArgs {
    /// Dataset [default: the recipe's or checkpoint's, mnist].
    #[arg(long, value_enum)]
    pub dataset: Option<Dataset>,
    /// Folder with the dataset's four IDX files (.gz or raw) [default: data/<dataset>].
    #[arg(long, env = "EMBER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Never download: a missing file is an error that says where to put it. EMBER_OFFLINE takes
    /// true/false, 1/0, yes/no or on/off.
    #[arg(long, env = "EMBER_OFFLINE", value_parser = clap::builder::BoolishValueParser::new())]
    pub offline: bool,
}

impl DataArgs {
    pub(crate) fn source(&self, dataset: Dataset) -> Source {
        Source {
            dataset,
            dir: self.data_dir.clone().unwrap_or_else(|| dataset.default_dir()),
            download: !self.offline,
        }
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

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Import(args) => import::run(args),
        Command::Predict(args) => predict::run(args),
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
    }
}
