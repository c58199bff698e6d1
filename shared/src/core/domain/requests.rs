//! Payloads as a client sends them (before normalization, `payload.rs`).

use serde::Deserialize;

use super::{optional_input_price, Ident, OrderType, Price, Quantity, Side, TimeInForce};

fn default_tif() -> TimeInForce {
    TimeInForce::Day
}

/// `order.submit.cl` payload, as sent. The symbol stays text: a bad symbol is a failed
/// `symbol_valid` check in the plan, not a malformed request.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderSubmitCl {
    pub account_id: Ident,
    /// The CL contract, e.g. `CLF27`. An unknown one is a failed `symbol_valid` check.
    #[schemars(length(max = 32), regex(pattern = crate::core::domain::PRINTABLE_PATTERN))]
    pub symbol: String,
    pub side: Side,
    pub quantity: Quantity,
    pub order_type: OrderType,
    #[serde(default, deserialize_with = "optional_input_price")]
    pub limit_price: Option<Price>,
    #[serde(default, deserialize_with = "optional_input_price")]
    pub stop_price: Option<Price>,
    #[serde(default = "default_tif")]
    pub time_in_force: TimeInForce,
}

/// `order.cancel` payload.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderCancel {
    pub account_id: Ident,
    pub order_id: Ident,
}

/// `positions.sync` payload.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PositionsSync {
    pub account_id: Ident,
}
