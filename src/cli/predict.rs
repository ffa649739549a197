//! `ember predict`: classifies image files with a checkpoint.

use std::path::PathBuf;

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;
use clap::Args;

use crate::backend::{self, BackendTask, DeviceArg, DeviceInfo};
use crate::checkpoint::RunDir;
use crate::config::TrainConfig;

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
        let prepare = predict::Prepare::of(&config);
        let loaded: Vec<Result<_, predict::PredictError>> =
            images.iter().map(|p| predict::load_as(p, prepare)).collect();
        let good: Vec<Vec<u8>> = loaded.iter().filter_map(|r| r.as_ref().ok().cloned()).collect();
        let mut probs =
            predict::probabilities(&model, &good, prepare.shape(), &config.normalization, &device)
                .into_iter();
        let mut entries = Vec::new();
        let mut failed = Vec::new();
        for (path, result) in images.iter().zip(&loaded) {
            let file = path.display().to_string();
            match result {
                Ok(_) => {
                    let names = config.class_names();
                    let name = |c: usize| names.get(c).cloned().unwrap_or_else(|| c.to_string());
                    let p = predict::top3(&file, &probs.next().expect("one row per image"), name);
                    if !json {
                        println!("{}", p.text(&config));
                    }
                    entries.push(serde_json::to_value(&p)?);
                }
                Err(e) => {
                    failed.push(e.to_string());
                    entries.push(serde_json::json!({ "file": file, "error": e.to_string() }));
                }
            }
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&entries)?);
        }
        // One line for all of them, after the files that could be classified.
        anyhow::ensure!(
            failed.is_empty(),
            "{} of {} files could not be classified: {}",
            failed.len(),
            images.len(),
            failed.join("; ")
        );
        Ok(())
    }
}
