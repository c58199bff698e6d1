//! `POST /actions/execute`, in the contract's order of evaluation:
//!
//! 1. authenticate and parse (the handler), scope, `requested_by`;
//! 2. look up the idempotency key: a decided key replays its decision, another plan or
//!    requester is 422, a live lease is 409, an expired lease is resumed;
//! 3. verify the confirmation token locally;
//! 4. one atomic commit: decide the key (naming this attempt as its owner), consume the
//!    plan, check the control record, the rate limit and the account's message throttle
//!    ([`crate::core::throttle`]), store the action, append the audit record; on the
//!    embedded store, queue the message too (the queue is a table of the same database:
//!    a transactional outbox, so step 5 has nothing left to send);
//! 5. enqueue, and answer. Nothing is written after the send: a replay answers from the
//!    committed key, and an action whose send was lost (a crash) is sent by the sweeper;
//!    the queue deduplicates on the action id and workers are idempotent on it. A send that
//!    fails gives the key back (a claim whose lease already ended) so the caller's retry
//!    sends at once.
//!
//! On the AWS backend that is three calls on a first execute (one `BatchGetItem`, one
//! `TransactWriteItems`, one `SendMessage`; an order, a change or a cancel also reads its
//! account's message window, one `GetItem`) and two on a replay (the read and a `PutItem`
//! of its audit record). On SQLite it is one read transaction and one write.
//!
//! Conditions that changed under us (another request won a race) make the commit a
//! conflict; we then read again and decide again, a bounded number of times. A request
//! knows its own commits (the owner token on the key): one that finds its own decision
//! after an ambiguous failure (a lost reply retried into a failed condition, a timeout)
//! carries on from it instead of calling itself a concurrent request.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::{not_found, sha256_hex, ChatContext};
use crate::core::auth::{Caller, Permission, TokenFault};
use crate::core::clock::SharedClock;
use crate::core::domain::{
    human_time, new_id, rfc3339, ActionStatus, ActionType, IdempotencyKey, Millis, QueueTarget,
};
use crate::core::error::{ApiError, Code};
use crate::core::parse::check_ident;
use crate::core::policy;
use crate::core::policy::ConfirmationMode;
use crate::core::policy::Policy;
use crate::core::ports::{
    AccountStore, ActionStore, AuditLog, CommitOutcome, Conflict, ExecuteCommit, ExecuteLedger,
    KeyCondition, PlanChange, PositionStore, Queue, Reservation,
};
use crate::core::records::{
    ActionRecord, ApprovalDecision, AuditRecord, Control, Decision, KeyRecord, KeyState,
    PlanRecord, PlanStatus, QueueMessage, RateState, ResourceRefs, RiskCheck, Trace,
    QUEUE_MESSAGE_SCHEMA,
};
use crate::core::token::ConfirmationVerifier;

mod accept;
mod backlog;
mod decide;
mod dispatch;
mod round;
mod throttle;

use accept::*;
pub use backlog::Backlog;
pub(crate) use decide::*;
pub use dispatch::*;
use round::*;

/// How long a decided key replays its decision.
pub const REPLAY_WINDOW_MS: Millis = 24 * 3600 * 1000;
const MAX_ROUNDS: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub plan_id: String,
    /// The plan's confirmation token (`token` mode); absent or null for a plan the
    /// operator approves on the approval page (`operator` mode).
    #[serde(default)]
    pub confirmation_token: Option<String>,
    pub idempotency_key: IdempotencyKey,
    pub requested_by: String,
    #[serde(default)]
    pub chat_context: Option<ChatContext>,
}

impl schemars::JsonSchema for ExecuteRequest {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ExecuteRequest".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let chat = g.subschema_for::<ChatContext>();
        schemars::json_schema!({
            "type": "object",
            "description": "A plan to execute, its confirmation and an idempotency key.",
            "properties": {
                "plan_id": g.subschema_for::<crate::core::domain::Ident>(),
                "confirmation_token": {"anyOf": [
                    {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": "^[A-Za-z0-9_.-]+$",
                     "description": "The plan's confirmation_token (token confirmation)."},
                    {"type": "null"}
                ]},
                "idempotency_key": g.subschema_for::<IdempotencyKey>(),
                "requested_by": super::plan::requested_by_schema(),
                "chat_context": {"anyOf": [chat, {"type": "null"}]}
            },
            "required": ["plan_id", "idempotency_key", "requested_by"],
            "additionalProperties": false
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Accepted {
    pub action_id: String,
    pub status: &'static str,
    pub queue_target: QueueTarget,
    pub resource_refs: ResourceRefs,
    pub plan_id: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExecuteOutcome {
    /// 202: newly queued.
    Queued(Accepted),
    /// 200: the same key was decided before; the original action.
    Duplicate(Accepted),
}

/// Per-request facts that go into audit records.
pub struct RequestFacts<'a> {
    pub request_id: &'a str,
    pub chat: ChatContext,
}

struct Ctx<'a> {
    state: &'a Executor,
    caller: &'a Caller,
    req: &'a ExecuteRequest,
    facts: &'a RequestFacts<'a>,
    fingerprint: String,
    /// Keys are scoped to the service principal and the operator.
    scope: String,
    /// What this request committed, or may have: the owner token of each attempt, with
    /// what it would answer once found committed.
    mine: Mutex<Vec<Mine>>,
    /// The last commit failed ambiguously (the write may have happened): if the key is not
    /// found ours on the next read, this is the answer.
    unsure: Mutex<Option<ApiError>>,
    /// The plan's action type once a read found the plan (the metrics' label).
    action_type: Mutex<Option<ActionType>>,
    /// When this request's hold for room in the orders backlog ends (set when it first
    /// meets a full backlog).
    backlog_until: Mutex<Option<tokio::time::Instant>>,
    /// The last round ended in that hold.
    waited: std::sync::atomic::AtomicBool,
    /// The hold ended with a place in the backlog's count ([`Backlog::room_by`]): later
    /// rounds do not ask the backlog again (a cached count that includes this execute's
    /// own place would hold it again, and again, until its wait ends).
    placed: std::sync::atomic::AtomicBool,
}

/// One commit attempt of this request.
struct Mine {
    owner: String,
    /// The action it accepted (absent for a rejection).
    action: Option<ActionRecord>,
}

impl Ctx<'_> {
    /// The end of this request's hold for room in the orders backlog: `wait` after it first
    /// met a full backlog.
    fn backlog_wait_until(&self, wait: std::time::Duration) -> tokio::time::Instant {
        *self
            .backlog_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(|| tokio::time::Instant::now() + wait)
    }

    fn principal(&self) -> &str {
        &self.scope
    }

    fn remember(&self, owner: &str, action: Option<&ActionRecord>) {
        self.mine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Mine {
                owner: owner.to_string(),
                action: action.cloned(),
            });
    }

    /// The attempt of this request that wrote `rec`, if one did.
    fn own(&self, rec: &KeyRecord) -> Option<Option<ActionRecord>> {
        let owner = rec.owner()?;
        self.mine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|m| m.owner == owner)
            .map(|m| m.action.clone())
    }

    fn set_unsure(&self, e: ApiError) {
        *self.unsure.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
    }

    fn take_unsure(&self) -> Option<ApiError> {
        self.unsure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn audit(&self, now: Millis, decision: &str) -> AuditRecord {
        AuditRecord {
            audit_id: new_id("aud", now),
            at: now,
            event: "execute".into(),
            decision: decision.into(),
            reason_code: None,
            reason: None,
            action_type: None,
            plan_id: Some(self.req.plan_id.clone()),
            action_id: None,
            idempotency_key: Some(self.req.idempotency_key.as_str().to_string()),
            operator_id: self.caller.operator.sub.clone(),
            service_principal: self.caller.service.sub.clone(),
            payload_hash: None,
            risk_checks: Vec::new(),
            order_id: None,
            job_id: None,
            chat_session_id: self.facts.chat.chat_session_id.clone(),
            tool_call_id: self.facts.chat.tool_call_id.clone(),
            request_id: self.facts.request_id.to_string(),
            policy_version: None,
            approver: None,
            credential_id: None,
            user_verified: None,
            apigw_request_id: crate::telemetry::gateway_ids().0,
            lambda_request_id: crate::telemetry::gateway_ids().1,
        }
    }

    fn audit_rejection(&self, now: Millis, e: &ApiError, plan: Option<&PlanRecord>) -> AuditRecord {
        let mut a = self.audit(now, "rejected");
        a.reason_code = Some(e.code.as_str().into());
        a.reason = Some(e.message.clone());
        a.action_id = e.action_id.clone();
        if let Some(p) = plan {
            a.action_type = Some(p.action_type);
            a.payload_hash = Some(p.payload_hash.clone());
            a.policy_version = Some(p.policy_version.clone());
        }
        a
    }

    /// [`Ctx::reject`] for an answer that decides nothing and that a client asks again
    /// and again (a plan waiting for its approval): the first for this plan and
    /// idempotency key is audited, its repeats are counted (`airlock_audit_repeats_total`)
    /// and not written. The mark lasts as long as the plan can give this answer.
    async fn reject_once(&self, e: ApiError, plan: &PlanRecord) -> ApiError {
        let now = self.state.clock.now_ms();
        let key = self.req.idempotency_key.as_str();
        let mark = super::limits::refusal_mark_id(e.code, &self.scope, key, &plan.plan_id);
        let audit = self.audit_rejection(now, &e, Some(plan));
        match self
            .state
            .limits
            .append_once(&mark, plan.expires_at, &audit, now)
            .await
        {
            Ok(true) => e,
            Ok(false) => {
                metrics::counter!(super::limits::AUDIT_REPEATS, "code" => e.code.as_str())
                    .increment(1);
                e
            }
            Err(err) => err.into(),
        }
    }

    /// Appends an audit record for a rejection that is not part of a commit, then
    /// returns the error.
    async fn reject(&self, e: ApiError, plan: Option<&PlanRecord>) -> ApiError {
        let now = self.state.clock.now_ms();
        if let Err(err) = self
            .state
            .audit
            .append(&self.audit_rejection(now, &e, plan))
            .await
        {
            return err.into();
        }
        e
    }
}

fn accepted(d: &Decision) -> Option<Accepted> {
    match d {
        Decision::Queued {
            action_id,
            plan_id,
            queue_target,
            resource_refs,
        } => Some(Accepted {
            action_id: action_id.clone(),
            status: "queued",
            queue_target: *queue_target,
            resource_refs: resource_refs.clone(),
            plan_id: plan_id.clone(),
        }),
        Decision::Rejected { .. } => None,
    }
}

fn replayed_rejection(
    code: &str,
    message: &str,
    details: &[crate::core::error::FieldError],
) -> ApiError {
    ApiError::new(Code::parse(code).unwrap_or(Code::Internal), message)
        .with_details(details.to_vec())
}

/// The execute use case, built once per process (`app.rs`) with the ports it uses.
#[derive(Clone)]
pub struct Executor {
    pub clock: SharedClock,
    /// The process's policy; a policy in the control record takes precedence.
    pub policy: Arc<Policy>,
    /// How long an attempt holds its idempotency key before another may take over.
    pub lease_ms: Millis,
    /// Per-operator decided executes per rolling minute.
    pub rate_per_minute: u32,
    pub confirmations: Arc<ConfirmationVerifier>,
    pub ledger: Arc<dyn ExecuteLedger>,
    pub audit: Arc<dyn AuditLog>,
    pub accounts: Arc<dyn AccountStore>,
    pub positions: Arc<dyn PositionStore>,
    /// Reference prices, read again for the price band (a price that moved or went stale
    /// since the plan stops the order here).
    pub prices: Arc<dyn crate::core::ports::Prices>,
    pub actions: Arc<dyn ActionStore>,
    pub dispatch: Dispatch,
    /// Where operators approve plans (the `approval_required` answer names the page).
    pub approval_origin: String,
    pub backlog: Backlog,
    /// Marks of refusals audited once ([`Ctx::reject_once`]).
    pub limits: Arc<dyn crate::core::ports::limits::LimitStore>,
}

impl Executor {
    /// Plan id + confirmation token + idempotency key -> a queued action (or the replay of
    /// the key's earlier decision). `header_key`: the `Idempotency-Key` header, if sent.
    pub async fn execute(
        &self,
        caller: &Caller,
        req: ExecuteRequest,
        header_key: Option<&str>,
        facts: RequestFacts<'_>,
    ) -> Result<ExecuteOutcome, ApiError> {
        let state = self;
        check_execute_request(&req)?;
        caller.require(Permission::Execute)?;
        super::parse_requested_by(&req.requested_by)?;
        if let Some(h) = header_key {
            if h != req.idempotency_key.as_str() {
                return Err(ApiError::invalid(
                    "/idempotency_key",
                    "does not match the Idempotency-Key header; send the same key in both or only in the body",
                ));
            }
        }
        let fingerprint = sha256_hex(
            format!(
                "{}\u{0}{}\u{0}{}",
                req.plan_id, req.requested_by, caller.service.sub
            )
            .as_bytes(),
        );
        let ctx = Ctx {
            state,
            caller,
            req: &req,
            facts: &facts,
            fingerprint,
            scope: crate::core::records::key_scope(&caller.service.sub, &caller.operator.sub),
            mine: Mutex::new(Vec::new()),
            unsure: Mutex::new(None),
            action_type: Mutex::new(None),
            backlog_until: Mutex::new(None),
            waited: std::sync::atomic::AtomicBool::new(false),
            placed: std::sync::atomic::AtomicBool::new(false),
        };
        let result = execute_rounds(&ctx).await;
        let action_type = ctx
            .action_type
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map_or("unknown", ActionType::as_str);
        record_metrics(action_type, &result);
        result
    }
}

async fn execute_rounds(ctx: &Ctx<'_>) -> Result<ExecuteOutcome, ApiError> {
    // Acting for another operator is the clearest sign of an agent overreaching: audited.
    if let Err(e) = ctx.caller.check_requested_by(&ctx.req.requested_by) {
        return Err(ctx.reject(e, None).await);
    }
    let mut rounds = 0;
    while rounds < MAX_ROUNDS {
        if let Some(done) = round(ctx).await? {
            return Ok(done);
        }
        // A round that waited for room in the backlog is not a conflict: its wait is
        // bounded by the request's own deadline instead.
        if !ctx.waited.swap(false, Ordering::Relaxed) {
            rounds += 1;
        }
    }
    Err(ApiError::unavailable(
        "execute: too many conflicting concurrent writes",
    ))
}

/// `airlock_execute_requests_total{action_type, outcome}` and, for a rejection (the
/// contract's `status: rejected` answers), `airlock_execute_rejections_total{action_type,
/// code}`. A malformed request, a refused caller or an outage is neither: those are the
/// HTTP metrics' statuses. `action_type` is `unknown` when no plan was found.
fn record_metrics(action_type: &'static str, result: &Result<ExecuteOutcome, ApiError>) {
    use crate::metrics::{EXECUTE_REJECTIONS, EXECUTE_REQUESTS};
    let outcome = match result {
        Ok(ExecuteOutcome::Queued(_)) => "queued",
        Ok(ExecuteOutcome::Duplicate(_)) => "duplicate",
        Err(e) if e.code.is_execute_rejection() => {
            metrics::counter!(EXECUTE_REJECTIONS, "action_type" => action_type, "code" => e.code.as_str())
                .increment(1);
            "rejected"
        }
        Err(_) => return,
    };
    metrics::counter!(EXECUTE_REQUESTS, "action_type" => action_type, "outcome" => outcome)
        .increment(1);
}

/// Bounds of an execute body that the typed parse does not enforce: the plan id is an
/// identifier and the confirmation token compact-JWS text, so neither reaches a store key
/// or a log malformed. `idempotency_key` is bounded by its type, `requested_by` by the
/// protocol.
pub fn check_execute_request(req: &ExecuteRequest) -> Result<(), ApiError> {
    check_ident("/plan_id", &req.plan_id)
        .map_err(|_| ApiError::invalid("/plan_id", "must be a plan id from POST /actions/plan"))?;
    if let Some(t) = &req.confirmation_token {
        if t.is_empty()
            || t.len() > 4096
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(ApiError::invalid(
                "/confirmation_token",
                "must be the token from the plan",
            ));
        }
    }
    if let Some(c) = &req.chat_context {
        c.validate("/chat_context")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::error::{StoreError, StoreResult};
    use crate::core::ports::{Delivery, QueueDepth};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A queue that only counts: `count` messages, or a failure; `asked` counts the asks.
    /// Each ask after the first finds `drained` fewer (the workers at work).
    struct Counted {
        count: Option<u64>,
        drained: u64,
        asked: AtomicU64,
    }

    #[async_trait::async_trait]
    impl Queue for Counted {
        async fn send(&self, _: &QueueMessage, _: &str, _: &str) -> StoreResult<()> {
            unreachable!()
        }
        async fn depth(&self) -> StoreResult<Vec<QueueDepth>> {
            unreachable!()
        }
        async fn backlog(&self, queue: QueueTarget) -> StoreResult<u64> {
            assert_eq!(queue, QueueTarget::Orders);
            let before = self.asked.fetch_add(1, Ordering::Relaxed);
            self.count
                .map(|n| n.saturating_sub(before * self.drained))
                .ok_or_else(|| StoreError::Unavailable("throttled".into()))
        }
        async fn receive(&self, _: QueueTarget, _: u32, _: u64) -> StoreResult<Vec<Delivery>> {
            unreachable!()
        }
        async fn ack(&self, _: QueueTarget, _: &str) -> StoreResult<()> {
            unreachable!()
        }
        async fn release(&self, _: QueueTarget, _: &str, _: u64) -> StoreResult<()> {
            unreachable!()
        }
        async fn dead_letters(&self, _: QueueTarget, _: u32, _: u64) -> StoreResult<Vec<Delivery>> {
            unreachable!()
        }
        async fn redrive(&self, _: QueueTarget, _: u32) -> StoreResult<usize> {
            unreachable!()
        }
    }

    fn queue(count: Option<u64>) -> Counted {
        Counted {
            count,
            drained: 0,
            asked: AtomicU64::new(0),
        }
    }

    fn clock() -> SharedClock {
        Arc::new(crate::core::clock::OffsetClock::system())
    }

    /// A held submission waits for room and is admitted once there is some: the queue was
    /// asked again until its count fell below the limit.
    #[tokio::test]
    async fn a_held_submission_is_admitted_when_the_workers_make_room() {
        let draining = Counted {
            drained: 1,
            ..queue(Some(5))
        };
        let gate = Backlog::new(3, 0, 2_000);
        assert!(gate.refusal(&draining, 0).await.is_some(), "5 is full");
        let until = tokio::time::Instant::now() + gate.wait;
        assert!(gate.room_by(&draining, &clock(), until).await);
        // Asked at 5 (full), 4 (full), 3 (full), 2: room.
        assert_eq!(draining.asked.load(Ordering::Relaxed), 4);
    }

    /// Executes held at the same moment share their counts: fifty of them held for 40 ms
    /// ask the queue about once per poll interval, not fifty times.
    #[tokio::test]
    async fn held_executes_share_one_count_per_interval() {
        let full = queue(Some(3));
        let gate = Backlog::new(3, 0, 40);
        let until = tokio::time::Instant::now() + gate.wait;
        let (full, gate, clock) = (&full, &gate, clock());
        let held = (0..50).map(|_| gate.room_by(full, &clock, until));
        let rooms = futures_util::future::join_all(held).await;
        assert!(rooms.iter().all(|r| !r), "the backlog stayed full");
        let asked = full.asked.load(Ordering::Relaxed);
        // 40 ms at one count per 2 ms is about 20 (timer slack makes it fewer).
        assert!((1..=40).contains(&asked), "asked {asked} times");
    }

    /// Room for two lets go two of a crowd of fifty held executes, not all of them: the
    /// others stay held (and are refused when their wait ends, the backlog staying at 2).
    #[tokio::test]
    async fn room_for_two_lets_go_two_of_a_crowd() {
        let two_free = queue(Some(1));
        let gate = Backlog::new(3, 0, 40);
        let until = tokio::time::Instant::now() + gate.wait;
        let (q, gate, clock) = (&two_free, &gate, clock());
        let held = (0..50).map(|_| gate.room_by(q, &clock, until));
        let let_go = futures_util::future::join_all(held)
            .await
            .into_iter()
            .filter(|r| *r)
            .count();
        // Each fresh count finds room for two again (the fake never fills): two per
        // interval at most, about twenty intervals.
        let asked = two_free.asked.load(Ordering::Relaxed) as usize;
        assert!(let_go <= 2 * asked, "{let_go} let go on {asked} counts");
        assert!(let_go < 50, "the whole crowd was let go");
    }

    /// A backlog that stays full holds a submission for its whole wait, then refuses it;
    /// a wait of 0 refuses at once.
    #[tokio::test]
    async fn a_backlog_that_stays_full_refuses_after_the_wait() {
        let full = queue(Some(3));
        let gate = Backlog::new(3, 0, 200);
        let started = tokio::time::Instant::now();
        assert!(!gate.room_by(&full, &clock(), started + gate.wait).await);
        assert!(started.elapsed() >= std::time::Duration::from_millis(200));
        assert!(
            full.asked.load(Ordering::Relaxed) >= 2,
            "asked while it waited"
        );
        let at_once = Backlog::new(3, 0, 0);
        let started = tokio::time::Instant::now();
        assert!(
            !at_once
                .room_by(&full, &clock(), started + at_once.wait)
                .await
        );
        assert!(started.elapsed() < std::time::Duration::from_millis(50));
    }

    #[tokio::test]
    async fn the_backlog_refuses_at_its_limit_and_reuses_its_count_for_the_cache_time() {
        let full = queue(Some(3));
        let gate = Backlog::new(3, 1_000, 0);
        let e = gate
            .refusal(&full, 10_000)
            .await
            .expect("refused at the limit");
        assert_eq!(e.code, Code::OrdersBacklogged);
        assert_eq!(e.retry_after, Some(1));
        // Within the cache time the count is reused; after it, asked again.
        assert!(gate.refusal(&full, 10_999).await.is_some());
        assert_eq!(full.asked.load(Ordering::Relaxed), 1);
        assert!(gate.refusal(&full, 11_000).await.is_some());
        assert_eq!(full.asked.load(Ordering::Relaxed), 2);
        // A clock that went back does not keep a stale count.
        assert!(gate.refusal(&full, 9_000).await.is_some());
        assert_eq!(full.asked.load(Ordering::Relaxed), 3);

        assert!(
            Backlog::new(4, 0, 0).refusal(&full, 0).await.is_none(),
            "below"
        );
        let off = Backlog::new(0, 0, 0);
        assert!(off.refusal(&queue(Some(1_000_000)), 0).await.is_none());
    }

    #[tokio::test]
    async fn a_count_that_fails_admits() {
        let failing = queue(None);
        let gate = Backlog::new(1, 0, 0);
        assert!(gate.refusal(&failing, 0).await.is_none());
        assert_eq!(failing.asked.load(Ordering::Relaxed), 1);
    }
}
