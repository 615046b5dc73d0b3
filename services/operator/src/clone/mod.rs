//! Transfers made by the storage instead of by a mover: a VolumeSnapshot of the source
//! claim restored into every new claim, or CSI clones of it, with a copy as the fallback
//! ([`strategy`] decides, [`plan`] builds, [`reconcile`] carries it out). A source claim in
//! another namespace is cloned there by a child Transfer and its volumes handed over
//! ([`cross`], [`handover`], [`cross_reconcile`]), once the creator may read it.

pub mod cross;
pub mod cross_reconcile;
pub mod handover;
pub mod plan;
pub mod reconcile;
pub mod strategy;

#[cfg(test)]
mod cross_tests;
#[cfg(test)]
mod tests;
