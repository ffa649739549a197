//! ember as `cargo install --path .` leaves it: run from folders outside the clone, offline, it
//! trains on the committed MNIST (the clone it was built from) without making a `data/` folder
//! where it was started, and `eval` of the run from yet another folder finds the data again.

use std::process::Command;

#[test]
fn trains_and_evaluates_from_folders_outside_the_clone() {
    let elsewhere = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let run = elsewhere.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .current_dir(elsewhere.path())
        .env("EMBER_OFFLINE", "true")
        .env_remove("EMBER_DATA_DIR")
        .args([
            "train",
            "--epochs",
            "1",
            "--limit-train",
            "512",
            "--limit-test",
            "200",
            "--device",
            "cpu",
            "-q",
        ])
        .arg("--run-dir")
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !elsewhere.path().join("data").exists(),
        "made a data/ folder where it was started"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("config.json")).unwrap()).unwrap();
    let recorded = std::path::PathBuf::from(config["data_dir"].as_str().unwrap());
    assert_eq!(
        recorded.canonicalize().unwrap(),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/mnist")
            .canonicalize()
            .unwrap()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .current_dir(other.path())
        .env("EMBER_OFFLINE", "true")
        .env_remove("EMBER_DATA_DIR")
        .args(["eval", "--device", "cpu", "--checkpoint"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("/200)"));
    assert!(!other.path().join("data").exists());
}
