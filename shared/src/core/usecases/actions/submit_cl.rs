//! `order.submit.cl`: a new NYMEX WTI crude (CL) futures order. The plan checks it
//! against the policy, the calendar, the account's exposure and the reference price;
//! execute checks again what can change and reserves its contracts; the worker claims the
//! order, passes the kill switch and position gates, and sends it to the broker.

use async_trait::async_trait;
use serde_json::Value;

use super::{Action, AtExecute, Claimed, PayloadType, PlanContext, PlanTool, Worked};
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::cl::ClContract;
use crate::core::domain::payload::{NormalizedOrder, NormalizedPayload};
use crate::core::domain::{
    Account, ActionStatus, ActionType, ExposureDelta, Millis, Order, OrderSubmitCl, OrderTerms,
    OrderType, Price, Side, TimeInForce,
};
use crate::core::error::ApiError;
use crate::core::parse::from_value;
use crate::core::policy::{self, OrderInputs, Policy};
use crate::core::ports::Reservation;
use crate::core::ports::{PositionStore, Prices, Quote, Stored};
use crate::core::records::{ActionRecord, Control, PlanRecord, QueueMessage, RiskCheck};
use crate::core::usecases::execute::Executor;
use crate::core::usecases::plan::{Evaluated, Planner};
use crate::core::usecases::reads::visible_account;
use crate::core::usecases::worker::{self, Worker};

pub struct SubmitCl;

#[async_trait]
impl Action for SubmitCl {
    fn action_type(&self) -> ActionType {
        ActionType::OrderSubmitCl
    }

    fn plan_tool(&self) -> PlanTool {
        PlanTool {
            name: "plan_cl_order",
            title: "Plan a CL futures order",
            description: "Validate a NYMEX WTI crude oil (CL) order and run the risk checks. Returns a preview for the operator and, when executable, where the operator approves it. Places nothing.",
        }
    }

    fn payload_type(&self) -> PayloadType {
        PayloadType::of::<OrderSubmitCl>()
    }

    fn check_payload(&self, payload: &Value, at: &str) -> Result<(), ApiError> {
        if let Some(Value::String(sym)) = payload.get("symbol") {
            if !sym.is_empty() {
                crate::core::parse::check_text(&format!("{at}/symbol"), sym, MAX_SYMBOL_CHARS)?;
            }
        }
        from_value::<OrderSubmitCl>(payload.clone(), at).map(|_| ())
    }

    async fn evaluate(&self, cx: &PlanContext<'_>, payload: Value) -> Result<Evaluated, ApiError> {
        evaluate_order(cx, self.parsed(payload)?).await
    }

    fn weighs_notional(&self) -> bool {
        true
    }

    async fn at_execute(
        &self,
        ex: &Executor,
        plan: &PlanRecord,
        control: &Control,
    ) -> Result<AtExecute, ApiError> {
        // Every check that can change since the plan, under the policy in force now and at
        // the reference price read now; the position ones (with open orders) as a
        // condition of the commit, which also reserves the order's contracts.
        let (order, contract) = plan_order(plan)?;
        // The day's P&L and the reference price, side by side.
        let (day_pnl, reference) = execute_day_pnl_and_quote(ex, plan, contract).await?;
        let inputs = OrderInputs {
            policy: policy::in_force(&ex.policy, control),
            calendar: ExchangeCalendar::cme(),
            now: ex.clock.now(),
            account_id: &plan.account_id,
            order: &order,
            contract,
            exposure: Default::default(),
            reference,
            day_pnl: Some(&day_pnl),
        };
        let failed: Vec<RiskCheck> = policy::recheck_order_without_position(&inputs)
            .into_iter()
            .filter(RiskCheck::failed)
            .collect();
        if !failed.is_empty() {
            return Ok(AtExecute::Refuse(policy_violation(&failed)));
        }
        Ok(AtExecute::Go(Some(Reservation {
            side: order.side,
            bound: policy::reservation_bound(&inputs),
            delta: ExposureDelta::reserve(
                &plan.account_id,
                &order.symbol,
                order.side,
                order.quantity.get() as i64,
            ),
        })))
    }

    async fn position_violation(
        &self,
        ex: &Executor,
        plan: &PlanRecord,
        control: &Control,
    ) -> Result<Option<ApiError>, ApiError> {
        let (order, contract) = plan_order(plan)?;
        let exposure =
            order_inputs_exposure(ex.positions.as_ref(), &plan.account_id, contract).await?;
        let (day_pnl, reference) = execute_day_pnl_and_quote(ex, plan, contract).await?;
        let inputs = OrderInputs {
            policy: policy::in_force(&ex.policy, control),
            calendar: ExchangeCalendar::cme(),
            now: ex.clock.now(),
            account_id: &plan.account_id,
            order: &order,
            contract,
            exposure,
            reference,
            day_pnl: Some(&day_pnl),
        };
        let failed: Vec<RiskCheck> = policy::recheck_order_at_execute(&inputs)
            .into_iter()
            .filter(RiskCheck::failed)
            .collect();
        Ok((!failed.is_empty()).then(|| policy_violation(&failed)))
    }

    async fn claim(
        &self,
        w: &Worker,
        msg: &QueueMessage,
        now: Millis,
    ) -> Result<Option<Stored<Order>>, ApiError> {
        worker::claim_order(w, msg, now).await.map(Some)
    }

    async fn work(&self, w: &Worker, msg: &QueueMessage, claimed: Claimed) -> Worked {
        worker::submit(w, msg, claimed).await
    }

    async fn give_up(
        &self,
        w: &Worker,
        action: &ActionRecord,
        cause: &str,
    ) -> Result<(ActionStatus, Option<String>), ApiError> {
        worker::give_up_order(w, action, cause).await
    }
}

/// The longest `symbol` accepted, in characters. A symbol that is merely unknown is a failed
/// `symbol_valid` check, not a malformed request; one this long is neither.
const MAX_SYMBOL_CHARS: usize = 32;

/// The plan's order, as confirmed.
pub(crate) fn plan_order(
    plan: &PlanRecord,
) -> Result<(OrderSubmitCl, Option<ClContract>), ApiError> {
    let normalized = plan
        .normalized_payload
        .order()
        .ok_or_else(|| ApiError::internal(format!("plan {} holds no order", plan.plan_id)))?;
    let order = normalized.as_request().map_err(ApiError::internal)?;
    Ok((order, ClContract::parse(&normalized.terms.symbol).ok()))
}

/// The plan's account's P&L on the trading day, read again at execute.
pub(crate) async fn execute_day_pnl(
    ex: &Executor,
    plan: &PlanRecord,
) -> Result<crate::core::domain::pnl::DayPnl, ApiError> {
    crate::core::usecases::day_pnl::account_day_pnl(
        ex.positions.as_ref(),
        ex.prices.as_ref(),
        &plan.account_id,
        ex.clock.now(),
    )
    .await
}

/// The account's P&L on the trading day and the contract's quote, read as execute reads
/// them ([`crate::core::usecases::day_pnl::day_pnl_and_quote`]).
pub(crate) async fn execute_day_pnl_and_quote(
    ex: &Executor,
    plan: &PlanRecord,
    contract: Option<ClContract>,
) -> Result<(crate::core::domain::pnl::DayPnl, Option<Quote>), ApiError> {
    crate::core::usecases::day_pnl::day_pnl_and_quote(
        ex.positions.as_ref(),
        ex.prices.as_ref(),
        &plan.account_id,
        contract.map(|c| c.symbol()).as_deref(),
        ex.clock.now(),
    )
    .await
}

/// A refusal at execute naming every check that failed.
pub(crate) fn policy_violation(failed: &[RiskCheck]) -> ApiError {
    crate::core::usecases::execute::policy_violation(failed)
}

/// Barrels per CL contract.
pub const CL_CONTRACT_BARRELS: i64 = 1_000;

/// The notional of `quantity` contracts at `price`: absolute USD.
pub fn notional(quantity: u32, price: Price) -> rust_decimal::Decimal {
    // Saturates at the decimal range: above any four-eyes threshold, never a panic.
    (price.value().saturating_mul(rust_decimal::Decimal::from(
        quantity as i64 * CL_CONTRACT_BARRELS,
    )))
    .abs()
}

pub(super) fn tif_words(t: TimeInForce) -> &'static str {
    match t {
        TimeInForce::Day => "day order",
        TimeInForce::Gtc => "good till cancelled",
        TimeInForce::Ioc => "immediate or cancel",
        TimeInForce::Fok => "fill or kill",
    }
}

/// "Buy 2 CLF27 limit 68.50 on ACC-1, day order."; a protected market order: "Buy 2 CLF27
/// at market, protected: limit 68.90 (68.40 + 0.5) on ACC-1, day order."
pub fn order_preview(o: &NormalizedOrder) -> String {
    let verb = match o.terms.side {
        Side::Buy => "Buy",
        Side::Sell => "Sell",
    };
    let how = match (&o.market_protection, o.terms.limit_price) {
        (Some(p), Some(l)) => {
            let sign = match o.terms.side {
                Side::Buy => '+',
                Side::Sell => '-',
            };
            let asked = match p.requested_type {
                OrderType::Stop => format!("stop {}", p.from_price),
                _ => "at market".to_string(),
            };
            Some(format!(
                "{asked}, protected: limit {l} ({} {sign} {})",
                p.from_price, p.points
            ))
        }
        _ => None,
    };
    let how = how.unwrap_or_else(|| {
        match (o.terms.order_type, o.terms.limit_price, o.terms.stop_price) {
            (OrderType::Market, _, _) => "at market".to_string(),
            (OrderType::Limit, Some(l), _) => format!("limit {l}"),
            (OrderType::Stop, _, Some(s)) => format!("stop {s}"),
            (OrderType::StopLimit, Some(l), Some(s)) => format!("stop {s} limit {l}"),
            (t, _, _) => format!("as a {t} order (price missing)"),
        }
    });
    format!(
        "{verb} {} {} {how} on {}, {}.",
        o.terms.quantity,
        o.terms.symbol,
        o.terms.account_id,
        tif_words(o.terms.time_in_force)
    )
}

/// Shared by plan and execute: the account's exposure in the contract (its position and
/// open orders), an input of the `order.submit.cl` checks.
pub async fn order_inputs_exposure(
    positions: &dyn PositionStore,
    account_id: &str,
    contract: Option<ClContract>,
) -> Result<crate::core::domain::Exposure, ApiError> {
    Ok(match contract {
        Some(c) => positions.get_exposure(account_id, &c.symbol()).await?,
        None => crate::core::domain::Exposure::default(),
    })
}

/// The reference price of the contract (the paper broker's price table) and its time, for
/// the band.
pub(super) async fn reference_quote(
    state: &Planner,
    contract: Option<ClContract>,
) -> Result<Option<Quote>, ApiError> {
    quote_now(state.prices.as_ref(), contract).await
}

/// The contract's reference price and its time as the source has it now.
pub(crate) async fn quote_now(
    prices: &dyn Prices,
    contract: Option<ClContract>,
) -> Result<Option<Quote>, ApiError> {
    Ok(match contract {
        Some(c) => prices.quote(&c.symbol()).await?,
        None => None,
    })
}

/// `concentration` (what-if; `warn` at worst, never `fail`): the risk flags the order would
/// create, deepen or clear on its account's book, were it filled in full, with every
/// position at its reference price (`GET /portfolio/risk-flags`' flags and thresholds).
/// Other working orders are not assumed filled.
pub(super) async fn concentration_check(
    state: &Planner,
    account: &Account,
    o: &OrderSubmitCl,
    contract: ClContract,
    pol: &Policy,
) -> Result<RiskCheck, ApiError> {
    const NAME: &str = "concentration";
    let symbol = contract.symbol();
    let (book, reference) = crate::core::usecases::portfolio::account_book(
        state.positions.as_ref(),
        state.prices.as_ref(),
        account,
        &symbol,
    )
    .await?;
    let Some(reference) = reference else {
        return Ok(RiskCheck::warn(
            NAME,
            format!("no reference price for {symbol}: what the order does to the book's concentration cannot be computed"),
        ));
    };
    let quantity = i64::from(o.quantity.get());
    let delta = match o.side {
        Side::Buy => quantity,
        Side::Sell => -quantity,
    };
    let position = crate::core::domain::portfolio::Holding {
        account_id: account.account_id.clone(),
        desk: account.desk.clone(),
        symbol: symbol.clone(),
        quantity: 0,
        avg_price: None,
    };
    let w = crate::core::domain::portfolio::what_if(
        &book,
        &position,
        delta,
        Some(reference),
        crate::core::usecases::portfolio::trade_date(state.clock.now_ms()),
        ExchangeCalendar::cme(),
        &pol.portfolio_thresholds(),
    );
    let share = match w.month_percent_after {
        Some(p) => format!(
            "after the order {} would hold {p}% of the account's gross notional",
            contract.contract_month()
        ),
        None => format!(
            "after the order the account would hold no {} notional",
            contract.contract_month()
        ),
    };
    let list = |flags: &[crate::core::domain::portfolio::Flag]| {
        flags
            .iter()
            .map(|f| format!("{} ({})", f.kind, f.message))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut parts = vec![share];
    if !w.created.is_empty() {
        parts.push(format!("creates {}", list(&w.created)));
    }
    if !w.deepened.is_empty() {
        parts.push(format!("deepens {}", list(&w.deepened)));
    }
    if !w.cleared.is_empty() {
        parts.push(format!("clears {}", list(&w.cleared)));
    }
    let reason = parts.join("; ");
    Ok(if w.created.is_empty() && w.deepened.is_empty() {
        RiskCheck::pass(
            NAME,
            format!("{reason}; no risk flag created or made worse"),
        )
    } else {
        RiskCheck::warn(NAME, reason)
    })
}

async fn evaluate_order(cx: &PlanContext<'_>, o: OrderSubmitCl) -> Result<Evaluated, ApiError> {
    let PlanContext {
        planner: state,
        caller,
        control,
    } = *cx;
    let account = visible_account(state.accounts.as_ref(), caller, o.account_id.as_str()).await?;
    let cal = ExchangeCalendar::cme();
    let contract = ClContract::parse(&o.symbol).ok();
    // Every order is valued at the reference price, which the plan records (the four-eyes
    // rule, the approval page); a market order is protected from it, a stop order from
    // its stop price; the order's prices are banded around it.
    let symbol = contract.map(|c| c.symbol());
    let (exposure, (day_pnl, price_now)) = tokio::try_join!(
        order_inputs_exposure(state.positions.as_ref(), &account.account_id, contract),
        crate::core::usecases::day_pnl::day_pnl_and_quote(
            state.positions.as_ref(),
            state.prices.as_ref(),
            &account.account_id,
            symbol.as_deref(),
            state.clock.now(),
        )
    )?;
    let pol = policy::in_force(&state.policy, control);
    let (o, market_protection) = policy::protect(&o, price_now.map(|q| q.price), pol);
    let inputs = OrderInputs {
        policy: pol,
        calendar: cal,
        now: state.clock.now(),
        account_id: &account.account_id,
        order: &o,
        contract,
        exposure,
        reference: price_now,
        day_pnl: Some(&day_pnl),
    };
    let mut checks = policy::check_order_submit(&inputs, &account, control);
    if let Some(c) = contract {
        checks.push(concentration_check(state, &account, &o, c, inputs.policy).await?);
    }
    let normalized = NormalizedOrder {
        terms: OrderTerms {
            account_id: account.account_id.clone(),
            symbol: contract
                .map(|c| c.symbol())
                .unwrap_or_else(|| o.symbol.trim().to_ascii_uppercase()),
            side: o.side,
            quantity: o.quantity.get(),
            order_type: o.order_type,
            limit_price: o.limit_price,
            stop_price: o.stop_price,
            time_in_force: o.time_in_force,
        },
        contract_month: contract.map(|c| c.contract_month()),
        last_trade_date: contract.map(|c| c.last_trade_date(cal).to_string()),
        market_protection,
    };
    Ok(Evaluated {
        preview: order_preview(&normalized),
        normalized: NormalizedPayload::OrderSubmitCl(normalized),
        account,
        checks,
        reference: price_now,
        notional: price_now.map(|q| notional(o.quantity.get(), q.price)),
    })
}
