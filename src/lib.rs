//! ember: a CNN trainer on burn that keeps the whole dataset on the device and follows
//! PyTorch's recipes exactly (models, initialisation, optimizers, schedules).
//!
//! The binary (`src/main.rs`) only parses arguments; everything it does lives here:
//! [`cli`] defines and runs the commands, [`train`] holds the one training loop,
//! [`backend`] the one place concrete backends are named.

pub mod augment;
pub mod backend;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod compare;
pub mod config;
pub mod data;
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
