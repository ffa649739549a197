//! `ember compare`: `ember bench` and PyTorch's twin side by side.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use super::bench::MeasureArgs;
use super::DataArgs;
use crate::backend::DeviceArg;
use crate::config::Recipe;
use crate::data::{Data, Dataset};

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
    /// Measure ember only (no Python with torch on this machine); results.md says so.
    #[arg(long, conflicts_with = "time_to_accuracy")]
    pub without_pytorch: bool,
    /// Kill a measurement that runs longer than this many seconds, list it as failed, and go
    /// on with the next.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "time_to_accuracy")]
    pub timeout: Option<u64>,
    /// Start no measurement, and let none run, past this many seconds from now; what finished
    /// is kept.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "time_to_accuracy")]
    pub deadline: Option<u64>,
    /// Instead of step times: train the speedrun recipe to its 99.0% target on both sides
    /// (ember, then benches/pytorch/recipe.py) and compare the times from process start.
    #[arg(long)]
    pub time_to_accuracy: bool,
    /// With --time-to-accuracy: how many times each side races.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub rounds: usize,
    /// With --time-to-accuracy: the PyTorch twin of ember's recipes.
    #[arg(long, default_value = "benches/pytorch/recipe.py", value_name = "PATH")]
    pub recipe_script: PathBuf,
    #[command(flatten)]
    pub measure: MeasureArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

pub fn run(args: CompareArgs) -> Result<()> {
    if args.time_to_accuracy {
        return race(args);
    }
    let options = crate::compare::CompareOptions {
        device: args.device,
        scenarios: args.scenarios,
        settings: args.measure.overrides()?,
        python: args.python,
        script: args.pytorch_script,
        data_dir: args
            .data
            .data_dir
            .clone()
            .unwrap_or_else(|| Dataset::Mnist.default_dir()),
        out: args.out,
        without_pytorch: args.without_pytorch,
        timeout: args.timeout.map(Duration::from_secs),
        deadline: args.deadline.map(Duration::from_secs),
    };
    // Fail on missing data here, before any child process starts.
    Data::load(&args.data.source(Dataset::Mnist))?;
    crate::compare::run(&options)?;
    Ok(())
}

fn race(args: CompareArgs) -> Result<()> {
    if args.rounds == 0 {
        anyhow::bail!("--rounds must be at least 1, got 0");
    }
    let recipe = Recipe::Speedrun;
    let dataset = recipe
        .config()
        .dataset
        .idx()
        .expect("the speedrun recipe reads MNIST");
    let data_dir = args
        .data
        .data_dir
        .clone()
        .unwrap_or_else(|| dataset.default_dir());
    Data::load(&args.data.source(dataset))?;
    let resolved = crate::backend::resolve(args.device)?;
    let device_arg = match &resolved {
        crate::backend::Resolved::Cpu => "cpu".to_string(),
        crate::backend::Resolved::Cuda { index, .. } => format!("cuda:{index}"),
    };
    let out = args.out.clone().unwrap_or_else(|| {
        let date = crate::files::utc_stamp(std::time::SystemTime::now());
        PathBuf::from("benches/results").join(format!("{}-time-to-accuracy-{device_arg}", &date[..8]))
    });
    let options = crate::race::RaceOptions {
        recipe,
        device_arg,
        threads: crate::backend::cpu_threads(),
        python: args.python,
        script: args.recipe_script,
        data_dir,
        rounds: args.rounds,
    };
    let table = crate::race::run(&options, &out)?;
    println!("\n{table}");
    println!("results: {}", out.display());
    Ok(())
}
