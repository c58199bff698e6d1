//! Accounts on DynamoDB: the accounts table.

use super::ddb::{from_body, s};
use super::Aws;
use crate::core::auth::DeskScope;
use crate::core::domain::Account;
use crate::core::error::StoreResult;
use crate::core::ports::{AccountStore, Page};
use async_trait::async_trait;

#[async_trait]
impl AccountStore for Aws {
    async fn list_accounts(
        &self,
        desks: &DeskScope,
        page: &Page<String>,
    ) -> StoreResult<Vec<Account>> {
        Ok(self
            .all_accounts()
            .await?
            .into_iter()
            .filter(|a| desks.allows(&a.desk))
            .filter(|a| {
                page.after
                    .as_ref()
                    .is_none_or(|after| &a.account_id > after)
            })
            .take(page.limit as usize)
            .collect())
    }

    async fn get_account(&self, account_id: &str) -> StoreResult<Option<Account>> {
        self.get(&self.names.accounts, &[("account_id", s(account_id))])
            .await?
            .map(|i| from_body(&i))
            .transpose()
    }
}
