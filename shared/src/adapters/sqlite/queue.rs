//! The embedded queue: a SQLite table with a unique `(queue, dedup_id)`, so a resend of
//! the same action is a no-op, like SQS FIFO deduplication.

use async_trait::async_trait;
use rusqlite::params;

use super::{db_err, json_err, Sqlite};
use crate::domain::QueueTarget;
use crate::error::StoreError;
use crate::error::StoreResult;
use crate::ports::{Delivery, Queue, QueueDepth};

use crate::records::QueueMessage;
use crate::worker::consumer::MAX_RECEIVES;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub queue: String,
    pub ready: i64,
    pub in_flight: i64,
    pub dead: i64,
}

#[async_trait]
impl Queue for Sqlite {
    async fn send(&self, msg: &QueueMessage, group: &str, dedup_id: &str) -> StoreResult<()> {
        let body = serde_json::to_string(msg).map_err(json_err)?;
        let queue = msg.action_type.queue_target().as_str().to_string();
        let (group, dedup) = (group.to_string(), dedup_id.to_string());
        let now = chrono::Utc::now().timestamp_millis();
        self.write(move |tx| {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO queue (queue, group_key, dedup_id, body, visible_at, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?)",
            )
            .and_then(|mut st| st.execute(params![queue, group, dedup, body, now, now]))
            .map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn receive(
        &self,
        queue: QueueTarget,
        max: u32,
        visibility_ms: u64,
    ) -> StoreResult<Vec<Delivery>> {
        let now = chrono::Utc::now().timestamp_millis();
        let q = queue.as_str().to_string();
        self.write(move |tx| {
            // Per group, only the oldest live message, and only if none of its group is in
            // flight: FIFO per account, like an SQS FIFO queue's message groups.
            let rows: Vec<(i64, String, i64)> = {
                let mut st = tx
                    .prepare_cached(
                        "SELECT m.id, m.body, m.receive_count FROM queue m \
                         WHERE m.queue = ?1 AND m.status IN ('ready', 'in_flight') AND m.visible_at <= ?2 \
                           AND m.id = (SELECT MIN(id) FROM queue g WHERE g.queue = ?1 \
                                       AND g.group_key = m.group_key AND g.status IN ('ready', 'in_flight')) \
                         ORDER BY m.id LIMIT ?3",
                    )
                    .map_err(db_err)?;
                let it = st
                    .query_map(params![q, now, max], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(db_err)?;
                it.collect::<rusqlite::Result<_>>().map_err(db_err)?
            };
            let mut out = Vec::with_capacity(rows.len());
            for (id, body, count) in rows {
                if count as u32 >= MAX_RECEIVES {
                    // Received as often as allowed (its consumer kept dying): dead-letter it.
                    tx.execute("UPDATE queue SET status = 'dead' WHERE id = ?", [id])
                        .map_err(db_err)?;
                    continue;
                }
                tx.execute(
                    "UPDATE queue SET status = 'in_flight', visible_at = ?, receive_count = receive_count + 1 WHERE id = ?",
                    params![now + visibility_ms as i64, id],
                )
                .map_err(db_err)?;
                out.push(Delivery {
                    receipt: id.to_string(),
                    body,
                    receive_count: count as u32 + 1,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn ack(&self, _queue: QueueTarget, receipt: &str) -> StoreResult<()> {
        let id: i64 = receipt
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("receipt {receipt}")))?;
        self.write(move |tx| {
            tx.execute("UPDATE queue SET status = 'done' WHERE id = ?", [id])
                .map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn release(&self, _queue: QueueTarget, receipt: &str, delay_ms: u64) -> StoreResult<()> {
        let id: i64 = receipt
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("receipt {receipt}")))?;
        let now = chrono::Utc::now().timestamp_millis();
        self.write(move |tx| {
            tx.execute(
                "UPDATE queue SET status = CASE WHEN receive_count >= ? THEN 'dead' ELSE 'ready' END, \
                 visible_at = ? WHERE id = ?",
                params![MAX_RECEIVES, now + delay_ms as i64, id],
            )
            .map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn depth(&self) -> StoreResult<Vec<QueueDepth>> {
        let stats = self.queue_stats().await?;
        Ok([QueueTarget::Orders, QueueTarget::Jobs]
            .into_iter()
            .map(|q| {
                let s = stats.iter().find(|s| s.queue == q.as_str());
                QueueDepth {
                    queue: q,
                    waiting: s.map(|s| s.ready).unwrap_or(0),
                    in_flight: s.map(|s| s.in_flight).unwrap_or(0),
                    dead_letters: s.map(|s| s.dead).unwrap_or(0),
                }
            })
            .collect())
    }
}

impl Sqlite {
    /// Message counts per queue, for `airlock status` and tests.
    pub async fn queue_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.read(|c| {
            let mut st = c
                .prepare(
                    "SELECT queue, \
                       SUM(status = 'ready'), SUM(status = 'in_flight'), SUM(status = 'dead') \
                     FROM queue GROUP BY queue ORDER BY queue",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map([], |r| {
                    Ok(QueueStats {
                        queue: r.get(0)?,
                        ready: r.get(1)?,
                        in_flight: r.get(2)?,
                        dead: r.get(3)?,
                    })
                })
                .map_err(db_err)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)
        })
        .await
    }
}
