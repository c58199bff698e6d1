//! `order.replace.cl`: change a working CL order's quantity, prices or time in force
//! (cancel/replace). The symbol, side, account and order type stay: a different one is a
//! new order. The plan checks the order as it will be, counting only the contracts the
//! change adds against the position limit; execute reserves that increase; the worker
//! refuses a change of an order that moved on since the plan, passes the kill switch and
//! position gates when the change adds risk, and asks the broker to replace the order at
//! its next version. A change that only lowers the quantity reduces risk: it passes the
//! kill switch and is confirmed as a cancel is.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::submit_cl::{concentration_check, reference_quote, tif_words};
use super::{
    notional, Action, AtExecute, Claimed, Field, PayloadType, PlanContext, PlanTool, Worked,
};
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::cl::ClContract;
use crate::core::domain::payload::{
    NormalizedOrder, NormalizedPayload, NormalizedReplace, Payload, Replaced,
};
use crate::core::domain::pnl::DayPnl;
use crate::core::domain::{
    optional_input_price, ActionStatus, ActionType, Exposure, ExposureDelta, Ident, Order,
    OrderStatus, OrderSubmitCl, OrderTerms, OrderType, Price, Quantity, Side, TimeInForce,
};
use crate::core::error::{ApiError, Code, FieldError};
use crate::core::parse::from_value;
use crate::core::policy::checks as check;
use crate::core::policy::{self, OrderInputs, Policy};
use crate::core::ports::broker::{ReplaceOutcome, Replacement};
use crate::core::ports::{ActionMove, Quote, Reservation};
use crate::core::records::{ActionRecord, Control, PlanRecord, QueueMessage, RiskCheck};
use crate::core::usecases::execute::{policy_violation, Executor};
use crate::core::usecases::plan::Evaluated;
use crate::core::usecases::reads::visible_account;
use crate::core::usecases::worker::{self, Outcome, Worker};

pub struct ReplaceCl;

/// `order.replace.cl` payload, as sent: the order, and at least one new value. What is not
/// given (or `null`) stays as it is.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [
    {"required": ["quantity"], "properties": {"quantity": {"not": {"type": "null"}}}},
    {"required": ["limit_price"], "properties": {"limit_price": {"not": {"type": "null"}}}},
    {"required": ["stop_price"], "properties": {"stop_price": {"not": {"type": "null"}}}},
    {"required": ["time_in_force"], "properties": {"time_in_force": {"not": {"type": "null"}}}}
]))]
pub struct OrderReplaceCl {
    pub account_id: Ident,
    /// The order to change (`ord_...`): `submitted`, `working` or `partially_filled`.
    pub order_id: Ident,
    /// The new total quantity, not below what has filled.
    #[serde(default)]
    pub quantity: Option<Quantity>,
    #[serde(default, deserialize_with = "optional_input_price")]
    pub limit_price: Option<Price>,
    #[serde(default, deserialize_with = "optional_input_price")]
    pub stop_price: Option<Price>,
    #[serde(default)]
    pub time_in_force: Option<TimeInForce>,
}

#[async_trait]
impl Action for ReplaceCl {
    fn action_type(&self) -> ActionType {
        ActionType::OrderReplaceCl
    }

    fn plan_tool(&self) -> PlanTool {
        PlanTool {
            name: "plan_replace_order",
            title: "Plan a change of a CL order",
            description: "Validate changing a working CL order's quantity, limit or stop price, or time in force (cancel/replace; what is not given stays) and run the risk checks on the order as it will be. Returns a preview of before -> after and, when executable, where the operator approves it (a change that only lowers the quantity is confirmed like a cancel). Changes nothing by itself.",
        }
    }

    fn payload_type(&self) -> PayloadType {
        PayloadType::of::<OrderReplaceCl>()
    }

    fn check_payload(&self, payload: &Value, at: &str) -> Result<(), ApiError> {
        let r: OrderReplaceCl = from_value(payload.clone(), at)?;
        if r.quantity.is_none()
            && r.limit_price.is_none()
            && r.stop_price.is_none()
            && r.time_in_force.is_none()
        {
            return Err(ApiError::new(
                Code::InvalidRequest,
                "A replace changes at least one of quantity, limit_price, stop_price, time_in_force.",
            )
            .with_details(vec![FieldError::new(
                if at.is_empty() { "/" } else { at },
                "give at least one of quantity, limit_price, stop_price, time_in_force",
            )]));
        }
        Ok(())
    }

    async fn evaluate(&self, cx: &PlanContext<'_>, payload: Value) -> Result<Evaluated, ApiError> {
        evaluate(cx, self.parsed(payload)?).await
    }

    fn weighs_notional(&self) -> bool {
        true
    }

    /// A change that only lowers the quantity is confirmed as a cancel is
    /// (`confirmation["order.cancel"]`); any other by this type's own mode.
    fn confirmed_as(&self, payload: &NormalizedPayload) -> ActionType {
        match payload {
            NormalizedPayload::OrderReplaceCl(r) if r.only_reduces() => ActionType::OrderCancel,
            _ => ActionType::OrderReplaceCl,
        }
    }

    async fn at_execute(
        &self,
        ex: &Executor,
        plan: &PlanRecord,
        control: &Control,
    ) -> Result<AtExecute, ApiError> {
        let r = replace_of(plan)?;
        if r.only_reduces() {
            // Reduces risk, like a cancel: nothing to re-check, nothing to reserve.
            return Ok(AtExecute::Go(None));
        }
        let pol = policy::in_force(&ex.policy, control);
        let whole = as_request(&r.order, r.order.terms.quantity)?;
        let contract = ClContract::parse(&r.order.terms.symbol).ok();
        // The reference price and the day's P&L, side by side.
        let (day_pnl, quote) =
            super::submit_cl::execute_day_pnl_and_quote(ex, plan, contract).await?;
        let checked = inputs(pol, ex.clock.now(), &r, &whole, Exposure::default(), quote);
        let failed: Vec<RiskCheck> = [
            check::account_listed(pol, &plan.account_id),
            check::contract_not_expired(&checked),
            check::market_open(&checked),
            check::max_order_size(&checked),
            check::price_on_tick(&checked),
            check::price_band(&checked),
        ]
        .into_iter()
        .filter(RiskCheck::failed)
        .collect();
        if !failed.is_empty() {
            return Ok(AtExecute::Refuse(policy_violation(&failed)));
        }
        // Past the daily loss limit a change that adds risk must reduce the position (a
        // price change reserves nothing, so the commit cannot hold it back).
        if day_pnl.breaches(pol.max_daily_loss) {
            let exposure = ex
                .positions
                .get_exposure(&plan.account_id, &r.order.terms.symbol)
                .await?;
            let now = ex.clock.now();
            let filled = r.replaces.filled_quantity;
            let failed: Vec<RiskCheck> = position_checks(pol, now, &r, exposure, filled, &day_pnl)?
                .into_iter()
                .filter(|c| c.failed() && c.name == "daily_loss")
                .collect();
            if !failed.is_empty() {
                return Ok(AtExecute::Refuse(policy_violation(&failed)));
            }
        }
        let increase = r.increase();
        if increase == 0 {
            return Ok(AtExecute::Go(None));
        }
        // The increase is reserved like a new order of that size: the worst case with the
        // order's current rest (already counted) plus the increase stays within the limit.
        let added = as_request(&r.order, increase)?;
        let mut added_inputs = inputs(pol, ex.clock.now(), &r, &added, Exposure::default(), None);
        added_inputs.day_pnl = Some(&day_pnl);
        Ok(AtExecute::Go(Some(Reservation {
            side: r.order.terms.side,
            bound: policy::reservation_bound(&added_inputs),
            delta: ExposureDelta::reserve(
                &plan.account_id,
                &r.order.terms.symbol,
                r.order.terms.side,
                i64::from(increase),
            ),
        })))
    }

    async fn position_violation(
        &self,
        ex: &Executor,
        plan: &PlanRecord,
        control: &Control,
    ) -> Result<Option<ApiError>, ApiError> {
        let r = replace_of(plan)?;
        let exposure = ex
            .positions
            .get_exposure(&plan.account_id, &r.order.terms.symbol)
            .await?;
        let failed: Vec<RiskCheck> = position_checks(
            policy::in_force(&ex.policy, control),
            ex.clock.now(),
            &r,
            exposure,
            r.replaces.filled_quantity,
            &super::submit_cl::execute_day_pnl(ex, plan).await?,
        )?
        .into_iter()
        .filter(RiskCheck::failed)
        .collect();
        Ok((!failed.is_empty()).then(|| policy_violation(&failed)))
    }

    async fn work(&self, w: &Worker, msg: &QueueMessage, _claimed: Claimed) -> Worked {
        let NormalizedPayload::OrderReplaceCl(r) = &msg.normalized_payload else {
            return Err(worker::bad_message(
                "an order.replace.cl message without its change",
            ));
        };
        replace(w, msg, r).await
    }

    async fn give_up(
        &self,
        w: &Worker,
        action: &ActionRecord,
        cause: &str,
    ) -> Result<(ActionStatus, Option<String>), ApiError> {
        let why = format!("processing failed after repeated attempts: {cause}");
        if let NormalizedPayload::OrderReplaceCl(r) = &action.message.normalized_payload {
            release(w, &action.action_id, r, &why).await?;
        }
        Ok((ActionStatus::Failed, Some(why)))
    }

    /// The order as it will be, each changed field with the value it replaces.
    fn fields(&self, payload: &NormalizedPayload) -> Vec<Field> {
        let mut fields = super::json_fields(&payload.to_json());
        fields.retain(|f| f.name != "replaces");
        if let NormalizedPayload::OrderReplaceCl(r) = payload {
            let was = |name: &str| -> Option<String> {
                let p = &r.replaces;
                Some(match name {
                    "quantity" => p.quantity.to_string(),
                    "limit_price" => opt_price(p.limit_price),
                    "stop_price" => opt_price(p.stop_price),
                    "time_in_force" => p.time_in_force.to_string(),
                    _ => return None,
                })
            };
            for f in &mut fields {
                f.before = was(&f.name);
            }
            fields.push(Field {
                name: "filled_quantity".into(),
                value: r.replaces.filled_quantity.to_string(),
                before: None,
            });
            fields.push(Field {
                name: "version".into(),
                value: (r.replaces.version + 1).to_string(),
                before: Some(r.replaces.version.to_string()),
            });
        }
        fields
    }
}

fn opt_price(p: Option<Price>) -> String {
    p.map_or_else(|| "-".to_string(), |p| p.to_string())
}

/// The plan's change, as confirmed.
fn replace_of(plan: &PlanRecord) -> Result<NormalizedReplace, ApiError> {
    match &plan.normalized_payload {
        NormalizedPayload::OrderReplaceCl(r) => Ok(r.clone()),
        _ => Err(ApiError::internal(format!(
            "plan {} holds no order change",
            plan.plan_id
        ))),
    }
}

/// The order's terms as a request of `quantity` contracts, for the order checks.
fn as_request(o: &NormalizedOrder, quantity: u32) -> Result<OrderSubmitCl, ApiError> {
    let mut request = o.as_request().map_err(ApiError::internal)?;
    request.quantity = Quantity::new(i64::from(quantity)).map_err(ApiError::internal)?;
    Ok(request)
}

fn inputs<'a>(
    policy: &'a Policy,
    now: chrono::DateTime<chrono::Utc>,
    r: &'a NormalizedReplace,
    order: &'a OrderSubmitCl,
    exposure: Exposure,
    reference: Option<Quote>,
) -> OrderInputs<'a> {
    OrderInputs {
        policy,
        calendar: ExchangeCalendar::cme(),
        now,
        account_id: &r.order.terms.account_id,
        order,
        contract: ClContract::parse(&r.order.terms.symbol).ok(),
        exposure,
        reference,
        day_pnl: None,
    }
}

/// `position_limit` and `expiry_window` of the order as it will be: its current rest
/// (counted in `exposure` among the open orders) replaced by its new rest, so only what the
/// change adds counts. No rest left (the new quantity is what has filled): nothing to
/// check.
fn position_checks(
    pol: &Policy,
    now: chrono::DateTime<chrono::Utc>,
    r: &NormalizedReplace,
    mut exposure: Exposure,
    filled: u32,
    day_pnl: &DayPnl,
) -> Result<Vec<RiskCheck>, ApiError> {
    let old_rest = i64::from(r.replaces.quantity.saturating_sub(filled));
    match r.order.terms.side {
        Side::Buy => exposure.open_buy = (exposure.open_buy - old_rest).max(0),
        Side::Sell => exposure.open_sell = (exposure.open_sell - old_rest).max(0),
    }
    let new_rest = r.order.terms.quantity.saturating_sub(filled);
    if new_rest == 0 {
        return Ok(vec![RiskCheck::pass(
            "position_limit",
            "the new quantity is what has filled: nothing is left to trade",
        )]);
    }
    let rest = as_request(&r.order, new_rest)?;
    let mut i = inputs(pol, now, r, &rest, exposure, None);
    let loss = if r.only_reduces() {
        RiskCheck::pass(
            "daily_loss",
            "the change only lowers the order's quantity: it reduces risk",
        )
    } else {
        i.day_pnl = Some(day_pnl);
        check::daily_loss(&i)
    };
    Ok(vec![
        check::expiry_window(&i),
        check::position_limit(&i),
        loss,
    ])
}

/// "Change order ord_1 on ACC-1: buy 2 -> 3 CLF27, limit 71.25 -> 71.20, day order."
pub fn replace_preview(r: &NormalizedReplace) -> String {
    let t = &r.order.terms;
    let p = &r.replaces;
    let change = |before: String, after: String| {
        if before == after {
            after
        } else {
            format!("{before} -> {after}")
        }
    };
    let mut parts = vec![format!(
        "{} {} {}",
        t.side,
        change(p.quantity.to_string(), t.quantity.to_string()),
        t.symbol
    )];
    if t.limit_price.is_some() || p.limit_price.is_some() {
        parts.push(format!(
            "limit {}",
            change(opt_price(p.limit_price), opt_price(t.limit_price))
        ));
    }
    if t.stop_price.is_some() || p.stop_price.is_some() {
        parts.push(format!(
            "stop {}",
            change(opt_price(p.stop_price), opt_price(t.stop_price))
        ));
    }
    parts.push(change(
        tif_words(p.time_in_force).to_string(),
        tif_words(t.time_in_force).to_string(),
    ));
    format!(
        "Change order {} on {}: {}.",
        r.order_id,
        t.account_id,
        parts.join(", ")
    )
}

/// `order_replaceable`: the order can still change at the broker, the new quantity is not
/// below what has filled, the new prices fit its type, and something changes.
fn replaceable(order: &Order, r: &OrderReplaceCl, after: &OrderTerms) -> RiskCheck {
    const NAME: &str = "order_replaceable";
    let id = &order.order_id;
    if !matches!(
        order.status,
        OrderStatus::Submitted | OrderStatus::Working | OrderStatus::PartiallyFilled
    ) {
        return RiskCheck::fail(
            NAME,
            format!(
                "order {id} is {}: only a submitted, working or partially filled order can change",
                order.status
            ),
        );
    }
    if after.quantity < order.filled_quantity {
        return RiskCheck::fail(
            NAME,
            format!(
                "order {id} has {} filled: the new quantity {} is below it",
                order.filled_quantity, after.quantity
            ),
        );
    }
    let t = order.terms.order_type;
    let limit_ok = r.limit_price.is_none() || matches!(t, OrderType::Limit | OrderType::StopLimit);
    let stop_ok = r.stop_price.is_none() || matches!(t, OrderType::Stop | OrderType::StopLimit);
    if !limit_ok || !stop_ok {
        let which = if limit_ok { "stop" } else { "limit" };
        return RiskCheck::fail(
            NAME,
            format!("order {id} is a {t} order: it has no {which} price to change (a different order type is a new order)"),
        );
    }
    if *after == order.terms {
        return RiskCheck::fail(NAME, format!("the change leaves order {id} as it is"));
    }
    RiskCheck::pass(
        NAME,
        format!(
            "order {id} is {} at version {}, {} of {} filled",
            order.status, order.version, order.filled_quantity, order.terms.quantity
        ),
    )
}

async fn evaluate(cx: &PlanContext<'_>, r: OrderReplaceCl) -> Result<Evaluated, ApiError> {
    let PlanContext {
        planner: state,
        caller,
        control,
    } = *cx;
    let account = visible_account(state.accounts.as_ref(), caller, r.account_id.as_str()).await?;
    // An order of another account answers as one that does not exist.
    let order = state
        .orders
        .get_order(r.order_id.as_str())
        .await?
        .filter(|o| o.terms.account_id == account.account_id)
        .ok_or_else(|| {
            ApiError::new(
                Code::OrderNotFound,
                format!(
                    "There is no order {} on account {}.",
                    r.order_id, account.account_id
                ),
            )
            .with_details(vec![FieldError::new(
                "/payload/order_id",
                "no such order on this account",
            )])
        })?;
    let current = &order.terms;
    let after = OrderTerms {
        quantity: r.quantity.map_or(current.quantity, Quantity::get),
        limit_price: r.limit_price.or(current.limit_price),
        stop_price: r.stop_price.or(current.stop_price),
        time_in_force: r.time_in_force.unwrap_or(current.time_in_force),
        ..current.clone()
    };
    let cal = ExchangeCalendar::cme();
    let contract = ClContract::parse(&after.symbol).ok();
    let normalized = NormalizedReplace {
        order: NormalizedOrder {
            terms: after.clone(),
            contract_month: contract.map(|c| c.contract_month()),
            last_trade_date: contract.map(|c| c.last_trade_date(cal).to_string()),
            market_protection: None,
        },
        order_id: order.order_id.clone(),
        replaces: Replaced {
            order_id: order.order_id.clone(),
            version: order.version,
            quantity: current.quantity,
            filled_quantity: order.filled_quantity,
            limit_price: current.limit_price,
            stop_price: current.stop_price,
            time_in_force: current.time_in_force,
        },
    };
    let pol = policy::in_force(&state.policy, control);
    let now = state.clock.now();
    let quote = reference_quote(state, contract).await?;
    let reference = quote.map(|q| q.price);
    let whole = as_request(&normalized.order, after.quantity.max(1))?;
    let order_inputs = inputs(pol, now, &normalized, &whole, Exposure::default(), quote);
    let mut checks = vec![
        check::action_enabled(control, ActionType::OrderReplaceCl),
        check::kill_switch(control, !normalized.only_reduces()),
        check::account_allowed(pol, &account),
        RiskCheck::pass(
            "order_exists",
            format!(
                "order {} is on account {}",
                order.order_id, account.account_id
            ),
        ),
        replaceable(&order, &r, &after),
        check::market_open(&order_inputs),
        check::max_order_size(&order_inputs),
    ];
    let exposure = state
        .positions
        .get_exposure(&account.account_id, &after.symbol)
        .await?;
    let day_pnl = crate::core::usecases::day_pnl::account_day_pnl(
        state.positions.as_ref(),
        state.prices.as_ref(),
        &account.account_id,
        now,
    )
    .await?;
    let position = position_checks(
        pol,
        now,
        &normalized,
        exposure,
        order.filled_quantity,
        &day_pnl,
    )?;
    let (expiry, limit): (Vec<RiskCheck>, Vec<RiskCheck>) = position
        .into_iter()
        .partition(|c| c.name == "expiry_window");
    checks.extend(limit);
    checks.push(check::price_on_tick(&order_inputs));
    checks.push(check::price_band(&order_inputs));
    checks.extend(expiry);
    let added = normalized.increase();
    checks.push(match contract {
        Some(c) if added > 0 => {
            let request = as_request(&normalized.order, added)?;
            concentration_check(state, &account, &request, c, pol).await?
        }
        _ => RiskCheck::pass("concentration", "the change adds no contracts to the book"),
    });
    Ok(Evaluated {
        preview: replace_preview(&normalized),
        notional: reference.map(|p| notional(after.quantity, p)),
        normalized: NormalizedPayload::OrderReplaceCl(normalized),
        account,
        checks,
        reference: quote,
    })
}

/// The worker's step: the order must still be at the version the plan saw, open at the
/// broker and not filled beyond the new quantity; a change that adds risk passes the kill
/// switch and the position gate; then the broker replaces it at its next version, and the
/// order's record follows in one conditional write that also settles the action and turns
/// the reserved increase into the order's open rest (or releases what a reduction frees).
async fn replace(
    st: &Worker,
    msg: &QueueMessage,
    r: &NormalizedReplace,
) -> Result<(Outcome, bool), ApiError> {
    let id = &r.order_id;
    for _ in 0..worker::ROUNDS {
        let Some(order) = st.orders.get_order(id).await? else {
            return refuse(st, msg, r, format!("there is no order {id}")).await;
        };
        if order
            .versions
            .iter()
            .any(|v| v.replaced_by == msg.action_id)
        {
            return Ok((Outcome::AlreadyDone, false));
        }
        if order.version != r.replaces.version {
            return refuse(
                st,
                msg,
                r,
                format!(
                    "order {id} is at version {}, not version {} that this change was approved for; plan the change again",
                    order.version, r.replaces.version
                ),
            )
            .await;
        }
        if let Some(why) = worker::keeps_closing_order(st, &order, msg).await? {
            return refuse(st, msg, r, why).await;
        }
        match order.status {
            OrderStatus::Working | OrderStatus::PartiallyFilled => {}
            OrderStatus::Submitted | OrderStatus::Queued => {
                return Err(ApiError::unavailable(format!(
                    "order {id} is being sent to the broker; the change will be retried"
                )))
            }
            s => {
                return refuse(
                    st,
                    msg,
                    r,
                    format!("order {id} is {s}; it can no longer change"),
                )
                .await
            }
        }
        if r.order.terms.quantity < order.filled_quantity {
            return refuse(
                st,
                msg,
                r,
                format!(
                    "order {id} has {} filled: the new quantity {} is below it",
                    order.filled_quantity, r.order.terms.quantity
                ),
            )
            .await;
        }
        let now = st.clock.now_ms();
        let next = order.replaced(r.order.terms.clone(), &msg.action_id, now);
        let what = format!("the change of order {id}");
        // A redelivery after the broker took the change goes straight to recording it.
        let at_broker = st.broker.order(&order.terms.account_id, id).await?;
        let sent = at_broker.is_some_and(|b| b.version >= next.version);
        if r.adds_risk() && !sent {
            if let Some(why) = worker::pre_broker_gate(st, &next, &what).await? {
                return refuse(st, msg, r, why).await;
            }
        }
        match st
            .broker
            .replace(&order.terms.account_id, id, &Replacement::of(&next))
            .await?
        {
            ReplaceOutcome::Replaced(ack) => {
                // The increase was reserved at execute; a reduction frees its contracts.
                let freed = ExposureDelta::reserve(
                    &order.terms.account_id,
                    &order.terms.symbol,
                    order.terms.side,
                    -i64::from(r.decrease()),
                );
                let settles = ActionMove {
                    action_id: &msg.action_id,
                    from: &worker::UNSETTLED,
                    to: ActionStatus::Succeeded,
                    error: None,
                    at: now,
                };
                if !st
                    .store
                    .replace_order(&order, &next, &freed, Some(&settles))
                    .await?
                {
                    continue; // The order moved (a fill recorded meanwhile): read again.
                }
                if worker::order_status(ack.status) != next.status
                    || ack.filled_quantity != next.filled_quantity
                {
                    worker::record(st, &next, &ack, now, None).await?;
                }
                return Ok((Outcome::Succeeded, true));
            }
            ReplaceOutcome::Rejected { order: ack, reason } => {
                // The order stays as it was; what the broker says of it now is recorded.
                worker::record(st, &order, &ack, now, None).await?;
                let why = format!("the broker rejected the change of order {id}: {reason}");
                return refuse(st, msg, r, why).await;
            }
            ReplaceOutcome::Unknown => {
                let why = format!("the broker does not know order {id}");
                return refuse(st, msg, r, why).await;
            }
        }
    }
    Err(ApiError::unavailable(format!(
        "order {id}: too many concurrent changes"
    )))
}

/// The change ends without changing the order: the action fails with `why`, and the
/// increase reserved at execute is released in the same write.
async fn refuse(
    st: &Worker,
    msg: &QueueMessage,
    r: &NormalizedReplace,
    why: String,
) -> Result<(Outcome, bool), ApiError> {
    release(st, &msg.action_id, r, &why).await?;
    Ok((Outcome::Failed(why), true))
}

async fn release(
    st: &Worker,
    action_id: &str,
    r: &NormalizedReplace,
    why: &str,
) -> Result<bool, ApiError> {
    let t = &r.order.terms;
    let released =
        ExposureDelta::reserve(&t.account_id, &t.symbol, t.side, -i64::from(r.increase()));
    let settles = ActionMove {
        action_id,
        from: &worker::UNSETTLED,
        to: ActionStatus::Failed,
        error: Some(why),
        at: st.clock.now_ms(),
    };
    Ok(st.store.settle_with_exposure(&released, &settles).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(quantity: u32, limit: &str) -> NormalizedReplace {
        let price = |s: &str| Some(Price::parse(s).unwrap());
        NormalizedReplace {
            order: NormalizedOrder {
                terms: OrderTerms {
                    account_id: "ACC-1".into(),
                    symbol: "CLF27".into(),
                    side: Side::Buy,
                    quantity,
                    order_type: OrderType::Limit,
                    limit_price: price(limit),
                    stop_price: None,
                    time_in_force: TimeInForce::Day,
                },
                contract_month: None,
                last_trade_date: None,
                market_protection: None,
            },
            order_id: "ord_1".into(),
            replaces: Replaced {
                order_id: "ord_1".into(),
                version: 1,
                quantity: 2,
                filled_quantity: 0,
                limit_price: price("71.25"),
                stop_price: None,
                time_in_force: TimeInForce::Day,
            },
        }
    }

    #[test]
    fn the_preview_says_what_changes() {
        assert_eq!(
            replace_preview(&change(3, "71.20")),
            "Change order ord_1 on ACC-1: buy 2 -> 3 CLF27, limit 71.25 -> 71.20, day order."
        );
        assert_eq!(
            replace_preview(&change(1, "71.25")),
            "Change order ord_1 on ACC-1: buy 2 -> 1 CLF27, limit 71.25, day order."
        );
    }

    #[test]
    fn only_a_pure_reduction_reduces_risk() {
        assert!(change(1, "71.25").only_reduces());
        assert!(!change(1, "71.20").only_reduces(), "a price move adds risk");
        assert!(!change(3, "71.25").only_reduces());
        let a = ReplaceCl;
        let p = |r| NormalizedPayload::OrderReplaceCl(r);
        assert_eq!(
            a.confirmed_as(&p(change(1, "71.25"))),
            ActionType::OrderCancel
        );
        assert_eq!(
            a.confirmed_as(&p(change(3, "71.25"))),
            ActionType::OrderReplaceCl
        );
    }

    #[test]
    fn only_what_the_change_adds_counts_against_the_limit() {
        let pol = Policy {
            max_position: 5,
            ..Policy::default()
        };
        let now = chrono::Utc::now();
        // Long 2 with this order's rest of 2 working: 4 of 5. Going to 3 adds one: 5 of 5.
        let exposure = Exposure {
            position: 2,
            open_buy: 2,
            open_sell: 0,
        };
        let flat = DayPnl::of(chrono::NaiveDate::default(), &[]);
        let ok = position_checks(&pol, now, &change(3, "71.25"), exposure, 0, &flat).unwrap();
        let limit = ok.iter().find(|c| c.name == "position_limit").unwrap();
        assert!(!limit.failed(), "{limit:?}");
        let too_far = position_checks(&pol, now, &change(4, "71.25"), exposure, 0, &flat).unwrap();
        let limit = too_far.iter().find(|c| c.name == "position_limit").unwrap();
        assert!(limit.failed(), "{limit:?}");
    }
}
