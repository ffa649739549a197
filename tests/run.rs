//! Runs as a user lives them: killed and resumed, diverging, predicting on image files,
//! plotting; all through the `ember` binary on real MNIST.

mod common;

use common::{ember, repo_mnist};

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command as Process, Stdio};

use assert_cmd::cargo::CommandCargoExt;
use burn::backend::NdArray;
use ember::checkpoint::RunDir;
use ember::import::to_pytorch_tensors;

/// Training flags of a small, quick run: 10 steps per epoch, 1,000 test images.
const SMALL: [&str; 8] = [
    "--limit-train",
    "640",
    "--limit-test",
    "1000",
    "--device",
    "cpu",
    "--log-interval",
    "1",
];

fn train_args(run_dir: &Path, epochs: &str) -> Vec<String> {
    let mut v: Vec<String> = ["train", "--epochs", epochs]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend(SMALL.iter().map(|s| s.to_string()));
    v.extend([
        "--data-dir".into(),
        repo_mnist().display().to_string(),
        "--run-dir".into(),
        run_dir.display().to_string(),
    ]);
    v
}

/// Every parameter of the run's latest checkpoint, by name.
fn weights(run_dir: &Path) -> Vec<(String, Vec<f32>)> {
    let run = RunDir::open(run_dir).unwrap();
    let config = run.load_config().unwrap();
    let model = run.load_model::<NdArray>(&config, &Default::default()).unwrap();
    to_pytorch_tensors(&model)
        .into_iter()
        .map(|(n, d)| (n, d.to_vec().unwrap()))
        .collect()
}

#[test]
fn a_run_killed_mid_epoch_and_resumed_ends_with_the_same_weights() {
    kill_and_resume(&[], 8);
}

/// The same with batch norm (its running statistics are compared too), augmentation drawn per
/// epoch, Nesterov momentum buffers, a per-step one-cycle schedule that also moves the momentum,
/// and label smoothing: the speedrun recipe at 10 steps per epoch.
#[test]
fn a_speedrun_killed_mid_epoch_and_resumed_ends_with_the_same_weights() {
    kill_and_resume(&["--recipe", "speedrun", "--batch-size", "64"], 11 + 3 * 3);
}

/// Trains 3 epochs of 10 steps straight, and the same killed in epoch 2 and resumed; the two
/// checkpoints must hold the same bits in all `tensors` tensors (parameters and buffers).
fn kill_and_resume(recipe: &[&str], tensors: usize) {
    let dir = tempfile::tempdir().unwrap();
    let straight = dir.path().join("straight");
    let killed = dir.path().join("killed");
    let args = |run: &Path| {
        let mut v = train_args(run, "3");
        v.extend(recipe.iter().map(|s| s.to_string()));
        v
    };
    ember().args(args(&straight)).assert().success();

    // Start the same run and SIGKILL it in the middle of epoch 2.
    let mut child = Process::cargo_bin("ember")
        .unwrap()
        .env("EMBER_OFFLINE", "true")
        .args(args(&killed))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        let stop = line.starts_with("train epoch 2 [320/640");
        seen.push(line);
        if stop {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(seen.iter().any(|l| l.starts_with("epoch   1/3")), "{seen:#?}");
    // Killed inside epoch 2: only epoch 1 is recorded. (Reading stdout stops at the marker, so
    // an assertion on `seen` could not tell a kill that came after epoch 2 ended; the files can.)
    let rows = std::fs::read_to_string(killed.join("metrics.csv")).unwrap();
    assert_eq!(rows.lines().count(), 2, "killed too late: {rows}");

    let state = std::fs::read_to_string(killed.join("state.json")).unwrap();
    assert!(state.contains("\"epoch\": 1"), "{state}");
    let resumed = ember()
        .args(["train", "--resume"])
        .arg(&killed)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .args(["--device", "cpu"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        resumed.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert!(
        out.contains("resuming after 1 completed epochs (10 steps)"),
        "{out}"
    );

    let (a, b) = (weights(&straight), weights(&killed));
    assert_eq!(a.len(), tensors);
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let differing = x
            .iter()
            .zip(y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        assert_eq!(
            differing,
            0,
            "{name}: {differing} of {} values differ after resume",
            x.len()
        );
    }
    // The metrics agree too (training seconds aside).
    let metrics = |d: &Path| -> Vec<String> {
        std::fs::read_to_string(d.join("metrics.csv"))
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(8).collect::<Vec<_>>().join(","))
            .collect()
    };
    assert_eq!(metrics(&straight), metrics(&killed));
    assert_eq!(metrics(&killed).len(), 4);

    // Resuming a finished run says so.
    let again = ember()
        .args(["train", "--resume"])
        .arg(&killed)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("is complete (3 of 3 epochs)"));
}

/// SIGTERM (what schedulers and `docker stop` send) stops a run as Ctrl-C does: the step
/// finishes, a checkpoint is written, and the run resumes from it.
#[test]
fn sigterm_checkpoints_like_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = Process::cargo_bin("ember")
        .unwrap()
        .env("EMBER_OFFLINE", "true")
        .args(train_args(&run, "3"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in &mut lines {
        if line.unwrap().starts_with("train epoch 1 [320/640") {
            break;
        }
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    // Keep reading: a closed pipe would fail the child's next line.
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let out = child.wait_with_output().unwrap();
    assert!(!rest.iter().any(|l| l.starts_with("final:")), "{rest:#?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("checkpoint written to"), "{stderr}");
    let state = std::fs::read_to_string(run.join("state.json")).unwrap();
    assert!(!state.contains("\"global_step\": 0,"), "{state}");
    ember()
        .args(["train", "--resume"])
        .arg(&run)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .args(["--device", "cpu"])
        .assert()
        .success();
}

/// A state.json whose step lies past the end of its epoch is refused (the step counter used to
/// wrap around).
#[test]
fn a_state_past_the_end_of_its_epoch_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    ember().args(train_args(&run, "1")).assert().success();
    let state = std::fs::read_to_string(run.join("state.json")).unwrap();
    std::fs::write(
        run.join("state.json"),
        state.replace("\"step_in_epoch\": 0", "\"step_in_epoch\": 999"),
    )
    .unwrap();
    let out = ember()
        .args(["train", "--epochs", "2", "--resume"])
        .arg(&run)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("step_in_epoch 999 is not inside an epoch of 10 steps"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn a_diverging_run_stops_naming_epoch_and_step_and_keeps_the_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("diverged");
    let mut args = train_args(&run, "2");
    // PyTorch's example at --lr 1e12 also turns NaN at step 2; at 1e6 both stay finite.
    args.extend(["--lr".into(), "1e12".into()]);
    let out = ember().args(&args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("Error: training loss is not finite"),
        "{stderr}"
    );
    assert!(
        stderr.contains("at epoch 1, step 2 of 10 (lr 1.000e12)"),
        "{stderr}"
    );
    assert!(stderr.contains("last good checkpoint (epoch 0)"), "{stderr}");
    // The checkpoint written before training (epoch 0) still loads and evaluates.
    ember()
        .args(["eval", "--device", "cpu", "--checkpoint"])
        .arg(&run)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .assert()
        .success()
        .stdout(predicates::str::contains("/1000)"));
}

#[test]
fn predict_on_pngs_of_test_images_agrees_with_the_model_and_reports_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    ember().args(train_args(&run, "1")).assert().success();

    // PNGs of the first 12 MNIST test images, written here with the image crate.
    let data = common::load_mnist();
    let mut files = Vec::new();
    for i in 0..12 {
        let pixels = data.test.images[i * 784..(i + 1) * 784].to_vec();
        let img = image::GrayImage::from_raw(28, 28, pixels).unwrap();
        let path = dir.path().join(format!("test-{i}.png"));
        img.save(&path).unwrap();
        files.push(path);
    }
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not an image").unwrap();

    // What the model predicts for those images through the evaluation path.
    let run_dir = RunDir::open(&run).unwrap();
    let config = run_dir.load_config().unwrap();
    let device = Default::default();
    let model = run_dir.load_model::<NdArray>(&config, &device).unwrap();
    let split = ember::data::DeviceSplit::<NdArray>::upload(&data.test, &config.normalization, &device);
    let (images, _) = split.range(0, 12);
    use ember_models::Classifier;
    let expected: Vec<i64> = model
        .forward(images)
        .argmax(1)
        .into_data()
        .convert::<i64>()
        .to_vec()
        .unwrap();

    let out = ember()
        .args(["predict", "--json", "--checkpoint"])
        .arg(&run)
        .args(&files[..6])
        .arg(&text)
        .args(&files[6..])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("notes.txt: cannot read as an image"), "{stderr}");
    assert!(
        stderr.contains("1 of 13 files could not be classified"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entries = json.as_array().unwrap();
    assert_eq!(entries.len(), 13);
    assert!(entries[6]["error"].as_str().unwrap().contains("notes.txt"));
    let predicted: Vec<i64> = entries
        .iter()
        .filter(|e| e.get("prediction").is_some())
        .map(|e| e["prediction"].as_i64().unwrap())
        .collect();
    assert_eq!(predicted, expected);
    let p: f64 = entries[0]["top3"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["probability"].as_f64().unwrap())
        .sum();
    assert!(p > 0.0 && p <= 1.0 + 1e-6, "{p}");

    // Text output: one line per file, the digit first.
    let out = ember()
        .args(["predict", "--checkpoint"])
        .arg(&run)
        .arg(&files[0])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.starts_with(&format!("{}: {}  (", files[0].display(), expected[0])),
        "{stdout}"
    );

    // A file whose header claims a huge image is refused by name; the others are classified.
    let huge = dir.path().join("huge.png");
    std::fs::write(&huge, common::claiming_png(1_000_000, 1)).unwrap();
    let out = ember()
        .args(["predict", "--checkpoint"])
        .arg(&run)
        .arg(&files[0])
        .arg(&huge)
        .arg(&files[1])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("huge.png") && stderr.contains("1000000x1 pixels"),
        "{stderr}"
    );
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(
        stdout.contains(&format!("{}: {}  (", files[1].display(), expected[1])),
        "{stdout}"
    );

    // ember plot redraws the curves, and overlays runs.
    std::fs::remove_file(run.join("curves.png")).unwrap();
    ember().args(["plot"]).arg(&run).assert().success();
    assert!(run.join("curves.png").is_file());
    let both = dir.path().join("both.png");
    ember()
        .args(["plot", "--out"])
        .arg(&both)
        .arg(&run)
        .arg(&run)
        .assert()
        .success();
    assert!(std::fs::metadata(&both).unwrap().len() > 10_000);
}

/// A run killed after writing config.json and before its first checkpoint resumes from the
/// start: the config holds the seed, so it is the same run (it used to fail on the missing
/// state.json, and the same --run-dir was refused as not empty).
#[test]
fn a_run_stopped_before_its_first_checkpoint_resumes_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (straight, stopped) = (dir.path().join("straight"), dir.path().join("stopped"));
    ember().args(train_args(&straight, "1")).assert().success();
    std::fs::create_dir(&stopped).unwrap();
    std::fs::copy(straight.join("config.json"), stopped.join("config.json")).unwrap();
    // The half-written first checkpoint's record.
    std::fs::write(stopped.join("model-e0000-s0000000.mpk"), b"half").unwrap();
    let out = ember()
        .args(["train", "--resume"])
        .arg(&stopped)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .args(["--device", "cpu"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("resuming after 0 completed epochs"), "{stdout}");
    assert_eq!(weights(&straight), weights(&stopped));
    assert!(!stopped.join("model-e0000-s0000000.mpk").exists());
}
