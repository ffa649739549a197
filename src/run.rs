//! A training run as a user drives it: progress, per-epoch lines, `metrics.csv` and
//! `curves.png`, checkpoints after every epoch (and on Ctrl-C), resume, and a clean stop on a
//! non-finite loss.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};

use crate::checkpoint::{optimizer_bytes, CheckpointError, RunDir, STATE_FILE};
use crate::config::TrainConfig;
use crate::data::DeviceSplit;
use crate::metrics::{self, MetricsError, MetricsRow, CURVES_FILE};
use crate::model::{EmberModel, Trainable};
use crate::optim::Optimizer;
use crate::progress::Progress;
use crate::train::{self, EpochControl, EpochEnd, EpochStats, EvalStats, Splits, StepInfo};

/// Set by the Ctrl-C handler; the training loop stops after the current step.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler: the first press finishes the step and checkpoints, a second
/// quits at once.
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!(
            "\ninterrupt: stopping (in training: after this step, with a checkpoint); Ctrl-C again quits at once"
        );
    });
}

/// Whether a checkpoint's counters agree with each other for epochs of `steps` steps: the
/// global step is the epochs' and the step's sum (a wrapped or edited value would misplace
/// the schedule and the dropout masks), and the partial sums are finite.
fn check_counters(p: &Progress, steps: usize) -> Result<(), String> {
    let expected = p
        .epoch
        .checked_mul(steps)
        .and_then(|s| s.checked_add(p.step_in_epoch));
    if expected != Some(p.global_step) {
        return Err(format!(
            "global_step {} is not epoch {} x {steps} steps + step_in_epoch {} (or the training set changed size since)",
            p.global_step, p.epoch, p.step_in_epoch
        ));
    }
    for (field, value) in [
        ("partial_loss_sum", p.partial_loss_sum),
        ("partial_seconds", p.partial_seconds),
    ] {
        if !value.is_finite() || value < 0.0 || value > 1e30 {
            return Err(format!("{field} is {value}, not a finite sum of a partial epoch"));
        }
    }
    Ok(())
}

/// Why a run stopped early.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "training loss is not finite (NaN or infinite) at epoch {epoch}, step {step} of {steps} (lr {}); \
         stopped without saving it. The last good checkpoint ({saved}) in {dir} is intact; try a lower --lr",
        num(*.lr, 6)
    )]
    NonFinite {
        epoch: usize,
        step: usize,
        steps: usize,
        lr: f64,
        saved: String,
        dir: String,
    },
    #[error("interrupted in epoch {epoch} after step {step}; {saved}")]
    Interrupted {
        epoch: usize,
        step: usize,
        saved: String,
    },
    #[error("{0} is complete ({1} of {1} epochs); pass --epochs N with --resume to train further")]
    Complete(String, usize),
    #[error("{dir}/state.json: step_in_epoch {step} is not inside an epoch of {steps} steps; the checkpoint state is corrupt")]
    PastEpoch { dir: String, step: usize, steps: usize },
    #[error("{dir}/state.json: {reason}; the checkpoint state is corrupt")]
    BadState { dir: String, reason: String },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
}

/// How much a run prints.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// Print only the final result.
    pub quiet: bool,
    /// With a terminal: check the loss (and show it) every N steps; without one, also print a
    /// line every N steps. 0: the defaults (10 on a terminal, epoch ends otherwise).
    pub log_interval: usize,
    /// Draw progress bars (stderr is a terminal and not quiet).
    pub bars: bool,
}

impl Output {
    pub fn new(quiet: bool, log_interval: usize) -> Self {
        Self {
            quiet,
            log_interval,
            bars: !quiet && std::io::stderr().is_terminal(),
        }
    }

    /// Steps between loss checks (each a device sync) in epochs of `steps` steps: a progress
    /// bar shows the loss every 10 steps, and at least once in a shorter epoch.
    fn check_every(&self, steps: usize) -> usize {
        match (self.log_interval, self.bars) {
            (0, true) => 10.min(steps.div_ceil(2)).max(1),
            (0, false) => 100,
            (n, _) => n,
        }
    }
}

/// Where training starts from.
pub struct Start<B: AutodiffBackend, M: Trainable<B>> {
    pub model: M,
    pub optim: Optimizer<M, B>,
    pub progress: Progress,
    pub rows: Vec<MetricsRow>,
}

impl<B: AutodiffBackend, M: Trainable<B>> Start<B, M> {
    /// A new `model` for `config`, checkpointed as epoch 0 so that even the first epoch can be
    /// resumed.
    pub fn fresh<D: EmberModel<Net<B> = M>>(model: &D, config: &TrainConfig, device: &B::Device) -> Self {
        Self {
            model: train::init::<B, D>(model, config, device),
            optim: config.optimizer.init::<B, _>(),
            progress: Progress::default(),
            rows: Vec::new(),
        }
    }

    /// The run's latest checkpoint and metrics; the run's start when it was stopped before its
    /// first checkpoint (config.json written, no state.json yet): the config holds the seed,
    /// so that is the same run.
    pub fn resume<D: EmberModel<Net<B> = M>>(
        model: &D,
        run: &RunDir,
        config: &TrainConfig,
        device: &B::Device,
    ) -> Result<Self, RunError> {
        if !run.file(STATE_FILE).exists() {
            return Ok(Self::fresh(model, config, device));
        }
        let (model, optim, progress) = run.load_training_of::<B, D>(model, config, device)?;
        let mut rows = metrics::read_if_present(&run.path)?;
        rows.retain(|r| r.epoch <= progress.epoch);
        Ok(Self {
            model,
            optim,
            progress,
            rows,
        })
    }
}

/// `x` with `decimals` decimals, or in scientific notation when that would be unreadable.
pub fn num(x: f64, decimals: usize) -> String {
    if x != 0.0 && (x.abs() >= 1e5 || x.abs() < 1e-4) {
        format!("{x:.3e}")
    } else {
        format!("{x:.decimals$}")
    }
}

/// Writes checkpoints into the run directory, unless `--save-model=false`.
struct Checkpoints<'a> {
    run: &'a RunDir,
    enabled: bool,
}

impl Checkpoints<'_> {
    fn save<B: AutodiffBackend, M: Trainable<B>>(
        &self,
        model: &M,
        optim: &Optimizer<M, B>,
        progress: &Progress,
    ) -> Result<(), RunError> {
        if self.enabled {
            self.run
                .save_checkpoint(model, Some(optimizer_bytes(optim)), progress)?;
        }
        Ok(())
    }
}

/// Trains from `start` to `config.epochs`; returns the trained model and its final test
/// evaluation.
pub fn train<B: AutodiffBackend, M: Trainable<B>>(
    config: &TrainConfig,
    splits: &Splits<B::InnerBackend>,
    run: &RunDir,
    start: Start<B, M>,
    save_model: bool,
    out: Output,
) -> Result<(M, EvalStats), RunError> {
    let Start {
        mut model,
        mut optim,
        mut progress,
        mut rows,
    } = start;
    if progress.epoch >= config.epochs {
        return Err(RunError::Complete(run.path.display().to_string(), progress.epoch));
    }
    let steps = splits.train.len().div_ceil(config.batch_size);
    if progress.step_in_epoch >= steps {
        return Err(RunError::PastEpoch {
            dir: run.path.display().to_string(),
            step: progress.step_in_epoch,
            steps,
        });
    }
    check_counters(&progress, steps).map_err(|reason| RunError::BadState {
        dir: run.path.display().to_string(),
        reason,
    })?;
    let checkpoints = Checkpoints {
        run,
        enabled: save_model,
    };
    if progress.is_start() {
        checkpoints.save(&model, &optim, &progress)?;
    }
    let schedule = config.schedule(steps);
    let mut last = None;
    while progress.epoch < config.epochs {
        // The rate at the epoch's first step, for the metrics row and the epoch line.
        let lr = schedule.at(progress.epoch, progress.epoch_start_step()).lr;
        let mut reporter = StepReporter::new(config, splits.train.len(), &progress, out);
        let control = EpochControl {
            from: &progress,
            check_every: out.check_every(steps),
            on_step: &mut |s| reporter.step(s),
            stop: &|| INTERRUPTED.load(Ordering::SeqCst),
        };
        let (trained, end) = train::train_epoch(model, &mut optim, &splits.train, config, &schedule, control);
        model = trained;
        reporter.finish();
        let stats = match end {
            EpochEnd::Done(stats) => stats,
            EpochEnd::NonFinite { step, steps } => {
                let lr = schedule.at(progress.epoch, progress.global_step_at(step - 1)).lr;
                return Err(non_finite(run, save_model, &progress, lr, step, steps));
            }
            EpochEnd::Stopped {
                steps_done,
                loss_sum,
                seconds,
            } => {
                progress.stop_inside(steps_done, loss_sum, seconds);
                checkpoints.save(&model, &optim, &progress)?;
                return Err(interrupted(run, save_model, &progress));
            }
        };
        progress.finish_epoch(stats.steps);
        let (row, test) = finish_epoch(&model, splits, config, &progress, lr, &stats);
        rows.push(row);
        write_metrics(run, config, &rows)?;
        checkpoints.save(&model, &optim, &progress)?;
        if !out.quiet {
            // The rate over the epoch's steps: one-cycle moves it within an epoch.
            let first = progress.global_step.saturating_sub(steps);
            let rates = (first..progress.global_step).map(|g| schedule.at(progress.epoch - 1, g).lr);
            let range = rates.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), lr| {
                (lo.min(lr), hi.max(lr))
            });
            println!("{}", epoch_line(config, &rows[rows.len() - 1], range, &test));
        }
        let reached = config.target_accuracy.filter(|&t| 100.0 * test.accuracy() >= t);
        last = Some(test);
        if let Some(target) = reached {
            println!(
                "target {target}% reached after epoch {}: {} at {:.2} s since the process started",
                progress.epoch,
                test.accuracy_text(),
                since_process_start()
            );
            break;
        }
    }
    let test = last.expect("at least one epoch ran");
    let saved = if save_model {
        format!("  checkpoint in {}", run.path.display())
    } else {
        String::new()
    };
    println!(
        "final: test loss {}  accuracy {}{saved}",
        num(test.loss, 4),
        test.accuracy_text()
    );
    Ok((model, test))
}

static PROCESS_START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Marks the start of the process for [`since_process_start`]: `main` calls it first.
pub fn mark_process_start() {
    PROCESS_START.get_or_init(std::time::Instant::now);
}

/// Seconds since [`mark_process_start`] (since the first call, where nothing marked it): a
/// time-to-accuracy includes loading the data and starting the device, as a user waits for them.
pub fn since_process_start() -> f64 {
    PROCESS_START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// The error that reports a non-finite loss at `step` of `steps`; nothing was saved after
/// `progress`.
fn non_finite(
    run: &RunDir,
    saved: bool,
    progress: &Progress,
    lr: f64,
    step: usize,
    steps: usize,
) -> RunError {
    RunError::NonFinite {
        epoch: progress.epoch + 1,
        step,
        steps,
        lr,
        saved: if saved {
            progress.describe()
        } else {
            "none: --save-model=false".into()
        },
        dir: run.path.display().to_string(),
    }
}

/// The error that reports a stop inside an epoch, after its checkpoint was written.
fn interrupted(run: &RunDir, saved: bool, progress: &Progress) -> RunError {
    RunError::Interrupted {
        epoch: progress.epoch + 1,
        step: progress.step_in_epoch,
        saved: if saved {
            format!(
                "checkpoint written to {}; continue with: ember train --resume {}",
                run.path.display(),
                run.path.display()
            )
        } else {
            "no checkpoint written (--save-model=false)".into()
        },
    }
}

/// Evaluates the model after an epoch; returns its metrics row and the test evaluation.
fn finish_epoch<B: AutodiffBackend, M: Trainable<B>>(
    model: &M,
    splits: &Splits<B::InnerBackend>,
    config: &TrainConfig,
    progress: &Progress,
    lr: f64,
    stats: &EpochStats,
) -> (MetricsRow, EvalStats) {
    let valid = splits
        .valid
        .as_ref()
        .map(|v| train::evaluate_trained(model, v, config.test_batch_size));
    let test = train::evaluate_trained(model, &splits.test, config.test_batch_size);
    let row = MetricsRow {
        epoch: progress.epoch,
        step: progress.global_step,
        lr,
        train_loss: stats.loss,
        valid_loss: valid.map(|v| v.loss),
        valid_accuracy: valid.map(|v| v.accuracy()),
        test_loss: test.loss,
        test_accuracy: test.accuracy(),
        seconds: stats.seconds,
        images_per_sec: stats.images_per_sec(),
    };
    (row, test)
}

/// `metrics.csv` and `curves.png` of the run so far.
fn write_metrics(run: &RunDir, config: &TrainConfig, rows: &[MetricsRow]) -> Result<(), RunError> {
    metrics::write(&run.path, rows)?;
    let name = run
        .path
        .file_name()
        .map_or("run".into(), |n| n.to_string_lossy().to_string());
    let label = metrics::loss_label(&[config.label_smoothing]);
    metrics::draw_curves(&run.path.join(CURVES_FILE), &[(name, rows.to_vec())], &label)?;
    Ok(())
}

/// The line printed after each epoch.
/// `lr` is the lowest and highest rate of the epoch's steps, shown as one value when they agree
/// and as `lr LOW..HIGH` (its range over the epoch) when the schedule moved it.
fn epoch_line(config: &TrainConfig, row: &MetricsRow, (low, high): (f64, f64), test: &EvalStats) -> String {
    let lr = if !(low < high) || num(low, 6) == num(high, 6) {
        num(row.lr, 6)
    } else {
        format!("{}..{}", num(low, 6), num(high, 6))
    };
    let mut line = format!(
        "epoch {:>3}/{}  lr {lr}  train loss {}",
        row.epoch,
        config.epochs,
        num(row.train_loss, 4)
    );
    if let (Some(loss), Some(accuracy)) = (row.valid_loss, row.valid_accuracy) {
        line += &format!("  valid loss {} accuracy {:.2}%", num(loss, 4), 100.0 * accuracy);
    }
    line += &format!(
        "  test loss {}  accuracy {}  train {:.1} s  {:.0} img/s  eval {:.1} s",
        num(test.loss, 4),
        test.accuracy_text(),
        row.seconds,
        row.images_per_sec,
        test.seconds
    );
    line
}

/// Shows an epoch's steps: a progress bar on a terminal, else a line every `--log-interval`
/// steps (none by default).
struct StepReporter {
    bar: Option<ProgressBar>,
    out: Output,
    /// When the first step of this process's part of the epoch ended, and the images seen then.
    first: Option<(std::time::Instant, usize)>,
    /// The last loss read, shown until the next.
    loss: Option<f64>,
}

impl StepReporter {
    fn new(config: &TrainConfig, train_len: usize, progress: &Progress, out: Output) -> Self {
        let steps = train_len.div_ceil(config.batch_size);
        let bar = out.bars.then(|| {
            let bar = ProgressBar::new(steps as u64).with_style(
                // The bar takes the width the text leaves: one line on any terminal width.
                ProgressStyle::with_template("epoch {prefix} [{wide_bar}] {pos}/{len} steps {msg}eta {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(format!("{}/{}", progress.epoch + 1, config.epochs));
            bar.set_position(progress.step_in_epoch as u64);
            bar
        });
        Self {
            bar,
            out,
            first: None,
            loss: None,
        }
    }

    fn step(&mut self, s: StepInfo) {
        if let Some(bar) = &self.bar {
            bar.set_position(s.step as u64);
            self.loss = s.loss.or(self.loss);
            // Images per second over the steps after the first (which may include warm-up).
            let (t0, seen0) = *self.first.get_or_insert((std::time::Instant::now(), s.seen));
            let elapsed = t0.elapsed().as_secs_f64();
            let mut msg = String::new();
            if let Some(loss) = self.loss {
                msg += &format!("| loss {} ", num(loss, 4));
            }
            if s.seen > seen0 && elapsed > 0.0 {
                msg += &format!("| {:.0} images/s ", (s.seen - seen0) as f64 / elapsed);
            }
            bar.set_message(msg);
        } else if let (Some(loss), false, true) = (s.loss, self.out.quiet, self.out.log_interval > 0) {
            println!(
                "train epoch {} [{}/{} ({:.0}%)] loss {}",
                s.epoch + 1,
                s.seen,
                s.total,
                100.0 * s.seen as f64 / s.total as f64,
                num(loss, 6)
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Header printed before training.
pub fn header<B: AutodiffBackend, M: Trainable<B>>(
    config: &TrainConfig,
    model: &M,
    splits: &Splits<B::InnerBackend>,
    info: &str,
    run: &RunDir,
) -> String {
    let mut dataset = crate::files::printable(&config.dataset.to_string());
    if config.input != crate::data::ImageShape::MNIST || config.num_classes() != crate::data::NUM_CLASSES {
        dataset += &format!(" ({} images, {} classes)", config.input, config.num_classes());
    }
    format!(
        "ember train: recipe {}, {} ({} parameters), {} {} train / {} valid / {} test, {info}\nrun directory: {}",
        config.recipe.name(),
        config.model.name(),
        ember_models::Classifier::trainable_params(model),
        dataset,
        splits.train.len(),
        splits.valid.as_ref().map_or(0, DeviceSplit::len),
        splits.test.len(),
        crate::files::shown(&run.path)
    )
}
