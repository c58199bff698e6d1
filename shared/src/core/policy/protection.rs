//! Market protection: Airlock never sends an order whose price it cannot bound. A market
//! order goes to the broker as a limit `market_protection_points` beyond the reference
//! price (above it for a buy, below it for a sell), and a stop order as a stop-limit whose
//! limit is that far beyond its stop price: CME Globex's "market and stop orders with
//! protection", decided here, where the person approving sees it, rather than left to the
//! venue. What was asked is kept beside the protected terms ([`MarketProtection`]).

use rust_decimal::Decimal;

use super::Policy;
use crate::core::domain::payload::MarketProtection;
use crate::core::domain::{OrderSubmitCl, OrderType, Price, Side};

/// The order to send for `o`, and how it was protected: a market order with a reference
/// price becomes a limit, a stop order a stop-limit; any other order (or a market order
/// without a reference price, which `price_band` then fails) is sent as asked.
pub fn protect(
    o: &OrderSubmitCl,
    reference: Option<Price>,
    pol: &Policy,
) -> (OrderSubmitCl, Option<MarketProtection>) {
    let (from, sent_as) = match (o.order_type, reference, o.stop_price) {
        (OrderType::Market, Some(r), _) => (r, OrderType::Limit),
        (OrderType::Stop, _, Some(s)) => (s, OrderType::StopLimit),
        _ => return (o.clone(), None),
    };
    let points = pol.market_protection_points;
    let Some(limit) = protected_limit(o.side, from, points, pol.tick) else {
        return (o.clone(), None);
    };
    let protected = OrderSubmitCl {
        order_type: sent_as,
        limit_price: Some(limit),
        ..o.clone()
    };
    let how = MarketProtection {
        requested_type: o.order_type,
        from_price: from,
        points: Price::new(points),
    };
    (protected, Some(how))
}

/// `points` beyond `from` on the order's side, on the tick and never beyond the
/// protection (a buy's limit rounds down, a sell's up). `None`: out of the decimal range.
pub fn protected_limit(side: Side, from: Price, points: Decimal, tick: Decimal) -> Option<Price> {
    let raw = match side {
        Side::Buy => from.value().checked_add(points)?,
        Side::Sell => from.value().checked_sub(points)?,
    };
    let ticks = raw.checked_div(tick)?;
    let ticks = match side {
        Side::Buy => ticks.floor(),
        Side::Sell => ticks.ceil(),
    };
    Some(Price::new(ticks.checked_mul(tick)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::domain::{Ident, Quantity, TimeInForce};

    fn price(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    fn order(side: Side, order_type: OrderType, stop: Option<&str>) -> OrderSubmitCl {
        OrderSubmitCl {
            account_id: Ident::parse("ACC-1").unwrap(),
            symbol: "CLF27".into(),
            side,
            quantity: Quantity::new(2).unwrap(),
            order_type,
            limit_price: None,
            stop_price: stop.map(price),
            time_in_force: TimeInForce::Day,
        }
    }

    #[test]
    fn a_market_order_becomes_a_limit_beyond_the_reference_on_its_side() {
        let pol = Policy::default();
        let (buy, how) = protect(
            &order(Side::Buy, OrderType::Market, None),
            Some(price("68.40")),
            &pol,
        );
        assert_eq!(buy.order_type, OrderType::Limit);
        assert_eq!(buy.limit_price, Some(price("68.90")));
        let how = how.unwrap();
        assert_eq!(how.requested_type, OrderType::Market);
        assert_eq!(how.from_price, price("68.40"));
        let (sell, _) = protect(
            &order(Side::Sell, OrderType::Market, None),
            Some(price("68.40")),
            &pol,
        );
        assert_eq!(sell.limit_price, Some(price("67.90")));
        // Near zero and below it (CL settled at -37.63): the arithmetic holds.
        let (sell, _) = protect(
            &order(Side::Sell, OrderType::Market, None),
            Some(price("0.20")),
            &pol,
        );
        assert_eq!(sell.limit_price, Some(price("-0.30")));
    }

    #[test]
    fn a_stop_order_becomes_a_stop_limit_beyond_its_stop() {
        let pol = Policy::default();
        let (buy, how) = protect(
            &order(Side::Buy, OrderType::Stop, Some("70.00")),
            Some(price("68.40")),
            &pol,
        );
        assert_eq!(buy.order_type, OrderType::StopLimit);
        assert_eq!(buy.stop_price, Some(price("70.00")));
        assert_eq!(buy.limit_price, Some(price("70.50")));
        assert_eq!(how.unwrap().from_price, price("70.00"));
    }

    #[test]
    fn what_cannot_be_protected_is_sent_as_asked() {
        let pol = Policy::default();
        let market = order(Side::Buy, OrderType::Market, None);
        assert_eq!(protect(&market, None, &pol), (market, None));
        let mut limit = order(Side::Buy, OrderType::Limit, None);
        limit.limit_price = Some(price("68.00"));
        assert_eq!(protect(&limit, Some(price("68.40")), &pol), (limit, None));
    }

    #[test]
    fn the_protected_limit_is_on_the_tick_and_never_beyond_the_protection() {
        let tick = Decimal::new(1, 2);
        let points = Decimal::new(5, 1);
        // A reference off the tick: the buy rounds down, the sell up.
        assert_eq!(
            protected_limit(Side::Buy, price("68.405"), points, tick),
            Some(price("68.90"))
        );
        assert_eq!(
            protected_limit(Side::Sell, price("68.405"), points, tick),
            Some(price("67.91"))
        );
        assert_eq!(
            protected_limit(Side::Buy, Price::new(Decimal::MAX), points, tick),
            None
        );
    }
}
