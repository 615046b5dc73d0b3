//! The `ferry` binary: a thin front over the ferry library ([`ferry::app::main`]).

fn main() -> std::process::ExitCode {
    ferry::app::main()
}
