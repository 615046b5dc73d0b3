//! GoldenImages: an image source polled on a cron schedule ([`probe`] asks its version,
//! [`registry`] a registry image's digest),
//! imported through a Transfer into a new claim when the version changed, the newest
//! imports kept and older claims deleted ([`plan`], pure), the newest claim recorded in
//! the status for `source: {goldenImage}` to read ([`reconcile`], [`source`]).

pub mod plan;
pub mod probe;
pub mod probe_pod;
pub mod reconcile;
pub mod registry;
pub mod report;
pub mod source;
