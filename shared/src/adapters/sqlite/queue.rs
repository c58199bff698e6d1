//! The embedded queue: a SQLite table with a unique `(queue, dedup_id)`, so a resend of
//! the same action is a no-op, like SQS FIFO deduplication.

use async_trait::async_trait;
use rusqlite::params;

use super::{db_err, json_err, Sqlite};
use crate::domain::QueueTarget;
use crate::error::StoreResult;
use crate::ports::{Queue, QueueDepth};
use crate::records::QueueMessage;

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
