//! ember: a CNN trainer on burn that keeps the whole dataset on the device and follows
//! PyTorch's recipes exactly (models, initialisation, optimizers, schedules).
//!
//! The binary (`src/main.rs`) only parses arguments; everything it does lives here:
//! [`cli`] defines and runs the commands, [`tasks`] what each does with a model, [`train`] holds
//! the one training loop, [`backend`] the one place concrete backends are named.
//!
//! # Your own model
//! Any burn `Module` that implements [`model::Classifier`] trains with ember once an
//! [`model::EmberModel`] says its name and how to build it for a dataset: through
//! [`trainer::Trainer`] from your code, or with ember's whole command line in your own binary
//! ([`cli::main_with`]). It gets what ember's models get: the data on the device, the recipes'
//! PyTorch-exact optimizers and schedules, checkpoints, bit-identical resume, `metrics.csv`,
//! `curves.png`, `eval`, `predict`, `import`, `bench`. Layers called through
//! `ember_kernels::nn` (`conv2d`, `conv2d_relu`, `linear`, `linear_relu`, `max_pool2d`) and
//! `ember_models::BatchNorm2d` run ember's CPU kernels on the flex backend.
//!
//! A linear model on synthetic 8x8 images, trained for two epochs on ndarray:
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::nn::{Linear, LinearConfig};
//! use burn::prelude::*;
//! use ember::config::Recipe;
//! use ember::data::Data;
//! use ember::model::{Classifier, EmberModel, ImageShape};
//! use ember::trainer::Trainer;
//! use ember_models::Output;
//!
//! #[derive(Module, Debug)]
//! struct Tiny<B: Backend> {
//!     fc: Linear<B>,
//! }
//!
//! impl<B: Backend> Classifier<B> for Tiny<B> {
//!     fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
//!         self.fc.forward(images.flatten(1, 3)) // [batch, 64] -> [batch, classes]
//!     }
//!     fn output(&self) -> Output {
//!         Output::Logits
//!     }
//! }
//!
//! #[derive(Clone)]
//! struct TinyModel;
//!
//! impl EmberModel for TinyModel {
//!     type Net<B: Backend> = Tiny<B>;
//!     fn name(&self) -> &str {
//!         "tiny"
//!     }
//!     fn init<B: Backend>(&self, input: ImageShape, classes: usize, device: &B::Device) -> Tiny<B> {
//!         Tiny { fc: LinearConfig::new(input.len(), classes).init(device) }
//!     }
//! }
//!
//! // Class 0 dark images, class 1 bright ones: u8 pixels, channel-major, one label each.
//! let shape = ImageShape { channels: 1, height: 8, width: 8 };
//! let make = |n: usize| {
//!     let labels: Vec<u16> = (0..n).map(|i| (i % 2) as u16).collect();
//!     let images = labels.iter().flat_map(|&l| [if l == 1 { 200u8 } else { 30 }; 64]).collect();
//!     (images, labels)
//! };
//! let data = Data::from_memory(make(256), make(64), shape, vec!["dark".into(), "bright".into()])?;
//! let dir = std::env::temp_dir().join(format!("ember-doctest-{}", std::process::id()));
//! let trainer = Trainer::new(Recipe::Tch).epochs(2).batch_size(32).lr(1e-2).run_dir(&dir).quiet(true);
//! let (_model, fitted) = trainer.fit_on::<Autodiff<NdArray>, _>(&TinyModel, data, true, &Default::default())?;
//! assert_eq!(fitted.test.correct, 64);
//! assert!(dir.join("metrics.csv").exists() && dir.join("state.json").exists());
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), anyhow::Error>(())
//! ```

// The command-line structs' `///` comments are also clap's `--help` text, which writes
// placeholders as `<recipe>`; rustdoc would read them as HTML tags.
#![allow(rustdoc::invalid_html_tags)]

pub mod augment;
pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod compare;
pub mod config;
pub mod data;
pub mod faults;
pub mod files;
pub mod gpu;
pub mod import;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod plot;
pub mod predict;
pub mod progress;
pub mod race;
pub mod registry;
pub mod run;
pub mod seed;
pub mod tasks;
pub mod train;
pub mod trainer;
