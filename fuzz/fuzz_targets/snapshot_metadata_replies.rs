//! CSI SnapshotMetadata replies and their validation; see `ferry_fuzz_drivers::snapshot_metadata_replies`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::snapshot_metadata_replies(d));
