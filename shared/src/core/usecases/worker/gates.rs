//! The worker's gates before the broker: the kill switch, the last risk checks on the
//! claimed order, and refusing an order that was never sent.

use super::*;
use crate::core::usecases::kill_switch;

/// The kill switch, read before every order submission: `Some(error)` if it is engaged.
pub(super) async fn kill_switch(st: &Worker, order_id: &str) -> Result<Option<String>, ApiError> {
    Ok(engaged(
        &st.control.get_control().await?,
        &format!("order {order_id}"),
    ))
}

/// `Some(error)`: `order` is a closing order of the engaged switch, which `msg` (a cancel
/// or change the switch did not queue) may not touch ([`kill_switch::keeps_closing_order`]).
pub(crate) async fn keeps_closing_order(
    st: &Worker,
    order: &Order,
    msg: &QueueMessage,
) -> Result<Option<String>, ApiError> {
    if order.action_id.is_none() || msg.service_principal == kill_switch::PRINCIPAL {
        return Ok(None);
    }
    Ok(kill_switch::keeps_closing_order(
        order,
        &st.control.get_control().await?,
        msg,
    ))
}

/// `Some(error)` if `control` has the kill switch engaged; `what` did not reach the broker
/// ("order ord_1", "the change of order ord_1").
pub(super) fn engaged(control: &crate::core::records::Control, what: &str) -> Option<String> {
    if control.trade_execute_enabled {
        return None;
    }
    let reason = control
        .reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    Some(format!(
        "kill_switch_engaged: the kill switch was engaged{reason} before {what} \
         reached the broker; it was not sent"
    ))
}

/// The worker's last check before an order goes to the broker, made after its claim: the
/// kill switch, the account's status, the market rules and the price band at the
/// reference price read now (moved or gone stale since execute), then the position limit
/// against the worst case with open orders (this order's own contracts were reserved at
/// execute), under the policy in force now. A kill switch engaged, a policy lowered, or a
/// sync that raised the position, since execute stops the order here. `Some(error)`: do
/// not send it.
/// `what`: what is about to be sent ("order ord_1", "the change of order ord_1").
pub(crate) async fn pre_broker_gate(
    st: &Worker,
    order: &Order,
    what: &str,
) -> Result<Option<String>, ApiError> {
    pre_broker_gate_of(st, order, what, None).await
}

/// [`pre_broker_gate`] for an order submission's stored message `msg`: the kill switch's
/// closing order of its current engagement passes the engaged switch
/// ([`kill_switch::is_flattening`]), and any closing order of the kill switch must only
/// reduce the position found now ([`kill_switch::reduces_only`]), so a position that moved
/// since it was queued is never reversed.
pub(crate) async fn pre_broker_gate_of(
    st: &Worker,
    order: &Order,
    what: &str,
    msg: Option<&QueueMessage>,
) -> Result<Option<String>, ApiError> {
    // Its reads side by side: one of the control record for both the kill switch and the
    // policy in force, the exposure, the account, the reference price, the day's P&L.
    let account_id = &order.terms.account_id;
    let (control, exposure, account, reference, day_pnl) = tokio::try_join!(
        async { Ok::<_, ApiError>(st.control.get_control().await?) },
        async {
            Ok(st
                .positions
                .get_exposure(account_id, &order.terms.symbol)
                .await?)
        },
        async { Ok(st.accounts.get_account(account_id).await?) },
        async { Ok(st.prices.quote(&order.terms.symbol).await?) },
        crate::core::usecases::day_pnl::account_day_pnl(
            st.positions.as_ref(),
            st.prices.as_ref(),
            account_id,
            st.clock.now(),
        ),
    )?;
    let closing = msg.filter(|m| kill_switch::is_closing_order(m));
    if !closing.is_some_and(|m| kill_switch::is_flattening(m, &control)) {
        if let Some(why) = engaged(&control, what) {
            return Ok(Some(why));
        }
    }
    if closing.is_some() {
        if let Err(why) =
            kill_switch::reduces_only(exposure.position, order.terms.side, order.terms.quantity)
        {
            return Ok(Some(why));
        }
    }
    let request = crate::core::domain::OrderSubmitCl {
        account_id: crate::core::domain::Ident::parse(&order.terms.account_id)
            .map_err(bad_message)?,
        symbol: order.terms.symbol.clone(),
        side: order.terms.side,
        quantity: crate::core::domain::Quantity::new(order.terms.quantity as i64)
            .map_err(bad_message)?,
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
        reference,
        day_pnl: Some(&day_pnl),
    };
    if let Some(a) = account.filter(|a| a.status != crate::core::domain::AccountStatus::Active) {
        return Ok(Some(format!(
            "policy_violation: account_allowed: account {} is {}; {what} was not sent to the broker",
            a.account_id, a.status
        )));
    }
    if let Some(c) = crate::core::policy::recheck_at_worker(&inputs)
        .into_iter()
        .find(crate::core::records::RiskCheck::failed)
    {
        return Ok(Some(format!(
            "policy_violation: {}: {}; {what} was not sent to the broker",
            c.name, c.reason
        )));
    }
    if let Err(why) = crate::core::policy::checks::daily_loss_gate(&inputs) {
        return Ok(Some(format!(
            "policy_violation: daily_loss: {why}; {what} was not sent to the broker"
        )));
    }
    Ok(crate::core::policy::position_gate(&inputs)
        .err()
        .map(|why| {
            format!("policy_violation: position_limit: {why}; {what} was not sent to the broker")
        }))
}

/// Whether a `submitted` order's claim is old enough that no delivery can still be
/// between the claim and the broker call: longer than a message stays hidden while it is
/// handled. A younger claim the broker does not know yet may still reach it, so it is not
/// refused (that would release its reservation while the order goes live).
pub(super) fn claim_abandoned(st: &Worker, order: &Order, now: Millis) -> bool {
    now - order.updated_at > st.visibility_ms as i64
}

/// Moves an order the broker never saw to `rejected` (releasing what it reserved).
/// `false`: it moved under us; read it again.
pub(super) async fn reject_unsent(
    st: &Worker,
    order: &Order,
    now: Millis,
) -> Result<bool, ApiError> {
    let next = Order {
        status: OrderStatus::Rejected,
        updated_at: now.max(order.updated_at),
        ..order.clone()
    };
    Ok(st.store.advance_order(order, &next, None, None).await?)
}

/// An order submission the sweeper will not send because the kill switch is engaged (the
/// kill switch's own closing orders excepted):
/// its order is recorded `rejected` (so what execute reserved is released) and the
/// error to fail the action with is returned. `None`: the switch is not engaged.
pub(crate) async fn refuse_unsent_submission(
    st: &Worker,
    action: &ActionRecord,
) -> Result<Option<String>, ApiError> {
    let Some(order_id) = action.resource_refs.order_id.as_deref() else {
        return Ok(None);
    };
    let control = st.control.get_control().await?;
    // The kill switch's own closing order is sent: the worker's gate decides it.
    if kill_switch::is_flattening(&action.message, &control) {
        return Ok(None);
    }
    let Some(why) = engaged(&control, &format!("order {order_id}")) else {
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
