//! `ember info`: the compiled backends, the device a run would use and, as a preflight, one
//! convolution trained on it.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use anyhow::Result;
use burn::nn::conv::Conv2dConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use clap::Args;

use crate::backend::{self, BackendError, BackendTask, DeviceArg, DeviceInfo};

/// `ember info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The --device value to resolve and check.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
}

pub fn run(args: InfoArgs) -> Result<()> {
    println!("ember {}", env!("CARGO_PKG_VERSION"));
    println!("burn 0.21.0");
    println!("compiled backends: {}", backend::compiled().join(", "));
    println!("cpu threads: {}", backend::cpu_threads());
    println!(
        "cpu kernels: {} (EMBER_KERNELS), vector instructions: {} (EMBER_SIMD)",
        if ember_kernels::kernels_enabled() {
            "ember's"
        } else {
            "burn's stock ops"
        },
        ember_kernels::simd_in_use()
    );
    println!("models (--model):");
    for model in crate::registry::global().models() {
        let aliases = model.aliases();
        let aliases = if aliases.is_empty() {
            String::new()
        } else {
            format!(" (also {})", aliases.join(", "))
        };
        println!("  {}{aliases}: {}", model.name(), model.about());
    }
    let resolved = backend::resolve(args.device)?;
    let device = match &resolved {
        backend::Resolved::Cpu => format!("cpu ({} backend)", backend::CPU_BACKEND),
        backend::Resolved::Cuda { index, name } => format!("cuda:{index} ({name})"),
    };
    println!("--device {} uses: {device}", args.device);
    #[cfg(feature = "cuda")]
    if let backend::Resolved::Cuda { index, .. } = resolved {
        let kit = backend::toolkit(args.device)?;
        if let Some(bytes) = backend::total_memory(index) {
            println!("device memory: {:.1} GiB", bytes as f64 / (1u64 << 30) as f64);
        }
        println!(
            "driver supports CUDA {}.{}; NVRTC {}.{}; headers: {}",
            kit.driver_cuda.0,
            kit.driver_cuda.1,
            kit.nvrtc.0,
            kit.nvrtc.1,
            kit.headers.display()
        );
    }
    let seconds = backend::dispatch(args.device, ConvCheck)?.map_err(|reason| BackendError::Smoke {
        device: args.device,
        reason,
    })?;
    println!(
        "check: conv2d forward and backward ok in {seconds:.2} s (on a GPU: kernel compilation included)"
    );
    Ok(())
}

/// One 3x3 convolution on a batch of ones, forward and backward, its weight gradient read back
/// and checked: every entry is the number of output positions, 2 x 26 x 26 = 1,352, exactly
/// (sums of ones are exact in f32 and TF32 alike). A panic inside burn becomes the error text.
struct ConvCheck;

impl BackendTask for ConvCheck {
    type Output = Result<f64, String>;

    fn run<B: AutodiffBackend>(self, device: B::Device, _: DeviceInfo) -> Self::Output {
        let start = Instant::now();
        let hook = std::panic::take_hook();
        // The panic is reported as the error's reason, once, not as a backtrace.
        std::panic::set_hook(Box::new(|_| {}));
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let conv = Conv2dConfig::new([1, 4], [3, 3]).init::<B>(&device);
            let x = Tensor::<B, 4>::ones([2, 1, 28, 28], &device);
            let grads = conv.forward(x).sum().backward();
            let grad = conv.weight.grad(&grads).ok_or("no weight gradient")?;
            let values = grad.into_data().to_vec::<f32>().map_err(|e| format!("{e:?}"))?;
            match values.iter().find(|&&v| v != 1352.0) {
                None => Ok(()),
                Some(v) => Err(format!("weight gradient {v}, expected 1352")),
            }
        }));
        std::panic::set_hook(hook);
        match outcome {
            Ok(Ok(())) => Ok(start.elapsed().as_secs_f64()),
            Ok(Err(reason)) => Err(reason),
            Err(payload) => Err(payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into())
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")),
        }
    }
}
