//! The bodies of ferry's fuzz targets as plain functions (protocol replies, image
//! formats), one per cargo-fuzz target in
//! `fuzz/fuzz_targets/` (each a one-line `fuzz_target!` calling its function here), with
//! their seed inputs and the fuzz smoke that runs them all on stable Rust in the test
//! suite (`tests/smoke.rs`). Dev only: nothing in the product depends on it.
//!
//! Adding a target is one function and one line in [`DRIVERS`] (plus its cargo-fuzz
//! binary; a test checks the two lists agree).

pub mod dict;
pub mod formats;
pub mod http;
pub mod iscsi;
pub mod mutate;
pub mod nbd;
pub mod nfs;
pub mod registry;
pub mod seeds;
pub mod smoke;
pub mod snapshot_metadata;

pub use formats::{
    compressed_stream, ova_image, qcow2_image, vdi_image, vhd_image, vhdx_image, vmdk_image,
};
pub use http::http_headers;
pub use iscsi::{iscsi_pdu, iscsi_session};
pub use nbd::{nbd_handshake, nbd_parsers, nbd_replies, nbd_server};
pub use nfs::{nfs4_compound_reply, nfs_rpc_reply, nfs_xdr};
pub use registry::{container_layer, registry_manifest};
pub use snapshot_metadata::snapshot_metadata_replies;

/// One fuzz target, as the smoke and `make-seeds` see it.
#[derive(Debug, Clone, Copy)]
pub struct Driver {
    /// The cargo-fuzz target's name (`fuzz/fuzz_targets/NAME.rs`) and its function's.
    pub name: &'static str,
    /// The target's body: must return (not panic, not hang) on every input.
    pub run: fn(&[u8]),
    /// Its seed inputs (the libFuzzer seed corpus, the smoke's starting points).
    pub seeds: fn() -> Vec<seeds::Seed>,
    /// The libFuzzer dictionary fuzz/README.md passes with `-dict=`, "" for none.
    pub dict: &'static str,
    /// Mutated inputs per smoke run: the whole smoke stays under about 30 s in a debug build.
    pub inputs: usize,
    /// The `-max_len` fuzz/README.md gives libFuzzer; the smoke cuts inputs to it.
    pub max_len: usize,
}

/// libFuzzer dictionaries, shared with the cargo-fuzz runs.
pub const NBD_DICT: &str = include_str!("../../../fuzz/seeds/nbd.dict");
pub const ISCSI_DICT: &str = include_str!("../../../fuzz/seeds/iscsi.dict");
pub const NFS_DICT: &str = include_str!("../../../fuzz/seeds/nfs.dict");

/// Every fuzz target. A new protocol's targets are a module with their functions, their
/// seeds in [`seeds`], and a line each here.
#[rustfmt::skip]
pub const DRIVERS: &[Driver] = &[
    Driver { name: "nbd_parsers", run: nbd_parsers, seeds: seeds::nbd_parsers, dict: NBD_DICT, inputs: 200_000, max_len: 4096 },
    Driver { name: "nbd_handshake", run: nbd_handshake, seeds: seeds::nbd_handshake, dict: NBD_DICT, inputs: 40_000, max_len: 16384 },
    Driver { name: "nbd_replies", run: nbd_replies, seeds: seeds::nbd_replies, dict: NBD_DICT, inputs: 25_000, max_len: 16384 },
    Driver { name: "nbd_server", run: nbd_server, seeds: seeds::nbd_server, dict: NBD_DICT, inputs: 10_000, max_len: 16384 },
    Driver { name: "iscsi_pdu", run: iscsi_pdu, seeds: seeds::iscsi_pdu, dict: ISCSI_DICT, inputs: 200_000, max_len: 16384 },
    Driver { name: "iscsi_session", run: iscsi_session, seeds: seeds::iscsi_session, dict: ISCSI_DICT, inputs: 8_000, max_len: 16384 },
    Driver { name: "nfs_xdr", run: nfs_xdr, seeds: seeds::nfs_xdr, dict: NFS_DICT, inputs: 20_000, max_len: 4096 },
    Driver { name: "nfs_rpc_reply", run: nfs_rpc_reply, seeds: seeds::nfs_rpc_reply, dict: NFS_DICT, inputs: 20_000, max_len: 4096 },
    Driver { name: "nfs4_compound_reply", run: nfs4_compound_reply, seeds: seeds::nfs4_compound_reply, dict: NFS_DICT, inputs: 20_000, max_len: 4096 },
    Driver { name: "qcow2_image", run: qcow2_image, seeds: seeds::qcow2_image, dict: "", inputs: 10_000, max_len: 16384 },
    Driver { name: "http_headers", run: http_headers, seeds: seeds::http_headers, dict: "", inputs: 100_000, max_len: 512 },
    Driver { name: "compressed_stream", run: compressed_stream, seeds: seeds::compressed_stream, dict: "", inputs: 3_000, max_len: 16384 },
    Driver { name: "vmdk_image", run: vmdk_image, seeds: seeds::vmdk_image, dict: "", inputs: 5_000, max_len: 16384 },
    Driver { name: "vhd_image", run: vhd_image, seeds: seeds::vhd_image, dict: "", inputs: 5_000, max_len: 16384 },
    Driver { name: "vhdx_image", run: vhdx_image, seeds: seeds::vhdx_image, dict: "", inputs: 2_000, max_len: 32768 },
    Driver { name: "vdi_image", run: vdi_image, seeds: seeds::vdi_image, dict: "", inputs: 5_000, max_len: 16384 },
    Driver { name: "ova_image", run: ova_image, seeds: seeds::ova_image, dict: "", inputs: 5_000, max_len: 16384 },
    Driver { name: "registry_manifest", run: registry_manifest, seeds: seeds::registry_manifest, dict: "", inputs: 20_000, max_len: 8192 },
    Driver { name: "snapshot_metadata_replies", run: snapshot_metadata_replies, seeds: seeds::snapshot_metadata_replies, dict: "", inputs: 50_000, max_len: 4096 },
    Driver { name: "container_layer", run: container_layer, seeds: seeds::container_layer, dict: "", inputs: 3_000, max_len: 16384 },
];
