//! SIGKILL at every point that matters (issue 12, made deterministic in issue 25): a training
//! run is killed in start-up, mid-epoch, in evaluation and at each step of writing each file of
//! a checkpoint, and new runs are killed at each step of their start. After every kill the run
//! directory loads as it is (what `--resume` and `ember eval` read), the next resume continues
//! from it, progress never goes back, and once a resume ends normally nothing that a kill left
//! is still there.
//!
//! The kills come from the process itself: `EMBER_KILL_AT=POINT@N` (src/faults.rs) sends it
//! SIGKILL the N-th time it reaches POINT, as `kill -9` at that moment would. Each kill is
//! asserted to have happened (the process died of signal 9), and each kill inside a file write
//! to have left that write's temporary file: no timing decides what the test covers.

mod common;

use common::{ember, repo_mnist};

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

use assert_cmd::cargo::CommandCargoExt;
use burn::backend::{Autodiff, NdArray};
use ember::checkpoint::{RunDir, TrainState};
use ember::faults::POINTS;

/// `ember train` on DIR: two 64-image steps per epoch, 256 test images in two batches.
fn train(run: &Path, resume: bool, epochs: usize) -> Command {
    let mut cmd = Command::cargo_bin("ember").unwrap();
    cmd.env("EMBER_OFFLINE", "true")
        .env_remove("EMBER_DATA_DIR")
        .env_remove("EMBER_KILL_AT");
    cmd.arg("train");
    if resume {
        cmd.arg("--resume").arg(run);
    } else {
        cmd.arg("--run-dir").arg(run);
        cmd.args([
            "--limit-train",
            "128",
            "--batch-size",
            "64",
            "--limit-test",
            "256",
        ]);
        cmd.args(["--test-batch-size", "128"]);
    }
    cmd.args(["--epochs", &epochs.to_string(), "--device", "cpu", "--quiet"]);
    cmd.arg("--data-dir").arg(repo_mnist());
    cmd
}

/// Runs `cmd` killed at `point`: asserts that it died of SIGKILL there.
fn killed_at(mut cmd: Command, point: &str) -> Output {
    let out = cmd.env("EMBER_KILL_AT", point).output().unwrap();
    assert_eq!(
        out.status.signal(),
        Some(9),
        "{point} was not reached (status {:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether `run` holds a temporary file of `write_atomic`.
fn has_temporary(run: &Path) -> bool {
    std::fs::read_dir(run)
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp"))
}

/// The points inside `write_atomic` at which its temporary file exists.
fn inside_a_write(point: &str) -> bool {
    ["write:created", "write:half", "write:synced"].contains(&point)
}

/// The checkpoint as `--resume` loads it: config, state, model and optimizer records (checksums
/// included).
fn load(run: &Path) -> TrainState {
    let dir = RunDir::open(run).unwrap();
    let config = dir.load_config().unwrap();
    let state = dir.load_state().unwrap();
    dir.load_training::<Autodiff<NdArray>>(&config, &Default::default())
        .unwrap_or_else(|e| panic!("{e}"));
    state
}

/// Files in the run directory that its checkpoint does not account for: temporary files, and
/// records that state.json does not name.
fn leftovers(run: &Path, state: &TrainState) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| {
            let record = (n.starts_with("model-") || n.starts_with("optimizer-")) && n.ends_with(".mpk");
            n.ends_with(".tmp")
                || record && *n != state.model_file && state.optimizer_file.as_deref() != Some(n.as_str())
        })
        .collect();
    found.sort();
    found
}

#[test]
fn sigkill_at_every_point_never_costs_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let status = train(&run, false, 1).output().unwrap().status;
    assert!(status.success());

    // A resume to one epoch more than the checkpoint has, killed at each point: in start-up,
    // at each step of writing config.json (its new length) and each file of the epoch's
    // checkpoint (metrics.csv, curves.png, then model, optimizer, state.json: six writes), after the
    // first and second training steps, in evaluation, after the checkpoint is committed.
    let mut epoch_done = load(&run).progress.epoch;
    let mut kills = Vec::new();
    // MNIST's IDX files decode no image file: decode:image is a folder's (tests/hostile.rs).
    for name in POINTS.iter().filter(|p| !p.starts_with("decode:")) {
        let times = if name.starts_with("write:") {
            6
        } else if *name == "train:step" {
            2
        } else {
            1
        };
        kills.extend((1..=times).map(|n| format!("{name}@{n}")));
    }
    for point in &kills {
        killed_at(train(&run, true, epoch_done + 1), point);
        let state = load(&run);
        assert!(
            state.progress.epoch >= epoch_done,
            "killed at {point}: epoch {} after {epoch_done}",
            state.progress.epoch
        );
        if inside_a_write(point.split('@').next().unwrap()) {
            assert!(has_temporary(&run), "killed at {point}: no temporary file left");
        }
        epoch_done = state.progress.epoch;
    }
    assert!(
        epoch_done >= 3,
        "the kills after commits advanced {epoch_done} epochs"
    );

    // New runs killed at each step of their start (lock, data, config.json, the first
    // checkpoint's writes and commit): the same command, or `--resume` once config.json is
    // there, gives the whole run.
    let mut starts = Vec::new();
    for name in ["run:locked", "data:loaded", "checkpoint:committed"] {
        starts.push(format!("{name}@1"));
    }
    for name in POINTS.iter().filter(|p| p.starts_with("write:")) {
        // config.json, then the first checkpoint's model, optimizer and state.json.
        starts.extend((1..=4).map(|n| format!("{name}@{n}")));
    }
    let mut left = BTreeSet::new();
    for (i, point) in starts.iter().enumerate() {
        let fresh = dir.path().join(format!("fresh-{i}"));
        killed_at(train(&fresh, false, 1), point);
        let had_config = fresh.join("config.json").exists();
        left.insert(
            match (fresh.exists(), had_config, fresh.join("state.json").exists()) {
                (false, ..) => "no directory",
                (true, false, _) => "no config",
                (true, true, false) => "config, no checkpoint",
                (true, true, true) => "a checkpoint",
            },
        );
        if inside_a_write(point.split('@').next().unwrap()) {
            assert!(
                has_temporary(&fresh),
                "start killed at {point}: no temporary file left"
            );
        }
        // Two epochs: one more than the killed run's, which may have finished.
        let out = train(&fresh, had_config, 2).output().unwrap();
        assert!(
            out.status.success(),
            "start killed at {point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let state = load(&fresh);
        assert_eq!(state.progress.epoch, 2);
        assert_eq!(leftovers(&fresh, &state), Vec::<String>::new());
    }
    // Every kind of state a start can be killed in was reached.
    assert_eq!(
        left.into_iter().collect::<Vec<_>>(),
        ["a checkpoint", "config, no checkpoint", "no config"]
    );

    // A resume that ends normally: it continues from the last kill's checkpoint and leaves only
    // the run's own files.
    let out = train(&run, true, epoch_done + 1).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let state = load(&run);
    assert_eq!(state.progress.epoch, epoch_done + 1);
    assert_eq!(leftovers(&run, &state), Vec::<String>::new());
    let files: BTreeSet<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    let expected: BTreeSet<String> = [
        ".lock",
        "config.json",
        "state.json",
        "metrics.csv",
        "curves.png",
        &state.model_file,
        state.optimizer_file.as_deref().unwrap(),
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(files, expected);
    // One metrics row per epoch, in order: none lost, none doubled by a kill.
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let epochs: Vec<usize> = metrics
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(epochs, (1..=epoch_done + 1).collect::<Vec<_>>());
    // Eval reads the directory as the user would.
    ember()
        .args(["eval", "--checkpoint"])
        .arg(&run)
        .arg("--data-dir")
        .arg(repo_mnist())
        .args(["--device", "cpu"])
        .assert()
        .success();

    eprintln!(
        "{} kills of a resume, {} of a start; reached epoch {}",
        kills.len(),
        starts.len(),
        epoch_done + 1
    );
}
