//! The limits port on SQLite: rows of the rate-limits table beside the execute rate's,
//! each under its own id. A rate window is a row as execute's; held calls are one row per
//! operator (the version in the `version` column); a refusal's mark is a row whose
//! `version` is the instant it lasts until; a pace is a row whose `version` is its `due`; an
//! account's message window is a row as a rate window, its lockout in the body.

use super::audit::AuditRow;
use super::ledger::{
    count_rate, load_messages, load_rate, put_messages, put_rate_limits_row, rate_allows,
    rate_limits_row,
};
use super::rows::Cached;
use super::{db_err, Sqlite};
use crate::core::domain::Millis;
use crate::core::error::StoreResult;
use crate::core::ports::limits::{Holds, LimitStore, PaceStep};
use crate::core::records::{AuditRecord, RateState, RateUpdate};
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

fn load_holds(c: &Connection, id: &str) -> StoreResult<Holds> {
    Ok(rate_limits_row(c, id)?.unwrap_or_default())
}

#[async_trait]
impl LimitStore for Sqlite {
    async fn rate(&self, id: &str) -> StoreResult<RateState> {
        let id = id.to_string();
        self.read(move |c| load_rate(c, &id)).await
    }

    async fn count_rate(&self, u: &RateUpdate) -> StoreResult<bool> {
        let u = u.clone();
        self.write(move |tx| {
            if !rate_allows(tx, &u)? {
                return Ok(false);
            }
            count_rate(tx, &u)?;
            Ok(true)
        })
        .await
    }

    async fn pace(&self, id: &str, step: &PaceStep) -> StoreResult<Option<Millis>> {
        let (id, step) = (id.to_string(), *step);
        self.write(move |tx| {
            let due: Millis = tx
                .row(
                    "SELECT version FROM rate_limits WHERE operator_id = ?",
                    [&id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err)?
                .unwrap_or(0);
            if !step.admits(due) {
                return Ok(Some(due));
            }
            tx.run(
                "INSERT OR REPLACE INTO rate_limits (operator_id, version, body) VALUES (?, ?, '{}')",
                params![id, step.next(due)],
            )
            .map_err(db_err)?;
            Ok(None)
        })
        .await
    }

    async fn holds(&self, id: &str) -> StoreResult<Holds> {
        let id = id.to_string();
        self.read(move |c| load_holds(c, &id)).await
    }

    async fn put_holds(&self, id: &str, holds: &Holds, expected: u64) -> StoreResult<bool> {
        let (id, holds) = (id.to_string(), holds.clone());
        self.write(move |tx| {
            if load_holds(tx, &id)?.version != expected {
                return Ok(false);
            }
            put_rate_limits_row(tx, &id, holds.version as i64, &holds)?;
            Ok(true)
        })
        .await
    }

    async fn messages(&self, id: &str) -> StoreResult<crate::core::throttle::MessageWindow> {
        let id = id.to_string();
        self.read(move |c| load_messages(c, &id)).await
    }

    async fn lock_messages(&self, id: &str, until: Millis, _keep_until: Millis) -> StoreResult<()> {
        let id = id.to_string();
        self.write(move |tx| {
            let mut w = load_messages(tx, &id)?;
            if w.locked_until < until {
                w.locked_until = until;
                put_messages(tx, &w)?;
            }
            Ok(())
        })
        .await
    }

    async fn append_once(
        &self,
        id: &str,
        until: Millis,
        audit: &AuditRecord,
        now: Millis,
    ) -> StoreResult<bool> {
        let id = id.to_string();
        let row = AuditRow::new(audit)?;
        self.write(move |tx| {
            let live: Option<i64> = tx
                .row(
                    "SELECT version FROM rate_limits WHERE operator_id = ?",
                    [&id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err)?;
            if live.is_some_and(|until| until > now) {
                return Ok(false);
            }
            tx.run(
                "INSERT OR REPLACE INTO rate_limits (operator_id, version, body) VALUES (?, ?, '{}')",
                params![id, until],
            )
            .map_err(db_err)?;
            row.insert(tx)?;
            Ok(true)
        })
        .await
    }
}
