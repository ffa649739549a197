//! The C allocator's settings for training.
//!
//! Every training step frees and allocates the same activation and gradient buffers again
//! (megabytes each). By default glibc hands large freed blocks back to the kernel (`munmap`,
//! heap trimming), so the next step page-faults them in and the kernel zeroes every page again:
//! measured at ~15% of a step on the 2-core VM. Keeping freed memory in the process reuses it;
//! peak resident memory is unchanged, since the same buffers are live at the peak either way.

/// Serves every block from the heap (no mmap, whose blocks go back to the kernel on free,
/// whatever their size; batch-256 activations pass glibc's 32 MiB mmap ceiling) and never
/// trims it. Call once, before the first large allocation; a no-op off glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before any other thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// `n` bytes for people: "512 B", "1.5 MiB", "7.21 GiB".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} B"),
        _ if value >= 100.0 => format!("{value:.0} {}", UNITS[unit]),
        _ => format!("{value:.2} {}", UNITS[unit]),
    }
}

/// A size as a person writes it: `4096`, `512M`, `8G`, `1.5GiB`, `2 GB` (K, M, G, T: powers of
/// 1024, with or without `i`/`B`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size: expected a number and a unit, e.g. 8G or 512M"))?;
    let scale = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("'{text}': unknown unit '{unit}'; use K, M, G or T")),
    };
    let out = value * scale as f64;
    if !(out.is_finite() && out >= 1.0) {
        return Err(format!("'{text}' must be at least 1 byte"));
    }
    Ok(out as u64)
}

/// Physical memory of this machine, from /proc/meminfo (`None` elsewhere).
pub fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2 gb"), Ok(2 << 30));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3X").is_err());
        assert!(parse_bytes("0").is_err());
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 29), "1.50 GiB");
    }
}
