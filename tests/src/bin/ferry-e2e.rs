//! The `ferry` command, built inside the tests package so that `cargo test` always runs
//! the current code (integration tests find it as `CARGO_BIN_EXE_ferry-e2e`).

use std::process::ExitCode;

fn main() -> ExitCode {
    ferry::app::main()
}
