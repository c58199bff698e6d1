//! `GET /jobs?kind=&status=`: jobs of the operator's desks, newest first.

use crate::core::domain::{JobKind, JobStatus};
use crate::core::ports::JobFilter;
use crate::core::usecases::views::JobView;

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
    page: JobPage { jobs: JobView<'static> },
    filter: |q| JobFilter {
        kind: q.parsed("kind")?,
        status: q.parsed("status")?,
    },
    read: |st, caller, filter, page| st.reads.jobs(&caller, filter, &page).await?,
}
