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
mod gates;
mod give_up;
mod orders;
mod reconcile;
mod step;
pub mod sweeper;
mod sync;

pub(crate) use gates::*;
pub(crate) use give_up::*;
pub(crate) use orders::*;
use reconcile::*;
use step::*;
pub(crate) use sync::*;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tracing::Instrument;

use crate::core::auth::DeskScope;
use crate::core::clock::SharedClock;
use crate::core::domain::{
    ActionStatus, Job, JobKind, JobStatus, Millis, Order, OrderStatus, Position,
};
use crate::core::error::ApiError;
use crate::core::policy::Policy;
use crate::core::ports::broker::Broker;
use crate::core::ports::broker::{BrokerOrder, BrokerStatus};
use crate::core::ports::{
    AccountStore, ActionStore, ControlStore, OrderStore, PositionStore, WorkerStore,
};
use crate::core::ports::{ActionMove, Page, PositionChange, PositionsReplacement, Stored};
use crate::core::records::{ActionRecord, QueueMessage};

pub(crate) const ROUNDS: usize = 16;

/// The statuses a worker settles an action from.
pub(crate) const UNSETTLED: [ActionStatus; 2] = [ActionStatus::Queued, ActionStatus::Processing];

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
    /// Reference prices: an order is banded against the price read just before the broker.
    pub prices: Arc<dyn crate::core::ports::Prices>,
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
        let st = self;
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

    /// A message left unhandled because an earlier one of its group failed: on its last
    /// receive, its action is settled as failed, like a last attempt.
    pub async fn skipped(&self, body: &str, receive_count: u32) {
        if receive_count >= crate::core::records::MAX_RECEIVES {
            let e = ApiError::unavailable("an earlier message of its group kept failing");
            if let Err(err) = give_up(self, body, &e).await {
                tracing::error!(
                    cause = err.cause.as_deref().unwrap_or(&err.message),
                    "giving up a skipped message failed; the dead-letter sweep settles it"
                );
            }
        }
    }

    /// Re-checks every working order against the broker (after a price change); returns
    /// how many changed.
    pub async fn reconcile_working_orders(&self) -> Result<usize, ApiError> {
        reconcile_orders(
            self,
            None,
            &[OrderStatus::Working, OrderStatus::PartiallyFilled],
        )
        .await
    }

    fn policy_for<'a>(&'a self, control: &'a crate::core::records::Control) -> &'a Policy {
        crate::core::policy::in_force(&self.policy, control)
    }
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

pub(crate) fn bad_message(why: impl Into<String>) -> ApiError {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::domain::payload::NormalizedPayload;
    use crate::core::domain::ActionType;
    use crate::core::records::QUEUE_MESSAGE_SCHEMA;
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
