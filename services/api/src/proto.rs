//! The generated gRPC types of package ferry.v1, and the descriptor set for reflection.

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

tonic::include_proto!("ferry.v1");

/// The encoded FileDescriptorSet of ferry.v1 (with its imports), served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ferry_v1_descriptor");

/// The fully qualified service name, as health checks and reflection list it.
pub const JOB_SERVICE_NAME: &str = "ferry.v1.JobService";

/// The fully qualified name of the schedule service.
pub const SCHEDULE_SERVICE_NAME: &str = "ferry.v1.ScheduleService";

/// The fully qualified name of the backup repository service.
pub const BACKUP_SERVICE_NAME: &str = "ferry.v1.BackupService";
