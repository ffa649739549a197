//! SIGKILL in a loop (issue 12): a training run is killed at random moments, again and again,
//! in training, in evaluation and in the middle of writing a checkpoint, and new runs are killed
//! while they start. After every kill the run
//! directory loads as it is (what `--resume` and `ember eval` read), the next resume continues
//! from it, progress never goes back, and once a resume ends normally nothing that a kill left
//! is still there.
//!
//! Epochs of one step and a short evaluation make a checkpoint (model and optimizer records,
//! state.json, metrics.csv, curves.png) every ~100 ms. Half of the kills come at a random moment
//! (their moment is what the test varies); the other half as soon as a temporary file of a
//! checkpoint appears, so that many land while one is being written. The test counts those by
//! what they leave behind and requires them.

mod common;

use common::{ember, repo_mnist};

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use assert_cmd::cargo::CommandCargoExt;
use burn::backend::{Autodiff, NdArray};
use ember::checkpoint::{RunDir, TrainState};
use rand::{Rng, SeedableRng};

const KILLS: usize = 60;
const STARTS: usize = 12;

/// `ember train` on DIR: one 64-image step per epoch, 256 test images.
fn train(run: &Path, resume: bool, epochs: usize) -> Command {
    let mut cmd = Command::cargo_bin("ember").unwrap();
    cmd.env("EMBER_OFFLINE", "true").env_remove("EMBER_DATA_DIR");
    cmd.arg("train");
    if resume {
        cmd.arg("--resume").arg(run);
    } else {
        cmd.arg("--run-dir").arg(run);
        cmd.args(["--limit-train", "64", "--batch-size", "64", "--limit-test", "256"]);
    }
    cmd.args(["--epochs", &epochs.to_string(), "--device", "cpu", "--quiet"]);
    cmd.arg("--data-dir").arg(repo_mnist());
    cmd
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
fn sigkill_in_a_loop_never_costs_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");

    // The run's first epoch, and the time a resume takes to start and to run epochs, which set
    // the range of kill times on this machine.
    let status = train(&run, false, 1).stdout(Stdio::null()).status().unwrap();
    assert!(status.success());
    let timed = |epochs| {
        let t = Instant::now();
        let out = train(&run, true, epochs).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        t.elapsed()
    };
    let one = timed(2);
    let eleven = timed(13);
    let epoch = (eleven.saturating_sub(one)) / 10;
    let start = one.saturating_sub(epoch);
    eprintln!("resume: {start:?} to start, {epoch:?} per epoch");

    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut epoch_done = load(&run).progress.epoch;
    let mut mid_checkpoint = 0;
    for kill in 0..KILLS {
        let mut child = train(&run, true, 1_000_000)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if kill % 2 == 0 {
            // From halfway through start-up to eight epochs in.
            let at = start / 2 + (start / 2 + 8 * epoch).mul_f64(rng.random::<f64>());
            std::thread::sleep(at);
        } else {
            // The first temporary file of a checkpoint, watched for without pause.
            let watching = Instant::now();
            while !std::fs::read_dir(&run)
                .unwrap()
                .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp"))
            {
                assert!(watching.elapsed() < 30 * (start + epoch), "no checkpoint started");
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let state = load(&run);
        assert!(
            state.progress.epoch >= epoch_done,
            "kill {kill}: epoch {} after {epoch_done}",
            state.progress.epoch
        );
        epoch_done = state.progress.epoch;
        if !leftovers(&run, &state).is_empty() {
            mid_checkpoint += 1;
        }
    }

    // New runs killed while they start (before, while and after they write config.json and
    // their first checkpoint): the same command, or `--resume` once config.json is there, gives
    // the whole run.
    let mut early = Vec::new();
    for kill in 0..STARTS {
        let fresh = dir.path().join(format!("fresh-{kill}"));
        let mut child = train(&fresh, false, 1)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep((start + 2 * epoch).mul_f64(rng.random::<f64>()));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let had_config = fresh.join("config.json").exists();
        early.push(
            match (fresh.exists(), had_config, fresh.join("state.json").exists()) {
                (false, ..) => "no directory",
                (true, false, _) => "no config",
                (true, true, false) => "config, no checkpoint",
                (true, true, true) => "a checkpoint",
            },
        );
        // Two epochs: one more than the killed run's, which may have finished.
        let out = train(&fresh, had_config, 2).output().unwrap();
        assert!(
            out.status.success(),
            "start kill {kill} ({}): {}",
            early[kill],
            String::from_utf8_lossy(&out.stderr)
        );
        let state = load(&fresh);
        assert_eq!(state.progress.epoch, 2);
        assert_eq!(leftovers(&fresh, &state), Vec::<String>::new());
    }
    early.sort();
    early.dedup();
    eprintln!("start-up kills left: {early:?}");

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
        "{KILLS} kills in training: {mid_checkpoint} left a checkpoint half-written; reached epoch {}",
        epoch_done + 1
    );
    assert!(
        mid_checkpoint >= KILLS / 4,
        "only {mid_checkpoint} of {KILLS} kills landed in a checkpoint"
    );
}
