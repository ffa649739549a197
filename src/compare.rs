//! `ember compare`: runs `ember bench` and `benches/pytorch/bench.py` side by side, one process
//! per measurement (so each peak RSS is its own), and writes the comparison: `results.json`
//! (every record), `results.md` (set-up, table, and what failed), `train_step.png`, `eval.png`.
//!
//! A GPU is lent for minutes, so a run must yield whatever it can: the folder is rewritten after
//! every measurement, a measurement that fails or outlives `timeout` is listed and the next one
//! runs, none starts after the `deadline`, and PyTorch can be left out (`without_pytorch`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::backend::{self, DeviceArg, Resolved};
use crate::bench::{BenchRecord, Overrides, Scenario, Settings};
use crate::plot::{bar_chart, BarSeries};

/// What to compare and where.
pub struct CompareOptions {
    pub device: DeviceArg,
    pub scenarios: Vec<Scenario>,
    /// The measurement flags given; each scenario's defaults fill the rest.
    pub settings: Overrides,
    pub python: String,
    pub script: PathBuf,
    pub data_dir: PathBuf,
    /// Results folder; default `benches/results/<date>-<host>-<device>`.
    pub out: Option<PathBuf>,
    /// Measure ember only.
    pub without_pytorch: bool,
    /// The longest one measurement may run before it is killed.
    pub timeout: Option<Duration>,
    /// No measurement starts after this long, and none runs past it.
    pub deadline: Option<Duration>,
}

/// PyTorch modes measured on a device kind.
fn pytorch_modes(gpu: bool) -> &'static [&'static str] {
    if gpu {
        // preloaded-tf32: PyTorch at ember's precision on CUDA (TF32 matmuls and convolutions).
        &[
            "preloaded",
            "preloaded-tf32",
            "preloaded-cudnn-benchmark",
            "dataloader",
        ]
    } else {
        &["preloaded", "dataloader"]
    }
}

/// Runs one measurement, killed after `limit`, and reads the record it wrote to `json`.
fn run_child(cmd: &mut Command, json: &Path, limit: Option<Duration>) -> Result<BenchRecord> {
    let shown = format!("{cmd:?}");
    let child = cmd.spawn().with_context(|| format!("cannot start {shown}"))?;
    let status = wait_at_most(child, limit).with_context(|| shown.clone())?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    let text =
        std::fs::read_to_string(json).with_context(|| format!("{shown} wrote no {}", json.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not an ember-bench/1 record", json.display()))
}

/// Waits for `child`, killing it once `limit` has passed.
fn wait_at_most(mut child: Child, limit: Option<Duration>) -> Result<ExitStatus> {
    let Some(limit) = limit else {
        return Ok(child.wait()?);
    };
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "killed after {:.0} s (--timeout or --deadline)",
                limit.as_secs_f64()
            );
        }
        // A measurement lasts seconds to minutes: polling 10 times a second costs nothing.
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One measurement to run: its label in results.md, its command, and where it writes its record.
struct Measurement {
    label: String,
    cmd: Command,
    json: PathBuf,
}

/// Runs every measurement, rewriting the results folder after each, and returns its path. An
/// error after the folder is written when any measurement failed, was killed or never started.
pub fn run(opts: &CompareOptions) -> Result<PathBuf> {
    let started = Instant::now();
    let resolved = backend::resolve(opts.device)?;
    let (device_arg, device_slug, gpu) = match &resolved {
        Resolved::Cpu => ("cpu".to_string(), "cpu".to_string(), false),
        Resolved::Cuda { index, name } => (
            format!("cuda:{index}"),
            name.to_lowercase()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
            true,
        ),
    };
    let out = match &opts.out {
        Some(dir) => dir.clone(),
        None => {
            let date = crate::files::utc_stamp(std::time::SystemTime::now());
            let day = format!("{}-{}-{}", &date[..4], &date[4..6], &date[6..8]);
            PathBuf::from("benches/results")
                .join(format!("{day}-{}-{device_slug}", crate::bench::host_name()))
        }
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let threads = backend::cpu_threads();
    let exe = std::env::current_exe().context("cannot find the ember executable")?;
    let tmp = tempfile_dir()?;
    let mut measurements = Vec::new();
    for &scenario in &opts.scenarios {
        let settings = opts.settings.settings(scenario);
        let json = tmp.join(format!("ember-{}.json", scenario.name()));
        let mut cmd = Command::new(&exe);
        cmd.args(["bench", "--scenario", scenario.name(), "--device", &device_arg])
            .args(measure_args(&settings))
            .arg("--data-dir")
            .arg(&opts.data_dir)
            .arg("--offline")
            .arg("--json")
            .arg(&json);
        measurements.push(Measurement {
            label: format!("{} ember", scenario.name()),
            cmd,
            json,
        });
        let modes = if opts.without_pytorch {
            &[][..]
        } else if scenario.modern() {
            // The twin of a recipe's input pipeline is ember's: the data on the device.
            &pytorch_modes(gpu)[..1]
        } else {
            pytorch_modes(gpu)
        };
        // The modern scenarios' PyTorch side reads the recipe from ember's own config.
        let config = tmp.join(format!("config-{}.json", scenario.name()));
        if scenario.modern() {
            std::fs::write(&config, serde_json::to_string_pretty(&scenario.config())?)
                .with_context(|| format!("cannot write {}", config.display()))?;
        }
        for mode in modes {
            let json = tmp.join(format!("pytorch-{}-{mode}.json", scenario.name()));
            let mut cmd = Command::new(&opts.python);
            cmd.arg(&opts.script)
                .args([
                    "--scenario",
                    scenario.name(),
                    "--mode",
                    mode,
                    "--device",
                    &device_arg,
                ])
                .args(["--threads", &threads.to_string()])
                .args(measure_args(&settings))
                .arg("--data-dir")
                .arg(&opts.data_dir)
                .arg("--json")
                .arg(&json);
            if scenario.modern() {
                cmd.arg("--config").arg(&config);
            }
            measurements.push(Measurement {
                label: format!("{} pytorch {mode}", scenario.name()),
                cmd,
                json,
            });
        }
    }
    let mut records = Vec::new();
    let mut failures = Vec::new();
    for mut m in measurements {
        let left = opts.deadline.map(|d| d.saturating_sub(started.elapsed()));
        if left == Some(Duration::ZERO) {
            failures.push(format!("{}: not started, past the --deadline", m.label));
            continue;
        }
        let limit = match (opts.timeout, left) {
            (Some(t), Some(l)) => Some(t.min(l)),
            (t, l) => t.or(l),
        };
        match run_child(&mut m.cmd, &m.json, limit) {
            Ok(record) => records.push(record),
            Err(e) => {
                eprintln!("compare: {}: {e:#}", m.label);
                failures.push(format!("{}: {e:#}", m.label));
            }
        }
        write_results(&out, &records, &failures, opts, &resolved)?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if opts.without_pytorch {
        println!("PyTorch left out (--without-pytorch): ember's records only");
    }
    println!("\n{}", table(&records));
    println!("results: {}", out.display());
    if !failures.is_empty() {
        bail!(
            "{} measurement(s) failed or did not run (the others are in {}): {}",
            failures.len(),
            out.display(),
            failures.join("; ")
        );
    }
    Ok(out)
}

/// `results.json`, `results.md` and the charts, from the records so far.
fn write_results(
    out: &Path,
    records: &[BenchRecord],
    failures: &[String],
    opts: &CompareOptions,
    resolved: &Resolved,
) -> Result<()> {
    let json = out.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(records)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    let mut md = format!("{}\n{}", setup_note(records, opts, resolved), table(records));
    if opts.without_pytorch {
        md += "\nPyTorch was left out (`--without-pytorch`): the table has ember's figures only.\n";
    }
    if !failures.is_empty() {
        md += "\n## Measurements that failed or did not run\n\n";
        for f in failures {
            md += &format!("- {f}\n");
        }
    }
    std::fs::write(out.join("results.md"), md)?;
    if !records.is_empty() {
        charts(out, records)?;
    }
    Ok(())
}

/// The measurement flags, spelled the same by `ember bench` and bench.py.
fn measure_args(s: &Settings) -> Vec<String> {
    let mut v: Vec<String> = [
        ("--warmup", s.warmup_steps),
        ("--steps", s.timed_steps),
        ("--repeats", s.repeats),
        ("--eval-repeats", s.eval_repeats),
    ]
    .iter()
    .flat_map(|(flag, n)| [flag.to_string(), n.to_string()])
    .collect();
    if s.full_epoch {
        v.push("--full-epoch".into());
    }
    v
}

fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ember-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

fn find<'a>(
    records: &'a [BenchRecord],
    scenario: &str,
    framework: &str,
    mode: &str,
) -> Option<&'a BenchRecord> {
    records
        .iter()
        .find(|r| r.scenario == scenario && r.framework == framework && r.mode == mode)
}

fn scenarios(records: &[BenchRecord]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in records {
        if !v.contains(&r.scenario) {
            v.push(r.scenario.clone());
        }
    }
    v
}

/// `ember / pytorch`, with the ratio of the fastest and of the slowest repeats.
fn ratio(e: &BenchRecord, p: &BenchRecord) -> String {
    format!(
        "{:.2} ({:.2}–{:.2})",
        e.train_step_ms.median / p.train_step_ms.median,
        e.train_step_ms.min / p.train_step_ms.min,
        e.train_step_ms.max / p.train_step_ms.max
    )
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The markdown comparison table: ratios are ember / PyTorch (below 1: ember is faster or
/// smaller), for step time, eval throughput (above 1: ember is faster), memory and utilisation.
pub fn table(records: &[BenchRecord]) -> String {
    let gpu = records
        .iter()
        .any(|r| r.gpu_utilization.is_some() || r.memory.device_used_bytes.is_some());
    let mut s = String::from(
        "Step times are medians over repeats, ms (min–max). Ratios are ember / PyTorch: below 1 \
         ember's step is shorter; for eval images/s above 1 ember is faster.\n\n\
         | scenario | ember step ms | PyTorch preloaded ms | ratio (min–max) | PyTorch dataloader ms | ratio (min–max) | eval img/s ember / PyTorch (untrained) | eval img/s ember / PyTorch (trained) | peak RSS MiB ember / PyTorch | ember GFLOP/s (% of GEMM peak) |",
    );
    if gpu {
        s += " PyTorch preloaded TF32 ms | ratio (min–max) | GPU util % ember / PyTorch (p10) | peak GPU memory MiB (NVML) ember / PyTorch |";
    }
    s += "\n|---|---|---|---|---|---|---|---|---|---|";
    if gpu {
        s += "---|---|---|---|";
    }
    s += "\n";
    for sc in scenarios(records) {
        let Some(e) = find(records, &sc, "ember", "device-resident") else {
            continue;
        };
        let ms = |r: &BenchRecord| {
            format!(
                "{:.2} ({:.2}–{:.2})",
                r.train_step_ms.median, r.train_step_ms.min, r.train_step_ms.max
            )
        };
        let cell = |mode: &str| match find(records, &sc, "pytorch", mode) {
            Some(p) => (ms(p), ratio(e, p)),
            None => ("–".into(), "–".into()),
        };
        let (pre, pre_r) = cell("preloaded");
        let (dl, dl_r) = cell("dataloader");
        let p = find(records, &sc, "pytorch", "preloaded");
        let eval = |f: fn(&BenchRecord) -> f64| match p {
            Some(p) => format!("{:.0} / {:.0} = {:.2}", f(e), f(p), f(e) / f(p)),
            None => format!("{:.0} / –", f(e)),
        };
        let rss = match p {
            Some(p) => format!(
                "{:.0} / {:.0} = {:.2}",
                mib(e.memory.peak_rss_bytes),
                mib(p.memory.peak_rss_bytes),
                e.memory.peak_rss_bytes as f64 / p.memory.peak_rss_bytes as f64
            ),
            None => format!("{:.0}", mib(e.memory.peak_rss_bytes)),
        };
        // Training FLOP/s, as a fraction of the CPU's measured f32 GEMM peak where measured.
        let gflops = e.achieved_gflops();
        let flops = match e.percent_of_peak() {
            Some(percent) => format!("{gflops:.0} ({percent:.0}%)"),
            None => format!("{gflops:.0}"),
        };
        s += &format!(
            "| {sc} (batch {}) | {} | {pre} | {pre_r} | {dl} | {dl_r} | {} | {} | {rss} | {flops} |",
            e.batch_size,
            ms(e),
            eval(|r| r.eval.untrained_images_per_sec.median),
            eval(|r| r.eval.trained_images_per_sec.median),
        );
        if gpu {
            let util = |r: Option<&BenchRecord>| {
                r.and_then(|r| r.gpu_utilization.as_ref())
                    .map_or("–".to_string(), |u| {
                        format!("{:.0} ({:.0})", u.mean_percent, u.p10_percent)
                    })
            };
            let mem = |r: Option<&BenchRecord>| {
                r.and_then(|r| r.memory.device_used_bytes)
                    .map_or("–".to_string(), |b| format!("{:.0}", mib(b)))
            };
            let (tf32, tf32_r) = cell("preloaded-tf32");
            s += &format!(
                " {tf32} | {tf32_r} | {} / {} | {} / {} |",
                util(Some(e)),
                util(p),
                mem(Some(e)),
                mem(p)
            );
        }
        s += "\n";
    }
    s
}

fn setup_note(records: &[BenchRecord], opts: &CompareOptions, device: &Resolved) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let version = |fw: &str| {
        records
            .iter()
            .find(|r| r.framework == fw)
            .map_or("–".to_string(), |r| r.framework_version.clone())
    };
    // One line per distinct setting, naming its scenarios when they differ.
    let mut groups: Vec<(Settings, Vec<&str>)> = Vec::new();
    for &sc in &opts.scenarios {
        let set = opts.settings.settings(sc);
        match groups.iter_mut().find(|(s, _)| *s == set) {
            Some((_, names)) => names.push(sc.name()),
            None => groups.push((set, vec![sc.name()])),
        }
    }
    let per_measurement: String = groups
        .iter()
        .map(|(s, names)| {
            let which = if groups.len() > 1 {
                format!(" ({})", names.join(", "))
            } else {
                String::new()
            };
            format!(
                "- per measurement{which}: {} warm-up steps, {} repeats of {} timed steps (device synchronised at the end of each), eval: 1 untimed + {} timed passes over the test images in batches of 1,000\n",
                s.warmup_steps, s.repeats, s.timed_steps, s.eval_repeats
            )
        })
        .collect();
    let full_epoch = opts.settings.full_epoch;
    format!(
        "# ember vs PyTorch, {}\n\n\
         - host: {} ({cpu}), {} compute threads on both sides\n\
         - device: {}\n\
         - ember {}, PyTorch {}\n\
         {per_measurement}\
         - epoch time: {}\n\
         - command: `{}`\n",
        records.first().map_or("", |r| r.timestamp.as_str()),
        records.first().map_or("", |r| r.host.as_str()),
        records.first().map_or(0, |r| r.threads),
        match device {
            Resolved::Cpu => "cpu".to_string(),
            Resolved::Cuda { index, name } => format!("cuda:{index} {name}"),
        },
        version("ember"),
        version("pytorch"),
        if full_epoch {
            "one full epoch timed"
        } else {
            "estimated as median step x steps per epoch"
        },
        std::env::args().collect::<Vec<_>>().join(" "),
    )
}

fn charts(out: &Path, records: &[BenchRecord]) -> Result<()> {
    let groups = scenarios(records);
    let mut kinds: Vec<(String, String)> = Vec::new();
    for r in records {
        let k = (r.framework.clone(), r.mode.clone());
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let series = |f: fn(&BenchRecord) -> f64| -> Vec<BarSeries> {
        kinds
            .iter()
            .map(|(fw, mode)| BarSeries {
                name: format!("{fw} {mode}"),
                values: groups.iter().map(|g| find(records, g, fw, mode).map(f)).collect(),
            })
            .collect()
    };
    bar_chart(
        &out.join("train_step.png"),
        "Training step time (median, lower is better)",
        "ms per step",
        &groups,
        &series(|r| r.train_step_ms.median),
    )?;
    bar_chart(
        &out.join("eval.png"),
        "Evaluation throughput, trained weights (higher is better)",
        "images/s",
        &groups,
        &series(|r| r.eval.trained_images_per_sec.median),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_past_its_limit_is_killed() {
        let start = Instant::now();
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        let err = wait_at_most(child, Some(Duration::from_millis(300))).unwrap_err();
        assert!(err.to_string().starts_with("killed after 0 s"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(30));
        let quick = Command::new("true").spawn().unwrap();
        assert!(wait_at_most(quick, Some(Duration::from_secs(60)))
            .unwrap()
            .success());
    }
}
