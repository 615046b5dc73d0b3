//! The CPU and memory a mover container asks for and is held to when its resource gives
//! none: every mover has requests and limits, so a namespace's ResourceQuota admits it and
//! the scheduler places it by what it uses.
//!
//! The defaults fit ferry's measured peaks (docs/BENCHMARKS.md: a copy about 20 MiB, a
//! backup or restore under 250 MiB, an S3 transfer under 200 MiB with the default workers)
//! with room; the CPU limit lets a mover use two cores, which a checksum or a compressed
//! image's decoding does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The operator's default CPU request of a mover container.
pub const CPU_REQUEST: &str = "250m";
/// The operator's default memory request of a mover container.
pub const MEMORY_REQUEST: &str = "256Mi";
/// The operator's default CPU limit of a mover container.
pub const CPU_LIMIT: &str = "2";
/// The operator's default memory limit of a mover container.
pub const MEMORY_LIMIT: &str = "1Gi";

/// A mover container's requests and limits; `None` leaves that entry out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoverResources {
    pub cpu_request: Option<String>,
    pub memory_request: Option<String>,
    pub cpu_limit: Option<String>,
    pub memory_limit: Option<String>,
}

impl MoverResources {
    /// The requirements, or `None` when every entry is left out.
    pub fn requirements(&self) -> Option<ResourceRequirements> {
        let pair = |cpu: &Option<String>, memory: &Option<String>| {
            let map: BTreeMap<String, Quantity> = [("cpu", cpu), ("memory", memory)]
                .into_iter()
                .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), Quantity(v))))
                .collect();
            (!map.is_empty()).then_some(map)
        };
        let requests = pair(&self.cpu_request, &self.memory_request);
        let limits = pair(&self.cpu_limit, &self.memory_limit);
        (requests.is_some() || limits.is_some()).then(|| ResourceRequirements {
            requests,
            limits,
            ..ResourceRequirements::default()
        })
    }
}

/// Why a quantity is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a Kubernetes quantity (like 250m, 2, 512Mi or 1Gi)")]
pub struct BadQuantity(pub String);

/// Checks `text` is a Kubernetes quantity as the API server accepts it in resource
/// requirements: a non-negative decimal number with an optional binary (Ki..Ei), decimal
/// (m, k, M..E) or exponent (e3, E-2) suffix.
pub fn check_quantity(text: &str) -> Result<&str, BadQuantity> {
    let bad = || BadQuantity(text.to_string());
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let digits = number.replace('.', "");
    if digits.is_empty() || number.matches('.').count() > 1 {
        return Err(bad());
    }
    const SUFFIXES: &[&str] = &[
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let exponent = suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()));
    if SUFFIXES.contains(&suffix) || exponent {
        Ok(text)
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_defaults_become_requests_and_limits() {
        let r = MoverResources {
            cpu_request: Some(CPU_REQUEST.into()),
            memory_request: Some(MEMORY_REQUEST.into()),
            cpu_limit: Some(CPU_LIMIT.into()),
            memory_limit: Some(MEMORY_LIMIT.into()),
        };
        assert_eq!(
            serde_json::to_value(r.requirements().unwrap()).unwrap(),
            json!({
                "requests": {"cpu": "250m", "memory": "256Mi"},
                "limits": {"cpu": "2", "memory": "1Gi"}
            })
        );
    }

    #[test]
    fn entries_left_out_are_absent() {
        let r = MoverResources {
            memory_limit: Some("2Gi".into()),
            ..MoverResources::default()
        };
        assert_eq!(
            serde_json::to_value(r.requirements().unwrap()).unwrap(),
            json!({"limits": {"memory": "2Gi"}})
        );
        assert_eq!(MoverResources::default().requirements(), None);
    }

    #[test]
    fn quantities_are_checked() {
        for good in ["250m", "2", "0.5", "512Mi", "1Gi", "1e3", "100M", "1.5Gi"] {
            assert_eq!(check_quantity(good), Ok(good));
        }
        for bad in ["", "m", "1 Gi", "1GB", "-1", "1..5", "one", "1e", "Gi"] {
            assert!(check_quantity(bad).is_err(), "{bad}");
        }
        assert_eq!(
            check_quantity("1GB").unwrap_err().to_string(),
            "'1GB' is not a Kubernetes quantity (like 250m, 2, 512Mi or 1Gi)"
        );
    }
}
