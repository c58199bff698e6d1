//! `GET /orders?account_id=&status=`: orders on the operator's desks, newest first.

use serde::Deserialize;

use crate::core::domain::{Ident, Order, OrderStatus};
use crate::core::error::Code;
use crate::core::ports::OrderFilter;

// The tool's arguments (a doc comment would show in the tool's input schema).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OrdersArgs {
    account_id: Option<Ident>,
    status: Option<OrderStatus>,
    #[schemars(range(min = 1, max = 200))]
    limit: Option<u32>,
    cursor: Option<String>,
}

listing_route! {
    name: "orders",
    operation: "listOrders",
    summary: (
        "Orders on the operator's desks",
        "Orders newest first, optionally by account and status."
    ),
    queries: [
        ("account_id", Ident, "Only this account's orders. An account the operator may not see is 404 `account_not_found`."),
        ("status", OrderStatus, "Only orders in this status."),
    ],
    errors: [Code::AccountNotFound],
    answer: "One page of orders, newest first.",
    page: OrderPage { orders: Order },
    filter: |q| OrderFilter {
        account_id: q.ident("account_id")?,
        status: q.parsed("status")?,
    },
    tool: (
        "list_orders",
        "List orders",
        "Orders newest first, optionally by account and status."
    ),
    args: OrdersArgs => |a| OrderFilter {
        account_id: a.account_id.map(|i| i.as_str().to_string()),
        status: a.status,
    },
    read: |reads, caller, filter, page| reads.orders(caller, filter, page).await?,
}
