//! The `ember` binary as a user runs it: help, bad values, missing or corrupt data, and a
//! train → eval round trip on real MNIST.

mod common;

use common::{ember, import_fixture, pytorch_fixture, repo_mnist};

use std::io::Write;
use std::path::Path;

use predicates::prelude::*;

const FILES: [&str; 4] = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
];

/// A copy of MNIST in a temporary folder whose `broken` file holds `bytes`.
fn mnist_with(broken: &str, bytes: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in FILES {
        std::fs::copy(repo_mnist().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join(broken), bytes).unwrap();
    dir
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// `ember train --epochs 1` on the data in `data_dir`, for tests that expect it to fail.
fn train_on(data_dir: &Path) -> std::process::Output {
    ember()
        .args(["train", "--epochs", "1", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap()
}

/// Asserts a failed run printed exactly one line, `Error: ...` containing every `needle`.
fn assert_one_line_error(output: &std::process::Output, needles: &[&str]) {
    assert!(!output.status.success());
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "expected one line, got:\n{stderr}");
    assert!(stderr.starts_with("Error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "missing {n:?} in:\n{stderr}");
    }
}

#[test]
fn help_lists_the_commands() {
    ember().arg("--help").assert().success().stdout(
        predicate::str::contains("train")
            .and(predicate::str::contains("eval"))
            .and(predicate::str::contains("info")),
    );
    ember().args(["train", "--help"]).assert().success().stdout(
        predicate::str::contains("--batch-size")
            .and(predicate::str::contains("--test-batch-size"))
            .and(predicate::str::contains("--log-interval")),
    );
}

#[test]
fn unknown_recipe_is_an_error() {
    ember()
        .args(["train", "--recipe", "keras"])
        .assert()
        .failure()
        .code(2)
        .stderr(
            predicate::str::contains("invalid value 'keras'")
                .and(predicate::str::contains("pytorch-example")),
        );
}

#[test]
fn info_names_backend_and_device() {
    ember()
        .args(["info", "--device", "cpu"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("compiled backends: flex").and(predicate::str::contains("uses: cpu")),
        );
}

/// `ember info | head -1`, the reader gone: ember must end quietly (killed by SIGPIPE, as Unix
/// tools are), not panic with "failed printing to stdout". The pipe's read end is closed before
/// ember starts, so its first write meets a closed pipe every time.
#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_ember_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (read, write) = std::io::pipe().unwrap();
    drop(read);
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("ember"))
        .args(["info", "--device", "cpu"])
        .stdout(std::process::Stdio::from(write))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_device_without_cuda_build_is_one_clear_error() {
    let out = ember().args(["train", "--device", "cuda"]).output().unwrap();
    assert_one_line_error(&out, &["--device cuda:0", "--features cuda"]);
}

#[test]
fn missing_data_offline_says_what_to_put_where() {
    let empty = tempfile::tempdir().unwrap();
    let out = ember()
        .args(["train", "--epochs", "1", "--data-dir"])
        .arg(empty.path())
        .output()
        .unwrap();
    let mut needles = FILES.to_vec();
    let dir = empty.path().display().to_string();
    needles.extend([dir.as_str(), "--offline", "--data-dir"]);
    assert_one_line_error(&out, &needles);
}

/// EMBER_OFFLINE=1 (and yes/on) means offline, as environment switches usually do.
#[test]
fn ember_offline_takes_the_usual_spellings_of_true() {
    let empty = tempfile::tempdir().unwrap();
    for value in ["1", "yes", "on", "TRUE"] {
        let out = ember()
            .env("EMBER_OFFLINE", value)
            .args(["train", "--epochs", "1", "--data-dir"])
            .arg(empty.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {stderr}");
        assert!(!stderr.contains("invalid value"), "{value}: {stderr}");
        assert!(
            stderr.contains(FILES[0]) && !stderr.contains("downloading"),
            "{value}: {stderr}"
        );
    }
}

/// A run that cannot start leaves nothing behind: --valid-size taking every training image
/// used to leave a run directory holding only config.json, which the next try refused.
#[test]
fn a_run_that_cannot_start_leaves_no_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = ember()
        .args(["train", "--epochs", "1", "--valid-size", "60000", "--run-dir"])
        .arg(&run)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        &["--valid-size 60000 leaves no training images out of 60000"],
    );
    assert!(!run.exists(), "{:?}", std::fs::read_dir(&run).map(|d| d.count()));
}

/// An operating-system error is printed once, after the path it concerns.
#[test]
fn os_errors_are_printed_once() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let under_a_file = file.path().join("run");
    let out = ember()
        .args(["train", "--epochs", "1", "--run-dir"])
        .arg(&under_a_file)
        .args(["--data-dir"])
        .arg(repo_mnist())
        .output()
        .unwrap();
    assert_one_line_error(&out, &[&under_a_file.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("os error").count(), 1, "{stderr}");
}

/// A resume that fails its checks leaves the run's config.json as it was.
#[test]
fn a_failed_resume_leaves_the_config_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("imported");
    import_fixture(&run);
    let before = std::fs::read(run.join("config.json")).unwrap();
    let out = ember()
        .args(["train", "--epochs", "0", "--resume"])
        .arg(&run)
        .output()
        .unwrap();
    assert_one_line_error(&out, &["--epochs must be at least 1, got 0"]);
    assert_eq!(std::fs::read(run.join("config.json")).unwrap(), before);
}

#[test]
fn garbage_idx_file_is_a_one_line_error_naming_it() {
    let dir = mnist_with("train-labels-idx1-ubyte.gz", b"<html>404 not found</html>");
    let out = train_on(dir.path());
    assert_one_line_error(&out, &["train-labels-idx1-ubyte.gz", "gzip"]);
}

#[test]
fn truncated_idx_file_is_a_one_line_error_naming_it() {
    // A well-formed gzip of an IDX file cut short: the header promises 10,000 labels.
    let full = flate2::read::GzDecoder::new(
        std::fs::File::open(repo_mnist().join("t10k-labels-idx1-ubyte.gz")).unwrap(),
    );
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut { full }, &mut raw).unwrap();
    let dir = mnist_with("t10k-labels-idx1-ubyte.gz", &gzip(&raw[..5000]));
    let out = train_on(dir.path());
    assert_one_line_error(
        &out,
        &[
            "t10k-labels-idx1-ubyte.gz",
            "10000 bytes",
            "4992 bytes",
            "truncated",
        ],
    );

    // An image file whose header is all that is left.
    let dir = mnist_with("t10k-images-idx3-ubyte.gz", &gzip(&[0, 0, 8, 3, 0, 0]));
    let out = train_on(dir.path());
    assert_one_line_error(&out, &["t10k-images-idx3-ubyte.gz", "header"]);
}

#[test]
fn labels_in_place_of_images_are_named() {
    let labels = std::fs::read(repo_mnist().join("t10k-labels-idx1-ubyte.gz")).unwrap();
    let dir = mnist_with("t10k-images-idx3-ubyte.gz", &labels);
    let out = train_on(dir.path());
    assert_one_line_error(
        &out,
        &["t10k-images-idx3-ubyte.gz", "magic number 2049", "expected 2051"],
    );
}

#[test]
fn eval_of_a_folder_without_checkpoint_fails() {
    let dir = tempfile::tempdir().unwrap();
    let out = ember()
        .args(["eval", "--checkpoint"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_one_line_error(&out, &["not a checkpoint"]);
}

/// `(loss, accuracy)` as printed after "test loss " on the last line that has them.
fn test_result(stdout: &str) -> (String, String) {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.contains("test loss ") && l.contains("accuracy "))
        .unwrap_or_else(|| panic!("no test result in:\n{stdout}"));
    let after = |key: &str| line[line.find(key).unwrap() + key.len()..].to_string();
    let loss = after("test loss ").split_whitespace().next().unwrap().to_string();
    let accuracy = after("accuracy ").split(')').next().unwrap().to_string() + ")";
    (loss, accuracy)
}

#[test]
fn eval_reproduces_the_accuracy_training_printed() {
    let runs = tempfile::tempdir().unwrap();
    let run_dir = runs.path().join("run");
    let train = ember()
        .args([
            "train",
            "--recipe",
            "tch",
            "--epochs",
            "1",
            "--limit-train",
            "512",
            "--device",
            "cpu",
            "--data-dir",
        ])
        .arg(repo_mnist())
        .arg("--run-dir")
        .arg(&run_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&train.stdout);
    assert!(
        train.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&train.stderr)
    );
    let eval = ember()
        .args(["eval", "--device", "cpu", "--data-dir"])
        .arg(repo_mnist())
        .arg("--checkpoint")
        .arg(&run_dir)
        .output()
        .unwrap();
    let eval_out = String::from_utf8_lossy(&eval.stdout);
    assert!(
        eval.status.success(),
        "{eval_out}\n{}",
        String::from_utf8_lossy(&eval.stderr)
    );
    let trained = test_result(&stdout);
    let evaluated = test_result(&eval_out);
    assert!(evaluated.1.ends_with("/10000)"), "{evaluated:?}");
    assert_eq!(
        trained, evaluated,
        "train printed:\n{stdout}\neval printed:\n{eval_out}"
    );

    // A second run into the same directory is refused; the first run's files stay.
    let again = ember()
        .args(["train", "--epochs", "1", "--limit-train", "64", "--data-dir"])
        .arg(repo_mnist())
        .arg("--run-dir")
        .arg(&run_dir)
        .output()
        .unwrap();
    assert_one_line_error(&again, &["already exists"]);
    assert!(run_dir.join("state.json").is_file() && run_dir.join("metrics.csv").is_file());
}

#[test]
fn import_of_a_pytorch_state_dict_gives_a_checkpoint_eval_accepts() {
    let pt = pytorch_fixture();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("imported");
    ember()
        .args([
            "import",
            "--from",
            "pytorch",
            "--model",
            "pytorch-example",
            "--out",
        ])
        .arg(&out)
        .arg(&pt)
        .assert()
        .success()
        .stdout(predicate::str::contains("1199882 parameters"));
    // The fixture holds hash-drawn initial weights: chance-level accuracy, but a full evaluation.
    ember()
        .args(["eval", "--device", "cpu", "--checkpoint"])
        .arg(&out)
        .arg("--data-dir")
        .arg(repo_mnist())
        .assert()
        .success()
        .stdout(predicate::str::contains("/10000)").and(predicate::str::contains("pytorch-example-net")));

    let wrong = ember()
        .args(["import", "--from", "pytorch", "--model", "tch-net", "--out"])
        .arg(dir.path().join("wrong"))
        .arg(dir.path().join("missing.pt"))
        .output()
        .unwrap();
    assert_one_line_error(&wrong, &["missing.pt"]);
    let wrong = ember()
        .args(["import", "--from", "pytorch", "--model", "flashlight", "--out"])
        .arg(dir.path().join("wrong"))
        .arg(&pt)
        .output()
        .unwrap();
    assert_one_line_error(
        &wrong,
        &[
            "pytorch-example-net.pt",
            "not a flashlight-cnn state_dict",
            "conv1.weight",
        ],
    );
    assert!(
        !dir.path().join("wrong").exists(),
        "a failed import leaves no checkpoint"
    );
}

/// A ResNet-20 trained in PyTorch (benches/pytorch/parity.py: batch norm buffers included)
/// evaluates in ember as in PyTorch: the same test images right, the same loss.
#[test]
fn imported_resnet20_evaluates_as_in_pytorch() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let torch: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("resnet20-mnist.json")).unwrap())
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("resnet");
    ember()
        .args(["import", "--from", "pytorch", "--model", "resnet20"])
        // pytorch-example's normalisation (MNIST's mean and std), as the fixture was trained.
        .args(["--recipe", "pytorch-example", "--dataset", "mnist", "--out"])
        .arg(&out)
        .arg(fixtures.join("resnet20-mnist.pt"))
        .assert()
        .success()
        .stdout(predicate::str::contains("272186 parameters"));
    let eval = ember()
        .args(["eval", "--device", "cpu", "--checkpoint"])
        .arg(&out)
        .arg("--data-dir")
        .arg(repo_mnist())
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let stdout = String::from_utf8_lossy(&eval.stdout);
    let line = stdout.lines().find(|l| l.starts_with("test loss")).unwrap();
    let loss: f64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    let correct: i64 = line
        .split('(')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (torch_correct, torch_loss) = (
        torch["test_correct"].as_i64().unwrap(),
        torch["test_loss"].as_f64().unwrap(),
    );
    // Float rounding may move an image that sits on a decision boundary; a wrong buffer or
    // normalisation would move hundreds.
    assert!(
        (correct - torch_correct).abs() <= 2,
        "{line}: PyTorch had {torch_correct}/10000 right"
    );
    assert!(
        (loss - torch_loss).abs() <= 1e-3,
        "{line}: PyTorch's loss {torch_loss}"
    );
}
