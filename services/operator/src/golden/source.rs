//! `source: {goldenImage: {name}}`: a Transfer reads the claim its GoldenImage names as
//! current, looked up once, when the Transfer starts, and recorded in its status
//! (`sourceClaim`), so a newer import during the copy changes nothing. From then on the
//! Transfer is reconciled as one whose source is that claim (a storage clone where the
//! storage can, a copy otherwise).

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::Api;

use crate::clone::reconcile::Resolved;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::{write_status, Ids};
use crate::controller::plan as mover_plan;
use crate::crd::status::condition::reason;
use crate::crd::{Endpoint, GoldenImage, PvcRef, Transfer};

/// How often a Transfer waiting for its GoldenImage's first import looks again.
const WAIT: Duration = Duration::from_secs(10);

/// `obj` with its source the claim `claim` (the source's format and path kept).
pub fn with_claim(obj: &Transfer, claim: &str) -> Transfer {
    let mut t = obj.clone();
    let golden = std::mem::take(&mut t.spec.source);
    t.spec.source = Endpoint {
        pvc: Some(PvcRef {
            name: claim.to_string(),
            path: None,
            namespace: None,
        }),
        format: golden.format,
        allow_backing: golden.allow_backing,
        ..Endpoint::default()
    };
    t
}

/// Resolves a GoldenImage source: the recorded claim, or the GoldenImage's current one
/// (recorded now), or a wait with the reason.
pub async fn resolve(obj: Arc<Transfer>, ctx: &Context) -> Result<Resolved, Error> {
    let Some(golden) = obj.spec.source.golden_image.clone() else {
        return Ok(Resolved::Ready(obj));
    };
    let status = obj.status.clone().unwrap_or_default();
    if let Some(claim) = &status.source_claim {
        return Ok(Resolved::Ready(Arc::new(with_claim(&obj, claim))));
    }
    if obj.metadata.deletion_timestamp.is_some()
        || status.phase.is_final()
        || obj.spec.validate().is_err()
    {
        return Ok(Resolved::Ready(obj));
    }
    let ids = Ids::of(obj.as_ref())?;
    let api: Api<GoldenImage> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let current = api
        .get_opt(&golden.name)
        .await?
        .and_then(|g| g.status.and_then(|s| s.current_claim));
    let mut next = match &current {
        Some(claim) => {
            let mut next = status.clone();
            next.source_claim = Some(claim.clone());
            next
        }
        None => {
            let text = format!(
                "waiting for GoldenImage {} to hold an image: create it, or wait for its first import",
                golden.name
            );
            mover_plan::waiting(obj.as_ref(), &status, reason::PENDING, &text)
        }
    };
    next.observed_generation = obj.metadata.generation;
    if !crate::controller::life::same_status(&status, &next) {
        write_status(ctx, &ids, obj.as_ref(), &next).await?;
    }
    Ok(Resolved::Done(if current.is_some() {
        Action::requeue(Duration::ZERO)
    } else {
        Action::requeue(WAIT)
    }))
}
