//! `ember import`: a PyTorch state_dict into a run directory.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::backend;
use crate::checkpoint::RunDir;
use crate::config::Recipe;
use crate::data::Dataset;
use crate::model::ModelKind;

/// Formats `ember import` reads.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ImportFormat {
    /// A `torch.save`d state_dict (.pt/.pth), read without libtorch.
    Pytorch,
}

/// `ember import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Format of FILE.
    #[arg(long, value_enum)]
    pub from: ImportFormat,
    /// The file to convert.
    pub file: PathBuf,
    /// The model whose state_dict FILE holds (its parameter names and shapes must match).
    #[arg(long, value_enum)]
    pub model: ModelKind,
    /// Recipe whose settings (data normalisation, batch sizes) the checkpoint records [default: the model's].
    #[arg(long, value_enum)]
    pub recipe: Option<Recipe>,
    /// Dataset the checkpoint is evaluated on: mnist or fashion-mnist [default: the recipe's].
    #[arg(long, value_enum)]
    pub dataset: Option<Dataset>,
    /// Checkpoint directory to create (must not exist or be empty).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

pub fn run(args: ImportArgs) -> Result<()> {
    let ImportFormat::Pytorch = args.from;
    let mut config = args.recipe.unwrap_or(Recipe::of_model(args.model)).config();
    config.model = args.model;
    if let Some(d) = args.dataset {
        config.dataset = crate::data::DatasetSpec::Idx(d);
    }
    let device = Default::default();
    let model = crate::import::from_pytorch_file::<backend::Cpu>(args.model, &args.file, &device)?;
    let run = RunDir::create(args.out.clone())?;
    run.save_config(&config)?;
    run.save_checkpoint(&model, None, &crate::progress::Progress::default())?;
    println!(
        "imported {} ({}, {} parameters) into {}",
        args.file.display(),
        args.model.name(),
        ember_models::Classifier::trainable_params(&model),
        run.path.display()
    );
    Ok(())
}
