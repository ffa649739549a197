//! `ember compare`: `ember bench` and PyTorch's twin side by side.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::bench::MeasureArgs;
use super::DataArgs;
use crate::backend::DeviceArg;
use crate::data::{Dataset, Mnist};

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

pub fn run(args: CompareArgs) -> Result<()> {
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
