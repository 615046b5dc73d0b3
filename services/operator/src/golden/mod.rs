//! GoldenImages: an image source polled on a cron schedule ([`probe`] asks its version of
//! an HTTP(S), S3 or registry source anonymously, [`registry`] a registry image's digest;
//! a source with credentials is asked by a short-lived pod, [`probe_pod`], that reports
//! through its termination message, [`report`]), imported through a Transfer into a new
//! claim when the version changed, kept as that claim or as a VolumeSnapshot of it, the
//! newest imports kept and older ones deleted ([`plan`], pure), the newest recorded in the
//! status for `source: {goldenImage}` to read ([`reconcile`], [`source`]).

pub mod plan;
pub mod probe;
pub mod probe_pod;
pub mod reconcile;
pub mod registry;
pub mod report;
pub mod source;

pub use plan::Current;

use crate::crd::GoldenImage;

/// What holds `golden`'s current import: its claim, or (`keepAs: Snapshot`) its
/// VolumeSnapshot; None before its first import succeeded. What a consumer of the
/// GoldenImage (a Transfer, a VolumeImageSource's populator) reads.
pub fn current_import(golden: &GoldenImage) -> Option<Current> {
    golden.status.as_ref().and_then(plan::current)
}
