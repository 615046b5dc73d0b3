//! The clients of a running job service: `ferry job` ([`job`]; syncs and protection in
//! [`sync`], repository keys in [`keys`]), `ferry schedule`
//! ([`schedule`]) and `ferry backup ... --server` ([`backup`]). Each turns flags into a
//! ferry-api request and prints the reply; they share how to reach the service
//! ([`connection`]) and the `--json` shapes ([`json`]).

pub mod backup;
pub mod connection;
pub mod job;
pub mod json;
pub mod keys;
pub mod schedule;
pub mod sync;
