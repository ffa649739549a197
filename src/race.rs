//! `ember compare --time-to-accuracy`: ember and its PyTorch twin (`benches/pytorch/recipe.py`)
//! each train a recipe with a target accuracy (the `speedrun` recipe: 99.0% on MNIST) from a
//! fresh process, one after the other, `rounds` times, on the same device and thread count.
//! Each side's time runs from its own process start to the end of the first epoch whose test
//! accuracy reaches the target: data loading, device start-up and evaluation included.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::{Recipe, TrainConfig};

/// One side's run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RaceRecord {
    pub framework: String,
    pub round: usize,
    /// Epochs trained (the last is the one that reached the target, if any).
    pub epochs: usize,
    /// Test accuracy after the last epoch, percent.
    pub test_accuracy: f64,
    pub reached: bool,
    /// From the process's start to the end of the last epoch's evaluation.
    pub seconds: f64,
}

pub struct RaceOptions {
    pub recipe: Recipe,
    pub device_arg: String,
    pub threads: usize,
    pub python: String,
    pub script: PathBuf,
    pub data_dir: PathBuf,
    pub rounds: usize,
}

/// The epoch count, accuracy and time ember printed: its epoch lines
/// ("epoch   2/3 ... test ... 99.12% ...") and, when reached, the target line.
fn parse_ember(stdout: &str, round: usize) -> Result<RaceRecord> {
    let mut record = RaceRecord {
        framework: "ember".into(),
        round,
        epochs: 0,
        test_accuracy: 0.0,
        reached: false,
        seconds: 0.0,
    };
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("target ") {
            // "target 99% reached after epoch 2: 99.12% (9912/10000) at 41.20 s since ..."
            let epoch = rest
                .split("after epoch ")
                .nth(1)
                .and_then(|r| r.split(':').next());
            let accuracy = rest.split(": ").nth(1).and_then(|r| r.split('%').next());
            let seconds = rest.split(" at ").nth(1).and_then(|r| r.split(' ').next());
            match (epoch, accuracy, seconds) {
                (Some(e), Some(a), Some(s)) => {
                    record.epochs = e.parse()?;
                    record.test_accuracy = a.parse()?;
                    record.seconds = s.parse()?;
                    record.reached = true;
                }
                _ => bail!("cannot read ember's line {line:?}"),
            }
        }
    }
    Ok(record)
}

/// Runs the race and writes `time_to_accuracy.json` and `.md` into `out`; returns the table.
pub fn run(opts: &RaceOptions, out: &Path) -> Result<String> {
    let config = opts.recipe.config();
    let Some(target) = config.target_accuracy else {
        bail!(
            "--recipe {} has no target accuracy to race to",
            opts.recipe.name()
        );
    };
    let exe = std::env::current_exe().context("cannot find the ember executable")?;
    let tmp = std::env::temp_dir().join(format!("ember-race-{}", std::process::id()));
    let mut records = Vec::new();
    for round in 1..=opts.rounds {
        let run_dir = tmp.join(format!("ember-{round}"));
        let _ = std::fs::remove_dir_all(&run_dir);
        let mut cmd = Command::new(&exe);
        cmd.args([
            "train",
            "--recipe",
            opts.recipe.name(),
            "--device",
            &opts.device_arg,
        ])
        .args(["--save-model=false", "--offline"])
        .arg("--data-dir")
        .arg(&opts.data_dir)
        .arg("--run-dir")
        .arg(&run_dir);
        let output = cmd.output().with_context(|| format!("cannot start {cmd:?}"))?;
        if !output.status.success() {
            bail!(
                "{cmd:?} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let mut ember = parse_ember(&stdout, round)?;
        let saved: TrainConfig = serde_json::from_str(
            &std::fs::read_to_string(run_dir.join("config.json")).context("ember wrote no config.json")?,
        )?;
        if !ember.reached {
            // Not reached in the recipe's epochs: the final line's accuracy, all epochs.
            ember.epochs = saved.epochs;
            ember.test_accuracy = final_accuracy(&stdout).unwrap_or(0.0);
            ember.seconds = f64::NAN;
        }
        records.push(ember);

        let json = tmp.join(format!("pytorch-{round}.json"));
        let mut cmd = Command::new(&opts.python);
        cmd.arg(&opts.script)
            .arg("--config")
            .arg(run_dir.join("config.json"))
            .arg("--data-dir")
            .arg(&opts.data_dir)
            // ember's cpu / cuda:N are PyTorch's device names too.
            .args(["--device", &opts.device_arg])
            .args(["--threads", &opts.threads.to_string()])
            .arg("--json")
            .arg(&json);
        let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
        if !status.success() {
            bail!("{cmd:?} failed ({status})");
        }
        let epochs: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
        let last = epochs.last().context("recipe.py wrote no records")?;
        let number = |key: &str| {
            last[key]
                .as_f64()
                .with_context(|| format!("recipe.py record lacks {key}"))
        };
        let reached = last["reached"].as_bool().unwrap_or(false);
        records.push(RaceRecord {
            framework: "pytorch".into(),
            round,
            epochs: number("epoch")? as usize,
            test_accuracy: number("test_accuracy")?,
            reached,
            seconds: if reached {
                number("since_process_start")?
            } else {
                f64::NAN
            },
        });
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let table = table(&records, target);
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    std::fs::write(
        out.join("time_to_accuracy.json"),
        serde_json::to_string_pretty(&records)?,
    )?;
    std::fs::write(out.join("time_to_accuracy.md"), &table)?;
    Ok(table)
}

fn final_accuracy(stdout: &str) -> Option<f64> {
    let line = stdout.lines().find(|l| l.starts_with("final:"))?;
    line.split("accuracy ").nth(1)?.split('%').next()?.parse().ok()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The per-round table and the medians, ember / PyTorch.
pub fn table(records: &[RaceRecord], target: f64) -> String {
    let mut s = format!(
        "Time to {target}% test accuracy, seconds from process start (data loading and evaluation \
         included); epochs trained; accuracy at the stop.\n\n\
         | round | ember s | ember epochs | ember accuracy | PyTorch s | PyTorch epochs | PyTorch accuracy |\n\
         |---|---|---|---|---|---|---|\n"
    );
    let side = |fw: &str, round: usize| records.iter().find(|r| r.framework == fw && r.round == round);
    let rounds = records.iter().map(|r| r.round).max().unwrap_or(0);
    let cell = |r: Option<&RaceRecord>| match r {
        Some(r) if r.reached => format!("{:.2} | {} | {:.2}%", r.seconds, r.epochs, r.test_accuracy),
        Some(r) => format!("not reached | {} | {:.2}%", r.epochs, r.test_accuracy),
        None => "– | – | –".into(),
    };
    for round in 1..=rounds {
        s += &format!(
            "| {round} | {} | {} |\n",
            cell(side("ember", round)),
            cell(side("pytorch", round))
        );
    }
    let times = |fw: &str| -> Vec<f64> {
        records
            .iter()
            .filter(|r| r.framework == fw && r.reached)
            .map(|r| r.seconds)
            .collect()
    };
    let (e, p) = (times("ember"), times("pytorch"));
    if !e.is_empty() && !p.is_empty() {
        let (me, mp) = (median(e), median(p));
        s += &format!(
            "\nMedian: ember {me:.2} s, PyTorch {mp:.2} s: ember / PyTorch = {:.2}\n",
            me / mp
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_embers_target_line() {
        let out = "epoch   1/3  lr 0.008  train loss 0.41 ...\n\
                   target 99% reached after epoch 2: 99.12% (9912/10000) at 41.20 s since the process started\n\
                   final: test loss 0.0300  accuracy 99.12% (9912/10000)\n";
        let r = parse_ember(out, 1).unwrap();
        assert_eq!(
            (r.epochs, r.test_accuracy, r.seconds, r.reached),
            (2, 99.12, 41.2, true)
        );
        assert_eq!(final_accuracy(out), Some(99.12));
    }

    #[test]
    fn table_gives_medians_of_reached_rounds() {
        let rec = |fw: &str, round, seconds| RaceRecord {
            framework: fw.into(),
            round,
            epochs: 2,
            test_accuracy: 99.1,
            reached: true,
            seconds,
        };
        let t = table(
            &[
                rec("ember", 1, 10.0),
                rec("pytorch", 1, 20.0),
                rec("ember", 2, 12.0),
                rec("pytorch", 2, 30.0),
            ],
            99.0,
        );
        assert!(
            t.contains("| 1 | 10.00 | 2 | 99.10% | 20.00 | 2 | 99.10% |"),
            "{t}"
        );
        assert!(t.contains("ember / PyTorch = 0.44"), "{t}");
    }
}
