//! The named risk checks. Each returns one [`RiskCheck`] with a reason precise enough to
//! relay to a trader ("CLZ26 stopped trading at 13:30 CT on 2026-11-20").

use chrono::{DateTime, Utc};

use super::Policy;
use crate::domain::calendar::{chicago_label, ExchangeCalendar, MarketState};
use crate::domain::cl::ClContract;
use crate::domain::{
    Account, AccountStatus, ActionType, Order, OrderSubmitCl, OrderType, Price, Side, TimeInForce,
};
use crate::records::{Control, RiskCheck, RolloutMode};

/// Everything an `order.submit.cl` check looks at.
pub struct OrderInputs<'a> {
    pub policy: &'a Policy,
    pub calendar: &'a ExchangeCalendar,
    pub now: DateTime<Utc>,
    pub account_id: &'a str,
    pub order: &'a OrderSubmitCl,
    /// Parsed symbol, if it parses.
    pub contract: Option<ClContract>,
    /// The account's current signed position in that contract.
    pub position: i64,
}

pub struct CancelInputs<'a> {
    pub policy: &'a Policy,
    pub account: &'a Account,
    pub order: Option<&'a Order>,
    pub order_id: &'a str,
}

fn action_enabled(control: &Control, a: ActionType) -> RiskCheck {
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

fn kill_switch(control: &Control, a: ActionType) -> RiskCheck {
    if control.trade_execute_enabled {
        RiskCheck::pass("kill_switch", "trading is enabled (kill switch released)")
    } else if a.is_order_submission() {
        RiskCheck::fail(
            "kill_switch",
            "the kill switch is engaged: no order can be submitted until an operator releases it",
        )
    } else {
        RiskCheck::pass(
            "kill_switch",
            format!("the kill switch is engaged, but {a} reduces risk and stays available"),
        )
    }
}

fn account_allowed(policy: &Policy, a: &Account) -> RiskCheck {
    if a.status != AccountStatus::Active {
        return RiskCheck::fail(
            "account_allowed",
            format!("account {} is {}, not active", a.account_id, a.status),
        );
    }
    match &policy.allowed_accounts {
        Some(list) if !list.iter().any(|x| x == &a.account_id) => RiskCheck::fail(
            "account_allowed",
            format!(
                "account {} is not on the policy's list of trading accounts",
                a.account_id
            ),
        ),
        _ => RiskCheck::pass(
            "account_allowed",
            format!("account {} is active", a.account_id),
        ),
    }
}

/// The checks of `order.submit.cl` at plan time, in the contract's order.
pub fn check_order_submit(i: &OrderInputs, account: &Account, control: &Control) -> Vec<RiskCheck> {
    let a = ActionType::OrderSubmitCl;
    let mut out = vec![
        action_enabled(control, a),
        kill_switch(control, a),
        account_allowed(i.policy, account),
        symbol_valid(i),
        symbol_allowed(i),
    ];
    out.extend(time_and_size_checks(i));
    out.push(price_on_tick(i));
    out.push(order_type_valid(i));
    out
}

/// The time-sensitive and size checks that execute re-runs against current positions:
/// `contract_not_expired`, `expiry_window`, `market_open`, `max_order_size`,
/// `position_limit`.
pub fn recheck_order_at_execute(i: &OrderInputs) -> Vec<RiskCheck> {
    time_and_size_checks(i)
}

/// The re-checks that do not depend on the position (`i.position` is ignored).
pub fn recheck_order_without_position(i: &OrderInputs) -> Vec<RiskCheck> {
    vec![contract_not_expired(i), market_open(i), max_order_size(i)]
}

/// The current positions (inclusive range) for which `position_limit` and `expiry_window`
/// pass, given that the other re-checks pass. Execute checks the account's position against
/// this range inside its atomic commit, instead of reading the position first; the range is
/// exact (a property test compares it with the checks). `i.position` is ignored.
pub fn position_bounds(i: &OrderInputs) -> (i64, i64) {
    let q = i.order.quantity.get() as i64;
    let max = i.policy.max_position as i64;
    // position_limit passes when |after| <= max, or when the order moves the position
    // strictly toward zero (|pos + q| < |pos|, i.e. pos < -q/2 for a buy).
    let (mut lo, mut hi) = match i.order.side {
        Side::Buy => (i64::MIN, (max - q).max((-q - 1).div_euclid(2))),
        Side::Sell => ((q - max).min(q.div_euclid(2) + 1), i64::MAX),
    };
    // In the close-only window only reducing orders pass: a buy needs pos <= -q.
    if in_close_only_window(i) {
        match i.order.side {
            Side::Buy => hi = hi.min(-q),
            Side::Sell => lo = lo.max(q),
        }
    }
    (lo, hi)
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

fn contract_not_expired(i: &OrderInputs) -> RiskCheck {
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

/// Whether the order only reduces the existing position (never flips it).
fn reduces_position(i: &OrderInputs) -> bool {
    let q = i.order.quantity.get() as i64;
    i.position != 0 && i.position.signum() == -i.order.side.sign() && q <= i.position.abs()
}

fn expiry_window(i: &OrderInputs) -> RiskCheck {
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
                "{} is in its close-only window (last trading day {ltd}); this order reduces the position of {}",
                c.symbol(),
                i.position
            ),
        )
    } else {
        RiskCheck::fail(
            "expiry_window",
            format!(
                "{} is within {window} business days of its last trading day {ltd}: only orders that reduce the position pass, and {} holds {:+}",
                c.symbol(),
                i.account_id,
                i.position
            ),
        )
    }
}

fn market_open(i: &OrderInputs) -> RiskCheck {
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

fn max_order_size(i: &OrderInputs) -> RiskCheck {
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

fn position_limit(i: &OrderInputs) -> RiskCheck {
    let after = i.position + i.order.side.sign() * i.order.quantity.get() as i64;
    let max = i.policy.max_position as i64;
    let sym = i
        .contract
        .map(|c| c.symbol())
        .unwrap_or_else(|| i.order.symbol.clone());
    let text = format!(
        "{} holds {:+} {sym}; after this order {:+} (limit {max} either way)",
        i.account_id, i.position, after
    );
    if after.abs() <= max || after.abs() < i.position.abs() {
        RiskCheck::pass("position_limit", text)
    } else {
        RiskCheck::fail("position_limit", text)
    }
}

fn price_on_tick(i: &OrderInputs) -> RiskCheck {
    let prices: Vec<(&str, Price)> = [
        ("limit_price", i.order.limit_price),
        ("stop_price", i.order.stop_price),
    ]
    .into_iter()
    .filter_map(|(n, p)| p.map(|p| (n, p)))
    .collect();
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
        Some(o) if o.account_id == i.account.account_id => RiskCheck::pass(
            "order_exists",
            format!("order {} is on account {}", o.order_id, o.account_id),
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
        Some(o) if o.account_id == i.account.account_id && o.status.is_cancellable() => {
            RiskCheck::pass(
                "order_cancellable",
                format!("order {} is {}", o.order_id, o.status),
            )
        }
        Some(o) if o.account_id == i.account.account_id => RiskCheck::fail(
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
        kill_switch(control, a),
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
        kill_switch(control, a),
        account_check,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Ident, Quantity};
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

    fn order(side: Side, q: u32) -> OrderSubmitCl {
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
        /// The bounds execute checks atomically agree exactly with the position checks,
        /// at every position around the limits (the edges are what matter).
        #[test]
        fn position_bounds_match_the_checks(
            buy in any::<bool>(),
            q in 1u32..40,
            max in 1u32..60,
            close_only in any::<bool>(),
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
                    position: pos,
                };
                let checks_pass = !position_limit(&i).failed() && !expiry_window(&i).failed();
                let (lo, hi) = position_bounds(&i);
                prop_assert_eq!(checks_pass, lo <= pos && pos <= hi, "pos {} bounds {:?}", pos, (lo, hi));
            }
        }
    }
}
