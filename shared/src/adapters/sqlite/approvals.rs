//! The approval channel's documents on SQLite: the `approval_docs` table, by kind and id,
//! each with a version and an expiry that every read and condition compares with now.

use super::rows::Cached;
use super::{db_err, json_err, Sqlite};
use crate::core::domain::Millis;
use crate::core::error::StoreResult;
use crate::core::ports::{ApprovalStore, Doc, DocKind};
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

fn load(c: &Connection, kind: DocKind, id: &str, now: Millis) -> StoreResult<Option<Doc>> {
    let row: Option<(i64, Option<i64>, String)> = c
        .prepare_cached(
            "SELECT version, expires_at, body FROM approval_docs WHERE kind = ? AND id = ? \
             AND (expires_at IS NULL OR expires_at > ?)",
        )
        .and_then(|mut st| {
            st.query_row(params![kind.as_str(), id, now], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
        })
        .map_err(db_err)?;
    row.map(|(version, expires_at, body)| {
        Ok(Doc {
            body: serde_json::from_str(&body).map_err(json_err)?,
            version: version as u64,
            expires_at,
        })
    })
    .transpose()
}

#[async_trait]
impl ApprovalStore for Sqlite {
    async fn get_doc(&self, kind: DocKind, id: &str, now: Millis) -> StoreResult<Option<Doc>> {
        let id = id.to_string();
        self.read(move |c| load(c, kind, &id, now)).await
    }

    async fn put_doc(
        &self,
        kind: DocKind,
        id: &str,
        doc: &Doc,
        expected: u64,
        now: Millis,
    ) -> StoreResult<bool> {
        let (id, doc) = (id.to_string(), doc.clone());
        self.write(move |tx| {
            let current = load(tx, kind, &id, now)?.map(|d| d.version).unwrap_or(0);
            if current != expected {
                return Ok(false);
            }
            let body = serde_json::to_string(&doc.body).map_err(json_err)?;
            // Expired documents (finished ceremonies, ended sessions, unused links) are
            // deleted a few at a time by the writes that add documents.
            tx.run(
                "DELETE FROM approval_docs WHERE rowid IN (SELECT rowid FROM approval_docs \
                 WHERE expires_at <= ? ORDER BY expires_at LIMIT 16)",
                params![now],
            )
            .map_err(db_err)?;
            tx.run(
                "INSERT INTO approval_docs (kind, id, version, expires_at, body) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (kind, id) DO UPDATE SET \
                 version = excluded.version, expires_at = excluded.expires_at, body = excluded.body",
                params![kind.as_str(), id, doc.version as i64, doc.expires_at, body],
            )
            .map_err(db_err)?;
            Ok(true)
        })
        .await
    }

    async fn take_doc(&self, kind: DocKind, id: &str, now: Millis) -> StoreResult<Option<Doc>> {
        let id = id.to_string();
        self.write(move |tx| {
            let doc = load(tx, kind, &id, now)?;
            if doc.is_some() {
                tx.run(
                    "DELETE FROM approval_docs WHERE kind = ? AND id = ?",
                    params![kind.as_str(), id],
                )
                .map_err(db_err)?;
            }
            Ok(doc)
        })
        .await
    }

    async fn list_docs(&self, kind: DocKind, now: Millis) -> StoreResult<Vec<Doc>> {
        self.read(move |c| {
            let mut st = c
                .prepare_cached(
                    "SELECT version, expires_at, body FROM approval_docs WHERE kind = ? \
                     AND (expires_at IS NULL OR expires_at > ?) ORDER BY id",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![kind.as_str(), now], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, Option<i64>>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })
                .map_err(db_err)?;
            let mut out = Vec::new();
            for r in rows {
                let (version, expires_at, body) = r.map_err(db_err)?;
                out.push(Doc {
                    body: serde_json::from_str(&body).map_err(json_err)?,
                    version: version as u64,
                    expires_at,
                });
            }
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn expired_documents_are_deleted_by_later_writes() {
        let dir = std::env::temp_dir().join(format!(
            "airlock-approval-docs-{}-{}",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
        ));
        let db = Sqlite::open(&dir).unwrap();
        let doc = |exp: Millis| Doc {
            body: json!({}),
            version: 1,
            expires_at: Some(exp),
        };
        for i in 0..40 {
            let id = format!("c{i}");
            assert!(db
                .put_doc(DocKind::Challenge, &id, &doc(1_000), 0, 500)
                .await
                .unwrap());
        }
        let count = |db: Sqlite| async move {
            db.read(|c| {
                c.query_row("SELECT COUNT(*) FROM approval_docs", [], |r| {
                    r.get::<_, i64>(0)
                })
                .map_err(db_err)
            })
            .await
            .unwrap()
        };
        assert_eq!(count(db.clone()).await, 40);
        // Later, three writes: each deletes up to 16 expired documents.
        for i in 0..3 {
            let id = format!("s{i}");
            db.put_doc(DocKind::Session, &id, &doc(10_000), 0, 2_000)
                .await
                .unwrap();
        }
        assert_eq!(count(db.clone()).await, 3, "only the live ones are left");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
