//! The paper broker's documents on SQLite: versioned JSON, saved at the version read.

use super::rows::Cached;
use super::{db_err, json_err, Sqlite};
use crate::core::error::StoreResult;
use crate::core::ports::{PaperBookStore, PaperDoc};
use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};

#[async_trait]
impl PaperBookStore for Sqlite {
    async fn load(&self, key: &str) -> StoreResult<(Option<serde_json::Value>, u64)> {
        let key = key.to_string();
        self.read(move |c| {
            let row: Option<(String, i64)> = c
                .row(
                    "SELECT doc, version FROM paper_book WHERE key = ?",
                    [&key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(db_err)?;
            match row {
                None => Ok((None, 0)),
                Some((doc, v)) => Ok((
                    Some(serde_json::from_str(&doc).map_err(json_err)?),
                    v as u64,
                )),
            }
        })
        .await
    }

    async fn load_changed(
        &self,
        key: &str,
        known: u64,
    ) -> StoreResult<Option<(Option<serde_json::Value>, u64)>> {
        let key = key.to_string();
        self.read(move |c| {
            // The document's text only when its version moved (the price table is read by
            // every plan and every order, and changes only with `airlock prices set`).
            let row: Option<(Option<String>, i64)> = c
                .row(
                    "SELECT CASE WHEN version = ?2 THEN NULL ELSE doc END, version \
                     FROM paper_book WHERE key = ?1",
                    params![key, known as i64],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(db_err)?;
            match row {
                None if known == 0 => Ok(None),
                None => Ok(Some((None, 0))),
                Some((_, v)) if v as u64 == known => Ok(None),
                Some((None, v)) => Ok(Some((None, v as u64))),
                Some((Some(doc), v)) => Ok(Some((
                    Some(serde_json::from_str(&doc).map_err(json_err)?),
                    v as u64,
                ))),
            }
        })
        .await
    }

    async fn save(
        &self,
        key: &str,
        doc: &serde_json::Value,
        expected_version: u64,
    ) -> StoreResult<bool> {
        let (key, doc) = (key.to_string(), doc.to_string());
        self.write(move |tx| {
            let n = if expected_version == 0 {
                tx.run(
                    "INSERT OR IGNORE INTO paper_book (key, version, doc) VALUES (?, 1, ?)",
                    params![key, doc],
                )
            } else {
                tx.run(
                    "UPDATE paper_book SET doc = ?, version = version + 1 WHERE key = ? AND version = ?",
                    params![doc, key, expected_version as i64],
                )
            }
            .map_err(db_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn save_all(&self, docs: &[PaperDoc]) -> StoreResult<bool> {
        let docs: Vec<(String, String, u64)> = docs
            .iter()
            .map(|d| (d.key.clone(), d.doc.to_string(), d.expected_version))
            .collect();
        self.write(move |tx| {
            // One writer, one IMMEDIATE transaction: check every version, then write.
            for (key, _, expected) in &docs {
                let version: Option<i64> = tx
                    .prepare_cached("SELECT version FROM paper_book WHERE key = ?")
                    .and_then(|mut st| st.query_row([key], |r| r.get(0)).optional())
                    .map_err(db_err)?;
                if version.unwrap_or(0) as u64 != *expected {
                    return Ok(false);
                }
            }
            for (key, doc, expected) in &docs {
                tx.prepare_cached(
                    "INSERT INTO paper_book (key, version, doc) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (key) DO UPDATE SET version = ?2, doc = ?3",
                )
                .and_then(|mut st| st.execute(params![key, *expected as i64 + 1, doc]))
                .map_err(db_err)?;
            }
            Ok(true)
        })
        .await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<serde_json::Value>> {
        let prefix = prefix.to_string();
        self.read(move |c| {
            // A range on the primary key: [prefix, prefix + U+10FFFF).
            let end = format!("{prefix}\u{10FFFF}");
            let mut st = c
                .prepare("SELECT doc FROM paper_book WHERE key >= ? AND key < ? ORDER BY key")
                .map_err(db_err)?;
            let rows = st
                .query_map(params![prefix, end], |r| r.get::<_, String>(0))
                .map_err(db_err)?;
            rows.map(|r| {
                r.map_err(db_err)
                    .and_then(|doc| serde_json::from_str(&doc).map_err(json_err))
            })
            .collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::super::queue::tests::temp_db;
    use super::*;
    use serde_json::json;

    fn doc(key: &str, doc: serde_json::Value, expected_version: u64) -> PaperDoc {
        PaperDoc {
            key: key.into(),
            doc,
            expected_version,
        }
    }

    #[tokio::test]
    async fn paper_documents_save_together_or_not_at_all() {
        let t = temp_db("paper-save-all");
        let db = &t.db;
        assert!(db
            .save_all(&[
                doc("account:A", json!({"n": 1}), 0),
                doc("order:A:1", json!(1), 0)
            ])
            .await
            .unwrap());
        // The order exists already: nothing is written, not even the book.
        assert!(!db
            .save_all(&[
                doc("account:A", json!({"n": 2}), 1),
                doc("order:A:1", json!(2), 0)
            ])
            .await
            .unwrap());
        assert_eq!(
            db.load("account:A").await.unwrap(),
            (Some(json!({"n": 1})), 1)
        );
        // A stale book version: nothing is written.
        assert!(!db
            .save_all(&[
                doc("order:A:2", json!(2), 0),
                doc("account:A", json!({"n": 3}), 7)
            ])
            .await
            .unwrap());
        assert_eq!(db.load("order:A:2").await.unwrap(), (None, 0));
        assert!(db
            .save_all(&[
                doc("order:A:2", json!(2), 0),
                doc("account:A", json!({"n": 3}), 1)
            ])
            .await
            .unwrap());
        assert_eq!(
            db.load("account:A").await.unwrap(),
            (Some(json!({"n": 3})), 2)
        );
        assert!(db.save("order:AB:1", &json!(9), 0).await.unwrap());
        let mut listed = db.list("order:A:").await.unwrap();
        listed.sort_by_key(|v| v.as_i64());
        assert_eq!(listed, [json!(1), json!(2)]);
    }
}
