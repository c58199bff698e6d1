//! The audit log on SQLite: append-only records, read back as an id's trail.

use super::rows::{full_body, Cached, Compact};
use super::{db_err, Sqlite};
use crate::core::error::StoreResult;
use crate::core::ports::AuditLog;
use crate::core::records::AuditRecord;
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

pub(super) fn append_audit(c: &Connection, a: &AuditRecord) -> StoreResult<()> {
    AuditRow::new(a)?.insert(c)
}

/// An audit record ready to append (built before the write, see [`Compact`]).
pub(super) struct AuditRow {
    at: i64,
    plan_id: Option<String>,
    action_id: Option<String>,
    body: Compact,
}

impl AuditRow {
    pub(super) fn new(a: &AuditRecord) -> StoreResult<AuditRow> {
        Ok(AuditRow {
            at: a.at,
            plan_id: a.plan_id.clone(),
            action_id: a.action_id.clone(),
            body: Compact::new(a)?,
        })
    }

    pub(super) fn insert(&self, c: &Connection) -> StoreResult<()> {
        self.body.store(c)?;
        c.run(
            "INSERT INTO audit (at, plan_id, action_id, body) VALUES (?, ?, ?, ?)",
            params![self.at, self.plan_id, self.action_id, self.body.body],
        )
        .map_err(db_err)?;
        Ok(())
    }
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
                .query_map(params![id, id, plan], |r| {
                    r.get::<_, super::packed::Body>(0)
                })
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err).and_then(|b| full_body(c, &b.0)))
                .collect()
        })
        .await
    }
}
