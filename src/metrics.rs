//! Per-epoch metrics of a run: `metrics.csv` (rewritten atomically after every epoch) and the
//! `curves.png` drawn from it.

use std::path::{Path, PathBuf};

use crate::files::{write_atomic, FileError};
use crate::plot::{line_panels, Line, Panel, PlotError};

pub const METRICS_FILE: &str = "metrics.csv";
pub const CURVES_FILE: &str = "curves.png";

const HEADER: &str =
    "epoch,step,lr,train_loss,valid_loss,valid_accuracy,test_loss,test_accuracy,seconds,images_per_sec";

/// One epoch's line of `metrics.csv`. Accuracies are fractions; `step` counts optimizer steps
/// since the start of the run; `seconds` is the epoch's training time.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsRow {
    pub epoch: usize,
    pub step: usize,
    pub lr: f64,
    pub train_loss: f64,
    pub valid_loss: Option<f64>,
    pub valid_accuracy: Option<f64>,
    pub test_loss: f64,
    pub test_accuracy: f64,
    pub seconds: f64,
    pub images_per_sec: f64,
}

/// Errors reading metrics; they name the file and line.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}:{line}: {reason}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error(transparent)]
    Write(#[from] FileError),
    #[error(transparent)]
    Plot(#[from] PlotError),
}

fn opt(v: Option<f64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// `rows` as CSV text, header first.
pub fn to_csv(rows: &[MetricsRow]) -> String {
    let mut s = format!("{HEADER}\n");
    for r in rows {
        s += &format!(
            "{},{},{},{},{},{},{},{},{},{}\n",
            r.epoch,
            r.step,
            r.lr,
            r.train_loss,
            opt(r.valid_loss),
            opt(r.valid_accuracy),
            r.test_loss,
            r.test_accuracy,
            r.seconds,
            r.images_per_sec
        );
    }
    s
}

pub fn write(dir: &Path, rows: &[MetricsRow]) -> Result<(), MetricsError> {
    Ok(write_atomic(&dir.join(METRICS_FILE), to_csv(rows).as_bytes())?)
}

/// Reads `dir/metrics.csv`; a run without epochs yet has an empty list.
/// [`read`], with no rows when the run has no `metrics.csv` yet. Any other failure (an
/// unreadable or non-UTF-8 file) is an error: taking it for "no metrics" would drop the rows.
pub fn read_if_present(dir: &Path) -> Result<Vec<MetricsRow>, MetricsError> {
    match read(dir) {
        Err(MetricsError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        other => other,
    }
}

pub fn read(dir: &Path) -> Result<Vec<MetricsRow>, MetricsError> {
    let path = dir.join(METRICS_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| MetricsError::Io {
        path: path.clone(),
        error: source,
    })?;
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h == HEADER => {}
        _ => {
            return Err(MetricsError::Parse {
                path,
                line: 1,
                reason: format!("expected the header {HEADER}"),
            })
        }
    }
    lines
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, line)| {
            let bad = |reason: String| MetricsError::Parse {
                path: path.clone(),
                line: i + 1,
                reason,
            };
            let f: Vec<&str> = line.split(',').collect();
            if f.len() != 10 {
                return Err(bad(format!("{} fields, expected 10", f.len())));
            }
            let num = |k: usize| {
                f[k].parse::<f64>()
                    .map_err(|e| bad(format!("field {}: {e}", k + 1)))
            };
            let maybe = |k: usize| {
                if f[k].is_empty() {
                    Ok(None)
                } else {
                    num(k).map(Some)
                }
            };
            Ok(MetricsRow {
                epoch: f[0].parse().map_err(|e| bad(format!("epoch: {e}")))?,
                step: f[1].parse().map_err(|e| bad(format!("step: {e}")))?,
                lr: num(2)?,
                train_loss: num(3)?,
                valid_loss: maybe(4)?,
                valid_accuracy: maybe(5)?,
                test_loss: num(6)?,
                test_accuracy: num(7)?,
                seconds: num(8)?,
                images_per_sec: num(9)?,
            })
        })
        .collect()
}

/// The loss axis's label for runs trained with these label-smoothing factors.
pub fn loss_label(smoothing: &[f64]) -> String {
    match smoothing {
        s if s.iter().all(|&v| v == 0.0) => "mean cross-entropy".into(),
        [first, rest @ ..] if rest.iter().all(|v| v == first) => {
            format!("mean cross-entropy, label smoothing {first}")
        }
        _ => "mean cross-entropy (label-smoothed where trained so)".into(),
    }
}

/// Draws loss and accuracy per epoch for one or several runs (`(name, rows)`) into `path`,
/// the loss axis labelled `loss_label`. One run: a colour per series (train, test, valid), the
/// same in both panels. Several: a colour per run, test drawn with dots and train and valid as
/// plain lines.
pub fn draw_curves(
    path: &Path,
    runs: &[(String, Vec<MetricsRow>)],
    loss_label: &str,
) -> Result<(), MetricsError> {
    let several = runs.len() > 1;
    let prefix = |name: &str, what: &str| {
        if several {
            format!("{name} {what}")
        } else {
            what.to_string()
        }
    };
    let mut loss = Vec::new();
    let mut accuracy = Vec::new();
    for (run, (name, rows)) in runs.iter().enumerate() {
        let points = |f: &dyn Fn(&MetricsRow) -> Option<f64>| -> Vec<(f64, f64)> {
            rows.iter()
                .filter_map(|r| f(r).map(|v| (r.epoch as f64, v)))
                .collect()
        };
        // (colour, dots) of a series: train 0, test 1, valid 2 for one run.
        let style = |series: usize| {
            if several {
                (run, series == 1)
            } else {
                (series, true)
            }
        };
        let line = |series: usize, what: &str, points: Vec<(f64, f64)>| {
            let (colour, dots) = style(series);
            Line {
                name: prefix(name, what),
                points,
                colour,
                dots,
            }
        };
        loss.push(line(0, "train", points(&|r| Some(r.train_loss))));
        loss.push(line(1, "test", points(&|r| Some(r.test_loss))));
        accuracy.push(line(1, "test", points(&|r| Some(100.0 * r.test_accuracy))));
        if rows.iter().any(|r| r.valid_loss.is_some()) {
            loss.push(line(2, "valid", points(&|r| r.valid_loss)));
            accuracy.push(line(2, "valid", points(&|r| r.valid_accuracy.map(|a| 100.0 * a))));
        }
    }
    line_panels(
        path,
        "epoch",
        &[
            Panel {
                title: "Loss".into(),
                y_label: loss_label.into(),
                lines: loss,
                legend_low: false,
            },
            Panel {
                title: "Accuracy".into(),
                y_label: "% correct".into(),
                lines: accuracy,
                legend_low: true,
            },
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_loss_axis_says_when_it_is_label_smoothed() {
        use super::loss_label;
        assert_eq!(loss_label(&[0.0]), "mean cross-entropy");
        assert_eq!(loss_label(&[0.1, 0.1]), "mean cross-entropy, label smoothing 0.1");
        assert_eq!(
            loss_label(&[0.1, 0.0]),
            "mean cross-entropy (label-smoothed where trained so)"
        );
    }

    #[test]
    fn a_damaged_metrics_file_is_an_error_not_an_empty_history() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_if_present(dir.path()).unwrap(), Vec::new());
        let mut bytes = format!("{HEADER}\n").into_bytes();
        bytes.extend_from_slice(b"1,10,0.1,\xff\n");
        std::fs::write(dir.path().join(METRICS_FILE), bytes).unwrap();
        let err = read_if_present(dir.path()).unwrap_err().to_string();
        assert!(err.contains(METRICS_FILE), "{err}");
    }

    use super::*;

    fn row(epoch: usize, valid: bool) -> MetricsRow {
        MetricsRow {
            epoch,
            step: epoch * 938,
            lr: 0.7f64.powi(epoch as i32 - 1),
            train_loss: 0.3 / epoch as f64,
            valid_loss: valid.then_some(0.1),
            valid_accuracy: valid.then_some(0.97),
            test_loss: 0.05,
            test_accuracy: 0.9859,
            seconds: 175.5,
            images_per_sec: 342.9,
        }
    }

    #[test]
    fn csv_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let rows = vec![row(1, false), row(2, true)];
        write(dir.path(), &rows).unwrap();
        let text = std::fs::read_to_string(dir.path().join(METRICS_FILE)).unwrap();
        assert!(text.starts_with("epoch,step,lr,train_loss"), "{text}");
        assert!(
            text.contains("\n1,938,1,0.3,,,0.05,0.9859,175.5,342.9\n"),
            "{text}"
        );
        assert_eq!(read(dir.path()).unwrap(), rows);
    }

    #[test]
    fn malformed_csv_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(METRICS_FILE), format!("{HEADER}\n1,2,3\n")).unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("metrics.csv:2") && err.contains("3 fields"), "{err}");
    }
}
