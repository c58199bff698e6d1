//! The workers' writes and the paper broker's book on SQLite; each call is one
//! transaction checking the condition it is given.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Transaction};

use super::reads::{job_row, order_row, query, ORDER_COLUMNS};
use super::{db_err, json_err, Sqlite};
use crate::domain::{ActionStatus, ExposureDelta, Job, Millis, Order, Position};
use crate::error::{StoreError, StoreResult};
use crate::ports::{PaperBookStore, PaperDoc, PositionChange, PositionsReplacement, WorkerStore};
use crate::records::ActionRecord;

/// Writes an order's row: replacing one with the same id, or (`replace` false) only if absent.
pub(super) fn put_order(tx: &Transaction, o: &Order, replace: bool) -> StoreResult<usize> {
    let verb = if replace {
        "INSERT OR REPLACE"
    } else {
        "INSERT OR IGNORE"
    };
    tx.prepare_cached(&format!(
        "{verb} INTO orders (order_id, account_id, symbol, side, quantity, order_type, \
         limit_price, stop_price, time_in_force, status, filled_quantity, avg_fill_price, \
         action_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ))
    .and_then(|mut st| {
        st.execute(params![
            o.order_id,
            o.terms.account_id,
            o.terms.symbol,
            o.terms.side.as_str(),
            o.terms.quantity,
            o.terms.order_type.as_str(),
            o.terms.limit_price.map(|x| x.to_string()),
            o.terms.stop_price.map(|x| x.to_string()),
            o.terms.time_in_force.as_str(),
            o.status.as_str(),
            o.filled_quantity,
            o.avg_fill_price.map(|x| x.to_string()),
            o.action_id,
            o.created_at,
            o.updated_at
        ])
    })
    .map_err(db_err)
}

fn put_position(tx: &Transaction, p: &Position) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO positions (account_id, symbol, quantity, avg_price, updated_at) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .and_then(|mut st| {
        st.execute(params![
            p.account_id,
            p.symbol,
            p.quantity,
            p.avg_price.map(|x| x.to_string()),
            p.updated_at
        ])
    })
    .map_err(db_err)?;
    Ok(())
}

fn load_order(c: &rusqlite::Connection, id: &str) -> StoreResult<Option<Order>> {
    let sql = format!("SELECT {ORDER_COLUMNS} FROM orders o WHERE o.order_id = ?");
    Ok(query(c, &sql, vec![id.to_string().into()], order_row)?
        .into_iter()
        .next())
}

fn load_job(c: &rusqlite::Connection, id: &str) -> StoreResult<Option<Job>> {
    let sql = "SELECT j.job_id, j.kind, j.status, j.account_id, j.action_id, j.created_at, \
               j.updated_at, j.error, j.result FROM jobs j WHERE j.job_id = ?";
    Ok(query(c, sql, vec![id.to_string().into()], job_row)?
        .into_iter()
        .next())
}

#[async_trait]
impl WorkerStore for Sqlite {
    async fn create_order(&self, order: &Order) -> StoreResult<Order> {
        let order = order.clone();
        self.write(move |tx| {
            put_order(tx, &order, false)?;
            load_order(tx, &order.order_id)?
                .ok_or_else(|| StoreError::Corrupt("order vanished".into()))
        })
        .await
    }

    async fn advance_order(
        &self,
        prev: &Order,
        order: &Order,
        position: Option<&PositionChange>,
    ) -> StoreResult<bool> {
        let (from, exposure) = (prev.status, ExposureDelta::of_order_step(prev, order));
        let prev_filled = prev.filled_quantity;
        let (order, position) = (order.clone(), position.cloned());
        self.write(move |tx| {
            // The step applies only to the state it was computed from: the status and the
            // fills (two steps from one partially filled state must not both apply).
            let stored: Option<(String, u32)> = tx
                .query_row(
                    "SELECT status, filled_quantity FROM orders WHERE order_id = ?",
                    [&order.order_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(db_err)?;
            if stored != Some((from.as_str().to_string(), prev_filled)) {
                return Ok(false);
            }
            if let Some(change) = &position {
                let qty: Option<i64> = tx
                    .query_row(
                        "SELECT quantity FROM positions WHERE account_id = ? AND symbol = ?",
                        [&change.new.account_id, &change.new.symbol],
                        |r| r.get(0),
                    )
                    .optional()
                    .map_err(db_err)?;
                if qty != change.expected {
                    return Ok(false);
                }
                put_position(tx, &change.new)?;
            }
            super::ledger::add_open(tx, &exposure)?;
            put_order(tx, &order, true)?;
            Ok(true)
        })
        .await
    }

    async fn create_job(&self, job: &Job) -> StoreResult<Job> {
        let job = job.clone();
        self.write(move |tx| {
            tx.execute(
                "INSERT OR IGNORE INTO jobs (job_id, kind, status, account_id, action_id, created_at, \
                 updated_at, error, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                params![
                    job.job_id,
                    job.kind.as_str(),
                    job.status.as_str(),
                    job.account_id,
                    job.action_id,
                    job.created_at,
                    job.updated_at,
                    job.error
                ],
            )
            .map_err(db_err)?;
            load_job(tx, &job.job_id)?.ok_or_else(|| StoreError::Corrupt("job vanished".into()))
        })
        .await
    }

    async fn finish_job(
        &self,
        job: &Job,
        result: &serde_json::Value,
        positions: Option<&PositionsReplacement<'_>>,
    ) -> StoreResult<bool> {
        let (job, result) = (job.clone(), result.to_string());
        let positions = positions.map(|r| {
            let quantities = |rows: &[Position]| {
                let mut q: Vec<(String, i64)> = rows
                    .iter()
                    .map(|p| (p.symbol.clone(), p.quantity))
                    .collect();
                q.sort();
                q
            };
            (
                r.account_id.to_string(),
                quantities(r.before),
                r.after.to_vec(),
            )
        });
        self.write(move |tx| {
            if let Some((account, before, _)) = &positions {
                let mut held: Vec<(String, i64)> = tx
                    .prepare_cached("SELECT symbol, quantity FROM positions WHERE account_id = ?")
                    .and_then(|mut st| {
                        st.query_map([account], |r| Ok((r.get(0)?, r.get(1)?)))?
                            .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .map_err(db_err)?;
                held.sort();
                if held != *before {
                    // A fill was recorded since the sync read: write nothing; it reads again.
                    return Ok(false);
                }
            }
            let n = tx
                .execute(
                    "UPDATE jobs SET status = ?, error = ?, result = ?, updated_at = ? \
                     WHERE job_id = ? AND status = 'running'",
                    params![
                        job.status.as_str(),
                        job.error,
                        result,
                        job.updated_at,
                        job.job_id
                    ],
                )
                .map_err(db_err)?;
            if n == 0 {
                return Ok(false);
            }
            if let Some((account, _, rows)) = positions {
                tx.execute("DELETE FROM positions WHERE account_id = ?", [&account])
                    .map_err(db_err)?;
                for p in rows {
                    put_position(tx, &p)?;
                }
            }
            Ok(true)
        })
        .await
    }

    async fn set_action_status(
        &self,
        action_id: &str,
        from: &[ActionStatus],
        to: ActionStatus,
        error: Option<&str>,
        now: Millis,
    ) -> StoreResult<bool> {
        let (id, from, error) = (
            action_id.to_string(),
            from.to_vec(),
            error.map(String::from),
        );
        self.write(move |tx| {
            let text: Option<String> = tx
                .query_row("SELECT body FROM actions WHERE action_id = ?", [&id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(db_err)?;
            let Some(text) = text else { return Ok(false) };
            let mut a: ActionRecord = serde_json::from_str(&text).map_err(json_err)?;
            if !from.contains(&a.status) {
                return Ok(false);
            }
            a.status = to;
            a.error = error.clone();
            a.updated_at = now.max(a.updated_at);
            let body = serde_json::to_string(&a).map_err(json_err)?;
            tx.execute(
                "UPDATE actions SET body = ? WHERE action_id = ?",
                params![body, id],
            )
            .map_err(db_err)?;
            Ok(true)
        })
        .await
    }
}

#[async_trait]
impl PaperBookStore for Sqlite {
    async fn load(&self, key: &str) -> StoreResult<(Option<serde_json::Value>, u64)> {
        let key = key.to_string();
        self.read(move |c| {
            let row: Option<(String, i64)> = c
                .query_row(
                    "SELECT doc, version FROM paper_book WHERE key = ?",
                    [&key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(db_err)?;
            match row {
                None => Ok((None, 0)),
                Some((doc, v)) => Ok((
                    Some(serde_json::from_str(&doc).map_err(json_err)?),
                    v as u64,
                )),
            }
        })
        .await
    }

    async fn save(
        &self,
        key: &str,
        doc: &serde_json::Value,
        expected_version: u64,
    ) -> StoreResult<bool> {
        let (key, doc) = (key.to_string(), doc.to_string());
        self.write(move |tx| {
            let n = if expected_version == 0 {
                tx.execute(
                    "INSERT OR IGNORE INTO paper_book (key, version, doc) VALUES (?, 1, ?)",
                    params![key, doc],
                )
            } else {
                tx.execute(
                    "UPDATE paper_book SET doc = ?, version = version + 1 WHERE key = ? AND version = ?",
                    params![doc, key, expected_version as i64],
                )
            }
            .map_err(db_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn save_all(&self, docs: &[PaperDoc]) -> StoreResult<bool> {
        let docs: Vec<(String, String, u64)> = docs
            .iter()
            .map(|d| (d.key.clone(), d.doc.to_string(), d.expected_version))
            .collect();
        self.write(move |tx| {
            // One writer, one IMMEDIATE transaction: check every version, then write.
            for (key, _, expected) in &docs {
                let version: Option<i64> = tx
                    .prepare_cached("SELECT version FROM paper_book WHERE key = ?")
                    .and_then(|mut st| st.query_row([key], |r| r.get(0)).optional())
                    .map_err(db_err)?;
                if version.unwrap_or(0) as u64 != *expected {
                    return Ok(false);
                }
            }
            for (key, doc, expected) in &docs {
                tx.prepare_cached(
                    "INSERT INTO paper_book (key, version, doc) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (key) DO UPDATE SET version = ?2, doc = ?3",
                )
                .and_then(|mut st| st.execute(params![key, *expected as i64 + 1, doc]))
                .map_err(db_err)?;
            }
            Ok(true)
        })
        .await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<serde_json::Value>> {
        let prefix = prefix.to_string();
        self.read(move |c| {
            // A range on the primary key: [prefix, prefix + U+10FFFF).
            let end = format!("{prefix}\u{10FFFF}");
            let mut st = c
                .prepare("SELECT doc FROM paper_book WHERE key >= ? AND key < ? ORDER BY key")
                .map_err(db_err)?;
            let rows = st
                .query_map(params![prefix, end], |r| r.get::<_, String>(0))
                .map_err(db_err)?;
            rows.map(|r| {
                r.map_err(db_err)
                    .and_then(|doc| serde_json::from_str(&doc).map_err(json_err))
            })
            .collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::queue::tests::temp_db;
    use super::*;
    use serde_json::json;

    fn doc(key: &str, doc: serde_json::Value, expected_version: u64) -> PaperDoc {
        PaperDoc {
            key: key.into(),
            doc,
            expected_version,
        }
    }

    #[tokio::test]
    async fn paper_documents_save_together_or_not_at_all() {
        let t = temp_db("paper-save-all");
        let db = &t.db;
        assert!(db
            .save_all(&[
                doc("account:A", json!({"n": 1}), 0),
                doc("order:A:1", json!(1), 0)
            ])
            .await
            .unwrap());
        // The order exists already: nothing is written, not even the book.
        assert!(!db
            .save_all(&[
                doc("account:A", json!({"n": 2}), 1),
                doc("order:A:1", json!(2), 0)
            ])
            .await
            .unwrap());
        assert_eq!(
            db.load("account:A").await.unwrap(),
            (Some(json!({"n": 1})), 1)
        );
        // A stale book version: nothing is written.
        assert!(!db
            .save_all(&[
                doc("order:A:2", json!(2), 0),
                doc("account:A", json!({"n": 3}), 7)
            ])
            .await
            .unwrap());
        assert_eq!(db.load("order:A:2").await.unwrap(), (None, 0));
        assert!(db
            .save_all(&[
                doc("order:A:2", json!(2), 0),
                doc("account:A", json!({"n": 3}), 1)
            ])
            .await
            .unwrap());
        assert_eq!(
            db.load("account:A").await.unwrap(),
            (Some(json!({"n": 3})), 2)
        );
        assert!(db.save("order:AB:1", &json!(9), 0).await.unwrap());
        let mut listed = db.list("order:A:").await.unwrap();
        listed.sort_by_key(|v| v.as_i64());
        assert_eq!(listed, [json!(1), json!(2)]);
    }
}
