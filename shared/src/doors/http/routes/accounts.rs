//! `GET /accounts`: the accounts on the operator's desks.

use crate::core::usecases::views::AccountView;

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
    page: AccountPage { accounts: AccountView<'static> },
    filter: |q| (),
    read: |st, caller, _f, page| st.reads.accounts(&caller, &page).await?,
}
