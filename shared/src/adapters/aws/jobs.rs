//! Jobs on DynamoDB: the jobs table and its desk and account indexes.

use super::ddb::{self, from_body, s, time_key, Item};
use super::tables::{before_key, NO_DESK};
use super::Aws;
use crate::core::auth::DeskScope;
use crate::core::domain::Job;
use crate::core::error::StoreResult;
use crate::core::ports::{JobFilter, JobStore, Page, TimeKey};
use async_trait::async_trait;
use std::collections::HashMap;

#[async_trait]
impl JobStore for Aws {
    async fn list_jobs(
        &self,
        desks: &DeskScope,
        filter: &JobFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Job>> {
        let before = before_key(&page.after);
        let want = page.limit as usize;
        let mut filters = Vec::new();
        if let Some(k) = filter.kind {
            filters.push(("kind", k.as_str().to_string()));
        }
        if let Some(st) = filter.status {
            filters.push(("status", st.as_str().to_string()));
        }
        let mut desk_list = self.desks(desks).await?;
        desk_list.push(NO_DESK.to_string());
        self.newest_by_desk(
            &self.names.jobs,
            desk_list,
            before.as_deref(),
            &filters,
            want,
        )
        .await?
        .iter()
        .map(from_body)
        .collect()
    }
}

/// The one shape of a job's item: key, the index attributes (desk, kind, status, time
/// key) and the job as its JSON body.
pub(super) fn job_item(j: &Job, desk: &str) -> StoreResult<Item> {
    Ok(HashMap::from([
        ("job_id".to_string(), s(j.job_id.clone())),
        ("desk".to_string(), s(desk)),
        ("kind".to_string(), s(j.kind.as_str())),
        ("status".to_string(), s(j.status.as_str())),
        (
            "created_key".to_string(),
            s(time_key(j.created_at, &j.job_id)),
        ),
        ("body".to_string(), ddb::body(j)?),
    ]))
}

impl Aws {
    /// The desk a job is listed under: its account's, or [`NO_DESK`] for a job of no account.
    pub(super) async fn job_desk(
        &self,
        j: &Job,
        cache: &mut HashMap<String, String>,
    ) -> StoreResult<String> {
        match &j.account_id {
            Some(a) => self.desk_of(a, cache).await,
            None => Ok(NO_DESK.to_string()),
        }
    }
}
