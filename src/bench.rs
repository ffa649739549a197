//! `ember bench`: steady-state timings of the seed scenarios, in a JSON record that the PyTorch
//! side (`benches/pytorch/bench.py`) writes too (`benches/schema.json`).
//!
//! Training: the steps `ember train` runs ([`train::EpochSteps`]): `warmup` steps plus the last
//! partial batch (the first step timed alone: on a GPU it compiles and autotunes), then `repeats`
//! timed runs of `steps` consecutive steps, each ended by a device sync inside the timed region;
//! a repeat's figure is its mean time per step.
//! Evaluation: the 10,000 test images in batches of 1,000, one untimed pass, then
//! `eval_repeats` timed passes, with the initial weights and again with the weights after the
//! training steps (the two can differ in speed, e.g. through denormals or sparsity on CPUs).

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::backend::DeviceInfo;
use crate::config::{Recipe, TrainConfig};
use crate::data::Data;
use crate::gpu::GpuMonitor;
use crate::model::{Classifier, EmberModel, Trainable};
use crate::train::{self, Splits};

/// Version tag of the JSON record; both sides write it.
pub const SCHEMA: &str = "ember-bench/1";

/// The seed benchmarks' settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// PytorchExampleNet, batch 64, Adadelta (the PyTorch example).
    Net64,
    /// PytorchExampleNet, batch 256, Adadelta.
    Net256,
    /// PytorchExampleNet, batch 1024, Adadelta: a batch that fills a GPU.
    Net1024,
    /// PytorchExampleNet, batch 4096, Adadelta.
    Net4096,
    /// TchNet, batch 256, Adam (the tch-rs port).
    Tch256,
    /// FlashlightCnn, batch 64, SGD (flashlight's example).
    Flash64,
    /// ResNet-20, batch 128, the resnet-fashion recipe (Nesterov SGD, one-cycle, label smoothing,
    /// shifts and flips) on 1x28x28 images.
    #[value(name = "resnet20-128")]
    #[serde(rename = "resnet20-128")]
    Resnet20_128,
    /// ResNet-18 (CIFAR stem), batch 128, resnet-fashion's optimizer and augmentation, on 3x32x32
    /// images: MNIST's digits centred on a 32x32 canvas in three channels (CIFAR's shape; no
    /// CIFAR download reaches these machines). 10,000 training and 1,000 test images.
    #[value(name = "resnet18-128")]
    #[serde(rename = "resnet18-128")]
    Resnet18_128,
    /// SpeedrunNet, batch 256, the speedrun recipe (Nesterov SGD, one-cycle, shifts).
    #[value(name = "speedrun-256")]
    #[serde(rename = "speedrun-256")]
    Speedrun256,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Self::Net64 => "net64",
            Self::Net256 => "net256",
            Self::Net1024 => "net1024",
            Self::Net4096 => "net4096",
            Self::Tch256 => "tch256",
            Self::Flash64 => "flash64",
            Self::Resnet20_128 => "resnet20-128",
            Self::Resnet18_128 => "resnet18-128",
            Self::Speedrun256 => "speedrun-256",
        }
    }

    /// Whether the scenario trains with a recipe of its own (optimizer parameter groups,
    /// schedule, label smoothing, augmentation), which `benches/pytorch/bench.py` reads from the
    /// scenario's `config.json` (`--config`) rather than from its own table; the seed scenarios'
    /// PyTorch side predates that and also has a dataloader mode (the seed examples' input
    /// pipelines).
    pub fn modern(self) -> bool {
        matches!(self, Self::Resnet20_128 | Self::Resnet18_128 | Self::Speedrun256)
    }

    /// What to measure when the command line does not say: ResNet-18's step takes seconds on
    /// a CPU, so it gets fewer steps than the others.
    pub fn default_settings(self) -> Settings {
        match self {
            Self::Resnet18_128 => Settings {
                warmup_steps: 2,
                timed_steps: 3,
                repeats: 3,
                eval_repeats: 2,
                full_epoch: false,
            },
            _ => Settings::default(),
        }
    }

    /// The scenario's images from the MNIST-format `data`: only the ones its config trains and
    /// tests on (its `limit_train` / `limit_test`; the rest are dropped, not held through the
    /// run), as they are, or for [`Self::Resnet18_128`] each digit centred on a 32x32 canvas (2
    /// pixels of background each side) and repeated in three channels;
    /// `benches/pytorch/bench.py` slices and builds the same.
    pub fn images(self, mut data: Data) -> Data {
        let config = self.config();
        let limits = [
            config.limit_train.map(|n| config.valid_size + n),
            config.limit_test,
        ];
        for (split, limit) in [&mut data.train, &mut data.test].into_iter().zip(limits) {
            if let Some(n) = limit.filter(|&n| n < split.len()) {
                *split = split.first(n);
            }
            if self == Self::Resnet18_128 {
                *split = colour_canvas(split, 32);
            }
        }
        data
    }
}

/// `split`'s single-channel images centred on a `size` x `size` canvas of zeros, in three
/// channels.
fn colour_canvas(split: &crate::data::Split, size: usize) -> crate::data::Split {
    let from = split.shape;
    assert!(from.channels == 1 && from.height <= size && from.width <= size);
    let shape = crate::data::ImageShape {
        channels: 3,
        height: size,
        width: size,
    };
    let (top, left) = ((size - from.height) / 2, (size - from.width) / 2);
    let mut images = vec![0u8; split.len() * shape.len()];
    for (i, out) in images.chunks_exact_mut(shape.len()).enumerate() {
        let image = split.image(i);
        for plane in out.chunks_exact_mut(size * size) {
            for (y, row) in image.chunks_exact(from.width).enumerate() {
                let at = (top + y) * size + left;
                plane[at..at + from.width].copy_from_slice(row);
            }
        }
    }
    crate::data::Split {
        images,
        labels: split.labels.clone(),
        shape,
    }
}

impl Scenario {
    /// The recipe's settings at this scenario's batch size.
    pub fn config(self) -> TrainConfig {
        let (recipe, batch_size) = match self {
            Self::Net64 => (Recipe::PytorchExample, 64),
            Self::Net256 => (Recipe::PytorchExample, 256),
            Self::Net1024 => (Recipe::PytorchExample, 1024),
            Self::Net4096 => (Recipe::PytorchExample, 4096),
            Self::Tch256 => (Recipe::Tch, 256),
            Self::Flash64 => (Recipe::Flashlight, 64),
            Self::Resnet20_128 => (Recipe::ResnetFashion, 128),
            Self::Resnet18_128 => (Recipe::ResnetFashion, 128),
            Self::Speedrun256 => (Recipe::Speedrun, 256),
        };
        let config = TrainConfig {
            batch_size,
            test_batch_size: 1000,
            valid_size: 0,
            ..recipe.config()
        };
        // The scenarios read MNIST (data/mnist): Fashion-MNIST has the same shape and cost.
        let mnist = TrainConfig {
            dataset: crate::data::DatasetSpec::MNIST,
            normalization: crate::data::Normalization::mnist(),
            ..config.clone()
        };
        match self {
            Self::Resnet20_128 => mnist,
            Self::Resnet18_128 => TrainConfig {
                model: crate::model::ModelKind::Resnet18.into(),
                input: crate::data::ImageShape {
                    channels: 3,
                    height: 32,
                    width: 32,
                },
                limit_train: Some(10_000),
                limit_test: Some(1_000),
                ..mnist
            },
            _ => config,
        }
    }
}

/// How much to measure.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub warmup_steps: usize,
    pub timed_steps: usize,
    pub repeats: usize,
    pub eval_repeats: usize,
    /// Also time one full training epoch (all 60,000 images); otherwise it is estimated from
    /// the median step time.
    pub full_epoch: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            warmup_steps: 10,
            timed_steps: 20,
            repeats: 5,
            eval_repeats: 3,
            full_epoch: false,
        }
    }
}

/// The measurement flags a command line gave; the rest come from the scenario.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Overrides {
    pub warmup_steps: Option<usize>,
    pub timed_steps: Option<usize>,
    pub repeats: Option<usize>,
    pub eval_repeats: Option<usize>,
    pub full_epoch: bool,
}

impl Overrides {
    /// `scenario`'s default settings with these overrides.
    pub fn settings(&self, scenario: Scenario) -> Settings {
        let d = scenario.default_settings();
        Settings {
            warmup_steps: self.warmup_steps.unwrap_or(d.warmup_steps),
            timed_steps: self.timed_steps.unwrap_or(d.timed_steps),
            repeats: self.repeats.unwrap_or(d.repeats),
            eval_repeats: self.eval_repeats.unwrap_or(d.eval_repeats),
            full_epoch: self.full_epoch || d.full_epoch,
        }
    }
}

/// Median, minimum and maximum of a set of measurements, and the measurements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Stats {
    pub fn of(samples: Vec<f64>) -> Self {
        assert!(!samples.is_empty(), "no samples");
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Self {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            samples,
        }
    }

    /// The `q`-quantile (nearest rank).
    pub fn quantile(samples: &[f64], q: f64) -> f64 {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalRecord {
    pub batch_size: usize,
    pub images: usize,
    /// Images/s with the initial weights.
    pub untrained_images_per_sec: Stats,
    /// Images/s with the weights after the benchmark's training steps.
    pub trained_images_per_sec: Stats,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRecord {
    /// Peak resident set size of the process (VmHWM / ru_maxrss).
    pub peak_rss_bytes: u64,
    /// Peak bytes reserved by the framework's device memory pool (GPU only; ember reads burn's
    /// pool at its sync points, PyTorch `max_memory_reserved`).
    pub device_pool_bytes: Option<u64>,
    /// Peak device memory NVML reports in use, minus its reading before the run (GPU only).
    pub device_used_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UtilizationRecord {
    pub interval_ms: u64,
    pub samples: usize,
    pub mean_percent: f64,
    pub p10_percent: f64,
}

/// One benchmark run: the record both frameworks write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchRecord {
    pub schema: String,
    /// "ember" or "pytorch".
    pub framework: String,
    pub framework_version: String,
    pub scenario: String,
    /// How batches reach the model: "device-resident" (ember; PyTorch "preloaded"),
    /// "preloaded-cudnn-benchmark", or "dataloader" (PyTorch's input pipeline).
    pub mode: String,
    pub model: String,
    pub optimizer: String,
    pub backend: String,
    pub device: String,
    pub threads: usize,
    pub batch_size: usize,
    pub dtype: String,
    /// The arithmetic of matmuls and convolutions: "f32", "tf32" (TF32 tensor cores allowed for
    /// both) or "tf32-conv" (PyTorch's CUDA default: convolutions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    pub warmup_steps: usize,
    pub timed_steps: usize,
    pub repeats: usize,
    /// Mean milliseconds per training step, one sample per repeat.
    pub train_step_ms: Stats,
    pub train_images_per_sec: f64,
    pub epoch_seconds: f64,
    /// Whether `epoch_seconds` was timed (true) or estimated from the median step (false).
    pub epoch_measured: bool,
    pub eval: EvalRecord,
    pub memory: MemoryRecord,
    pub gpu_utilization: Option<UtilizationRecord>,
    /// Floating-point operations of one training step per image: 3 x 2 x the forward
    /// multiply-accumulates of the convolutions and linear layers.
    pub train_flops_per_image: f64,
    pub achieved_tflops: f64,
    /// On CPUs: the f32 GEMM GFLOP/s this machine reaches on the same threads, measured in the
    /// same process after the timings (`ember_kernels::cpu::peak`), against which `achieved_tflops` is a fraction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_gemm_peak_gflops: Option<f64>,
    /// The first warm-up step, in milliseconds, device synchronised: on a GPU it includes
    /// compiling and autotuning the step's kernels (absent from the PyTorch side's records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step_ms: Option<f64>,
    /// All of the warm-up (every batch shape timed later, the last partial batch included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_seconds: Option<f64>,
    pub host: String,
    pub timestamp: String,
}

impl BenchRecord {
    /// The one-line summary printed by `ember bench` and used in tables.
    pub fn line(&self) -> String {
        format!(
            "{:<8} {:<7} {:<26} step {:8.2} ms (min {:.2}, max {:.2})  {:7.0} img/s  epoch {:6.1} s{}  eval {:6.0}/{:6.0} img/s  rss {:5.0} MiB{}",
            self.scenario,
            self.framework,
            self.mode,
            self.train_step_ms.median,
            self.train_step_ms.min,
            self.train_step_ms.max,
            self.train_images_per_sec,
            self.epoch_seconds,
            if self.epoch_measured { "" } else { " (est.)" },
            self.eval.untrained_images_per_sec.median,
            self.eval.trained_images_per_sec.median,
            self.memory.peak_rss_bytes as f64 / (1 << 20) as f64,
            self.gpu_utilization
                .as_ref()
                .map(|u| format!("  gpu {:.0}% (p10 {:.0}%)", u.mean_percent, u.p10_percent))
                .unwrap_or_default(),
        ) + &self
            .first_step_ms
            .map(|ms| format!("  first step {ms:.0} ms"))
            .unwrap_or_default()
            + &self
            .cpu_gemm_peak_gflops
            .zip(self.percent_of_peak())
            .map(|(peak, percent)| {
                let gflops = self.achieved_gflops();
                format!("  {gflops:.0} GFLOP/s = {percent:.0}% of GEMM peak {peak:.0}")
            })
            .unwrap_or_default()
    }

    /// Training GFLOP/s.
    pub fn achieved_gflops(&self) -> f64 {
        self.achieved_tflops * 1e3
    }

    /// [`Self::achieved_gflops`] as a percentage of the CPU's measured f32 GEMM peak, where it
    /// was measured.
    pub fn percent_of_peak(&self) -> Option<f64> {
        self.cpu_gemm_peak_gflops
            .map(|peak| 100.0 * self.achieved_gflops() / peak)
    }
}

/// Peak resident set size of this process, from /proc/self/status (0 where unavailable).
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Runs `scenario` on backend `B` with its own model.
pub fn run<B: AutodiffBackend>(
    scenario: Scenario,
    settings: Settings,
    data: Data,
    device: &B::Device,
    info: &DeviceInfo,
    gpu: Option<GpuMonitor>,
) -> BenchRecord {
    let config = scenario.config();
    let kind =
        crate::model::ModelKind::from_name(config.model.name()).expect("scenarios train built-in models");
    run_model::<B, _>(&kind, scenario, settings, data, device, info, gpu)
}

/// Runs `scenario`'s recipe, data and batch size on backend `B` with `model` in place of the
/// scenario's own.
#[allow(clippy::too_many_arguments)]
pub fn run_model<B: AutodiffBackend, D: EmberModel>(
    model: &D,
    scenario: Scenario,
    settings: Settings,
    data: Data,
    device: &B::Device,
    info: &DeviceInfo,
    mut gpu: Option<GpuMonitor>,
) -> BenchRecord
where
    D::Net<B>: Trainable<B>,
{
    let mut config = scenario.config();
    config.model = crate::model::ModelName::new(model.name());
    let family = model;
    let splits = Splits::<B::InnerBackend>::upload(&data, &config, device).expect("valid split");
    // As `ember train`: the host copy is not held through the run.
    drop(data);
    let mut model = train::init::<B, D>(model, &config, device);
    let mut optim = config.optimizer.init::<B, _>();
    let untrained = eval_throughput(&model.valid(), &splits, settings.eval_repeats);

    // The steps `ember train` runs (`EpochSteps`: the same permutation upload, gathers, dropout
    // keys, schedule and on-device loss bookkeeping), through epoch 0's full batches, wrapping
    // around. Warm-up runs every batch shape timed later, the last partial batch included (the
    // full epoch runs it), so that no compilation or autotuning lands in a timed region.
    let batch = config.batch_size;
    let mut steps = train::EpochSteps::<B>::new(&splits.train, &config, 0, 0.0);
    let epoch_steps = steps.steps();
    let schedule = config.schedule(epoch_steps);
    let full_steps = splits.train.len() / batch;
    assert!(full_steps > 0, "the training split is smaller than one batch");
    let mut step = |model: D::Net<B>, optim: &mut crate::optim::Optimizer<_, B>, index: usize| {
        steps.step(model, optim, &schedule, index, index).0
    };
    let warmup_start = Instant::now();
    model = step(model, &mut optim, 0);
    sync::<B>(device);
    let first_step_ms = warmup_start.elapsed().as_secs_f64() * 1e3;
    let mut next = 1usize;
    while next < settings.warmup_steps {
        model = step(model, &mut optim, next % full_steps);
        next += 1;
    }
    if full_steps < epoch_steps {
        model = step(model, &mut optim, full_steps);
    }
    sync::<B>(device);
    let warmup_seconds = warmup_start.elapsed().as_secs_f64();
    if let Some(gpu) = &mut gpu {
        gpu.read_pool();
        gpu.timing(true);
    }
    let mut step_ms = Vec::with_capacity(settings.repeats);
    for _ in 0..settings.repeats {
        let start = Instant::now();
        for _ in 0..settings.timed_steps {
            model = step(model, &mut optim, next % full_steps);
            next += 1;
        }
        sync::<B>(device);
        step_ms.push(start.elapsed().as_secs_f64() * 1e3 / settings.timed_steps as f64);
    }
    let train_step_ms = Stats::of(step_ms);
    let steps_per_epoch = splits.train.len().div_ceil(batch);
    let (epoch_seconds, epoch_measured) = if settings.full_epoch {
        let (trained, end) = train::train_whole_epoch(model, &mut optim, &splits.train, &config, 0);
        model = trained;
        match end {
            train::EpochEnd::Done(stats) => (stats.seconds, true),
            other => panic!("benchmark epoch did not complete: {other:?}"),
        }
    } else {
        (train_step_ms.median * steps_per_epoch as f64 / 1e3, false)
    };
    if let Some(gpu) = &mut gpu {
        gpu.read_pool();
        gpu.timing(false);
    }
    let trained = eval_throughput(&model.valid(), &splits, settings.eval_repeats);
    let gpu_samples = gpu.map(GpuMonitor::stop);
    if let Some(g) = &gpu_samples {
        eprintln!("NVML device matched by {}", g.matched_by);
    }

    let images_per_sec = batch as f64 / (train_step_ms.median / 1e3);
    let flops = 6.0 * family.forward_macs_per_image(config.input).unwrap_or(0) as f64;
    BenchRecord {
        schema: SCHEMA.into(),
        framework: "ember".into(),
        framework_version: format!("{} (burn 0.21.0)", env!("CARGO_PKG_VERSION")),
        scenario: scenario.name().into(),
        mode: "device-resident".into(),
        model: config.model.name().into(),
        optimizer: format!("{:?}", config.optimizer.kind).to_lowercase(),
        backend: info.backend.into(),
        device: info.device.clone(),
        threads: crate::backend::cpu_threads(),
        batch_size: batch,
        dtype: "f32".into(),
        // cubek-matmul 0.2 (`definition/blueprint.rs`) stages f32 operands as TF32 in its
        // tensor-core algorithms whenever the device supports TF32; autotune may pick them for
        // any matmul or convolution.
        precision: Some(if info.cuda.is_some() { "tf32" } else { "f32" }.into()),
        warmup_steps: settings.warmup_steps,
        timed_steps: settings.timed_steps,
        repeats: settings.repeats,
        train_images_per_sec: images_per_sec,
        epoch_seconds,
        epoch_measured,
        eval: EvalRecord {
            batch_size: config.test_batch_size,
            images: splits.test.len(),
            untrained_images_per_sec: untrained,
            trained_images_per_sec: trained,
        },
        memory: MemoryRecord {
            peak_rss_bytes: peak_rss_bytes(),
            device_pool_bytes: gpu_samples.as_ref().and_then(|g| g.pool_bytes),
            device_used_bytes: gpu_samples.as_ref().map(|g| g.used_bytes_peak),
        },
        gpu_utilization: gpu_samples.as_ref().map(|g| UtilizationRecord {
            interval_ms: g.interval_ms,
            samples: g.utilization.len(),
            mean_percent: g.utilization.iter().sum::<f64>() / g.utilization.len().max(1) as f64,
            p10_percent: if g.utilization.is_empty() {
                0.0
            } else {
                Stats::quantile(&g.utilization, 0.1)
            },
        }),
        train_flops_per_image: flops,
        achieved_tflops: flops * images_per_sec / 1e12,
        cpu_gemm_peak_gflops: info
            .cuda
            .is_none()
            .then(ember_kernels::cpu::peak::gemm_peak_gflops),
        train_step_ms,
        first_step_ms: Some(first_step_ms),
        warmup_seconds: Some(warmup_seconds),
        host: host_name(),
        timestamp: crate::files::utc_stamp(std::time::SystemTime::now()),
    }
}

fn sync<B: Backend>(device: &B::Device) {
    B::sync(device).expect("device sync");
}

/// Images/s over the test set: one untimed pass, then `repeats` timed ones.
fn eval_throughput<B: Backend, M: Classifier<B>>(model: &M, splits: &Splits<B>, repeats: usize) -> Stats {
    let batch = 1000;
    train::evaluate(model, &splits.test, batch);
    let samples = (0..repeats.max(1))
        .map(|_| {
            // evaluate() reads the loss and count back: the device is synchronised.
            train::evaluate(model, &splits.test, batch).images_per_sec()
        })
        .collect();
    Stats::of(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelKind;

    #[test]
    fn stats_are_order_statistics() {
        let s = Stats::of(vec![5.0, 1.0, 3.0, 4.0]);
        assert_eq!((s.median, s.min, s.max), (3.5, 1.0, 5.0));
        assert_eq!(s.samples, vec![5.0, 1.0, 3.0, 4.0]);
        assert_eq!(Stats::of(vec![2.0, 9.0, 4.0]).median, 4.0);
        let xs: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(Stats::quantile(&xs, 0.1), 2.0);
    }

    #[test]
    fn scenarios_use_their_recipes() {
        let c = Scenario::Net256.config();
        assert_eq!(
            (c.model, c.batch_size, c.valid_size),
            (
                crate::model::ModelName::from(ModelKind::PytorchExampleNet),
                256,
                0
            )
        );
        assert_eq!(Scenario::Flash64.config().model, ModelKind::FlashlightCnn);
        assert_eq!(
            Scenario::Tch256.config().optimizer.kind,
            crate::optim::OptimizerKind::Adam
        );
    }

    /// benches/schema.json lists the scenarios and their models: the same as this enum.
    #[test]
    fn the_schema_lists_every_scenario_and_model() {
        let schema: serde_json::Value = serde_json::from_str(include_str!("../benches/schema.json")).unwrap();
        let listed = |key: &str| -> Vec<String> {
            schema["properties"][key]["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        let names: Vec<String> = Scenario::value_variants()
            .iter()
            .map(|s| s.name().to_string())
            .collect();
        assert_eq!(listed("scenario"), names);
        for s in Scenario::value_variants() {
            let model = s.config().model.name().to_string();
            assert!(
                listed("model").contains(&model),
                "{model} of {} not in the schema",
                s.name()
            );
            // clap's and serde's spellings are the name.
            assert_eq!(s.to_possible_value().unwrap().get_name(), s.name());
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
        }
    }

    /// ResNet-18's scenario: CIFAR's shape from MNIST's digits, centred in three channels.
    #[test]
    fn colour_canvas_centres_the_digit_in_each_channel() {
        let split = crate::data::Split {
            images: (1..=4).collect(),
            labels: vec![7],
            shape: crate::data::ImageShape {
                channels: 1,
                height: 2,
                width: 2,
            },
        };
        let c = colour_canvas(&split, 4);
        assert_eq!(
            c.shape,
            crate::data::ImageShape {
                channels: 3,
                height: 4,
                width: 4
            }
        );
        let plane = [0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0];
        assert_eq!(c.images, [plane, plane, plane].concat());
        assert_eq!(c.labels, [7]);
    }

    /// A scenario keeps only the images its config uses (the rest held through the run
    /// counted in ResNet-18's peak RSS: 60,000 canvases, 184 MB, of which 10,000 are used).
    #[test]
    fn scenario_images_keep_only_the_limits() {
        let split = |n: usize| crate::data::Split {
            images: (0..n * 4).map(|v| v as u8).collect(),
            labels: (0..n).map(|v| v as u16).collect(),
            shape: crate::data::ImageShape {
                channels: 1,
                height: 2,
                width: 2,
            },
        };
        let data = || Data {
            train: split(10_005),
            test: split(1_002),
            classes: (0..10).map(|c| c.to_string()).collect(),
            report: Default::default(),
        };
        let r18 = Scenario::Resnet18_128.images(data());
        assert_eq!((r18.train.len(), r18.test.len()), (10_000, 1_000));
        assert_eq!(r18.train.shape.len(), 3 * 32 * 32);
        assert_eq!(r18.train.labels[9_999], 9_999);
        let net = Scenario::Net64.images(data());
        assert_eq!((net.train, net.test), (data().train, data().test));
    }

    #[test]
    fn peak_rss_is_read() {
        assert!(peak_rss_bytes() > 1 << 20);
    }
}
