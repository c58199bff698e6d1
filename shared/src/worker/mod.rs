//! Workers: turn queued actions into broker orders and jobs, and report status from their
//! own state, never inferred success. The same code runs in `airlock serve` (consuming the
//! embedded queue, or SQS with `--backend aws`) and in the `worker-orders` / `worker-jobs`
//! Lambdas (SQS events, partial batch failures).
//!
//! Exactly once towards the broker: the order record is created by a conditional write
//! keyed by the order id chosen at execute; `queued -> submitted` is claimed before the
//! broker call, and the broker deduplicates on the client order id (= order id), so a
//! redelivered message, or one whose worker died after the broker accepted the order,
//! never becomes a second order. Every later step is conditional on the state read.

pub mod broker;
pub mod consumer;
pub mod lambda;
pub mod paper;

use serde_json::json;

use crate::app::AppState;
use crate::auth::DeskScope;
use crate::domain::{
    ActionStatus, ActionType, Job, JobKind, JobStatus, Millis, Order, OrderStatus, Position,
};
use crate::error::ApiError;
use crate::ports::{Page, PositionChange};
use crate::protocol::plan::NormalizedOrder;
use crate::records::{QueueMessage, QUEUE_MESSAGE_SCHEMA};
use broker::{BrokerOrder, BrokerStatus};

const ROUNDS: usize = 16;

/// How a handled message ended (the message is deleted either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// A business outcome, not an error: the broker rejected the order, nothing to cancel.
    Failed(String),
    /// Already handled by an earlier delivery.
    AlreadyDone,
}

/// Handles one message. `Err`: a fault (storage, broker, a malformed message); the message
/// stays on the queue and is retried. `last_attempt`: no retry follows (the queue moves it
/// to its dead-letter queue), so the action and job are marked failed with the error.
pub async fn handle(st: &AppState, body: &str, last_attempt: bool) -> Result<Outcome, ApiError> {
    let ids = serde_json::from_str::<serde_json::Value>(body).ok();
    let action_id = ids
        .as_ref()
        .and_then(|v| v["action_id"].as_str())
        .unwrap_or("")
        .to_string();
    let span = tracing::info_span!("record", action_id = %action_id);
    let _g = span.enter();
    let result = process(st, body).await;
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
                give_up(st, ids.as_ref(), e).await;
            }
        }
    }
    result
}

fn bad_message(why: impl Into<String>) -> ApiError {
    let why = why.into();
    ApiError::internal(format!("malformed queue message: {why}")).with_field("message", why)
}

async fn process(st: &AppState, body: &str) -> Result<Outcome, ApiError> {
    let msg: QueueMessage = serde_json::from_str(body).map_err(|e| bad_message(e.to_string()))?;
    if msg.schema != QUEUE_MESSAGE_SCHEMA {
        return Err(bad_message(format!("unknown schema {}", msg.schema)));
    }
    if crate::failpoint::hit("worker.poison") && msg.trace.tool_call_id.as_deref() == Some("poison")
    {
        // Test-only: a message that fails every time it is handled.
        return Err(ApiError::internal(
            "failpoint worker.poison: this message cannot be handled",
        ));
    }
    let Some(action) = st.ports.actions.get_action(&msg.action_id).await? else {
        return Err(bad_message(format!("unknown action {}", msg.action_id)));
    };
    if matches!(
        action.status,
        ActionStatus::Succeeded | ActionStatus::Failed
    ) {
        return Ok(Outcome::AlreadyDone);
    }
    let now = st.clock.now_ms();
    st.ports
        .workers
        .set_action_status(
            &msg.action_id,
            &[ActionStatus::Queued],
            ActionStatus::Processing,
            None,
            now,
        )
        .await?;
    let outcome = match msg.action_type {
        ActionType::OrderSubmitCl => submit(st, &msg).await?,
        ActionType::OrderCancel => cancel(st, &msg).await?,
        ActionType::PositionsSync => sync(st, &msg).await?,
    };
    let (status, error) = match &outcome {
        Outcome::Failed(why) => (ActionStatus::Failed, Some(why.as_str())),
        _ => (ActionStatus::Succeeded, None),
    };
    st.ports
        .workers
        .set_action_status(
            &msg.action_id,
            &[ActionStatus::Queued, ActionStatus::Processing],
            status,
            error,
            st.clock.now_ms(),
        )
        .await?;
    Ok(outcome)
}

/// The last attempt failed: record the failure on the action and its job.
async fn give_up(st: &AppState, ids: Option<&serde_json::Value>, e: &ApiError) {
    let Some(ids) = ids else { return };
    let error = format!(
        "processing failed after repeated attempts: {}",
        e.cause.as_deref().unwrap_or(&e.message)
    );
    let now = st.clock.now_ms();
    if let Some(action_id) = ids["action_id"].as_str() {
        let from = [ActionStatus::Queued, ActionStatus::Processing];
        if let Err(err) = st
            .ports
            .workers
            .set_action_status(action_id, &from, ActionStatus::Failed, Some(&error), now)
            .await
        {
            tracing::error!(error = %err, "could not mark the action failed");
        }
    }
    if let Some(job_id) = ids["resource_refs"]["job_id"].as_str() {
        let job = Job {
            job_id: job_id.into(),
            kind: JobKind::PositionsSync,
            status: JobStatus::Failed,
            account_id: ids["normalized_payload"]["account_id"]
                .as_str()
                .map(String::from),
            action_id: ids["action_id"].as_str().map(String::from),
            created_at: now,
            updated_at: now,
            error: Some(error.clone()),
            result: None,
        };
        let created = st
            .ports
            .workers
            .create_job(&Job {
                status: JobStatus::Running,
                ..job.clone()
            })
            .await;
        if let Ok(stored) = created {
            let failed = Job {
                created_at: stored.created_at,
                ..job
            };
            if let Err(err) = st.ports.workers.finish_job(&failed, &json!({}), None).await {
                tracing::error!(error = %err, "could not mark the job failed");
            }
        }
    }
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
        account_id: o.account_id.clone(),
        symbol: o.symbol.clone(),
        side: o.side,
        quantity: o.quantity,
        order_type: o.order_type,
        limit_price: o.limit_price,
        stop_price: o.stop_price,
        time_in_force: o.time_in_force,
        status: BrokerStatus::Working,
        filled_quantity: 0,
        avg_fill_price: None,
        reason: None,
        triggered: false,
    }
}

/// Records what the broker says of an order: its new state and, for a new fill, the
/// position change. `Ok(false)`: the order or position moved under us; read again.
async fn record(
    st: &AppState,
    order: &Order,
    ack: &BrokerOrder,
    now: Millis,
) -> Result<bool, ApiError> {
    let mut next = order.clone();
    next.status = order_status(ack.status);
    next.filled_quantity = ack.filled_quantity;
    next.avg_fill_price = ack.avg_fill_price;
    next.updated_at = now.max(order.updated_at);
    let new_fill = ack.filled_quantity.saturating_sub(order.filled_quantity);
    let change = match (new_fill, ack.avg_fill_price) {
        (q, Some(price)) if q > 0 => {
            let current = st
                .ports
                .positions
                .get_position(&order.account_id, &order.symbol)
                .await?;
            let (qty, avg) = current
                .as_ref()
                .map(|p| (p.quantity, p.avg_price))
                .unwrap_or((0, None));
            let (after, avg_after) = paper::apply_fill(qty, avg, order.side, q, price);
            Some(PositionChange {
                expected: current.map(|p| p.quantity),
                new: Position {
                    account_id: order.account_id.clone(),
                    symbol: order.symbol.clone(),
                    quantity: after,
                    avg_price: avg_after,
                    updated_at: now,
                },
            })
        }
        _ => None,
    };
    if next == *order && change.is_none() {
        return Ok(true);
    }
    Ok(st
        .ports
        .workers
        .advance_order(&next, order.status, change.as_ref())
        .await?)
}

async fn reload(st: &AppState, order_id: &str) -> Result<Order, ApiError> {
    st.ports
        .orders
        .get_order(order_id)
        .await?
        .ok_or_else(|| ApiError::internal(format!("order {order_id} vanished")))
}

async fn submit(st: &AppState, msg: &QueueMessage) -> Result<Outcome, ApiError> {
    let order_id = msg
        .resource_refs
        .order_id
        .clone()
        .ok_or_else(|| bad_message("no order_id"))?;
    let n: NormalizedOrder = serde_json::from_value(msg.normalized_payload.clone())
        .map_err(|e| bad_message(e.to_string()))?;
    let now = st.clock.now_ms();
    let fresh = Order {
        order_id: order_id.clone(),
        account_id: n.account_id.clone(),
        symbol: n.symbol.clone(),
        side: n.side,
        quantity: n.quantity,
        order_type: n.order_type,
        limit_price: n.limit_price,
        stop_price: n.stop_price,
        time_in_force: n.time_in_force,
        status: OrderStatus::Queued,
        filled_quantity: 0,
        avg_fill_price: None,
        action_id: Some(msg.action_id.clone()),
        created_at: now,
        updated_at: now,
    };
    let mut order = st.ports.workers.create_order(&fresh).await?;
    for _ in 0..ROUNDS {
        let now = st.clock.now_ms();
        match order.status {
            OrderStatus::Queued => {
                // Claim the send before calling the broker.
                let next = Order {
                    status: OrderStatus::Submitted,
                    updated_at: now.max(order.updated_at),
                    ..order.clone()
                };
                st.ports
                    .workers
                    .advance_order(&next, OrderStatus::Queued, None)
                    .await?;
            }
            OrderStatus::Submitted => {
                // The broker deduplicates on the client order id: a resend is not a new order.
                let ack = st.ports.broker.submit(&to_broker(&order)).await?;
                if crate::failpoint::hit("worker.after_broker") {
                    // Test-only: the worker dies after the broker accepted the order.
                    tracing::error!(order_id = %order_id, "failpoint worker.after_broker: aborting");
                    std::process::abort();
                }
                record(st, &order, &ack, now).await?;
            }
            OrderStatus::Rejected => {
                let why = st
                    .ports
                    .broker
                    .order(&order.account_id, &order.order_id)
                    .await?
                    .and_then(|o| o.reason)
                    .unwrap_or_else(|| "rejected by the broker".into());
                return Ok(Outcome::Failed(format!(
                    "the broker rejected order {order_id}: {why}"
                )));
            }
            OrderStatus::Cancelled => {
                return Ok(Outcome::Failed(format!(
                    "order {order_id} was cancelled without a fill"
                )));
            }
            _ => return Ok(Outcome::Succeeded),
        }
        order = reload(st, &order_id).await?;
    }
    Err(ApiError::unavailable(format!(
        "order {order_id}: too many concurrent changes"
    )))
}

async fn cancel(st: &AppState, msg: &QueueMessage) -> Result<Outcome, ApiError> {
    let order_id = msg
        .resource_refs
        .order_id
        .clone()
        .ok_or_else(|| bad_message("no order_id"))?;
    for _ in 0..ROUNDS {
        let Some(order) = st.ports.orders.get_order(&order_id).await? else {
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
        match st.ports.broker.cancel(&order.account_id, &order_id).await? {
            Some(ack) => {
                record(st, &order, &ack, now).await?;
            }
            None => {
                // Never reached the broker: cancel it here.
                let next = Order {
                    status: OrderStatus::Cancelled,
                    updated_at: now.max(order.updated_at),
                    ..order.clone()
                };
                st.ports
                    .workers
                    .advance_order(&next, order.status, None)
                    .await?;
            }
        }
    }
    Err(ApiError::unavailable(format!(
        "order {order_id}: too many concurrent changes"
    )))
}

async fn sync(st: &AppState, msg: &QueueMessage) -> Result<Outcome, ApiError> {
    let job_id = msg
        .resource_refs
        .job_id
        .clone()
        .ok_or_else(|| bad_message("no job_id"))?;
    let account = msg.normalized_payload["account_id"]
        .as_str()
        .ok_or_else(|| bad_message("no account_id"))?
        .to_string();
    let now = st.clock.now_ms();
    let job = st
        .ports
        .workers
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
    reconcile_orders(
        st,
        Some(&account),
        &[
            OrderStatus::Submitted,
            OrderStatus::Working,
            OrderStatus::PartiallyFilled,
        ],
    )
    .await?;
    let broker = st.ports.broker.positions(&account).await?;
    let page = Page {
        after: None,
        limit: 10_000,
    };
    let before = st
        .ports
        .positions
        .list_positions(&DeskScope::All, Some(&account), &page)
        .await?;
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
            changed.push(json!({ "symbol": sym, "before": was, "after": now_q }));
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
    let result = json!({ "positions": rows.len(), "changed": changed });
    let done = Job {
        status: JobStatus::Succeeded,
        updated_at: now,
        result: Some(result.clone()),
        ..job
    };
    if st
        .ports
        .workers
        .finish_job(&done, &result, Some((&account, &rows)))
        .await?
    {
        return Ok(Outcome::Succeeded);
    }
    // Not written: another delivery finished the job, or (DynamoDB) the write conflicted.
    // (`create_job` of an existing job returns the stored one.)
    match st.ports.workers.create_job(&done).await? {
        j if j.status != JobStatus::Running => Ok(Outcome::AlreadyDone),
        _ => Err(ApiError::unavailable(format!(
            "job {job_id}: positions changed during the sync; retrying"
        ))),
    }
}

/// Asks the broker about one order and records what moved. `true` if it recorded a change.
async fn reconcile_order(st: &AppState, order: &Order) -> Result<bool, ApiError> {
    let Some(ack) = st
        .ports
        .broker
        .order(&order.account_id, &order.order_id)
        .await?
    else {
        return Ok(false);
    };
    let moved =
        order_status(ack.status) != order.status || ack.filled_quantity != order.filled_quantity;
    Ok(moved && record(st, order, &ack, st.clock.now_ms()).await?)
}

/// Asks the broker about every working order (after a price change) and records fills.
pub async fn reconcile_working_orders(st: &AppState) -> Result<usize, ApiError> {
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
    st: &AppState,
    account: Option<&str>,
    statuses: &[OrderStatus],
) -> Result<usize, ApiError> {
    let mut updated = 0;
    for &status in statuses {
        let filter = crate::ports::OrderFilter {
            account_id: account.map(str::to_string),
            status: Some(status),
        };
        let page = Page {
            after: None,
            limit: 10_000,
        };
        for order in st
            .ports
            .orders
            .list_orders(&DeskScope::All, &filter, &page)
            .await?
        {
            if reconcile_order(st, &order).await? {
                updated += 1;
            }
        }
    }
    Ok(updated)
}
