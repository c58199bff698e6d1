//! Orders: their terms, their record, and the versions a replace leaves.

use serde::{Deserialize, Serialize};

use super::{Millis, OrderStatus, OrderType, Price, Side, TimeInForce};

/// What an order trades and for whom: the same terms from the plan's normalized payload
/// through Airlock's order record to the broker's order. Flattened in JSON, so each of
/// those keeps its flat shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OrderTerms {
    pub account_id: String,
    pub symbol: String,
    pub side: Side,
    pub quantity: u32,
    pub order_type: OrderType,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
}

impl OrderTerms {
    /// The limit and stop prices the order carries, for the tick and band checks.
    pub fn prices(&self) -> impl Iterator<Item = Price> {
        [self.limit_price, self.stop_price].into_iter().flatten()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    #[serde(flatten)]
    pub terms: OrderTerms,
    pub status: OrderStatus,
    pub filled_quantity: u32,
    pub avg_fill_price: Option<Price>,
    pub action_id: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// 1 as submitted, one more with each replace of its terms.
    #[serde(default = "first_version")]
    pub version: u32,
    /// The terms of each earlier version, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<OrderVersion>,
}

/// An order's version before its first replace (and of a record stored without one).
pub fn first_version() -> u32 {
    1
}

/// An order's terms as they were up to a replace: what a replace may change (quantity,
/// prices, time in force), when it was replaced and by which action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderVersion {
    pub version: u32,
    pub quantity: u32,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
    pub replaced_at: Millis,
    pub replaced_by: String,
}

impl Order {
    /// The order after a replace of its terms by `terms` (action `replaced_by`, at `at`):
    /// the next version, with the current terms kept last in `versions`. Status and fills
    /// stay; what a replace may not change (account, contract, side, type) is checked by
    /// [`Order::replace_error`].
    pub fn replaced(&self, terms: OrderTerms, replaced_by: &str, at: Millis) -> Order {
        let mut next = self.clone();
        next.versions.push(OrderVersion {
            version: self.version,
            quantity: self.terms.quantity,
            limit_price: self.terms.limit_price,
            stop_price: self.terms.stop_price,
            time_in_force: self.terms.time_in_force,
            replaced_at: at,
            replaced_by: replaced_by.to_string(),
        });
        next.terms = terms;
        next.version = self.version + 1;
        next.updated_at = at.max(self.updated_at);
        next
    }

    /// Why `next` is not a replace of `self` ([`Order::replaced`]): `None` when it is the
    /// same order (id, account, contract, side, type, creation, status, fills, action) at
    /// the next version, with `self`'s versions and its terms last among them.
    pub fn replace_error(&self, next: &Order) -> Option<String> {
        let (a, b) = (&self.terms, &next.terms);
        let why = if (
            &self.order_id,
            &a.account_id,
            &a.symbol,
            a.side,
            a.order_type,
        ) != (
            &next.order_id,
            &b.account_id,
            &b.symbol,
            b.side,
            b.order_type,
        ) {
            "a replace may not change the order's id, account, contract, side or type"
        } else if (
            self.created_at,
            self.status,
            self.filled_quantity,
            self.avg_fill_price,
        ) != (
            next.created_at,
            next.status,
            next.filled_quantity,
            next.avg_fill_price,
        ) || self.action_id != next.action_id
        {
            "a replace may not change the order's creation, status, fills or action"
        } else if next.version != self.version.saturating_add(1) {
            "a replace makes the next version"
        } else if next.versions.len() != self.versions.len() + 1
            || next.versions[..self.versions.len()] != self.versions[..]
            || next.versions.last().is_none_or(|v| {
                (
                    v.version,
                    v.quantity,
                    v.limit_price,
                    v.stop_price,
                    v.time_in_force,
                ) != (
                    self.version,
                    a.quantity,
                    a.limit_price,
                    a.stop_price,
                    a.time_in_force,
                )
            })
        {
            "a replace keeps every earlier version and adds the replaced terms"
        } else {
            return None;
        };
        Some(format!("order {}: {why}", self.order_id))
    }

    /// Contracts that may still trade: the unfilled rest of an open order, else 0.
    pub fn open_quantity(&self) -> i64 {
        if self.status.is_open() {
            (self.terms.quantity as i64 - self.filled_quantity as i64).max(0)
        } else {
            0
        }
    }
}
