//! Fetching missing dataset files from the public mirrors. A file is kept only once its
//! decompressed bytes match the known SHA-256.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use super::{idx, verify, Dataset, FileSpec};

/// Downloads `<name>.gz` of each `missing` file into `dir`, trying the dataset's mirrors in
/// order. Returns the last mirror's failure when none served a verified copy.
pub(super) fn fetch(dataset: Dataset, dir: &Path, missing: &[&FileSpec]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(15)))
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    for spec in missing {
        let file = format!("{}.gz", spec.name);
        let target = dir.join(&file);
        let partial = dir.join(format!("{file}.part"));
        let mut last_error = String::new();
        for mirror in dataset.mirrors() {
            let url = format!("{mirror}{file}");
            eprintln!("downloading {url}");
            let result = get(&agent, &url, &partial).and_then(|()| {
                let parsed = idx::read(&partial, spec.magic).map_err(|e| e.to_string())?;
                verify(&target, dataset, spec, &parsed).map_err(|e| e.to_string())
            });
            match result {
                Ok(()) => {
                    std::fs::rename(&partial, &target)
                        .map_err(|e| format!("cannot move {} into place: {e}", partial.display()))?;
                    last_error.clear();
                    break;
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&partial);
                    last_error = format!("{url}: {e}");
                }
            }
        }
        if !last_error.is_empty() {
            return Err(last_error);
        }
    }
    Ok(())
}

fn get(agent: &ureq::Agent, url: &str, to: &Path) -> Result<(), String> {
    let response = agent.get(url).call().map_err(|e| e.to_string())?;
    let mut body = response.into_body().into_reader();
    let mut out = std::fs::File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
    std::io::copy(&mut body, &mut out).map_err(|e| e.to_string())?;
    out.sync_all().map_err(|e| format!("{}: {e}", to.display()))?;
    out.flush().map_err(|e| e.to_string())
}
