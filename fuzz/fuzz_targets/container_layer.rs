//! A containerDisk layer (plain or gzip tar) opened and read; see `ferry_fuzz_drivers::container_layer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::container_layer(d));
