//! Portfolio figures of CL futures positions: what the positions are worth and risk,
//! where a book sits on the curve, and which positions are about to become a delivery
//! problem. Pure and deterministic: decimal arithmetic only (no
//! binary floating point touches money), no clock or store of its own; the read use cases
//! bring the positions, the reference prices, the policy's thresholds and today's date.
//! `protocol::portfolio` serves them (`GET /portfolio`, `/portfolio/allocation`,
//! `/portfolio/risk-flags` and their MCP tools).

use std::collections::BTreeMap;

use chrono::NaiveDate;
use rust_decimal::Decimal;

use super::calendar::ExchangeCalendar;
use super::cl::ClContract;
use super::Price;

/// Barrels per CL contract: notional = contracts x 1,000 x price (USD).
pub const BARRELS_PER_CONTRACT: i64 = 1_000;

/// One position as the stores hold it.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    pub account_id: String,
    pub desk: String,
    pub symbol: String,
    /// Signed contracts: long > 0, short < 0.
    pub quantity: i64,
    pub avg_price: Option<Price>,
}

/// A position valued at its reference price.
#[derive(Debug, Clone, PartialEq)]
pub struct Valued {
    pub holding: Holding,
    /// `"2027-01"`, when the symbol is a CL contract.
    pub contract_month: Option<String>,
    pub reference_price: Option<Price>,
    /// Signed: quantity x 1,000 x reference price. `None` without a reference price.
    pub notional: Option<Decimal>,
    /// quantity x 1,000 x (reference - average price). `None` without either price.
    pub unrealized_pnl: Option<Decimal>,
}

/// Values one position at `reference`.
/// A figure beyond the decimal range (about 7.9e28) is `None`: the position counts as
/// unpriced rather than being given a wrong number.
pub fn value(holding: Holding, reference: Option<Price>) -> Valued {
    let barrels = Decimal::from(holding.quantity).checked_mul(Decimal::from(BARRELS_PER_CONTRACT));
    let notional = reference
        .zip(barrels)
        .and_then(|(r, b)| b.checked_mul(r.value()));
    let unrealized_pnl = match (reference, holding.avg_price, barrels) {
        (Some(r), Some(a), Some(b)) => r
            .value()
            .checked_sub(a.value())
            .and_then(|d| b.checked_mul(d)),
        _ => None,
    };
    Valued {
        contract_month: ClContract::parse(&holding.symbol)
            .ok()
            .map(|c| c.contract_month()),
        holding,
        reference_price: reference,
        notional,
        unrealized_pnl,
    }
}

/// The book's totals over the positions that have a reference price.
#[derive(Debug, Clone, PartialEq)]
pub struct Totals {
    /// Sum of absolute notionals.
    pub gross_notional: Decimal,
    /// Sum of signed notionals.
    pub net_notional: Decimal,
    /// Sum of signed contracts (every position, priced or not).
    pub net_contracts: i64,
    pub unrealized_pnl: Decimal,
    /// Positions left out of the notionals for want of a reference price.
    pub unpriced_positions: usize,
}

pub fn totals(book: &[Valued]) -> Totals {
    let mut t = Totals {
        gross_notional: Decimal::ZERO,
        net_notional: Decimal::ZERO,
        net_contracts: 0,
        unrealized_pnl: Decimal::ZERO,
        unpriced_positions: 0,
    };
    for v in book {
        t.net_contracts = t.net_contracts.saturating_add(v.holding.quantity);
        let sums = v.notional.and_then(|n| {
            Some((
                t.gross_notional.checked_add(n.abs())?,
                t.net_notional.checked_add(n)?,
                t.unrealized_pnl
                    .checked_add(v.unrealized_pnl.unwrap_or_default())?,
            ))
        });
        match sums {
            Some((gross, net, pnl)) => {
                t.gross_notional = gross;
                t.net_notional = net;
                t.unrealized_pnl = pnl;
            }
            // No price, or a sum beyond the decimal range: left out, and counted.
            None if v.holding.quantity != 0 => t.unpriced_positions += 1,
            None => {}
        }
    }
    t
}

/// One slice of an allocation: its gross notional and its share of the whole, in percent
/// with two decimals.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub key: String,
    pub gross_notional: Decimal,
    pub percent: Decimal,
}

/// Shares of the gross notional by `key`, in key order, as percentages with two decimals
/// that sum to exactly 100.00 (largest remainder: the hundredths lost to rounding go to the
/// slices that lost the most). Empty when there is no notional.
pub fn shares<'a>(book: &'a [Valued], key: impl Fn(&'a Valued) -> String) -> Vec<Share> {
    let mut parts: BTreeMap<String, Decimal> = BTreeMap::new();
    for v in book {
        // A flat position (quantity 0) is no slice: a closed-out month is not "held".
        if let Some(n) = v.notional.filter(|n| !n.is_zero()) {
            let part = parts.entry(key(v)).or_default();
            *part = part.saturating_add(n.abs());
        }
    }
    let gross: Decimal = parts
        .values()
        .fold(Decimal::ZERO, |a, b| a.saturating_add(*b));
    if gross.is_zero() {
        return Vec::new();
    }
    let hundredths = Decimal::from(10_000);
    // Exact shares in hundredths of a percent, floored, and what flooring took off.
    let mut out: Vec<(Share, Decimal)> = parts
        .into_iter()
        .map(|(key, n)| {
            // Exact when n x 10,000 is representable; else divided first (28 digits).
            let exact = n
                .checked_mul(hundredths)
                .map(|x| x / gross)
                .unwrap_or_else(|| n / gross * hundredths);
            let floor = exact.floor();
            (
                Share {
                    key,
                    gross_notional: n,
                    percent: floor,
                },
                exact - floor,
            )
        })
        .collect();
    let given: Decimal = out.iter().map(|(s, _)| s.percent).sum();
    let mut left = (hundredths - given)
        .to_string()
        .parse::<usize>()
        .unwrap_or(0);
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|a, b| out[*b].1.cmp(&out[*a].1).then(a.cmp(b)));
    for i in order {
        if left == 0 {
            break;
        }
        out[i].0.percent += Decimal::ONE;
        left -= 1;
    }
    out.into_iter()
        .map(|(mut s, _)| {
            s.percent = (s.percent / Decimal::from(100)).round_dp(2);
            s.percent.rescale(2);
            s
        })
        .collect()
}

/// Thresholds of the risk flags (the risk policy's, with these defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    /// One contract month above this share of the gross notional: `concentration` (warn).
    pub concentration_pct: Decimal,
    /// Whether a book held in one contract month only is flagged as concentrated. No by
    /// default: such a book is a deliberate choice the allocation shows at once, and a flag
    /// that is always on teaches people to ignore flags.
    pub flag_single_month_book: bool,
    /// A position above this share of `max_position`: `near_limit` (warn).
    pub near_limit_pct: Decimal,
    pub max_position: u32,
    /// The policy's close-only window before the last trading day (business days).
    pub close_only_business_days: u32,
    /// Within this many business days of the last trading day: `delivery` (fail).
    pub delivery_business_days: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            concentration_pct: Decimal::from(25),
            flag_single_month_book: false,
            near_limit_pct: Decimal::from(80),
            max_position: 50,
            close_only_business_days: 2,
            delivery_business_days: 5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warn,
    Fail,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    /// `concentration`, `near_limit`, `close_only`, `delivery`.
    pub kind: &'static str,
    pub severity: Severity,
    pub message: String,
    /// The figures behind the flag, as decimal text.
    pub figures: BTreeMap<&'static str, String>,
}

/// The flags of one account's book, in a fixed order: concentration, then per position
/// (by symbol) near-limit and delivery.
pub fn risk_flags(
    book: &[Valued],
    today: NaiveDate,
    cal: &ExchangeCalendar,
    th: &Thresholds,
) -> Vec<Flag> {
    let mut flags = Vec::new();
    let months = shares(book, |v| {
        v.contract_month
            .clone()
            .unwrap_or_else(|| v.holding.symbol.clone())
    });
    if months.len() > 1 || th.flag_single_month_book {
        for m in months.iter().filter(|m| m.percent > th.concentration_pct) {
            flags.push(Flag {
                kind: "concentration",
                severity: Severity::Warn,
                message: format!(
                    "{} holds {}% of the gross notional (above {}%)",
                    m.key, m.percent, th.concentration_pct
                ),
                figures: BTreeMap::from([
                    ("contract_month", m.key.clone()),
                    ("percent", m.percent.to_string()),
                    ("threshold_percent", th.concentration_pct.to_string()),
                    ("gross_notional", m.gross_notional.to_string()),
                ]),
            });
        }
    }
    let mut positions: Vec<&Valued> = book.iter().filter(|v| v.holding.quantity != 0).collect();
    positions.sort_by(|a, b| a.holding.symbol.cmp(&b.holding.symbol));
    for v in positions {
        let h = &v.holding;
        let size = Decimal::from(h.quantity.unsigned_abs());
        let limit = Decimal::from(th.max_position);
        if !limit.is_zero() && size * Decimal::from(100) > limit * th.near_limit_pct {
            let pct = (size * Decimal::from(100) / limit).round_dp(2);
            flags.push(Flag {
                kind: "near_limit",
                severity: Severity::Warn,
                message: format!(
                    "{} {} is {} contracts, {pct}% of the position limit of {}",
                    h.account_id, h.symbol, h.quantity, th.max_position
                ),
                figures: BTreeMap::from([
                    ("symbol", h.symbol.clone()),
                    ("quantity", h.quantity.to_string()),
                    ("max_position", th.max_position.to_string()),
                    ("percent", pct.to_string()),
                ]),
            });
        }
        let Ok(contract) = ClContract::parse(&h.symbol) else {
            continue;
        };
        let last = contract.last_trade_date(cal);
        let left = cal.business_days_between(today, last);
        let (kind, why) = if today > last {
            ("delivery", "is past its last trading day")
        } else if left <= th.close_only_business_days as i64 {
            ("close_only", "is in the close-only window")
        } else if left <= th.delivery_business_days as i64 {
            ("delivery", "is close to its last trading day")
        } else {
            continue;
        };
        flags.push(Flag {
            kind,
            severity: Severity::Fail,
            message: format!(
                "{} {} ({} contracts) {why}: {left} business days to {last}; CL settles by physical delivery at Cushing",
                h.account_id, h.symbol, h.quantity
            ),
            figures: BTreeMap::from([
                ("symbol", h.symbol.clone()),
                ("quantity", h.quantity.to_string()),
                ("last_trade_date", last.to_string()),
                ("business_days_left", left.to_string()),
            ]),
        });
    }
    flags
}

/// What an order would do to a book's flags: the flags it would create, the ones already
/// raised about its contract that it would make worse, and the ones it would clear (plan's
/// `concentration` what-if check).
#[derive(Debug, Clone, PartialEq)]
pub struct WhatIf {
    pub created: Vec<Flag>,
    /// Raised before and after, about the order's contract or month, with a larger
    /// `percent` after.
    pub deepened: Vec<Flag>,
    pub cleared: Vec<Flag>,
    /// The order's contract month's share of the gross notional after the order, percent
    /// (`None` when the book after the order has no priced notional).
    pub month_percent_after: Option<Decimal>,
}

/// A flag's identity across two books: its type and what it is about.
fn flag_key(f: &Flag) -> (&'static str, String) {
    let about = f
        .figures
        .get("symbol")
        .or_else(|| f.figures.get("contract_month"))
        .cloned()
        .unwrap_or_default();
    (f.kind, about)
}

fn percent(f: &Flag) -> Option<Decimal> {
    f.figures.get("percent").and_then(|p| p.parse().ok())
}

/// The book after `delta` contracts of `position`'s symbol fill in full on its account
/// (buys positive, sells negative; `position.quantity` is ignored), valued at `reference`
/// (the contract's reference price, as every position is), and how its flags differ from
/// the book's now. Other working orders are not assumed filled.
pub fn what_if(
    book: &[Valued],
    position: &Holding,
    delta: i64,
    reference: Option<Price>,
    today: NaiveDate,
    cal: &ExchangeCalendar,
    th: &Thresholds,
) -> WhatIf {
    let mut after: Vec<Valued> = book.to_vec();
    match after.iter_mut().find(|v| {
        v.holding.account_id == position.account_id && v.holding.symbol == position.symbol
    }) {
        Some(v) => {
            let mut h = v.holding.clone();
            h.quantity = h.quantity.saturating_add(delta);
            *v = value(h, reference);
        }
        None => after.push(value(
            Holding {
                quantity: delta,
                ..position.clone()
            },
            reference,
        )),
    }
    let before = risk_flags(book, today, cal, th);
    let now = risk_flags(&after, today, cal, th);
    let keys =
        |flags: &[Flag]| -> Vec<(&'static str, String)> { flags.iter().map(flag_key).collect() };
    let (kb, ka) = (keys(&before), keys(&now));
    let month = ClContract::parse(&position.symbol)
        .ok()
        .map(|c| c.contract_month())
        .unwrap_or_else(|| position.symbol.clone());
    let month_percent_after = shares(&after, |v| {
        v.contract_month
            .clone()
            .unwrap_or_else(|| v.holding.symbol.clone())
    })
    .into_iter()
    .find(|s| s.key == month)
    .map(|s| s.percent);
    WhatIf {
        created: now
            .iter()
            .filter(|f| !kb.contains(&flag_key(f)))
            .cloned()
            .collect(),
        deepened: now
            .iter()
            .filter(|f| {
                let (_, about) = flag_key(f);
                (about == position.symbol || about == month)
                    && before
                        .iter()
                        .find(|b| flag_key(b) == flag_key(f))
                        .is_some_and(|b| percent(b) < percent(f))
            })
            .cloned()
            .collect(),
        cleared: before
            .iter()
            .filter(|f| !ka.contains(&flag_key(f)))
            .cloned()
            .collect(),
        month_percent_after,
    }
}

/// Long and short contracts per contract month, and in all: the calendar exposure.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CalendarExposure {
    pub long_contracts: i64,
    pub short_contracts: i64,
    /// Net contracts per contract month, in month order.
    pub by_month: BTreeMap<String, i64>,
}

pub fn calendar_exposure(book: &[Valued]) -> CalendarExposure {
    let mut e = CalendarExposure::default();
    for v in book {
        let q = v.holding.quantity;
        if q > 0 {
            e.long_contracts += q;
        } else {
            e.short_contracts += -q;
        }
        if let Some(m) = &v.contract_month {
            *e.by_month.entry(m.clone()).or_default() += q;
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    fn holding(account: &str, symbol: &str, qty: i64, avg: &str) -> Holding {
        Holding {
            account_id: account.into(),
            desk: "energy".into(),
            symbol: symbol.into(),
            quantity: qty,
            avg_price: Some(price(avg)),
        }
    }

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    fn date(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    /// A two-month book, computed by hand: +3 CLF27 bought at 68.40, -2 CLG27 sold at 67.95;
    /// references 70.00 and 69.50.
    fn book() -> Vec<Valued> {
        vec![
            value(holding("ACC-1", "CLF27", 3, "68.40"), Some(price("70.00"))),
            value(holding("ACC-1", "CLG27", -2, "67.95"), Some(price("69.50"))),
        ]
    }

    #[test]
    fn notionals_and_pnl_are_exact_decimals() {
        let b = book();
        // 3 x 1,000 x 70.00 and -2 x 1,000 x 69.50.
        assert_eq!(b[0].notional, Some(d("210000.00")));
        assert_eq!(b[1].notional, Some(d("-139000.00")));
        // 3,000 x (70.00 - 68.40) and -2,000 x (69.50 - 67.95).
        assert_eq!(b[0].unrealized_pnl, Some(d("4800.00")));
        assert_eq!(b[1].unrealized_pnl, Some(d("-3100.00")));
        assert_eq!(b[0].contract_month.as_deref(), Some("2027-01"));
        let t = totals(&b);
        assert_eq!(t.gross_notional, d("349000"));
        assert_eq!(t.net_notional, d("71000"));
        assert_eq!(t.net_contracts, 1);
        assert_eq!(t.unrealized_pnl, d("1700"));
        assert_eq!(t.unpriced_positions, 0);
        // No binary floating point: 0.1 + 0.2 of a dollar stays 0.3.
        let v = value(holding("A", "CLF27", 1, "0.1"), Some(price("0.3")));
        assert_eq!(v.unrealized_pnl, Some(d("200.0")));
    }

    #[test]
    fn shares_sum_to_exactly_one_hundred() {
        let b = book();
        let s = shares(&b, |v| v.contract_month.clone().unwrap());
        // 210,000 / 349,000 = 60.1719...%, 139,000 / 349,000 = 39.8280...%.
        assert_eq!(
            s.iter().map(|s| s.percent.to_string()).collect::<Vec<_>>(),
            ["60.17", "39.83"]
        );
        // Three equal slices: 33.34 + 33.33 + 33.33 (the remainder goes to the first).
        let three: Vec<Valued> = ["CLF27", "CLG27", "CLH27"]
            .iter()
            .map(|s| value(holding("A", s, 1, "70"), Some(price("70"))))
            .collect();
        let s = shares(&three, |v| v.holding.symbol.clone());
        let p: Vec<String> = s.iter().map(|s| s.percent.to_string()).collect();
        assert_eq!(p, ["33.34", "33.33", "33.33"]);
        let sum: Decimal = s.iter().map(|s| s.percent).sum();
        assert_eq!(sum, d("100.00"));
        assert!(shares(&[], |v: &Valued| v.holding.symbol.clone()).is_empty());
    }

    #[test]
    fn flags_are_the_documented_ones() {
        let cal = ExchangeCalendar::cme();
        let th = Thresholds::default();
        // 2026-11-23: CLF27 trades until 2026-12-21, 19 business days away.
        let f = risk_flags(&book(), date("2026-11-23"), cal, &th);
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].kind, "concentration");
        assert_eq!(f[0].figures["contract_month"], "2027-01");
        assert_eq!(f[0].figures["percent"], "60.17");
        assert_eq!(f[1].kind, "concentration");
        assert_eq!(f[1].figures["percent"], "39.83");
        assert!(f.iter().all(|f| f.severity == Severity::Warn));

        // A deliberately single-month book is not flagged as concentrated, unless asked.
        let one = vec![value(holding("A", "CLF27", 41, "70"), Some(price("70")))];
        let f = risk_flags(&one, date("2026-11-23"), cal, &th);
        assert_eq!(f.iter().map(|f| f.kind).collect::<Vec<_>>(), ["near_limit"]);
        assert_eq!(f[0].figures["percent"], "82");
        let strict = Thresholds {
            flag_single_month_book: true,
            ..Thresholds::default()
        };
        let f = risk_flags(&one, date("2026-11-23"), cal, &strict);
        assert_eq!(f[0].kind, "concentration");
        assert_eq!(f[0].figures["percent"], "100.00");
        // 40 of 50 is exactly 80%: not above it.
        let at = vec![value(holding("A", "CLF27", -40, "70"), Some(price("70")))];
        assert!(risk_flags(&at, date("2026-11-23"), cal, &th).is_empty());

        // Delivery: 5 business days before the last trading day (2026-12-21) fails, and
        // inside the close-only window (2) it is `close_only`.
        let f = risk_flags(&one, date("2026-12-14"), cal, &th);
        let kinds: Vec<&str> = f.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, ["near_limit", "delivery"], "{f:?}");
        assert_eq!(f[1].severity, Severity::Fail);
        assert_eq!(f[1].figures["business_days_left"], "5");
        assert_eq!(f[1].figures["last_trade_date"], "2026-12-21");
        let f = risk_flags(&one, date("2026-12-17"), cal, &th);
        assert_eq!(f[1].kind, "close_only", "{f:?}");
        assert_eq!(f[1].figures["business_days_left"], "2");
        // Six business days out: nothing about delivery.
        let f = risk_flags(&one, date("2026-12-11"), cal, &th);
        assert_eq!(f.len(), 1, "{f:?}");
        // A flat position has no flags.
        let flat = vec![value(holding("A", "CLF27", 0, "70"), Some(price("70")))];
        assert!(risk_flags(&flat, date("2026-12-18"), cal, &th).is_empty());
    }

    #[test]
    fn what_if_reports_flags_created_deepened_and_cleared() {
        let cal = ExchangeCalendar::cme();
        let today = date("2026-11-24");
        let th = Thresholds::default();
        let b = book();
        let f27 = Holding {
            quantity: 0,
            ..holding("ACC-1", "CLF27", 0, "1")
        };
        // Buying 2 more CLF27: 5 x 70,000 = 350,000 of 489,000 = 71.57% (was 60.17%): the
        // concentration flag on 2027-01 is there before and deepens; nothing new.
        let w = what_if(&b, &f27, 2, Some(price("70.00")), today, cal, &th);
        assert!(w.created.is_empty(), "{w:?}");
        assert_eq!(w.deepened.len(), 1);
        assert_eq!(w.deepened[0].figures["percent"], "71.57");
        assert!(w.cleared.is_empty());
        assert_eq!(w.month_percent_after, Some(d("71.57")));
        // A third month CLH27 at 69.00, 4 contracts: 276,000 of 625,000 = 44.16%: a new
        // concentration flag; 2027-01 falls to 33.60% (still flagged, not deepened).
        let h27 = holding("ACC-1", "CLH27", 0, "1");
        let w = what_if(&b, &h27, 4, Some(price("69.00")), today, cal, &th);
        assert_eq!(w.created.len(), 1, "{w:?}");
        assert_eq!(w.created[0].kind, "concentration");
        assert_eq!(w.created[0].figures["contract_month"], "2027-03");
        assert_eq!(w.created[0].figures["percent"], "44.16");
        assert!(w.deepened.is_empty());
        // Selling the 3 CLF27 leaves a one-month book: its flags clear (a single-month book
        // is not flagged by default) and nothing is created.
        let w = what_if(&b, &f27, -3, Some(price("70.00")), today, cal, &th);
        assert!(w.created.is_empty());
        assert_eq!(w.cleared.len(), 2, "{w:?}");
        assert_eq!(w.month_percent_after, None);
        // Near the position limit: 38 more CLF27 make 41 of 50 (82%).
        let w = what_if(&b, &f27, 38, Some(price("70.00")), today, cal, &th);
        assert_eq!(
            w.created.iter().map(|f| f.kind).collect::<Vec<_>>(),
            ["near_limit"]
        );
    }

    #[test]
    fn figures_beyond_the_decimal_range_are_left_out_not_a_panic() {
        let max = Price::parse("79228162514264337593543950335").unwrap();
        let big = value(holding("ACC-1", "CLF27", 3, "68.40"), Some(max));
        assert_eq!((big.notional, big.unrealized_pnl), (None, None));
        let mut b = book();
        b.push(big);
        // Two huge but representable notionals whose sum is not.
        let half = Price::parse("30000000000000000000000000").unwrap();
        b.push(value(holding("ACC-1", "CLG27", 2, "1"), Some(half)));
        b.push(value(holding("ACC-1", "CLH27", 2, "1"), Some(half)));
        let t = totals(&b);
        assert_eq!(t.unpriced_positions, 2, "{t:?}");
        let s = shares(&b, |v| v.holding.symbol.clone());
        assert!(!s.is_empty());
        let th = Thresholds::default();
        let cal = ExchangeCalendar::cme();
        let _ = risk_flags(&b, date("2026-11-24"), cal, &th);
        let f27 = holding("ACC-1", "CLF27", 0, "1");
        let _ = what_if(&b, &f27, 2, Some(max), date("2026-11-24"), cal, &th);
    }

    #[test]
    fn calendar_exposure_sums_long_and_short() {
        let e = calendar_exposure(&book());
        assert_eq!((e.long_contracts, e.short_contracts), (3, 2));
        assert_eq!(
            e.by_month,
            BTreeMap::from([("2027-01".to_string(), 3), ("2027-02".to_string(), -2)])
        );
        let unpriced = vec![Valued {
            notional: None,
            unrealized_pnl: None,
            reference_price: None,
            ..book().remove(0)
        }];
        assert_eq!(totals(&unpriced).unpriced_positions, 1);
        assert_eq!(totals(&unpriced).gross_notional, Decimal::ZERO);
    }
}
