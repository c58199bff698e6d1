//! Normalized payloads: what a plan settled on for each action type, and what execute,
//! the queue message and the workers act on. The JSON is the contract's
//! `normalized_payload` (no tag: the `action_type` beside it names the variant), and its
//! canonical form is what the confirmation token's `payload_hash` covers.

use serde::{Deserialize, Serialize};

use super::{ActionType, Ident, OrderSubmitCl, OrderTerms, Quantity};

/// The normalized `order.submit.cl` payload. `symbol` is canonical (`CLF27`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NormalizedOrder {
    #[serde(flatten)]
    pub terms: OrderTerms,
    pub contract_month: Option<String>,
    pub last_trade_date: Option<String>,
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

/// One normalized payload per action type. Stored and sent untagged; the variants cannot
/// be mistaken for one another (an order has a side, a cancel an order id, and neither
/// a cancel nor a sync accepts a field it does not have).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum NormalizedPayload {
    OrderSubmitCl(NormalizedOrder),
    OrderCancel(NormalizedCancel),
    PositionsSync(NormalizedSync),
}

impl NormalizedPayload {
    pub fn action_type(&self) -> ActionType {
        match self {
            NormalizedPayload::OrderSubmitCl(_) => ActionType::OrderSubmitCl,
            NormalizedPayload::OrderCancel(_) => ActionType::OrderCancel,
            NormalizedPayload::PositionsSync(_) => ActionType::PositionsSync,
        }
    }

    pub fn account_id(&self) -> &str {
        match self {
            NormalizedPayload::OrderSubmitCl(o) => &o.terms.account_id,
            NormalizedPayload::OrderCancel(c) => &c.account_id,
            NormalizedPayload::PositionsSync(s) => &s.account_id,
        }
    }

    /// The message group of the action's queue message. A submission travels in its
    /// account and contract's group (`ACC-1#CLF27`), so one account's orders for one
    /// contract reach the broker in the order they were accepted, while its orders for
    /// other contracts (whose positions, limits and reservations are separate) are handled
    /// beside them. Cancels travel in the account's cancel group (`ACC-1#cancel`), so a
    /// cancel never waits behind a submission that keeps failing; a sync in the account's
    /// group of the jobs queue.
    pub fn message_group(&self) -> String {
        match self {
            NormalizedPayload::OrderSubmitCl(o) => {
                format!("{}#{}", o.terms.account_id, o.terms.symbol)
            }
            NormalizedPayload::OrderCancel(c) => format!("{}#cancel", c.account_id),
            NormalizedPayload::PositionsSync(s) => s.account_id.clone(),
        }
    }

    /// The order of a submission; `None` for the other action types.
    pub fn order(&self) -> Option<&NormalizedOrder> {
        match self {
            NormalizedPayload::OrderSubmitCl(o) => Some(o),
            _ => None,
        }
    }

    /// The order a cancel acts on; `None` for the other action types.
    pub fn cancelled_order_id(&self) -> Option<&str> {
        match self {
            NormalizedPayload::OrderCancel(c) => Some(&c.order_id),
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
        let cancel = round_trip(serde_json::json!({"account_id": "ACC-1", "order_id": "ord-1"}));
        assert_eq!(cancel.action_type(), ActionType::OrderCancel);
        assert_eq!(cancel.cancelled_order_id(), Some("ord-1"));
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
