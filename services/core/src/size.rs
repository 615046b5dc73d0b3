//! Human sizes: `4096`, `4K`, `1M`, `1MiB`, `2G`. Suffixes are binary, as in qemu-img.

use crate::{Error, Result};

/// Parses a byte count with an optional binary suffix (K, M, G, T, P; optionally followed
/// by `iB` or `B`; case-insensitive).
pub fn parse_size(text: &str) -> Result<u64> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    let bad = || {
        Error::invalid_input(format!(
            "invalid size '{text}': expected a number with an optional suffix K, M, G, T or P (like 4K, 1MiB, 2G)"
        ))
    };
    if number.is_empty() {
        return Err(bad());
    }
    let number: u64 = number.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => return Err(bad()),
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| Error::invalid_input(format!("size '{text}' is too large")))
}

/// Formats a byte count with a binary suffix, for humans.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size(" 3T ").unwrap(), 3 << 40);
        assert_eq!(parse_size("0").unwrap(), 0);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "K",
            "-1",
            "1.5M",
            "1X",
            "12 34",
            "99999999999999999999",
            "16384P",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidInput, "{bad}");
            assert!(err.to_string().contains("size"), "{err}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(4 << 30), "4.00 GiB");
    }
}
