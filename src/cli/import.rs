//! `ember import`: a PyTorch state_dict into a run directory.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::config::Recipe;
use crate::data::Dataset;
use crate::model::ModelName;
use crate::registry;
use crate::tasks::ImportJob;

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
    #[arg(long, value_parser = registry::parse_model)]
    pub model: ModelName,
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
    let model = registry::global().get(args.model.name())?;
    let mut config = args.recipe.unwrap_or(Recipe::of_model(model.name())).config();
    config.model = args.model.clone();
    if let Some(d) = args.dataset {
        config.dataset = crate::data::DatasetSpec::Idx(d);
    }
    let out = args.out.clone();
    let params = model.import(ImportJob {
        config,
        file: args.file.clone(),
        out: out.clone(),
    })?;
    println!(
        "imported {} ({}, {params} parameters) into {}",
        args.file.display(),
        model.name(),
        out.display()
    );
    Ok(())
}
