//! The broker port: what workers ask of a broker. Brokers deduplicate on the client order
//! id (Airlock's order id, chosen at execute), so a resent order never becomes two orders.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::core::domain::{OrderTerms, Price};
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
    /// The broker's state of an order, after re-checking it against the current price.
    async fn order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<BrokerOrder>>;
    /// The broker's view of an account's positions.
    async fn positions(&self, account_id: &str) -> StoreResult<Vec<BrokerPosition>>;
}
