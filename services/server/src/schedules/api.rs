//! The `ferry.v1.ScheduleService` gRPC handlers: thin glue from requests to the schedule
//! manager; errors become status codes in [`crate::status`] only.

use tonic::{Request, Response, Status};

use super::convert::{missed_from_proto, schedule_to_proto};
use super::template::Template;
use super::{NewSchedule, ScheduleChange, ScheduleManager};
use crate::api::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
use crate::convert::job_to_proto;
use crate::metrics::RequestGuard;
use crate::status::ServiceError;
use ferry_api::proto::{self, schedule_service_server::ScheduleService};

/// The service implementation.
#[derive(Debug, Clone)]
pub struct ScheduleApi {
    schedules: ScheduleManager,
}

impl ScheduleApi {
    pub fn new(schedules: ScheduleManager) -> Self {
        Self { schedules }
    }

    fn guard(&self, method: &'static str) -> RequestGuard {
        self.schedules.metrics().request(method)
    }
}

fn reply<T>(mut guard: RequestGuard, r: Result<T, ServiceError>) -> Result<Response<T>, Status> {
    match r {
        Ok(v) => {
            guard.set_code(tonic::Code::Ok);
            Ok(Response::new(v))
        }
        Err(e) => {
            let status: Status = e.into();
            guard.set_code(status.code());
            Err(status)
        }
    }
}

#[tonic::async_trait]
impl ScheduleService for ScheduleApi {
    async fn create_schedule(
        &self,
        request: Request<proto::CreateScheduleRequest>,
    ) -> Result<Response<proto::Schedule>, Status> {
        let guard = self.guard("CreateSchedule");
        let req = request.into_inner();
        let r = async {
            let new = NewSchedule {
                template: Template::from_proto(req.template.as_ref())?,
                missed: missed_from_proto(req.missed_run_policy)?,
                name: req.name,
                cron: req.cron,
                time_zone: req.time_zone,
                paused: req.paused,
                labels: req.labels,
            };
            let record = self.schedules.create(new).await?;
            Ok(schedule_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn get_schedule(
        &self,
        request: Request<proto::GetScheduleRequest>,
    ) -> Result<Response<proto::Schedule>, Status> {
        let guard = self.guard("GetSchedule");
        let r = self
            .schedules
            .get(&request.get_ref().id)
            .map(|r| schedule_to_proto(&r));
        reply(guard, r)
    }

    async fn list_schedules(
        &self,
        request: Request<proto::ListSchedulesRequest>,
    ) -> Result<Response<proto::ListSchedulesResponse>, Status> {
        let guard = self.guard("ListSchedules");
        let req = request.get_ref();
        let size = match req.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let (page, next) = self.schedules.list(&req.labels, size, &req.page_token);
        reply(
            guard,
            Ok(proto::ListSchedulesResponse {
                schedules: page.iter().map(schedule_to_proto).collect(),
                next_page_token: next,
            }),
        )
    }

    async fn update_schedule(
        &self,
        request: Request<proto::UpdateScheduleRequest>,
    ) -> Result<Response<proto::Schedule>, Status> {
        let guard = self.guard("UpdateSchedule");
        let req = request.into_inner();
        let r = async {
            let change = ScheduleChange {
                cron: req.cron,
                time_zone: req.time_zone,
                paused: req.paused,
                missed: req.missed_run_policy.map(missed_from_proto).transpose()?,
                template: req
                    .template
                    .as_ref()
                    .map(|t| Template::from_proto(Some(t)))
                    .transpose()?,
            };
            let record = self.schedules.update(&req.id, change).await?;
            Ok(schedule_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn delete_schedule(
        &self,
        request: Request<proto::DeleteScheduleRequest>,
    ) -> Result<Response<proto::DeleteScheduleResponse>, Status> {
        let guard = self.guard("DeleteSchedule");
        let r = self.schedules.delete(&request.get_ref().id).await.map(|r| {
            proto::DeleteScheduleResponse {
                schedule: Some(schedule_to_proto(&r)),
            }
        });
        reply(guard, r)
    }

    async fn run_schedule_now(
        &self,
        request: Request<proto::RunScheduleNowRequest>,
    ) -> Result<Response<proto::RunScheduleNowResponse>, Status> {
        let guard = self.guard("RunScheduleNow");
        let r = self
            .schedules
            .run_now(&request.get_ref().id)
            .await
            .map(|(s, j)| proto::RunScheduleNowResponse {
                schedule: Some(schedule_to_proto(&s)),
                job: Some(job_to_proto(&j)),
            });
        reply(guard, r)
    }

    async fn pause_schedule(
        &self,
        request: Request<proto::PauseScheduleRequest>,
    ) -> Result<Response<proto::Schedule>, Status> {
        let guard = self.guard("PauseSchedule");
        let r = self
            .schedules
            .set_paused(&request.get_ref().id, true)
            .await
            .map(|r| schedule_to_proto(&r));
        reply(guard, r)
    }

    async fn resume_schedule(
        &self,
        request: Request<proto::ResumeScheduleRequest>,
    ) -> Result<Response<proto::Schedule>, Status> {
        let guard = self.guard("ResumeSchedule");
        let r = self
            .schedules
            .set_paused(&request.get_ref().id, false)
            .await
            .map(|r| schedule_to_proto(&r));
        reply(guard, r)
    }
}
