//! The broker port: what workers ask of a broker. Brokers deduplicate on the client order
//! id (Airlock's order id, chosen at execute), so a resent order never becomes two orders.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::core::domain::{Millis, Order, OrderTerms, Price, TimeInForce};
use crate::core::error::StoreResult;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokerStatus {
    Working,
    PartiallyFilled,
    Filled,
    Cancelled,
    Rejected,
}

/// An order as the broker knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerOrder {
    pub client_order_id: String,
    #[serde(flatten)]
    pub terms: OrderTerms,
    pub status: BrokerStatus,
    pub filled_quantity: u32,
    pub avg_fill_price: Option<Price>,
    /// Why the broker rejected or cancelled it.
    pub reason: Option<String>,
    /// A stop order whose stop price was reached.
    #[serde(default)]
    pub triggered: bool,
    /// 1 as submitted; after a replace, the replace's version ([`Replacement::version`]).
    #[serde(default = "crate::core::domain::first_version")]
    pub version: u32,
    /// When the order took its place in the queue at its price: when the broker accepted
    /// it, again at each replace that moves a price or adds contracts (a replace that only
    /// takes contracts away keeps it).
    #[serde(default)]
    pub priority_at: Millis,
    /// Each earlier version's terms, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<BrokerOrderVersion>,
}

impl BrokerOrder {
    /// A new order to send: `working` as far as the sender knows, nothing filled, at the
    /// order's version (the broker sets the time of its place in the queue).
    pub fn new(client_order_id: &str, terms: &OrderTerms, version: u32) -> Self {
        BrokerOrder {
            client_order_id: client_order_id.to_string(),
            terms: terms.clone(),
            status: BrokerStatus::Working,
            filled_quantity: 0,
            avg_fill_price: None,
            reason: None,
            triggered: false,
            version,
            priority_at: 0,
            versions: Vec::new(),
        }
    }
}

/// A broker order's terms up to a replace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerOrderVersion {
    pub version: u32,
    pub quantity: u32,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
    pub priority_at: Millis,
    pub replaced_at: Millis,
}

/// A replace of a working order's terms: the new values, all of them (what does not
/// change is sent as it is), and the version the order becomes. The quantity is the whole
/// order's, fills included: on a partly filled order what is left is `quantity - filled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replacement {
    pub version: u32,
    pub quantity: u32,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
}

impl Replacement {
    /// The replace that makes the broker's order `order`'s version and terms (`order` as
    /// [`Order::replaced`] makes it).
    pub fn of(order: &Order) -> Self {
        Replacement {
            version: order.version,
            quantity: order.terms.quantity,
            limit_price: order.terms.limit_price,
            stop_price: order.terms.stop_price,
            time_in_force: order.terms.time_in_force,
        }
    }
}

/// The broker's answer to a replace.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplaceOutcome {
    /// The order at the replace's version (applied now, or by an earlier send of the same
    /// version), as it is after the replace: re-checked against the market, so it may have
    /// filled, or been cancelled (IOC, FOK).
    Replaced(BrokerOrder),
    /// Not applied: the order as it is, and why (filled, cancelled or rejected already; a
    /// quantity below what filled; a price outside the band; an older version).
    Rejected { order: BrokerOrder, reason: String },
    /// The broker does not know the order.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerPosition {
    pub symbol: String,
    pub quantity: i64,
    pub avg_price: Option<Price>,
}

#[async_trait]
pub trait Broker: Send + Sync {
    /// Sends a new order, or returns the one already known under its client order id.
    async fn submit(&self, order: &BrokerOrder) -> StoreResult<BrokerOrder>;
    /// Cancels a working order; `None` if the broker does not know it.
    async fn cancel(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<BrokerOrder>>;
    /// Replaces a working or partly filled order's terms ([`Replacement`]). Idempotent on
    /// the version: a resend of the order's version answers `Replaced` and changes nothing.
    async fn replace(
        &self,
        account_id: &str,
        client_order_id: &str,
        change: &Replacement,
    ) -> StoreResult<ReplaceOutcome>;
    /// The broker's state of an order, after re-checking it against the current price.
    async fn order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<BrokerOrder>>;
    /// The broker's view of an account's positions.
    async fn positions(&self, account_id: &str) -> StoreResult<Vec<BrokerPosition>>;
}
