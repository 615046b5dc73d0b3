//! Cron expressions in a time zone: the parsing and next-fire search live in ferry-cron,
//! shared with the Kubernetes operator's backup schedules.

pub use ferry_cron::*;
