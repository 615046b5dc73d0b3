//! Events as the cluster's components write them: core/v1 Events naming the object, with
//! the reason and message a real component uses; a repeat of the same reason and message
//! on the same object counts up instead of writing a new Event, as the client-go event
//! recorder's correlator does.

use serde_json::{json, Value};

use crate::kube::state::{now, State};
use crate::kube::store::Key;

/// A repeat of an Event within this many seconds is not written (a component retrying
/// backs off; without this every pass of a controller would count the Event up).
const REPEAT_AFTER_SECS: i64 = 10;

/// A component's event on `involved`.
pub fn record(
    state: &mut State,
    involved: &Value,
    warning: bool,
    reason: &str,
    message: &str,
    component: &str,
) {
    let namespace = involved["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let uid = involved["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let same = state
        .store
        .list("", "events", Some(&namespace))
        .find(|(_, e)| {
            e["involvedObject"]["uid"] == uid.as_str()
                && e["reason"] == reason
                && e["message"] == message
        })
        .map(|(k, e)| (k.clone(), e.clone()));
    if let Some((key, mut e)) = same {
        let last = e["lastTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map_or(0, |t| t.as_second());
        if k8s_openapi::jiff::Timestamp::now().as_second() - last < REPEAT_AFTER_SECS {
            return; // the same again so soon: a component backs off before repeating
        }
        e["count"] = json!(e["count"].as_i64().unwrap_or(1) + 1);
        e["lastTimestamp"] = json!(now());
        state.replace(&key, e);
        return;
    }
    let name = involved["metadata"]["name"].as_str().unwrap_or_default();
    let event_name = format!("{name}.{:016x}", state.next_seq());
    let at = now();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved["apiVersion"], "kind": involved["kind"], "name": name,
            "namespace": involved["metadata"]["namespace"], "uid": uid,
            "resourceVersion": involved["metadata"]["resourceVersion"],
        },
        "reason": reason, "message": message,
        "type": if warning { "Warning" } else { "Normal" },
        "source": {"component": component},
        "reportingComponent": component, "reportingInstance": "",
        "firstTimestamp": at, "lastTimestamp": at, "count": 1,
    });
    let _ = state.create_object(event);
}

/// The Events of an object, by its key, oldest first: (type, reason, message).
pub fn of(state: &State, key: &Key) -> Vec<(String, String, String)> {
    let Some(uid) = state
        .store
        .get(key)
        .and_then(|o| o["metadata"]["uid"].as_str().map(String::from))
    else {
        return Vec::new();
    };
    let mut events: Vec<&Value> = state
        .store
        .list("", "events", None)
        .map(|(_, e)| e)
        .filter(|e| e["involvedObject"]["uid"] == uid.as_str())
        .collect();
    events.sort_by_key(|e| {
        e["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
    });
    events
        .iter()
        .map(|e| {
            let s = |f: &str| e[f].as_str().unwrap_or_default().to_string();
            (s("type"), s("reason"), s("message"))
        })
        .collect()
}
