//! The workers' writes on SQLite; each call is one transaction checking the condition it
//! is given, composed from the entity files' row writers.

use super::jobs::load_job;
use super::orders::{load_order, put_order, update_order};
use super::packed::packed_json;
use super::positions::{add_open, put_position};
use super::rows::{one_body, Cached};
use super::{db_err, json_err, Sqlite};
use crate::core::domain::{ActionStatus, ExposureDelta, Job, Millis, Order, OrderStatus, Position};
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::{
    creation_step, open_change_check, replace_check, step_check, ActionMove, PositionChange,
    PositionsReplacement, Stored, WorkerStore,
};
use crate::core::records::ActionRecord;
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

#[async_trait]
impl WorkerStore for Sqlite {
    async fn create_order(&self, order: &Order) -> StoreResult<Stored<Order>> {
        let (order, exposure) = (order.clone(), creation_step(order)?);
        self.write(move |tx| {
            // Inserted: the row is this order (no read back on the writer thread), and
            // its step from what execute reserved applies with it.
            // Ignored: an earlier delivery created it; that one is the order.
            if put_order(tx, &order, false)? == 1 {
                add_open(tx, &exposure)?;
                return Ok(Stored::Created(order));
            }
            load_order(tx, &order.order_id)?
                .map(Stored::Found)
                .ok_or_else(|| StoreError::Corrupt("order vanished".into()))
        })
        .await
    }

    async fn advance_order(
        &self,
        prev: &Order,
        order: &Order,
        position: Option<&PositionChange>,
        settles: Option<&ActionMove<'_>>,
    ) -> StoreResult<bool> {
        step_check(prev, order)?;
        let step = OrderStep {
            at: OrderAt::of(prev),
            exposure: ExposureDelta::of_order_step(prev, order),
            position: position.cloned(),
            settles: settles.map(OwnedMove::from),
            order: order.clone(),
        };
        self.write(move |tx| step.apply(tx)).await
    }

    async fn replace_order(
        &self,
        prev: &Order,
        next: &Order,
        exposure: &ExposureDelta,
        settles: Option<&ActionMove<'_>>,
    ) -> StoreResult<bool> {
        replace_check(prev, next)?;
        let step = OrderStep {
            at: OrderAt::of(prev),
            exposure: exposure.clone(),
            position: None,
            settles: settles.map(OwnedMove::from),
            order: next.clone(),
        };
        self.write(move |tx| step.apply(tx)).await
    }

    async fn create_job(&self, job: &Job) -> StoreResult<Job> {
        let job = job.clone();
        self.write(move |tx| {
            tx.run(
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
            if let Some((account, before, rows)) = &positions {
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
                // An order claimed for the broker and not yet recorded: the broker's
                // position may already hold its fill, which its record would add again.
                // Write nothing; the sync retries once the order is recorded.
                let submitting: Vec<String> = tx
                    .prepare_cached(
                        "SELECT symbol FROM orders WHERE account_id = ? AND status = 'submitted'",
                    )
                    .and_then(|mut st| {
                        st.query_map([account], |r| r.get(0))?
                            .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .map_err(db_err)?;
                let replaced = |sym: &String| {
                    before.iter().any(|(s, _)| s == sym) || rows.iter().any(|p| &p.symbol == sym)
                };
                if submitting.iter().any(replaced) {
                    return Ok(false);
                }
            }
            let n = tx
                .run(
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
                tx.run("DELETE FROM positions WHERE account_id = ?", [&account])
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
        let m = OwnedMove::from(&ActionMove {
            action_id,
            from,
            to,
            error,
            at: now,
        });
        self.write(move |tx| settle(tx, &m, None)).await
    }

    async fn settle_with_exposure(
        &self,
        exposure: &ExposureDelta,
        settles: &ActionMove<'_>,
    ) -> StoreResult<bool> {
        open_change_check(exposure)?;
        let (exposure, m) = (exposure.clone(), OwnedMove::from(settles));
        self.write(move |tx| settle(tx, &m, Some(&exposure))).await
    }
}

/// The action's move, with the exposure's increments when given, only if the action is in
/// one of the move's `from`; else nothing.
fn settle(tx: &Connection, m: &OwnedMove, exposure: Option<&ExposureDelta>) -> StoreResult<bool> {
    let Some(a) = movable_action(tx, m)? else {
        return Ok(false);
    };
    if let Some(d) = exposure {
        add_open(tx, d)?;
    }
    move_action(tx, a, m)?;
    Ok(true)
}

/// The state of an order a write was computed from: its status, fills and version (two
/// writes from one state must not both apply, nor one from a state that has moved on).
struct OrderAt {
    order_id: String,
    status: OrderStatus,
    filled: u32,
    version: u32,
}

impl OrderAt {
    fn of(o: &Order) -> Self {
        OrderAt {
            order_id: o.order_id.clone(),
            status: o.status,
            filled: o.filled_quantity,
            version: o.version,
        }
    }
}

/// One conditional write of an order (a step or a replace), owned by the writer thread:
/// the order as `at` (and the position as `position.expected`, and the action in one of
/// its move's `from`), else nothing; then the position, the exposure's increments, the
/// order and the action's move.
struct OrderStep {
    at: OrderAt,
    order: Order,
    exposure: ExposureDelta,
    position: Option<PositionChange>,
    settles: Option<OwnedMove>,
}

impl OrderStep {
    fn apply(&self, tx: &Connection) -> StoreResult<bool> {
        let stored: Option<(String, u32, u32)> = tx
            .row(
                "SELECT status, filled_quantity, version FROM orders WHERE order_id = ?",
                [&self.at.order_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(db_err)?;
        let at = &self.at;
        if stored != Some((at.status.as_str().to_string(), at.filled, at.version)) {
            return Ok(false);
        }
        if let Some(change) = &self.position {
            let qty: Option<i64> = tx
                .row(
                    "SELECT quantity FROM positions WHERE account_id = ? AND symbol = ?",
                    [&change.new.account_id, &change.new.symbol],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err)?;
            if qty != change.expected {
                return Ok(false);
            }
        }
        // Every condition is checked before anything is written; the action's is the
        // last, checked by `settle` before it writes the exposure and the move.
        match &self.settles {
            Some(m) => {
                if !settle(tx, m, Some(&self.exposure))? {
                    return Ok(false);
                }
            }
            None => add_open(tx, &self.exposure)?,
        }
        if let Some(change) = &self.position {
            put_position(tx, &change.new)?;
        }
        update_order(tx, &self.order)?;
        Ok(true)
    }
}

/// An [`ActionMove`] the writer thread owns.
struct OwnedMove {
    action_id: String,
    from: Vec<ActionStatus>,
    to: ActionStatus,
    error: Option<String>,
    at: Millis,
}

impl From<&ActionMove<'_>> for OwnedMove {
    fn from(m: &ActionMove<'_>) -> Self {
        OwnedMove {
            action_id: m.action_id.to_string(),
            from: m.from.to_vec(),
            to: m.to,
            error: m.error.map(String::from),
            at: m.at,
        }
    }
}

/// The stored action if its status is one the move starts from.
fn movable_action(tx: &Connection, m: &OwnedMove) -> StoreResult<Option<ActionRecord>> {
    let Some(text) = one_body(
        tx,
        "SELECT body FROM actions WHERE action_id = ?",
        &[&m.action_id],
    )?
    else {
        return Ok(None);
    };
    let a: ActionRecord = serde_json::from_str(&text).map_err(json_err)?;
    Ok(m.from.contains(&a.status).then_some(a))
}

fn move_action(tx: &Connection, mut a: ActionRecord, m: &OwnedMove) -> StoreResult<()> {
    a.status = m.to;
    a.error = m.error.clone();
    a.updated_at = m.at.max(a.updated_at);
    // A status a worker moved was delivered: out of the sweeper's unsent listing.
    a.enqueued_at = a.enqueued_at.or(Some(m.at));
    let body = packed_json(&a)?;
    tx.run(
        "UPDATE actions SET body = ?, enqueued_at = ? WHERE action_id = ?",
        params![body, a.enqueued_at, m.action_id],
    )
    .map_err(db_err)?;
    Ok(())
}
