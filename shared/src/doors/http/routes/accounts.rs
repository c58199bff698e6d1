//! `GET /accounts`: the accounts on the operator's desks.

use serde::Deserialize;

use crate::core::domain::Account;

// The tool's arguments (a doc comment would show in the tool's input schema).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageArgs {
    /// Rows per page, 1 to 200 (default 50).
    #[schemars(range(min = 1, max = 200))]
    limit: Option<u32>,
    /// `next_cursor` of the previous page, unchanged.
    cursor: Option<String>,
}

listing_route! {
    name: "accounts",
    operation: "listAccounts",
    summary: (
        "Accounts on the operator's desks",
        "Accounts the operator may see (desk-filtered), by account id. Page with `next_cursor`."
    ),
    queries: [],
    errors: [],
    answer: "One page of accounts.",
    /// One page of `GET /accounts` (the document's schema of the answer).
    page: AccountPage { accounts: Account },
    filter: |q| (),
    tool: (
        "list_accounts",
        "List accounts",
        "Accounts the operator may see (desk-filtered), by account id. Page with next_cursor."
    ),
    args: PageArgs => |_a| (),
    read: |reads, caller, _f, page| reads.accounts(caller, page).await?,
}
