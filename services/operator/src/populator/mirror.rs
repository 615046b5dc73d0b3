//! The life of the resource filling the prime claim (a Transfer of an image, a Restore of
//! a backup) told on the user's claim: users watch their claim (`kubectl describe pvc`),
//! not the resource behind it, so each phase change and each tenth of the
//! copy becomes one event there. What was last told is remembered per claim so repeated
//! reconciles (every status write of the Transfer wakes the claim) stay quiet; after a
//! restart the current state is told once more.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::crd::status::condition;
use crate::crd::{Phase, Progress, Restore, Transfer};

/// A resource that fills a prime claim, as its events tell it.
pub trait Filler {
    /// Its kind (`Transfer`).
    const KIND: &'static str;
    /// What it does while it runs (`copies the image`).
    const DOING: &'static str;
    /// What it did (`copied the image`).
    const DONE: &'static str;
    /// Its name.
    fn name(&self) -> &str;
    /// Its phase (Pending without a status).
    fn phase(&self) -> Phase;
    /// Its progress.
    fn progress(&self) -> Progress;
    /// Its message.
    fn message(&self) -> Option<&str>;
    /// Its conditions.
    fn conditions(&self) -> &[Condition];
    /// Its mover pod and node.
    fn mover(&self) -> (Option<&str>, Option<&str>);
}

macro_rules! filler {
    ($kind:ty, $doing:expr, $done:expr) => {
        impl Filler for $kind {
            const KIND: &'static str = stringify!($kind);
            const DOING: &'static str = $doing;
            const DONE: &'static str = $done;
            fn name(&self) -> &str {
                self.metadata.name.as_deref().unwrap_or_default()
            }
            fn phase(&self) -> Phase {
                self.status.as_ref().map(|s| s.phase).unwrap_or_default()
            }
            fn progress(&self) -> Progress {
                self.status
                    .as_ref()
                    .and_then(|s| s.progress)
                    .unwrap_or_default()
            }
            fn message(&self) -> Option<&str> {
                self.status.as_ref().and_then(|s| s.message.as_deref())
            }
            fn conditions(&self) -> &[Condition] {
                self.status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default()
            }
            fn mover(&self) -> (Option<&str>, Option<&str>) {
                match &self.status {
                    Some(s) => (s.mover_pod.as_deref(), s.node.as_deref()),
                    None => (None, None),
                }
            }
        }
    };
}

filler!(Transfer, "copies the image", "copied the image");
filler!(Restore, "restores the backup", "restored the backup");

/// What the claim's events last said about its filler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Said {
    /// The Transfer's phase.
    pub phase: Phase,
    /// Tenths of the copy done (0..=10).
    pub tenths: u8,
}

/// An event to publish on the user's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Warning rather than Normal.
    pub warning: bool,
    /// The event reason.
    pub reason: &'static str,
    /// What happened.
    pub text: String,
}

/// Where the filler is now.
pub fn now<F: Filler>(filler: &F) -> Said {
    let progress = filler.progress();
    let tenths = if progress.total_bytes == 0 {
        0
    } else {
        let t = u128::from(progress.done_bytes.min(progress.total_bytes)) * 10
            / u128::from(progress.total_bytes);
        u8::try_from(t).unwrap_or(10)
    };
    Said {
        phase: filler.phase(),
        tenths,
    }
}

/// The claim's progress annotation: the tenths done, as a percentage (`40%`); `100%`
/// once the filler succeeded.
pub fn progress_text<F: Filler>(filler: &F) -> String {
    let now = now(filler);
    let percent = if now.phase == Phase::Succeeded {
        100
    } else {
        u32::from(now.tenths) * 10
    };
    format!("{percent}%")
}

fn ready_message(conditions: &[Condition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .map(|c| c.message.as_str())
        .filter(|m| !m.is_empty())
}

/// The event that tells `now` after `last` was told, or None when nothing new happened
/// (the copy's progress is told only while it runs).
pub fn note<F: Filler>(last: Option<Said>, now: Said, filler: &F, prime: &str) -> Option<Note> {
    let same_phase = last.is_some_and(|l| l.phase == now.phase);
    if same_phase && (now.phase != Phase::Running || last.is_some_and(|l| l.tenths >= now.tenths)) {
        return None;
    }
    let name = filler.name();
    let kind = F::KIND;
    let why = filler
        .message()
        .or_else(|| ready_message(filler.conditions()))
        .unwrap_or("no message");
    let normal = |reason, text| {
        Some(Note {
            warning: false,
            reason,
            text,
        })
    };
    let warning = |reason, text| {
        Some(Note {
            warning: true,
            reason,
            text,
        })
    };
    let kept = format!("pvc/{prime} is kept for inspection; delete {kind} {name} to try again");
    match now.phase {
        Phase::Pending => normal(
            "PopulatorPending",
            format!("{kind} {name} is pending: {why}"),
        ),
        Phase::Running => {
            let progress = filler.progress();
            let (pod, node) = filler.mover();
            let text = format!(
                "{kind} {name} {} into pvc/{prime}: {} of {} bytes ({}%) by mover pod {} on node {}",
                F::DOING,
                progress.done_bytes,
                progress.total_bytes,
                u32::from(now.tenths) * 10,
                pod.unwrap_or("-"),
                node.unwrap_or("-"),
            );
            let reason = if same_phase {
                "PopulatorProgress"
            } else {
                "PopulatorRunning"
            };
            normal(reason, text)
        }
        Phase::Succeeded => normal(
            "ImageCopied",
            format!(
                "{kind} {name} {} into pvc/{prime}; its volume is rebound to this claim once bound",
                F::DONE
            ),
        ),
        Phase::Failed => warning(
            "PopulatorFailed",
            format!("{kind} {name} failed: {why}; {kept}"),
        ),
        Phase::Cancelled => warning(
            "PopulatorCancelled",
            format!("{kind} {name} was cancelled: {why}; {kept}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn transfer(status: serde_json::Value) -> Transfer {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "disk", "namespace": "vms"},
            "spec": {"source": {"url": "s3://b/k"}, "targets": [{"pvc": {"name": "p"}}]},
            "status": status,
        }))
        .unwrap()
    }

    fn running(done: u64) -> Transfer {
        transfer(
            json!({"phase": "Running", "moverPod": "disk-ft-1", "node": "n1",
                        "progress": {"totalBytes": 1000, "doneBytes": done}}),
        )
    }

    #[test]
    fn phases_and_tenths_are_told_once() {
        let t = running(250);
        let said = now(&t);
        assert_eq!(
            said,
            Said {
                phase: Phase::Running,
                tenths: 2
            }
        );
        let first = note(None, said, &t, "p").unwrap();
        assert_eq!(first.reason, "PopulatorRunning");
        assert!(
            first
                .text
                .contains("250 of 1000 bytes (20%) by mover pod disk-ft-1 on node n1"),
            "{}",
            first.text
        );
        assert_eq!(note(Some(said), said, &t, "p"), None);
        let later = running(299);
        assert_eq!(note(Some(said), now(&later), &later, "p"), None);
        let later = running(400);
        assert_eq!(
            note(Some(said), now(&later), &later, "p").unwrap().reason,
            "PopulatorProgress"
        );
    }

    #[test]
    fn failures_are_warnings_that_keep_the_prime() {
        let t = transfer(json!({"phase": "Failed", "message": "source: 404 Not Found"}));
        let n = note(None, now(&t), &t, "ferry-prime-u").unwrap();
        assert!(n.warning);
        assert_eq!(n.reason, "PopulatorFailed");
        assert_eq!(
            n.text,
            "Transfer disk failed: source: 404 Not Found; pvc/ferry-prime-u is kept for inspection; delete Transfer disk to try again"
        );
        let pending = transfer(json!({"phase": "Pending"}));
        assert_eq!(
            note(None, now(&pending), &pending, "p").unwrap().reason,
            "PopulatorPending"
        );
        let no_status: Transfer = transfer(serde_json::Value::Null);
        assert_eq!(now(&no_status).phase, Phase::Pending);
    }
}
