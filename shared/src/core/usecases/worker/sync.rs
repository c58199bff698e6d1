//! `positions.sync`: the broker's positions replace the stored ones, change by change.

use super::*;

/// A sync job's result: how many positions the broker reported, and which changed.
#[derive(Debug, serde::Serialize)]
pub(super) struct SyncResult {
    pub(super) positions: usize,
    pub(super) changed: Vec<SyncChange>,
}

#[derive(Debug, serde::Serialize)]
pub(super) struct SyncChange {
    pub(super) symbol: String,
    pub(super) before: i64,
    pub(super) after: i64,
}

pub(crate) async fn sync(st: &Worker, msg: &QueueMessage) -> Result<Outcome, ApiError> {
    let job_id = msg
        .resource_refs
        .job_id
        .clone()
        .ok_or_else(|| bad_message("no job_id"))?;
    let account = msg.normalized_payload.account_id().to_string();
    let now = st.clock.now_ms();
    let job = st
        .store
        .create_job(&Job {
            job_id: job_id.clone(),
            kind: JobKind::PositionsSync,
            status: JobStatus::Running,
            account_id: Some(account.clone()),
            action_id: Some(msg.action_id.clone()),
            created_at: now,
            updated_at: now,
            error: None,
            result: None,
        })
        .await?;
    if job.status != JobStatus::Running {
        return Ok(Outcome::AlreadyDone);
    }
    // First record every fill the broker made on this account's open orders, so a fill an
    // order worker has not recorded yet (it died after the broker answered) is recorded
    // now, once: the broker's positions below already include it, and the order's status
    // then tells the order worker's redelivery there is nothing left to add.
    reconcile_orders(st, Some(&account), AT_THE_BROKER).await?;
    // Our positions, then the broker's, then the open orders once more: a fill the broker
    // made after the first pass is in its positions, so it must be in ours before we
    // replace them (else it would be counted twice). The replacement is conditional on
    // `before`, so a fill recorded meanwhile by an order worker makes it fail and retry
    // (else the fill would be lost).
    let page = Page {
        after: None,
        limit: 10_000,
    };
    let before = st
        .positions
        .list_positions(&DeskScope::All, Some(&account), &page)
        .await?;
    let broker = st.broker.positions(&account).await?;
    let late = reconcile_orders(st, Some(&account), AT_THE_BROKER).await?;
    if late > 0 {
        return Err(ApiError::unavailable(format!(
            "job {job_id}: orders filled during the sync; retrying"
        )));
    }
    let mut changed = Vec::new();
    let mut symbols: Vec<&str> = broker
        .iter()
        .map(|p| p.symbol.as_str())
        .chain(before.iter().map(|p| p.symbol.as_str()))
        .collect();
    symbols.sort();
    symbols.dedup();
    for sym in symbols {
        let was = before
            .iter()
            .find(|p| p.symbol == sym)
            .map(|p| p.quantity)
            .unwrap_or(0);
        let now_q = broker
            .iter()
            .find(|p| p.symbol == sym)
            .map(|p| p.quantity)
            .unwrap_or(0);
        if was != now_q {
            changed.push(SyncChange {
                symbol: sym.to_string(),
                before: was,
                after: now_q,
            });
        }
    }
    let mut rows: Vec<Position> = broker
        .iter()
        .filter(|p| p.quantity != 0)
        .map(|p| Position {
            account_id: account.clone(),
            symbol: p.symbol.clone(),
            quantity: p.quantity,
            avg_price: p.avg_price,
            updated_at: now,
            // The day's realized P&L stays with the position the broker still reports.
            day_realized: before
                .iter()
                .find(|b| b.symbol == p.symbol)
                .and_then(|b| b.day_realized),
        })
        .collect();
    let positions = rows.len();
    // A position the broker no longer reports keeps its row, flat, while it holds a
    // realized P&L: the day's loss must not vanish with it.
    let flat: Vec<Position> = before
        .iter()
        .filter(|b| b.day_realized.is_some() && !rows.iter().any(|r| r.symbol == b.symbol))
        .map(|b| Position {
            quantity: 0,
            avg_price: None,
            updated_at: now,
            ..b.clone()
        })
        .collect();
    rows.extend(flat);
    let result = serde_json::to_value(SyncResult { positions, changed })
        .map_err(|e| ApiError::internal(format!("sync result: {e}")))?;
    let done = Job {
        status: JobStatus::Succeeded,
        updated_at: now,
        result: Some(result.clone()),
        ..job
    };
    if st
        .store
        .finish_job(
            &done,
            &result,
            Some(&PositionsReplacement {
                account_id: &account,
                before: &before,
                after: &rows,
            }),
        )
        .await?
    {
        return Ok(Outcome::Succeeded);
    }
    // Not written: another delivery finished the job, or (DynamoDB) the write conflicted.
    // (`create_job` of an existing job returns the stored one.)
    match st.store.create_job(&done).await? {
        j if j.status != JobStatus::Running => Ok(Outcome::AlreadyDone),
        _ => Err(ApiError::unavailable(format!(
            "job {job_id}: positions changed during the sync; retrying"
        ))),
    }
}
