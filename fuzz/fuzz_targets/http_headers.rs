//! HTTP response header parsers (Content-Range, Content-Length, ETag); see `ferry_fuzz_drivers::http_headers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|d: &[u8]| ferry_fuzz_drivers::http_headers(d));
