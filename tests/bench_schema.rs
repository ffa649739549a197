//! `ember bench` writes the record both frameworks share (benches/schema.json), and every
//! committed result, ember's and PyTorch's, still validates against it.

mod common;

use common::{ember, repo_mnist};

use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn validator() -> jsonschema::Validator {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("benches/schema.json")).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn assert_valid(validator: &jsonschema::Validator, record: &Value, what: &str) {
    let errors: Vec<String> = validator
        .iter_errors(record)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match benches/schema.json:\n{}",
        errors.join("\n")
    );
}

#[test]
fn ember_bench_json_matches_the_shared_schema() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("net64.json");
    let out = ember()
        .args([
            "bench",
            "--scenario",
            "net64",
            "--device",
            "cpu",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--repeats",
            "2",
            "--eval-repeats",
            "1",
            "--offline",
            "--data-dir",
        ])
        .arg(repo_mnist())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("net64    ember"), "{stdout}");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_valid(&validator(), &record, "ember bench's record");
    assert_eq!(record["train_step_ms"]["samples"].as_array().unwrap().len(), 2);
    assert_eq!(record["threads"].as_u64().unwrap() as usize, rayon_threads());
    assert!(
        record["memory"]["peak_rss_bytes"].as_u64().unwrap() > 100 << 20,
        "{}",
        record["memory"]
    );
    assert!(record["gpu_utilization"].is_null());

    // The schema is strict: an extra field or a wrong type is caught.
    let mut extra = record.clone();
    extra["speedup"] = Value::from(10);
    assert!(!validator().is_valid(&extra));
    let mut wrong = record;
    wrong["train_step_ms"]["median"] = Value::from("fast");
    assert!(!validator().is_valid(&wrong));
}

fn rayon_threads() -> usize {
    ember::backend::cpu_threads()
}

#[test]
fn committed_results_of_both_frameworks_match_the_schema() {
    let results: Vec<PathBuf> = std::fs::read_dir(root().join("benches/results"))
        .map(|dir| {
            dir.filter_map(|e| Some(e.ok()?.path().join("results.json")))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    let validator = validator();
    let mut frameworks = std::collections::BTreeSet::new();
    for path in &results {
        let records: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for (i, r) in records.iter().enumerate() {
            assert_valid(&validator, r, &format!("{} record {i}", path.display()));
            frameworks.insert(r["framework"].as_str().unwrap().to_string());
        }
    }
    if !results.is_empty() {
        assert_eq!(frameworks.into_iter().collect::<Vec<_>>(), ["ember", "pytorch"]);
    }
}

/// `ember compare` with its quickest settings on net64, on the CPU, into `out`.
fn quick_compare(out: &Path, extra: &[&str]) -> std::process::Output {
    ember()
        .args(["compare", "--device", "cpu", "--scenarios", "net64"])
        .args([
            "--warmup",
            "1",
            "--steps",
            "1",
            "--repeats",
            "1",
            "--eval-repeats",
            "1",
        ])
        .args(extra)
        .arg("--offline")
        .arg("--data-dir")
        .arg(repo_mnist())
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

fn results(out: &Path) -> (Vec<Value>, String) {
    let records: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    (records, std::fs::read_to_string(out.join("results.md")).unwrap())
}

/// A GPU is lent for minutes: a measurement that fails must not cost the others. Here every
/// PyTorch measurement fails (its script exits 3); ember's record is still written, valid, and
/// the failures are listed, and the command ends in one `Error:` line.
#[test]
fn compare_keeps_what_finished_when_a_measurement_fails() {
    let dir = tempfile::tempdir().unwrap();
    let failing = dir.path().join("fails.py");
    std::fs::write(&failing, "import sys\nsys.exit(3)\n").unwrap();
    let out = dir.path().join("results");
    let run = quick_compare(
        &out,
        &[
            "--python",
            "python3",
            "--pytorch-script",
            failing.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("Error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("2 measurement(s) failed"), "{}", errors[0]);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let (records, md) = results(&out);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["framework"], "ember");
    assert_valid(&validator(), &records[0], "ember's record");
    assert!(
        md.contains("- net64 pytorch preloaded:") && md.contains("- net64 pytorch dataloader:"),
        "{md}"
    );
}

/// Without torch on the machine: ember's records only, said so, and a clean exit.
#[test]
fn compare_without_pytorch_writes_embers_records() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results");
    let run = quick_compare(&out, &["--without-pytorch"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (records, md) = results(&out);
    assert_eq!(records.len(), 1);
    assert_valid(&validator(), &records[0], "ember's record");
    assert!(md.contains("PyTorch was left out"), "{md}");
    // The training GFLOP/s and its fraction of the CPU's measured GEMM peak, in the table.
    let row = md
        .lines()
        .find(|l| l.starts_with("| net64 "))
        .expect("net64's row");
    let last = row.trim_end_matches('|').rsplit('|').next().unwrap().trim();
    assert!(
        last.ends_with("%)"),
        "GFLOP/s (% of peak) cell: {last:?} in {row}"
    );
}
