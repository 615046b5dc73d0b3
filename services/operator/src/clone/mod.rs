//! Transfers made by the storage instead of by a mover: a VolumeSnapshot of the source
//! claim restored into every new claim, or CSI clones of it, with a copy as the fallback
//! ([`strategy`] decides, [`plan`] builds, [`reconcile`] carries it out).

pub mod plan;
pub mod reconcile;
pub mod strategy;

#[cfg(test)]
mod tests;
