//! The named risk checks. Each returns one [`RiskCheck`] with a reason precise enough to
//! relay to a trader ("CLZ26 stopped trading at 13:30 CT on 2026-11-20").

use chrono::{DateTime, Utc};

use super::Policy;
use super::{Control, RiskCheck, RolloutMode};
use crate::core::domain::calendar::{chicago_label, ExchangeCalendar, MarketState};
use crate::core::domain::cl::ClContract;
use crate::core::domain::pnl::DayPnl;
use crate::core::domain::{
    Account, AccountStatus, ActionType, Exposure, Order, OrderSubmitCl, OrderType, Price, Quote,
    Side, TimeInForce,
};

/// Everything an `order.submit.cl` check looks at.
pub struct OrderInputs<'a> {
    pub policy: &'a Policy,
    pub calendar: &'a ExchangeCalendar,
    pub now: DateTime<Utc>,
    pub account_id: &'a str,
    pub order: &'a OrderSubmitCl,
    /// Parsed symbol, if it parses.
    pub contract: Option<ClContract>,
    /// The account's filled position and open orders in that contract.
    pub exposure: Exposure,
    /// The reference price the price band is measured from, with its time, if one is known.
    pub reference: Option<Quote>,
    /// The account's P&L on the trading day, for `daily_loss`; `None`: not measured (the
    /// check passes, and a loss does not make the account close-only).
    pub day_pnl: Option<&'a DayPnl>,
}

pub struct CancelInputs<'a> {
    pub policy: &'a Policy,
    pub account: &'a Account,
    pub order: Option<&'a Order>,
    pub order_id: &'a str,
}

pub fn action_enabled(control: &Control, a: ActionType) -> RiskCheck {
    match control.mode(a) {
        RolloutMode::Execute => {
            RiskCheck::pass("action_enabled", format!("{a} is enabled for execution"))
        }
        RolloutMode::PlanOnly => RiskCheck::fail(
            "action_enabled",
            format!("{a} is in plan_only rollout mode: plans can be reviewed but not executed"),
        ),
        RolloutMode::Disabled => RiskCheck::fail("action_enabled", format!("{a} is disabled")),
    }
}

/// `adds_risk`: the action can add risk (it fails while the switch is engaged); one that
/// reduces risk passes.
pub fn kill_switch(control: &Control, adds_risk: bool) -> RiskCheck {
    if control.trade_execute_enabled {
        RiskCheck::pass("kill_switch", "trading is enabled (kill switch released)")
    } else if adds_risk {
        RiskCheck::fail(
            "kill_switch",
            "the kill switch is engaged: no order can be submitted until an operator releases it",
        )
    } else {
        RiskCheck::pass(
            "kill_switch",
            "the kill switch is engaged, but this action reduces risk and stays available",
        )
    }
}

pub fn account_allowed(policy: &Policy, a: &Account) -> RiskCheck {
    if a.status != AccountStatus::Active {
        return RiskCheck::fail(
            "account_allowed",
            format!("account {} is {}, not active", a.account_id, a.status),
        );
    }
    account_listed(policy, &a.account_id)
}

/// The policy's list of trading accounts (the account's status is checked apart: at
/// execute it is a condition of the atomic commit).
pub fn account_listed(policy: &Policy, account_id: &str) -> RiskCheck {
    match &policy.allowed_accounts {
        Some(list) if !list.iter().any(|x| x == account_id) => RiskCheck::fail(
            "account_allowed",
            format!("account {account_id} is not on the policy's list of trading accounts"),
        ),
        _ => RiskCheck::pass("account_allowed", format!("account {account_id} is active")),
    }
}

/// The checks of `order.submit.cl` at plan time, in the contract's order.
pub fn check_order_submit(i: &OrderInputs, account: &Account, control: &Control) -> Vec<RiskCheck> {
    let a = ActionType::OrderSubmitCl;
    let mut out = vec![
        action_enabled(control, a),
        kill_switch(control, a.can_add_risk()),
        account_allowed(i.policy, account),
        symbol_valid(i),
        symbol_allowed(i),
    ];
    out.extend(time_and_size_checks(i));
    out.push(daily_loss(i));
    out.push(price_on_tick(i));
    out.push(price_band(i));
    out.push(order_type_valid(i));
    out
}

/// Every check execute re-runs, because it can change between plan and execute (the
/// policy, the clock, the position and open orders): `account_allowed` (the policy's
/// list; the account's status is a condition of the commit), `symbol_allowed`,
/// `contract_not_expired`, `expiry_window`, `market_open`, `max_order_size`,
/// `position_limit`, `price_on_tick`, `price_band`.
pub fn recheck_order_at_execute(i: &OrderInputs) -> Vec<RiskCheck> {
    let mut out = recheck_order_without_position(i);
    out.push(expiry_window(i));
    out.push(position_limit(i));
    out.push(daily_loss(i));
    out
}

/// The re-checks that do not depend on the position (`i.exposure` is ignored): execute
/// runs these, and checks the position ones as a condition of its atomic commit
/// ([`reservation_bound`]).
pub fn recheck_order_without_position(i: &OrderInputs) -> Vec<RiskCheck> {
    vec![
        account_listed(i.policy, i.account_id),
        symbol_allowed(i),
        contract_not_expired(i),
        market_open(i),
        max_order_size(i),
        price_on_tick(i),
        price_band(i),
    ]
}

/// The checks the worker re-runs just before an order first goes to the broker, besides
/// the kill switch and the position gate: anything that can change while an order waits
/// in the queue (the policy's lists, the clock, the reference price and its age). The
/// account's status is read apart.
pub fn recheck_at_worker(i: &OrderInputs) -> Vec<RiskCheck> {
    vec![
        account_listed(i.policy, i.account_id),
        symbol_allowed(i),
        contract_not_expired(i),
        market_open(i),
        max_order_size(i),
        price_band(i),
    ]
}

/// How far the worst case on the order's side may go after the order: `max_position`
/// each way, or zero in the close-only window or past the daily loss limit (only orders
/// that reduce the position without flipping it, even if every open order on that side
/// fills).
fn side_cap(i: &OrderInputs) -> i64 {
    if in_close_only_window(i)
        || i.day_pnl
            .is_some_and(|p| p.breaches(i.policy.max_daily_loss))
    {
        0
    } else {
        i.policy.max_position as i64
    }
}

/// The worst case on the order's side after it: for a buy the position plus every open
/// buy plus this order; for a sell the position minus every open sell minus this order.
fn worst_after(i: &OrderInputs) -> i64 {
    let q = i.order.quantity.get() as i64;
    match i.order.side {
        Side::Buy => i.exposure.worst_long().saturating_add(q),
        Side::Sell => i.exposure.worst_short().saturating_sub(q),
    }
}

/// The bound on the worst case of the order's side before it, for which `position_limit`
/// and `expiry_window` pass (given the other re-checks pass): a buy needs
/// `position + open_buy <= bound`, a sell `position - open_sell >= bound`. Execute checks
/// the stored exposure against it inside its atomic commit and reserves the order's
/// contracts in the same write; a property test proves it exact. `i.exposure` is ignored.
pub fn reservation_bound(i: &OrderInputs) -> i64 {
    let q = i.order.quantity.get() as i64;
    let cap = side_cap(i);
    match i.order.side {
        Side::Buy => cap - q,
        Side::Sell => q - cap,
    }
}

/// The worker's last check before the broker: with this order's own contracts already
/// counted in `i.exposure` (reserved at execute), the worst case on its side must still be
/// within the limit. A policy lowered, or a sync that raised the position, after execute
/// stops the order here. `Err`: why.
pub fn position_gate(i: &OrderInputs) -> Result<(), String> {
    let cap = side_cap(i);
    let (worst, ok) = match i.order.side {
        Side::Buy => (i.exposure.worst_long(), i.exposure.worst_long() <= cap),
        Side::Sell => (i.exposure.worst_short(), i.exposure.worst_short() >= -cap),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} in {}: the worst case with open orders is {worst:+}, beyond the limit of {cap} on that side",
            i.account_id, i.order.symbol
        ))
    }
}

/// Whether the contract is tradable but within the policy's close-only window.
fn in_close_only_window(i: &OrderInputs) -> bool {
    let Some(c) = i.contract else { return false };
    if i.now >= c.trading_stops_at(i.calendar) {
        return false;
    }
    let left = i
        .calendar
        .business_days_between(chicago_date(i.now), c.last_trade_date(i.calendar));
    left <= i.policy.close_only_business_days as i64
}

fn time_and_size_checks(i: &OrderInputs) -> Vec<RiskCheck> {
    vec![
        contract_not_expired(i),
        expiry_window(i),
        market_open(i),
        max_order_size(i),
        position_limit(i),
    ]
}

fn symbol_valid(i: &OrderInputs) -> RiskCheck {
    match ClContract::parse(&i.order.symbol) {
        Err(e) => RiskCheck::fail("symbol_valid", e.to_string()),
        Ok(c) => {
            let expired = i.now >= c.trading_stops_at(i.calendar);
            match c.listed_on(chicago_date(i.now)) {
                Err(why) if !expired => RiskCheck::fail("symbol_valid", why),
                _ => RiskCheck::pass(
                    "symbol_valid",
                    format!(
                        "{} is NYMEX WTI crude, contract month {}",
                        c.symbol(),
                        c.contract_month()
                    ),
                ),
            }
        }
    }
}

fn symbol_allowed(i: &OrderInputs) -> RiskCheck {
    match &i.contract {
        None => RiskCheck::fail("symbol_allowed", "no valid symbol to check"),
        Some(c) if i.policy.allowed_symbols.iter().any(|s| s == "CL") => RiskCheck::pass(
            "symbol_allowed",
            format!("{} is on the allowed list", c.symbol()),
        ),
        Some(c) => RiskCheck::fail(
            "symbol_allowed",
            format!(
                "CL contracts such as {} are not on the policy's allowed list",
                c.symbol()
            ),
        ),
    }
}

fn chicago_date(t: DateTime<Utc>) -> chrono::NaiveDate {
    t.with_timezone(&chrono_tz::America::Chicago).date_naive()
}

pub fn contract_not_expired(i: &OrderInputs) -> RiskCheck {
    let Some(c) = i.contract else {
        return RiskCheck::fail("contract_not_expired", "no valid symbol to check");
    };
    let stops = c.trading_stops_at(i.calendar);
    if i.now >= stops {
        RiskCheck::fail(
            "contract_not_expired",
            format!("{} stopped trading at {}", c.symbol(), chicago_label(stops)),
        )
    } else if !i.calendar.covers(c.last_trade_date(i.calendar)) {
        RiskCheck::warn(
            "contract_not_expired",
            format!(
                "{} trades until {}, computed without the exchange holiday table (it ends before that year)",
                c.symbol(),
                chicago_label(stops)
            ),
        )
    } else {
        RiskCheck::pass(
            "contract_not_expired",
            format!("{} trades until {}", c.symbol(), chicago_label(stops)),
        )
    }
}

/// Whether the order only reduces the position, never flips it, even if every open
/// order on its side fills too.
fn reduces_position(i: &OrderInputs) -> bool {
    match i.order.side {
        Side::Buy => worst_after(i) <= 0,
        Side::Sell => worst_after(i) >= 0,
    }
}

fn exposure_text(i: &OrderInputs) -> String {
    let e = &i.exposure;
    match (e.open_buy, e.open_sell) {
        (0, 0) => format!("{} holds {:+}", i.account_id, e.position),
        (b, s) => format!(
            "{} holds {:+} with open orders to buy {b} and sell {s}",
            i.account_id, e.position
        ),
    }
}

pub fn expiry_window(i: &OrderInputs) -> RiskCheck {
    let Some(c) = i.contract else {
        return RiskCheck::fail("expiry_window", "no valid symbol to check");
    };
    let ltd = c.last_trade_date(i.calendar);
    let left = i.calendar.business_days_between(chicago_date(i.now), ltd);
    let window = i.policy.close_only_business_days as i64;
    if i.now >= c.trading_stops_at(i.calendar) {
        return RiskCheck::fail("expiry_window", format!("{} has expired", c.symbol()));
    }
    if !in_close_only_window(i) {
        return RiskCheck::pass(
            "expiry_window",
            format!("{left} business days to the last trading day {ltd}"),
        );
    }
    if reduces_position(i) {
        RiskCheck::pass(
            "expiry_window",
            format!(
                "{} is in its close-only window (last trading day {ltd}); this order reduces the position ({}) without flipping it",
                c.symbol(),
                exposure_text(i)
            ),
        )
    } else {
        RiskCheck::fail(
            "expiry_window",
            format!(
                "{} is within {window} business days of its last trading day {ltd}: only orders that reduce the position without flipping it, counting open orders, pass, and {}",
                c.symbol(),
                exposure_text(i)
            ),
        )
    }
}

/// `daily_loss`: past the daily loss limit only orders that reduce the position without
/// flipping it, counting open orders, pass (`super::daily_loss`).
pub fn daily_loss(i: &OrderInputs) -> RiskCheck {
    let (limit, reduces) = (i.policy.max_daily_loss, reduces_position(i));
    super::daily_loss::check(limit, i.day_pnl, i.account_id, reduces, &exposure_text(i))
}

/// The worker's `daily_loss` before the broker, with this order's own contracts already
/// counted in `i.exposure` (reserved at execute). `Err`: why.
pub fn daily_loss_gate(i: &OrderInputs) -> Result<(), String> {
    let reduces = match i.order.side {
        Side::Buy => i.exposure.worst_long() <= 0,
        Side::Sell => i.exposure.worst_short() >= 0,
    };
    let (limit, side) = (i.policy.max_daily_loss, i.order.side);
    let text = exposure_text(i);
    super::daily_loss::gate(limit, i.day_pnl, i.account_id, side, reduces, &text)
}

pub fn market_open(i: &OrderInputs) -> RiskCheck {
    match i.calendar.market_state(i.now) {
        MarketState::Open { closes_at } => RiskCheck::pass(
            "market_open",
            format!("CME Globex is open until {}", chicago_label(closes_at)),
        ),
        MarketState::Closed { reason, reopens_at } => {
            let extra = match i.order.time_in_force {
                TimeInForce::Ioc | TimeInForce::Fok => " IOC and FOK orders need an open market.",
                _ => "",
            };
            RiskCheck::fail(
                "market_open",
                format!(
                    "CME Globex is closed for {reason}; it reopens at {}.{extra}",
                    chicago_label(reopens_at)
                ),
            )
        }
    }
}

pub fn max_order_size(i: &OrderInputs) -> RiskCheck {
    let q = i.order.quantity.get();
    let max = i.policy.max_order_size;
    if q <= max {
        RiskCheck::pass(
            "max_order_size",
            format!("{q} contracts, within the limit of {max}"),
        )
    } else {
        RiskCheck::fail(
            "max_order_size",
            format!("{q} contracts exceeds the maximum order size of {max}"),
        )
    }
}

/// The limit holds against the worst case: the position plus every open order on the
/// order's side plus the order itself stays within `max_position` on that side.
pub fn position_limit(i: &OrderInputs) -> RiskCheck {
    let after = worst_after(i);
    let max = i.policy.max_position as i64;
    let sym = i
        .contract
        .map(|c| c.symbol())
        .unwrap_or_else(|| i.order.symbol.clone());
    let text = format!(
        "{} {sym}; if this order and every open {} order fill: {after:+} (limit {max} either way)",
        exposure_text(i),
        i.order.side
    );
    if i.order.side.sign().saturating_mul(after) <= max {
        RiskCheck::pass("position_limit", text)
    } else {
        RiskCheck::fail("position_limit", text)
    }
}

/// The order's limit and stop prices that are set, by field name.
fn order_prices<'a>(i: &OrderInputs<'a>) -> Vec<(&'static str, Price)> {
    [
        ("limit_price", i.order.limit_price),
        ("stop_price", i.order.stop_price),
    ]
    .into_iter()
    .filter_map(|(n, p)| p.map(|p| (n, p)))
    .collect()
}

/// Limit and stop prices within the policy's band around a fresh reference price. The
/// reference must be known and no older than `max_quote_age_seconds` for any order: it
/// bands the order's prices, protects a market order, and values every order. Checked
/// arithmetic throughout: a price near the decimal limits fails the check, never panics.
pub fn price_band(i: &OrderInputs) -> RiskCheck {
    const NAME: &str = "price_band";
    let prices = order_prices(i);
    let symbol = &i.order.symbol;
    let Some(quote) = i.reference else {
        return match (i.order.order_type, prices.is_empty()) {
            (OrderType::Market, _) => RiskCheck::fail(
                NAME,
                format!("no reference price for {symbol}, so a market order cannot be protected (sent as a limit within market_protection_points of it); it is not sent"),
            ),
            (_, true) => RiskCheck::pass(NAME, "no price to check"),
            (_, false) => RiskCheck::fail(
                NAME,
                format!("no reference price for {symbol}, so its prices cannot be checked"),
            ),
        };
    };
    let reference = quote.price;
    let age = quote.age_seconds(i.now.timestamp_millis());
    if let Some(max) = i.policy.max_quote_age_seconds {
        let refresh =
            format!("refresh the market data (paper broker: `airlock prices {symbol} PRICE`)");
        match age {
            None => {
                return RiskCheck::fail(
                    NAME,
                    format!("the reference price of {symbol} ({reference}) has no time, so it cannot be shown fresh (max_quote_age_seconds {max}); {refresh}"),
                )
            }
            Some(a) if a > i64::from(max) => {
                return RiskCheck::fail(
                    NAME,
                    format!("the reference price of {symbol} ({reference}) is {a} s old, older than max_quote_age_seconds {max}; {refresh}"),
                )
            }
            Some(_) => {}
        }
    }
    let r = reference.value();
    let band = r
        .abs()
        .checked_mul(i.policy.price_band_pct)
        .and_then(|x| x.checked_div(rust_decimal::Decimal::ONE_HUNDRED))
        .map(|x| x.max(i.policy.price_band_min));
    for (name, p) in &prices {
        let distance = p.value().checked_sub(r).map(|d| d.abs());
        match (distance, band) {
            (Some(d), Some(b)) if d <= b => {}
            _ => {
                return RiskCheck::fail(
                    NAME,
                    format!(
                        "{name} {p} is more than {}% (at least {}) away from the reference price {reference}",
                        i.policy.price_band_pct, i.policy.price_band_min
                    ),
                )
            }
        }
    }
    let observed = match age {
        Some(a) => format!("observed {a} s ago"),
        None => "of unknown age".into(),
    };
    let what = if prices.is_empty() {
        "no price to check; the reference price is".to_string()
    } else {
        format!(
            "prices within {}% of the reference price",
            i.policy.price_band_pct
        )
    };
    RiskCheck::pass(NAME, format!("{what} {reference} ({observed})"))
}

pub fn price_on_tick(i: &OrderInputs) -> RiskCheck {
    let prices = order_prices(i);
    if prices.is_empty() {
        return RiskCheck::pass("price_on_tick", "no price to check");
    }
    for (name, p) in &prices {
        if !p.on_tick(i.policy.tick) {
            return RiskCheck::fail(
                "price_on_tick",
                format!(
                    "{name} {p} is not on the {} tick; round it, e.g. to {}",
                    i.policy.tick,
                    Price::new(p.value().round_dp(2))
                ),
            );
        }
        if p.value().is_sign_negative() && !p.value().is_zero() && !i.policy.allow_negative_prices {
            return RiskCheck::fail(
                "price_on_tick",
                format!("{name} {p} is negative, and the policy does not allow negative prices"),
            );
        }
    }
    RiskCheck::pass(
        "price_on_tick",
        format!("prices are on the {} tick", i.policy.tick),
    )
}

fn order_type_valid(i: &OrderInputs) -> RiskCheck {
    let o = i.order;
    let (needs_limit, needs_stop) = match o.order_type {
        OrderType::Market => (false, false),
        OrderType::Limit => (true, false),
        OrderType::Stop => (false, true),
        OrderType::StopLimit => (true, true),
    };
    let mut problems = Vec::new();
    match (needs_limit, o.limit_price.is_some()) {
        (true, false) => problems.push("needs a limit_price"),
        (false, true) => problems.push("must not carry a limit_price"),
        _ => {}
    }
    match (needs_stop, o.stop_price.is_some()) {
        (true, false) => problems.push("needs a stop_price"),
        (false, true) => problems.push("must not carry a stop_price"),
        _ => {}
    }
    if problems.is_empty() {
        RiskCheck::pass(
            "order_type_valid",
            format!(
                "{} order with {} time in force",
                o.order_type, o.time_in_force
            ),
        )
    } else {
        RiskCheck::fail(
            "order_type_valid",
            format!("a {} order {}", o.order_type, problems.join(" and ")),
        )
    }
}

/// `order.cancel`: the order exists on that account and can still be cancelled.
pub fn check_order_cancel(i: &CancelInputs, control: &Control) -> Vec<RiskCheck> {
    let a = ActionType::OrderCancel;
    let exists = match i.order {
        Some(o) if o.terms.account_id == i.account.account_id => RiskCheck::pass(
            "order_exists",
            format!("order {} is on account {}", o.order_id, o.terms.account_id),
        ),
        _ => RiskCheck::fail(
            "order_exists",
            format!(
                "no order {} on account {}",
                i.order_id, i.account.account_id
            ),
        ),
    };
    let cancellable = match i.order {
        Some(o) if o.terms.account_id == i.account.account_id && o.status.is_cancellable() => {
            RiskCheck::pass(
                "order_cancellable",
                format!("order {} is {}", o.order_id, o.status),
            )
        }
        Some(o) if o.terms.account_id == i.account.account_id => RiskCheck::fail(
            "order_cancellable",
            format!(
                "order {} is already {} and cannot be cancelled",
                o.order_id, o.status
            ),
        ),
        _ => RiskCheck::fail("order_cancellable", "no such order to cancel"),
    };
    vec![
        action_enabled(control, a),
        kill_switch(control, a.can_add_risk()),
        account_allowed(i.policy, i.account),
        exists,
        cancellable,
    ]
}

/// `positions.sync`: the account is active.
pub fn check_positions_sync(
    policy: &Policy,
    account: &Account,
    control: &Control,
) -> Vec<RiskCheck> {
    let a = ActionType::PositionsSync;
    let mut account_check = account_allowed(policy, account);
    // Syncing a listed but non-trading account is still fine; only an inactive one fails.
    if account.status == AccountStatus::Active && account_check.failed() {
        account_check = RiskCheck::pass(
            "account_allowed",
            format!("account {} is active", account.account_id),
        );
    }
    vec![
        action_enabled(control, a),
        kill_switch(control, a.can_add_risk()),
        account_check,
    ]
}

/// Fixtures the policy's tests share: an order and its inputs.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::domain::{Ident, Quantity};
    use proptest::prelude::*;

    fn account() -> Account {
        Account {
            account_id: "ACC-1".into(),
            name: "A".into(),
            desk: "energy".into(),
            currency: "USD".into(),
            status: AccountStatus::Active,
        }
    }

    /// A market order on ACC-1 in CLF27.
    pub(crate) fn order(side: Side, q: u32) -> OrderSubmitCl {
        OrderSubmitCl {
            account_id: Ident::parse("ACC-1").unwrap(),
            symbol: "CLF27".into(),
            side,
            quantity: Quantity::new(q as i64).unwrap(),
            order_type: OrderType::Market,
            limit_price: None,
            stop_price: None,
            time_in_force: TimeInForce::Day,
        }
    }

    proptest! {
        /// The bound execute checks atomically agrees exactly with the position checks,
        /// at every position and open quantity around the limits (the edges matter).
        #[test]
        fn reservation_bound_matches_the_checks(
            buy in any::<bool>(),
            q in 1u32..40,
            max in 1u32..60,
            close_only in any::<bool>(),
            open_buy in 0i64..70,
            open_sell in 0i64..70,
        ) {
            let policy = Policy { max_position: max, max_order_size: 100, ..Policy::default() };
            let cal = ExchangeCalendar::cme();
            // CLF27 stops on 2026-12-21; 12-17 is inside the 2-day window, 11-23 is not.
            let at = if close_only { "2026-12-17T15:00:00Z" } else { "2026-11-23T15:00:00Z" };
            let now: DateTime<Utc> = at.parse().unwrap();
            let o = order(if buy { Side::Buy } else { Side::Sell }, q);
            let acc = account();
            for pos in -150i64..=150 {
                let i = OrderInputs {
                    policy: &policy,
                    calendar: cal,
                    now,
                    account_id: &acc.account_id,
                    order: &o,
                    contract: ClContract::parse("CLF27").ok(),
                    exposure: Exposure { position: pos, open_buy, open_sell },
                    reference: None,
                    day_pnl: None,
                };
                let checks_pass = !position_limit(&i).failed() && !expiry_window(&i).failed();
                let bound = reservation_bound(&i);
                prop_assert_eq!(checks_pass, i.exposure.leaves_room(o.side, bound), "exposure {:?} bound {}", i.exposure, bound);
                // Whatever passes, the worst case after the order is within the limit.
                if checks_pass {
                    let after = worst_after(&i);
                    prop_assert!(after.abs() <= max as i64 || o.side.sign() * after < 0);
                }
            }
        }

        /// The worker's gate, with the order's own contracts already reserved, passes
        /// exactly when the checks passed for the order before its reservation.
        #[test]
        fn worker_gate_matches_the_checks(
            buy in any::<bool>(),
            q in 1u32..40,
            max in 1u32..60,
            close_only in any::<bool>(),
            pos in -100i64..100,
            open_buy in 0i64..70,
            open_sell in 0i64..70,
        ) {
            let policy = Policy { max_position: max, max_order_size: 100, ..Policy::default() };
            let cal = ExchangeCalendar::cme();
            let at = if close_only { "2026-12-17T15:00:00Z" } else { "2026-11-23T15:00:00Z" };
            let now: DateTime<Utc> = at.parse().unwrap();
            let o = order(if buy { Side::Buy } else { Side::Sell }, q);
            let before = Exposure { position: pos, open_buy, open_sell };
            let mut reserved = before;
            match o.side {
                Side::Buy => reserved.open_buy += q as i64,
                Side::Sell => reserved.open_sell += q as i64,
            }
            let at_plan = OrderInputs {
                policy: &policy, calendar: cal, now, account_id: "ACC-1", order: &o,
                contract: ClContract::parse("CLF27").ok(), exposure: before, reference: None,
                day_pnl: None,
            };
            let at_worker = OrderInputs { exposure: reserved, ..at_plan };
            let checks_pass = !position_limit(&at_plan).failed() && !expiry_window(&at_plan).failed();
            prop_assert_eq!(checks_pass, position_gate(&at_worker).is_ok());
        }
    }

    /// The inputs of an order on ACC-1 in CLF27 at [`NOW_MS`], with no exposure, no day's
    /// P&L, and the reference price given (observed 10 s before).
    pub(crate) fn inputs<'a>(
        policy: &'a Policy,
        o: &'a OrderSubmitCl,
        reference: Option<&str>,
    ) -> OrderInputs<'a> {
        OrderInputs {
            policy,
            calendar: ExchangeCalendar::cme(),
            now: "2026-11-23T15:00:00Z".parse().unwrap(),
            account_id: "ACC-1",
            order: o,
            contract: ClContract::parse("CLF27").ok(),
            exposure: Exposure::default(),
            reference: reference.map(|r| Quote {
                price: Price::new(r.parse().unwrap()),
                observed_at: Some(NOW_MS - 10_000),
            }),
            day_pnl: None,
        }
    }

    /// 2026-11-23T15:00:00Z, the `now` of [`inputs`].
    const NOW_MS: i64 = 1_795_446_000_000;

    #[test]
    fn price_band_is_checked_without_overflow() {
        let policy = Policy::default();
        let mut o = order(Side::Buy, 1);
        o.order_type = OrderType::Limit;
        for (price, reference, pass) in [
            ("70.00", Some("70.00"), true),
            ("84.00", Some("70.00"), true),
            ("84.01", Some("70.00"), false),
            ("-79228162514264337593543950335", Some("70.00"), false),
            ("79228162514264337593543950335", Some("-70.00"), false),
            ("0.50", Some("0.00"), true),
            ("70.00", None, false),
        ] {
            o.limit_price = Some(Price::new(price.parse().unwrap()));
            let c = price_band(&inputs(&policy, &o, reference));
            assert_eq!(
                !c.failed(),
                pass,
                "{price} around {reference:?}: {}",
                c.reason
            );
        }
        // A market order without a reference price cannot be protected: it fails.
        o.order_type = OrderType::Market;
        o.limit_price = None;
        let c = price_band(&inputs(&policy, &o, None));
        assert!(
            c.failed() && c.reason.contains("cannot be protected"),
            "{}",
            c.reason
        );
    }

    #[test]
    fn a_stale_or_timeless_reference_price_fails_the_band_with_its_age() {
        let policy = Policy {
            max_quote_age_seconds: Some(60),
            ..Policy::default()
        };
        let mut o = order(Side::Buy, 1);
        o.order_type = OrderType::Limit;
        o.limit_price = Some(Price::new("70.00".parse().unwrap()));
        let mut i = inputs(&policy, &o, Some("70.00"));
        assert_eq!(i.now.timestamp_millis(), NOW_MS);
        let at = |i: &mut OrderInputs, observed_at: Option<i64>| {
            if let Some(q) = i.reference.as_mut() {
                q.observed_at = observed_at;
            }
            price_band(i)
        };
        let fresh = at(&mut i, Some(NOW_MS - 60_000));
        assert!(
            !fresh.failed() && fresh.reason.contains("observed 60 s ago"),
            "{}",
            fresh.reason
        );
        // Stamped ahead of this clock (another process's): as fresh as now.
        assert!(!at(&mut i, Some(NOW_MS + 5_000)).failed());
        let stale = at(&mut i, Some(NOW_MS - 61_000));
        assert!(
            stale.failed() && stale.reason.contains("61 s old"),
            "{}",
            stale.reason
        );
        let timeless = at(&mut i, None);
        assert!(
            timeless.failed() && timeless.reason.contains("has no time"),
            "{}",
            timeless.reason
        );
        // No age limit: any age passes.
        let open = Policy {
            max_quote_age_seconds: None,
            ..Policy::default()
        };
        i.policy = &open;
        assert!(!at(&mut i, None).failed());
        assert!(!at(&mut i, Some(NOW_MS - 86_400_000)).failed());
    }
}
