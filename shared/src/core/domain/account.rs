//! Accounts and their positions.

use serde::{Deserialize, Serialize};

use super::{AccountStatus, Millis, Price};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    pub account_id: String,
    pub name: String,
    pub desk: String,
    pub currency: String,
    pub status: AccountStatus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub account_id: String,
    pub symbol: String,
    pub quantity: i64,
    pub avg_price: Option<Price>,
    pub updated_at: Millis,
    /// What the position's fills realized on their trading day (the `daily_loss` check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day_realized: Option<super::pnl::DayRealized>,
}
