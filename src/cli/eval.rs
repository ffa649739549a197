//! `ember eval`: a checkpoint's test loss and accuracy.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::DataArgs;
use crate::backend::{self, DeviceArg};
use crate::checkpoint::RunDir;
use crate::registry;
use crate::tasks::EvalJob;

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

pub fn run(args: EvalArgs) -> Result<()> {
    let run = RunDir::open(&args.checkpoint)?;
    let mut config = run.load_config()?;
    if let Some(n) = args.test_batch_size {
        config.test_batch_size = n;
    }
    config.validate()?;
    let model = registry::global().get(config.model.name())?;
    config.check_input(|input| model.fits(input))?;
    let d = &args.data;
    for (flag, set) in [
        ("--image-size", d.image_size.is_some()),
        ("--channels", d.channels.is_some()),
        ("--val-fraction", d.val_fraction.is_some()),
        ("--skip-bad-images", d.skip_bad_images),
    ] {
        anyhow::ensure!(
            !set,
            "{flag}: a checkpoint is evaluated on its images read as in training (its config.json), not set again"
        );
    }
    if let Some(d) = &args.data.dataset {
        config.dataset = d.clone().absolute();
    }
    let device = backend::resolve(args.device)?;
    // The images are read as the model was trained on them (shape and channels).
    let data = crate::data::load(&config.dataset, &args.data.options(&config, &device, false))?;
    config.check_classes(&data.classes)?;
    model.eval(args.device, EvalJob { config, data, run })?;
    Ok(())
}
