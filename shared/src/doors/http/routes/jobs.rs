//! `GET /jobs?kind=&status=`: jobs of the operator's desks, newest first.

use serde::Deserialize;

use crate::core::domain::{Job, JobKind, JobStatus};
use crate::core::ports::JobFilter;

// The tool's arguments (a doc comment would show in the tool's input schema).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobsArgs {
    kind: Option<JobKind>,
    status: Option<JobStatus>,
    #[schemars(range(min = 1, max = 200))]
    limit: Option<u32>,
    cursor: Option<String>,
}

listing_route! {
    name: "jobs",
    operation: "listJobs",
    summary: (
        "Jobs of the operator's desks",
        "Jobs (positions syncs) newest first, with their results or errors, optionally by kind and status."
    ),
    queries: [
        ("kind", JobKind, "Only jobs of this kind."),
        ("status", JobStatus, "Only jobs in this status."),
    ],
    errors: [],
    answer: "One page of jobs, newest first.",
    page: JobPage { jobs: Job },
    filter: |q| JobFilter {
        kind: q.parsed("kind")?,
        status: q.parsed("status")?,
    },
    tool: (
        "list_jobs",
        "List jobs",
        "Jobs (positions syncs) newest first, with their results or errors."
    ),
    args: JobsArgs => |a| JobFilter {
        kind: a.kind,
        status: a.status,
    },
    read: |reads, caller, filter, page| reads.jobs(caller, filter, page).await?,
}
