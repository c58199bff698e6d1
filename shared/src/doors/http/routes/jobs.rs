//! `GET /jobs?kind=&status=`: jobs of the operator's desks, newest first.

use axum::extract::State;
use axum::response::Response;
use axum::Router;

use crate::app::AppState;
use crate::core::domain::{JobKind, JobStatus};
use crate::core::error::ApiError;
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, Query};
use crate::doors::http::openapi::{schema, Api, Op};
use crate::core::ports::JobFilter;
use crate::core::usecases::views::JobView;

pub fn api_doc() -> Api {
    Api::new().route(
        Op::get(api("/jobs"), "listJobs")
            .tag("reads")
            .summary(
                "Jobs of the operator's desks",
                "Jobs (positions syncs) newest first, with their results or errors, optionally by kind and status.",
            )
            .query("kind", schema::<JobKind>, "Only jobs of this kind.")
            .query("status", schema::<JobStatus>, "Only jobs in this status.")
            .paged()
            .answers(200, "One page of jobs, newest first.", schema::<JobPage>),
        handler,
    )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

#[allow(dead_code)]
#[derive(schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
struct JobPage {
    jobs: Vec<JobView<'static>>,
    /// The cursor of the next page; `null` on the last page.
    next_cursor: Option<String>,
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let filter = JobFilter {
        kind: q.parsed("kind")?,
        status: q.parsed("status")?,
    };
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.jobs(&caller, filter, &page).await?;
    Ok(super::listing("jobs", &l))
}
