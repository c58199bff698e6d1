//! Orders on SQLite: the `orders` table.

use super::rows::{desk_clause, limit, parse, price, query, time_after};
use super::{db_err, Sqlite};
use crate::core::auth::DeskScope;
use crate::core::domain::Order;
use crate::core::error::StoreResult;
use crate::core::ports::{OrderFilter, OrderStore, Page, TimeKey};
use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::Row;

pub(super) const ORDER_COLUMNS: &str =
    "o.order_id, o.account_id, o.symbol, o.side, o.quantity, o.order_type, \
     o.limit_price, o.stop_price, o.time_in_force, o.status, o.filled_quantity, o.avg_fill_price, \
     o.action_id, o.created_at, o.updated_at, o.version, o.versions";

pub(super) fn order_row(r: &Row) -> rusqlite::Result<Order> {
    Ok(Order {
        order_id: r.get(0)?,
        terms: crate::core::domain::OrderTerms {
            account_id: r.get(1)?,
            symbol: r.get(2)?,
            side: parse(r, 3)?,
            quantity: r.get(4)?,
            order_type: parse(r, 5)?,
            limit_price: price(r, 6)?,
            stop_price: price(r, 7)?,
            time_in_force: parse(r, 8)?,
        },
        status: parse(r, 9)?,
        filled_quantity: r.get(10)?,
        avg_fill_price: price(r, 11)?,
        action_id: r.get(12)?,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
        version: r.get(15)?,
        versions: match r.get_ref(16)?.as_str_or_null()? {
            None => Vec::new(),
            Some(text) => serde_json::from_str(text).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(16, rusqlite::types::Type::Text, e.into())
            })?,
        },
    })
}

/// One page of orders, newest first: the statement and its parameters.
fn list_sql(desks: &DeskScope, filter: &OrderFilter, page: &Page<TimeKey>) -> (String, Vec<Value>) {
    let mut args = Vec::new();
    // The order's own desk (migration 8): one seek of `orders_desk_time` per page. With an
    // account, its own index serves the page (the caller found the account visible; the
    // desk is still checked, row by row: `+` keeps the planner off the desk index).
    let desk = if filter.account_id.is_some() {
        "+o.desk"
    } else {
        "o.desk"
    };
    let mut sql = format!(
        "SELECT {ORDER_COLUMNS} FROM orders o WHERE {}",
        desk_clause(desks, desk, &mut args)
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
    sql.push_str(" ORDER BY o.created_at DESC, o.order_id DESC");
    sql.push_str(&limit(page.limit));
    (sql, args)
}

#[async_trait]
impl OrderStore for Sqlite {
    async fn list_orders(
        &self,
        desks: &DeskScope,
        filter: &OrderFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Order>> {
        let (sql, args) = list_sql(desks, filter, page);
        self.read(move |c| query(c, &sql, args, order_row)).await
    }

    async fn get_order(&self, order_id: &str) -> StoreResult<Option<Order>> {
        let sql = format!("SELECT {ORDER_COLUMNS} FROM orders o WHERE o.order_id = ?");
        let args = vec![Value::Text(order_id.to_string())];
        self.read(move |c| query(c, &sql, args, order_row).map(|v| v.into_iter().next()))
            .await
    }

    async fn list_at_the_broker(&self, account_id: Option<&str>) -> StoreResult<Vec<Order>> {
        // `orders_status_time` serves the status test: open orders only, whatever the history.
        let mut sql = format!(
            "SELECT {ORDER_COLUMNS} FROM orders o              WHERE o.status IN ('submitted', 'working', 'partially_filled')"
        );
        let mut args = Vec::new();
        if let Some(id) = account_id {
            sql.push_str(" AND o.account_id = ?");
            args.push(Value::Text(id.to_string()));
        }
        sql.push_str(" ORDER BY o.created_at, o.order_id");
        self.read(move |c| query(c, &sql, args, order_row)).await
    }
}

/// An order's columns, as `?1` to `?17` of the statements that write it.
fn order_values(o: &Order) -> StoreResult<[Value; 17]> {
    let text = |s: &str| Value::Text(s.to_string());
    let price = |p: Option<crate::core::domain::Price>| {
        p.map_or(Value::Null, |x| Value::Text(x.to_string()))
    };
    let versions = match o.versions.as_slice() {
        [] => Value::Null,
        v => Value::Text(serde_json::to_string(v).map_err(super::json_err)?),
    };
    Ok([
        text(&o.order_id),
        text(&o.terms.account_id),
        text(&o.terms.symbol),
        text(o.terms.side.as_str()),
        Value::Integer(o.terms.quantity.into()),
        text(o.terms.order_type.as_str()),
        price(o.terms.limit_price),
        price(o.terms.stop_price),
        text(o.terms.time_in_force.as_str()),
        text(o.status.as_str()),
        Value::Integer(o.filled_quantity.into()),
        price(o.avg_fill_price),
        o.action_id.as_deref().map_or(Value::Null, text),
        Value::Integer(o.created_at),
        Value::Integer(o.updated_at),
        Value::Integer(o.version.into()),
        versions,
    ])
}

/// Writes an order's row: replacing one with the same id, or (`replace` false) only if absent.
pub(super) fn put_order(tx: &rusqlite::Connection, o: &Order, replace: bool) -> StoreResult<usize> {
    let values = order_values(o)?;
    let verb = if replace {
        "INSERT OR REPLACE"
    } else {
        "INSERT OR IGNORE"
    };
    tx.prepare_cached(&format!(
        "{verb} INTO orders (order_id, account_id, symbol, side, quantity, order_type, \
         limit_price, stop_price, time_in_force, status, filled_quantity, avg_fill_price, \
         action_id, created_at, updated_at, version, versions, desk) VALUES (?1, ?2, ?3, ?4, \
         ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
         (SELECT desk FROM accounts WHERE account_id = ?2))"
    ))
    .and_then(|mut st| st.execute(rusqlite::params_from_iter(values)))
    .map_err(db_err)
}

/// Writes a step or a replace of an existing order: every column but its key, its account
/// (and desk) and its creation time, which neither moves. Only the index on `status`
/// changes with it; a `REPLACE` deleted and inserted the row and all five of its index
/// entries.
pub(super) fn update_order(tx: &rusqlite::Connection, o: &Order) -> StoreResult<usize> {
    let values = order_values(o)?;
    tx.prepare_cached(
        "UPDATE orders SET symbol = ?3, side = ?4, quantity = ?5, order_type = ?6, \
         limit_price = ?7, stop_price = ?8, time_in_force = ?9, status = ?10, \
         filled_quantity = ?11, avg_fill_price = ?12, action_id = ?13, updated_at = ?15, \
         version = ?16, versions = ?17 WHERE order_id = ?1",
    )
    .and_then(|mut st| st.execute(rusqlite::params_from_iter(values)))
    .map_err(db_err)
}

pub(super) fn load_order(c: &rusqlite::Connection, id: &str) -> StoreResult<Option<Order>> {
    let sql = format!("SELECT {ORDER_COLUMNS} FROM orders o WHERE o.order_id = ?");
    Ok(query(c, &sql, vec![id.to_string().into()], order_row)?
        .into_iter()
        .next())
}

#[cfg(test)]
mod tests {
    use super::super::queue::tests::temp_db;
    use crate::core::auth::DeskScope;
    use crate::core::ports::{OrderFilter, OrderStore, Page};

    /// A desk's orders page is one ordered seek of `orders_desk_time` (no sort of the desk's
    /// whole history), an account's page one of `orders_account_time`, even after the
    /// cursor; and an order written without its desk (by a binary from before migration 8)
    /// is given it, so it is listed.
    #[tokio::test]
    async fn a_desk_page_seeks_its_index_and_finds_every_order() {
        let t = temp_db("orders-desk");
        t.db.write(|c| {
            c.execute_batch(
                "INSERT INTO accounts VALUES ('ACC-1', 'One', 'energy', 'USD', 'active'), \
                                             ('ACC-9', 'Nine', 'metals', 'USD', 'active'); \
                 INSERT INTO orders (order_id, account_id, symbol, side, quantity, order_type, \
                   time_in_force, status, created_at, updated_at) VALUES \
                   ('ord-old', 'ACC-1', 'CLF27', 'buy', 1, 'market', 'day', 'filled', 1, 1), \
                   ('ord-metals', 'ACC-9', 'CLF27', 'buy', 1, 'market', 'day', 'filled', 2, 2);",
            )
            .map_err(super::db_err)
        })
        .await
        .unwrap();
        let energy = DeskScope::Only(["energy".to_string()].into());
        let first = Page {
            after: None,
            limit: 50,
        };
        let listed =
            t.db.list_orders(&energy, &OrderFilter::default(), &first)
                .await
                .unwrap();
        let ids: Vec<_> = listed.iter().map(|o| o.order_id.as_str()).collect();
        assert_eq!(ids, ["ord-old"]);

        let next = Page {
            after: Some((5, "ord-x".to_string())),
            limit: 50,
        };
        let account = OrderFilter {
            account_id: Some("ACC-1".into()),
            status: None,
        };
        let cases = [
            (OrderFilter::default(), &first, "orders_desk_time (desk=?)"),
            (OrderFilter::default(), &next, "orders_desk_time (desk=?"),
            (
                account.clone(),
                &first,
                "orders_account_time (account_id=?)",
            ),
            (account, &next, "orders_account_time (account_id=?"),
        ];
        for (filter, page, index) in cases {
            let (sql, args) = super::list_sql(&energy, &filter, page);
            let plan: Vec<String> =
                t.db.read(move |c| {
                    let mut st = c
                        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                        .map_err(super::db_err)?;
                    let rows = st
                        .query_map(rusqlite::params_from_iter(args), |r| r.get(3))
                        .map_err(super::db_err)?;
                    rows.collect::<rusqlite::Result<_>>().map_err(super::db_err)
                })
                .await
                .unwrap();
            assert_eq!(plan.len(), 1, "{plan:?}");
            assert!(
                plan[0].starts_with(&format!("SEARCH o USING INDEX {index}")),
                "{plan:?}"
            );
        }
    }
}
