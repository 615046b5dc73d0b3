//! What every populator reconcile shares: the client, the stores of claims (every claim,
//! so prime claims are read at no cost) and of populator Transfers and Restores, the event recorder,
//! and what the claim's events last said about each Transfer. The stores are filled by
//! watches; what they miss (a just-created object) is created again and the conflict
//! taken as success, so they only save requests, never decide alone.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Client;
use parking_lot::Mutex;

use crate::crd::{Restore, Transfer};
use crate::events;

use super::mirror::{self, Filler, Note, Said};

/// Shared by every populator reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Every claim of the cluster.
    pub claims: Store<PersistentVolumeClaim>,
    /// The Transfers the populator created.
    pub transfers: Store<Transfer>,
    /// The Restores the populator created.
    pub restores: Store<Restore>,
    /// What the StorageClassProfiles say (the file-system overhead of a prime claim).
    pub class_defaults: crate::class_defaults::ClassDefaults,
    recorder: Recorder,
    said: Mutex<HashMap<String, Said>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("claims", &self.claims.len())
            .field("transfers", &self.transfers.len())
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over this client and these stores.
    pub fn new(
        client: Client,
        claims: Store<PersistentVolumeClaim>,
        transfers: Store<Transfer>,
    ) -> Self {
        Self {
            recorder: events::recorder(client.clone()),
            client,
            claims,
            transfers,
            restores: Writer::<Restore>::default().as_reader(),
            class_defaults: crate::class_defaults::ClassDefaults::default(),
            said: Mutex::default(),
        }
    }

    /// The same context reading populator Restores from `restores`.
    pub fn with_restores(mut self, restores: Store<Restore>) -> Self {
        self.restores = restores;
        self
    }

    /// The same context reading the StorageClassProfiles from `defaults`.
    pub fn with_class_defaults(mut self, defaults: crate::class_defaults::ClassDefaults) -> Self {
        self.class_defaults = defaults;
        self
    }

    /// The populator Restore `name` in `namespace`, as last watched.
    pub fn restore(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Restore>> {
        self.restores.get(&ObjectRef::new(name).within(namespace))
    }

    /// The claim `name` in `namespace`, as last watched.
    pub fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<std::sync::Arc<PersistentVolumeClaim>> {
        self.claims.get(&ObjectRef::new(name).within(namespace))
    }

    /// The populator Transfer `name` in `namespace`, as last watched.
    pub fn transfer(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Transfer>> {
        self.transfers.get(&ObjectRef::new(name).within(namespace))
    }

    /// Publishes an event on the user's claim; a failure is logged, never fatal.
    pub async fn event(
        &self,
        pvc: &PersistentVolumeClaim,
        warning: bool,
        reason: &str,
        note: &str,
    ) {
        events::publish(&self.recorder, pvc, warning, reason, note).await;
    }

    /// The event telling the filler's state on the claim `uid`, if it has news (and
    /// remembers it as told).
    pub fn news<F: Filler>(&self, uid: &str, filler: &F, prime: &str) -> Option<Note> {
        let now = mirror::now(filler);
        let mut said = self.said.lock();
        let note = mirror::note(said.get(uid).copied(), now, filler, prime)?;
        said.insert(uid.to_string(), now);
        Some(note)
    }

    /// The claim is populated: nothing more to tell about it.
    pub fn forget(&self, uid: &str) {
        self.said.lock().remove(uid);
    }
}
