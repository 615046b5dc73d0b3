//! Deterministic names of what the operator creates for a resource: the mover pod and
//! its token Secret of each attempt. The same resource and attempt always give the same
//! names, so a reconcile that repeats itself finds what it created instead of creating
//! it twice.

/// Longest name the operator builds (a DNS label, so it also fits a hostname).
const MAX_NAME: usize = 63;

/// The mover pod of `attempt` of the resource `name` (uid `uid`) of kind `short`
/// (`ft`, `fcs`): `<name>-<short>-<attempt>`, or, when that is too long, a prefix of the
/// name with the uid's first 8 characters to keep it unique.
pub fn mover_pod(short: &str, name: &str, uid: &str, attempt: u32) -> String {
    bounded(name, uid, &format!("-{short}-{attempt}"), MAX_NAME)
}

/// `<name><suffix>`, or, when that is longer than `max`, a prefix of the name with the
/// uid's first 8 characters to keep it unique.
pub fn bounded(name: &str, uid: &str, suffix: &str, max: usize) -> String {
    if name.len() + suffix.len() <= max {
        return format!("{name}{suffix}");
    }
    let uid: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    let keep = max - suffix.len() - uid.len() - 1;
    let prefix = name[..keep.min(name.len())].trim_end_matches(['-', '.']);
    format!("{prefix}-{uid}{suffix}")
}

/// The token Secret of a mover pod.
pub fn token_secret(pod: &str) -> String {
    format!("{pod}-token")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_read_well_and_long_ones_stay_unique_and_short() {
        assert_eq!(mover_pod("ft", "import", "u", 2), "import-ft-2");
        assert_eq!(token_secret("import-ft-2"), "import-ft-2-token");
        let long = "a".repeat(80);
        let a = mover_pod("ft", &long, "0b0e5e1c-1111", 1);
        let b = mover_pod("ft", &long, "9f9f9f9f-2222", 1);
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME, "{a}");
        assert_ne!(a, b);
        assert!(a.ends_with("-0b0e5e1c-ft-1"), "{a}");
    }
}
