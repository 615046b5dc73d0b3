//! The whole initiator against arbitrary target bytes: the first byte picks the mode
//! (see `ferry_fuzz::iscsi::Mode`); unless it asks for raw bytes, a valid login comes
//! first and the fuzzer's bytes are the full-feature phase (or the SendTargets answer).
#![no_main]

use ferry_fuzz::iscsi::{self, Mode};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let mode = Mode::from_byte(first);
    let mut script = if mode.raw {
        Vec::new()
    } else {
        iscsi::login_prefix(mode)
    };
    script.extend_from_slice(rest);
    iscsi::session(mode, script);
});
