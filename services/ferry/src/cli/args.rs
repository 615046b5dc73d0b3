//! Argument types shared by the subcommands: sizes with suffixes, counts and the progress
//! switch. The mode enums (cache, order, preallocation, algorithm) are in
//! [`crate::cli::options`], shared with `ferry job` and the service.

use ferry_core::size::parse_size;

/// Largest request size accepted, to keep memory bounded.
pub const MAX_REQUEST_SIZE: u64 = 64 << 20;

/// A byte count with an optional suffix: 4096, 4K, 1M, 1MiB, 2G.
pub fn size(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.message().to_string())
}

/// A size the way a user would type it: `256K`, `64M`, `4097`.
pub fn show_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in UNITS {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A request size: at least 1 byte, at most [`MAX_REQUEST_SIZE`].
pub fn request_size(text: &str) -> Result<usize, String> {
    let bytes = size(text)?;
    if bytes == 0 || bytes > MAX_REQUEST_SIZE {
        return Err(format!(
            "request size must be between 1 byte and {} MiB",
            MAX_REQUEST_SIZE >> 20
        ));
    }
    usize::try_from(bytes).map_err(|_| "request size does not fit in memory".to_string())
}

/// A sparse granularity: 0 (keep everything allocated) or a power of two up to 64 MiB.
pub fn sparse_size(text: &str) -> Result<usize, String> {
    let bytes = size(text)?;
    if bytes != 0 && (!bytes.is_power_of_two() || bytes > MAX_REQUEST_SIZE) {
        return Err(format!(
            "sparse size must be 0 or a power of two up to {} MiB (like 512, 4K, 64K)",
            MAX_REQUEST_SIZE >> 20
        ));
    }
    usize::try_from(bytes).map_err(|_| "sparse size does not fit in memory".to_string())
}

/// A rate in bytes per second: at least 1.
pub fn rate(text: &str) -> Result<u64, String> {
    match size(text)? {
        0 => Err("rate limit must be at least 1 byte per second".to_string()),
        bytes => Ok(bytes),
    }
}

/// A work unit: at least 64 KiB.
pub fn work_unit(text: &str) -> Result<u64, String> {
    match size(text)? {
        bytes if bytes < 64 << 10 => Err("work unit must be at least 64K".to_string()),
        bytes => Ok(bytes),
    }
}

/// A count of workers or threads: 1 to 1024.
pub fn count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("'{text}' is not a number from 1 to 1024")),
    }
}

/// `--progress` / `--no-progress`, shared by the subcommands.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct ProgressArgs {
    /// Show a progress bar with rate and ETA (default: only when stderr is a terminal).
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long, overrides_with = "progress")]
    pub no_progress: bool,
}

impl ProgressArgs {
    /// `Some(true)` or `Some(false)` when the user chose, `None` for the default.
    pub fn choice(&self) -> Option<bool> {
        match (self.progress, self.no_progress) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size("4K"), Ok(4096));
        assert_eq!(request_size("1MiB"), Ok(1 << 20));
        assert!(request_size("0").is_err());
        assert!(request_size("1G").is_err());
        assert!(size("1X").unwrap_err().contains("invalid size '1X'"));
        assert_eq!(sparse_size("0"), Ok(0));
        assert_eq!(sparse_size("64K"), Ok(65536));
        assert!(sparse_size("3000").is_err());
        assert!(rate("0").is_err());
        assert_eq!(rate("10M"), Ok(10 << 20));
        assert!(count("0").is_err());
        assert_eq!(count("8"), Ok(8));
    }

    #[test]
    fn shows_sizes() {
        assert_eq!(show_size(256 << 10), "256K");
        assert_eq!(show_size(64 << 20), "64M");
        assert_eq!(show_size(1 << 30), "1G");
        assert_eq!(show_size(4097), "4097");
        assert_eq!(show_size(0), "0");
    }
}
