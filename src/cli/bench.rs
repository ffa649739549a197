//! `ember bench`: times one scenario's training steps and evaluation.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::DataArgs;
use crate::backend::{self, DeviceArg};
use crate::data::{Data, Dataset};
use crate::model::ModelName;
use crate::registry;
use crate::tasks::BenchJob;

/// How much `ember bench` and `ember compare` measure; a flag not given takes the scenario's
/// default (`Scenario::default_settings`: fewer steps for resnet18-128, whose step takes seconds
/// on a CPU).
#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// Untimed training steps before timing [default: 10; resnet18-128: 2].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Training steps per timed repeat [default: 20; resnet18-128: 3].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Timed repeats (median, min and max are over these) [default: 5; resnet18-128: 3].
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Timed passes over the test set for evaluation throughput [default: 3; resnet18-128: 2].
    #[arg(long)]
    pub eval_repeats: Option<usize>,
    /// Also time one full training epoch instead of estimating it from the step time.
    #[arg(long)]
    pub full_epoch: bool,
}

impl MeasureArgs {
    /// The flags as given, checked.
    pub(super) fn overrides(&self) -> Result<crate::bench::Overrides> {
        for (flag, v) in [("--steps", self.steps), ("--repeats", self.repeats)] {
            anyhow::ensure!(v != Some(0), "{flag} must be at least 1");
        }
        Ok(crate::bench::Overrides {
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
    /// Time this model with the scenario's recipe, data and batch size [default: the scenario's].
    #[arg(long, value_parser = registry::parse_model)]
    pub model: Option<ModelName>,
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

pub fn run(args: BenchArgs) -> Result<()> {
    let settings = args.measure.overrides()?.settings(args.scenario);
    backend::resolve(args.device)?;
    let data = args
        .scenario
        .images(Data::load(&args.data.source(Dataset::Mnist))?);
    let name = args.model.clone().unwrap_or_else(|| args.scenario.config().model);
    let model = registry::global().get(name.name())?;
    let record = model.bench(
        args.device,
        BenchJob {
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
