//! Actions on SQLite: the `actions` table, and the sweeper's listing of unsent ones.

use super::packed::{packed_json, Body};
use super::rows::Cached;
use super::rows::{body, one_body};
use super::{db_err, json_err, Sqlite};
use crate::core::error::StoreResult;
use crate::core::ports::ActionStore;
use crate::core::records::ActionRecord;
use async_trait::async_trait;
use rusqlite::params;

#[async_trait]
impl ActionStore for Sqlite {
    async fn get_action(&self, action_id: &str) -> StoreResult<Option<ActionRecord>> {
        let id = action_id.to_string();
        self.read(move |c| {
            one_body(c, "SELECT body FROM actions WHERE action_id = ?", &[&id])?
                .map(body)
                .transpose()
        })
        .await
    }

    async fn list_unsent(&self, claimed_before: i64, limit: u32) -> StoreResult<Vec<ActionRecord>> {
        self.read(move |c| {
            let sql = format!(
                "SELECT body FROM actions WHERE enqueued_at IS NULL AND created_at < ? \
                 ORDER BY created_at{}",
                super::rows::limit(limit)
            );
            let mut st = c.prepare_cached(&sql).map_err(db_err)?;
            let rows = st
                .query_map(params![claimed_before], |r| r.get::<_, Body>(0))
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err).and_then(|b| body(b.0)))
                .collect::<StoreResult<Vec<_>>>()
        })
        .await
    }

    async fn clear_unsent(&self, action_id: &str, now: i64) -> StoreResult<bool> {
        let id = action_id.to_string();
        self.write(move |tx| {
            let Some(text) = one_body(
                tx,
                "SELECT body FROM actions WHERE action_id = ? AND enqueued_at IS NULL",
                &[&id],
            )?
            else {
                return Ok(false);
            };
            let mut a: ActionRecord = serde_json::from_str(&text).map_err(json_err)?;
            a.enqueued_at = Some(now);
            a.updated_at = a.updated_at.max(now);
            let body = packed_json(&a)?;
            tx.run(
                "UPDATE actions SET enqueued_at = ?, body = ? WHERE action_id = ?",
                params![now, body, id],
            )
            .map_err(db_err)?;
            Ok(true)
        })
        .await
    }
}
