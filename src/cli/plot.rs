//! `ember plot`: redraws curves from runs' metrics.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

/// `ember plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Run directories (each with metrics.csv).
    #[arg(required = true, value_name = "RUN_DIR")]
    pub runs: Vec<PathBuf>,
    /// Output PNG [default: RUN_DIR/curves.png for one run; curves.png for several].
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

pub fn run(args: PlotArgs) -> Result<()> {
    let mut runs = Vec::new();
    let mut smoothing = Vec::new();
    for dir in &args.runs {
        let rows = crate::metrics::read(dir)?;
        // The loss axis says whether it is label-smoothed (runs without config.json: not).
        let config = crate::checkpoint::RunDir::open(dir).and_then(|r| r.load_config());
        smoothing.push(config.map_or(0.0, |c| c.label_smoothing));
        let name = dir
            .file_name()
            .map_or(dir.display().to_string(), |n| n.to_string_lossy().to_string());
        runs.push((name, rows));
    }
    let out = args.out.clone().unwrap_or_else(|| match args.runs.as_slice() {
        [one] => one.join(crate::metrics::CURVES_FILE),
        _ => PathBuf::from(crate::metrics::CURVES_FILE),
    });
    crate::metrics::draw_curves(&out, &runs, &crate::metrics::loss_label(&smoothing))?;
    println!("{}", out.display());
    Ok(())
}
