//! Orders at the broker: submit (the order created claimed, the gates, the broker call,
//! the record of its answer) and cancel.

use super::*;

/// The order a submission's stored message describes, as first recorded (`queued`).
pub(super) fn new_order(msg: &QueueMessage, now: Millis) -> Result<Order, ApiError> {
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
        version: crate::core::domain::first_version(),
        versions: Vec::new(),
    })
}

pub(crate) fn order_status(s: BrokerStatus) -> OrderStatus {
    match s {
        BrokerStatus::Working => OrderStatus::Working,
        BrokerStatus::PartiallyFilled => OrderStatus::PartiallyFilled,
        BrokerStatus::Filled => OrderStatus::Filled,
        BrokerStatus::Cancelled => OrderStatus::Cancelled,
        BrokerStatus::Rejected => OrderStatus::Rejected,
    }
}

pub(super) fn to_broker(o: &Order) -> BrokerOrder {
    BrokerOrder::new(&o.order_id, &o.terms, o.version)
}

/// The order as [`record`] writes it after the broker's answer `ack`.
pub(super) fn recorded(order: &Order, ack: &BrokerOrder, now: Millis) -> Order {
    let mut next = order.clone();
    next.status = order_status(ack.status);
    next.filled_quantity = ack.filled_quantity;
    next.avg_fill_price = ack.avg_fill_price;
    next.updated_at = now.max(order.updated_at);
    next
}

/// What a submission's order in `status` says of its action once the broker has answered
/// (`reason`: the broker's, for a rejection); `None` before.
pub(super) fn submission_outcome(
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

pub(super) fn broker_rejected(order_id: &str, reason: Option<&str>) -> String {
    format!(
        "the broker rejected order {order_id}: {}",
        reason.unwrap_or("rejected by the broker")
    )
}

/// Records what the broker says of an order: its new state, for a new fill the position
/// change, and with `settles` the move of the action it settles, in one write.
/// `Ok(false)`: the order, the position or the action moved under us; read again.
pub(crate) async fn record(
    st: &Worker,
    order: &Order,
    ack: &BrokerOrder,
    now: Millis,
    settles: Option<&ActionMove<'_>>,
) -> Result<bool, ApiError> {
    let next = recorded(order, ack, now);
    let new_fill = ack.filled_quantity.saturating_sub(order.filled_quantity);
    // The broker's average is over all the order's fills: the new contracts' own price is
    // what moves the position.
    let new_fill_price = crate::core::domain::fills::price_of_new_fills(
        (order.filled_quantity, order.avg_fill_price),
        (ack.filled_quantity, ack.avg_fill_price),
    );
    let change = match (new_fill, new_fill_price) {
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
            let day_realized = day_realized(current.as_ref(), order, q, price, now);
            Some(PositionChange {
                expected: current.map(|p| p.quantity),
                new: Position {
                    account_id: order.terms.account_id.clone(),
                    symbol: order.terms.symbol.clone(),
                    quantity: after,
                    avg_price: avg_after,
                    updated_at: now,
                    day_realized,
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

/// The position's realized P&L of the trading day after a fill of `qty` at `price`,
/// recorded at `now` (the day is the one the record is made in: the broker reports no
/// fill times). A fill closing contracts of unknown average price realizes an unknown
/// amount: counted as zero, with an error in the log.
fn day_realized(
    current: Option<&Position>,
    order: &Order,
    qty: u32,
    price: crate::core::domain::Price,
    now: Millis,
) -> Option<crate::core::domain::pnl::DayRealized> {
    use crate::core::domain::pnl;
    let (quantity, avg) = current.map_or((0, None), |p| (p.quantity, p.avg_price));
    let realized = pnl::realized_by_fill(quantity, avg, order.terms.side, qty, price)
        .unwrap_or_else(|| {
            tracing::error!(
                order_id = %order.order_id,
                quantity,
                qty,
                price = %price,
                "a fill's realized P&L cannot be computed (no average price); counted as zero"
            );
            rust_decimal::Decimal::ZERO
        });
    let before = current.and_then(|p| p.day_realized.as_ref());
    if realized.is_zero() && before.is_none() {
        return None;
    }
    let day = pnl::trading_day(
        crate::core::domain::calendar::ExchangeCalendar::cme(),
        chrono::DateTime::from_timestamp_millis(now).unwrap_or_default(),
    );
    Some(pnl::DayRealized::add(before, day, realized))
}

pub(super) async fn reload(st: &Worker, order_id: &str) -> Result<Order, ApiError> {
    st.orders
        .get_order(order_id)
        .await?
        .ok_or_else(|| ApiError::internal(format!("order {order_id} vanished")))
}

/// Creates a submission's order claimed for the broker (`submitted`) in one write, or
/// finds the one an earlier delivery created. The gate runs after the claim, as the last
/// step before the broker.
pub(crate) async fn claim_order(
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
pub(crate) async fn submit(
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
            OrderStatus::Submitted => {
                match pre_broker_gate_of(
                    st,
                    &order,
                    &format!("order {}", order.order_id),
                    Some(msg),
                )
                .await?
                {
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
                        let outcome =
                            submission_outcome(&order_id, next.status, ack.reason.as_deref())
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
                }
            }
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
pub(super) async fn rejected(st: &Worker, order: &Order) -> Result<Outcome, ApiError> {
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

pub(crate) async fn cancel(st: &Worker, msg: &QueueMessage) -> Result<Outcome, ApiError> {
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
        if let Some(why) = keeps_closing_order(st, &order, msg).await? {
            return Ok(Outcome::Failed(why));
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
