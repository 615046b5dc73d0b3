//! The one place where errors become gRPC status codes.
//!
//! Data-path errors carry a [`ErrorKind`]; the service adds the few outcomes that only
//! exist at its level (a used idempotency key, a busy target, a full queue, a job id
//! nobody knows, and the schedules' own: an unknown schedule, a taken name, a run still
//! going). Every handler returns [`ServiceError`] and converts here.

use ferry_core::{Error, ErrorKind};
use tonic::{Code, Status};

/// An error of a job service request.
#[derive(Debug)]
pub enum ServiceError {
    /// An error of the data path or of validation, classified by its kind.
    Core(Error),
    /// The idempotency key was used with a different request.
    KeyConflict { key: String, job_id: String },
    /// Another unfinished job writes the target and the caller asked not to wait.
    TargetBusy { target: String },
    /// The queue holds as many jobs as the server allows.
    QueueFull { limit: usize },
    /// No job with this id (never existed or pruned).
    UnknownJob { id: String },
    /// The server is shutting down.
    ShuttingDown,
    /// No schedule with this id or name.
    UnknownSchedule { id: String },
    /// Another schedule has this name.
    ScheduleNameTaken { name: String },
    /// The schedule's previous run has not finished.
    ScheduleBusy { name: String, job_id: String },
    /// The server holds as many schedules as it allows.
    TooManySchedules { limit: usize },
    /// InitRepository where a repository exists.
    RepositoryExists { url: String },
    /// EndRelay of a job that relays nothing.
    NotRelaying { id: String },
}

impl From<Error> for ServiceError {
    fn from(e: Error) -> Self {
        Self::Core(e)
    }
}

/// The gRPC code for an error kind.
pub fn code_for(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidInput => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Timeout => Code::DeadlineExceeded,
        ErrorKind::Disconnected => Code::Unavailable,
        ErrorKind::NoSpace => Code::ResourceExhausted,
        ErrorKind::Cancelled => Code::Cancelled,
        ErrorKind::Corrupt => Code::DataLoss,
        ErrorKind::Io | ErrorKind::Protocol | ErrorKind::Internal => Code::Internal,
        _ => Code::Unknown,
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Self {
        e.to_status()
    }
}

impl ServiceError {
    /// The status a caller gets for this error (its message is what a schedule records
    /// for a run that could not start).
    pub fn to_status(&self) -> Status {
        match self {
            ServiceError::Core(e) => Status::new(code_for(e.kind()), e.to_string()),
            ServiceError::KeyConflict { key, job_id } => Status::already_exists(format!(
                "idempotency key '{key}' was already used by job {job_id} with a different \
                 request: reuse the key only to retry the same request, or choose a new key"
            )),
            ServiceError::TargetBusy { target } => Status::failed_precondition(format!(
                "another unfinished job writes {target}: wait for it, cancel it, or start \
                 without refuse_if_target_busy to queue behind it"
            )),
            ServiceError::QueueFull { limit } => Status::resource_exhausted(format!(
                "the job queue is full ({limit} queued jobs): retry later or raise \
                 --max-queued-jobs"
            )),
            ServiceError::UnknownJob { id } => Status::not_found(format!(
                "no job with id '{id}' (it may have been pruned from the history)"
            )),
            ServiceError::ShuttingDown => {
                Status::unavailable("the server is shutting down: retry on the next one")
            }
            ServiceError::UnknownSchedule { id } => {
                Status::not_found(format!("no schedule with id or name '{id}'"))
            }
            ServiceError::ScheduleNameTaken { name } => Status::already_exists(format!(
                "a schedule named '{name}' exists: choose another name, or update that one"
            )),
            ServiceError::ScheduleBusy { name, job_id } => Status::failed_precondition(format!(
                "the previous run of schedule '{name}' (job {job_id}) has not finished: runs \
                 of a schedule never overlap; wait for it or cancel it"
            )),
            ServiceError::RepositoryExists { url } => Status::already_exists(format!(
                "{url} already holds a backup repository: use it, or choose another location"
            )),
            ServiceError::TooManySchedules { limit } => Status::resource_exhausted(format!(
                "the server holds {limit} schedules, as many as it allows: delete one first"
            )),
            ServiceError::NotRelaying { id } => Status::failed_precondition(format!(
                "job {id} does not relay its image (no target with `relay`): nothing to end"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        let s: Status = ServiceError::Core(Error::invalid_input("bad url")).into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("bad url"));
        let s: Status =
            ServiceError::Core(Error::new(ErrorKind::PermissionDenied, "outside")).into();
        assert_eq!(s.code(), Code::PermissionDenied);
        let s: Status = ServiceError::UnknownJob { id: "x".into() }.into();
        assert_eq!(s.code(), Code::NotFound);
        let s: Status = ServiceError::KeyConflict {
            key: "k".into(),
            job_id: "j".into(),
        }
        .into();
        assert_eq!(s.code(), Code::AlreadyExists);
        assert_eq!(code_for(ErrorKind::Disconnected), Code::Unavailable);
        let s: Status = ServiceError::NotRelaying { id: "x".into() }.into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        let s: Status = ServiceError::UnknownSchedule { id: "x".into() }.into();
        assert_eq!(s.code(), Code::NotFound);
        let s: Status = ServiceError::ScheduleNameTaken { name: "n".into() }.into();
        assert_eq!(s.code(), Code::AlreadyExists);
        let s: Status = ServiceError::ScheduleBusy {
            name: "n".into(),
            job_id: "j".into(),
        }
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(code_for(ErrorKind::Corrupt), Code::DataLoss);
    }
}
