//! Workers: turn queued actions into broker orders and jobs, and report status from their
//! own state, never inferred success. The same code runs in `airlock serve` (consuming the
//! embedded queue, or SQS with `--backend aws`) and in the `worker-orders` / `worker-jobs`
//! Lambdas (SQS events, partial batch failures).
//!
//! Exactly once towards the broker: the order record is created by a conditional write
//! keyed by the order id chosen at execute, already claimed for the broker (`submitted`)
//! before the last checks and the broker call, and the broker deduplicates on the client
//! order id (= order id), so a redelivered message, or one whose worker died after the
//! broker accepted the order, never becomes a second order. Every later step is
//! conditional on the state read.

pub mod consumer;
pub mod dead_letters;
pub mod sweeper;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tracing::Instrument;

use crate::core::auth::DeskScope;
use crate::core::clock::SharedClock;
use crate::core::domain::{
    ActionStatus, ActionType, Job, JobKind, JobStatus, Millis, Order, OrderStatus, Position,
};
use crate::core::error::ApiError;
use crate::core::policy::Policy;
use crate::core::ports::broker::Broker;
use crate::core::ports::broker::{BrokerOrder, BrokerStatus};
use crate::core::ports::{
    AccountStore, ActionStore, ControlStore, OrderStore, PositionStore, WorkerStore,
};
use crate::core::ports::{ActionMove, Page, PositionChange, PositionsReplacement, Stored};
use crate::core::records::{ActionRecord, QueueMessage, QUEUE_MESSAGE_SCHEMA};

const ROUNDS: usize = 16;

/// The statuses a worker settles an action from.
const UNSETTLED: [ActionStatus; 2] = [ActionStatus::Queued, ActionStatus::Processing];

/// How a handled message ended (the message is deleted either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// A business outcome, not an error: the broker rejected the order, nothing to cancel.
    Failed(String),
    /// Already handled by an earlier delivery.
    AlreadyDone,
    /// The message is not the stored action's (forged, or naming no action): nothing was
    /// done, and the message is deleted, since no redelivery can make it right.
    Refused(String),
}

/// A sync job's result: how many positions the broker reported, and which changed.
#[derive(Debug, serde::Serialize)]
struct SyncResult {
    positions: usize,
    changed: Vec<SyncChange>,
}

#[derive(Debug, serde::Serialize)]
struct SyncChange {
    symbol: String,
    before: i64,
    after: i64,
}

/// The workers' use case, built once per process (`app.rs`): what the in-process consumer
/// and the worker Lambdas call for each message.
#[derive(Clone)]
pub struct Worker {
    pub clock: SharedClock,
    /// The process's policy; a policy in the control record takes precedence.
    pub policy: Arc<Policy>,
    /// How long a received message stays hidden: an order claimed longer ago than this by a
    /// worker that never finished is taken to be abandoned.
    pub visibility_ms: u64,
    pub accounts: Arc<dyn AccountStore>,
    pub positions: Arc<dyn PositionStore>,
    pub orders: Arc<dyn OrderStore>,
    pub actions: Arc<dyn ActionStore>,
    pub control: Arc<dyn ControlStore>,
    /// The workers' conditional writes (orders, jobs, positions, action status).
    pub store: Arc<dyn WorkerStore>,
    pub broker: Arc<dyn Broker>,
}

impl Worker {
    /// Handles one message. `Err`: a fault (storage, broker, a malformed message, a
    /// panic); the message stays on the queue and is retried. `last_attempt`: no retry
    /// follows (the queue moves it to its dead-letter queue), so the action and job are
    /// settled with the error.
    ///
    /// A panic while handling fails this message only: it is caught here, for the
    /// in-process consumer and the Lambda alike, and becomes an error like any other fault.
    pub async fn handle(&self, body: &str, last_attempt: bool) -> Result<Outcome, ApiError> {
        handle(self, body, last_attempt).await
    }

    /// A message left unhandled because an earlier one of its group failed: on its last
    /// receive, its action is settled as failed, like a last attempt.
    pub async fn skipped(&self, body: &str, receive_count: u32) {
        skipped(self, body, receive_count).await
    }

    /// Re-checks every working order against the broker (after a price change); returns
    /// how many changed.
    pub async fn reconcile_working_orders(&self) -> Result<usize, ApiError> {
        reconcile_working_orders(self).await
    }

    fn policy_for<'a>(&'a self, control: &'a crate::core::records::Control) -> &'a Policy {
        crate::core::policy::in_force(&self.policy, control)
    }
}

async fn handle(st: &Worker, body: &str, last_attempt: bool) -> Result<Outcome, ApiError> {
    let result = handle_message(st, body, last_attempt).await;
    // `airlock_worker_messages_total{queue, outcome}`: `retried` is a fault (the message
    // stays on its queue), the others delete it.
    let queue = serde_json::from_str::<QueueMessage>(body)
        .map_or("unknown", |m| m.action_type.queue_target().short_name());
    let outcome = match &result {
        Ok(Outcome::Succeeded) => "succeeded",
        Ok(Outcome::Failed(_)) => "failed",
        Ok(Outcome::AlreadyDone) => "already_done",
        Ok(Outcome::Refused(_)) => "refused",
        Err(_) => "retried",
    };
    metrics::counter!(crate::metrics::WORKER_MESSAGES, "queue" => queue, "outcome" => outcome)
        .increment(1);
    result
}

async fn handle_message(st: &Worker, body: &str, last_attempt: bool) -> Result<Outcome, ApiError> {
    // The message's ids on every log line of its handling, the execute's among them: its
    // request id, API Gateway's and Lambda's (the message's `trace`).
    let v = serde_json::from_str::<serde_json::Value>(body).unwrap_or_default();
    let text = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or("");
    let span = tracing::info_span!(
        "record",
        action_id = text("/action_id"),
        request_id = text("/trace/request_id"),
        apigw_request_id = text("/trace/apigw_request_id"),
        lambda_request_id = text("/trace/lambda_request_id")
    );
    async move {
        let result = guarded(process(st, body)).await.unwrap_or_else(Err);
        match &result {
            Ok(o) => tracing::info!(outcome = ?o, "message handled"),
            Err(e) => {
                tracing::warn!(
                    code = e.code.as_str(),
                    cause = e.cause.as_deref().unwrap_or(&e.message),
                    last_attempt,
                    "message failed"
                );
                if last_attempt {
                    // Not settled here: the dead-letter sweep settles it (and tries again).
                    if let Err(p) = guarded(give_up(st, body, e)).await.and_then(|r| r) {
                        tracing::error!(
                            cause = p.cause.as_deref().unwrap_or(&p.message),
                            "giving up failed; the dead-letter sweep settles it"
                        );
                    }
                }
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// Runs `f`, turning a panic into an error (logged with its message).
async fn guarded<T>(f: impl std::future::Future<Output = T>) -> Result<T, ApiError> {
    AssertUnwindSafe(f).catch_unwind().await.map_err(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-text panic".into());
        tracing::error!(panic = %what, "the worker panicked handling a message");
        ApiError::internal(format!("the worker panicked handling this message: {what}"))
    })
}

fn bad_message(why: impl Into<String>) -> ApiError {
    let why = why.into();
    ApiError::internal(format!("malformed queue message: {why}")).with_field("message", why)
}

/// Which field of a received message differs from the stored one, if any. Only the
/// fields that say what to do and for whom count; the trace and the send time may differ.
fn mismatch(received: &QueueMessage, stored: &QueueMessage) -> Option<&'static str> {
    let fields = [
        ("action_id", received.action_id == stored.action_id),
        ("schema", received.schema == stored.schema),
        ("action_type", received.action_type == stored.action_type),
        (
            "normalized_payload",
            received.normalized_payload == stored.normalized_payload,
        ),
        (
            "resource_refs",
            received.resource_refs == stored.resource_refs,
        ),
        ("plan_id", received.plan_id == stored.plan_id),
        (
            "service_principal",
            received.service_principal == stored.service_principal,
        ),
        ("requested_by", received.requested_by == stored.requested_by),
    ];
    fields.iter().find(|(_, same)| !same).map(|(name, _)| *name)
}

/// The stored action a received message must be: `Err(reason)` when it is not (no such
/// action, or a field differs), and the worker must not act on it.
async fn stored_action(
    st: &Worker,
    received: &QueueMessage,
) -> Result<Result<ActionRecord, String>, ApiError> {
    let Some(action) = st.actions.get_action(&received.action_id).await? else {
        return Ok(Err(format!("no action {} is stored", received.action_id)));
    };
    Ok(match mismatch(received, &action.message) {
        Some(field) => Err(format!(
            "its {field} differs from the one stored for action {}",
            received.action_id
        )),
        None => Ok(action),
    })
}

fn refuse(action_id: &str, why: String) -> Outcome {
    tracing::error!(
        action_id = %action_id,
        reason = %why,
        "refused a queue message that is not the stored action's; deleted unhandled"
    );
    Outcome::Refused(format!("message refused: {why}"))
}

async fn process(st: &Worker, body: &str) -> Result<Outcome, ApiError> {
    let received: QueueMessage =
        serde_json::from_str(body).map_err(|e| bad_message(e.to_string()))?;
    if received.schema != QUEUE_MESSAGE_SCHEMA {
        return Err(bad_message(format!("unknown schema {}", received.schema)));
    }
    let action = match stored_action(st, &received).await? {
        Ok(action) => action,
        Err(why) => return Ok(refuse(&received.action_id, why)),
    };
    // From here on only the stored message counts: what was approved at execute.
    let msg = &action.message;
    if crate::failpoint::hit("worker.poison") && msg.trace.tool_call_id.as_deref() == Some("poison")
    {
        // Test-only: a message that fails every time it is handled.
        return Err(ApiError::internal(
            "failpoint worker.poison: this message cannot be handled",
        ));
    }
    if crate::failpoint::hit("worker.panic") && msg.trace.tool_call_id.as_deref() == Some("panic") {
        // Test-only: a message whose handling panics every time.
        panic!("failpoint worker.panic: this message panics");
    }
    if matches!(
        action.status,
        ActionStatus::Succeeded | ActionStatus::Failed
    ) {
        return Ok(Outcome::AlreadyDone);
    }
    let now = st.clock.now_ms();
    // The action moves to `processing`; an order submission's order is created, claimed
    // for the broker, beside it: two independent writes side by side (on SQLite the writer
    // commits them together).
    let processing = async {
        st.store
            .set_action_status(
                &msg.action_id,
                &[ActionStatus::Queued],
                ActionStatus::Processing,
                None,
                now,
            )
            .await
            .map_err(ApiError::from)
    };
    let claim = async {
        match msg.action_type {
            ActionType::OrderSubmitCl => claim_order(st, msg, now).await.map(Some),
            _ => Ok(None),
        }
    };
    let (_, claimed) = tokio::try_join!(processing, claim)?;
    if crate::failpoint::hit("worker.slow") && msg.trace.tool_call_id.as_deref() == Some("slow") {
        // Test-only: a message whose handling takes 6 s (a slow broker, say).
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    }
    // `settled`: the action was settled with the order's record, in the same write.
    let (outcome, settled) = match msg.action_type {
        ActionType::OrderSubmitCl => submit(st, msg, claimed).await?,
        ActionType::OrderCancel => (cancel(st, msg).await?, false),
        ActionType::PositionsSync => (sync(st, msg).await?, false),
    };
    let settled_at = st.clock.now_ms();
    if !settled {
        let m = settle(msg, &outcome, settled_at);
        st.store
            .set_action_status(m.action_id, m.from, m.to, m.error, m.at)
            .await?;
    }
    if msg.action_type == ActionType::OrderSubmitCl {
        // Accept (the execute) to the order's first terminal answer from this worker.
        metrics::histogram!(crate::metrics::ORDER_LATENCY)
            .record((settled_at - action.created_at).max(0) as f64 / 1000.0);
    }
    Ok(outcome)
}

/// The action's move to the status `outcome` gives it.
fn settle<'a>(msg: &'a QueueMessage, outcome: &'a Outcome, at: Millis) -> ActionMove<'a> {
    let (to, error) = match outcome {
        Outcome::Failed(why) => (ActionStatus::Failed, Some(why.as_str())),
        _ => (ActionStatus::Succeeded, None),
    };
    ActionMove {
        action_id: &msg.action_id,
        from: &UNSETTLED,
        to,
        error,
        at,
    }
}

/// A message left unhandled because an earlier one of its group failed. On its last
/// receive it goes to the dead-letter queue with that one, never having run: settle its
/// action as failed (which releases an order's reservation) like a last attempt.
async fn skipped(st: &Worker, body: &str, receive_count: u32) {
    if receive_count >= crate::core::records::MAX_RECEIVES {
        let e = ApiError::unavailable("an earlier message of its group kept failing");
        if let Err(err) = give_up(st, body, &e).await {
            tracing::error!(
                cause = err.cause.as_deref().unwrap_or(&err.message),
                "giving up a skipped message failed; the dead-letter sweep settles it"
            );
        }
    }
}

/// The last attempt failed (or its message is a dead letter): settle the stored action
/// (never one a mismatching message names) and its order or job, saying what is known. A
/// finished action is left alone. The action is settled last, after its order and job:
/// `Err` (a read or write failed, the broker could not be asked) leaves it unsettled, so the
/// dead-letter sweep, which looks at its dead letter again, does it all again.
async fn give_up(st: &Worker, body: &str, e: &ApiError) -> Result<(), ApiError> {
    let Ok(received) = serde_json::from_str::<QueueMessage>(body) else {
        return Ok(()); // Malformed: it names nothing we can trust.
    };
    let action = match stored_action(st, &received).await? {
        Ok(a) => a,
        Err(why) => {
            refuse(&received.action_id, why);
            return Ok(());
        }
    };
    if matches!(
        action.status,
        ActionStatus::Succeeded | ActionStatus::Failed
    ) {
        return Ok(());
    }
    let cause = e.cause.as_deref().unwrap_or(&e.message);
    let now = st.clock.now_ms();
    let (status, error) = match action.action_type {
        ActionType::OrderSubmitCl => give_up_order(st, &action, cause).await?,
        _ => (
            ActionStatus::Failed,
            Some(format!(
                "processing failed after repeated attempts: {cause}"
            )),
        ),
    };
    if let Some(job_id) = &action.resource_refs.job_id {
        let why = error
            .clone()
            .unwrap_or_else(|| format!("processing failed: {cause}"));
        fail_job(st, &action, job_id, &why, now).await?;
    }
    let from = [ActionStatus::Queued, ActionStatus::Processing];
    st.store
        .set_action_status(&action.action_id, &from, status, error.as_deref(), now)
        .await?;
    // `airlock_dead_letters_total{queue}`: messages that went (or, on a last attempt, are
    // going) to their dead-letter queue, whose action was settled as failed here.
    metrics::counter!(
        crate::metrics::DEAD_LETTERED,
        "queue" => action.queue_target.short_name()
    )
    .increment(1);
    Ok(())
}

/// The last attempt at an order submission failed: find out where the order is, so that
/// nothing is left open and nobody is told to resubmit a live order. An order the broker
/// never saw (no row, or still `queued`, or `submitted` but unknown to the broker) becomes
/// `rejected`; one the broker has is recorded as the broker says.
async fn give_up_order(
    st: &Worker,
    action: &ActionRecord,
    cause: &str,
) -> Result<(ActionStatus, Option<String>), ApiError> {
    let failed = |why: String| Ok((ActionStatus::Failed, Some(why)));
    let Some(order_id) = action.resource_refs.order_id.as_deref() else {
        return failed(format!(
            "processing failed after repeated attempts: {cause}"
        ));
    };
    let never_sent = format!(
        "processing failed after repeated attempts: {cause}; order {order_id} never reached \
         the broker and is rejected"
    );
    for _ in 0..ROUNDS {
        let now = st.clock.now_ms();
        let order = match st.orders.get_order(order_id).await? {
            Some(o) => o,
            None => st
                .store
                .create_order(&new_order(&action.message, now)?)
                .await?
                .into_inner(),
        };
        match order.status {
            OrderStatus::Queued => {
                if reject_unsent(st, &order, now).await? {
                    return failed(never_sent);
                }
            }
            OrderStatus::Submitted => {
                match st.broker.order(&order.terms.account_id, order_id).await? {
                    Some(ack) => {
                        record(st, &order, &ack, now, None).await?;
                    }
                    // Claimed moments ago: an earlier attempt may still be sending it. Keep
                    // its reservation and never say "resubmit".
                    None if !claim_abandoned(st, &order, now) => {
                        return failed(format!(
                            "processing failed after repeated attempts: {cause}; order \
                             {order_id} was claimed for the broker moments ago and may still \
                             reach it: do not resubmit; check its status or run positions.sync"
                        ));
                    }
                    None => {
                        if reject_unsent(st, &order, now).await? {
                            return failed(never_sent);
                        }
                    }
                }
            }
            OrderStatus::Rejected => {
                return failed(format!(
                "processing failed after repeated attempts: {cause}; order {order_id} is rejected"
            ))
            }
            OrderStatus::Cancelled => {
                return failed(format!("order {order_id} was cancelled without a fill"))
            }
            // At the broker (working or filled): the submission did what it was for.
            _ => return Ok((ActionStatus::Succeeded, None)),
        }
    }
    Err(ApiError::unavailable(format!(
        "order {order_id}: too many concurrent changes"
    )))
}

/// Marks a job failed (creating it if no delivery did); a job already finished is left.
async fn fail_job(
    st: &Worker,
    action: &ActionRecord,
    job_id: &str,
    error: &str,
    now: Millis,
) -> Result<(), ApiError> {
    let job = Job {
        job_id: job_id.into(),
        kind: JobKind::PositionsSync,
        status: JobStatus::Failed,
        account_id: Some(action.account_id.clone()),
        action_id: Some(action.action_id.clone()),
        created_at: now,
        updated_at: now,
        error: Some(error.to_string()),
        result: None,
    };
    let stored = st
        .store
        .create_job(&Job {
            status: JobStatus::Running,
            ..job.clone()
        })
        .await?;
    let failed = Job {
        created_at: stored.created_at,
        ..job
    };
    st.store
        .finish_job(
            &failed,
            &serde_json::Value::Object(Default::default()),
            None,
        )
        .await?;
    Ok(())
}

/// The kill switch, read before every order submission: `Some(error)` if it is engaged.
async fn kill_switch(st: &Worker, order_id: &str) -> Result<Option<String>, ApiError> {
    Ok(engaged(&st.control.get_control().await?, order_id))
}

/// `Some(error)` if `control` has the kill switch engaged.
fn engaged(control: &crate::core::records::Control, order_id: &str) -> Option<String> {
    if control.trade_execute_enabled {
        return None;
    }
    let reason = control
        .reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    Some(format!(
        "kill_switch_engaged: the kill switch was engaged{reason} before order {order_id} \
         reached the broker; it was not sent"
    ))
}

/// The worker's last check before an order goes to the broker, made after its claim: the
/// kill switch, the account's status and the market rules, then the position limit
/// against the worst case with open orders (this order's own contracts were reserved at
/// execute), under the policy in force now. A kill switch engaged, a policy lowered, or a
/// sync that raised the position, since execute stops the order here. `Some(error)`: do
/// not send it.
async fn pre_broker_gate(st: &Worker, order: &Order) -> Result<Option<String>, ApiError> {
    // Its three reads side by side: one of the control record for both the kill switch
    // and the policy in force, the exposure, the account.
    let account_id = &order.terms.account_id;
    let (control, exposure, account) = tokio::try_join!(
        st.control.get_control(),
        st.positions.get_exposure(account_id, &order.terms.symbol),
        st.accounts.get_account(account_id),
    )?;
    if let Some(why) = engaged(&control, &order.order_id) {
        return Ok(Some(why));
    }
    let request = crate::core::domain::OrderSubmitCl {
        account_id: crate::core::domain::Ident::parse(&order.terms.account_id).map_err(bad_message)?,
        symbol: order.terms.symbol.clone(),
        side: order.terms.side,
        quantity: crate::core::domain::Quantity::new(order.terms.quantity as i64).map_err(bad_message)?,
        order_type: order.terms.order_type,
        limit_price: order.terms.limit_price,
        stop_price: order.terms.stop_price,
        time_in_force: order.terms.time_in_force,
    };
    let inputs = crate::core::policy::OrderInputs {
        policy: st.policy_for(&control),
        calendar: crate::core::domain::calendar::ExchangeCalendar::cme(),
        now: st.clock.now(),
        account_id: &order.terms.account_id,
        order: &request,
        contract: crate::core::domain::cl::ClContract::parse(&order.terms.symbol).ok(),
        exposure,
        reference: None,
    };
    if let Some(a) = account.filter(|a| a.status != crate::core::domain::AccountStatus::Active) {
        return Ok(Some(format!(
            "policy_violation: account_allowed: account {} is {}; order {} was not sent to the broker",
            a.account_id, a.status, order.order_id
        )));
    }
    if let Some(c) = crate::core::policy::recheck_at_worker(&inputs)
        .into_iter()
        .find(crate::core::records::RiskCheck::failed)
    {
        return Ok(Some(format!(
            "policy_violation: {}: {}; order {} was not sent to the broker",
            c.name, c.reason, order.order_id
        )));
    }
    Ok(crate::core::policy::position_gate(&inputs).err().map(|why| {
        format!(
            "policy_violation: position_limit: {why}; order {} was not sent to the broker",
            order.order_id
        )
    }))
}

/// Whether a `submitted` order's claim is old enough that no delivery can still be
/// between the claim and the broker call: longer than a message stays hidden while it is
/// handled. A younger claim the broker does not know yet may still reach it, so it is not
/// refused (that would release its reservation while the order goes live).
fn claim_abandoned(st: &Worker, order: &Order, now: Millis) -> bool {
    now - order.updated_at > st.visibility_ms as i64
}

/// Moves an order the broker never saw to `rejected` (releasing what it reserved).
/// `false`: it moved under us; read it again.
async fn reject_unsent(st: &Worker, order: &Order, now: Millis) -> Result<bool, ApiError> {
    let next = Order {
        status: OrderStatus::Rejected,
        updated_at: now.max(order.updated_at),
        ..order.clone()
    };
    Ok(st.store.advance_order(order, &next, None, None).await?)
}

/// The order a submission's stored message describes, as first recorded (`queued`).
fn new_order(msg: &QueueMessage, now: Millis) -> Result<Order, ApiError> {
    let order_id = msg
        .resource_refs
        .order_id
        .clone()
        .ok_or_else(|| bad_message("no order_id"))?;
    let n = msg
        .normalized_payload
        .order()
        .ok_or_else(|| bad_message("an order submission without an order"))?;
    Ok(Order {
        order_id,
        terms: n.terms.clone(),
        status: OrderStatus::Queued,
        filled_quantity: 0,
        avg_fill_price: None,
        action_id: Some(msg.action_id.clone()),
        created_at: now,
        updated_at: now,
    })
}

/// An order submission the sweeper will not send because the kill switch is engaged:
/// its order is recorded `rejected` (so what execute reserved is released) and the
/// error to fail the action with is returned. `None`: the switch is not engaged.
pub(crate) async fn refuse_unsent_submission(
    st: &Worker,
    action: &ActionRecord,
) -> Result<Option<String>, ApiError> {
    let Some(order_id) = action.resource_refs.order_id.as_deref() else {
        return Ok(None);
    };
    let Some(why) = kill_switch(st, order_id).await? else {
        return Ok(None);
    };
    Ok(reject_unsent_order(st, action).await?.then_some(why))
}

/// Records an unsent order submission's order `rejected` (releasing what execute
/// reserved). `true`: it is rejected (now or before); `false`: a worker has it already (a
/// redelivery), so it was sent after all and the worker's own gates decide. An action
/// that is not an order submission has no order: `true`.
pub(crate) async fn reject_unsent_order(
    st: &Worker,
    action: &ActionRecord,
) -> Result<bool, ApiError> {
    let Some(order_id) = action.resource_refs.order_id.as_deref() else {
        return Ok(true);
    };
    if !action.action_type.is_order_submission() {
        return Ok(true);
    }
    for _ in 0..ROUNDS {
        let now = st.clock.now_ms();
        let unsent = Order {
            status: OrderStatus::Rejected,
            ..new_order(&action.message, now)?
        };
        // Never delivered: the order is created rejected, releasing the reservation.
        let order = match st.store.create_order(&unsent).await? {
            Stored::Created(_) => return Ok(true),
            Stored::Found(order) => order,
        };
        match order.status {
            OrderStatus::Queued => {
                if reject_unsent(st, &order, now).await? {
                    return Ok(true);
                }
            }
            OrderStatus::Rejected => return Ok(true),
            _ => return Ok(false),
        }
    }
    Err(ApiError::unavailable(format!(
        "order {order_id}: too many concurrent changes"
    )))
}

fn order_status(s: BrokerStatus) -> OrderStatus {
    match s {
        BrokerStatus::Working => OrderStatus::Working,
        BrokerStatus::PartiallyFilled => OrderStatus::PartiallyFilled,
        BrokerStatus::Filled => OrderStatus::Filled,
        BrokerStatus::Cancelled => OrderStatus::Cancelled,
        BrokerStatus::Rejected => OrderStatus::Rejected,
    }
}

fn to_broker(o: &Order) -> BrokerOrder {
    BrokerOrder {
        client_order_id: o.order_id.clone(),
        terms: o.terms.clone(),
        status: BrokerStatus::Working,
        filled_quantity: 0,
        avg_fill_price: None,
        reason: None,
        triggered: false,
    }
}

/// The order as [`record`] writes it after the broker's answer `ack`.
fn recorded(order: &Order, ack: &BrokerOrder, now: Millis) -> Order {
    let mut next = order.clone();
    next.status = order_status(ack.status);
    next.filled_quantity = ack.filled_quantity;
    next.avg_fill_price = ack.avg_fill_price;
    next.updated_at = now.max(order.updated_at);
    next
}

/// What a submission's order in `status` says of its action once the broker has answered
/// (`reason`: the broker's, for a rejection); `None` before.
fn submission_outcome(
    order_id: &str,
    status: OrderStatus,
    reason: Option<&str>,
) -> Option<Outcome> {
    match status {
        OrderStatus::Queued | OrderStatus::Submitted => None,
        OrderStatus::Rejected => Some(Outcome::Failed(broker_rejected(order_id, reason))),
        OrderStatus::Cancelled => Some(Outcome::Failed(format!(
            "order {order_id} was cancelled without a fill"
        ))),
        OrderStatus::Working | OrderStatus::PartiallyFilled | OrderStatus::Filled => {
            Some(Outcome::Succeeded)
        }
    }
}

fn broker_rejected(order_id: &str, reason: Option<&str>) -> String {
    format!(
        "the broker rejected order {order_id}: {}",
        reason.unwrap_or("rejected by the broker")
    )
}

/// Records what the broker says of an order: its new state, for a new fill the position
/// change, and with `settles` the move of the action it settles, in one write.
/// `Ok(false)`: the order, the position or the action moved under us; read again.
async fn record(
    st: &Worker,
    order: &Order,
    ack: &BrokerOrder,
    now: Millis,
    settles: Option<&ActionMove<'_>>,
) -> Result<bool, ApiError> {
    let next = recorded(order, ack, now);
    let new_fill = ack.filled_quantity.saturating_sub(order.filled_quantity);
    let change = match (new_fill, ack.avg_fill_price) {
        (q, Some(price)) if q > 0 => {
            let current = st
                .positions
                .get_position(&order.terms.account_id, &order.terms.symbol)
                .await?;
            let (qty, avg) = current
                .as_ref()
                .map(|p| (p.quantity, p.avg_price))
                .unwrap_or((0, None));
            let (after, avg_after) =
                crate::core::domain::fills::apply_fill(qty, avg, order.terms.side, q, price);
            Some(PositionChange {
                expected: current.map(|p| p.quantity),
                new: Position {
                    account_id: order.terms.account_id.clone(),
                    symbol: order.terms.symbol.clone(),
                    quantity: after,
                    avg_price: avg_after,
                    updated_at: now,
                },
            })
        }
        // A fill must move the position and the exposure together: without a price the
        // position cannot be written, so the step is not recorded (retried, then settled).
        (q, None) if q > 0 => {
            return Err(ApiError::unavailable(format!(
                "the broker reported a fill of {q} on order {} without a price",
                order.order_id
            )))
        }
        _ => None,
    };
    if next == *order && change.is_none() && settles.is_none() {
        return Ok(true);
    }
    Ok(st
        .store
        .advance_order(order, &next, change.as_ref(), settles)
        .await?)
}

async fn reload(st: &Worker, order_id: &str) -> Result<Order, ApiError> {
    st.orders
        .get_order(order_id)
        .await?
        .ok_or_else(|| ApiError::internal(format!("order {order_id} vanished")))
}

/// Creates a submission's order claimed for the broker (`submitted`) in one write, or
/// finds the one an earlier delivery created. The gate runs after the claim, as the last
/// step before the broker.
async fn claim_order(
    st: &Worker,
    msg: &QueueMessage,
    now: Millis,
) -> Result<Stored<Order>, ApiError> {
    let claim = Order {
        status: OrderStatus::Submitted,
        ..new_order(msg, now)?
    };
    Ok(st.store.create_order(&claim).await?)
}

/// `claimed`: the order as [`claim_order`] created or found it (made beside the action's
/// move to `processing`). The answer's `bool`: the action was settled with the order's
/// record (when this delivery's broker answer decided it).
async fn submit(
    st: &Worker,
    msg: &QueueMessage,
    claimed: Option<Stored<Order>>,
) -> Result<(Outcome, bool), ApiError> {
    let unsettled = |o: Outcome| Ok((o, false));
    let claimed = match claimed {
        Some(c) => c,
        None => claim_order(st, msg, st.clock.now_ms()).await?,
    };
    // Whether this delivery made the claim (then nobody else can be sending the order),
    // and whether it sent the order to the broker.
    let (mut order, mut claimed_here) = match claimed {
        Stored::Created(order) => (order, true),
        Stored::Found(order) => (order, false),
    };
    let order_id = order.order_id.clone();
    let mut sent_here = false;
    // Whether to settle the action with the order's record; not after that write failed
    // (the order or the action moved under us: record alone, settle after).
    let mut settle_here = true;
    for _ in 0..ROUNDS {
        let now = st.clock.now_ms();
        match order.status {
            // Created by a path that does not claim (a last attempt's or the sweeper's,
            // which reject it at once): claim it; the gate follows.
            OrderStatus::Queued => {
                let next = Order {
                    status: OrderStatus::Submitted,
                    updated_at: now.max(order.updated_at),
                    ..order.clone()
                };
                claimed_here = st.store.advance_order(&order, &next, None, None).await?;
                if claimed_here {
                    // Our write is the order's state now: no need to read it back.
                    order = next;
                    continue;
                }
            }
            OrderStatus::Submitted => match pre_broker_gate(st, &order).await? {
                // Claimed by this delivery and not sent: the broker cannot have it.
                Some(why) if claimed_here && !sent_here => {
                    if reject_unsent(st, &order, now).await? {
                        return unsettled(Outcome::Failed(why));
                    }
                }
                // Claimed by an earlier delivery (or sent): the broker may have it already.
                Some(why) => match st.broker.order(&order.terms.account_id, &order_id).await? {
                    Some(ack) => {
                        record(st, &order, &ack, now, None).await?;
                    }
                    // Claimed moments ago: an earlier delivery may still be sending it.
                    None if !claimed_here && !claim_abandoned(st, &order, now) => {
                        return Err(ApiError::unavailable(format!(
                            "order {order_id} was claimed for the broker moments ago; \
                             re-checking before it is refused"
                        )));
                    }
                    None => {
                        if reject_unsent(st, &order, now).await? {
                            return unsettled(Outcome::Failed(why));
                        }
                    }
                },
                None => {
                    if crate::failpoint::hit("worker.before_broker") {
                        // Test-only: the worker dies between its claim and the broker (on
                        // every receive: a message whose last receive never finishes).
                        tracing::error!(order_id = %order_id, "failpoint worker.before_broker: aborting");
                        std::process::abort();
                    }
                    // The broker deduplicates on the client order id: a resend is not a new
                    // order.
                    sent_here = true;
                    let ack = st.broker.submit(&to_broker(&order)).await?;
                    if crate::failpoint::hit("worker.after_broker") {
                        // Test-only: the worker dies after the broker accepted the order.
                        tracing::error!(order_id = %order_id, "failpoint worker.after_broker: aborting");
                        std::process::abort();
                    }
                    if crate::failpoint::hit("worker.record_fails")
                        && msg.trace.tool_call_id.as_deref() == Some("record-fails")
                    {
                        // Test-only: the broker accepted the order, recording it fails.
                        return Err(ApiError::unavailable(
                            "failpoint worker.record_fails: the order's record was not written",
                        ));
                    }
                    // The broker's answer decides the action: it settles with the order's
                    // record, one write instead of two, both at the answer's time.
                    let now = st.clock.now_ms().max(now);
                    let next = recorded(&order, &ack, now);
                    let outcome = submission_outcome(&order_id, next.status, ack.reason.as_deref())
                        .filter(|_| settle_here);
                    let settles = outcome.as_ref().map(|o| settle(msg, o, now));
                    if record(st, &order, &ack, now, settles.as_ref()).await? {
                        if crate::failpoint::hit("worker.after_record") {
                            // Test-only: the worker dies right after the order's record.
                            tracing::error!(order_id = %order_id, "failpoint worker.after_record: aborting");
                            std::process::abort();
                        }
                        if let Some(o) = outcome {
                            return Ok((o, true));
                        }
                        // Our write is the order's state now: no need to read it back.
                        order = next;
                        continue;
                    }
                    settle_here = false;
                }
            },
            OrderStatus::Rejected => return unsettled(rejected(st, &order).await?),
            status => {
                if let Some(o) = submission_outcome(&order_id, status, None) {
                    return unsettled(o);
                }
            }
        }
        order = reload(st, &order_id).await?;
    }
    Err(ApiError::unavailable(format!(
        "order {order_id}: too many concurrent changes"
    )))
}

/// Why a rejected order was rejected: the broker's reason, or, for an order the broker
/// never saw, the kill switch or the last attempt that gave up on it.
async fn rejected(st: &Worker, order: &Order) -> Result<Outcome, ApiError> {
    let order_id = &order.order_id;
    let why = match st.broker.order(&order.terms.account_id, order_id).await? {
        Some(o) => broker_rejected(order_id, o.reason.as_deref()),
        None => match kill_switch(st, order_id).await? {
            Some(why) => why,
            None => format!("order {order_id} was rejected before it reached the broker"),
        },
    };
    Ok(Outcome::Failed(why))
}

async fn cancel(st: &Worker, msg: &QueueMessage) -> Result<Outcome, ApiError> {
    let order_id = msg
        .resource_refs
        .order_id
        .clone()
        .ok_or_else(|| bad_message("no order_id"))?;
    for _ in 0..ROUNDS {
        let Some(order) = st.orders.get_order(&order_id).await? else {
            return Ok(Outcome::Failed(format!("there is no order {order_id}")));
        };
        if order.status == OrderStatus::Cancelled {
            return Ok(Outcome::Succeeded);
        }
        if !order.status.is_cancellable() {
            return Ok(Outcome::Failed(format!(
                "order {order_id} is {} and can no longer be cancelled",
                order.status
            )));
        }
        let now = st.clock.now_ms();
        match st.broker.cancel(&order.terms.account_id, &order_id).await? {
            Some(ack) => {
                record(st, &order, &ack, now, None).await?;
            }
            None if order.status == OrderStatus::Submitted => {
                // Claimed for sending but unknown to the broker: its submission may be on
                // its way (cancels travel apart from submissions). Cancelling it here could
                // leave a live order behind a `cancelled` record: retry until it settles.
                return Err(ApiError::unavailable(format!(
                    "order {order_id} is being sent to the broker; the cancel will be retried"
                )));
            }
            None => {
                // Never reached the broker (still queued: its claim is conditional, so it
                // will not be sent now): cancel it here.
                let next = Order {
                    status: OrderStatus::Cancelled,
                    updated_at: now.max(order.updated_at),
                    ..order.clone()
                };
                st.store.advance_order(&order, &next, None, None).await?;
            }
        }
    }
    Err(ApiError::unavailable(format!(
        "order {order_id}: too many concurrent changes"
    )))
}

async fn sync(st: &Worker, msg: &QueueMessage) -> Result<Outcome, ApiError> {
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
    let rows: Vec<Position> = broker
        .iter()
        .filter(|p| p.quantity != 0)
        .map(|p| Position {
            account_id: account.clone(),
            symbol: p.symbol.clone(),
            quantity: p.quantity,
            avg_price: p.avg_price,
            updated_at: now,
        })
        .collect();
    let result = serde_json::to_value(SyncResult {
        positions: rows.len(),
        changed,
    })
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

/// Orders the broker may have filled since we last recorded them.
const AT_THE_BROKER: &[OrderStatus] = &[
    OrderStatus::Submitted,
    OrderStatus::Working,
    OrderStatus::PartiallyFilled,
];

/// Asks the broker about one order and records what moved. `true` if it recorded a change.
async fn reconcile_order(st: &Worker, order: &Order) -> Result<bool, ApiError> {
    let Some(ack) = st
        .broker
        .order(&order.terms.account_id, &order.order_id)
        .await?
    else {
        return Ok(false);
    };
    let moved =
        order_status(ack.status) != order.status || ack.filled_quantity != order.filled_quantity;
    Ok(moved && record(st, order, &ack, st.clock.now_ms(), None).await?)
}

/// Asks the broker about every working order (after a price change) and records fills.
async fn reconcile_working_orders(st: &Worker) -> Result<usize, ApiError> {
    reconcile_orders(
        st,
        None,
        &[OrderStatus::Working, OrderStatus::PartiallyFilled],
    )
    .await
}

/// Asks the broker about the orders in `statuses` (of one account, or all) and records
/// what moved. Returns how many changed.
async fn reconcile_orders(
    st: &Worker,
    account: Option<&str>,
    statuses: &[OrderStatus],
) -> Result<usize, ApiError> {
    let mut updated = 0;
    for listed in st.orders.list_at_the_broker(account).await? {
        if !statuses.contains(&listed.status) {
            continue;
        }
        // The listing may lag (an index on DynamoDB): act on the order as it is now.
        let Some(order) = st.orders.get_order(&listed.order_id).await? else {
            continue;
        };
        if statuses.contains(&order.status) && reconcile_order(st, &order).await? {
            updated += 1;
        }
    }
    Ok(updated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::domain::payload::NormalizedPayload;
    use serde_json::json;

    fn message() -> QueueMessage {
        serde_json::from_value(json!({
            "schema": QUEUE_MESSAGE_SCHEMA, "action_id": "act-1", "plan_id": "plan-1",
            "action_type": "order.submit.cl",
            "normalized_payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "buy",
                                   "quantity": 1, "order_type": "market", "time_in_force": "day"},
            "resource_refs": {"order_id": "ord-1"}, "requested_by": "op-1",
            "service_principal": "svc", "enqueued_at": "2026-11-23T15:00:00Z",
            "trace": {"request_id": "req-1", "chat_session_id": null, "tool_call_id": null}
        }))
        .unwrap()
    }

    #[test]
    fn a_message_must_be_the_stored_one_in_every_field_that_acts() {
        let stored = message();
        let mut same = stored.clone();
        same.trace.request_id = "req-2".into();
        same.enqueued_at = "2026-11-23T15:01:00Z".into();
        assert_eq!(
            mismatch(&same, &stored),
            None,
            "trace and send time may differ"
        );
        type Forge = fn(&mut QueueMessage);
        let forged: [(&str, Forge); 7] = [
            ("normalized_payload", |m| {
                if let NormalizedPayload::OrderSubmitCl(o) = &mut m.normalized_payload {
                    o.terms.quantity = 7
                }
            }),
            ("normalized_payload", |m| {
                if let NormalizedPayload::OrderSubmitCl(o) = &mut m.normalized_payload {
                    o.terms.account_id = "ACC-2".into()
                }
            }),
            ("resource_refs", |m| {
                m.resource_refs.order_id = Some("ord-2".into())
            }),
            ("action_type", |m| m.action_type = ActionType::OrderCancel),
            ("plan_id", |m| m.plan_id = "plan-2".into()),
            ("service_principal", |m| {
                m.service_principal = "other".into()
            }),
            ("requested_by", |m| m.requested_by = "op-2".into()),
        ];
        for (field, change) in forged {
            let mut m = stored.clone();
            change(&mut m);
            assert_eq!(mismatch(&m, &stored), Some(field));
        }
    }

    #[test]
    fn submissions_group_by_account_and_contract_and_cancels_have_their_own_group() {
        let group = |v: serde_json::Value| {
            serde_json::from_value::<NormalizedPayload>(v)
                .unwrap()
                .message_group()
        };
        assert_eq!(message().normalized_payload.message_group(), "ACC-1#CLF27");
        assert_eq!(
            group(json!({"account_id": "ACC-1", "order_id": "ord-1"})),
            "ACC-1#cancel"
        );
        assert_eq!(group(json!({"account_id": "ACC-1"})), "ACC-1");
    }
}
