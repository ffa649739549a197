//! The one place where ember names concrete backends, and the dispatch from a `--device`
//! value to a generic task.
//!
//! CPU: burn's `flex` backend (default feature), or `ndarray` when built without `flex`.
//! GPU: burn's CUDA backend with fusion and autotune (feature `cuda`), driver loaded at run time.

use std::fmt;
use std::str::FromStr;

use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;

use crate::model::{EmberModel, Trainable};

#[cfg(feature = "flex")]
pub type Cpu = burn::backend::Flex;
#[cfg(all(feature = "ndarray", not(feature = "flex")))]
pub type Cpu = burn::backend::NdArray<f32>;
#[cfg(not(any(feature = "flex", feature = "ndarray")))]
compile_error!("ember needs a CPU backend: enable the `flex` (default) or `ndarray` feature");

#[cfg(feature = "cuda")]
pub type Gpu = burn::backend::Cuda<f32, i32>;

/// Name of the CPU backend compiled in.
pub const CPU_BACKEND: &str = if cfg!(feature = "flex") { "flex" } else { "ndarray" };

/// Errors choosing a device; each says what to do instead.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Clap's message says which flag and value; this says what it takes.
    #[error("expected auto, cpu, cuda or cuda:N")]
    Parse,
    #[error("--device {0} needs a build with CUDA: cargo build --release --features cuda")]
    CudaNotCompiled(DeviceArg),
    #[error("--device {device}: no CUDA driver could be loaded (libcuda.so); install the NVIDIA driver or use --device cpu")]
    NoDriver { device: DeviceArg },
    #[error("--device {device}: the CUDA driver failed to initialise ({reason}); use --device cpu")]
    DriverInit { device: DeviceArg, reason: String },
    #[error("--device {device}: this machine has {count} CUDA device(s)")]
    NoSuchDevice { device: DeviceArg, count: usize },
    #[error("--device {device}: NVRTC (libnvrtc.so) could not be loaded; burn's CUDA backend compiles every kernel with it at run time: install the CUDA toolkit's NVRTC or add its lib folder to LD_LIBRARY_PATH")]
    NoNvrtc { device: DeviceArg },
    #[error("--device {device}: no CUDA headers at {looked}; burn's CUDA kernels include them when compiled at run time: set CUDA_PATH to the CUDA toolkit's folder")]
    NoCudaHeaders { device: DeviceArg, looked: String },
    #[error("--device {device}: a test convolution on the GPU failed: {reason}")]
    Smoke { device: DeviceArg, reason: String },
}

/// A `--device` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceArg {
    /// The first CUDA device when compiled with CUDA and one is present, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceArg {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or(BackendError::Parse),
        }
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The device a run uses, in words: backend name and device description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub backend: &'static str,
    pub device: String,
    /// The CUDA device index, when the device is a GPU.
    pub cuda: Option<usize>,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.backend, self.device)
    }
}

/// Work that runs on any autodiff backend; [`dispatch`] picks the backend.
pub trait BackendTask {
    type Output;
    fn run<B: AutodiffBackend>(self, device: B::Device, info: DeviceInfo) -> Self::Output;
}

/// A device resolved against what is compiled in and present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    Cpu,
    Cuda { index: usize, name: String },
}

/// Compute threads of the CPU backend's pool.
pub fn cpu_threads() -> usize {
    rayon::current_num_threads()
}

/// Backends compiled into this binary.
pub fn compiled() -> Vec<&'static str> {
    let mut v = vec![CPU_BACKEND];
    if cfg!(feature = "cuda") {
        v.push("cuda (fusion, autotune)");
    }
    v
}

/// Maps `arg` to a device that exists, without touching any backend.
pub fn resolve(arg: DeviceArg) -> Result<Resolved, BackendError> {
    match arg {
        DeviceArg::Cpu => Ok(Resolved::Cpu),
        DeviceArg::Auto => Ok(cuda::probe(0).unwrap_or(Resolved::Cpu)),
        DeviceArg::Cuda(index) => {
            if !cfg!(feature = "cuda") {
                return Err(BackendError::CudaNotCompiled(arg));
            }
            cuda::probe_checked(arg, index)
        }
    }
}

/// Resolves `arg` and runs `task` on the matching backend, with autodiff.
pub fn dispatch<T: BackendTask>(arg: DeviceArg, task: T) -> Result<T::Output, BackendError> {
    on_backend(arg, task)
}

/// Work for model `D` (ember's or a user's) on any autodiff backend; [`dispatch_model`] picks the
/// backend. `run` may rely on `D`'s network being trainable there: [`dispatch_model`] checks that
/// for each backend compiled in, where the backend is a concrete type.
pub trait ModelTask<D: EmberModel> {
    type Output;
    fn run<B: AutodiffBackend>(self, model: &D, device: B::Device, info: DeviceInfo) -> Self::Output
    where
        D::Net<B>: Trainable<B>;
}

/// A model whose network trains on every backend compiled in: every [`EmberModel`] whose
/// network is a `#[derive(Module)]` struct (the bound is stated once here, not at each use).
pub trait Trains: EmberModel {
    /// Resolves `arg` and runs `task` for this model on the matching backend.
    fn dispatch<T: ModelTask<Self>>(&self, arg: DeviceArg, task: T) -> Result<T::Output, BackendError>;
}

#[cfg(not(feature = "cuda"))]
impl<D: EmberModel> Trains for D
where
    D::Net<Autodiff<Cpu>>: Trainable<Autodiff<Cpu>>,
{
    fn dispatch<T: ModelTask<Self>>(&self, arg: DeviceArg, task: T) -> Result<T::Output, BackendError> {
        on_backend(arg, WithModel(self, task))
    }
}

#[cfg(feature = "cuda")]
impl<D: EmberModel> Trains for D
where
    D::Net<Autodiff<Cpu>>: Trainable<Autodiff<Cpu>>,
    D::Net<Autodiff<Gpu>>: Trainable<Autodiff<Gpu>>,
{
    fn dispatch<T: ModelTask<Self>>(&self, arg: DeviceArg, task: T) -> Result<T::Output, BackendError> {
        on_backend(arg, WithModel(self, task))
    }
}

/// Resolves `arg` and runs `task` for `model` on the matching backend.
pub fn dispatch_model<D: Trains, T: ModelTask<D>>(
    arg: DeviceArg,
    model: &D,
    task: T,
) -> Result<T::Output, BackendError> {
    model.dispatch(arg, task)
}

/// The CPU backend's device.
type CpuDevice = <Autodiff<Cpu> as burn::tensor::backend::BackendTypes>::Device;

/// A task run on one of the concrete backends: [`on_backend`] is the one switch over them.
trait OnBackend {
    type Output;
    fn cpu(self, device: CpuDevice, info: DeviceInfo) -> Self::Output;
    #[cfg(feature = "cuda")]
    fn cuda(self, device: burn::backend::cuda::CudaDevice, info: DeviceInfo) -> Self::Output;
}

impl<T: BackendTask> OnBackend for T {
    type Output = T::Output;
    fn cpu(self, device: CpuDevice, info: DeviceInfo) -> T::Output {
        self.run::<Autodiff<Cpu>>(device, info)
    }
    #[cfg(feature = "cuda")]
    fn cuda(self, device: burn::backend::cuda::CudaDevice, info: DeviceInfo) -> T::Output {
        self.run::<Autodiff<Gpu>>(device, info)
    }
}

/// A [`ModelTask`] with its model, as an [`OnBackend`].
struct WithModel<'a, D, T>(&'a D, T);

#[cfg(not(feature = "cuda"))]
impl<D: EmberModel, T: ModelTask<D>> OnBackend for WithModel<'_, D, T>
where
    D::Net<Autodiff<Cpu>>: Trainable<Autodiff<Cpu>>,
{
    type Output = T::Output;
    fn cpu(self, device: CpuDevice, info: DeviceInfo) -> T::Output {
        self.1.run::<Autodiff<Cpu>>(self.0, device, info)
    }
}

#[cfg(feature = "cuda")]
impl<D: EmberModel, T: ModelTask<D>> OnBackend for WithModel<'_, D, T>
where
    D::Net<Autodiff<Cpu>>: Trainable<Autodiff<Cpu>>,
    D::Net<Autodiff<Gpu>>: Trainable<Autodiff<Gpu>>,
{
    type Output = T::Output;
    fn cpu(self, device: CpuDevice, info: DeviceInfo) -> T::Output {
        self.1.run::<Autodiff<Cpu>>(self.0, device, info)
    }
    fn cuda(self, device: burn::backend::cuda::CudaDevice, info: DeviceInfo) -> T::Output {
        self.1.run::<Autodiff<Gpu>>(self.0, device, info)
    }
}

fn on_backend<T: OnBackend>(arg: DeviceArg, task: T) -> Result<T::Output, BackendError> {
    match resolve(arg)? {
        Resolved::Cpu => Ok(task.cpu(
            Default::default(),
            DeviceInfo {
                backend: CPU_BACKEND,
                device: format!("cpu ({} threads)", cpu_threads()),
                cuda: None,
            },
        )),
        #[cfg(feature = "cuda")]
        Resolved::Cuda { index, name } => {
            cuda::configure_caches();
            Ok(task.cuda(
                burn::backend::cuda::CudaDevice::new(index),
                DeviceInfo {
                    backend: "cuda",
                    device: format!("cuda:{index} ({name})"),
                    cuda: Some(index),
                },
            ))
        }
        #[cfg(not(feature = "cuda"))]
        Resolved::Cuda { .. } => unreachable!("resolve() only yields CUDA devices when compiled with CUDA"),
    }
}

/// What `ember info` reports of the CUDA toolkit a run uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolkit {
    /// The CUDA headers burn's kernels are compiled against.
    pub headers: std::path::PathBuf,
    /// NVRTC's version (major, minor).
    pub nvrtc: (i32, i32),
    /// The newest CUDA version the driver supports (major, minor).
    pub driver_cuda: (i32, i32),
}

#[cfg(feature = "cuda")]
pub use cuda::toolkit;
pub use cuda::total_memory;

#[cfg(feature = "cuda")]
mod cuda {
    use super::{BackendError, DeviceArg, Resolved, Toolkit};
    use cudarc::driver::result;

    /// Asks the driver, without panicking, whether CUDA device `index` exists.
    pub fn probe_checked(arg: DeviceArg, index: usize) -> Result<Resolved, BackendError> {
        // SAFETY: only loads the driver library to see whether it is there.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(BackendError::NoDriver { device: arg });
        }
        let init = |e: result::DriverError| BackendError::DriverInit {
            device: arg,
            reason: e.to_string(),
        };
        result::init().map_err(init)?;
        let count = result::device::get_count().map_err(init)? as usize;
        if index >= count {
            return Err(BackendError::NoSuchDevice { device: arg, count });
        }
        let dev = result::device::get(index as i32).map_err(init)?;
        let name = result::device::get_name(dev).map_err(init)?;
        toolkit(arg)?;
        Ok(Resolved::Cuda { index, name })
    }

    /// The CUDA toolkit pieces a run needs besides the driver, as burn's CUDA backend finds
    /// them: NVRTC, and the headers its kernels include (cubecl-cuda 0.10 `install::cuda_path`:
    /// `CUDA_PATH`, then /usr/local/cuda, /opt/cuda, /usr). Without them the first kernel
    /// panics; here each is a one-line error before any work.
    pub fn toolkit(arg: DeviceArg) -> Result<Toolkit, BackendError> {
        // SAFETY: only loads the library to see whether it is there.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(BackendError::NoNvrtc { device: arg });
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC is loaded (checked above); the pointers are to live locals.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        let looked = || match std::env::var("CUDA_PATH") {
            Ok(path) => format!("CUDA_PATH={path}/include"),
            Err(_) => "CUDA_PATH (unset), /usr/local/cuda, /opt/cuda, /usr/bin/nvcc".to_string(),
        };
        let root = cubecl::cuda::install::cuda_path().ok_or_else(|| BackendError::NoCudaHeaders {
            device: arg,
            looked: looked(),
        })?;
        let headers = root.join("include");
        if !headers.join("cuda_runtime.h").is_file() {
            return Err(BackendError::NoCudaHeaders {
                device: arg,
                looked: format!("{} (no cuda_runtime.h)", headers.display()),
            });
        }
        let mut driver = 0;
        // SAFETY: the driver is loaded and initialised (probe_checked); a live local.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
        Ok(Toolkit {
            headers,
            nvrtc: (major, minor),
            driver_cuda: (driver / 1000, (driver % 1000) / 10),
        })
    }

    /// Turns on cubecl's on-disk cache of compiled kernels (off by default in cubecl 0.10; its
    /// autotune cache is on), so that a second process, a benchmark after a preflight, neither
    /// recompiles nor retunes. A `cubecl.toml`/`burn.toml` or `CUBECL_*` variable that sets the
    /// cache wins. Once per process, before burn's CUDA backend first runs.
    pub fn configure_caches() {
        use cubecl::config::cache::CacheConfig;
        use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
            if config.compilation.cache.is_none() {
                config.compilation.cache = Some(CacheConfig::Target);
            }
            CubeClRuntimeConfig::set(config);
        });
    }

    /// Total memory of CUDA device `index`, in bytes.
    pub fn total_memory(index: usize) -> Option<usize> {
        let dev = result::device::get(index as i32).ok()?;
        // SAFETY: `dev` is a valid device handle from the initialised driver.
        unsafe { result::device::total_mem(dev) }.ok()
    }

    pub fn probe(index: usize) -> Option<Resolved> {
        probe_checked(DeviceArg::Cuda(index), index).ok()
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::{BackendError, DeviceArg, Resolved};

    pub fn probe_checked(arg: DeviceArg, _index: usize) -> Result<Resolved, BackendError> {
        Err(BackendError::CudaNotCompiled(arg))
    }

    pub fn probe(_index: usize) -> Option<Resolved> {
        None
    }

    pub fn total_memory(_index: usize) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_values() {
        assert_eq!("auto".parse::<DeviceArg>().unwrap(), DeviceArg::Auto);
        assert_eq!("cpu".parse::<DeviceArg>().unwrap(), DeviceArg::Cpu);
        assert_eq!("cuda".parse::<DeviceArg>().unwrap(), DeviceArg::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceArg>().unwrap(), DeviceArg::Cuda(3));
        // Only clap parses these, and its message names the flag and the value
        // (tests/errors.rs checks the whole line): this one says what is accepted.
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", ""] {
            let err = bad.parse::<DeviceArg>().unwrap_err().to_string();
            assert_eq!(err, "expected auto, cpu, cuda or cuda:N", "{bad}");
        }
    }

    #[test]
    fn cpu_always_resolves() {
        assert_eq!(resolve(DeviceArg::Cpu).unwrap(), Resolved::Cpu);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_build_it() {
        let err = resolve(DeviceArg::Cuda(0)).unwrap_err().to_string();
        assert!(err.contains("--features cuda"), "{err}");
        assert_eq!(resolve(DeviceArg::Auto).unwrap(), Resolved::Cpu);
    }
}
