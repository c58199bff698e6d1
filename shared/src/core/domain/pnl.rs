//! An account's profit and loss over CME's trading day (the `daily_loss` check and
//! `GET /portfolio`): realized from the day's fills, each closing contract against the
//! position's average entry price; unrealized on the open positions at reference prices,
//! against the same average entry price. USD; CL is 1,000 barrels a contract.

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::calendar::{chicago_to_utc, ExchangeCalendar, EXCHANGE_TZ};
use super::portfolio::BARRELS_PER_CONTRACT;
use super::{Price, Side};

/// The trading day an instant belongs to: CME's trade date `D`, whose session opens at
/// 17:00 CT the evening before and closes at 16:00 CT on `D` (earlier on an early-close
/// day). The day runs from the previous session's close to its own close, so the daily
/// halt, a weekend and a holiday belong to the next session's day: a fill at 17:30 CT on a
/// Monday is Tuesday's, a Friday evening is Monday's.
pub fn trading_day(cal: &ExchangeCalendar, at: DateTime<Utc>) -> NaiveDate {
    let local = at.with_timezone(&EXCHANGE_TZ).naive_local();
    let mut d = local.date();
    // Holidays never span more than a few days; the bound only keeps a malformed table
    // from looping.
    for _ in 0..31 {
        if let Some((_, close)) = cal.session(d) {
            if chicago_to_utc(close).is_none_or(|c| at < c) {
                return d;
            }
        }
        match d.succ_opt() {
            Some(next) => d = next,
            None => break,
        }
    }
    d
}

/// What a position's fills realized on one trading day, USD (stored on the position; a
/// figure of an earlier day counts as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayRealized {
    pub trading_day: NaiveDate,
    pub realized: Decimal,
}

impl DayRealized {
    /// The figure of `day`: zero when it was written on another day.
    pub fn on(this: Option<&DayRealized>, day: NaiveDate) -> Decimal {
        this.filter(|r| r.trading_day == day)
            .map_or(Decimal::ZERO, |r| r.realized)
    }

    /// `this` after a fill on `day` realized `realized`: added to the day's figure, or
    /// the first of a new day. Saturates at the decimal range (a loss that large is far
    /// past any limit either way).
    pub fn add(this: Option<&DayRealized>, day: NaiveDate, realized: Decimal) -> DayRealized {
        DayRealized {
            trading_day: day,
            realized: DayRealized::on(this, day).saturating_add(realized),
        }
    }
}

/// USD of `contracts` barrels-worth at a price difference: `diff x contracts x 1,000`.
fn usd(diff: Decimal, contracts: i64) -> Option<Decimal> {
    diff.checked_mul(Decimal::from(contracts))?
        .checked_mul(Decimal::from(BARRELS_PER_CONTRACT))
}

/// What a fill of `qty` at `price` realizes on a position of `quantity` at average `avg`:
/// the contracts it closes (all of the position's when it flips it) times the price
/// difference from the average entry price, signed by the position's side. Zero for a
/// fill that opens or adds; `None` when it closes contracts of unknown average price or
/// the figure cannot be represented.
pub fn realized_by_fill(
    quantity: i64,
    avg: Option<Price>,
    side: Side,
    qty: u32,
    price: Price,
) -> Option<Decimal> {
    if quantity == 0 || quantity.signum() == side.sign() {
        return Some(Decimal::ZERO);
    }
    let closed = quantity.unsigned_abs().min(u64::from(qty)) as i64;
    let diff = price.value().checked_sub(avg?.value())?;
    usd(diff, closed.checked_mul(quantity.signum())?)
}

/// A position's unrealized P&L at `reference`: `(reference - avg) x quantity x 1,000`.
/// Zero for a flat position; `None` without a price or an average.
pub fn unrealized(quantity: i64, avg: Option<Price>, reference: Option<Price>) -> Option<Decimal> {
    if quantity == 0 {
        return Some(Decimal::ZERO);
    }
    usd(reference?.value().checked_sub(avg?.value())?, quantity)
}

/// One position as the day's P&L reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held<'a> {
    pub symbol: &'a str,
    pub quantity: i64,
    pub avg_price: Option<Price>,
    pub day_realized: Option<&'a DayRealized>,
    pub reference: Option<Price>,
}

/// An account's P&L on one trading day, USD.
#[derive(Debug, Clone, PartialEq)]
pub struct DayPnl {
    pub trading_day: NaiveDate,
    pub realized: Decimal,
    pub unrealized: Decimal,
    /// `realized + unrealized`.
    pub total: Decimal,
    /// Open positions left out of `unrealized`: no reference price or no average price.
    pub unpriced: Vec<String>,
}

impl DayPnl {
    /// The day's P&L of these positions.
    pub fn of(trading_day: NaiveDate, held: &[Held]) -> DayPnl {
        let mut realized = Decimal::ZERO;
        let mut unrealized_sum = Decimal::ZERO;
        let mut unpriced = Vec::new();
        for h in held {
            realized = realized.saturating_add(DayRealized::on(h.day_realized, trading_day));
            match unrealized(h.quantity, h.avg_price, h.reference) {
                Some(u) => unrealized_sum = unrealized_sum.saturating_add(u),
                None => unpriced.push(h.symbol.to_string()),
            }
        }
        DayPnl {
            trading_day,
            realized,
            unrealized: unrealized_sum,
            total: realized.saturating_add(unrealized_sum),
            unpriced,
        }
    }

    /// The day's loss (a positive number; zero on a gain).
    pub fn loss(&self) -> Decimal {
        (-self.total).max(Decimal::ZERO)
    }

    /// Whether the loss is at or beyond `limit` (`None`: no limit).
    pub fn breaches(&self, limit: Option<Decimal>) -> bool {
        limit.is_some_and(|l| self.loss() >= l)
    }

    /// What is left of the day's budget: `limit - loss`, never below zero.
    pub fn remaining(&self, limit: Decimal) -> Decimal {
        limit
            .checked_sub(self.loss())
            .unwrap_or(Decimal::ZERO)
            .max(Decimal::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    fn date(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn ct(s: &str) -> DateTime<Utc> {
        chicago_to_utc(chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M").unwrap()).unwrap()
    }

    #[test]
    fn the_trading_day_runs_from_close_to_close_in_chicago() {
        let cal = ExchangeCalendar::cme();
        // Monday 2026-03-02 (standard time) and around the halt.
        assert_eq!(trading_day(cal, ct("2026-03-02 10:00")), date("2026-03-02"));
        assert_eq!(trading_day(cal, ct("2026-03-02 15:59")), date("2026-03-02"));
        assert_eq!(trading_day(cal, ct("2026-03-02 16:00")), date("2026-03-03"));
        assert_eq!(trading_day(cal, ct("2026-03-02 17:30")), date("2026-03-03"));
        assert_eq!(trading_day(cal, ct("2026-03-02 23:59")), date("2026-03-03"));
        assert_eq!(trading_day(cal, ct("2026-03-03 00:30")), date("2026-03-03"));
        // Friday evening, the weekend and Sunday's open belong to Monday.
        assert_eq!(trading_day(cal, ct("2026-03-06 15:00")), date("2026-03-06"));
        assert_eq!(trading_day(cal, ct("2026-03-06 17:30")), date("2026-03-09"));
        assert_eq!(trading_day(cal, ct("2026-03-07 12:00")), date("2026-03-09"));
        assert_eq!(trading_day(cal, ct("2026-03-08 18:00")), date("2026-03-09"));
        // Across the March DST switch (2026-03-08) and in summer time.
        assert_eq!(trading_day(cal, ct("2026-07-15 15:59")), date("2026-07-15"));
        assert_eq!(trading_day(cal, ct("2026-07-15 17:00")), date("2026-07-16"));
        // Good Friday 2026-04-03 is an exchange holiday: Thursday evening is Monday's.
        assert_eq!(trading_day(cal, ct("2026-04-02 17:30")), date("2026-04-06"));
        // In UTC: 2026-03-02 22:30Z is 16:30 CT, already Tuesday's day.
        let utc = DateTime::parse_from_rfc3339("2026-03-02T22:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(trading_day(cal, utc), date("2026-03-03"));
    }

    #[test]
    fn fills_realize_against_the_average_entry_price() {
        // Opening or adding realizes nothing.
        assert_eq!(
            realized_by_fill(0, None, Side::Buy, 2, p("70")),
            Some(d("0"))
        );
        assert_eq!(
            realized_by_fill(2, Some(p("70")), Side::Buy, 1, p("60")),
            Some(d("0"))
        );
        // A partial close of a long: 1 of 3 at 68.50 against 70: -1,500.
        assert_eq!(
            realized_by_fill(3, Some(p("70")), Side::Sell, 1, p("68.50")),
            Some(d("-1500"))
        );
        // A short closed lower gains: -2 at 71.25, buy 2 at 70.00: +2,500.
        assert_eq!(
            realized_by_fill(-2, Some(p("71.25")), Side::Buy, 2, p("70")),
            Some(d("2500"))
        );
        // A flip closes the whole position, the rest opens: +1 at 70, sell 3 at 69: -1,000.
        assert_eq!(
            realized_by_fill(1, Some(p("70")), Side::Sell, 3, p("69")),
            Some(d("-1000"))
        );
        // Negative prices (CL in April 2020): long 1 at 10, sold at -37.63: -47,630.
        assert_eq!(
            realized_by_fill(1, Some(p("10")), Side::Sell, 1, p("-37.63")),
            Some(d("-47630"))
        );
        // Closing contracts of unknown average price: unknown.
        assert_eq!(realized_by_fill(2, None, Side::Sell, 1, p("70")), None);
        // Past the decimal range: unknown, never a panic.
        let max = Price::new(Decimal::MAX);
        assert_eq!(realized_by_fill(2, Some(max), Side::Sell, 1, p("-1")), None);
    }

    #[test]
    fn a_sequence_of_fills_adds_up_with_the_average_price() {
        // Buy 2 at 70, buy 2 at 72 (avg 71), sell 1 at 75 (+4,000), sell 4 at 69
        // (closes 3 at 69: -6,000; opens short 1 at 69), buy 1 at 68 (+1,000).
        let fills = [
            (Side::Buy, 2, "70"),
            (Side::Buy, 2, "72"),
            (Side::Sell, 1, "75"),
            (Side::Sell, 4, "69"),
            (Side::Buy, 1, "68"),
        ];
        let (mut q, mut avg, mut total) = (0i64, None, Decimal::ZERO);
        let mut each = Vec::new();
        for (side, n, price) in fills {
            let r = realized_by_fill(q, avg, side, n, p(price)).unwrap();
            each.push(r);
            total += r;
            (q, avg) = crate::core::domain::fills::apply_fill(q, avg, side, n, p(price));
        }
        assert_eq!(each, vec![d("0"), d("0"), d("4000"), d("-6000"), d("1000")]);
        assert_eq!(total, d("-1000"));
        assert_eq!((q, avg), (0, None));
    }

    #[test]
    fn the_day_figure_starts_over_on_a_new_trading_day() {
        let mon = date("2026-03-02");
        let tue = date("2026-03-03");
        let a = DayRealized::add(None, mon, d("-1500"));
        let a = DayRealized::add(Some(&a), mon, d("500"));
        assert_eq!(a.realized, d("-1000"));
        assert_eq!(DayRealized::on(Some(&a), mon), d("-1000"));
        assert_eq!(DayRealized::on(Some(&a), tue), d("0"));
        let b = DayRealized::add(Some(&a), tue, d("200"));
        assert_eq!((b.trading_day, b.realized), (tue, d("200")));
    }

    #[test]
    fn the_day_pnl_sums_realized_and_unrealized() {
        let day = date("2026-03-02");
        let today = DayRealized {
            trading_day: day,
            realized: d("-30000"),
        };
        let yesterday = DayRealized {
            trading_day: date("2026-02-27"),
            realized: d("-900000"),
        };
        let held = [
            // Long 2 at 70, now 65: -10,000 unrealized; -30,000 realized today.
            Held {
                symbol: "CLZ26",
                quantity: 2,
                avg_price: Some(p("70")),
                day_realized: Some(&today),
                reference: Some(p("65")),
            },
            // Short 1 at 60, now 61: -1,000; its realized is another day's.
            Held {
                symbol: "CLF27",
                quantity: -1,
                avg_price: Some(p("60")),
                day_realized: Some(&yesterday),
                reference: Some(p("61")),
            },
            // No reference price: left out, named.
            Held {
                symbol: "CLG27",
                quantity: 1,
                avg_price: Some(p("60")),
                day_realized: None,
                reference: None,
            },
        ];
        let pnl = DayPnl::of(day, &held);
        assert_eq!(pnl.realized, d("-30000"));
        assert_eq!(pnl.unrealized, d("-11000"));
        assert_eq!(pnl.total, d("-41000"));
        assert_eq!(pnl.unpriced, vec!["CLG27".to_string()]);
        assert_eq!(pnl.loss(), d("41000"));
        assert!(pnl.breaches(Some(d("41000"))));
        assert!(!pnl.breaches(Some(d("41000.01"))));
        assert!(!pnl.breaches(None));
        assert_eq!(pnl.remaining(d("100000")), d("59000"));
        assert_eq!(pnl.remaining(d("40000")), d("0"));
        // A gain is no loss.
        let gain = DayPnl::of(
            day,
            &[Held {
                reference: Some(p("75")),
                day_realized: None,
                ..held[0].clone()
            }],
        );
        assert_eq!((gain.total, gain.loss()), (d("10000"), d("0")));
        assert_eq!(gain.remaining(d("100000")), d("100000"));
    }
}
