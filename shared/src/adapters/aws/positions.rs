//! Positions and exposures on DynamoDB: the positions table (filled contracts, by account)
//! and the exposures table (open buy and sell contracts per account and contract).

use super::ddb::{self, from_body, n, s, Item};
use super::tables::built;
use super::{unavailable, Aws};
use crate::core::auth::DeskScope;
use crate::core::domain::{Exposure, ExposureDelta, Position};
use crate::core::error::StoreResult;
use crate::core::ports::{AccountStore, Page, PositionStore};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use std::collections::HashMap;

#[async_trait]
impl PositionStore for Aws {
    async fn list_positions(
        &self,
        desks: &DeskScope,
        account_id: Option<&str>,
        page: &Page<(String, String)>,
    ) -> StoreResult<Vec<Position>> {
        let candidates: Vec<String> = match (account_id, desks) {
            // Every desk: one account's positions need no read of the account.
            (Some(id), DeskScope::All) => vec![id.to_string()],
            // One account: read it (GetItem) for its desk rather than scan the table.
            (Some(id), _) => self
                .get_account(id)
                .await?
                .into_iter()
                .filter(|a| desks.allows(&a.desk))
                .map(|a| a.account_id)
                .collect(),
            (None, _) => self
                .all_accounts()
                .await?
                .into_iter()
                .filter(|a| desks.allows(&a.desk))
                .map(|a| a.account_id)
                .collect(),
        };
        let accounts: Vec<String> = candidates
            .into_iter()
            .filter(|a| page.after.as_ref().is_none_or(|(acc, _)| a >= acc))
            .collect();
        let mut out = Vec::new();
        for acc in accounts {
            let mut start: Option<Item> = match &page.after {
                Some((a, sym)) if *a == acc => Some(HashMap::from([
                    ("account_id".to_string(), s(a.clone())),
                    ("symbol".to_string(), s(sym.clone())),
                ])),
                _ => None,
            };
            loop {
                let o = self
                    .ddb
                    .query()
                    .table_name(&self.names.positions)
                    .key_condition_expression("account_id = :a")
                    .expression_attribute_values(":a", s(acc.clone()))
                    .consistent_read(true)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| unavailable("Query positions", &e))?;
                for item in o.items.unwrap_or_default() {
                    out.push(from_body::<Position>(&item)?);
                }
                match o.last_evaluated_key {
                    Some(k) if !k.is_empty() && out.len() < page.limit as usize => start = Some(k),
                    _ => break,
                }
            }
            if out.len() >= page.limit as usize {
                break;
            }
        }
        out.truncate(page.limit as usize);
        Ok(out)
    }

    async fn get_exposure(&self, account_id: &str, symbol: &str) -> StoreResult<Exposure> {
        let item = self
            .get(
                &self.names.exposures,
                &[("account_id", s(account_id)), ("symbol", s(symbol))],
            )
            .await?;
        Ok(ddb::exposure_from_item(item.as_ref()))
    }

    async fn get_position(&self, account_id: &str, symbol: &str) -> StoreResult<Option<Position>> {
        self.get(
            &self.names.positions,
            &[("account_id", s(account_id)), ("symbol", s(symbol))],
        )
        .await?
        .map(|i| from_body(&i))
        .transpose()
    }
}

pub(super) fn position_put(
    table: &str,
    p: &Position,
    expected: Option<i64>,
) -> StoreResult<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .item("account_id", s(p.account_id.clone()))
        .item("symbol", s(p.symbol.clone()))
        .item("quantity", n(p.quantity))
        .item("body", ddb::body(p)?);
    let put = match expected {
        None => put.condition_expression("attribute_not_exists(account_id)"),
        Some(q) => put
            .condition_expression("quantity = :q")
            .expression_attribute_values(":q", n(q)),
    };
    Ok(TransactWriteItem::builder()
        .put(built(put.build())?)
        .build())
}

impl Aws {
    /// The exposure's copy of a position moved by `by` (a sync replaced it).
    /// A sync's move of a position on its exposure (`by` may be 0), only while no order of
    /// the contract is between its claim for the broker and its record: the broker's
    /// position may already hold that order's fill, which its record would add again.
    pub(super) fn position_synced(
        &self,
        account: &str,
        symbol: &str,
        by: i64,
    ) -> StoreResult<TransactWriteItem> {
        let d = ExposureDelta::position_moved(account, symbol, by);
        let up = ddb::exposure_update(&self.names.exposures, &d)
            .condition_expression(ddb::NONE_SUBMITTING)
            .expression_attribute_values(":zero", ddb::n(0));
        Ok(TransactWriteItem::builder()
            .update(built(up.build())?)
            .build())
    }
}
