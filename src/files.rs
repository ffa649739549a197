//! File and time helpers that checkpoints, metrics, `ember bench` and `ember compare` share.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `text` from outside (a file name, a file's contents) with control characters escaped (`\n`
/// as two characters, ESC as `\u{1b}`): a line printed with it stays one line and cannot
/// retitle, clear or move the terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `path` as `printable` text (non-UTF-8 bytes as U+FFFD).
pub fn shown(path: &Path) -> String {
    printable(&path.display().to_string())
}

/// A file that could not be written, by path.
#[derive(Debug, thiserror::Error)]
#[error("{}: {error}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    pub error: std::io::Error,
}

fn err(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError {
        path: path.to_owned(),
        error: source,
    }
}

/// Writes `bytes` to `path` through a temporary file that is synced and renamed into place.
/// The temporary name carries the process id, and a failed write (a full disk) removes it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let tmp = path.with_extension(format!(
        "{}.{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        std::process::id()
    ));
    let written = (|| {
        let mut file = fs::File::create(&tmp).map_err(err(&tmp))?;
        crate::faults::point("write:created");
        let (first, rest) = bytes.split_at(bytes.len() / 2);
        file.write_all(first).map_err(err(&tmp))?;
        crate::faults::point("write:half");
        file.write_all(rest).map_err(err(&tmp))?;
        file.sync_all().map_err(err(&tmp))?;
        drop(file);
        crate::faults::point("write:synced");
        fs::rename(&tmp, path).map_err(err(path))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    crate::faults::point("write:renamed");
    // The rename is durable once the directory entry is.
    if let Some(dir) = path.parent() {
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// `YYYYmmdd-HHMMSS` in UTC.
pub fn utc_stamp(time: std::time::SystemTime) -> String {
    let secs = time
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil conversion.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    /// /dev/full fails every write with ENOSPC, as a full disk does.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("state.json");
        let tmp = target.with_extension(format!("json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
        let err = write_atomic(&target, b"{}").unwrap_err().to_string();
        assert!(
            err.contains("No space left on device") && err.contains("state.json"),
            "{err}"
        );
        assert!(
            !tmp.exists() && std::fs::symlink_metadata(&tmp).is_err(),
            "temporary file left behind"
        );
        assert!(!target.exists());
        write_atomic(&target, b"{}").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
    }

    #[test]
    fn stamps_in_utc() {
        // date -u -d @1764672000 +%Y%m%d-%H%M%S
        assert_eq!(
            utc_stamp(UNIX_EPOCH + Duration::from_secs(1_764_672_000)),
            "20251202-104000"
        );
        assert_eq!(
            utc_stamp(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229-000000"
        );
    }
}
