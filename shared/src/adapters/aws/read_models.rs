//! Writes to the read models (the demo seed, bulk loads) on DynamoDB: batched puts.

use super::ddb::{self, n, s, Item};
use super::jobs::job_item;
use super::orders::order_item;
use super::Aws;
use crate::core::domain::{Account, Exposure, Job, Order, Position};
use crate::core::error::StoreResult;
use crate::core::ports::ReadModelWriter;
use async_trait::async_trait;
use std::collections::HashMap;

#[async_trait]
impl ReadModelWriter for Aws {
    async fn put_accounts(&self, rows: &[Account]) -> StoreResult<()> {
        let items = rows
            .iter()
            .map(|a| {
                Ok(HashMap::from([
                    ("account_id".to_string(), s(a.account_id.clone())),
                    ("desk".to_string(), s(a.desk.clone())),
                    // Execute's commit checks the account is still active.
                    ("status".to_string(), s(a.status.as_str())),
                    ("body".to_string(), ddb::body(a)?),
                ]))
            })
            .collect::<StoreResult<Vec<Item>>>()?;
        self.batch_put(&self.names.accounts, items).await
    }

    async fn put_positions(&self, rows: &[Position]) -> StoreResult<()> {
        let items = rows
            .iter()
            .map(|p| {
                Ok(HashMap::from([
                    ("account_id".to_string(), s(p.account_id.clone())),
                    ("symbol".to_string(), s(p.symbol.clone())),
                    ("quantity".to_string(), n(p.quantity)),
                    ("body".to_string(), ddb::body(p)?),
                ]))
            })
            .collect::<StoreResult<Vec<Item>>>()?;
        self.batch_put(&self.names.positions, items).await
    }

    async fn put_exposures(&self, rows: &[(String, String, Exposure)]) -> StoreResult<()> {
        let items = rows
            .iter()
            .map(|(account_id, symbol, e)| {
                HashMap::from([
                    ("account_id".to_string(), s(account_id.clone())),
                    ("symbol".to_string(), s(symbol.clone())),
                    ("position".to_string(), n(e.position)),
                    ("open_buy".to_string(), n(e.open_buy)),
                    ("open_sell".to_string(), n(e.open_sell)),
                    ("worst_long".to_string(), n(e.worst_long())),
                    ("worst_short".to_string(), n(e.worst_short())),
                ])
            })
            .collect();
        self.batch_put(&self.names.exposures, items).await
    }

    async fn put_orders(&self, rows: &[Order]) -> StoreResult<()> {
        let mut desks = HashMap::new();
        let mut items = Vec::with_capacity(rows.len());
        for o in rows {
            let desk = self.desk_of(&o.terms.account_id, &mut desks).await?;
            items.push(order_item(o, &desk)?);
        }
        self.batch_put(&self.names.orders, items).await
    }

    async fn put_jobs(&self, rows: &[Job]) -> StoreResult<()> {
        let mut desks = HashMap::new();
        let mut items = Vec::with_capacity(rows.len());
        for j in rows {
            let desk = self.job_desk(j, &mut desks).await?;
            items.push(job_item(j, &desk)?);
        }
        self.batch_put(&self.names.jobs, items).await
    }
}
