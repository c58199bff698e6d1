//! Accounts on SQLite: the `accounts` table.

use super::rows::{desk_clause, limit, parse, query};
use super::Sqlite;
use crate::core::auth::DeskScope;
use crate::core::domain::Account;
use crate::core::error::StoreResult;
use crate::core::ports::{AccountStore, Page};
use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::Row;

pub(super) fn account_row(r: &Row) -> rusqlite::Result<Account> {
    Ok(Account {
        account_id: r.get(0)?,
        name: r.get(1)?,
        desk: r.get(2)?,
        currency: r.get(3)?,
        status: parse(r, 4)?,
    })
}

#[async_trait]
impl AccountStore for Sqlite {
    async fn list_accounts(
        &self,
        desks: &DeskScope,
        page: &Page<String>,
    ) -> StoreResult<Vec<Account>> {
        let mut args = Vec::new();
        let mut sql = format!(
            "SELECT account_id, name, desk, currency, status FROM accounts WHERE {}",
            desk_clause(desks, "desk", &mut args)
        );
        if let Some(after) = &page.after {
            sql.push_str(" AND account_id > ?");
            args.push(Value::Text(after.clone()));
        }
        sql.push_str(" ORDER BY account_id");
        sql.push_str(&limit(page.limit));
        self.read(move |c| query(c, &sql, args, account_row)).await
    }

    async fn get_account(&self, account_id: &str) -> StoreResult<Option<Account>> {
        let id = account_id.to_string();
        self.read(move |c| {
            query(
                c,
                "SELECT account_id, name, desk, currency, status FROM accounts WHERE account_id = ?",
                vec![Value::Text(id)],
                account_row,
            )
            .map(|v| v.into_iter().next())
        })
        .await
    }
}
