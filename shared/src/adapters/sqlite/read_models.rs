//! Writes to the read models (the demo seed, bulk loads): one transaction per call.

use super::orders::put_order;
use super::positions::put_position;
use super::rows::Cached;
use super::{db_err, Sqlite};
use crate::core::domain::{Account, Exposure, Job, Order, Position};
use crate::core::error::StoreResult;
use crate::core::ports::ReadModelWriter;
use async_trait::async_trait;
use rusqlite::params;

#[async_trait]
impl ReadModelWriter for Sqlite {
    async fn put_accounts(&self, rows: &[Account]) -> StoreResult<()> {
        let rows = rows.to_vec();
        self.write(move |tx| {
            let mut st = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO accounts (account_id, name, desk, currency, status) \
                     VALUES (?, ?, ?, ?, ?)",
                )
                .map_err(db_err)?;
            for a in rows {
                st.execute(params![
                    a.account_id,
                    a.name,
                    a.desk,
                    a.currency,
                    a.status.as_str()
                ])
                .map_err(db_err)?;
            }
            Ok(())
        })
        .await
    }

    async fn put_positions(&self, rows: &[Position]) -> StoreResult<()> {
        let rows = rows.to_vec();
        self.write(move |tx| {
            for p in &rows {
                put_position(tx, p)?;
            }
            Ok(())
        })
        .await
    }

    async fn put_exposures(&self, rows: &[(String, String, Exposure)]) -> StoreResult<()> {
        let rows = rows.to_vec();
        self.write(move |tx| {
            // The position itself is the `positions` row; only open quantities live here.
            for (account_id, symbol, e) in &rows {
                tx.run(
                    "INSERT OR REPLACE INTO exposures (account_id, symbol, open_buy, open_sell) \
                     VALUES (?, ?, ?, ?)",
                    params![account_id, symbol, e.open_buy, e.open_sell],
                )
                .map_err(db_err)?;
            }
            Ok(())
        })
        .await
    }

    async fn put_orders(&self, rows: &[Order]) -> StoreResult<()> {
        let rows = rows.to_vec();
        self.write(move |tx| {
            for o in &rows {
                put_order(tx, o, true)?;
            }
            Ok(())
        })
        .await
    }

    async fn put_jobs(&self, rows: &[Job]) -> StoreResult<()> {
        let rows = rows.to_vec();
        self.write(move |tx| {
            let mut st = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO jobs (job_id, kind, status, account_id, action_id, \
                     created_at, updated_at, error, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                )
                .map_err(db_err)?;
            for j in rows {
                st.execute(params![
                    j.job_id,
                    j.kind.as_str(),
                    j.status.as_str(),
                    j.account_id,
                    j.action_id,
                    j.created_at,
                    j.updated_at,
                    j.error,
                    j.result.as_ref().map(|r| r.to_string())
                ])
                .map_err(db_err)?;
            }
            Ok(())
        })
        .await
    }
}
