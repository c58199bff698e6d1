//! What a person needs to decide on a plan at a glance: the money at stake, the price it
//! was measured against and how old that price is, the checks that did not simply pass,
//! what the buttons approve, and, for the pending list, who asked through which chat and
//! where a four-eyes plan stands. Computed from the plan record alone.

use rust_decimal::Decimal;
use serde::Serialize;

use crate::core::domain::{Millis, OrderType, Price, Side};
use crate::core::records::{ApprovalDecision, CheckStatus, PlanRecord, RiskCheck};
use crate::core::usecases::actions::{notional, CL_CONTRACT_BARRELS};

use super::still_needed;

/// The price an order's notional is measured at, and why that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PriceBasis {
    /// The order's limit price: it cannot trade worse.
    Limit,
    /// A stop order's stop price: where it becomes a market order.
    Stop,
    /// A market order: the contract's reference price when the plan was made.
    Reference,
}

/// An order's notional in USD: contracts x 1,000 bbl x price.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OrderValue {
    /// Absolute USD.
    pub usd: Decimal,
    pub price: Price,
    pub basis: PriceBasis,
}

/// The notional of the order a plan sends (for a change of an order, the order as it will
/// be after the change), or `None` when the plan sends no order or no price is known (a
/// market order planned without a reference price). The one place that picks the price: a
/// limit at its limit, a stop at its stop, a market order at the reference price recorded
/// with the plan (or the price behind the notional the plan recorded for four eyes).
pub fn order_value(plan: &PlanRecord) -> Option<OrderValue> {
    let t = plan.normalized_payload.payload().order_terms()?;
    let (price, basis) = match t.order_type {
        OrderType::Limit | OrderType::StopLimit => (t.limit_price?, PriceBasis::Limit),
        OrderType::Stop => (t.stop_price?, PriceBasis::Stop),
        OrderType::Market => match plan.reference_price {
            Some(p) => (p, PriceBasis::Reference),
            None => {
                let usd = plan.notional?;
                let barrels = Decimal::from(i64::from(t.quantity) * CL_CONTRACT_BARRELS);
                if barrels.is_zero() {
                    return None;
                }
                (Price::new(usd / barrels), PriceBasis::Reference)
            }
        },
    };
    Some(OrderValue {
        usd: notional(t.quantity, price),
        price,
        basis,
    })
}

/// When the plan's reference price was observed, if the plan recorded it.
pub fn reference_observed_at(plan: &PlanRecord) -> Option<Millis> {
    plan.reference_observed_at
}

/// USD with thousands separators: `$203,550`, `$68,412.50`.
pub fn usd(d: Decimal) -> String {
    let d = d.round_dp(2);
    let negative = d.is_sign_negative() && !d.is_zero();
    let d = d.abs();
    let whole = d.trunc();
    let cents = ((d - whole) * Decimal::from(100)).round();
    let digits = whole.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if negative { "-" } else { "" };
    if cents.is_zero() {
        format!("{sign}${grouped}")
    } else {
        format!("{sign}${grouped}.{cents:0>2}")
    }
}

/// A duration in words: `12 s`, `4 min`, `3 h`.
pub fn age(ms: Millis) -> String {
    let s = ms.max(0) / 1000;
    if s < 120 {
        format!("{s} s")
    } else if s < 120 * 60 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

/// The checks that did not simply pass (failures first, then warnings), in the plan's
/// order within each.
pub fn attention(plan: &PlanRecord) -> Vec<&RiskCheck> {
    let of = |s: CheckStatus| plan.risk_checks.iter().filter(move |c| c.status == s);
    of(CheckStatus::Fail).chain(of(CheckStatus::Warn)).collect()
}

/// The checks that passed.
pub fn passed(plan: &PlanRecord) -> Vec<&RiskCheck> {
    plan.risk_checks
        .iter()
        .filter(|c| c.status == CheckStatus::Pass)
        .collect()
}

/// What a decision button does, naming the order: `Approve: buy 3 CLF27 @ 67.85`.
pub fn decision_label(plan: &PlanRecord, d: ApprovalDecision) -> String {
    let verb = match d {
        ApprovalDecision::Approved => "Approve",
        ApprovalDecision::Declined => "Decline",
    };
    format!("{verb}: {}", short_order(plan))
}

/// The order in a few words: `buy 3 CLF27 @ 67.85`, `sell 1 CLF27 at market`, `change
/// O-1 to buy 3 CLF27 @ 65.95`; for a plan that sends no order, its preview.
pub fn short_order(plan: &PlanRecord) -> String {
    let p = plan.normalized_payload.payload();
    let Some(t) = p.order_terms() else {
        let text = plan.preview.trim_end_matches('.');
        let mut c = text.chars();
        return match c.next() {
            Some(first) => first.to_lowercase().chain(c).collect(),
            None => plan.action_type.as_str().to_string(),
        };
    };
    let side = match t.side {
        Side::Buy => "buy",
        Side::Sell => "sell",
    };
    let how = match (t.order_type, t.limit_price, t.stop_price) {
        (OrderType::Limit, Some(l), _) => format!("@ {l}"),
        (OrderType::Stop, _, Some(s)) => format!("stop {s}"),
        (OrderType::StopLimit, Some(l), Some(s)) => format!("stop {s} @ {l}"),
        _ => "at market".to_string(),
    };
    let order = format!("{side} {} {} {how}", t.quantity, t.symbol);
    match p.existing_order_id() {
        Some(id) => format!("change {id} to {order}"),
        None => order,
    }
}

/// A four-eyes plan's approvals so far and who it still waits for.
#[derive(Debug, Clone, Serialize)]
pub struct FourEyes {
    pub approved_by: Vec<String>,
    pub still_needed: String,
}

pub fn four_eyes(plan: &PlanRecord) -> Option<FourEyes> {
    plan.four_eyes.then(|| FourEyes {
        approved_by: plan.approvals.iter().map(|a| a.approver.clone()).collect(),
        still_needed: still_needed(plan),
    })
}

/// One plan of the pending list, as the page and its JSON show it.
#[derive(Debug, Clone, Serialize)]
pub struct PendingItem {
    pub plan_id: String,
    pub preview: String,
    /// The order's notional in USD (`$203,550`), when known.
    pub notional: Option<String>,
    pub requested_by: String,
    pub chat_session_id: Option<String>,
    pub desk: String,
    pub asked_at: Millis,
    pub expires_at: Millis,
    /// Milliseconds until it expires, at the time of the answer.
    pub left_ms: Millis,
    /// Checks that warned or failed.
    pub warnings: usize,
    pub four_eyes: Option<FourEyes>,
}

/// The chat session a plan was asked from, as its chat context says.
pub fn chat_session(plan: &PlanRecord) -> Option<String> {
    plan.chat_context
        .get("chat_session_id")
        .and_then(|v| v.as_str())
        .map(String::from)
}

pub fn pending_item(plan: &PlanRecord, now: Millis) -> PendingItem {
    PendingItem {
        plan_id: plan.plan_id.clone(),
        preview: plan.preview.clone(),
        notional: order_value(plan).map(|v| usd(v.usd)),
        requested_by: plan.requested_by.clone(),
        chat_session_id: chat_session(plan),
        desk: plan.desk.clone(),
        asked_at: plan.created_at,
        expires_at: plan.expires_at,
        left_ms: (plan.expires_at - now).max(0),
        warnings: attention(plan).len(),
        four_eyes: four_eyes(plan),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn dollars_are_grouped_in_thousands() {
        assert_eq!(usd(d("203550")), "$203,550");
        assert_eq!(usd(d("203550.00")), "$203,550");
        assert_eq!(usd(d("68412.5")), "$68,412.50");
        assert_eq!(usd(d("999")), "$999");
        assert_eq!(usd(d("1000")), "$1,000");
        assert_eq!(usd(d("1234567.891")), "$1,234,567.89");
        assert_eq!(usd(d("0")), "$0");
        assert_eq!(usd(d("-37630")), "-$37,630");
    }

    #[test]
    fn ages_read_as_words() {
        assert_eq!(age(12_400), "12 s");
        assert_eq!(age(-5), "0 s");
        assert_eq!(age(119_999), "119 s");
        assert_eq!(age(240_000), "4 min");
        assert_eq!(age(3 * 3_600_000), "3 h");
    }
}
