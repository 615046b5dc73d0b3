//! ferry-mover: the command line, the job service and everything around the data path
//! (jobs, scheduling, persistence, metrics, tracing). The binaries only call [`app::main`].

mod allocator;
pub mod app;
pub mod cli;
pub mod operator_link;
pub mod options;
pub mod service;
