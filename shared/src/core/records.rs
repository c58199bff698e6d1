//! What the ports store: plans, idempotency records, actions, audit records, the control
//! record, rate-limit state and queue messages. Both backends store exactly these.

use serde::{Deserialize, Serialize};

use crate::core::domain::payload::NormalizedPayload;
use crate::core::domain::{ActionStatus, ActionType, Millis, QueueTarget};
use crate::core::error::FieldError;

pub use crate::core::policy::{CheckStatus, Control, RiskCheck, RolloutMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    /// Waiting for execute.
    Planned,
    /// Consumed by an execute; `action_id` is set.
    Executed,
    /// Closed by a rejection at execute (kill switch, rollout mode, policy re-check), or
    /// declined by an operator on the approval page (`closed_reason` `plan_declined`).
    Closed,
}

/// What an operator decided on the approval page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    Approved,
    Declined,
}

impl ApprovalDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalDecision::Approved => "approved",
            ApprovalDecision::Declined => "declined",
        }
    }
}

/// An operator's approval or decline of a plan, made with a passkey assertion whose
/// challenge was bound to the plan id and payload hash. Written once, on the plan, only
/// while the plan is planned and unexpired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub decision: ApprovalDecision,
    /// The operator who approved (their passkey's `sub`).
    pub approver: String,
    /// The passkey's credential id (base64url).
    pub credential_id: String,
    /// The authenticator's user-verified flag (always true: verification is required).
    pub user_verified: bool,
    /// The payload hash the operator saw and signed for.
    pub payload_hash: String,
    pub at: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRecord {
    pub plan_id: String,
    pub action_type: ActionType,
    pub account_id: String,
    pub desk: String,
    pub requested_by: String,
    pub service_principal: String,
    pub normalized_payload: NormalizedPayload,
    pub payload_hash: String,
    pub risk_checks: Vec<RiskCheck>,
    pub executable: bool,
    pub preview: String,
    pub queue_target: QueueTarget,
    pub policy_version: String,
    pub status: PlanStatus,
    pub closed_reason: Option<String>,
    pub action_id: Option<String>,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub chat_context: serde_json::Value,
    pub request_id: String,
    /// The contract's reference price when the plan was made: what a limit or stop order's
    /// price band was checked against (execute re-checks the band against it under the
    /// policy then in force), and what the order is valued at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_price: Option<crate::core::domain::Price>,
    /// When the reference price was observed (`None`: no reference, or one of unknown age).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_observed_at: Option<Millis>,
    /// How the plan is confirmed (the policy's mode for its action type at plan time).
    #[serde(default = "token_mode")]
    pub confirmation: crate::core::policy::ConfirmationMode,
    /// `operator` mode above the policy's four-eyes notional: the approver must be another
    /// operator with `approve` on the plan's desk.
    #[serde(default)]
    pub four_eyes: bool,
    /// The order's notional (USD) as the plan measured it, kept when the policy had a
    /// four-eyes threshold: execute holds the plan to the threshold in force then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notional: Option<rust_decimal::Decimal>,
    /// The decision that ended the approval step on the approval page (`operator` mode
    /// only): the approval that completed it, or a decline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// Every approval given so far. A four-eyes plan needs two: its requester's and another
    /// approver's, in either order; the second one is also its `approval`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Approval>,
}

fn token_mode() -> crate::core::policy::ConfirmationMode {
    crate::core::policy::ConfirmationMode::Token
}

impl PlanRecord {
    /// An `operator`-mode plan that can still be approved or declined: executable, planned,
    /// undecided and unexpired at `now`.
    pub fn awaits_approval(&self, now: Millis) -> bool {
        self.confirmation == crate::core::policy::ConfirmationMode::Operator
            && self.executable
            && self.status == PlanStatus::Planned
            && self.approval.is_none()
            && now < self.expires_at
    }

    fn awaiting(&self) -> bool {
        self.confirmation == crate::core::policy::ConfirmationMode::Operator
            && self.executable
            && self.status == PlanStatus::Planned
            && self.approval.is_none()
    }

    /// The operator whose pending list shows the plan while it awaits approval: its
    /// requester (a key of the pending-approvals listing; absent otherwise, so the listing
    /// stays small).
    pub fn awaiting_requester(&self) -> Option<&str> {
        self.awaiting().then_some(self.requested_by.as_str())
    }

    /// The desk whose approvers are asked, while a four-eyes plan awaits approval: the
    /// other key of the pending-approvals listing.
    pub fn awaiting_desk(&self) -> Option<&str> {
        (self.awaiting() && self.four_eyes).then_some(self.desk.as_str())
    }

    /// Whether this operator has approved the plan.
    pub fn approved_by(&self, sub: &str) -> bool {
        self.approvals
            .iter()
            .any(|a| a.approver == sub && a.decision == ApprovalDecision::Approved)
    }
}

/// Where a newest-first listing of plans stopped: the last plan's expiry and id.
pub type PlanPosition = (Millis, String);

/// An operator's decision written on a plan ([`crate::core::ports::PlanStore::record_approval`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalChange {
    /// How many approvals the plan held when read: the write holds only if it still does.
    pub seen: usize,
    /// The plan's approvals after this one.
    pub approvals: Vec<Approval>,
    /// Set when this ends the approval step: the completing approval, or a decline.
    pub decision: Option<Approval>,
    /// Also close the plan with this reason code (a decline).
    pub close: Option<String>,
}

/// What an execute points at: the order or job the worker will create.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ResourceRefs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

/// The decision an idempotency key replays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decision {
    Queued {
        action_id: String,
        plan_id: String,
        queue_target: QueueTarget,
        resource_refs: ResourceRefs,
    },
    Rejected {
        code: String,
        message: String,
        #[serde(default)]
        details: Vec<FieldError>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KeyState {
    /// An execute holds the key; `action_id` is accepted but maybe not yet sent.
    Claimed {
        lease_owner: String,
        lease_until: Millis,
        action_id: String,
    },
    Decided {
        decision: Decision,
        /// The attempt that decided it at the atomic step (an execute's owner token):
        /// the request that wrote it recognises its own decision after an ambiguous
        /// failure, and only it may give the key back when its send fails.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
}

/// Receives of a queue message before it moves to its dead-letter queue (the queues'
/// redrive policy; the last one settles the action as failed).
pub const MAX_RECEIVES: u32 = 5;

/// The scope of idempotency keys: one service principal acting for one operator. Two
/// operators of one service never share a key, so neither can learn whether the other used
/// one, nor take a predictable key first. The length prefix makes the pair unambiguous.
pub fn key_scope(service_principal: &str, operator_id: &str) -> String {
    format!(
        "{}:{service_principal}/{operator_id}",
        service_principal.len()
    )
}

/// An idempotency key, scoped to a service principal and an operator ([`key_scope`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub principal: String,
    pub key: String,
    /// SHA-256 of plan id, requester and service principal: a key reused with another
    /// plan or requester is 422.
    pub fingerprint: String,
    pub plan_id: String,
    pub requested_by: String,
    pub state: KeyState,
    pub created_at: Millis,
    /// After this the record counts as absent (24 h after the decision).
    pub expires_at: Millis,
}

impl KeyRecord {
    /// The owner token holding the key: a claim's lease owner, or the attempt that decided
    /// it. Conditional writes on the key compare this (`lease_owner` in both stores).
    pub fn owner(&self) -> Option<&str> {
        match &self.state {
            KeyState::Claimed { lease_owner, .. } => Some(lease_owner),
            KeyState::Decided { owner, .. } => owner.as_deref(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub action_id: String,
    pub plan_id: String,
    pub action_type: ActionType,
    pub status: ActionStatus,
    pub queue_target: QueueTarget,
    pub resource_refs: ResourceRefs,
    pub account_id: String,
    pub desk: String,
    pub requested_by: String,
    pub service_principal: String,
    pub idempotency_key: String,
    /// The queue message, kept so a retry or the sweeper resends the very same body.
    pub message: QueueMessage,
    /// When the message was sent; `None` until then (the sweeper looks for these).
    pub enqueued_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Trace {
    pub request_id: String,
    pub chat_session_id: Option<String>,
    pub tool_call_id: Option<String>,
    /// On Lambda: the execute's API Gateway request id and Lambda request id, so the
    /// worker's log lines join the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apigw_request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lambda_request_id: Option<String>,
}

/// The public, versioned queue message (`schema: airlock.action.v1`); see
/// `docs/queue-message.schema.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueMessage {
    pub schema: String,
    pub action_id: String,
    pub plan_id: String,
    pub action_type: ActionType,
    pub normalized_payload: NormalizedPayload,
    pub resource_refs: ResourceRefs,
    pub requested_by: String,
    pub service_principal: String,
    pub enqueued_at: String,
    pub trace: Trace,
}

pub const QUEUE_MESSAGE_SCHEMA: &str = "airlock.action.v1";

/// Accepted executes of one operator: the count in the current minute bucket and in the one
/// before it, for a sliding-window estimate of the last 60 seconds (constant size, and
/// concurrent executes increment it without conflicting).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateState {
    pub operator_id: String,
    /// Start of the minute `count` belongs to; 0 when there is no record yet.
    pub bucket: Millis,
    pub count: u32,
    pub previous: u32,
}

pub const RATE_WINDOW_MS: Millis = 60_000;

impl RateState {
    /// The start of the minute bucket `now` falls in.
    pub fn bucket_of(now: Millis) -> Millis {
        now - now.rem_euclid(RATE_WINDOW_MS)
    }

    /// (this minute's count, the previous minute's count) as seen at `now`.
    fn counts_at(&self, now: Millis) -> (u32, u32) {
        let current = Self::bucket_of(now);
        if self.bucket == current {
            (self.count, self.previous)
        } else if self.bucket == current - RATE_WINDOW_MS {
            (0, self.count)
        } else {
            (0, 0)
        }
    }

    /// Executes in the last rolling minute, estimated: the previous bucket weighted by how
    /// much of it is still inside the window, plus the current bucket.
    pub fn estimate(&self, now: Millis) -> f64 {
        let (cur, prev) = self.counts_at(now);
        let elapsed = (now - Self::bucket_of(now)) as f64 / RATE_WINDOW_MS as f64;
        prev as f64 * (1.0 - elapsed) + cur as f64
    }

    /// The update that records one more execute at `now`, if the limit allows it.
    pub fn next(&self, now: Millis, limit: u32) -> RateUpdate {
        let current = Self::bucket_of(now);
        let (_, prev) = self.counts_at(now);
        RateUpdate {
            operator_id: self.operator_id.clone(),
            bucket: current,
            expected_bucket: self.bucket,
            previous: prev,
            cap: Self::cap(prev, now - current, limit),
        }
    }

    /// The highest count this minute may have before one more execute, so that the sliding
    /// estimate stays below `limit`: `count < cap` exactly when
    /// `prev * (W - into) / W + count < limit`, in integers (no rounding at the edge).
    /// The estimate only falls as the minute goes on, so a cap computed at the decision
    /// still holds at the commit: the atomic condition enforces the same window the
    /// decision estimated, and concurrent bursts cannot pass twice the rate.
    fn cap(prev: u32, into: Millis, limit: u32) -> u32 {
        let w = RATE_WINDOW_MS as i128;
        let room = limit as i128 * w - prev as i128 * (w - (into as i128).clamp(0, w));
        if room <= 0 {
            0
        } else {
            ((room + w - 1) / w).min(limit as i128) as u32
        }
    }
}

/// One more execute for an operator, applied atomically: an increment of the current bucket
/// while it is below `cap` (when the stored bucket is already `bucket`), or a roll-over to
/// `bucket` with a count of 1 (when the stored bucket is still `expected_bucket`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateUpdate {
    pub operator_id: String,
    pub bucket: Millis,
    pub expected_bucket: Millis,
    pub previous: u32,
    /// This minute's count must be below this ([`RateState::next`]).
    pub cap: u32,
}

impl RateUpdate {
    pub fn is_increment(&self) -> bool {
        self.expected_bucket == self.bucket
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub audit_id: String,
    pub at: Millis,
    /// `plan` or `execute`.
    pub event: String,
    /// `planned`, `queued`, `duplicate`, `rejected`, `resent`.
    pub decision: String,
    pub reason_code: Option<String>,
    pub reason: Option<String>,
    pub action_type: Option<ActionType>,
    pub plan_id: Option<String>,
    pub action_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub operator_id: String,
    pub service_principal: String,
    pub payload_hash: Option<String>,
    pub risk_checks: Vec<RiskCheck>,
    pub order_id: Option<String>,
    pub job_id: Option<String>,
    pub chat_session_id: Option<String>,
    pub tool_call_id: Option<String>,
    pub request_id: String,
    pub policy_version: Option<String>,
    /// Approval events: who approved or declined (their passkey's `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// Approval events: the passkey's credential id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    /// Approval events: the authenticator's user-verified flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_verified: Option<bool>,
    /// On Lambda: API Gateway's id of the request (its access logs) and the invocation's
    /// request id (the function's log stream), next to Airlock's `request_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apigw_request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lambda_request_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The atomic condition (`count < cap`) admits exactly what the sliding estimate
    /// admits, at every point of the minute: exact integer arithmetic, no float edge.
    #[test]
    fn the_commit_cap_is_the_sliding_window() {
        let w = RATE_WINDOW_MS as i128;
        for limit in [1u32, 2, 5, 7, 60] {
            for prev in 0..=limit + 2 {
                for into in (0..RATE_WINDOW_MS).step_by(997) {
                    let cap = RateState::cap(prev, into, limit);
                    for cur in 0..=limit + 2 {
                        // estimate < limit  <=>  prev * (W - into) + cur * W < limit * W
                        let admits = (prev as i128) * (w - into as i128) + (cur as i128) * w
                            < (limit as i128) * w;
                        assert_eq!(
                            cur < cap,
                            admits,
                            "limit {limit} prev {prev} into {into} cur {cur}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_rate_window_slides_across_minute_buckets() {
        let t0 = 1_800_000_000_000 - 1_800_000_000_000 % RATE_WINDOW_MS;
        let s = RateState {
            operator_id: "op".into(),
            bucket: t0,
            count: 20,
            previous: 0,
        };
        assert_eq!(s.estimate(t0 + 10_000), 20.0);
        // Half-way through the next minute, half of the previous minute still counts.
        assert_eq!(s.estimate(t0 + 90_000), 10.0);
        // Two minutes later nothing counts.
        assert_eq!(s.estimate(t0 + 130_000), 0.0);
        let inc = s.next(t0 + 10_000, 25);
        assert!(inc.is_increment());
        let roll = s.next(t0 + 70_000, 25);
        assert!(!roll.is_increment());
        assert_eq!(
            (roll.bucket, roll.expected_bucket, roll.previous),
            (t0 + 60_000, t0, 20)
        );
    }
}
