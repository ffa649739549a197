//! The catalogue of what a user gets wrong (issue 12, must-show 4): each mistake gives exit
//! status 1 and one line, `Error: ...`, that names the flag or the file at fault, with nothing in
//! it said twice and no panic. Clap's own usage errors (unknown flags, bad enum values) are
//! clap's format and tested in cli.rs. Run with --nocapture to read every message.

mod common;

use common::{ember, import_fixture, pytorch_fixture, repo_mnist};

use std::path::{Path, PathBuf};
use std::process::Output;

/// Checks one failure; returns its line, or what is wrong with it.
fn one_line(out: &Output, needles: &[&str]) -> Result<String, String> {
    let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    let wrong = |why: &str| Err(format!("{why}: {stderr:?} (exit {:?})", out.status.code()));
    if out.status.code() != Some(1) {
        return wrong("exit status is not 1");
    }
    if stderr.lines().count() != 1 || !stderr.starts_with("Error: ") || stderr.contains("panicked") {
        return wrong("not one line starting with \"Error: \"");
    }
    if let Some(n) = needles.iter().find(|n| !stderr.contains(*n)) {
        return wrong(&format!("{n:?} is not named"));
    }
    // Nothing said twice: no part between ": " or "; " repeats the one before it, and an OS
    // error's text ("... (os error N)") appears once.
    let parts: Vec<&str> = stderr
        .split([':', ';'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.windows(2).any(|p| p[0] == p[1]) || stderr.matches("(os error").count() > 1 {
        return wrong("something is said twice");
    }
    Ok(stderr)
}

/// A copy of the checkpoint directory `from` at `to`, with `file` replaced by `bytes`.
fn altered(from: &Path, to: &Path, file: &str, bytes: &[u8]) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    std::fs::write(to.join(file), bytes).unwrap();
    to.to_owned()
}

#[test]
fn every_mistake_is_one_line_naming_what_is_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let mnist = repo_mnist();
    let mnist = mnist.to_str().unwrap();
    let show = |p: &Path| p.display().to_string();

    // A checkpoint to spoil: the PyTorch fixture, imported.
    let imported = d("imported");
    import_fixture(&imported);
    let state = std::fs::read_to_string(imported.join("state.json")).unwrap();
    let record: String = std::fs::read_dir(&imported)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .find(|n| n.starts_with("model-"))
        .unwrap();
    let mut garbled = std::fs::read(imported.join(&record)).unwrap();
    let middle = garbled.len() / 2;
    garbled[middle..middle + 64].fill(0xAB);
    std::fs::create_dir(d("empty")).unwrap();
    std::fs::write(d("a-file"), b"x").unwrap();
    std::fs::write(d("garbage.pt"), b"not a zip").unwrap();
    std::fs::write(d("notes.txt"), b"not an image").unwrap();
    std::fs::create_dir(d("taken")).unwrap();
    std::fs::write(d("taken/mine.txt"), b"x").unwrap();

    let run = |args: &[&str]| ember().args(args).output().unwrap();
    let path = |p: PathBuf| show(&p);
    let cases: Vec<(&str, Output, Vec<String>)> = vec![
        (
            "non-finite --lr",
            run(&["train", "--lr", "nan"]),
            vec!["--lr".into()],
        ),
        (
            "zero --epochs",
            run(&["train", "--epochs", "0"]),
            vec!["--epochs".into()],
        ),
        (
            "negative --momentum",
            run(&["train", "--recipe", "speedrun", "--momentum=-0.9"]),
            vec!["--momentum".into()],
        ),
        (
            "--momentum with Adam",
            run(&["train", "--recipe", "tch", "--momentum", "0.9"]),
            vec!["--momentum".into(), "--optimizer sgd".into(), "adam".into()],
        ),
        (
            "--nesterov without momentum",
            run(&["train", "--recipe", "flashlight", "--nesterov"]),
            vec!["--nesterov".into(), "--momentum".into()],
        ),
        (
            "--label-smoothing above 1",
            run(&["train", "--label-smoothing", "1.5"]),
            vec!["--label-smoothing".into(), "1.5".into()],
        ),
        (
            "one-cycle flag on a StepLR run",
            run(&["train", "--pct-start", "0.4"]),
            vec!["--pct-start".into(), "--schedule one-cycle".into()],
        ),
        (
            "one-cycle --pct-start outside 0..1",
            run(&["train", "--recipe", "speedrun", "--pct-start", "1.5"]),
            vec!["--pct-start".into(), "1.5".into()],
        ),
        (
            "momentum cycling with Adadelta",
            run(&["train", "--schedule", "one-cycle"]),
            vec!["--cycle-momentum".into(), "adadelta".into()],
        ),
        (
            "warm-up longer than the run",
            run(&[
                "train",
                "--schedule",
                "warmup-cosine",
                "--warmup-steps",
                "100000",
                "--epochs",
                "1",
                "--data-dir",
                mnist,
                "--run-dir",
                &path(d("w")),
            ]),
            vec!["--warmup-steps".into(), "938".into()],
        ),
        (
            "--translate as wide as the image",
            run(&["train", "--translate", "28"]),
            vec!["--translate".into(), "28".into()],
        ),
        (
            "--target-accuracy above 100",
            run(&["train", "--target-accuracy", "150"]),
            vec!["--target-accuracy".into(), "150".into()],
        ),
        (
            "negative --std",
            run(&["train", "--std=-1"]),
            vec!["--std".into()],
        ),
        (
            "--valid-size of everything",
            run(&[
                "train",
                "--valid-size",
                "60000",
                "--data-dir",
                mnist,
                "--run-dir",
                &path(d("v")),
            ]),
            vec!["--valid-size".into()],
        ),
        (
            "data folder that is a file",
            run(&["train", "--data-dir", &path(d("a-file"))]),
            vec![path(d("a-file")), "not a folder".into(), "--data-dir".into()],
        ),
        (
            "data folder without the files",
            run(&["train", "--data-dir", &path(d("empty"))]),
            vec![
                path(d("empty")),
                "train-images-idx3-ubyte".into(),
                "--data-dir".into(),
            ],
        ),
        (
            "--run-dir that holds files",
            run(&["train", "--data-dir", mnist, "--run-dir", &path(d("taken"))]),
            vec![path(d("taken")), "--run-dir".into()],
        ),
        (
            "--resume of imported weights",
            run(&["train", "--resume", &show(&imported), "--data-dir", mnist]),
            vec![path(imported.join("state.json")), "not resumed".into()],
        ),
        (
            "--resume of a folder that is no run",
            run(&["train", "--resume", &path(d("empty")), "--data-dir", mnist]),
            vec![path(d("empty")), "not a checkpoint".into()],
        ),
        (
            "eval of a garbled record",
            run(&[
                "eval",
                "--checkpoint",
                &show(&altered(&imported, &d("garbled"), &record, &garbled)),
                "--data-dir",
                mnist,
            ]),
            vec![path(d("garbled").join(&record)), "SHA-256".into()],
        ),
        (
            "eval with a broken config.json",
            run(&[
                "eval",
                "--checkpoint",
                &show(&altered(&imported, &d("config"), "config.json", b"{\"model\": 3")),
                "--data-dir",
                mnist,
            ]),
            vec![path(d("config").join("config.json"))],
        ),
        (
            "eval with a broken state.json",
            run(&[
                "eval",
                "--checkpoint",
                &show(&altered(&imported, &d("state"), "state.json", b"[]")),
                "--data-dir",
                mnist,
            ]),
            vec![path(d("state").join("state.json"))],
        ),
        (
            "eval of a state.json naming a file outside the run",
            run(&[
                "eval",
                "--checkpoint",
                &show(&altered(
                    &imported,
                    &d("foreign"),
                    "state.json",
                    state.replace(&record, "../../../../etc/passwd").as_bytes(),
                )),
                "--data-dir",
                mnist,
            ]),
            vec![
                path(d("foreign").join("state.json")),
                "../../../../etc/passwd".into(),
            ],
        ),
        (
            "import of a file that is no torch.save archive",
            run(&[
                "import",
                "--from",
                "pytorch",
                "--model",
                "tch-net",
                "--out",
                &path(d("i1")),
                &path(d("garbage.pt")),
            ]),
            vec![path(d("garbage.pt"))],
        ),
        (
            "import into the wrong model",
            run(&[
                "import",
                "--from",
                "pytorch",
                "--model",
                "flashlight",
                "--out",
                &path(d("i2")),
                &show(&pytorch_fixture()),
            ]),
            vec![show(&pytorch_fixture()), "not a flashlight-cnn state_dict".into()],
        ),
        (
            "import of a file that is not there",
            run(&[
                "import",
                "--from",
                "pytorch",
                "--model",
                "tch-net",
                "--out",
                &path(d("i3")),
                &path(d("nope.pt")),
            ]),
            vec![path(d("nope.pt"))],
        ),
        (
            "predict on a file that is no image",
            run(&["predict", "--checkpoint", &show(&imported), &path(d("notes.txt"))]),
            vec![
                "1 of 1 files could not be classified".into(),
                path(d("notes.txt")),
            ],
        ),
        (
            "plot of a folder without metrics",
            run(&["plot", &show(&imported), "--out", &path(d("p.png"))]),
            vec![show(&imported)],
        ),
    ];
    let mut wrong = Vec::new();
    for (what, out, needles) in &cases {
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        match one_line(out, &needles) {
            Ok(line) => eprintln!("{what:>50}: {line}"),
            Err(e) => wrong.push(format!("{what}: {e}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // A value clap parses through ember's own type: clap's format (exit 2), the flag and the
    // value named once, then what it takes.
    let out = run(&["train", "--device", "tpu"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let first = stderr.lines().next().unwrap();
    assert_eq!(
        first,
        "error: invalid value 'tpu' for '--device <DEVICE>': expected auto, cpu, cuda or cuda:N"
    );
    // A refused run leaves no directory behind.
    assert!(!d("v").exists() && !d("i1").exists() && !d("i2").exists() && !d("i3").exists());
}
