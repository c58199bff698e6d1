//! Read use cases: desk-filtered listings with tamper-proof cursors, and action status.

use std::sync::Arc;

use serde::{de::DeserializeOwned, Serialize};

use crate::core::auth::{Caller, Permission};
use crate::core::domain::{Account, Job, Order, Position};
use crate::core::error::{ApiError, Code};
use crate::core::pagination::CursorCodec;
use crate::core::ports::{
    AccountStore, ActionStore, JobFilter, JobStore, OrderFilter, OrderStore, Page, PositionStore,
    TimeKey,
};
use crate::core::records::ActionRecord;

/// A page request as parsed from the query: the limit and the raw cursor.
pub struct PageRequest {
    pub limit: u32,
    pub cursor: Option<String>,
}

/// One page of rows and the cursor of the next page, if any.
pub struct Listing<T> {
    pub rows: Vec<T>,
    pub next_cursor: Option<String>,
}

/// The cursor scope: the endpoint, its filters, and the caller (service, operator, desks).
fn scope(caller: &Caller, endpoint: &str, filters: &[Option<&str>]) -> String {
    let f: Vec<&str> = filters.iter().map(|x| x.unwrap_or("")).collect();
    format!(
        "{endpoint}|{}|{}|{}|{}",
        f.join("\u{1f}"),
        caller.service.sub,
        caller.operator.sub,
        caller.operator.desks.fingerprint()
    )
}

async fn paged<T, K, F, Fut>(
    cursors: &CursorCodec,
    scope: &str,
    req: &PageRequest,
    key_of: impl Fn(&T) -> K,
    fetch: F,
) -> Result<Listing<T>, ApiError>
where
    K: Serialize + DeserializeOwned,
    F: FnOnce(Page<K>) -> Fut,
    Fut: std::future::Future<Output = crate::core::error::StoreResult<Vec<T>>>,
{
    let after = match &req.cursor {
        None => None,
        Some(c) => Some(cursors.decode::<K>(scope, c)?),
    };
    let mut rows = fetch(Page {
        after,
        limit: req.limit + 1,
    })
    .await?;
    let next_cursor = if rows.len() > req.limit as usize {
        rows.truncate(req.limit as usize);
        rows.last().map(|r| cursors.encode(scope, &key_of(r)))
    } else {
        None
    };
    Ok(Listing { rows, next_cursor })
}

/// The account if it exists and the caller may see it; otherwise 404, the same either way.
pub async fn visible_account(
    accounts: &dyn AccountStore,
    caller: &Caller,
    account_id: &str,
) -> Result<Account, ApiError> {
    match accounts.get_account(account_id).await? {
        Some(a) if caller.can_see_desk(&a.desk) => Ok(a),
        _ => Err(
            super::not_found(Code::AccountNotFound, "account", account_id)
                .with_field("account_id", "no such account visible to this operator"),
        ),
    }
}

/// The read use cases: desk-filtered listings and action status, for every front door.
#[derive(Clone)]
pub struct Reads {
    pub accounts: Arc<dyn AccountStore>,
    pub positions: Arc<dyn PositionStore>,
    pub orders: Arc<dyn OrderStore>,
    pub jobs: Arc<dyn JobStore>,
    pub actions: Arc<dyn ActionStore>,
    pub cursors: CursorCodec,
}

impl Reads {
    pub async fn accounts(
        &self,
        caller: &Caller,
        page: &PageRequest,
    ) -> Result<Listing<Account>, ApiError> {
        caller.require(Permission::Read)?;
        let s = scope(caller, "accounts", &[]);
        let desks = &caller.operator.desks;
        paged(
            &self.cursors,
            &s,
            page,
            |a: &Account| a.account_id.clone(),
            |p| async move { self.accounts.list_accounts(desks, &p).await },
        )
        .await
    }

    pub async fn positions(
        &self,
        caller: &Caller,
        account_id: Option<&str>,
        page: &PageRequest,
    ) -> Result<Listing<Position>, ApiError> {
        caller.require(Permission::Read)?;
        if let Some(id) = account_id {
            visible_account(self.accounts.as_ref(), caller, id).await?;
        }
        let s = scope(caller, "positions", &[account_id]);
        let desks = &caller.operator.desks;
        paged(
            &self.cursors,
            &s,
            page,
            |p: &Position| (p.account_id.clone(), p.symbol.clone()),
            |p| async move { self.positions.list_positions(desks, account_id, &p).await },
        )
        .await
    }

    pub async fn orders(
        &self,
        caller: &Caller,
        filter: OrderFilter,
        page: &PageRequest,
    ) -> Result<Listing<Order>, ApiError> {
        caller.require(Permission::Read)?;
        if let Some(id) = &filter.account_id {
            visible_account(self.accounts.as_ref(), caller, id).await?;
        }
        let s = scope(
            caller,
            "orders",
            &[
                filter.account_id.as_deref(),
                filter.status.map(|x| x.as_str()),
            ],
        );
        let desks = &caller.operator.desks;
        let filter = &filter;
        paged(
            &self.cursors,
            &s,
            page,
            |o: &Order| -> TimeKey { (o.created_at, o.order_id.clone()) },
            |p| async move { self.orders.list_orders(desks, filter, &p).await },
        )
        .await
    }

    pub async fn jobs(
        &self,
        caller: &Caller,
        filter: JobFilter,
        page: &PageRequest,
    ) -> Result<Listing<Job>, ApiError> {
        caller.require(Permission::Read)?;
        let s = scope(
            caller,
            "jobs",
            &[
                filter.kind.map(|x| x.as_str()),
                filter.status.map(|x| x.as_str()),
            ],
        );
        let desks = &caller.operator.desks;
        let filter = &filter;
        paged(
            &self.cursors,
            &s,
            page,
            |j: &Job| -> TimeKey { (j.created_at, j.job_id.clone()) },
            |p| async move { self.jobs.list_jobs(desks, filter, &p).await },
        )
        .await
    }

    /// The action, once its status differs from the one first read, or when `wait` runs out
    /// (0: at once). A finished action (`succeeded`, `failed`) answers at once: nothing more
    /// will change. Status without polling loops on the caller's side; the reads back off
    /// from 100 ms to 1 s, so a 20 s wait costs about two dozen reads.
    pub async fn action_wait(
        &self,
        caller: &Caller,
        action_id: &str,
        wait: std::time::Duration,
    ) -> Result<ActionRecord, ApiError> {
        let first = self.action(caller, action_id).await?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            let now = tokio::time::Instant::now();
            if first.status.is_final() || now >= deadline {
                return Ok(first);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 3 / 2).min(std::time::Duration::from_secs(1));
            let a = self.action(caller, action_id).await?;
            if a.status != first.status {
                return Ok(a);
            }
        }
    }

    /// An action the caller may see (its account's desk), else 404 `action_not_found`.
    pub async fn action(&self, caller: &Caller, action_id: &str) -> Result<ActionRecord, ApiError> {
        caller.require(Permission::Read)?;
        match self.actions.get_action(action_id).await? {
            Some(a) if caller.can_see_desk(&a.desk) => Ok(a),
            _ => Err(super::not_found(Code::ActionNotFound, "action", action_id)),
        }
    }
}

/// The longest `wait`, seconds: inside API Gateway's 29 s and the function's timeout.
pub const MAX_WAIT_S: u64 = 20;

/// `wait`: a whole number of seconds, 0 to [`MAX_WAIT_S`] (absent: 0).
pub fn wait_seconds(v: Option<&str>) -> Result<u64, ApiError> {
    match v {
        None => Ok(0),
        Some(t) => match t.parse::<u64>() {
            Ok(n) if n <= MAX_WAIT_S && !t.starts_with('+') => Ok(n),
            _ => Err(ApiError::invalid(
                "wait",
                format!("must be a whole number of seconds from 0 to {MAX_WAIT_S}"),
            )),
        },
    }
}
