//! The `ferry` binary as a library: [`app::main`] parses the command line and runs it; the
//! binary and the end-to-end tests' copy of it only call that.
//!
//! [`cli`] holds one module per command: the data path in this process (`copy`, `checksum`,
//! `info`, `backup`), `serve` (flags, environment and a config file into ferry-server's
//! configuration), `operator`, and [`cli::remote`], the clients of a running service
//! (`ferry job`, `ferry schedule`, `ferry backup --server`).

mod allocator;
pub mod app;
pub mod cli;
