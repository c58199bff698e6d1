//! The audit log on SQLite: append-only records, read back as an id's trail.

use super::rows::{compact_body, full_body, Cached};
use super::{db_err, Sqlite};
use crate::error::StoreResult;
use crate::ports::AuditLog;
use crate::records::AuditRecord;
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

pub(super) fn append_audit(c: &Connection, a: &AuditRecord) -> StoreResult<()> {
    let text = compact_body(c, a)?;
    c.prepare_cached("INSERT INTO audit (at, plan_id, action_id, body) VALUES (?, ?, ?, ?)")
        .and_then(|mut st| st.execute(params![a.at, a.plan_id, a.action_id, text]))
        .map_err(db_err)?;
    Ok(())
}

#[async_trait]
impl AuditLog for Sqlite {
    async fn append(&self, rec: &AuditRecord) -> StoreResult<()> {
        let rec = rec.clone();
        self.write(move |tx| append_audit(tx, &rec)).await
    }

    async fn trail(&self, id: &str) -> StoreResult<Vec<AuditRecord>> {
        let id = id.to_string();
        self.read(move |c| {
            // An action id also pulls in its plan's records.
            let plan_of_action: Option<String> = c
                .row(
                    "SELECT plan_id FROM actions WHERE action_id = ?",
                    [&id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err)?;
            let plan = plan_of_action.unwrap_or_else(|| id.clone());
            let mut st = c
                .prepare_cached(
                    "SELECT body FROM audit WHERE plan_id = ? OR action_id = ? OR plan_id = ? \
                     ORDER BY at, seq",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![id, id, plan], |r| r.get::<_, String>(0))
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err).and_then(|t| full_body(c, &t)))
                .collect()
        })
        .await
    }
}
