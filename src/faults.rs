//! Kill points: where `tests/kill9.rs` stops the process, deterministically.
//!
//! With `EMBER_KILL_AT=POINT@N` in its environment, the process sends itself SIGKILL the N-th
//! time it reaches POINT (one of [`POINTS`]), exactly as an outside `kill -9` at that moment
//! would: no destructor, no flush, no handler runs. Without the variable [`point`] is one
//! relaxed load. The binary checks the variable before doing anything ([`check_env`]), so a
//! misspelt point is an error rather than a run that is never killed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable that arms a kill point.
pub const VAR: &str = "EMBER_KILL_AT";

/// Every kill point, in the order a run reaches them.
pub const POINTS: &[&str] = &[
    // A new run's directory is created and locked; nothing else is in it yet.
    "run:locked",
    // The run's data is on the device; config.json is not written yet (new runs).
    "data:loaded",
    // `files::write_atomic` (config.json, model and optimizer records, state.json,
    // metrics.csv, curves.png): the temporary file created and empty, half written, complete
    // and synced but not renamed, renamed but the directory not synced.
    "write:created",
    "write:half",
    "write:synced",
    "write:renamed",
    // A checkpoint's state.json is committed; the previous checkpoint's records are still there.
    "checkpoint:committed",
    // An optimizer step is done (mid-epoch when the epoch has more steps).
    "train:step",
    // A batch of an evaluation is done.
    "eval:batch",
];

struct Armed {
    point: &'static str,
    at: u64,
    reached: AtomicU64,
}

fn parse(value: &str) -> Result<(&'static str, u64), String> {
    let (name, at) = value.rsplit_once('@').unwrap_or((value, "1"));
    let point = POINTS.iter().copied().find(|p| *p == name).ok_or_else(|| {
        format!(
            "{VAR}={value}: no kill point {name:?}; the points are {}",
            POINTS.join(", ")
        )
    })?;
    let at = at
        .parse::<u64>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{VAR}={value}: the count after @ must be a whole number from 1"))?;
    Ok((point, at))
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var(VAR).ok()?;
            let (point, at) = parse(&value).ok()?;
            Some(Armed {
                point,
                at,
                reached: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Checks `EMBER_KILL_AT` when set: one line naming the value and the points when it is not one.
pub fn check_env() -> Result<(), String> {
    match std::env::var(VAR) {
        Ok(value) => parse(&value).map(|_| ()),
        Err(std::env::VarError::NotPresent) => Ok(()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{VAR} is not UTF-8")),
    }
}

/// Kill point `name` (one of [`POINTS`]): SIGKILL when `EMBER_KILL_AT` names it and this is
/// the time it counts.
pub fn point(name: &'static str) {
    debug_assert!(POINTS.contains(&name), "{name} is not in faults::POINTS");
    let Some(armed) = armed() else { return };
    if armed.point == name && armed.reached.fetch_add(1, Ordering::SeqCst) + 1 == armed.at {
        // SAFETY: kill(2) and getpid(2) take plain integers and touch no memory of ours.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        // SIGKILL cannot be caught or ignored; delivery to ourselves happens before kill
        // returns, but wait rather than go on should it not.
        loop {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_points_are_parsed_and_misspellings_named() {
        assert_eq!(parse("write:half@3"), Ok(("write:half", 3)));
        assert_eq!(parse("train:step"), Ok(("train:step", 1)));
        let err = parse("write:halfway@2").unwrap_err();
        assert!(
            err.contains("no kill point \"write:halfway\"") && err.contains("write:half,"),
            "{err}"
        );
        assert!(parse("train:step@0").unwrap_err().contains("from 1"));
        assert!(parse("train:step@x").is_err());
    }
}
