//! The `ferry` binary: a thin front over the ferry-mover library.

fn main() -> std::process::ExitCode {
    ferry_mover::app::main()
}
