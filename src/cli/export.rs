//! `ember export`: a run's weights under PyTorch's parameter names, for the PyTorch twin.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::checkpoint::RunDir;
use crate::registry;
use crate::tasks::ExportJob;

/// `ember export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Run directory written by `ember train` or `ember import` (its latest checkpoint).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// The safetensors file to write; it must not exist.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let run = RunDir::open(&args.checkpoint)?;
    let config = run.load_config()?;
    let model = registry::global().get(config.model.name())?;
    anyhow::ensure!(
        !args.out.exists(),
        "{} already exists; pass another --out (ember export never overwrites a file)",
        args.out.display()
    );
    let name = model.name().to_string();
    let tensors = model.export(ExportJob {
        config,
        run,
        out: args.out.clone(),
    })?;
    println!(
        "exported {} ({name}, {tensors} tensors by PyTorch name) to {}",
        args.checkpoint.display(),
        args.out.display()
    );
    Ok(())
}
