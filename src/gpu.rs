//! GPU utilisation and memory, sampled through NVML (`libnvidia-ml.so`, loaded at run time) the
//! way `nvidia-smi -l` does, for `ember bench`. Without the `cuda` feature nothing is sampled.
//!
//! The sampler starts before the benchmark touches the device and runs to its end, so the
//! memory figure is a true peak: the largest NVML "used" seen minus the reading at the start
//! (the process's CUDA context, pool and buffers; PyTorch's bench.py does the same). Utilisation
//! is kept only while [`GpuMonitor::timing`] is on (the timed steps and the full epoch). NVML
//! numbers its devices by PCI order, CUDA by speed unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`: the
//! device is found by its PCI bus id, which both agree on.

use std::time::Duration;

/// What a [`GpuMonitor`] saw.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSamples {
    pub interval_ms: u64,
    /// GPU utilisation, percent, one sample per interval while timing.
    pub utilization: Vec<f64>,
    /// Peak NVML "used" memory minus the reading when the monitor started.
    pub used_bytes_peak: u64,
    /// Largest reservation of burn's device memory pool read at the benchmark's sync points.
    pub pool_bytes: Option<u64>,
    /// How NVML's device was matched to the CUDA device: "pci-bus-id 0000:..." or "index N".
    pub matched_by: String,
}

/// Sampling period: `nvidia-smi -l`'s finest.
pub const INTERVAL: Duration = Duration::from_millis(100);

#[cfg(feature = "cuda")]
mod imp {
    use super::{GpuSamples, INTERVAL};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// Samples NVML on its own thread from [`GpuMonitor::new`] to [`GpuMonitor::stop`].
    pub struct GpuMonitor {
        index: usize,
        matched_by: String,
        stop: Arc<AtomicBool>,
        timing: Arc<AtomicBool>,
        pool_max: Option<u64>,
        thread: JoinHandle<(Vec<f64>, u64)>,
    }

    /// The PCI bus id of CUDA device `index`, as the driver writes it ("0000:41:00.0").
    fn pci_bus_id(index: usize) -> Option<String> {
        let dev = cudarc::driver::result::device::get(index as i32).ok()?;
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer outlives the call and its length is passed; `dev` is valid.
        let status =
            unsafe { cudarc::driver::sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
        if status != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return None;
        }
        // The driver wrote a NUL-terminated string into `buf`; read within the buffer anyway.
        let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
        let id = std::ffi::CStr::from_bytes_until_nul(&bytes).ok()?;
        Some(id.to_string_lossy().into_owned())
    }

    impl GpuMonitor {
        /// Starts sampling CUDA device `index`; `None` when NVML cannot be loaded or does not
        /// have the device.
        pub fn new(index: usize) -> Option<Self> {
            let nvml = nvml_wrapper::Nvml::init().ok()?;
            let (key, matched_by) = match pci_bus_id(index) {
                Some(id) if nvml.device_by_pci_bus_id(id.as_str()).is_ok() => {
                    (Some(id.clone()), format!("pci-bus-id {id}"))
                }
                _ => {
                    nvml.device_by_index(index as u32).ok()?;
                    (None, format!("index {index}"))
                }
            };
            let stop = Arc::new(AtomicBool::new(false));
            let timing = Arc::new(AtomicBool::new(false));
            let (stop_flag, timing_flag) = (stop.clone(), timing.clone());
            let thread = std::thread::spawn(move || {
                let mut util = Vec::new();
                let dev = match &key {
                    Some(id) => nvml.device_by_pci_bus_id(id.as_str()),
                    None => nvml.device_by_index(index as u32),
                };
                let Ok(dev) = dev else {
                    return (util, 0);
                };
                let start = dev.memory_info().map(|m| m.used).unwrap_or(0);
                let mut used_max = start;
                while !stop_flag.load(Ordering::Relaxed) {
                    if timing_flag.load(Ordering::Relaxed) {
                        if let Ok(u) = dev.utilization_rates() {
                            util.push(f64::from(u.gpu));
                        }
                    }
                    if let Ok(m) = dev.memory_info() {
                        used_max = used_max.max(m.used);
                    }
                    std::thread::sleep(INTERVAL);
                }
                (util, used_max - start)
            });
            Some(Self {
                index,
                matched_by,
                stop,
                timing,
                pool_max: None,
                thread,
            })
        }

        /// Keeps utilisation samples while `on`.
        pub fn timing(&self, on: bool) {
            self.timing.store(on, Ordering::Relaxed);
        }

        /// Reads burn's pool reservation (call where the device is synchronised) and keeps
        /// the largest.
        pub fn read_pool(&mut self) {
            use cubecl::Runtime;
            let client = cubecl::cuda::CudaRuntime::client(&cubecl::cuda::CudaDevice::new(self.index));
            if let Ok(usage) = client.memory_usage() {
                self.pool_max = Some(self.pool_max.unwrap_or(0).max(usage.bytes_reserved));
            }
        }

        pub fn stop(mut self) -> GpuSamples {
            self.read_pool();
            self.stop.store(true, Ordering::Relaxed);
            let (utilization, used_bytes_peak) = self.thread.join().unwrap_or_default();
            GpuSamples {
                interval_ms: INTERVAL.as_millis() as u64,
                utilization,
                used_bytes_peak,
                pool_bytes: self.pool_max,
                matched_by: self.matched_by,
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::GpuSamples;

    /// Never constructed without the `cuda` feature.
    pub enum GpuMonitor {}

    impl GpuMonitor {
        pub fn new(_index: usize) -> Option<Self> {
            None
        }

        pub fn timing(&self, _on: bool) {
            match *self {}
        }

        pub fn read_pool(&mut self) {
            match *self {}
        }

        pub fn stop(self) -> GpuSamples {
            match self {}
        }
    }
}

pub use imp::GpuMonitor;
