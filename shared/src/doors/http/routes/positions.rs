//! `GET /positions?account_id=`: positions on the operator's desks.

use serde::Deserialize;

use crate::core::domain::{Ident, Position};
use crate::core::error::Code;

// The tool's arguments (a doc comment would show in the tool's input schema).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PositionsArgs {
    /// Only this account.
    account_id: Option<Ident>,
    #[schemars(range(min = 1, max = 200))]
    limit: Option<u32>,
    cursor: Option<String>,
}

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
    page: PositionPage { positions: Position },
    filter: |q| q.ident("account_id")?,
    tool: (
        "list_positions",
        "List positions",
        "Signed positions in contracts (long > 0, short < 0) with average prices, optionally for one account."
    ),
    args: PositionsArgs => |a| a.account_id.map(|i| i.as_str().to_string()),
    read: |reads, caller, account_id, page| {
        reads.positions(caller, account_id.as_deref(), page).await?
    },
}
