//! Positions and exposures on SQLite: the `positions` table (filled contracts) and the
//! `exposures` table (open buy and sell contracts per account and contract).

use super::rows::{desk_clause, limit, price, query};
use super::{db_err, Sqlite};
use crate::core::auth::DeskScope;
use crate::core::domain::{Exposure, ExposureDelta, Position};
use crate::core::error::StoreResult;
use crate::core::ports::{Page, PositionStore};
use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row};

pub(super) fn position_row(r: &Row) -> rusqlite::Result<Position> {
    Ok(Position {
        account_id: r.get(0)?,
        symbol: r.get(1)?,
        quantity: r.get(2)?,
        avg_price: price(r, 3)?,
        updated_at: r.get(4)?,
        day_realized: match r.get_ref(5)?.as_str_or_null()? {
            None => None,
            Some(text) => Some(serde_json::from_str(text).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, e.into())
            })?),
        },
    })
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
            "SELECT p.account_id, p.symbol, p.quantity, p.avg_price, p.updated_at, p.day_realized \
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
        sql.push_str(" ORDER BY p.account_id, p.symbol");
        sql.push_str(&limit(page.limit));
        self.read(move |c| query(c, &sql, args, position_row)).await
    }

    async fn get_exposure(&self, account_id: &str, symbol: &str) -> StoreResult<Exposure> {
        let (a, s) = (account_id.to_string(), symbol.to_string());
        self.read(move |c| load_exposure(c, &a, &s)).await
    }

    async fn get_position(&self, account_id: &str, symbol: &str) -> StoreResult<Option<Position>> {
        let args = vec![
            Value::Text(account_id.to_string()),
            Value::Text(symbol.to_string()),
        ];
        self.read(move |c| {
            query(
                c,
                "SELECT account_id, symbol, quantity, avg_price, updated_at, day_realized FROM positions \
                 WHERE account_id = ? AND symbol = ?",
                args,
                position_row,
            )
            .map(|v| v.into_iter().next())
        })
        .await
    }
}

/// The account's position (from `positions`) and open orders (from `exposures`).
pub(super) fn load_exposure(
    c: &Connection,
    account_id: &str,
    symbol: &str,
) -> StoreResult<Exposure> {
    let position: i64 = c
        .prepare_cached("SELECT quantity FROM positions WHERE account_id = ? AND symbol = ?")
        .and_then(|mut st| st.query_row([account_id, symbol], |r| r.get(0)).optional())
        .map_err(db_err)?
        .unwrap_or(0);
    let (open_buy, open_sell): (i64, i64) = c
        .prepare_cached(
            "SELECT open_buy, open_sell FROM exposures WHERE account_id = ? AND symbol = ?",
        )
        .and_then(|mut st| {
            st.query_row([account_id, symbol], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(db_err)?
        .unwrap_or((0, 0));
    Ok(Exposure {
        position,
        open_buy,
        open_sell,
    })
}

/// Adds a change of open quantities (the position itself lives in `positions`).
pub(super) fn add_open(c: &Connection, d: &ExposureDelta) -> StoreResult<()> {
    if d.open_buy == 0 && d.open_sell == 0 {
        return Ok(());
    }
    c.prepare_cached(
        "INSERT INTO exposures (account_id, symbol, open_buy, open_sell) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (account_id, symbol) DO UPDATE SET \
         open_buy = open_buy + ?3, open_sell = open_sell + ?4",
    )
    .and_then(|mut st| st.execute(params![d.account_id, d.symbol, d.open_buy, d.open_sell]))
    .map_err(db_err)?;
    Ok(())
}

pub(super) fn put_position(tx: &Connection, p: &Position) -> StoreResult<()> {
    let day_realized = p
        .day_realized
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(super::json_err)?;
    tx.prepare_cached(
        "INSERT OR REPLACE INTO positions (account_id, symbol, quantity, avg_price, updated_at, \
         day_realized) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .and_then(|mut st| {
        st.execute(params![
            p.account_id,
            p.symbol,
            p.quantity,
            p.avg_price.map(|x| x.to_string()),
            p.updated_at,
            day_realized
        ])
    })
    .map_err(db_err)?;
    Ok(())
}
