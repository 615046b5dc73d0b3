//! The whole client against arbitrary server bytes from the first byte on.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferry_fuzz::session(data.to_vec());
});
