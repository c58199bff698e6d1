//! Fills and positions: how a fill moves a signed position and its average price. Used by
//! the paper broker for its book and by the workers for Airlock's own position.

use rust_decimal::Decimal;

use super::{Price, Side};

/// Applies a fill of `qty` at `price` to a position: signed quantity, average price of the
/// open position (unchanged when reducing, the fill price when opening or flipping).
/// `None` if the result cannot be represented (a quantity past `i64`, an average price past
/// what a decimal holds): the caller refuses the fill instead of panicking.
pub fn try_apply_fill(
    quantity: i64,
    avg: Option<Price>,
    side: Side,
    qty: u32,
    price: Price,
) -> Option<(i64, Option<Price>)> {
    let delta = side.sign().checked_mul(i64::from(qty))?;
    let after = quantity.checked_add(delta)?;
    let avg = if after == 0 {
        None
    } else if quantity == 0 || quantity.signum() != after.signum() {
        Some(price)
    } else if quantity.signum() == delta.signum() {
        // Adding to the position: weighted average.
        let old = avg.map(|p| p.value()).unwrap_or(price.value());
        Some(Price::new(weighted_average(
            old,
            quantity.unsigned_abs(),
            price.value(),
            delta.unsigned_abs(),
        )?))
    } else {
        avg
    };
    Some((after, avg))
}

/// `(a * wa + b * wb) / (wa + wb)` to 6 places, checked. When the products overflow, the
/// same average as `a * (wa / w) + b * (wb / w)`, whose terms are no larger than `a` and `b`.
fn weighted_average(a: Decimal, wa: u64, b: Decimal, wb: u64) -> Option<Decimal> {
    let (wa, wb) = (Decimal::from(wa), Decimal::from(wb));
    let w = wa.checked_add(wb)?;
    if w.is_zero() {
        return None;
    }
    let direct = a
        .checked_mul(wa)
        .and_then(|x| x.checked_add(b.checked_mul(wb)?))
        .and_then(|t| t.checked_div(w));
    let avg = match direct {
        Some(avg) => avg,
        None => a
            .checked_mul(wa.checked_div(w)?)?
            .checked_add(b.checked_mul(wb.checked_div(w)?)?)?,
    };
    Some(avg.round_dp(6))
}

/// [`try_apply_fill`] for a caller that must record the fill whatever happens (Airlock's
/// own position after the broker filled): never panics; a quantity that cannot be
/// represented saturates and an average that cannot be represented is recorded as unknown
/// (`None`), with an error in the log.
pub fn apply_fill(
    quantity: i64,
    avg: Option<Price>,
    side: Side,
    qty: u32,
    price: Price,
) -> (i64, Option<Price>) {
    try_apply_fill(quantity, avg, side, qty, price).unwrap_or_else(|| {
        tracing::error!(
            quantity,
            qty,
            price = %price,
            "a fill's position cannot be represented; recording its average price as unknown"
        );
        let after = quantity.saturating_add(side.sign().saturating_mul(i64::from(qty)));
        (after, None)
    })
}

/// An order's average fill price after `qty` more contracts fill at `price`, when
/// `filled` had filled at `avg` before (as a broker reports it: over all its fills).
/// `None` if it cannot be represented.
pub fn average_after(filled: u32, avg: Option<Price>, qty: u32, price: Price) -> Option<Price> {
    match (filled, avg) {
        (0, _) | (_, None) => Some(price),
        (f, Some(a)) => {
            weighted_average(a.value(), u64::from(f), price.value(), u64::from(qty)).map(Price::new)
        }
    }
}

/// The price of the contracts an order filled between two reports of its fills (each a
/// quantity and the average over all fills so far): what moves the position. `avg` when
/// nothing had filled before; `None` when nothing more filled or it cannot be represented.
pub fn price_of_new_fills(
    before: (u32, Option<Price>),
    after: (u32, Option<Price>),
) -> Option<Price> {
    let (f0, f1) = (before.0, after.0);
    let new = f1.checked_sub(f0).filter(|q| *q > 0)?;
    let a1 = after.1?.value();
    let a0 = match before.1 {
        Some(a) if f0 > 0 => a.value(),
        _ => return Some(Price::new(a1)),
    };
    let total = a1.checked_mul(Decimal::from(f1))?;
    let earlier = a0.checked_mul(Decimal::from(f0))?;
    let p = total
        .checked_sub(earlier)?
        .checked_div(Decimal::from(new))?;
    Some(Price::new(p.round_dp(6)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_fills_are_priced_from_two_averages() {
        // 2 at 70, then 3 at 71.50: the average is 70.90.
        let avg = average_after(2, Some(p("70")), 3, p("71.50")).unwrap();
        assert_eq!(avg, p("70.9"));
        assert_eq!(average_after(0, None, 3, p("71.50")), Some(p("71.50")));
        assert_eq!(
            price_of_new_fills((2, Some(p("70"))), (5, Some(avg))),
            Some(p("71.50"))
        );
        assert_eq!(
            price_of_new_fills((0, None), (2, Some(p("70")))),
            Some(p("70"))
        );
        assert_eq!(
            price_of_new_fills((2, Some(p("70"))), (2, Some(p("70")))),
            None
        );
        assert_eq!(price_of_new_fills((2, Some(p("70"))), (3, None)), None);
        // A third of a cent: the average is rounded to 6 places, the new fill's price too.
        let avg = average_after(1, Some(p("70")), 2, p("70.01")).unwrap();
        assert_eq!(avg, p("70.006667"));
        let new = price_of_new_fills((1, Some(p("70"))), (3, Some(avg))).unwrap();
        assert!(
            (new.value() - p("70.01").value()).abs() <= Decimal::new(1, 6),
            "{new}"
        );
    }

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    #[test]
    fn fills_move_positions_and_average_prices() {
        assert_eq!(
            apply_fill(0, None, Side::Buy, 2, p("70")),
            (2, Some(p("70")))
        );
        assert_eq!(
            apply_fill(2, Some(p("70")), Side::Buy, 2, p("72")),
            (4, Some(p("71")))
        );
        assert_eq!(
            apply_fill(4, Some(p("71")), Side::Sell, 1, p("75")),
            (3, Some(p("71")))
        );
        assert_eq!(
            apply_fill(3, Some(p("71")), Side::Sell, 3, p("75")),
            (0, None)
        );
        assert_eq!(
            apply_fill(1, Some(p("71")), Side::Sell, 3, p("69")),
            (-2, Some(p("69")))
        );
    }

    #[test]
    fn fills_at_extreme_prices_never_panic() {
        let max = Price::new(Decimal::MAX);
        let min = Price::new(Decimal::MIN);
        assert_eq!(
            try_apply_fill(0, None, Side::Buy, 2, max),
            Some((2, Some(max)))
        );
        // 3 at 68.40 and 2 at MAX: the products overflow, the average does not.
        let (q, avg) = try_apply_fill(3, Some(p("68.40")), Side::Buy, 2, max).unwrap();
        let avg = avg.unwrap().value();
        assert_eq!(q, 5);
        assert!(
            avg > Decimal::MAX * Decimal::new(39, 2) && avg < Decimal::MAX,
            "{avg}"
        );
        let (q, avg) = try_apply_fill(-3, Some(p("68.40")), Side::Sell, 2, min).unwrap();
        assert_eq!(q, -5);
        assert!(avg.unwrap().value() < Decimal::MIN * Decimal::new(39, 2));
        // At the very edge the rounding may not fit: whatever the answer, no panic.
        let _ = try_apply_fill(1, Some(max), Side::Buy, 1, max);
        let _ = apply_fill(1, Some(max), Side::Buy, 1, max);
        // Quantities past i64.
        assert_eq!(
            try_apply_fill(i64::MAX, Some(p("1")), Side::Buy, 1, p("1")),
            None
        );
        assert_eq!(
            try_apply_fill(i64::MIN, Some(p("1")), Side::Sell, 1, p("1")),
            None
        );
        // The infallible form saturates and forgets the average instead.
        assert_eq!(
            apply_fill(i64::MAX, Some(p("1")), Side::Buy, 1, p("1")),
            (i64::MAX, None)
        );
    }
}
