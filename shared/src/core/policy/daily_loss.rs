//! `daily_loss`: an account whose loss on the trading day (realized plus unrealized, USD)
//! is at or beyond `max_daily_loss` is close-only until the next trading day. Orders that
//! reduce the position without flipping it, counting open orders as `expiry_window` does,
//! pass; any other fails, with the day's P&L and the limit in the reason.

use rust_decimal::Decimal;

use super::RiskCheck;
use crate::core::domain::pnl::DayPnl;
use crate::core::domain::Side;

const NAME: &str = "daily_loss";

/// USD for people: `-12,345.60`.
pub fn usd(d: Decimal) -> String {
    let d = d.round_dp(2);
    let text = format!("{:.2}", d.abs());
    let (whole, cents) = text.split_once('.').unwrap_or((&text, "00"));
    let mut grouped = String::new();
    for (n, c) in whole.chars().enumerate() {
        if n > 0 && (whole.len() - n) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if d.is_sign_negative() && !d.is_zero() {
        "-"
    } else {
        ""
    };
    format!("{sign}{grouped}.{cents}")
}

/// "P&L -120,000.00 USD on trading day 2026-03-03 (realized -100,000.00, unrealized
/// -20,000.00)".
fn pnl_text(p: &DayPnl) -> String {
    let unpriced = if p.unpriced.is_empty() {
        String::new()
    } else {
        format!(
            "; without a reference price, left out: {}",
            p.unpriced.join(", ")
        )
    };
    format!(
        "P&L {} USD on trading day {} (realized {}, unrealized {}{unpriced})",
        usd(p.total),
        p.trading_day,
        usd(p.realized),
        usd(p.unrealized)
    )
}

/// The check at plan and execute (`checks::daily_loss` gathers its inputs): `limit` the
/// policy's, `pnl` the account's day, `reduces` whether the order reduces the position
/// without flipping it (counting open orders), `exposure` the position and open orders in
/// words.
pub fn check(
    limit: Option<Decimal>,
    pnl: Option<&DayPnl>,
    account_id: &str,
    reduces: bool,
    exposure: &str,
) -> RiskCheck {
    let Some(limit) = limit else {
        return RiskCheck::pass(NAME, "the policy sets no daily loss limit");
    };
    let Some(p) = pnl else {
        return RiskCheck::pass(NAME, "the day's P&L was not measured for this check");
    };
    let limit_text = format!("the daily loss limit of {} USD", usd(limit));
    if !p.breaches(Some(limit)) {
        return RiskCheck::pass(
            NAME,
            format!(
                "{account_id} {}: {} USD left of {limit_text}",
                pnl_text(p),
                usd(p.remaining(limit))
            ),
        );
    }
    let head = format!(
        "{account_id} {}, at or beyond {limit_text}: close-only until the next trading day",
        pnl_text(p)
    );
    if reduces {
        RiskCheck::pass(
            NAME,
            format!("{head}; this order reduces the position without flipping it ({exposure})"),
        )
    } else {
        RiskCheck::fail(
            NAME,
            format!(
                "{head}; only orders that reduce the position without flipping it, counting open orders, pass, and {exposure}"
            ),
        )
    }
}

/// The worker's gate before the broker (`checks::daily_loss_gate` gathers its inputs):
/// past the limit, an order whose side's worst case, with its own contracts counted,
/// leaves the position's side (`reduces` false) is stopped. `Err`: why.
pub fn gate(
    limit: Option<Decimal>,
    pnl: Option<&DayPnl>,
    account_id: &str,
    side: Side,
    reduces: bool,
    exposure: &str,
) -> Result<(), String> {
    match (limit, pnl) {
        (Some(limit), Some(p)) if p.breaches(Some(limit)) && !reduces => Err(format!(
            "{account_id} {}, at or beyond the daily loss limit of {} USD: close-only until the next trading day, and this {side} order adds exposure ({exposure} with this order counted)",
            pnl_text(p),
            usd(limit),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::domain::{Exposure, OrderSubmitCl};
    use crate::core::policy::checks::tests::order;
    use crate::core::policy::checks::{self, daily_loss, daily_loss_gate, OrderInputs};
    use crate::core::policy::{position_gate, reservation_bound, Policy};

    fn pnl(total: &str) -> DayPnl {
        let total: Decimal = total.parse().unwrap();
        DayPnl {
            trading_day: "2026-11-23".parse().unwrap(),
            realized: total,
            unrealized: Decimal::ZERO,
            total,
            unpriced: Vec::new(),
        }
    }

    fn inputs<'a>(
        policy: &'a Policy,
        o: &'a OrderSubmitCl,
        exposure: Exposure,
        p: &'a DayPnl,
    ) -> OrderInputs<'a> {
        OrderInputs {
            exposure,
            day_pnl: Some(p),
            ..checks::tests::inputs(policy, o, None)
        }
    }

    #[test]
    fn usd_is_grouped_with_two_decimals() {
        assert_eq!(usd("-120000".parse().unwrap()), "-120,000.00");
        assert_eq!(usd("1234567.891".parse().unwrap()), "1,234,567.89");
        assert_eq!(usd("0".parse().unwrap()), "0.00");
        assert_eq!(usd("-0.001".parse().unwrap()), "0.00");
        assert_eq!(usd("999".parse().unwrap()), "999.00");
    }

    #[test]
    fn past_the_limit_only_reductions_pass() {
        let policy = Policy {
            max_daily_loss: Some("100000".parse().unwrap()),
            ..Policy::default()
        };
        let long3 = Exposure {
            position: 3,
            open_buy: 0,
            open_sell: 0,
        };
        let (buy1, sell3, sell4) = (
            order(Side::Buy, 1),
            order(Side::Sell, 3),
            order(Side::Sell, 4),
        );
        let under = pnl("-99999.99");
        let at = pnl("-100000");
        // Under the limit: everything passes, with what is left.
        let c = daily_loss(&inputs(&policy, &buy1, long3, &under));
        assert!(
            !c.failed() && c.reason.contains("0.01 USD left"),
            "{}",
            c.reason
        );
        // At the limit: a buy adds, a sell of 3 closes, a sell of 4 flips.
        let c = daily_loss(&inputs(&policy, &buy1, long3, &at));
        assert!(c.failed(), "{}", c.reason);
        assert!(
            c.reason.contains("P&L -100,000.00 USD")
                && c.reason.contains("limit of 100,000.00 USD"),
            "{}",
            c.reason
        );
        assert!(!daily_loss(&inputs(&policy, &sell3, long3, &at)).failed());
        assert!(daily_loss(&inputs(&policy, &sell4, long3, &at)).failed());
        // Open sells count: with 2 already working, a sell of 3 would flip.
        let working = Exposure {
            open_sell: 2,
            ..long3
        };
        assert!(daily_loss(&inputs(&policy, &sell3, working, &at)).failed());
        // The reservation bound agrees: a buy never fits, a closing sell does.
        let i = inputs(&policy, &buy1, long3, &at);
        assert!(!long3.leaves_room(Side::Buy, reservation_bound(&i)));
        let i = inputs(&policy, &sell3, long3, &at);
        assert!(long3.leaves_room(Side::Sell, reservation_bound(&i)));
        // No limit: nothing is close-only.
        let open = Policy {
            max_daily_loss: None,
            ..policy.clone()
        };
        assert!(!daily_loss(&inputs(&open, &buy1, long3, &pnl("-1e9"))).failed());
    }

    #[test]
    fn the_worker_gate_counts_the_order_itself() {
        let policy = Policy {
            max_daily_loss: Some("100000".parse().unwrap()),
            ..Policy::default()
        };
        let at = pnl("-150000");
        // Long 3 with this sell of 3 reserved: it closes, it passes.
        let sell3 = order(Side::Sell, 3);
        let reserved = Exposure {
            position: 3,
            open_buy: 0,
            open_sell: 3,
        };
        assert_eq!(
            daily_loss_gate(&inputs(&policy, &sell3, reserved, &at)),
            Ok(())
        );
        assert!(position_gate(&inputs(&policy, &sell3, reserved, &at)).is_ok());
        // A buy of 1 reserved on a long: it adds, it is stopped with the P&L and limit.
        let buy1 = order(Side::Buy, 1);
        let reserved = Exposure {
            position: 3,
            open_buy: 1,
            open_sell: 0,
        };
        let why = daily_loss_gate(&inputs(&policy, &buy1, reserved, &at)).unwrap_err();
        assert!(
            why.contains("-150,000.00") && why.contains("100,000.00") && why.contains("adds"),
            "{why}"
        );
        // Under the limit it passes.
        let fine = pnl("-10");
        assert_eq!(
            daily_loss_gate(&inputs(&policy, &buy1, reserved, &fine)),
            Ok(())
        );
    }
}
