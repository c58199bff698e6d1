//! The exchange's side of the paper broker, on values only: whether a working order
//! crosses the reference price, its fills and the position they move, the price band, and
//! the answer to a new order or a replace.

use std::collections::BTreeMap;

use rust_decimal::Decimal;

use crate::core::domain::fills::{average_after, try_apply_fill};
use crate::core::domain::{Millis, OrderType, Price, Side, TimeInForce};
use crate::core::ports::broker::{
    BrokerOrder, BrokerOrderVersion, BrokerPosition, BrokerStatus, Replacement,
};

/// The price band: 20 % of the reference, at least 5.00. (A fifth of any decimal is
/// representable, so this cannot overflow; checked all the same.)
fn band(reference: Decimal) -> Decimal {
    reference
        .abs()
        .checked_mul(Decimal::new(2, 1))
        .unwrap_or(Decimal::MAX)
        .max(Decimal::new(5, 0))
}

/// Whether `price` lies within the band around `reference`. A distance too large to
/// represent is outside any band.
fn within_band(price: Price, reference: Price) -> bool {
    price
        .value()
        .checked_sub(reference.value())
        .is_some_and(|d| d.abs() <= band(reference.value()))
}

/// Whether a working order trades at `reference` (stops trigger first), and at what price.
pub(super) fn crossing(o: &mut BrokerOrder, reference: Price) -> Option<Price> {
    let r = reference.value();
    let buy = o.terms.side == Side::Buy;
    if matches!(o.terms.order_type, OrderType::Stop | OrderType::StopLimit) && !o.triggered {
        let stop = o.terms.stop_price?.value();
        o.triggered = if buy { r >= stop } else { r <= stop };
        if !o.triggered {
            return None;
        }
    }
    match o.terms.order_type {
        OrderType::Market | OrderType::Stop => Some(reference),
        OrderType::Limit | OrderType::StopLimit => {
            let limit = o.terms.limit_price?.value();
            let marketable = if buy { r <= limit } else { r >= limit };
            marketable.then_some(reference)
        }
    }
}

/// Fills what is left of `o` at `price` and moves the account's position. `Err`: the
/// position after the fill cannot be represented; nothing changed.
pub(super) fn fill(
    positions: &mut BTreeMap<String, BrokerPosition>,
    o: &mut BrokerOrder,
    price: Price,
) -> Result<(), String> {
    let rest = o.terms.quantity.saturating_sub(o.filled_quantity);
    fill_part(positions, o, rest, price)
}

/// Fills `qty` contracts of `o` (at most what is left) at `price` and moves the account's
/// position: `o` is `filled` when nothing is left, else `partially_filled`, and its average
/// fill price is over all its fills. `Err`: the position or the average after the fill
/// cannot be represented; nothing changed.
pub(super) fn fill_part(
    positions: &mut BTreeMap<String, BrokerPosition>,
    o: &mut BrokerOrder,
    qty: u32,
    price: Price,
) -> Result<(), String> {
    let qty = qty.min(o.terms.quantity.saturating_sub(o.filled_quantity));
    let (q, avg) = match positions.get(&o.terms.symbol) {
        Some(pos) => try_apply_fill(pos.quantity, pos.avg_price, o.terms.side, qty, price),
        None => try_apply_fill(0, None, o.terms.side, qty, price),
    }
    .ok_or_else(|| {
        format!(
            "a fill of {qty} {} at {price} would take the position past what the broker can hold",
            o.terms.symbol
        )
    })?;
    let order_avg = average_after(o.filled_quantity, o.avg_fill_price, qty, price)
        .ok_or_else(|| format!("a fill of {qty} at {price} has no average the broker can hold"))?;
    o.filled_quantity += qty;
    o.status = if o.filled_quantity >= o.terms.quantity {
        BrokerStatus::Filled
    } else {
        BrokerStatus::PartiallyFilled
    };
    o.avg_fill_price = Some(order_avg);
    let pos = positions
        .entry(o.terms.symbol.clone())
        .or_insert(BrokerPosition {
            symbol: o.terms.symbol.clone(),
            quantity: 0,
            avg_price: None,
        });
    pos.quantity = q;
    pos.avg_price = avg;
    Ok(())
}

/// Why the broker refuses prices at the `reference` price (none known, or outside the
/// band), as it checks a new order's and a replace's.
fn price_refusal(o: &BrokerOrder, reference: Option<Price>) -> Result<Price, String> {
    let Some(reference) = reference else {
        return Err(format!("no reference price for {}", o.terms.symbol));
    };
    for p in o.terms.prices() {
        if !within_band(p, reference) {
            return Err(format!(
                "price {p} is outside the broker's band around the reference {reference}"
            ));
        }
    }
    Ok(reference)
}

/// A working order checked against the market at `reference`, as on its arrival: filled if
/// it crosses (which moves `positions`; `true`), cancelled if it is IOC or FOK and cannot
/// fill at once, else still working. `Err`: the fill cannot be held; nothing changed.
fn check_arrival(
    o: &mut BrokerOrder,
    reference: Price,
    positions: &mut BTreeMap<String, BrokerPosition>,
) -> Result<bool, String> {
    match crossing(o, reference) {
        Some(price) => fill(positions, o, price).map(|()| true),
        None => {
            if matches!(o.terms.time_in_force, TimeInForce::Ioc | TimeInForce::Fok) {
                o.status = BrokerStatus::Cancelled;
                o.reason = Some(format!(
                    "{} order could not fill at once",
                    o.terms.time_in_force
                ));
            }
            Ok(false)
        }
    }
}

/// The broker's answer to a new order at the `reference` price, accepted at `now`:
/// rejected (no price, or outside the band), cancelled (IOC or FOK that cannot fill at
/// once), working, or filled, which moves `positions`. `true` if it filled.
pub(super) fn accept(
    order: &BrokerOrder,
    reference: Option<Price>,
    positions: &mut BTreeMap<String, BrokerPosition>,
    now: Millis,
) -> (BrokerOrder, bool) {
    let mut o = order.clone();
    o.status = BrokerStatus::Working;
    o.filled_quantity = 0;
    o.avg_fill_price = None;
    o.triggered = false;
    o.priority_at = now;
    let reference = match price_refusal(&o, reference) {
        Ok(r) => r,
        Err(why) => {
            o.status = BrokerStatus::Rejected;
            o.reason = Some(why);
            return (o, false);
        }
    };
    match check_arrival(&mut o, reference, positions) {
        Ok(filled) => (o, filled),
        Err(why) => {
            o.status = BrokerStatus::Rejected;
            o.reason = Some(why);
            (o, false)
        }
    }
}

pub(super) fn order_status_text(s: BrokerStatus) -> &'static str {
    match s {
        BrokerStatus::Working => "working",
        BrokerStatus::PartiallyFilled => "partially filled",
        BrokerStatus::Filled => "filled",
        BrokerStatus::Cancelled => "cancelled",
        BrokerStatus::Rejected => "rejected",
    }
}

/// Why an order of type `t` cannot carry these prices (a limit order needs its limit, a
/// stop order its stop, and neither may carry the other's).
fn prices_refusal(t: OrderType, limit: Option<Price>, stop: Option<Price>) -> Option<String> {
    let needs_limit = matches!(t, OrderType::Limit | OrderType::StopLimit);
    let needs_stop = matches!(t, OrderType::Stop | OrderType::StopLimit);
    if needs_limit != limit.is_some() || needs_stop != stop.is_some() {
        let what = |needed: bool, name: &str| {
            if needed {
                format!("needs a {name} price")
            } else {
                format!("takes no {name} price")
            }
        };
        return Some(format!(
            "a {t} order {} and {}",
            what(needs_limit, "limit"),
            what(needs_stop, "stop")
        ));
    }
    None
}

/// The broker's answer to a replace of `o` by `change` at the `reference` price, at `now`
/// (exchange semantics): `Ok` with the order after the replace, re-checked against the
/// market as a new order is (it may fill, which moves `positions`, or be cancelled as an
/// IOC or FOK that cannot fill at once); `Err` with the reason it is refused, nothing
/// changed. A resend of the order's own version is the order as it is.
pub(super) fn replace_terms(
    o: &BrokerOrder,
    change: &Replacement,
    reference: Option<Price>,
    positions: &mut BTreeMap<String, BrokerPosition>,
    now: Millis,
) -> Result<BrokerOrder, String> {
    if change.version == o.version && o.version > 1 {
        return Ok(o.clone());
    }
    if change.version <= o.version {
        return Err(format!(
            "stale replace: version {} is not after the order's version {}",
            change.version, o.version
        ));
    }
    if !matches!(
        o.status,
        BrokerStatus::Working | BrokerStatus::PartiallyFilled
    ) {
        return Err(format!(
            "order {} is {}: nothing is left to replace",
            o.client_order_id,
            order_status_text(o.status)
        ));
    }
    if change.quantity == 0 || change.quantity < o.filled_quantity {
        return Err(format!(
            "quantity {} is below the {} already filled (or zero)",
            change.quantity, o.filled_quantity
        ));
    }
    if let Some(why) = prices_refusal(o.terms.order_type, change.limit_price, change.stop_price) {
        return Err(why);
    }
    let mut next = o.clone();
    next.versions.push(BrokerOrderVersion {
        version: o.version,
        quantity: o.terms.quantity,
        limit_price: o.terms.limit_price,
        stop_price: o.terms.stop_price,
        time_in_force: o.terms.time_in_force,
        priority_at: o.priority_at,
        replaced_at: now,
    });
    next.version = change.version;
    next.terms.quantity = change.quantity;
    next.terms.limit_price = change.limit_price;
    next.terms.stop_price = change.stop_price;
    next.terms.time_in_force = change.time_in_force;
    // Time priority: a new price, or more contracts, go to the back of the queue; fewer
    // contracts at the same prices keep their place.
    let repriced = (next.terms.limit_price, next.terms.stop_price)
        != (o.terms.limit_price, o.terms.stop_price);
    if repriced || next.terms.quantity > o.terms.quantity {
        next.priority_at = now;
    }
    let reference = price_refusal(&next, reference)?;
    if next.filled_quantity == next.terms.quantity {
        // Cut to what has filled: nothing is left to trade.
        next.status = BrokerStatus::Filled;
        return Ok(next);
    }
    check_arrival(&mut next, reference, positions)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{new_order, p};
    use super::*;

    #[test]
    fn prices_too_far_to_subtract_are_outside_the_band() {
        let extreme = Price::parse("-79228162514264337593543950335").unwrap();
        assert!(!within_band(extreme, p("68.40")));
        assert!(!within_band(p("68.40"), extreme));
        assert!(!within_band(Price::new(Decimal::MAX), extreme));
        assert!(within_band(p("60.00"), p("68.40")));
        assert!(!within_band(p("40.00"), p("68.40")));
        let mut positions = BTreeMap::new();
        let mut o = new_order("o", Side::Buy, OrderType::Limit, None);
        o.terms.limit_price = Some(extreme);
        let (ack, filled) = accept(&o, Some(p("68.40")), &mut positions, 0);
        assert_eq!(ack.status, BrokerStatus::Rejected);
        assert!(!filled);
        assert!(ack.reason.unwrap().contains("band"));
        // The answer, extreme price and all, serializes and reads back.
        let text = serde_json::to_string(&ack.terms.limit_price).unwrap();
        let back: Option<Price> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, Some(extreme));
    }

    #[test]
    fn limits_and_stops_cross_the_reference() {
        let terms = crate::core::domain::OrderTerms {
            account_id: "A".into(),
            symbol: "CLF27".into(),
            side: Side::Buy,
            quantity: 1,
            order_type: OrderType::Limit,
            limit_price: Some(p("68.00")),
            stop_price: None,
            time_in_force: TimeInForce::Day,
        };
        let mut o = BrokerOrder::new("o", &terms, 1);
        assert_eq!(crossing(&mut o, p("68.40")), None);
        assert_eq!(crossing(&mut o, p("67.90")), Some(p("67.90")));
        o.terms.order_type = OrderType::Stop;
        o.terms.stop_price = Some(p("70.00"));
        assert_eq!(crossing(&mut o, p("69.99")), None);
        assert!(!o.triggered);
        assert_eq!(crossing(&mut o, p("70.10")), Some(p("70.10")));
        assert!(o.triggered);
    }
}
