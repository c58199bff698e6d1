//! Jobs on SQLite: the `jobs` table.

use super::rows::{desk_clause, limit, parse, query, time_after};
use super::Sqlite;
use crate::core::auth::DeskScope;
use crate::core::domain::Job;
use crate::core::error::StoreResult;
use crate::core::ports::{JobFilter, JobStore, Page, TimeKey};
use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::Row;

pub(super) fn job_row(r: &Row) -> rusqlite::Result<Job> {
    Ok(Job {
        job_id: r.get(0)?,
        kind: parse(r, 1)?,
        status: parse(r, 2)?,
        account_id: r.get(3)?,
        action_id: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
        error: r.get(7)?,
        result: r
            .get::<_, Option<String>>(8)?
            .and_then(|t| serde_json::from_str(&t).ok()),
    })
}

#[async_trait]
impl JobStore for Sqlite {
    async fn list_jobs(
        &self,
        desks: &DeskScope,
        filter: &JobFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Job>> {
        let mut args = Vec::new();
        let mut sql = format!(
            "SELECT j.job_id, j.kind, j.status, j.account_id, j.action_id, j.created_at, \
             j.updated_at, j.error, j.result FROM jobs j LEFT JOIN accounts a ON a.account_id = j.account_id \
             WHERE (j.account_id IS NULL OR {})",
            desk_clause(desks, "a.desk", &mut args)
        );
        if let Some(k) = filter.kind {
            sql.push_str(" AND j.kind = ?");
            args.push(Value::Text(k.as_str().into()));
        }
        if let Some(s) = filter.status {
            sql.push_str(" AND j.status = ?");
            args.push(Value::Text(s.as_str().into()));
        }
        sql.push_str(&time_after(
            &page.after,
            "j.created_at",
            "j.job_id",
            &mut args,
        ));
        sql.push_str(" ORDER BY j.created_at DESC, j.job_id DESC");
        sql.push_str(&limit(page.limit));
        self.read(move |c| query(c, &sql, args, job_row)).await
    }
}

pub(super) fn load_job(c: &rusqlite::Connection, id: &str) -> StoreResult<Option<Job>> {
    let sql = "SELECT j.job_id, j.kind, j.status, j.account_id, j.action_id, j.created_at, \
               j.updated_at, j.error, j.result FROM jobs j WHERE j.job_id = ?";
    Ok(query(c, sql, vec![id.to_string().into()], job_row)?
        .into_iter()
        .next())
}
