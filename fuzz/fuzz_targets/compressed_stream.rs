//! The input as a gz, xz or zst image; see `ferry_fuzz_drivers::compressed_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::compressed_stream(d));
