//! A model from outside ember (examples/custom_model/net.rs) through ember's whole command line
//! (examples/custom_cli.rs, `ember::cli::main_with`): a run stopped mid-epoch by SIGTERM, then
//! killed mid-epoch by SIGKILL, resumed each time, ends byte for byte as the uninterrupted run;
//! `eval` and `predict` of it work with that binary, and ember's own binary, which lacks the
//! model, refuses it in one line.

mod common;
#[path = "../examples/custom_model/net.rs"]
mod net;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::repo_mnist;
use ember::checkpoint::{RunDir, TrainState};

/// The example binary that `cargo test` builds beside ember's.
fn custom_cli() -> PathBuf {
    let ember = PathBuf::from(env!("CARGO_BIN_EXE_ember"));
    let path = ember.parent().unwrap().join("examples").join("custom_cli");
    assert!(
        path.exists(),
        "{} not built (cargo test builds the examples)",
        path.display()
    );
    // A whole `cargo test` builds the examples; `cargo test --test custom_model` alone does not
    // rebuild them: run `cargo build --release --examples` first, or it tests a stale binary.
    path
}

/// `custom_cli train` of the residual net: 16 steps an epoch, 2 epochs, a line a step.
fn train(run: &Path, resume: bool) -> Command {
    let mut cmd = Command::new(custom_cli());
    cmd.env("EMBER_OFFLINE", "true").env_remove("EMBER_DATA_DIR");
    cmd.arg("train");
    if resume {
        cmd.arg("--resume").arg(run);
    } else {
        cmd.arg("--run-dir").arg(run);
        cmd.args(["--recipe", "speedrun", "--model", "residual-net", "--epochs", "2"]);
        cmd.args([
            "--limit-train",
            "1024",
            "--batch-size",
            "64",
            "--limit-test",
            "500",
        ]);
    }
    cmd.args(["--device", "cpu", "--log-interval", "1"]);
    cmd.arg("--data-dir").arg(repo_mnist());
    cmd
}

/// Runs `cmd` until it prints a line starting with `line`, then sends `signal`; returns the exit
/// status.
fn stop_at(mut cmd: Command, line: &str, signal: i32) -> std::process::ExitStatus {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    let mut sent = false;
    // Read to the end: a pipe closed early would stop the run by SIGPIPE instead of `signal`.
    for l in out.lines() {
        let l = l.unwrap();
        if !sent && l.starts_with(line) {
            // SAFETY: kill(2) on our own child's pid, which has not been waited for.
            assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
            sent = true;
        }
        seen.push(l);
    }
    let status = child.wait().unwrap();
    assert!(sent, "never printed {line:?}: {seen:?}");
    status
}

fn state(run: &Path) -> TrainState {
    RunDir::open(run).unwrap().load_state().unwrap()
}

/// Every tensor of the run's latest checkpoint (batch norm's running statistics included), by
/// name: the records themselves differ between runs in burn's random parameter ids.
fn weights(run: &Path) -> Vec<(String, Vec<f32>)> {
    let dir = RunDir::open(run).unwrap();
    let config = dir.load_config().unwrap();
    let model = dir
        .load_model_of::<burn::backend::NdArray, _>(&net::Residual, &config, &Default::default())
        .unwrap();
    ember::import::to_pytorch_tensors(&model)
        .into_iter()
        .map(|(n, d)| (n, d.to_vec().unwrap()))
        .collect()
}

#[test]
fn a_users_model_resumes_bit_identically_and_evaluates_through_its_own_cli() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let out = train(&whole, false).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("residual-net ("), "{text}");

    // SIGTERM in epoch 1: the step finishes, a mid-epoch checkpoint is written, exit 130.
    let cut = dir.path().join("cut");
    let status = stop_at(train(&cut, false), "train epoch 1 [512/1024", libc::SIGTERM);
    assert_eq!(status.code(), Some(130), "{status:?}");
    let mid = state(&cut);
    assert_eq!(
        (mid.progress.epoch, mid.model.as_deref()),
        (0, Some("residual-net"))
    );
    assert!(mid.progress.step_in_epoch >= 8, "{mid:?}");
    // SIGKILL in epoch 2 of the resumed run: nothing is written; the epoch-1 checkpoint stays.
    let status = stop_at(train(&cut, true), "train epoch 2 [512/1024", libc::SIGKILL);
    assert_eq!(status.code(), None, "{status:?}");
    let killed = state(&cut);
    assert_eq!((killed.progress.epoch, killed.progress.step_in_epoch), (1, 0));
    let out = train(&cut, true).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let (a, b) = (state(&whole), state(&cut));
    assert_eq!(a.progress.global_step, b.progress.global_step);
    let (wa, wb) = (weights(&whole), weights(&cut));
    assert!(
        wa.len() >= 20 && wa.iter().any(|(n, _)| n.ends_with("running_var")),
        "{:?}",
        wa.len()
    );
    assert!(
        wa == wb,
        "the resumed run's weights differ from the uninterrupted run's"
    );
    let metrics = |run: &Path| {
        let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
        // Every column but the timings (seconds, images/s), which vary.
        text.lines()
            .map(|l| l.split(',').take(8).collect::<Vec<_>>().join(","))
            .collect::<Vec<_>>()
    };
    assert_eq!(metrics(&whole), metrics(&cut));

    // eval and predict of the run with the binary that has the model.
    let out = Command::new(custom_cli())
        .args(["eval", "--device", "cpu", "--checkpoint"])
        .arg(&cut)
        .arg("--data-dir")
        .arg(repo_mnist())
        .env("EMBER_OFFLINE", "true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("residual-net") && text.contains("/500)"), "{text}");

    let mnist = common::load_mnist();
    let digit = dir.path().join("digit.png");
    let first: Vec<u8> = mnist.test.images[..784].to_vec();
    image::GrayImage::from_raw(28, 28, first)
        .unwrap()
        .save(&digit)
        .unwrap();
    let out = Command::new(custom_cli())
        .args(["predict", "--json", "--device", "cpu", "--checkpoint"])
        .arg(&cut)
        .arg(&digit)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let guesses: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(guesses[0]["prediction"].is_u64(), "{guesses}");

    // ember's own binary does not have the model: one line naming it, exit 1.
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["eval", "--device", "cpu", "--checkpoint"])
        .arg(&cut)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("Error: ") && err.contains("\"residual-net\"") && err.lines().count() == 1,
        "{err}"
    );
}
