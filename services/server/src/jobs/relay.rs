//! A transfer's relay (`Endpoint.relay`): while the job writes the relayed target, the
//! image written so far is served over NBD ([`ferry_endpoints::relay`]), so other movers
//! read it from this one instead of from the origin. The job's message names the URI;
//! the job ends after the relay does.

use ferry_core::{EndpointSpec, Error, Result};
use ferry_endpoints::relay::Relay;
use ferry_engine::Progress;

use super::Inner;
use crate::convert::TransferSpec;

/// Starts the relay a target of `spec` asks for, if any, once the targets are open (a
/// file target exists by then): the relayed target's index and the relay.
pub(super) async fn start(
    inner: &Inner,
    id: &str,
    spec: &TransferSpec,
    size: u64,
) -> Result<Option<(usize, Relay)>> {
    let Some((index, options)) = &spec.relay else {
        return Ok(None);
    };
    let access = spec
        .targets()
        .nth(*index)
        .ok_or_else(|| Error::internal("the relayed target is not among the job's targets"))?;
    let (target, _) = access.open(&inner.secrets)?;
    let EndpointSpec::File(path) = target else {
        return Err(Error::invalid_input(
            "a relay serves from a file or block device target",
        ));
    };
    let relay = Relay::start(&path, size, options).await?;
    inner.relay_started(id, relay.release_handle());
    tracing::info!(uri = relay.uri(), "relaying the image while it is copied");
    let message = format!("relaying at {}", relay.uri());
    inner.update(id, |r| {
        r.message = message.clone();
        true
    });
    Ok(Some((*index, relay)))
}

/// The copy's progress, reporting what it writes to the relay if there is one.
pub(super) fn progress(relay: Option<&(usize, Relay)>) -> Progress {
    match relay {
        Some((_, relay)) => Progress::with_written(relay.written()),
        None => Progress::new(),
    }
}

/// After the copy: serves the finished image to its clients (or fails their reads).
pub(super) async fn end(relay: Option<(usize, Relay)>) {
    if let Some((_, relay)) = relay {
        relay.end().await;
    }
}
