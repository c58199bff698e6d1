//! Row helpers shared by the SQLite entity files: the desk filter, keyset paging, text
//! columns parsed into domain types, JSON bodies.

use super::packed::{pack, Body};
use super::{db_err, json_err};
use crate::core::auth::DeskScope;
use crate::core::domain::Price;
use crate::core::error::StoreResult;
use crate::core::ports::TimeKey;
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row};
use serde_json::value::RawValue;

/// `execute` and `query_row` through the connection's statement cache: the hot statements
/// are parsed once per connection, not on every call.
pub(super) trait Cached {
    fn run<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn run<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }
    fn row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// `desk IN (...)` for a desk scope, with its parameters. `column` names the desk column.
pub(super) fn desk_clause(desks: &DeskScope, column: &str, args: &mut Vec<Value>) -> String {
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

/// Column `i` of `r`, text parsed as `T` (an enum's name): read in place, no `String`.
pub(super) fn parse<T: std::str::FromStr<Err = String>>(r: &Row, i: usize) -> rusqlite::Result<T> {
    let s = r.get_ref(i)?.as_str()?;
    s.parse::<T>().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("{s:?}: {e}").into(),
        )
    })
}

/// Column `i` of `r`, a price as text or NULL: read in place, no `String`.
pub(super) fn price(r: &Row, i: usize) -> rusqlite::Result<Option<Price>> {
    r.get_ref(i)?
        .as_str_or_null()?
        .map(|s| {
            Price::parse(s).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
            })
        })
        .transpose()
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

/// ` LIMIT n`, written into the statement's text, never bound. SQLite marks a statement
/// whose LIMIT is a bound parameter to be prepared again whenever that parameter is bound
/// (its planner reads the value), so a bound limit parsed and planned the statement anew at
/// every execution, cache or not: a fifth of the server's CPU under the `reads` benchmark.
/// A literal keeps the statement prepared; one cached statement per distinct limit.
pub(super) fn limit(n: impl Into<u64>) -> String {
    format!(" LIMIT {}", n.into())
}

/// `AND (created_at, id) < (?, ?)` for newest-first keyset pages.
pub(super) fn time_after(
    after: &Option<TimeKey>,
    t: &str,
    id: &str,
    args: &mut Vec<Value>,
) -> String {
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

pub(super) fn body<T: serde::de::DeserializeOwned>(text: String) -> StoreResult<T> {
    serde_json::from_str(&text).map_err(json_err)
}

pub(super) fn one_body(
    c: &Connection,
    sql: &str,
    key: &[&dyn rusqlite::ToSql],
) -> StoreResult<Option<String>> {
    c.prepare_cached(sql)
        .and_then(|mut st| st.query_row(key, |r| r.get::<_, Body>(0)).optional())
        .map(|b| b.map(|b| b.0))
        .map_err(db_err)
}

/// The field of a stored plan or audit body that replaces its `risk_checks`.
const CHECKS_REF: &str = "risk_checks_ref";

/// A JSON object's top-level fields, each kept as its JSON text (nothing below the top
/// level is parsed into a tree), in key order. Rewriting a stored body's top-level fields
/// this way costs one scan and no allocation per nested value, where a
/// `serde_json::Value` built the whole tree; and only a top-level field is ever touched,
/// whatever a nested object (an agent's `chat_context`) calls its keys.
pub(super) type Fields<'a> = std::collections::BTreeMap<String, &'a RawValue>;

pub(super) fn fields(text: &str) -> StoreResult<Fields<'_>> {
    serde_json::from_str(text).map_err(json_err)
}

/// `text` (JSON) as a field value.
pub(super) fn raw(text: String) -> StoreResult<Box<RawValue>> {
    RawValue::from_string(text).map_err(json_err)
}

/// A plan or audit record ready to store: JSON whose `risk_checks` list, when not empty,
/// is kept once in `check_sets` (by the SHA-256 of its JSON) and referenced as
/// `risk_checks_ref`. A plan and its plan and execute audit records hold the same list;
/// stored inline it would be about half of each pair's bytes. [`full_body`] reverses it. Built
/// before the write (serializing, hashing and packing stay off the writer thread);
/// [`Compact::store`] inside it.
pub(super) struct Compact {
    /// The body to store, packed.
    pub body: Vec<u8>,
    /// The check list's hash and packed JSON.
    checks: Option<(String, Vec<u8>)>,
}

impl Compact {
    pub(super) fn new<T: serde::Serialize>(rec: &T) -> StoreResult<Compact> {
        let json = serde_json::to_string(rec).map_err(json_err)?;
        let mut top = fields(&json)?;
        let list = top
            .get("risk_checks")
            .map(|l| l.get())
            .filter(|l| *l != "[]");
        let (text, checks) = match list {
            None => (json.as_str().into(), None),
            Some(list) => {
                let hash = crate::core::digest::sha256_hex(list.as_bytes());
                let packed = pack(list);
                let reference = raw(format!("\"{hash}\""))?;
                top.remove("risk_checks");
                top.insert(CHECKS_REF.into(), &reference);
                let text = serde_json::to_string(&top).map_err(json_err)?;
                (std::borrow::Cow::Owned(text), Some((hash, packed)))
            }
        };
        Ok(Compact {
            body: pack(&text),
            checks,
        })
    }

    /// Stores the check list (once per distinct list); the body to store is `self.body`.
    pub(super) fn store(&self, c: &Connection) -> StoreResult<()> {
        if let Some((hash, text)) = &self.checks {
            c.run(
                "INSERT OR IGNORE INTO check_sets (hash, body) VALUES (?, ?)",
                rusqlite::params![hash, text],
            )
            .map_err(db_err)?;
        }
        Ok(())
    }
}

/// [`Compact`] built and stored at once: the body to store.
pub(super) fn compact_body<T: serde::Serialize>(c: &Connection, rec: &T) -> StoreResult<Vec<u8>> {
    let k = Compact::new(rec)?;
    k.store(c)?;
    Ok(k.body)
}

/// A stored plan or audit body with its risk checks back in place ([`compact_body`]);
/// bodies stored inline (before migration 6) read as they are.
pub(super) fn full_body<T: serde::de::DeserializeOwned>(
    c: &Connection,
    text: &str,
) -> StoreResult<T> {
    if !text.contains(CHECKS_REF) {
        return serde_json::from_str(text).map_err(json_err);
    }
    let mut top = fields(text)?;
    let Some(reference) = top.remove(CHECKS_REF) else {
        // The name appears only below the top level: nothing to put back.
        return serde_json::from_str(text).map_err(json_err);
    };
    let hash: String = serde_json::from_str(reference.get()).map_err(json_err)?;
    let checks: String = c
        .row("SELECT body FROM check_sets WHERE hash = ?", [&hash], |r| {
            r.get::<_, Body>(0).map(|b| b.0)
        })
        .optional()
        .map_err(db_err)?
        .ok_or_else(|| {
            crate::core::error::StoreError::Corrupt(format!("check set {hash} is missing"))
        })?;
    let checks = raw(checks)?;
    top.insert("risk_checks".into(), &checks);
    let text = serde_json::to_string(&top).map_err(json_err)?;
    serde_json::from_str(&text).map_err(json_err)
}
