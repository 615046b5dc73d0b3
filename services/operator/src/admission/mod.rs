//! The operator's mutating admission webhook: it records who created a Transfer whose
//! source claim is in another namespace ([`stamp`], [`review`]), so that the reconciler
//! can ask the API server whether that user may read the claim before anything is done
//! there (CDI does the same for a DataVolume's cross-namespace clone). [`server`] serves
//! it over HTTPS with a certificate from the movers' CA, whose certificate the operator
//! puts into the MutatingWebhookConfiguration's caBundle ([`install`]).

pub mod install;
pub mod review;
pub mod server;
pub mod stamp;

#[cfg(test)]
mod tests;
