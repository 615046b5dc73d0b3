//! Test support for the populator scenarios: the mocked API server of the reconciler
//! scenarios (so every request is checked against the operator's RBAC too), and the
//! populator's context over stores the test fills by hand (as the watches would).

#![allow(dead_code)]

use std::sync::Arc;

use ferry_operator::crd::{Restore, Transfer};
use ferry_operator::populator::Context;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::Value;

use super::ApiServer;

/// Everything a scenario needs: the server, the context, and the writers of its stores.
pub struct Harness {
    pub server: ApiServer,
    pub ctx: Arc<Context>,
    pub claims: Writer<PersistentVolumeClaim>,
    pub transfers: Writer<Transfer>,
    pub restores: Writer<Restore>,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_class_defaults(Default::default())
    }

    /// A harness whose prime claims grow by these StorageClassProfiles' overheads.
    pub fn with_class_defaults(defaults: ferry_operator::class_defaults::ClassDefaults) -> Self {
        let (client, server) = ApiServer::new();
        let claims = Writer::<PersistentVolumeClaim>::default();
        let transfers = Writer::<Transfer>::default();
        let restores = Writer::<Restore>::default();
        let ctx = Arc::new(
            Context::new(client, claims.as_reader(), transfers.as_reader())
                .with_restores(restores.as_reader())
                .with_class_defaults(defaults),
        );
        Self {
            server,
            ctx,
            claims,
            transfers,
            restores,
        }
    }

    /// The watch of populator Restores saw this Restore.
    pub fn restore_seen(&mut self, restore: &Value) {
        let r: Restore = serde_json::from_value(restore.clone()).unwrap();
        self.restores.apply_watcher_event(&watcher::Event::Apply(r));
    }

    /// The watch of claims saw this claim.
    pub fn claim_seen(&mut self, pvc: &Value) {
        let pvc: PersistentVolumeClaim = serde_json::from_value(pvc.clone()).unwrap();
        self.claims.apply_watcher_event(&watcher::Event::Apply(pvc));
    }

    /// The watch of populator Transfers saw this Transfer.
    pub fn transfer_seen(&mut self, transfer: &Value) {
        let t: Transfer = serde_json::from_value(transfer.clone()).unwrap();
        self.transfers
            .apply_watcher_event(&watcher::Event::Apply(t));
    }
}
