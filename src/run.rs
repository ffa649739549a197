//! A training run as a user drives it: progress, per-epoch lines, `metrics.csv` and
//! `curves.png`, checkpoints after every epoch (and on Ctrl-C), resume, and a clean stop on a
//! non-finite loss.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};

use crate::checkpoint::{optimizer_bytes, CheckpointError, RunDir, TrainState};
use crate::config::TrainConfig;
use crate::data::DeviceSplit;
use crate::metrics::{self, MetricsError, MetricsRow, CURVES_FILE};
use crate::model::Model;
use crate::optim::Optimizer;
use crate::train::{self, EpochControl, EpochEnd, EvalStats, Splits, StepInfo};

/// Set by the Ctrl-C handler; the training loop stops after the current step.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler: the first press finishes the step and checkpoints, a second
/// quits at once.
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing this step and writing a checkpoint (Ctrl-C again quits at once)");
    });
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
}

/// Where training starts from.
pub struct Start<B: AutodiffBackend> {
    pub model: Model<B>,
    pub optim: Optimizer<Model<B>, B>,
    pub state: TrainState,
    pub rows: Vec<MetricsRow>,
}

impl<B: AutodiffBackend> Start<B> {
    /// A new model for `config`, checkpointed as epoch 0 so that even the first epoch can be resumed.
    pub fn fresh(config: &TrainConfig, device: &B::Device) -> Self {
        Self {
            model: train::init_model::<B>(config, device),
            optim: config.optimizer.init::<B, _>(),
            state: TrainState::default(),
            rows: Vec::new(),
        }
    }

    /// The run's latest checkpoint and metrics.
    pub fn resume(run: &RunDir, config: &TrainConfig, device: &B::Device) -> Result<Self, RunError> {
        let (model, optim, state) = run.load_training::<B>(config, device)?;
        let mut rows = match metrics::read(&run.path) {
            Ok(rows) => rows,
            Err(MetricsError::Io { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        rows.retain(|r| r.epoch <= state.epoch);
        Ok(Self {
            model,
            optim,
            state,
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

fn save<B: AutodiffBackend>(
    run: &RunDir,
    model: &Model<B>,
    optim: &Optimizer<Model<B>, B>,
    state: &TrainState,
) -> Result<(), RunError> {
    run.save_checkpoint(model, Some(optimizer_bytes(optim)), state.clone())?;
    Ok(())
}

fn describe(state: &TrainState) -> String {
    if state.step_in_epoch == 0 {
        format!("epoch {}", state.epoch)
    } else {
        format!("epoch {}, step {}", state.epoch + 1, state.step_in_epoch)
    }
}

/// Trains from `start` to `config.epochs`; returns the final test evaluation.
pub fn train<B: AutodiffBackend>(
    config: &TrainConfig,
    splits: &Splits<B::InnerBackend>,
    run: &RunDir,
    start: Start<B>,
    save_model: bool,
    out: Output,
) -> Result<EvalStats, RunError> {
    let Start {
        mut model,
        mut optim,
        mut state,
        mut rows,
    } = start;
    if state.epoch >= config.epochs {
        return Err(RunError::Complete(run.path.display().to_string(), state.epoch));
    }
    if save_model && state.global_step == 0 && state.epoch == 0 {
        save(run, &model, &optim, &state)?;
    }
    let schedule = config.schedule();
    let check_every = if out.log_interval > 0 {
        out.log_interval
    } else if out.bars {
        10
    } else {
        100
    };
    let mut last = None;
    while state.epoch < config.epochs {
        let epoch = state.epoch;
        let lr = schedule.lr(epoch);
        let steps = splits.train.len().div_ceil(config.batch_size);
        let bar = out.bars.then(|| {
            let bar = ProgressBar::new(steps as u64).with_style(
                ProgressStyle::with_template(
                    "epoch {prefix} [{bar:30}] {pos}/{len} {msg} {per_sec} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(format!("{}/{}", epoch + 1, config.epochs));
            bar.set_position(state.step_in_epoch as u64);
            bar
        });
        let mut on_step = |s: StepInfo| {
            if let Some(bar) = &bar {
                bar.set_position(s.step as u64);
                if let Some(loss) = s.loss {
                    bar.set_message(format!("loss {} |", num(loss, 4)));
                }
            } else if let (Some(loss), false, true) = (s.loss, out.quiet, out.log_interval > 0) {
                println!(
                    "train epoch {} [{}/{} ({:.0}%)] loss {}",
                    s.epoch + 1,
                    s.seen,
                    s.total,
                    100.0 * s.seen as f64 / s.total as f64,
                    num(loss, 6)
                );
            }
        };
        let stop = || INTERRUPTED.load(Ordering::SeqCst);
        let control = EpochControl {
            start_step: state.step_in_epoch,
            done_loss_sum: state.partial_loss_sum,
            done_seconds: state.partial_seconds,
            global_step: state.global_step,
            check_every,
            on_step: &mut on_step,
            stop: &stop,
        };
        let done_before = state.step_in_epoch;
        let (trained, end) = train::train_epoch(model, &mut optim, &splits.train, config, epoch, lr, control);
        model = trained;
        if let Some(bar) = &bar {
            bar.finish_and_clear();
        }
        let stats = match end {
            EpochEnd::Done(stats) => stats,
            EpochEnd::NonFinite { step, steps } => {
                return Err(RunError::NonFinite {
                    epoch: epoch + 1,
                    step,
                    steps,
                    lr,
                    saved: if save_model {
                        describe(&state)
                    } else {
                        "none: --save-model=false".into()
                    },
                    dir: run.path.display().to_string(),
                })
            }
            EpochEnd::Stopped {
                steps_done,
                loss_sum,
                seconds,
            } => {
                state.global_step += steps_done - done_before;
                state.step_in_epoch = steps_done;
                state.partial_loss_sum = loss_sum;
                state.partial_seconds = seconds;
                let saved = if save_model {
                    save(run, &model, &optim, &state)?;
                    format!(
                        "checkpoint written to {}; continue with: ember train --resume {}",
                        run.path.display(),
                        run.path.display()
                    )
                } else {
                    "no checkpoint written (--save-model=false)".into()
                };
                return Err(RunError::Interrupted {
                    epoch: epoch + 1,
                    step: steps_done,
                    saved,
                });
            }
        };
        state.global_step += stats.steps - done_before;
        state.epoch += 1;
        state.step_in_epoch = 0;
        state.partial_loss_sum = 0.0;
        state.partial_seconds = 0.0;

        let valid = splits
            .valid
            .as_ref()
            .map(|v| train::evaluate_trained(&model, v, config.test_batch_size));
        let test = train::evaluate_trained(&model, &splits.test, config.test_batch_size);
        rows.push(MetricsRow {
            epoch: state.epoch,
            step: state.global_step,
            lr,
            train_loss: stats.loss,
            valid_loss: valid.map(|v| v.loss),
            valid_accuracy: valid.map(|v| v.accuracy()),
            test_loss: test.loss,
            test_accuracy: test.accuracy(),
            seconds: stats.seconds,
            images_per_sec: stats.images_per_sec(),
        });
        metrics::write(&run.path, &rows)?;
        let name = run
            .path
            .file_name()
            .map_or("run".into(), |n| n.to_string_lossy().to_string());
        metrics::draw_curves(&run.path.join(CURVES_FILE), &[(name, rows.clone())])?;
        if save_model {
            save(run, &model, &optim, &state)?;
        }
        if !out.quiet {
            let mut line = format!(
                "epoch {:>3}/{}  lr {}  train loss {}",
                state.epoch,
                config.epochs,
                num(lr, 6),
                num(stats.loss, 4)
            );
            if let Some(v) = valid {
                line += &format!(
                    "  valid loss {} accuracy {:.2}%",
                    num(v.loss, 4),
                    100.0 * v.accuracy()
                );
            }
            line += &format!(
                "  test loss {}  accuracy {}  train {:.1} s  {:.0} img/s  eval {:.1} s",
                num(test.loss, 4),
                test.accuracy_text(),
                stats.seconds,
                stats.images_per_sec(),
                test.seconds
            );
            println!("{line}");
        }
        last = Some(test);
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
    Ok(test)
}

/// Header printed before training.
pub fn header<B: AutodiffBackend>(
    config: &TrainConfig,
    model: &Model<B>,
    splits: &Splits<B::InnerBackend>,
    info: &str,
    run: &RunDir,
) -> String {
    format!(
        "ember train: recipe {}, {} ({} parameters), {} {} train / {} valid / {} test, {info}\nrun directory: {}",
        config.recipe.name(),
        config.model.name(),
        model.num_params(),
        config.dataset,
        splits.train.len(),
        splits.valid.as_ref().map_or(0, DeviceSplit::len),
        splits.test.len(),
        run.path.display()
    )
}
