//! The audit log on SQLite: append-only records, each linked to its chain's head inside
//! the write that appends it ([`crate::core::audit_chain`]); read back as an id's trail,
//! or all of them with their links (`airlock audit verify`).

use super::rows::{full_body, Cached, Compact};
use super::{db_err, json_err, Sqlite};
use crate::core::audit_chain::{self, ChainHead, ChainLink, Checkpoint};
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::audit::{AuditChains, AuditPage, StoredAudit};
use crate::core::ports::AuditLog;
use crate::core::records::AuditRecord;
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

pub(super) fn append_audit(c: &Connection, a: &AuditRecord) -> StoreResult<()> {
    AuditRow::new(a)?.insert(c)
}

/// An audit record ready to append (built before the write, see [`Compact`]): its body and
/// content hash; the link is made inside the write.
pub(super) struct AuditRow {
    at: i64,
    plan_id: Option<String>,
    action_id: Option<String>,
    chain: String,
    content_hash: String,
    body: Compact,
}

impl AuditRow {
    pub(super) fn new(a: &AuditRecord) -> StoreResult<AuditRow> {
        Ok(AuditRow {
            at: a.at,
            plan_id: a.plan_id.clone(),
            action_id: a.action_id.clone(),
            chain: audit_chain::chain_of(a),
            content_hash: audit_chain::content_hash(a)?,
            body: Compact::new(a)?,
        })
    }

    /// Appends the record after its chain's head and moves the head, inside the caller's
    /// write (the one writer: no other append can come between the read and the writes).
    pub(super) fn insert(&self, c: &Connection) -> StoreResult<()> {
        let head: Option<ChainHead> = c
            .row(
                "SELECT seq, hash FROM audit_chains WHERE chain = ?",
                [&self.chain],
                |r| {
                    Ok(ChainHead {
                        chain: self.chain.clone(),
                        seq: r.get::<_, i64>(0)? as u64,
                        hash: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(db_err)?;
        let link = ChainLink::next(&self.chain, head.as_ref(), &self.content_hash);
        self.body.store(c)?;
        c.run(
            "INSERT INTO audit (at, plan_id, action_id, body, chain, chain_seq, prev_hash, hash) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            params![
                self.at,
                self.plan_id,
                self.action_id,
                self.body.body,
                link.chain,
                link.seq as i64,
                link.prev_hash,
                link.hash
            ],
        )
        .map_err(db_err)?;
        let moved = c
            .run(
                "INSERT INTO audit_chains (chain, seq, hash) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (chain) DO UPDATE SET seq = ?2, hash = ?3 WHERE seq = ?2 - 1",
                params![link.chain, link.seq as i64, link.hash],
            )
            .map_err(db_err)?;
        if moved != 1 {
            return Err(StoreError::Corrupt(format!(
                "audit chain {}: the head moved during its own write",
                link.chain
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl AuditLog for Sqlite {
    async fn append(&self, rec: &AuditRecord) -> StoreResult<()> {
        let row = AuditRow::new(rec)?;
        self.write(move |tx| row.insert(tx)).await
    }

    async fn trail(&self, id: &str) -> StoreResult<Vec<AuditRecord>> {
        let id = id.to_string();
        self.read(move |c| {
            // An action id also pulls in its plan's records.
            let plan_of_action: Option<String> = c
                .row(
                    "SELECT plan_id FROM actions WHERE action_id = ?",
                    [&id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err)?;
            let plan = plan_of_action.unwrap_or_else(|| id.clone());
            let mut st = c
                .prepare_cached(
                    "SELECT body FROM audit WHERE plan_id = ? OR action_id = ? OR plan_id = ? \
                     ORDER BY at, seq",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map(params![id, id, plan], |r| {
                    r.get::<_, super::packed::Body>(0)
                })
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err).and_then(|b| full_body(c, &b.0)))
                .collect()
        })
        .await
    }
}

type RawAudit = (
    i64,
    String,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

#[async_trait]
impl AuditChains for Sqlite {
    async fn heads(&self) -> StoreResult<Vec<ChainHead>> {
        self.read(|c| {
            let mut st = c
                .prepare_cached("SELECT chain, seq, hash FROM audit_chains ORDER BY chain")
                .map_err(db_err)?;
            let rows = st
                .query_map([], |r| {
                    Ok(ChainHead {
                        chain: r.get(0)?,
                        seq: r.get::<_, i64>(1)? as u64,
                        hash: r.get(2)?,
                    })
                })
                .map_err(db_err)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)
        })
        .await
    }

    async fn records(&self, after: Option<String>, limit: u32) -> StoreResult<AuditPage> {
        let after: i64 = match after {
            None => 0,
            Some(a) => a
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("audit position {a:?}")))?,
        };
        self.read(move |c| {
            let mut st = c
                .prepare_cached(&format!(
                    "SELECT seq, body, chain, chain_seq, prev_hash, hash FROM audit \
                     WHERE seq > ? ORDER BY seq{}",
                    super::rows::limit(limit)
                ))
                .map_err(db_err)?;
            let rows: Vec<RawAudit> = st
                .query_map([after], |r| {
                    Ok((
                        r.get(0)?,
                        r.get::<_, super::packed::Body>(1)?.0,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })
                .map_err(db_err)?
                .collect::<rusqlite::Result<_>>()
                .map_err(db_err)?;
            let next = (rows.len() as u32 == limit)
                .then(|| rows.last().map(|r| r.0.to_string()))
                .flatten();
            let mut out = Vec::with_capacity(rows.len());
            for (rowid, body, chain, seq, prev, hash) in rows {
                let link = match (chain, seq, prev, hash) {
                    (Some(chain), Some(seq), Some(prev_hash), Some(hash)) => Some(ChainLink {
                        chain,
                        seq: seq.max(0) as u64,
                        prev_hash,
                        hash,
                    }),
                    _ => None,
                };
                out.push(StoredAudit {
                    location: format!("audit row {rowid}"),
                    // A body that does not parse stays text: its hash then fails to match.
                    body: full_body(c, &body).unwrap_or(serde_json::Value::String(body)),
                    link,
                });
            }
            Ok((out, next))
        })
        .await
    }

    async fn put_checkpoint(&self, cp: &Checkpoint) -> StoreResult<()> {
        let body = serde_json::to_string(cp).map_err(json_err)?;
        let at = cp.at;
        self.write(move |tx| {
            tx.run(
                "INSERT INTO audit_checkpoints (at, body) VALUES (?, ?)",
                params![at, body],
            )
            .map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn checkpoints(&self) -> StoreResult<Vec<Checkpoint>> {
        self.read(|c| {
            let mut st = c
                .prepare_cached("SELECT id, body FROM audit_checkpoints ORDER BY at, id")
                .map_err(db_err)?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
                .map_err(db_err)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(db_err)?;
            rows.into_iter()
                .map(|(id, body)| {
                    serde_json::from_str(&body).map_err(|e| {
                        StoreError::Corrupt(format!("checkpoint row {id} does not parse: {e}"))
                    })
                })
                .collect()
        })
        .await
    }
}
