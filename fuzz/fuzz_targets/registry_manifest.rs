//! Registry manifests, indexes, auth challenges, token replies and config.json; see `ferry_fuzz_drivers::registry_manifest`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::registry_manifest(d));
