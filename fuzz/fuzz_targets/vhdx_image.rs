//! The input as a VHDX image; see `ferry_fuzz_drivers::vhdx_image`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::vhdx_image(d));
