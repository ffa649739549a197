//! GPU utilisation and memory, sampled through NVML (`libnvidia-ml.so`, loaded at run time) the
//! way `nvidia-smi -l` does, for `ember bench`. Without the `cuda` feature nothing is sampled.

use std::time::Duration;

/// What a [`GpuMonitor`] saw between start and stop.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSamples {
    pub interval_ms: u64,
    /// GPU utilisation, percent, one sample per interval.
    pub utilization: Vec<f64>,
    /// Largest device memory in use NVML reported.
    pub used_bytes_max: u64,
    /// Bytes reserved by burn's device memory pool at the end.
    pub pool_bytes: Option<u64>,
}

/// Sampling period: `nvidia-smi -l`'s finest, as the issue asks.
pub const INTERVAL: Duration = Duration::from_millis(100);

#[cfg(feature = "cuda")]
mod imp {
    use super::{GpuSamples, INTERVAL};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// A GPU that NVML can see, ready to be sampled.
    pub struct GpuMonitor {
        index: usize,
    }

    /// A monitor that is sampling.
    pub struct RunningMonitor {
        index: usize,
        stop: Arc<AtomicBool>,
        thread: JoinHandle<(Vec<f64>, u64)>,
    }

    impl GpuMonitor {
        /// `None` when NVML cannot be loaded or has no device `index`.
        pub fn new(index: usize) -> Option<Self> {
            let nvml = nvml_wrapper::Nvml::init().ok()?;
            nvml.device_by_index(index as u32).ok()?;
            Some(Self { index })
        }

        pub fn start(self) -> RunningMonitor {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            let index = self.index as u32;
            let thread = std::thread::spawn(move || {
                let mut util = Vec::new();
                let mut used_max = 0u64;
                let Ok(nvml) = nvml_wrapper::Nvml::init() else {
                    return (util, used_max);
                };
                let Ok(dev) = nvml.device_by_index(index) else {
                    return (util, used_max);
                };
                while !flag.load(Ordering::Relaxed) {
                    if let Ok(u) = dev.utilization_rates() {
                        util.push(f64::from(u.gpu));
                    }
                    if let Ok(m) = dev.memory_info() {
                        used_max = used_max.max(m.used);
                    }
                    std::thread::sleep(INTERVAL);
                }
                (util, used_max)
            });
            RunningMonitor {
                index: self.index,
                stop,
                thread,
            }
        }
    }

    impl RunningMonitor {
        pub fn stop(self) -> GpuSamples {
            self.stop.store(true, Ordering::Relaxed);
            let (utilization, used_bytes_max) = self.thread.join().unwrap_or_default();
            use cubecl::Runtime;
            let client = cubecl::cuda::CudaRuntime::client(&cubecl::cuda::CudaDevice::new(self.index));
            let pool_bytes = client.memory_usage().ok().map(|m| m.bytes_reserved);
            GpuSamples {
                interval_ms: INTERVAL.as_millis() as u64,
                utilization,
                used_bytes_max,
                pool_bytes,
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::GpuSamples;

    /// Never constructed without the `cuda` feature.
    pub enum GpuMonitor {}
    pub enum RunningMonitor {}

    impl GpuMonitor {
        pub fn new(_index: usize) -> Option<Self> {
            None
        }

        pub fn start(self) -> RunningMonitor {
            match self {}
        }
    }

    impl RunningMonitor {
        pub fn stop(self) -> GpuSamples {
            match self {}
        }
    }
}

pub use imp::{GpuMonitor, RunningMonitor};
