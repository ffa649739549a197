//! `ember predict`: classifies image files with a checkpoint.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::backend::{self, DeviceArg};
use crate::checkpoint::RunDir;
use crate::registry;
use crate::tasks::PredictJob;

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
    /// Images to classify (PNG, JPEG), any size or colour: converted as the run's training
    /// images were (MNIST runs: grey, light backgrounds inverted, 28x28).
    #[arg(required = true, value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
}

pub fn run(args: PredictArgs) -> Result<()> {
    let run = RunDir::open(&args.checkpoint)?;
    let config = run.load_config()?;
    let model = registry::global().get(config.model.name())?;
    config.check_input(|input| model.fits(input))?;
    backend::resolve(args.device)?;
    model.predict(
        args.device,
        PredictJob {
            config,
            run,
            json: args.json,
            images: args.images,
        },
    )
}
