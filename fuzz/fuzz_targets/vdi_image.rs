//! The input as a VDI image; see `ferry_fuzz_drivers::vdi_image`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::vdi_image(d));
