//! `ember info`: the compiled backends and the device a run would use.

use anyhow::Result;
use clap::Args;

use crate::backend::{self, DeviceArg};

/// `ember info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The --device value to resolve.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
}

pub fn run(args: InfoArgs) -> Result<()> {
    println!("ember {}", env!("CARGO_PKG_VERSION"));
    println!("burn 0.21.0");
    println!("compiled backends: {}", backend::compiled().join(", "));
    println!("cpu threads: {}", backend::cpu_threads());
    let resolved = backend::resolve(args.device)?;
    let device = match resolved {
        backend::Resolved::Cpu => format!("cpu ({} backend)", backend::CPU_BACKEND),
        backend::Resolved::Cuda { index, name } => format!("cuda:{index} ({name})"),
    };
    println!("--device {} uses: {device}", args.device);
    Ok(())
}
