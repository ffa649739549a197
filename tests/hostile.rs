//! Hostile and careless inputs on the surfaces added since the first hostile corpus (issue 25):
//! image folders, CIFAR's folder layout, run directories edited by hand, names from the file
//! system. Each case is one `Error:` line naming the file, folder or field (exit 1), or is
//! handled and said so; nothing silently wrong, no panic, no hang, no control character from a
//! file name on the terminal. Each reproduced on bb651f8 before its fix.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::ember;
use image::{GrayImage, Luma, Rgb, RgbImage};

/// What a command printed on stderr and stdout.
fn outputs(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stderr).to_string(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

/// Asserts that `cmd` fails with exit 1 and one `Error:` line that holds each of `expected` and
/// no control character; returns the line.
fn fails_with(cmd: &mut assert_cmd::Command, expected: &[&str]) -> String {
    let out = cmd.timeout(Duration::from_secs(300)).output().unwrap();
    let (stderr, stdout) = outputs(&out);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}\nstdout: {stdout}");
    let line = stderr.strip_suffix('\n').unwrap_or(&stderr);
    assert!(
        line.starts_with("Error: ") && !line.contains("panicked"),
        "{stderr}"
    );
    assert!(
        !line.chars().any(char::is_control),
        "control characters: {line:?}"
    );
    for e in expected {
        assert!(line.contains(e), "expected {e:?} in: {line}");
    }
    line.to_string()
}

/// Asserts that `cmd` succeeds; returns its stdout.
fn succeeds(cmd: &mut assert_cmd::Command) -> String {
    let out = cmd.timeout(Duration::from_secs(300)).output().unwrap();
    let (stderr, stdout) = outputs(&out);
    assert!(out.status.success(), "stderr: {stderr}\nstdout: {stdout}");
    stdout
}

/// A 28x28 grey PNG whose pattern depends on its class and index.
fn grey_png(path: &Path, class: u32, i: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    GrayImage::from_fn(28, 28, |x, y| {
        let on = match class % 3 {
            0 => x < 14,
            1 => y < 14,
            _ => (x + y) % 7 < 3,
        };
        Luma([if on {
            200 + (i % 50) as u8
        } else {
            (x * y + i) as u8 % 40
        }])
    })
    .save(path)
    .unwrap();
}

/// A folder of `per_class` grey images in each of `classes`.
fn folder(root: &Path, classes: &[&str], per_class: u32) {
    for (c, class) in classes.iter().enumerate() {
        for i in 0..per_class {
            grey_png(&root.join(class).join(format!("{i}.png")), c as u32, i);
        }
    }
}

fn data_cmd(root: &Path, extra: &[&str]) -> assert_cmd::Command {
    let mut cmd = ember();
    cmd.args(["data", "--dataset"])
        .arg(format!("folder:{}", root.display()))
        .args(["--val-fraction", "0.34"])
        .args(extra);
    cmd
}

/// `ember train` of one speedrun epoch on the CPU on the folder `root`, into `run`.
fn train_cmd(root: &Path, run: &Path, val_fraction: &str, extra: &[&str]) -> assert_cmd::Command {
    let mut cmd = ember();
    cmd.args([
        "train", "--recipe", "speedrun", "--epochs", "1", "--device", "cpu",
    ])
    .args(["--val-fraction", val_fraction, "--dataset"])
    .arg(format!("folder:{}", root.display()))
    .arg("--run-dir")
    .arg(run)
    .args(extra);
    cmd
}

/// A noisy RGB JPEG, big enough that cutting it leaves a partial scan.
fn jpeg_bytes() -> Vec<u8> {
    let img = RgbImage::from_fn(96, 96, |x, y| {
        let v = x.wrapping_mul(2_654_435_761).wrapping_add(y.wrapping_mul(40_503)) >> 7;
        Rgb([v as u8, (v >> 8) as u8, (x * y) as u8])
    });
    let mut bytes = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Jpeg)
        .unwrap();
    bytes
}

#[test]
fn a_truncated_jpeg_is_an_error_or_skipped_like_any_unreadable_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("photos");
    folder(&root, &["a", "b"], 6);
    let full = jpeg_bytes();
    std::fs::write(root.join("a/whole.jpg"), &full).unwrap();
    // A whole JPEG reads (as colour: the set becomes RGB).
    let stdout = succeeds(&mut data_cmd(&root, &[]));
    assert!(stdout.contains("read 13 images"), "{stdout}");
    // Cut anywhere in its scan, it is refused by name (the decoder would fill the rest grey).
    for cut in [full.len() / 3, full.len() * 3 / 5, full.len() - 2] {
        std::fs::write(root.join("a/cut.jpg"), &full[..cut]).unwrap();
        fails_with(
            &mut data_cmd(&root, &[]),
            &["cut.jpg: ", "truncated JPEG", "--skip-bad-images"],
        );
    }
    let stdout = succeeds(&mut data_cmd(&root, &["--skip-bad-images"]));
    assert!(stdout.contains("skipped 1 unreadable image"), "{stdout}");
    assert!(stdout.contains("cut.jpg: truncated JPEG"), "{stdout}");
}

#[test]
fn class_folders_changed_after_training_are_refused_by_eval_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("shapes");
    folder(&root, &["bars", "rings", "stripes"], 8);
    let run = dir.path().join("run");
    succeeds(&mut train_cmd(&root, &run, "0.25", &[]));
    let eval = || {
        let mut cmd = ember();
        cmd.args(["eval", "--device", "cpu", "--checkpoint"]).arg(&run);
        cmd
    };
    succeeds(&mut eval());
    // Renamed: same count, every label after it would shift.
    std::fs::rename(root.join("rings"), root.join("circles")).unwrap();
    fails_with(
        &mut eval(),
        &[
            "3 classes (bars, circles, stripes), without rings, with circles new",
            "trained on 3 classes (bars, rings, stripes)",
        ],
    );
    fails_with(
        ember().args(["train", "--resume"]).arg(&run),
        &["without rings", "the labels would not match"],
    );
    std::fs::rename(root.join("circles"), root.join("rings")).unwrap();
    // Added, then removed.
    folder(&root.join("zigzags"), &[""], 8);
    fails_with(&mut eval(), &["4 classes", "with zigzags new"]);
    std::fs::remove_dir_all(root.join("zigzags")).unwrap();
    std::fs::remove_dir_all(root.join("bars")).unwrap();
    fails_with(&mut eval(), &["2 classes (rings, stripes), without bars"]);
    fails_with(ember().args(["train", "--resume"]).arg(&run), &["without bars"]);
}

#[test]
fn cifar_in_burn_datasets_layout_needs_all_its_classes() {
    let dir = tempfile::tempdir().unwrap();
    for split in ["train", "test"] {
        for (c, class) in ["airplane", "automobile", "bird"].iter().enumerate() {
            for i in 0..2 {
                let path = dir.path().join(split).join(class).join(format!("{i}.png"));
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                RgbImage::from_fn(32, 32, |x, _| Rgb([(x * c as u32) as u8, i as u8, 9]))
                    .save(path)
                    .unwrap();
            }
        }
    }
    fails_with(
        ember()
            .args(["data", "--dataset", "cifar10", "--offline", "--data-dir"])
            .arg(dir.path()),
        &[
            "3 of cifar10's 10 class folders, without cat, deer, dog, frog, horse, ...",
            "--dataset folder:PATH",
        ],
    );
}

/// A trained run whose files the tests below edit (copies of it).
fn trained_run(dir: &Path) -> PathBuf {
    let root = dir.join("images");
    folder(&root, &["a", "b"], 6);
    let run = dir.join("run");
    succeeds(&mut train_cmd(&root, &run, "0.34", &[]));
    run
}

/// A copy of `run` with `file`'s JSON changed by `edit`.
fn edited(run: &Path, to: &Path, file: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(run).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() && entry.file_name() != ".lock" {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
    let path = to.join(file);
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    to.to_owned()
}

#[test]
fn edited_run_files_are_one_line_errors_naming_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let image = dir.path().join("images/a/0.png");
    let predict = |run: &Path| {
        let mut cmd = ember();
        cmd.args(["predict", "--device", "cpu", "--checkpoint"])
            .arg(run)
            .arg(&image);
        cmd
    };
    let eval = |run: &Path| {
        let mut cmd = ember();
        cmd.args(["eval", "--device", "cpu", "--checkpoint"]).arg(run);
        cmd
    };
    succeeds(&mut predict(&run));
    // config.json: image shapes no reader makes, or that no memory holds.
    for (i, (input, expected)) in [
        (serde_json::json!([2, 28, 28]), "config.json: the run's images have 2 channels (input 2x28x28); ember predict reads image files as grey (1) or RGB (3)"),
        (serde_json::json!([0, 28, 28]), "config.json: input 0x28x28: the channels must be 1 (grey) to 4"),
        (serde_json::json!([1, 100000, 100000]), "config.json: input 1x100000x100000: the sides must be 1 to 4096"),
    ]
    .into_iter()
    .enumerate()
    {
        let copy = edited(&run, &dir.path().join(format!("input{i}")), "config.json", |c| {
            let [ch, h, w] = [input[0].clone(), input[1].clone(), input[2].clone()];
            c["input"] = serde_json::json!({"channels": ch, "height": h, "width": w});
            c["normalization"] = serde_json::json!({"mean": [0.5], "std": [0.25]});
        });
        fails_with(&mut predict(&copy), &[expected]);
    }
    // config.json values are named as the file's fields, not as flags eval does not have.
    let copy = edited(&run, &dir.path().join("batch"), "config.json", |c| {
        c["batch_size"] = 0.into()
    });
    let line = fails_with(
        &mut eval(&copy),
        &["config.json: batch_size must be at least 1, got 0"],
    );
    assert!(!line.contains("--"), "{line}");
    let copy = edited(&run, &dir.path().join("std"), "config.json", |c| {
        c["normalization"]["std"] = serde_json::json!([1e-45])
    });
    fails_with(
        &mut eval(&copy),
        &["config.json: normalization.std must be at least 0.000001"],
    );
    // state.json: counters that do not add up (a wrapped global step), a partial sum past f64.
    for (name, field, value) in [
        ("wrapped", "global_step", serde_json::json!(u64::MAX)),
        ("huge", "partial_loss_sum", serde_json::json!(1e308)),
    ] {
        let copy = edited(&run, &dir.path().join(name), "state.json", |s| {
            s["epoch"] = 0.into();
            if field != "global_step" {
                s["global_step"] = 0.into();
            }
            s[field] = value;
        });
        fails_with(
            ember().args(["train", "--resume"]).arg(&copy),
            &["state.json: ", field, "the checkpoint state is corrupt"],
        );
    }
}

#[test]
fn a_chart_of_infinite_or_huge_values_is_drawn_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines: Vec<String> = csv.lines().map(String::from).collect();
    let first = lines[0].clone();
    let header: Vec<&str> = first.split(',').collect();
    let row: Vec<String> = lines[1].split(',').map(String::from).collect();
    for (i, value) in ["inf", "1e308", "-1e308", "NaN"].iter().enumerate() {
        let mut r = row.clone();
        r[header.iter().position(|h| *h == "epoch").unwrap()] = (i + 2).to_string();
        r[header.iter().position(|h| *h == "train_loss").unwrap()] = value.to_string();
        lines.push(r.join(","));
    }
    std::fs::write(run.join("metrics.csv"), lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("curves.png");
    // Looped forever before (plotters on an infinite axis range).
    succeeds(ember().arg("plot").arg(&run).arg("--out").arg(&out));
    assert!(std::fs::metadata(&out).unwrap().len() > 5_000);
}

#[test]
fn names_from_the_file_system_reach_the_terminal_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("names");
    let evil = "evil\u{1b}]0;owned\u{7}\nError: forged";
    folder(&root, &[evil, "plain"], 6);
    let stdout = succeeds(&mut data_cmd(&root, &[]));
    assert!(!stdout.chars().any(|c| c.is_control() && c != '\n'), "{stdout:?}");
    assert!(!stdout.contains("\nError: forged"), "{stdout}");
    assert!(
        stdout.contains("evil\\u{1b}]0;owned\\u{7}\\nError: forged"),
        "{stdout}"
    );
    // In an error too: a bad file in that folder.
    std::fs::write(root.join(evil).join("x\u{1b}[2J.png"), b"not an image").unwrap();
    fails_with(&mut data_cmd(&root, &[]), &["x\\u{1b}[2J.png: not a PNG or JPEG"]);
    // And in skipped.txt, one line per file.
    let run = dir.path().join("run");
    succeeds(&mut train_cmd(&root, &run, "0.34", &["--skip-bad-images"]));
    let listed = std::fs::read_to_string(run.join("skipped.txt")).unwrap();
    assert_eq!(listed.lines().count(), 1, "{listed:?}");
    assert!(
        !listed.trim_end().chars().any(|c| c.is_control() && c != '\t'),
        "{listed:?}"
    );
}

#[cfg(unix)]
#[test]
fn odd_folders_say_what_is_wrong() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();

    // A class folder whose name is not UTF-8 is named, not reported as empty elsewhere.
    let root = dir.path().join("latin1");
    folder(&root, &["plain", "other"], 4);
    let latin1 = root.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    grey_png(&latin1.join("0.png"), 0, 0);
    fails_with(
        &mut data_cmd(&root, &[]),
        &["caf\u{fffd}: a class folder whose name is not UTF-8"],
    );

    // A dangling symbolic link named like an image: an unreadable image, skippable.
    let root = dir.path().join("links");
    folder(&root, &["a", "b"], 6);
    std::os::unix::fs::symlink(root.join("a/gone.png"), root.join("a/ghost.png")).unwrap();
    fails_with(
        &mut data_cmd(&root, &[]),
        &[
            "ghost.png: a symbolic link to a file that does not exist",
            "--skip-bad-images",
        ],
    );
    let stdout = succeeds(&mut data_cmd(&root, &["--skip-bad-images"]));
    assert!(stdout.contains("skipped 1 unreadable image"), "{stdout}");

    // One class: nothing to learn (it "trained" to 100% and printed "target 99% reached").
    let root = dir.path().join("one");
    folder(&root, &["only"], 6);
    let run = dir.path().join("one-run");
    fails_with(
        &mut train_cmd(&root, &run, "0.34", &[]),
        &["one class (only): nothing to learn"],
    );
    assert!(!run.exists());

    // Two images a class: half is held out, and the output says so.
    let root = dir.path().join("small");
    folder(&root, &["a", "b"], 2);
    let mut cmd = ember();
    cmd.args(["data", "--val-fraction", "0.1", "--dataset"])
        .arg(format!("folder:{}", root.display()));
    let stdout = succeeds(&mut cmd);
    assert!(
        stdout.contains("test set: 2 of 4 images held out (50%; 10% of each class was asked"),
        "{stdout}"
    );

    // Odd sizes are resized, and a few of them are named.
    let root = dir.path().join("sizes");
    folder(&root, &["a", "b"], 6);
    GrayImage::from_fn(30, 20, |x, _| Luma([x as u8]))
        .save(root.join("b/wide.png"))
        .unwrap();
    let stdout = succeeds(&mut data_cmd(&root, &[]));
    assert!(stdout.contains("1 resized to 28x28 ("), "{stdout}");
    assert!(stdout.contains("wide.png 30x20)"), "{stdout}");
}

#[path = "common/torch_save.rs"]
mod torch_save;

/// ResNet-20's state_dict as `torch.save` bytes, `edit` applied to each tensor's values first
/// (by name); counters left out when `counters` is false.
fn resnet20_file(edit: impl Fn(&str, &mut Vec<f32>), counters: bool) -> Vec<u8> {
    use ember::model::ModelKind;
    let model = ModelKind::Resnet20.init::<burn::backend::NdArray>(&Default::default());
    let mut tensors = Vec::new();
    let mut storages = Vec::new();
    for (i, (name, data)) in ember::import::to_pytorch_tensors(&model).into_iter().enumerate() {
        let key = i.to_string();
        if name.ends_with("num_batches_tracked") {
            if counters {
                let mut t = torch_save::Tensor::contiguous(&name, &key, &[]);
                t.class = "LongStorage".into();
                t.storage_len = 1;
                tensors.push(t);
                storages.push((key, 7i64.to_le_bytes().to_vec()));
            }
            continue;
        }
        let shape = data.shape.to_vec();
        let mut values = data.to_vec::<f32>().unwrap();
        edit(&name, &mut values);
        tensors.push(torch_save::Tensor::contiguous(&name, &key, &shape));
        storages.push((key, torch_save::f32_bytes(&values)));
    }
    torch_save::archive(&torch_save::pickle(&tensors), &storages)
}

#[test]
fn imported_batch_norm_variances_below_zero_are_refused_and_missing_counters_are_zero() {
    use ember::model::ModelKind;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("resnet20.pt");
    let import = |bytes: Vec<u8>| {
        std::fs::write(&file, bytes).unwrap();
        ember::import::from_pytorch_file::<burn::backend::NdArray>(
            ModelKind::Resnet20,
            &file,
            &Default::default(),
        )
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
    };
    import(resnet20_file(|_, _| {}, true)).unwrap();
    // A negative running variance made eval's batch norm NaN, which the fused ReLU hid.
    let err = import(resnet20_file(
        |name, v| {
            if name == "stages.0.0.bn1.running_var" {
                v[3] = -0.5;
            }
        },
        true,
    ))
    .unwrap_err();
    assert!(
        err.contains("stages.0.0.bn1.running_var holds -0.5 at index 3: a variance cannot be negative"),
        "{err}"
    );
    // state_dicts from before PyTorch 0.4.1 have no counters: PyTorch loads them at 0.
    let model = import(resnet20_file(|_, _| {}, false)).unwrap();
    let counters: Vec<f32> = ember::import::to_pytorch_tensors(&model)
        .into_iter()
        .filter(|(name, _)| name.ends_with("num_batches_tracked"))
        .flat_map(|(_, d)| d.to_vec::<f32>().unwrap())
        .collect();
    assert!(
        !counters.is_empty() && counters.iter().all(|&c| c == 0.0),
        "{counters:?}"
    );
}

/// The kernels' switches are checked by the binary: one line, not a panic in the first kernel.
#[test]
fn misspelt_kernel_switches_are_one_line_errors() {
    for (var, value, expected) in [
        ("EMBER_SIMD", "avx1024", "EMBER_SIMD=\"avx1024\": expected `auto`"),
        ("EMBER_KERNELS", "fast", "EMBER_KERNELS=\"fast\": expected `cpu`"),
    ] {
        fails_with(
            ember().env(var, value).args(["info", "--device", "cpu"]),
            &[expected],
        );
    }
    let stdout = succeeds(
        ember()
            .env("EMBER_SIMD", "portable")
            .args(["info", "--device", "cpu"]),
    );
    assert!(
        stdout.contains("vector instructions: portable (EMBER_SIMD)"),
        "{stdout}"
    );
}

/// `--image-size 4096`: the dataset fits its budget, but a batch's activations do not fit in
/// memory (ResNet-20 aborted on a 3 GiB allocation). One line before any training, naming what
/// an image needs and what would fit; no run directory left. ResNet-18 at 4096x4096 needs about
/// 94 GiB an image, more than any machine this runs on, whatever its memory.
#[test]
fn batches_whose_activations_do_not_fit_are_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    folder(&root, &["a", "b"], 2);
    let run = dir.path().join("run");
    fails_with(
        &mut train_cmd(
            &root,
            &run,
            "0.5",
            &["--model", "resnet18", "--image-size", "4096"],
        ),
        &[
            "resnet18 on 1x4096x4096 images needs about",
            "an image in a training step: a batch of 2 needs",
            "beside the dataset",
            "not one image fits: lower --image-size",
        ],
    );
    assert!(!run.exists(), "a run directory was left");
}

/// SIGTERM (or Ctrl-C) while a folder is decoded: decoding stops, the new run directory is
/// removed, exit 130 as the README says (it was 143 with only `.lock` left). The signal comes
/// from the process itself at its second image (`EMBER_TERM_AT`, src/faults.rs), so the test
/// does not depend on when decoding happens to run.
#[test]
fn sigterm_while_decoding_exits_130_and_leaves_no_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    folder(&root, &["a", "b"], 6);
    let run = dir.path().join("run");
    let out = train_cmd(&root, &run, "0.34", &[])
        .env("EMBER_TERM_AT", "decode:image@2")
        .timeout(Duration::from_secs(300))
        .output()
        .unwrap();
    let (stderr, _) = outputs(&out);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("Error: ")).count(),
        1,
        "{stderr}"
    );
    assert!(!run.exists(), "the run directory was left");
}
