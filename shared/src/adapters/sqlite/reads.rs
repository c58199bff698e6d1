//! Read models (accounts, positions, orders, jobs, actions, plans) on SQLite. The desk
//! filter is part of every query's WHERE clause.

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, Row};

use super::{db_err, json_err, Sqlite};
use crate::auth::DeskScope;
use crate::domain::{Account, Exposure, Job, Order, Position, Price};
use crate::error::StoreResult;
use crate::ports::{
    AccountStore, ActionStore, JobFilter, JobStore, OrderFilter, OrderStore, Page, PlanStore,
    PositionStore, ReadModelWriter, TimeKey,
};
use crate::records::{ActionRecord, AuditRecord, PlanRecord};

/// `desk IN (...)` for a desk scope, with its parameters. `column` names the desk column.
fn desk_clause(desks: &DeskScope, column: &str, args: &mut Vec<Value>) -> String {
    match desks {
        DeskScope::All => "1=1".into(),
        DeskScope::Only(d) if d.is_empty() => "0=1".into(),
        DeskScope::Only(d) => {
            let marks = vec!["?"; d.len()].join(",");
            args.extend(d.iter().map(|x| Value::Text(x.clone())));
            format!("{column} IN ({marks})")
        }
    }
}

fn parse<T: std::str::FromStr<Err = String>>(s: String) -> rusqlite::Result<T> {
    s.parse::<T>().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("{s:?}: {e}").into(),
        )
    })
}

fn price(s: Option<String>) -> rusqlite::Result<Option<Price>> {
    s.map(|s| {
        Price::parse(&s).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, e.into())
        })
    })
    .transpose()
}

fn account_row(r: &Row) -> rusqlite::Result<Account> {
    Ok(Account {
        account_id: r.get(0)?,
        name: r.get(1)?,
        desk: r.get(2)?,
        currency: r.get(3)?,
        status: parse(r.get(4)?)?,
    })
}

fn position_row(r: &Row) -> rusqlite::Result<Position> {
    Ok(Position {
        account_id: r.get(0)?,
        symbol: r.get(1)?,
        quantity: r.get(2)?,
        avg_price: price(r.get(3)?)?,
        updated_at: r.get(4)?,
    })
}

pub(super) const ORDER_COLUMNS: &str =
    "o.order_id, o.account_id, o.symbol, o.side, o.quantity, o.order_type, \
     o.limit_price, o.stop_price, o.time_in_force, o.status, o.filled_quantity, o.avg_fill_price, \
     o.action_id, o.created_at, o.updated_at";

pub(super) fn order_row(r: &Row) -> rusqlite::Result<Order> {
    Ok(Order {
        order_id: r.get(0)?,
        terms: crate::domain::OrderTerms {
            account_id: r.get(1)?,
            symbol: r.get(2)?,
            side: parse(r.get(3)?)?,
            quantity: r.get(4)?,
            order_type: parse(r.get(5)?)?,
            limit_price: price(r.get(6)?)?,
            stop_price: price(r.get(7)?)?,
            time_in_force: parse(r.get(8)?)?,
        },
        status: parse(r.get(9)?)?,
        filled_quantity: r.get(10)?,
        avg_fill_price: price(r.get(11)?)?,
        action_id: r.get(12)?,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
    })
}

pub(super) fn job_row(r: &Row) -> rusqlite::Result<Job> {
    Ok(Job {
        job_id: r.get(0)?,
        kind: parse(r.get(1)?)?,
        status: parse(r.get(2)?)?,
        account_id: r.get(3)?,
        action_id: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
        error: r.get(7)?,
        result: r
            .get::<_, Option<String>>(8)?
            .and_then(|t| serde_json::from_str(&t).ok()),
    })
}

pub(super) fn query<T>(
    c: &rusqlite::Connection,
    sql: &str,
    args: Vec<Value>,
    f: fn(&Row) -> rusqlite::Result<T>,
) -> StoreResult<Vec<T>> {
    let mut st = c.prepare_cached(sql).map_err(db_err)?;
    let rows = st
        .query_map(rusqlite::params_from_iter(args), f)
        .map_err(db_err)?;
    rows.collect::<rusqlite::Result<Vec<T>>>().map_err(db_err)
}

/// `AND (created_at, id) < (?, ?)` for newest-first keyset pages.
fn time_after(after: &Option<TimeKey>, t: &str, id: &str, args: &mut Vec<Value>) -> String {
    match after {
        None => String::new(),
        Some((ms, key)) => {
            args.push(Value::Integer(*ms));
            args.push(Value::Integer(*ms));
            args.push(Value::Text(key.clone()));
            format!(" AND ({t} < ? OR ({t} = ? AND {id} < ?))")
        }
    }
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
        sql.push_str(" ORDER BY account_id LIMIT ?");
        args.push(Value::Integer(page.limit as i64));
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

#[async_trait]
impl PositionStore for Sqlite {
    async fn list_positions(
        &self,
        desks: &DeskScope,
        account_id: Option<&str>,
        page: &Page<(String, String)>,
    ) -> StoreResult<Vec<Position>> {
        let mut args = Vec::new();
        let mut sql = format!(
            "SELECT p.account_id, p.symbol, p.quantity, p.avg_price, p.updated_at \
             FROM positions p JOIN accounts a ON a.account_id = p.account_id WHERE {}",
            desk_clause(desks, "a.desk", &mut args)
        );
        if let Some(id) = account_id {
            sql.push_str(" AND p.account_id = ?");
            args.push(Value::Text(id.to_string()));
        }
        if let Some((acc, sym)) = &page.after {
            sql.push_str(" AND (p.account_id > ? OR (p.account_id = ? AND p.symbol > ?))");
            args.push(Value::Text(acc.clone()));
            args.push(Value::Text(acc.clone()));
            args.push(Value::Text(sym.clone()));
        }
        sql.push_str(" ORDER BY p.account_id, p.symbol LIMIT ?");
        args.push(Value::Integer(page.limit as i64));
        self.read(move |c| query(c, &sql, args, position_row)).await
    }

    async fn get_exposure(&self, account_id: &str, symbol: &str) -> StoreResult<Exposure> {
        let (a, s) = (account_id.to_string(), symbol.to_string());
        self.read(move |c| super::ledger::load_exposure(c, &a, &s))
            .await
    }

    async fn get_position(&self, account_id: &str, symbol: &str) -> StoreResult<Option<Position>> {
        let args = vec![
            Value::Text(account_id.to_string()),
            Value::Text(symbol.to_string()),
        ];
        self.read(move |c| {
            query(
                c,
                "SELECT account_id, symbol, quantity, avg_price, updated_at FROM positions \
                 WHERE account_id = ? AND symbol = ?",
                args,
                position_row,
            )
            .map(|v| v.into_iter().next())
        })
        .await
    }
}

#[async_trait]
impl OrderStore for Sqlite {
    async fn list_orders(
        &self,
        desks: &DeskScope,
        filter: &OrderFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Order>> {
        let mut args = Vec::new();
        let mut sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders o JOIN accounts a ON a.account_id = o.account_id \
             WHERE {}",
            desk_clause(desks, "a.desk", &mut args)
        );
        if let Some(id) = &filter.account_id {
            sql.push_str(" AND o.account_id = ?");
            args.push(Value::Text(id.clone()));
        }
        if let Some(s) = filter.status {
            sql.push_str(" AND o.status = ?");
            args.push(Value::Text(s.as_str().into()));
        }
        sql.push_str(&time_after(
            &page.after,
            "o.created_at",
            "o.order_id",
            &mut args,
        ));
        sql.push_str(" ORDER BY o.created_at DESC, o.order_id DESC LIMIT ?");
        args.push(Value::Integer(page.limit as i64));
        self.read(move |c| query(c, &sql, args, order_row)).await
    }

    async fn get_order(&self, order_id: &str) -> StoreResult<Option<Order>> {
        let sql = format!("SELECT {ORDER_COLUMNS} FROM orders o WHERE o.order_id = ?");
        let args = vec![Value::Text(order_id.to_string())];
        self.read(move |c| query(c, &sql, args, order_row).map(|v| v.into_iter().next()))
            .await
    }
}

#[async_trait]
impl JobStore for Sqlite {
    async fn list_jobs(
        &self,
        desks: &DeskScope,
        filter: &JobFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Job>> {
        let mut args = Vec::new();
        let mut sql = format!(
            "SELECT j.job_id, j.kind, j.status, j.account_id, j.action_id, j.created_at, \
             j.updated_at, j.error, j.result FROM jobs j LEFT JOIN accounts a ON a.account_id = j.account_id \
             WHERE (j.account_id IS NULL OR {})",
            desk_clause(desks, "a.desk", &mut args)
        );
        if let Some(k) = filter.kind {
            sql.push_str(" AND j.kind = ?");
            args.push(Value::Text(k.as_str().into()));
        }
        if let Some(s) = filter.status {
            sql.push_str(" AND j.status = ?");
            args.push(Value::Text(s.as_str().into()));
        }
        sql.push_str(&time_after(
            &page.after,
            "j.created_at",
            "j.job_id",
            &mut args,
        ));
        sql.push_str(" ORDER BY j.created_at DESC, j.job_id DESC LIMIT ?");
        args.push(Value::Integer(page.limit as i64));
        self.read(move |c| query(c, &sql, args, job_row)).await
    }
}

fn body<T: serde::de::DeserializeOwned>(text: String) -> StoreResult<T> {
    serde_json::from_str(&text).map_err(json_err)
}

#[async_trait]
impl ActionStore for Sqlite {
    async fn get_action(&self, action_id: &str) -> StoreResult<Option<ActionRecord>> {
        let id = action_id.to_string();
        self.read(move |c| {
            let text: Option<String> = c
                .query_row("SELECT body FROM actions WHERE action_id = ?", [id], |r| {
                    r.get(0)
                })
                .map(Some)
                .or_else(|e| match e {
                    rusqlite::Error::QueryReturnedNoRows => Ok(None),
                    e => Err(e),
                })
                .map_err(db_err)?;
            text.map(body).transpose()
        })
        .await
    }

    async fn list_unsent(&self, claimed_before: i64, limit: u32) -> StoreResult<Vec<ActionRecord>> {
        self.read(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT body FROM actions WHERE enqueued_at IS NULL AND created_at < ? \
                     ORDER BY created_at LIMIT ?",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![claimed_before, limit], |r| r.get::<_, String>(0))
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err).and_then(body))
                .collect::<StoreResult<Vec<_>>>()
        })
        .await
    }
}

#[async_trait]
impl PlanStore for Sqlite {
    async fn put_plan(&self, plan: &PlanRecord, audit: &AuditRecord) -> StoreResult<()> {
        let plan_body = serde_json::to_string(plan).map_err(json_err)?;
        let (id, status, exp) = (plan.plan_id.clone(), "planned".to_string(), plan.expires_at);
        let audit = audit.clone();
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO plans (plan_id, status, expires_at, body) VALUES (?, ?, ?, ?)",
                params![id, status, exp, plan_body],
            )
            .map_err(db_err)?;
            super::ledger::append_audit(tx, &audit)
        })
        .await
    }

    async fn get_plan(&self, plan_id: &str) -> StoreResult<Option<PlanRecord>> {
        let id = plan_id.to_string();
        self.read(move |c| super::ledger::load_plan(c, &id)).await
    }
}

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
            let mut st = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO positions (account_id, symbol, quantity, avg_price, \
                     updated_at) VALUES (?, ?, ?, ?, ?)",
                )
                .map_err(db_err)?;
            for p in rows {
                st.execute(params![
                    p.account_id,
                    p.symbol,
                    p.quantity,
                    p.avg_price.map(|x| x.to_string()),
                    p.updated_at
                ])
                .map_err(db_err)?;
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
                tx.execute(
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
                super::workers::put_order(tx, o, true)?;
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
