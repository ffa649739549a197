//! Kill points: where `tests/kill9.rs` stops the process, deterministically.
//!
//! With `EMBER_KILL_AT=POINT@N` in its environment, the process sends itself SIGKILL the N-th
//! time it reaches POINT (one of [`POINTS`]), exactly as an outside `kill -9` at that moment
//! would: no destructor, no flush, no handler runs. `EMBER_TERM_AT=POINT@N` sends SIGTERM
//! instead, at the points that wait for the process to see it ([`term_point`]), as a `kill` or
//! Ctrl-C at that moment would. Without the variables a point is one load. The binary checks
//! the variables before doing anything ([`check_env`]), so a misspelt point is an error rather
//! than a run that is never stopped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable that arms a kill point.
pub const VAR: &str = "EMBER_KILL_AT";

/// The environment variable that arms a SIGTERM point.
pub const TERM_VAR: &str = "EMBER_TERM_AT";

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
    // An image of a folder is about to be decoded.
    "decode:image",
];

struct Armed {
    point: &'static str,
    at: u64,
    reached: AtomicU64,
}

fn parse(var: &str, value: &str) -> Result<(&'static str, u64), String> {
    let (name, at) = value.rsplit_once('@').unwrap_or((value, "1"));
    let point = POINTS.iter().copied().find(|p| *p == name).ok_or_else(|| {
        format!(
            "{var}={value}: no kill point {name:?}; the points are {}",
            POINTS.join(", ")
        )
    })?;
    let at = at
        .parse::<u64>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{var}={value}: the count after @ must be a whole number from 1"))?;
    Ok((point, at))
}

fn arm(var: &str) -> Option<Armed> {
    let value = std::env::var(var).ok()?;
    let (point, at) = parse(var, &value).ok()?;
    Some(Armed {
        point,
        at,
        reached: AtomicU64::new(0),
    })
}

/// Whether this call at `name` is the one `var` armed (`slot` keeps the parsed variable).
fn fires(slot: &OnceLock<Option<Armed>>, var: &str, name: &str) -> bool {
    slot.get_or_init(|| arm(var)).as_ref().is_some_and(|armed| {
        armed.point == name && armed.reached.fetch_add(1, Ordering::SeqCst) + 1 == armed.at
    })
}

/// Checks `EMBER_KILL_AT` and `EMBER_TERM_AT` when set: one line naming the value and the
/// points when it is not one.
pub fn check_env() -> Result<(), String> {
    for var in [VAR, TERM_VAR] {
        match std::env::var(var) {
            Ok(value) => parse(var, &value).map(|_| ())?,
            Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(_)) => return Err(format!("{var} is not UTF-8")),
        }
    }
    Ok(())
}

/// Kill point `name` (one of [`POINTS`]): SIGKILL when `EMBER_KILL_AT` names it and this is
/// the time it counts.
pub fn point(name: &'static str) {
    debug_assert!(POINTS.contains(&name), "{name} is not in faults::POINTS");
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    if fires(&ARMED, VAR, name) {
        signal(libc::SIGKILL);
        // SIGKILL cannot be caught or ignored; delivery to ourselves happens before kill
        // returns, but wait rather than go on should it not.
        loop {
            std::thread::park();
        }
    }
}

/// [`point`], and a SIGTERM point: when `EMBER_TERM_AT` names `name` and this is the time it
/// counts, sends SIGTERM and returns once `seen()` says the process saw it (its handler runs
/// on another thread).
pub fn term_point(name: &'static str, seen: impl Fn() -> bool) {
    point(name);
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    if fires(&ARMED, TERM_VAR, name) {
        signal(libc::SIGTERM);
        while !seen() {
            std::thread::yield_now();
        }
    }
}

fn signal(sig: libc::c_int) {
    // SAFETY: kill(2) and getpid(2) take plain integers and touch no memory of ours.
    unsafe {
        libc::kill(libc::getpid(), sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_points_are_parsed_and_misspellings_named() {
        assert_eq!(parse(VAR, "write:half@3"), Ok(("write:half", 3)));
        assert_eq!(parse(VAR, "train:step"), Ok(("train:step", 1)));
        let err = parse(TERM_VAR, "write:halfway@2").unwrap_err();
        assert!(
            err.starts_with("EMBER_TERM_AT=write:halfway@2: no kill point \"write:halfway\""),
            "{err}"
        );
        assert!(err.contains("write:half,"), "{err}");
        assert!(parse(VAR, "train:step@0").unwrap_err().contains("from 1"));
        assert!(parse(VAR, "train:step@x").is_err());
    }
}
