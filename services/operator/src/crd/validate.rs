//! Checks the API server's schema cannot express (URL syntax, inline passwords, duplicate
//! targets, digests) shared by the specs' `validate()`. Each failure names the field and
//! says what to fix, so the reconciler can put it in the status message as it is; no
//! message ever repeats a secret (URLs are redacted before they are quoted).

use ferry_core::spec::{redact_userinfo, EndpointSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::endpoint::SecretKeyRef;

/// A spec that cannot run, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// The field's path, as `spec.targets[1].url`.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

pub(crate) fn invalid(field: &str, message: &str) -> ValidationError {
    ValidationError {
        field: field.to_string(),
        message: message.to_string(),
    }
}

/// The endpoint families a URL may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UrlKind {
    Nbd,
    Nfs,
    Iscsi,
    S3,
    Http,
    Registry,
}

impl UrlKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Nbd => "nbd",
            Self::Nfs => "nfs",
            Self::Iscsi => "iscsi",
            Self::S3 => "s3",
            Self::Http => "http(s)",
            Self::Registry => "docker",
        }
    }
}

/// Whether the URL's authority carries a password (`user:pass@` or libiscsi's
/// `user%pass@`).
fn has_inline_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    match authority.rsplit_once('@') {
        Some((userinfo, _)) => userinfo.contains(':') || userinfo.contains('%'),
        None => false,
    }
}

/// `url` as a status message may quote it: no user info, and no query or fragment of an
/// HTTP URL (a presigned URL's signature is a credential).
fn shown_url(url: &str) -> String {
    let http = url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
    });
    if http {
        redact_userinfo(url.split(['?', '#']).next().unwrap_or_default())
    } else {
        redact_userinfo(url)
    }
}

/// Parses `url` as ferry does and returns its family; file paths are refused (inside a
/// mover they name nothing the user controls: use a claim).
pub(crate) fn check_url(field: &str, url: &str) -> Result<UrlKind, ValidationError> {
    if has_inline_password(url) {
        return Err(invalid(
            field,
            &format!(
                "'{}' has a password inside the URL: remove it and give credentials only as a secretKeyRef in the endpoint's options",
                shown_url(url)
            ),
        ));
    }
    if !url.contains("://") {
        return Err(invalid(
            field,
            &format!("'{url}' is a path: name a claim with pvc instead of a file"),
        ));
    }
    let spec = EndpointSpec::parse(url)
        .map_err(|e| invalid(field, &e.message().replace(url, &shown_url(url))))?;
    match spec {
        EndpointSpec::Nbd(nbd) => match nbd.address {
            ferry_core::spec::NbdAddress::Unix { .. } => Err(invalid(
                field,
                "a Unix socket URL names nothing outside the mover: use nbd://host:port/export",
            )),
            ferry_core::spec::NbdAddress::Tcp { .. } => Ok(UrlKind::Nbd),
        },
        EndpointSpec::Nfs(_) => Ok(UrlKind::Nfs),
        EndpointSpec::Iscsi(_) => Ok(UrlKind::Iscsi),
        EndpointSpec::S3(_) => Ok(UrlKind::S3),
        EndpointSpec::Http(_) => Ok(UrlKind::Http),
        EndpointSpec::Registry(_) => Ok(UrlKind::Registry),
        _ => Err(invalid(
            field,
            &format!(
                "'{}' is a file URL: name a claim with pvc instead of a file",
                shown_url(url)
            ),
        )),
    }
}

/// A DNS-1123 subdomain, as claim and Secret names are.
pub(crate) fn check_pvc_name(field: &str, name: &str) -> Result<(), ValidationError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(invalid(
            field,
            &format!("'{name}' is not a valid object name (lower-case letters, digits, '-' and '.', at most 253)"),
        ));
    }
    Ok(())
}

/// A path inside a volume: relative, no `..`, no empty or `.` components.
pub(crate) fn check_relative_path(field: &str, path: &str) -> Result<(), ValidationError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains('\0')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(invalid(
            field,
            &format!("'{path}' must be a relative path inside the volume, without '.' or '..' parts (like disk.img or images/disk.img)"),
        ));
    }
    Ok(())
}

/// A Secret name and a key Kubernetes accepts (the key becomes a file name).
pub(crate) fn check_secret_ref(field: &str, r: &SecretKeyRef) -> Result<(), ValidationError> {
    check_pvc_name(&format!("{field}.name"), &r.name)?;
    let key_ok = !r.key.is_empty()
        && r.key.len() <= 253
        && r.key != "."
        && r.key != ".."
        && r.key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if !key_ok {
        return Err(invalid(
            &format!("{field}.key"),
            &format!(
                "'{}' is not a valid Secret key (letters, digits, '-', '_', '.')",
                r.key
            ),
        ));
    }
    Ok(())
}

/// A storage size: a positive Kubernetes quantity with a binary or decimal suffix.
pub(crate) fn check_quantity(field: &str, q: &Quantity) -> Result<(), ValidationError> {
    const SUFFIXES: [&str; 13] = [
        "", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let text = q.0.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let positive = number.parse::<f64>().is_ok_and(|n| n > 0.0);
    if !positive || !SUFFIXES.contains(&suffix) {
        return Err(invalid(
            field,
            &format!("'{text}' is not a positive size (like 10Gi or 500M)"),
        ));
    }
    Ok(())
}

/// The bytes a storage size stands for (a size [`check_quantity`] accepts); None for
/// anything else.
pub fn quantity_bytes(q: &Quantity) -> Option<u128> {
    let text = q.0.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut bytes = whole.checked_mul(multiplier)?;
    if !fraction.is_empty() {
        let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
        let fraction: u128 = fraction.parse().ok()?;
        bytes = bytes.checked_add(fraction.checked_mul(multiplier)?.div_ceil(scale))?;
    }
    Some(bytes)
}

/// The size a claim restored from a snapshot asks for: `asked`, or the snapshot's
/// `restoreSize` when that is larger (a driver that rounded the volume up refuses a
/// restore into a smaller claim).
pub fn restore_request(asked: &Quantity, restore_size: Option<&Quantity>) -> Quantity {
    match restore_size {
        Some(size) if quantity_bytes(size) > quantity_bytes(asked) => size.clone(),
        _ => asked.clone(),
    }
}

/// An expected digest: `sha256:<64 hex>` or `blkhash:<64 hex>`, lower case.
pub fn check_digest(field: &str, digest: &str) -> Result<(), ValidationError> {
    let ok = digest.split_once(':').is_some_and(|(algorithm, hex)| {
        matches!(algorithm, "sha256" | "blkhash")
            && hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if !ok {
        return Err(invalid(
            field,
            &format!("'{digest}' is not a digest: use sha256:<64 lower-case hex digits> or blkhash:<64 lower-case hex digits>"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_bytes() {
        for (text, bytes) in [
            ("20Gi", 20u128 << 30),
            ("500M", 500_000_000),
            ("1.5Gi", 3 << 29),
            ("1024", 1024),
            ("2k", 2000),
        ] {
            assert_eq!(
                quantity_bytes(&Quantity(text.into())),
                Some(bytes),
                "{text}"
            );
        }
        for text in ["20GB", "x", "1e3"] {
            assert_eq!(quantity_bytes(&Quantity(text.into())), None, "{text}");
        }
    }

    #[test]
    fn an_error_about_an_http_url_quotes_no_query_and_no_password() {
        let e = check_url("spec.source.url", "https://user:pw@host/disk.img?sig=abc").unwrap_err();
        assert!(!e.message.contains("sig=abc"), "{}", e.message);
        assert!(!e.message.contains("pw"), "{}", e.message);
        assert!(e.message.contains("host/disk.img"), "{}", e.message);
    }

    #[test]
    fn a_query_that_looks_like_user_info_is_not_a_password() {
        assert!(!has_inline_password("https://host?sig=a:b@x"));
        assert!(!has_inline_password("https://host#a:b@x"));
        assert!(has_inline_password("https://a:b@host/x"));
        assert!(check_url("f", "https://host/disk.img?sig=a:b@x").is_ok());
    }
}
