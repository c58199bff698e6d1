//! Actions on SQLite: the `actions` table, and the sweeper's listing of unsent ones.

use super::rows::body;
use super::{db_err, Sqlite};
use crate::error::StoreResult;
use crate::ports::ActionStore;
use crate::records::ActionRecord;
use async_trait::async_trait;
use rusqlite::params;

#[async_trait]
impl ActionStore for Sqlite {
    async fn get_action(&self, action_id: &str) -> StoreResult<Option<ActionRecord>> {
        let id = action_id.to_string();
        self.read(move |c| {
            let text: Option<String> = c
                .query_row("SELECT body FROM actions WHERE action_id = ?", [id], |r| {
                    r.get(0)
                })
                .map(Some)
                .or_else(|e| match e {
                    rusqlite::Error::QueryReturnedNoRows => Ok(None),
                    e => Err(e),
                })
                .map_err(db_err)?;
            text.map(body).transpose()
        })
        .await
    }

    async fn list_unsent(&self, claimed_before: i64, limit: u32) -> StoreResult<Vec<ActionRecord>> {
        self.read(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT body FROM actions WHERE enqueued_at IS NULL AND created_at < ? \
                     ORDER BY created_at LIMIT ?",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![claimed_before, limit], |r| r.get::<_, String>(0))
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err).and_then(body))
                .collect::<StoreResult<Vec<_>>>()
        })
        .await
    }
}
