//! The limits port: what bounds an operator's load besides execute's own rate limit (which
//! execute's atomic commit keeps itself): the plan rate, the `execute_plan` calls held for
//! an approval, the marks that keep a repeated refusal out of the audit log, and the
//! firm-wide pace of MCP's `execute_plan` calls, and each account's message window (counted
//! by execute's commit, locked out here). All of it
//! lives where the execute rate does (the rate-limits table, keyed by an id per limit), so
//! it holds across processes and Lambda instances alike.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::core::domain::Millis;
use crate::core::error::StoreResult;
use crate::core::records::{AuditRecord, RateState, RateUpdate};

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

/// One admission under a pace: the token bucket API Gateway throttles with (a steady rate
/// and a burst), kept as one instant, `due` (the generic cell rate algorithm): a call at
/// `now` is admitted when `due <= now + tolerance`, and `due` becomes `max(due, now) +
/// interval`. `interval` is the rate's spacing, `tolerance` `(burst - 1) * interval`.
/// `due` never moves back, whoever writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceStep {
    pub now: Millis,
    pub interval: Millis,
    pub tolerance: Millis,
}

impl PaceStep {
    /// Whether a stored `due` (0: none stored) admits a call at `now`.
    pub fn admits(&self, due: Millis) -> bool {
        due <= self.now + self.tolerance
    }

    /// The `due` to store after admitting a call over a stored `due`.
    pub fn next(&self, due: Millis) -> Millis {
        due.max(self.now) + self.interval
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
    /// Admits one more call under the pace kept under `id` ([`PaceStep`]), atomically:
    /// concurrent calls never pass more than the pace allows. `None`: admitted (counted).
    /// `Some(due)`: refused, nothing written; the stored `due` (the next call is admitted
    /// at `due - tolerance`).
    async fn pace(&self, id: &str, step: &PaceStep) -> StoreResult<Option<Millis>>;
    /// The held calls kept under `id`.
    async fn holds(&self, id: &str) -> StoreResult<Holds>;
    /// Stores `holds` under `id`, only if the stored version is still `expected` (0: none
    /// stored). `false`: it is not; nothing was written.
    async fn put_holds(&self, id: &str, holds: &Holds, expected: u64) -> StoreResult<bool>;
    /// The message window kept under `id` (empty when none is stored).
    async fn messages(&self, id: &str) -> StoreResult<crate::core::throttle::MessageWindow>;
    /// Locks the message window kept under `id` out until `until`, unless it is locked out
    /// longer already (the lockout never moves back). The record is kept until
    /// `keep_until` at least.
    async fn lock_messages(&self, id: &str, until: Millis, keep_until: Millis) -> StoreResult<()>;
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
