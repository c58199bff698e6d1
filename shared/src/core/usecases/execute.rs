//! `POST /actions/execute`, in the contract's order of evaluation:
//!
//! 1. authenticate and parse (the handler), scope, `requested_by`;
//! 2. look up the idempotency key: a decided key replays its decision, another plan or
//!    requester is 422, a live lease is 409, an expired lease is resumed;
//! 3. verify the confirmation token locally;
//! 4. one atomic commit: decide the key (naming this attempt as its owner), consume the
//!    plan, check the control record and the rate limit, store the action, append the
//!    audit record; on the embedded store, queue the message too (the queue is a table of
//!    the same database: a transactional outbox, so step 5 has nothing left to send);
//! 5. enqueue, and answer. Nothing is written after the send: a replay answers from the
//!    committed key, and an action whose send was lost (a crash) is sent by the sweeper;
//!    the queue deduplicates on the action id and workers are idempotent on it. A send that
//!    fails gives the key back (a claim whose lease already ended) so the caller's retry
//!    sends at once.
//!
//! On the AWS backend that is three calls on a first execute (one `BatchGetItem`, one
//! `TransactWriteItems`, one `SendMessage`) and two on a replay (the read and a `PutItem`
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

use super::plan::order_inputs_exposure;
use super::{not_found, sha256_hex, ChatContext};
use crate::core::auth::{Caller, Permission, TokenFault};
use crate::core::clock::SharedClock;
use crate::core::parse::check_ident;
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::cl::ClContract;
use crate::core::domain::ExposureDelta;
use crate::core::domain::OrderSubmitCl;
use crate::core::domain::{
    human_time, new_id, rfc3339, ActionStatus, ActionType, IdempotencyKey, Millis, QueueTarget,
};
use crate::core::error::{ApiError, Code};
use crate::core::policy::ConfirmationMode;
use crate::core::policy::Policy;
use crate::core::policy::{self, OrderInputs};
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

fn replayed_rejection(code: &str, message: &str, details: &[crate::core::error::FieldError]) -> ApiError {
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
    pub actions: Arc<dyn ActionStore>,
    pub dispatch: Dispatch,
    /// Where operators approve plans (the `approval_required` answer names the page).
    pub approval_origin: String,
    pub backlog: Backlog,
    /// Marks of refusals audited once ([`Ctx::reject_once`]).
    pub limits: Arc<dyn crate::core::ports::limits::LimitStore>,
}

/// Execute's admission check for order submissions: while the orders queue holds `limit`
/// messages or more, waiting or being handled, a submission is held for up to `wait_ms`
/// for room (the workers pace a burst), then refused (503 `orders_backlogged`,
/// `Retry-After: 1`), so an accepted order reaches the broker moments after its
/// confirmation and a stalled or outrun pipeline does not pile up orders to send late.
/// Cancels and syncs are never held or refused (they reduce risk). The count is reused for
/// `cache_ms` (each ask is an SQS call on AWS).
#[derive(Clone)]
pub struct Backlog {
    limit: u32,
    cache_ms: Millis,
    wait: std::time::Duration,
    /// The last count and when it was read.
    seen: Arc<Mutex<Option<(Millis, u64)>>>,
}

impl Backlog {
    pub fn new(limit: u32, cache_ms: u64, wait_ms: u64) -> Self {
        Backlog {
            limit,
            cache_ms: cache_ms.min(i64::MAX as u64) as Millis,
            wait: std::time::Duration::from_millis(wait_ms),
            seen: Arc::default(),
        }
    }

    /// The orders queue's count: the last one read, if younger than `max_age`.
    async fn count(&self, queue: &dyn Queue, now: Millis, max_age: Millis) -> u64 {
        let cached = *self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match cached {
            Some((at, n)) if (at..at + max_age).contains(&now) => n,
            _ => {
                // The count is a brake on delay, not a risk control (those hold in the
                // atomic step and at the worker): a count that fails or is throttled
                // admits, for the cache's time, and the send meets the queue as before.
                let n = match queue.backlog(QueueTarget::Orders).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!(cause = %e, "orders backlog unknown; admitting");
                        0
                    }
                };
                *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some((now, n));
                n
            }
        }
    }

    fn full(&self, n: u64) -> bool {
        self.limit != 0 && n >= u64::from(self.limit)
    }

    /// `None`: admit. `Some`: the refusal, unless the caller waits for room.
    async fn refusal(&self, queue: &dyn Queue, now: Millis) -> Option<ApiError> {
        if self.limit == 0 {
            return None;
        }
        let n = self.count(queue, now, self.cache_ms).await;
        self.full(n).then(|| {
            ApiError::new(
                Code::OrdersBacklogged,
                format!(
                    "The orders queue holds {n} orders not yet handled (the limit is {}): an order accepted now would reach the broker late. Retry in 1 s with the same idempotency key.",
                    self.limit
                ),
            )
            .retry_after(1)
        })
    }

    /// Waits until the backlog is below its limit (`true`) or `until` passes (`false`),
    /// looking as often as the queue allows ([`Queue::backlog_poll`], whatever the cache
    /// time: a cache as long as the wait would otherwise never see room). The executes
    /// held at the same moment share one count per interval, and each one let go takes a
    /// place in that count, so a count with room for `k` lets go about `k` of them, not
    /// the whole crowd; `clock` dates the counts.
    async fn room_by(
        &self,
        queue: &dyn Queue,
        clock: &SharedClock,
        until: tokio::time::Instant,
    ) -> bool {
        let every = queue.backlog_poll();
        let max_age = every.as_millis().clamp(1, i64::MAX as u128) as Millis;
        while tokio::time::Instant::now() < until {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(every.min(left)).await;
            let now = clock.now_ms();
            let n = self.count(queue, now, max_age).await;
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            let n = match seen.as_mut() {
                Some((_, counted)) => counted,
                None => &mut { n },
            };
            if !self.full(*n) {
                // This execute's place: the next held one sees one fewer free.
                *n += 1;
                return true;
            }
        }
        false
    }
}

/// Steps 5 and 6 of execute, shared with the sweeper: send an accepted action's message,
/// then settle its key, only while holding the key's lease.
#[derive(Clone)]
pub struct Dispatch {
    pub queue: Arc<dyn Queue>,
    pub ledger: Arc<dyn ExecuteLedger>,
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
        execute(self, caller, req, header_key, facts).await
    }
}

async fn execute(
    state: &Executor,
    caller: &Caller,
    req: ExecuteRequest,
    header_key: Option<&str>,
    facts: RequestFacts<'_>,
) -> Result<ExecuteOutcome, ApiError> {
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

/// One read-decide-commit round. `Ok(None)`: a condition changed under us; go again.
async fn round(ctx: &Ctx<'_>) -> Result<Option<ExecuteOutcome>, ApiError> {
    let st = ctx.state;
    let now = st.clock.now_ms();
    let key = ctx.req.idempotency_key.as_str();

    // One read: the key, the plan, the control record and the rate state.
    let snap = st
        .ledger
        .snapshot(
            ctx.principal(),
            key,
            &ctx.req.plan_id,
            &ctx.caller.operator.sub,
            now,
        )
        .await?;

    if let Some(p) = &snap.plan {
        *ctx.action_type
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(p.action_type);
    }

    // Our last commit failed ambiguously: the key says whether it happened.
    let unsure = ctx.take_unsure();

    // 2. The idempotency key.
    if let Some(rec) = snap.key {
        if let Some(action) = ctx.own(&rec) {
            // Our own commit, whose answer was lost or whose conditions a retry of it
            // failed: carry on from it.
            return own_decision(ctx, &rec, action, now).await;
        }
        if rec.fingerprint != ctx.fingerprint {
            let e = ApiError::new(
                Code::IdempotencyKeyReused,
                "This idempotency key was already used for another plan or requester; use a new key for a new execute.",
            )
            .with_field("/idempotency_key", "already used for another plan or requester");
            return Err(ctx.reject(e, None).await);
        }
        return match rec.state.clone() {
            KeyState::Decided { decision, .. } => match accepted(&decision) {
                Some(a) => {
                    let mut audit = ctx.audit(now, "duplicate");
                    audit.action_id = Some(a.action_id.clone());
                    audit.order_id = a.resource_refs.order_id.clone();
                    audit.job_id = a.resource_refs.job_id.clone();
                    st.audit.append(&audit).await?;
                    Ok(Some(ExecuteOutcome::Duplicate(Accepted {
                        status: "duplicate",
                        ..a
                    })))
                }
                None => match decision {
                    Decision::Rejected {
                        code,
                        message,
                        details,
                    } => Err(ctx
                        .reject(replayed_rejection(&code, &message, &details), None)
                        .await),
                    Decision::Queued { .. } => unreachable!("handled above"),
                },
            },
            KeyState::Claimed {
                lease_until,
                action_id,
                ..
            } if lease_until > now => {
                let wait = ((lease_until - now) as u64).div_ceil(1000);
                let mut e = ApiError::new(
                    Code::IdempotencyKeyInFlight,
                    format!("The first request with this idempotency key is still running; retry in {wait} s with the same key."),
                )
                .retry_after(wait);
                e.action_id = Some(action_id);
                Err(ctx.reject(e, None).await)
            }
            KeyState::Claimed { action_id, .. } => {
                // The first attempt committed but its send failed: resume at the enqueue.
                resume(st, &rec, &action_id, ctx.facts.request_id, now).await
            }
        };
    }
    // Our last commit failed ambiguously and did not happen: that failure is the answer.
    if let Some(e) = unsure {
        return Err(e);
    }

    // 3. The confirmation token, locally (no signer call), when one was sent.
    let claims = match &ctx.req.confirmation_token {
        Some(token) => Some(verify_token(ctx, token, now).await?),
        None => None,
    };

    // The plan, as this operator may see it.
    let plan = match snap.plan {
        Some(p)
            if ctx.caller.can_see_desk(&p.desk)
                && p.service_principal == ctx.caller.service.sub =>
        {
            p
        }
        _ => {
            let e = not_found(Code::PlanNotFound, "plan", &ctx.req.plan_id);
            return Err(ctx.reject(e, None).await);
        }
    };
    // The confirmation this plan needs: its token, or its operator's approval.
    match (plan.confirmation, claims) {
        (ConfirmationMode::Token, Some(claims)) => {
            if claims.payload_hash != plan.payload_hash {
                let e = ApiError::new(
                    Code::TokenInvalid,
                    "The confirmation token does not match the plan's payload; ask for a new plan.",
                );
                return Err(ctx.reject(e, Some(&plan)).await);
            }
        }
        // Absent is a confirmation that does not verify: whether a token is needed depends
        // on the plan, not on the shape of the request.
        (ConfirmationMode::Token, None) => {
            let e = ApiError::new(
                Code::TokenInvalid,
                "This plan is confirmed with its confirmation token; send the confirmation_token its plan returned.",
            )
            .with_field("/confirmation_token", "required for this plan");
            return Err(ctx.reject(e, Some(&plan)).await);
        }
        (ConfirmationMode::Operator, Some(_)) => {
            let e = ApiError::new(
                Code::TokenInvalid,
                "This plan is approved by the operator on Airlock's approval page, not with a token; execute it without confirmation_token once approved.",
            );
            return Err(ctx.reject(e, Some(&plan)).await);
        }
        (ConfirmationMode::Operator, None) => {
            if plan.requested_by != ctx.req.requested_by {
                let e = ApiError::new(
                    Code::OperatorMismatch,
                    format!(
                        "Plan {} was requested by operator {}; only its requester executes it.",
                        plan.plan_id, plan.requested_by
                    ),
                );
                return Err(ctx.reject(e, Some(&plan)).await);
            }
            if let Some(e) = approval_gate(&ctx.state.approval_origin, &plan, now) {
                return Err(match e.code {
                    // Asked again and again while the operator has not decided.
                    Code::ApprovalRequired => ctx.reject_once(e, &plan).await,
                    _ => ctx.reject(e, Some(&plan)).await,
                });
            }
        }
    }

    // 4. Decide, then commit atomically.
    let verdict = match decide(ctx, &plan, &snap.control, snap.rate, now).await? {
        Verdict::Accept { rate, reserve } => {
            match accept(ctx, &plan, &snap.control, rate, reserve, now).await? {
                Attempt::Done(outcome) => return Ok(Some(outcome)),
                Attempt::Retry => return Ok(None),
                // The exposure left no room under us: explain with the full re-check.
                Attempt::PositionMoved => {
                    match position_violation(st, &plan, &snap.control).await? {
                        Some(error) => Verdict::Reject { error, close: true },
                        None => return Ok(None),
                    }
                }
                Attempt::AccountInactive => Verdict::Reject {
                    error: account_inactive(st, &plan).await?,
                    close: true,
                },
            }
        }
        reject => reject,
    };
    match verdict {
        Verdict::Accept { .. } | Verdict::Again => Ok(None),
        Verdict::Reject { error, close } => {
            let owner = new_id("own", now);
            let commit = ExecuteCommit {
                key: key_record(
                    ctx,
                    now,
                    KeyState::Decided {
                        decision: Decision::Rejected {
                            code: error.code.as_str().into(),
                            message: error.message.clone(),
                            details: error.details.clone(),
                        },
                        owner: Some(owner.clone()),
                    },
                ),
                key_condition: KeyCondition::Absent,
                plan_change: close.then(|| {
                    (
                        plan.plan_id.clone(),
                        PlanChange::Close {
                            reason_code: error.code.as_str().into(),
                        },
                    )
                }),
                control_version: None,
                account_active: None,
                rate: None,
                reserve: None,
                action: None,
                enqueue_group: None,
                audit: ctx.audit_rejection(now, &error, Some(&plan)),
            };
            ctx.remember(&owner, None);
            match st.ledger.commit(&commit, now).await {
                Ok(CommitOutcome::Committed) => Err(error),
                Ok(CommitOutcome::Conflict(_)) => Ok(None),
                Err(e) => {
                    ctx.set_unsure(e.into());
                    Ok(None)
                }
            }
        }
    }
}

/// Verifies the confirmation token and its binding to this request (plan, requester,
/// service principal). A refusal is audited.
async fn verify_token(
    ctx: &Ctx<'_>,
    token: &str,
    now: Millis,
) -> Result<crate::core::token::ConfirmationClaims, ApiError> {
    let claims = match ctx
        .state
        .confirmations
        .verify(token, now.div_euclid(1000))
        .await
    {
        Ok(c) => c,
        Err(TokenFault::Expired(exp)) => {
            let e = ApiError::new(
                Code::TokenExpired,
                format!(
                    "The confirmation token expired at {}; ask for a new plan and confirm it again.",
                    human_time(exp * 1000)
                ),
            );
            return Err(ctx.reject(e, None).await);
        }
        Err(TokenFault::Invalid(why)) => {
            let e = ApiError::new(
                Code::TokenInvalid,
                format!("The confirmation token is not valid: {why}. Use the token returned by the plan."),
            );
            return Err(ctx.reject(e, None).await);
        }
        // The signer's public key could not be fetched (KMS unreachable).
        Err(TokenFault::Unavailable) => {
            return Err(ApiError::new(
                Code::UpstreamUnavailable,
                "The confirmation key is unavailable; retry shortly.",
            ))
        }
    };
    let bound = [
        (
            claims.plan_id == ctx.req.plan_id,
            "it was issued for another plan",
        ),
        (
            claims.requested_by == ctx.req.requested_by,
            "it was issued for another requester",
        ),
        (
            claims.sub == ctx.caller.service.sub,
            "it was issued to another service principal",
        ),
    ];
    if let Some((_, why)) = bound.iter().find(|(ok, _)| !ok) {
        let e = ApiError::new(
            Code::TokenInvalid,
            format!(
                "The confirmation token is not valid: {why}. Use the token returned by this plan."
            ),
        );
        return Err(ctx.reject(e, None).await);
    }
    Ok(claims)
}

/// An `operator`-mode plan executes only once its operator approved it on the approval
/// page. Before that the answer is 409 `approval_required`, which decides nothing: no key
/// is recorded and no rate is used, so the same execute succeeds after the approval. A
/// declined, expired, executed or closed plan is left to [`decide`], which records it.
fn approval_gate(origin: &str, plan: &PlanRecord, now: Millis) -> Option<ApiError> {
    if plan.awaits_approval(now) {
        let url = super::plan::approval_url(origin, &plan.plan_id);
        let mut e = ApiError::new(
            Code::ApprovalRequired,
            format!(
                "Plan {} waits for the operator's approval: open {} and approve it with your passkey, then execute again with the same idempotency key (before {}).",
                plan.plan_id,
                url,
                human_time(plan.expires_at)
            ),
        );
        let info = super::plan::ApprovalInfo {
            required: true,
            url,
            expires_at: rfc3339(plan.expires_at),
            four_eyes: plan.four_eyes,
            approved_by: plan.approvals.iter().map(|a| a.approver.clone()).collect(),
        };
        e.approval = serde_json::to_value(&info).ok().map(Box::new);
        return Some(e);
    }
    let not_matching = || {
        Some(ApiError::new(
            Code::PlanNotExecutable,
            "The approval on this plan does not match its payload; ask for a new plan.",
        ))
    };
    // An approval is bound to what was seen: the plan's payload hash, before expiry.
    let bound = |a: &crate::core::records::Approval| {
        a.decision == ApprovalDecision::Approved
            && a.payload_hash == plan.payload_hash
            && a.at < plan.expires_at
    };
    match &plan.approval {
        Some(a) if a.decision == ApprovalDecision::Approved && !bound(a) => not_matching(),
        // Four eyes: the requester's own approval and another operator's, both bound.
        Some(a) if a.decision == ApprovalDecision::Approved && plan.four_eyes => {
            let maker = plan
                .approvals
                .iter()
                .any(|a| a.approver == plan.requested_by && bound(a));
            let checker = plan
                .approvals
                .iter()
                .any(|a| a.approver != plan.requested_by && bound(a));
            if maker && checker {
                None
            } else {
                not_matching()
            }
        }
        _ => None,
    }
}

/// The key holds a decision this request committed: answer it. An accepted action is sent
/// now (the queue drops a second copy by its id, if the first send went through), unless
/// its commit queued it.
async fn own_decision(
    ctx: &Ctx<'_>,
    rec: &KeyRecord,
    action: Option<ActionRecord>,
    now: Millis,
) -> Result<Option<ExecuteOutcome>, ApiError> {
    let owner = rec.owner().unwrap_or_default();
    match (&rec.state, action) {
        (KeyState::Decided { decision, .. }, Some(action)) if accepted(decision).is_some() => {
            if action.enqueued_at.is_none() {
                send(&ctx.state.dispatch, rec, owner, &action, now).await?;
            }
            Ok(Some(ExecuteOutcome::Queued(accepted_action(&action))))
        }
        (
            KeyState::Decided {
                decision:
                    Decision::Rejected {
                        code,
                        message,
                        details,
                    },
                ..
            },
            _,
        ) => Err(replayed_rejection(code, message, details)),
        _ => Err(ApiError::internal(format!(
            "execute: this request's key record {} is in an unexpected state",
            rec.key
        ))),
    }
}

fn accepted_action(action: &ActionRecord) -> Accepted {
    Accepted {
        action_id: action.action_id.clone(),
        status: "queued",
        queue_target: action.queue_target,
        resource_refs: action.resource_refs.clone(),
        plan_id: action.plan_id.clone(),
    }
}

enum Verdict {
    Accept {
        rate: RateState,
        reserve: Option<Reservation>,
    },
    /// `close`: the plan is closed (kill switch, rollout mode, policy re-check).
    Reject { error: ApiError, close: bool },
    /// Held for room in the orders backlog, which there is now: read and decide again.
    Again,
}

fn reject(error: ApiError, close: bool) -> Result<Verdict, ApiError> {
    Ok(Verdict::Reject { error, close })
}

async fn decide(
    ctx: &Ctx<'_>,
    plan: &PlanRecord,
    control: &Control,
    mut rate: RateState,
    now: Millis,
) -> Result<Verdict, ApiError> {
    let st = ctx.state;
    match plan.status {
        PlanStatus::Executed => {
            return reject(
                ApiError::new(
                    Code::PlanAlreadyExecuted,
                    format!(
                        "This plan was already executed as action {}; check its status instead of executing again.",
                        plan.action_id.as_deref().unwrap_or("?")
                    ),
                ),
                false,
            )
        }
        PlanStatus::Closed
            if plan.closed_reason.as_deref() == Some(Code::PlanDeclined.as_str()) =>
        {
            return reject(
                ApiError::new(
                    Code::PlanDeclined,
                    format!(
                        "The operator declined this plan on the approval page ({}); it will not execute. Plan again if the trade is still wanted.",
                        plan.approval.as_ref().map(|a| a.approver.as_str()).unwrap_or("declined")
                    ),
                ),
                false,
            )
        }
        PlanStatus::Closed => {
            return reject(
                ApiError::new(
                    Code::PlanNotExecutable,
                    format!(
                        "This plan was closed when an execute was rejected ({}); ask for a new plan.",
                        plan.closed_reason.as_deref().unwrap_or("rejected")
                    ),
                ),
                false,
            )
        }
        PlanStatus::Planned => {}
    }
    if now >= plan.expires_at {
        return reject(
            ApiError::new(
                Code::PlanExpired,
                format!(
                    "The plan expired at {}; ask for a new plan.",
                    human_time(plan.expires_at)
                ),
            ),
            false,
        );
    }
    if !plan.executable {
        let failed: Vec<&str> = plan
            .risk_checks
            .iter()
            .filter(|c| c.failed())
            .map(|c| c.name.as_str())
            .collect();
        return reject(
            ApiError::new(
                Code::PlanNotExecutable,
                format!(
                    "The plan failed risk checks ({}); fix the request and plan again.",
                    failed.join(", ")
                ),
            ),
            false,
        );
    }
    if plan.action_type.is_order_submission() && !control.trade_execute_enabled {
        return reject(
            ApiError::new(
                Code::KillSwitchEngaged,
                "The kill switch is engaged: no orders can be submitted. This plan is now closed; plan again after the switch is released.",
            ),
            true,
        );
    }
    if !control.allows_execute(plan.action_type) {
        return reject(
            ApiError::new(
                Code::ActionDisabled,
                format!(
                    "{} is not enabled for execution (rollout mode {:?}). This plan is now closed.",
                    plan.action_type,
                    control.mode(plan.action_type)
                ),
            ),
            true,
        );
    }
    if let Some(why) = confirmation_short_of(plan, policy::in_force(&st.policy, control)) {
        return reject(
            ApiError::new(
                Code::PlanNotExecutable,
                format!("{why} This plan is now closed; ask for a new plan."),
            ),
            true,
        );
    }
    let mut reserve = None;
    if plan.action_type == ActionType::OrderSubmitCl {
        // Every check that can change since the plan, under the policy in force now; the
        // position ones (with open orders) as a condition of the commit, which also
        // reserves the order's contracts.
        let (order, contract) = plan_order(plan)?;
        let inputs = OrderInputs {
            policy: policy::in_force(&st.policy, control),
            calendar: ExchangeCalendar::cme(),
            now: st.clock.now(),
            account_id: &plan.account_id,
            order: &order,
            contract,
            exposure: Default::default(),
            reference: plan.reference_price,
        };
        let failed: Vec<RiskCheck> = policy::recheck_order_without_position(&inputs)
            .into_iter()
            .filter(RiskCheck::failed)
            .collect();
        if !failed.is_empty() {
            return reject(policy_violation(&failed), true);
        }
        reserve = Some(Reservation {
            side: order.side,
            bound: policy::reservation_bound(&inputs),
            delta: ExposureDelta::reserve(
                &plan.account_id,
                &order.symbol,
                order.side,
                order.quantity.get() as i64,
            ),
        });
    }
    // Admission: not a decision either. An order accepted behind a deep queue would reach
    // the broker seconds after the operator confirmed it; refuse it now instead.
    if plan.action_type.is_order_submission() && !ctx.placed.load(Ordering::Relaxed) {
        let queue = st.dispatch.queue.as_ref();
        if let Some(e) = st.backlog.refusal(queue, now).await {
            // Held for room while this request's wait lasts; then decided afresh (a new
            // round: the world may have moved while it waited).
            let until = ctx.backlog_wait_until(st.backlog.wait);
            if st.backlog.room_by(queue, &st.clock, until).await {
                ctx.waited.store(true, Ordering::Relaxed);
                ctx.placed.store(true, Ordering::Relaxed);
                return Ok(Verdict::Again);
            }
            return Err(ctx.reject(e, Some(plan)).await);
        }
    }
    // Rate limit: not a decision, so nothing is recorded and the key can be retried.
    rate.operator_id = ctx.caller.operator.sub.clone();
    let how = " with the same idempotency key";
    let operator = &ctx.caller.operator.sub;
    if let Some(e) =
        super::limits::rate_refusal(&rate, now, st.rate_per_minute, operator, "executes", how)
    {
        return Err(ctx.reject(e, Some(plan)).await);
    }
    Ok(Verdict::Accept { rate, reserve })
}

/// Why the confirmation this plan was given falls short of what the policy in force asks
/// now, if it does. The confirmation mode and the four-eyes rule are fixed on a plan when
/// it is made; a policy tightened since then (`airlock policy set`) must hold for the
/// plans already out, or an agent could still execute, for the rest of their lifetime,
/// plans confirmed the looser way. A plan confirmed more strictly than needed executes.
fn confirmation_short_of(plan: &PlanRecord, pol: &Policy) -> Option<String> {
    let a = plan.action_type;
    match plan.confirmation {
        ConfirmationMode::Token if pol.confirmation(a) == ConfirmationMode::Operator => {
            Some(format!(
                "The policy in force now has {a} approved by its operator on the approval page; this plan was confirmed with a token under an earlier policy."
            ))
        }
        ConfirmationMode::Operator if a == ActionType::OrderSubmitCl && !plan.four_eyes => {
            // The plan's notional as the plan measured it; a plan made without a four-eyes
            // threshold kept none: measured at its reference price, and without one (a
            // market order) the second person is the safe answer, as at plan time.
            let notional = plan.notional.or_else(|| {
                let (order, _) = plan_order(plan).ok()?;
                let price = plan.reference_price?;
                Some(super::plan::notional(order.quantity.get(), price))
            });
            pol.needs_four_eyes(notional).then(|| {
                "The policy in force now needs a second person's approval for an order of this size; this plan was approved by its requester alone under an earlier policy.".to_string()
            })
        }
        _ => None,
    }
}

/// The plan's order, as confirmed.
fn plan_order(plan: &PlanRecord) -> Result<(OrderSubmitCl, Option<ClContract>), ApiError> {
    let normalized = plan
        .normalized_payload
        .order()
        .ok_or_else(|| ApiError::internal(format!("plan {} holds no order", plan.plan_id)))?;
    let order = normalized.as_request().map_err(ApiError::internal)?;
    Ok((order, ClContract::parse(&normalized.terms.symbol).ok()))
}

fn policy_violation(failed: &[RiskCheck]) -> ApiError {
    let names: Vec<&str> = failed.iter().map(|c| c.name.as_str()).collect();
    ApiError::new(
        Code::PolicyViolation,
        format!(
            "A pre-trade check failed at execute ({}): {}. This plan is now closed; plan again when it can pass.",
            names.join(", "),
            failed.first().map(|c| c.reason.as_str()).unwrap_or("")
        ),
    )
    .with_details(
        failed
            .iter()
            .map(|c| crate::core::error::FieldError::new(format!("risk_checks/{}", c.name), c.reason.clone()))
            .collect(),
    )
}

/// The commit found the position outside the bounds: read it and run the full re-check
/// for a precise reason. `None`: it passes now (the position moved again); go again.
async fn position_violation(
    st: &Executor,
    plan: &PlanRecord,
    control: &Control,
) -> Result<Option<ApiError>, ApiError> {
    let (order, contract) = plan_order(plan)?;
    let exposure = order_inputs_exposure(st.positions.as_ref(), &plan.account_id, contract).await?;
    let inputs = OrderInputs {
        policy: policy::in_force(&st.policy, control),
        calendar: ExchangeCalendar::cme(),
        now: st.clock.now(),
        account_id: &plan.account_id,
        order: &order,
        contract,
        exposure,
        reference: plan.reference_price,
    };
    let failed: Vec<RiskCheck> = policy::recheck_order_at_execute(&inputs)
        .into_iter()
        .filter(RiskCheck::failed)
        .collect();
    Ok((!failed.is_empty()).then(|| policy_violation(&failed)))
}

/// The commit found the account no longer active: say what it is now.
async fn account_inactive(st: &Executor, plan: &PlanRecord) -> Result<ApiError, ApiError> {
    let status = match st.accounts.get_account(&plan.account_id).await? {
        Some(a) => a.status.to_string(),
        None => "gone".to_string(),
    };
    let check = RiskCheck::fail(
        "account_allowed",
        format!("account {} is {status}, not active", plan.account_id),
    );
    Ok(policy_violation(&[check]))
}

fn key_record(ctx: &Ctx<'_>, now: Millis, state: KeyState) -> KeyRecord {
    KeyRecord {
        principal: ctx.principal().to_string(),
        key: ctx.req.idempotency_key.as_str().to_string(),
        fingerprint: ctx.fingerprint.clone(),
        plan_id: ctx.req.plan_id.clone(),
        requested_by: ctx.req.requested_by.clone(),
        state,
        created_at: now,
        expires_at: now + REPLAY_WINDOW_MS,
    }
}

/// How an accept attempt ended.
enum Attempt {
    Done(ExecuteOutcome),
    /// Another request changed a condition; read and decide again.
    Retry,
    /// The exposure left no room for the order.
    PositionMoved,
    /// The account is no longer active.
    AccountInactive,
}

async fn accept(
    ctx: &Ctx<'_>,
    plan: &PlanRecord,
    control: &Control,
    rate: RateState,
    reserve: Option<Reservation>,
    now: Millis,
) -> Result<Attempt, ApiError> {
    let st = ctx.state;
    let action_id = new_id("act", now);
    let refs = match plan.action_type.queue_target() {
        QueueTarget::Orders => ResourceRefs {
            order_id: Some(match plan.action_type {
                // A cancel acts on an existing order.
                ActionType::OrderCancel => plan
                    .normalized_payload
                    .cancelled_order_id()
                    .unwrap_or_default()
                    .to_string(),
                _ => new_id("ord", now),
            }),
            job_id: None,
        },
        QueueTarget::Jobs => ResourceRefs {
            order_id: None,
            job_id: Some(new_id("job", now)),
        },
    };
    let plan_chat = |k: &str| {
        plan.chat_context
            .get(k)
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    let message = QueueMessage {
        schema: QUEUE_MESSAGE_SCHEMA.into(),
        action_id: action_id.clone(),
        plan_id: plan.plan_id.clone(),
        action_type: plan.action_type,
        normalized_payload: plan.normalized_payload.clone(),
        resource_refs: refs.clone(),
        requested_by: plan.requested_by.clone(),
        service_principal: plan.service_principal.clone(),
        enqueued_at: rfc3339(now),
        trace: Trace {
            request_id: ctx.facts.request_id.to_string(),
            // The execute's chat turn if it named one, else the plan's.
            chat_session_id: ctx
                .facts
                .chat
                .chat_session_id
                .clone()
                .or_else(|| plan_chat("chat_session_id")),
            tool_call_id: ctx
                .facts
                .chat
                .tool_call_id
                .clone()
                .or_else(|| plan_chat("tool_call_id")),
            apigw_request_id: crate::telemetry::gateway_ids().0,
            lambda_request_id: crate::telemetry::gateway_ids().1,
        },
    };
    let action = ActionRecord {
        action_id: action_id.clone(),
        plan_id: plan.plan_id.clone(),
        action_type: plan.action_type,
        status: ActionStatus::Queued,
        queue_target: plan.action_type.queue_target(),
        resource_refs: refs.clone(),
        account_id: plan.account_id.clone(),
        desk: plan.desk.clone(),
        requested_by: plan.requested_by.clone(),
        service_principal: plan.service_principal.clone(),
        idempotency_key: ctx.req.idempotency_key.as_str().to_string(),
        message,
        enqueued_at: None,
        created_at: now,
        updated_at: now,
        error: None,
    };
    // Where the ledger can, the commit queues the message itself (the embedded store's
    // outbox) and the action is stored sent; otherwise (SQS) it is sent after the commit.
    // Test-only: `execute.send_after_commit` takes the second path on the embedded store
    // too, so its commit-then-send window (the sweeper's work) is tested on both backends.
    let in_commit =
        st.ledger.queues_in_commit() && !crate::failpoint::hit("execute.send_after_commit");
    let mut action = action;
    if in_commit {
        action.enqueued_at = Some(now);
    }
    let owner = new_id("own", now);
    let mut audit = ctx.audit(now, "queued");
    audit.action_type = Some(plan.action_type);
    audit.action_id = Some(action_id.clone());
    audit.payload_hash = Some(plan.payload_hash.clone());
    audit.risk_checks = plan.risk_checks.clone();
    audit.policy_version = Some(plan.policy_version.clone());
    audit.order_id = refs.order_id.clone();
    audit.job_id = refs.job_id.clone();
    audit.chat_session_id = action.message.trace.chat_session_id.clone();
    audit.tool_call_id = action.message.trace.tool_call_id.clone();
    // Decided at the atomic step: nothing is written after the send.
    let key = key_record(
        ctx,
        now,
        KeyState::Decided {
            decision: Decision::Queued {
                action_id: action_id.clone(),
                plan_id: plan.plan_id.clone(),
                queue_target: action.queue_target,
                resource_refs: refs.clone(),
            },
            owner: Some(owner.clone()),
        },
    );
    let commit = ExecuteCommit {
        key: key.clone(),
        key_condition: KeyCondition::Absent,
        plan_change: Some((
            plan.plan_id.clone(),
            PlanChange::Execute {
                action_id: action_id.clone(),
            },
        )),
        control_version: Some(control.version),
        // Cancels and syncs reduce risk: they run on a suspended account too.
        account_active: plan
            .action_type
            .is_order_submission()
            .then(|| plan.account_id.clone()),
        rate: Some(rate.next(now, st.rate_per_minute)),
        reserve,
        action: Some(action.clone()),
        enqueue_group: in_commit.then(|| action.message.normalized_payload.message_group()),
        audit,
    };
    // Remembered before the commit: after a lost reply, the key found ours is this one.
    ctx.remember(&owner, Some(&action));
    let committed = match st.ledger.commit(&commit, now).await {
        // Test-only: the write happened but its reply was lost (the request cannot tell).
        Ok(CommitOutcome::Committed) if crate::failpoint::hit("execute.commit_reply_lost") => Err(
            crate::core::error::StoreError::Unavailable("failpoint execute.commit_reply_lost".into()),
        ),
        other => other,
    };
    match committed {
        Ok(CommitOutcome::Conflict(Conflict::Position)) => return Ok(Attempt::PositionMoved),
        Ok(CommitOutcome::Conflict(Conflict::Account)) => return Ok(Attempt::AccountInactive),
        Ok(CommitOutcome::Conflict(_)) => return Ok(Attempt::Retry),
        Err(e) => {
            // The write may have happened: read again; the key says whether it did.
            ctx.set_unsure(e.into());
            return Ok(Attempt::Retry);
        }
        Ok(CommitOutcome::Committed) => {}
    }
    if crate::failpoint::hit("execute.after_commit") {
        // Simulates a crash between the atomic step and the enqueue.
        tracing::error!(action_id = %action_id, "failpoint execute.after_commit: aborting");
        std::process::abort();
    }
    if !in_commit {
        send(&st.dispatch, &key, &owner, &action, now).await?;
    }
    if crate::failpoint::hit("execute.after_send") {
        // Simulates a crash after the send, before the caller hears the answer.
        tracing::error!(action_id = %action_id, "failpoint execute.after_send: aborting");
        std::process::abort();
    }
    Ok(Attempt::Done(ExecuteOutcome::Queued(accepted_action(
        &action,
    ))))
}

/// Sends an accepted action's stored message, deduplicated on its id.
pub(crate) async fn send_message(d: &Dispatch, action: &ActionRecord) -> Result<(), ApiError> {
    if crate::failpoint::hit("dispatch.send_fails") {
        return Err(ApiError::unavailable("failpoint dispatch.send_fails"));
    }
    Ok(d.queue
        .send(
            &action.message,
            &action.message.normalized_payload.message_group(),
            &action.action_id,
        )
        .await?)
}

/// Step 5: send the stored message of an action whose key `owner` holds. A send error
/// gives the key back at once (a claim by `owner` whose lease has ended), so the caller's
/// retry with the same key resumes and sends without waiting; if nobody retries, the
/// sweeper sends it. The caller gets 503 with the action's id and `Retry-After`.
pub(crate) async fn send(
    d: &Dispatch,
    key: &KeyRecord,
    owner: &str,
    action: &ActionRecord,
    now: Millis,
) -> Result<(), ApiError> {
    if let Err(e) = send_message(d, action).await {
        if let Err(release) = release_lease(d, key, owner, &action.action_id, now).await {
            tracing::warn!(error = %release, "could not give the key back after a failed send");
        }
        let mut err = ApiError::new(
            Code::UpstreamUnavailable,
            "The action was accepted but could not be queued yet. Retry with the same \
             idempotency key to queue it now; otherwise it is queued within a minute.",
        )
        .with_field(
            "/idempotency_key",
            "the action was accepted but not yet queued; retry with the same key",
        )
        .retry_after(1);
        err.cause = Some(format!(
            "enqueue {}: {}",
            action.action_id,
            e.cause.as_deref().unwrap_or(&e.message)
        ));
        err.action_id = Some(action.action_id.clone());
        return Err(err);
    }
    Ok(())
}

/// A retry or the sweeper holding the lease of a claimed key: send, then decide the key
/// (`queued`, this action) and mark the action sent, only while still holding it.
pub(crate) async fn send_and_finish(
    d: &Dispatch,
    key: &KeyRecord,
    lease_owner: &str,
    action: &ActionRecord,
    now: Millis,
) -> Result<bool, ApiError> {
    send(d, key, lease_owner, action, now).await?;
    mark_sent(d, key, lease_owner, action, now).await
}

/// The key decided as the atomic step decided it (`queued`, this action), and the action
/// marked sent, only while `lease_owner` holds the key.
pub(crate) async fn mark_sent(
    d: &Dispatch,
    key: &KeyRecord,
    lease_owner: &str,
    action: &ActionRecord,
    now: Millis,
) -> Result<bool, ApiError> {
    let mut decided = key.clone();
    decided.state = KeyState::Decided {
        decision: Decision::Queued {
            action_id: action.action_id.clone(),
            plan_id: action.plan_id.clone(),
            queue_target: action.queue_target,
            resource_refs: action.resource_refs.clone(),
        },
        owner: Some(lease_owner.to_string()),
    };
    Ok(d.ledger
        .mark_sent(&decided, lease_owner, &action.action_id, now)
        .await?)
}

/// Moves the lease of a claimed key to `new_owner` until `until`, only if its current
/// owner still holds it (a retry or the sweeper taking over an interrupted execute).
/// `false`: someone else holds it now, or it is decided.
pub(crate) async fn take_lease(
    d: &Dispatch,
    rec: &KeyRecord,
    new_owner: &str,
    until: Millis,
) -> Result<bool, ApiError> {
    let KeyState::Claimed {
        lease_owner,
        action_id,
        ..
    } = &rec.state
    else {
        return Ok(false);
    };
    let mut claim = rec.clone();
    claim.state = KeyState::Claimed {
        lease_owner: new_owner.to_string(),
        lease_until: until,
        action_id: action_id.clone(),
    };
    Ok(d.ledger.take_over(&claim, lease_owner).await?)
}

/// Gives the key of `action_id` back, only while `owner` holds it (its claim, or its
/// decision from the atomic step): a claim whose lease ends now, which whoever comes next
/// (the caller's retry, the sweeper) takes over at once to send the action.
async fn release_lease(
    d: &Dispatch,
    key: &KeyRecord,
    owner: &str,
    action_id: &str,
    now: Millis,
) -> Result<bool, ApiError> {
    let mut released = key.clone();
    released.state = KeyState::Claimed {
        lease_owner: owner.to_string(),
        lease_until: now,
        action_id: action_id.to_string(),
    };
    Ok(d.ledger.take_over(&released, owner).await?)
}

/// A key claimed by an attempt that never finished: take its lease and send.
async fn resume(
    st: &Executor,
    rec: &KeyRecord,
    action_id: &str,
    request_id: &str,
    now: Millis,
) -> Result<Option<ExecuteOutcome>, ApiError> {
    let new_owner = new_id("lease", now);
    if !take_lease(&st.dispatch, rec, &new_owner, now + st.lease_ms).await? {
        return Ok(None);
    }
    let action =
        st.actions.get_action(action_id).await?.ok_or_else(|| {
            ApiError::internal(format!("claimed action {action_id} has no record"))
        })?;
    send_and_finish(&st.dispatch, rec, &new_owner, &action, now).await?;
    let audit = resent_audit(
        &action,
        &rec.key,
        "a retry with the same idempotency key finished an interrupted execute",
        request_id.to_string(),
        now,
    );
    st.audit.append(&audit).await?;
    Ok(Some(ExecuteOutcome::Queued(accepted_action(&action))))
}

/// The audit record of an action sent late, by a retry or by the sweeper.
pub(crate) fn resent_audit(
    action: &ActionRecord,
    key: &str,
    reason: &str,
    request_id: String,
    now: Millis,
) -> AuditRecord {
    AuditRecord {
        audit_id: new_id("aud", now),
        at: now,
        event: "execute".into(),
        decision: "resent".into(),
        reason_code: None,
        reason: Some(reason.into()),
        action_type: Some(action.action_type),
        plan_id: Some(action.plan_id.clone()),
        action_id: Some(action.action_id.clone()),
        idempotency_key: Some(key.to_string()),
        operator_id: action.requested_by.clone(),
        service_principal: action.service_principal.clone(),
        payload_hash: None,
        risk_checks: Vec::new(),
        order_id: action.resource_refs.order_id.clone(),
        job_id: action.resource_refs.job_id.clone(),
        chat_session_id: action.message.trace.chat_session_id.clone(),
        tool_call_id: action.message.trace.tool_call_id.clone(),
        request_id,
        policy_version: None,
        approver: None,
        credential_id: None,
        user_verified: None,
        apigw_request_id: crate::telemetry::gateway_ids().0,
        lambda_request_id: crate::telemetry::gateway_ids().1,
    }
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
