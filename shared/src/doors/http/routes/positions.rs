//! `GET /positions?account_id=`: positions on the operator's desks.

use crate::core::domain::Ident;
use crate::core::error::Code;
use crate::core::usecases::views::PositionView;

listing_route! {
    name: "positions",
    operation: "listPositions",
    summary: (
        "Positions on the operator's desks",
        "Signed positions in contracts (long > 0, short < 0) with average prices, optionally for one account."
    ),
    queries: [
        ("account_id", Ident, "Only this account's positions. An account the operator may not see is 404 `account_not_found`."),
    ],
    errors: [Code::AccountNotFound],
    answer: "One page of positions.",
    page: PositionPage { positions: PositionView<'static> },
    filter: |q| q.ident("account_id")?,
    read: |st, caller, account_id, page| {
        st.reads.positions(&caller, account_id.as_deref(), &page).await?
    },
}
