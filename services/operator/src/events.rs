//! Kubernetes events from the operator: one recorder shape and one way to publish, for
//! the Transfer/Checksum reconcilers and the volume populator alike.

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

/// The reporter (and the field manager of every write) of the operator.
pub const REPORTER: &str = "ferry-operator";

/// Longest event note: the API server refuses notes over 1 KiB.
const MAX_NOTE: usize = 1000;

/// An event recorder reporting as the operator, from this pod (`POD_NAME`) when known.
pub fn recorder(client: Client) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: REPORTER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    )
}

/// Publishes an event on `obj`; a failure is logged, never fatal. `note` must hold no
/// secret (callers pass messages redacted at their source); it is cut to fit.
pub async fn publish<K: Resource<DynamicType = ()>>(
    recorder: &Recorder,
    obj: &K,
    warning: bool,
    reason: &str,
    note: &str,
) {
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(within(note, MAX_NOTE).to_string()),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &obj.object_ref(&())).await {
        tracing::warn!(reason, error = %e, "cannot publish an event");
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character.
pub(crate) fn within(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn notes_are_cut_on_a_character_within_the_limit() {
        assert_eq!(within("abc", 10), "abc");
        assert_eq!(within("aé", 2), "a");
        assert_eq!(within(&"é".repeat(600), 1000).len(), 1000);
    }
}
