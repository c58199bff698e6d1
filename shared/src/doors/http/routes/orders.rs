//! `GET /orders?account_id=&status=`: orders on the operator's desks, newest first.

use crate::core::domain::{Ident, OrderStatus};
use crate::core::error::Code;
use crate::core::ports::OrderFilter;
use crate::core::usecases::views::OrderView;

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
    page: OrderPage { orders: OrderView<'static> },
    filter: |q| OrderFilter {
        account_id: q.ident("account_id")?,
        status: q.parsed("status")?,
    },
    read: |st, caller, filter, page| st.reads.orders(&caller, filter, &page).await?,
}
