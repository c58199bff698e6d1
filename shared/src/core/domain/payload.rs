//! Normalized payloads: what a plan settled on for each action type, and what execute,
//! the queue message and the workers act on. The JSON is the contract's
//! `normalized_payload` (no tag: the `action_type` beside it names the variant), and its
//! canonical form is what the confirmation token's `payload_hash` covers.

use serde::{Deserialize, Serialize};

use super::{Ident, OrderSubmitCl, OrderTerms, OrderType, Price, Quantity, TimeInForce};

/// The normalized `order.submit.cl` payload. `symbol` is canonical (`CLF27`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NormalizedOrder {
    #[serde(flatten)]
    pub terms: OrderTerms,
    pub contract_month: Option<String>,
    pub last_trade_date: Option<String>,
    /// Set when the request asked for a market or stop order: the terms above are the
    /// protected order that goes to the broker (a limit, or a stop-limit), and this says
    /// what was asked and where the protected limit comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub market_protection: Option<MarketProtection>,
}

/// How a market or stop order is bounded: sent as a limit `points` beyond `from_price` (above it
/// for a buy, below for a sell), on the tick, never further.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MarketProtection {
    /// What the request asked for: `market` (sent as `limit`) or `stop` (sent as
    /// `stop_limit`).
    pub requested_type: OrderType,
    /// The price the protected limit is measured from: the reference price for a market
    /// order, the stop price for a stop order.
    pub from_price: Price,
    /// The policy's `market_protection_points` (dollars per barrel).
    pub points: Price,
}

impl NormalizedOrder {
    /// The order as its request would have said it, for the checks that run again at
    /// execute and at the worker.
    pub fn as_request(&self) -> Result<OrderSubmitCl, String> {
        let t = &self.terms;
        Ok(OrderSubmitCl {
            account_id: Ident::parse(&t.account_id)?,
            symbol: t.symbol.clone(),
            side: t.side,
            quantity: Quantity::new(t.quantity as i64)?,
            order_type: t.order_type,
            limit_price: t.limit_price,
            stop_price: t.stop_price,
            time_in_force: t.time_in_force,
        })
    }
}

/// The normalized `order.cancel` payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NormalizedCancel {
    pub account_id: String,
    pub order_id: String,
}

/// The normalized `positions.sync` payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NormalizedSync {
    pub account_id: String,
}

pub use super::NormalizedPayload;

/// The normalized `order.replace.cl` payload: the order as it will be after the change
/// (its full terms, as a new order's), the order it changes, and that order's values when
/// the plan was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NormalizedReplace {
    #[serde(flatten)]
    pub order: NormalizedOrder,
    pub order_id: String,
    pub replaces: Replaced,
}

/// An order's values as a replace found them: what the approval page shows as "before".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Replaced {
    pub order_id: String,
    /// The version the replace applies to; the worker refuses it if the order has moved on.
    pub version: u32,
    pub quantity: u32,
    pub filled_quantity: u32,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
}

impl NormalizedReplace {
    /// Contracts the change adds to the order (0 for a reduction).
    pub fn increase(&self) -> u32 {
        self.order
            .terms
            .quantity
            .saturating_sub(self.replaces.quantity)
    }

    /// Contracts the change takes off the order (0 for an increase).
    pub fn decrease(&self) -> u32 {
        self.replaces
            .quantity
            .saturating_sub(self.order.terms.quantity)
    }

    /// A change that only lowers the quantity: it reduces risk, like a cancel.
    pub fn only_reduces(&self) -> bool {
        let t = &self.order.terms;
        let r = &self.replaces;
        t.quantity < r.quantity
            && t.limit_price == r.limit_price
            && t.stop_price == r.stop_price
            && t.time_in_force == r.time_in_force
    }
}

/// A replace travels in its order's group (`ACC-1#CLF27`), behind the order's submission.
impl Payload for NormalizedReplace {
    fn account_id(&self) -> &str {
        &self.order.terms.account_id
    }
    fn message_group(&self) -> String {
        self.order.message_group()
    }
    fn adds_risk(&self) -> bool {
        !self.only_reduces()
    }
    fn order_terms(&self) -> Option<&OrderTerms> {
        Some(&self.order.terms)
    }
    fn existing_order_id(&self) -> Option<&str> {
        Some(&self.order_id)
    }
}

/// What every normalized payload answers, whatever its type.
pub trait Payload {
    /// The account it acts on.
    fn account_id(&self) -> &str;
    /// The message group of its queue message: the messages of one group are handled one
    /// at a time, in the order they were accepted.
    fn message_group(&self) -> String;
    /// Whether executing it can add risk: such an action is stopped by the kill switch
    /// (at plan, execute and the worker) and runs on active accounts only.
    fn adds_risk(&self) -> bool;
    /// The terms of the order it places or leaves at the broker (a new order, an order as
    /// changed); `None` for the others.
    fn order_terms(&self) -> Option<&OrderTerms> {
        None
    }
    /// The existing order it acts on (a cancel, a change); `None` for the others.
    fn existing_order_id(&self) -> Option<&str> {
        None
    }
}

/// A submission travels in its account and contract's group (`ACC-1#CLF27`), so one
/// account's orders for one contract reach the broker in the order they were accepted,
/// while its orders for other contracts (whose positions, limits and reservations are
/// separate) are handled beside them.
impl Payload for NormalizedOrder {
    fn account_id(&self) -> &str {
        &self.terms.account_id
    }
    fn message_group(&self) -> String {
        format!("{}#{}", self.terms.account_id, self.terms.symbol)
    }
    fn adds_risk(&self) -> bool {
        true
    }
    fn order_terms(&self) -> Option<&OrderTerms> {
        Some(&self.terms)
    }
}

/// Cancels travel in the account's cancel group (`ACC-1#cancel`), so a cancel never waits
/// behind a submission that keeps failing.
impl Payload for NormalizedCancel {
    fn account_id(&self) -> &str {
        &self.account_id
    }
    fn message_group(&self) -> String {
        format!("{}#cancel", self.account_id)
    }
    fn adds_risk(&self) -> bool {
        false
    }
    fn existing_order_id(&self) -> Option<&str> {
        Some(&self.order_id)
    }
}

/// A sync travels in the account's group of the jobs queue.
impl Payload for NormalizedSync {
    fn account_id(&self) -> &str {
        &self.account_id
    }
    fn message_group(&self) -> String {
        self.account_id.clone()
    }
    fn adds_risk(&self) -> bool {
        false
    }
}

impl NormalizedPayload {
    pub fn account_id(&self) -> &str {
        self.payload().account_id()
    }

    pub fn message_group(&self) -> String {
        self.payload().message_group()
    }

    pub fn adds_risk(&self) -> bool {
        self.payload().adds_risk()
    }

    /// The order of a submission; `None` for the other action types.
    pub fn order(&self) -> Option<&NormalizedOrder> {
        match self {
            NormalizedPayload::OrderSubmitCl(o) => Some(o),
            _ => None,
        }
    }

    /// The JSON the payload hash is taken over.
    pub fn to_json(&self) -> serde_json::Value {
        // Only strings, numbers, decimals-as-strings and enums: serializing cannot fail.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::domain::ActionType;

    fn round_trip(v: serde_json::Value) -> NormalizedPayload {
        let p: NormalizedPayload = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(p.to_json(), v, "the stored JSON is unchanged");
        p
    }

    #[test]
    fn each_payload_reads_back_as_its_own_action_type() {
        let order = round_trip(serde_json::json!({
            "account_id": "ACC-1", "symbol": "CLF27", "contract_month": "2027-01",
            "last_trade_date": "2026-12-21", "side": "buy", "quantity": 2,
            "order_type": "limit", "limit_price": "68.40", "stop_price": null,
            "time_in_force": "day"
        }));
        assert_eq!(order.action_type(), ActionType::OrderSubmitCl);
        let mut replace = order.to_json();
        replace["order_id"] = "ord-1".into();
        replace["replaces"] = serde_json::json!({"order_id": "ord-1", "version": 1, "quantity": 1, "filled_quantity": 0, "limit_price": "68.40", "stop_price": null, "time_in_force": "day"});
        let replace = round_trip(replace);
        assert_eq!(
            replace.action_type(),
            ActionType::OrderReplaceCl,
            "a replace is not read as a new order"
        );
        let cancel = round_trip(serde_json::json!({"account_id": "ACC-1", "order_id": "ord-1"}));
        assert_eq!(cancel.action_type(), ActionType::OrderCancel);
        assert_eq!(cancel.payload().existing_order_id(), Some("ord-1"));
        let sync = round_trip(serde_json::json!({"account_id": "ACC-1"}));
        assert_eq!(sync.action_type(), ActionType::PositionsSync);
        // Neither a partial order nor a payload with a stray field reads as anything.
        for bad in [
            serde_json::json!({"account_id": "ACC-1", "symbol": "CLF27"}),
            serde_json::json!({"account_id": "ACC-1", "order_id": "o", "x": 1}),
            serde_json::json!({}),
        ] {
            assert!(
                serde_json::from_value::<NormalizedPayload>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
