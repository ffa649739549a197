//! `ember data`: reads a dataset as `ember train` would and describes it, without training:
//! classes, image shape, splits, normalisation, device memory, and how long decoding took.

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use super::DataArgs;
use crate::backend::{self, DeviceArg};
use crate::config::Recipe;
use crate::data::{DatasetSpec, Normalization};

/// `ember data`.
#[derive(Debug, Args)]
pub struct DataCmdArgs {
    /// Recipe whose image size applies to images of mixed sizes.
    #[arg(long, value_enum, default_value_t = Recipe::PytorchExample)]
    pub recipe: Recipe,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The device whose memory bounds the dataset (--max-dataset-memory's default).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    #[command(flatten)]
    pub data: DataArgs,
}

/// What `ember data --json` prints.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub dataset: String,
    pub classes: Vec<String>,
    /// `[channels, height, width]`.
    pub shape: [usize; 3],
    pub train: usize,
    pub test: usize,
    pub test_from: String,
    /// Per-channel mean and standard deviation of the training images, 0..1 scale.
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    /// Device memory of both splits as f32, bytes.
    pub device_bytes: u64,
    pub decoded: usize,
    pub decode_seconds: f64,
    pub images_per_second: f64,
    pub threads: usize,
    pub resized: usize,
    pub ignored: usize,
    pub skipped: Vec<String>,
}

pub fn run(args: DataCmdArgs) -> Result<()> {
    let mut config = args.recipe.config();
    if let Some(d) = &args.data.dataset {
        config.dataset = d.clone().absolute();
    }
    if let Some(f) = args.data.val_fraction {
        config.val_fraction = f;
    }
    config.skip_bad_images = args.data.skip_bad_images;
    let device = backend::resolve(args.device)?;
    let mut options = args.data.options(&config, &device, true);
    options.progress &= !args.json;
    let data = crate::data::load(&config.dataset, &options)?;
    let stats = Normalization::of(&data.train);
    let report = &data.report;
    let shape = data.train.shape;
    let summary = Summary {
        dataset: config.dataset.to_string(),
        classes: data.classes.clone(),
        shape: [shape.channels, shape.height, shape.width],
        train: data.train.len(),
        test: data.test.len(),
        test_from: report.test_from.clone(),
        mean: stats.mean.values().to_vec(),
        std: stats.std.values().to_vec(),
        device_bytes: ((data.train.len() + data.test.len()) * shape.len() * 4) as u64,
        decoded: report.decoded,
        decode_seconds: report.decode_seconds,
        images_per_second: report.decoded as f64 / report.decode_seconds.max(1e-9),
        threads: rayon::current_num_threads(),
        resized: report.resized,
        ignored: report.ignored,
        skipped: report
            .skipped
            .iter()
            .map(|(p, why)| format!("{}: {why}", p.display()))
            .collect(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    let names = if summary.classes.len() > 12 {
        format!("{}, ...", summary.classes[..12].join(", "))
    } else {
        summary.classes.join(", ")
    };
    println!(
        "{}",
        crate::files::printable(&format!(
            "{}: {} classes ({names})",
            summary.dataset,
            summary.classes.len()
        ))
    );
    println!(
        "images {shape}, {} train / {} test, {} on the device as f32",
        summary.train,
        summary.test,
        crate::memory::bytes(summary.device_bytes)
    );
    println!("training images' mean {} std {}", stats.mean, stats.std);
    if let Some(line) = report.summary() {
        println!("{}", crate::files::printable(&line));
    }
    if let Some(line) = report.skipped_line() {
        println!("{line}");
    }
    if matches!(config.dataset, DatasetSpec::Idx(_)) && args.data.image_size.is_none() {
        println!("(MNIST-format data is stored decoded: nothing to decode)");
    }
    Ok(())
}
