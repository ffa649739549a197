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
    let agent = agent(Duration::from_secs(600));
    for spec in missing {
        let file = format!("{}.gz", spec.name);
        let target = dir.join(&file);
        let partial = dir.join(format!("{file}.part"));
        let mut last_error = String::new();
        for mirror in dataset.mirrors() {
            let url = format!("{mirror}{file}");
            eprintln!("downloading {url}");
            let result = get(&agent, &url, &partial, max_download(spec)).and_then(|()| {
                let parsed =
                    idx::read_expecting(&partial, spec.magic, spec.dims).map_err(|e| e.to_string())?;
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

/// The most a `.gz` of `spec` can take: gzip adds at most 5 bytes per 32 KiB block of data it
/// cannot compress, plus its header; a mirror that sends more is not sending this file.
pub(super) fn max_download(spec: &FileSpec) -> u64 {
    let len = spec.decompressed_len() as u64;
    len + len / 4096 + 1024
}

/// An HTTP client that gives up connecting after 15 s and a whole download after `global`.
pub(super) fn agent(global: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(15)))
        .timeout_global(Some(global))
        .build()
        .into()
}

/// Saves `url`'s body to `to`; more than `max_bytes` is an error.
pub(super) fn get(agent: &ureq::Agent, url: &str, to: &Path, max_bytes: u64) -> Result<(), String> {
    let response = agent.get(url).call().map_err(|e| e.to_string())?;
    let mut body = std::io::Read::take(response.into_body().into_reader(), max_bytes + 1);
    let mut out = std::fs::File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let copied = std::io::copy(&mut body, &mut out).map_err(|e| e.to_string())?;
    if copied > max_bytes {
        return Err(format!(
            "the download is larger than {max_bytes} bytes, more than this file can be"
        ));
    }
    out.sync_all().map_err(|e| format!("{}: {e}", to.display()))?;
    out.flush().map_err(|e| e.to_string())
}
