//! The limits port: what bounds an operator's load besides execute's own rate limit (which
//! execute's atomic commit keeps itself): the plan rate, the `execute_plan` calls held for
//! an approval, and the marks that keep a repeated refusal out of the audit log. All of it
//! lives where the execute rate does (the rate-limits table, keyed by an id per limit), so
//! it holds across processes and Lambda instances alike.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::domain::Millis;
use crate::error::StoreResult;
use crate::records::{AuditRecord, RateState, RateUpdate};

/// One `execute_plan` call held while its plan waits for the operator's approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub plan_id: String,
    /// The call holding it (a fresh id per call), so that it releases only its own.
    pub owner: String,
    /// When the hold ends at the latest; a hold past it counts for nothing (a process that
    /// died holding leaves nothing behind for longer).
    pub until: Millis,
}

/// One operator's held calls, versioned for conditional writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holds {
    /// 0: nothing stored yet.
    pub version: u64,
    pub held: Vec<Hold>,
}

impl Holds {
    /// The holds still running at `now`.
    pub fn live(&self, now: Millis) -> impl Iterator<Item = &Hold> {
        self.held.iter().filter(move |h| h.until > now)
    }
}

#[async_trait]
pub trait LimitStore: Send + Sync {
    /// The rate window kept under `id` (empty when none is stored).
    async fn rate(&self, id: &str) -> StoreResult<RateState>;
    /// Counts one more under `u.operator_id`, only if the stored window still allows it:
    /// the same condition as the rate update of execute's commit ([`RateUpdate`]). `false`:
    /// it does not; nothing was written.
    async fn count_rate(&self, u: &RateUpdate) -> StoreResult<bool>;
    /// The held calls kept under `id`.
    async fn holds(&self, id: &str) -> StoreResult<Holds>;
    /// Stores `holds` under `id`, only if the stored version is still `expected` (0: none
    /// stored). `false`: it is not; nothing was written.
    async fn put_holds(&self, id: &str, holds: &Holds, expected: u64) -> StoreResult<bool>;
    /// Appends `audit` and marks `id` until `until`, in one atomic write, only if no mark
    /// `id` is live at `now`. `false`: one is; nothing was written.
    async fn append_once(
        &self,
        id: &str,
        until: Millis,
        audit: &AuditRecord,
        now: Millis,
    ) -> StoreResult<bool>;
}
