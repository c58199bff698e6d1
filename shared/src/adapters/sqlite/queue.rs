//! The embedded queue: a SQLite table with a unique `(queue, dedup_id)`, so a resend of
//! the same action is a no-op, like SQS FIFO deduplication.
//!
//! A message is `ready`, `in_flight` (received, hidden until `visible_at`), `done` (acked)
//! or `dead` (dead-lettered). Done rows are kept only as long as their deduplication id
//! must hold, SQS FIFO's 5-minute interval from the send ([`DEDUP_WINDOW_MS`]), then
//! deleted by later acks, a few at a time; dead rows stay (they are the dead-letter queue).
//! `receive` finds the head of each message group through the partial index `queue_live`
//! (migration 3), one index seek per group, whatever the backlog.

use super::packed::{packed_json, Body};
use super::rows::{limit, Cached};
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::params;
use tokio::sync::Notify;

use super::{db_err, Sqlite};
use crate::core::domain::QueueTarget;
use crate::core::error::StoreError;
use crate::core::error::StoreResult;
use crate::core::ports::{Delivery, Queue, QueueDepth};

use crate::core::records::QueueMessage;
use crate::core::records::MAX_RECEIVES;

/// How long an acked message's deduplication id keeps a resend out: SQS FIFO's
/// deduplication interval, counted from the send.
pub const DEDUP_WINDOW_MS: i64 = 5 * 60 * 1000;

/// Expired done rows deleted per ack: more than one, so the purge keeps up with the acks.
const PURGE_PER_ACK: u32 = 64;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub queue: String,
    pub ready: i64,
    pub in_flight: i64,
    pub dead: i64,
    pub oldest_ready: Option<i64>,
}

/// One signal per queue, raised after each send commits (see [`Queue::send_signal`]).
#[derive(Default)]
pub(super) struct SendSignals {
    orders: Arc<Notify>,
    jobs: Arc<Notify>,
}

impl SendSignals {
    fn get(&self, queue: QueueTarget) -> &Arc<Notify> {
        match queue {
            QueueTarget::Orders => &self.orders,
            QueueTarget::Jobs => &self.jobs,
        }
    }
}

/// The head of each message group (its oldest live message) that is visible now, oldest
/// first. A group whose head is in flight or delayed delivers nothing: FIFO per group, like
/// an SQS FIFO queue's message groups. The recursive part walks the distinct groups, each
/// step one seek in `queue_live`; the head of each group is one more.
const RECEIVE: &str = "\
    WITH RECURSIVE groups(k) AS ( \
        SELECT (SELECT MIN(group_key) FROM queue \
                WHERE queue = ?1 AND status IN ('ready', 'in_flight')) \
        UNION ALL \
        SELECT (SELECT MIN(group_key) FROM queue \
                WHERE queue = ?1 AND status IN ('ready', 'in_flight') AND group_key > groups.k) \
        FROM groups WHERE groups.k IS NOT NULL \
    ) \
    SELECT m.id, m.body, m.receive_count, m.group_key FROM groups \
    JOIN queue m ON m.id = (SELECT MIN(id) FROM queue \
                            WHERE queue = ?1 AND status IN ('ready', 'in_flight') AND group_key = groups.k) \
    WHERE groups.k IS NOT NULL AND m.visible_at <= ?2 \
    ORDER BY m.id";

/// The messages after a group's head, in order, for the same batch (as SQS FIFO hands out
/// several messages of one group in order): taken while ready and visible.
const FOLLOWERS: &str = "\
    SELECT id, body, receive_count, status, visible_at FROM queue \
    WHERE queue = ?1 AND group_key = ?2 AND status IN ('ready', 'in_flight') AND id > ?3 \
    ORDER BY id";

/// `id:receive_count`, as `receive` hands it out.
fn parse_receipt(receipt: &str) -> StoreResult<(i64, i64)> {
    receipt
        .split_once(':')
        .and_then(|(id, n)| Some((id.parse().ok()?, n.parse().ok()?)))
        .ok_or_else(|| StoreError::Corrupt(format!("receipt {receipt}")))
}

/// Puts a message on `queue`, ready now; a second message with the same `dedup_id` on
/// that queue is dropped (the unique index), as SQS FIFO drops a resend in its window. Also
/// the execute commit's outbox ([`super::ledger`]): the same insert inside its transaction.
pub(super) fn insert(
    tx: &rusqlite::Connection,
    queue: &str,
    group: &str,
    dedup_id: &str,
    body: &[u8],
    now: i64,
) -> StoreResult<()> {
    tx.prepare_cached(
        "INSERT OR IGNORE INTO queue (queue, group_key, dedup_id, body, visible_at, created_at) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .and_then(|mut st| st.execute(params![queue, group, dedup_id, body, now, now]))
    .map_err(db_err)?;
    Ok(())
}

impl Sqlite {
    /// Raises the send signal of `queue` once a message is committed to it. A permit is
    /// kept if no consumer waits yet, so a send is never missed.
    pub(super) fn wake(&self, queue: QueueTarget) {
        self.inner.sent.get(queue).notify_one();
    }
}

#[async_trait]
impl Queue for Sqlite {
    async fn send(&self, msg: &QueueMessage, group: &str, dedup_id: &str) -> StoreResult<()> {
        let body = packed_json(msg)?;
        let queue = msg.action_type.queue_target().as_str().to_string();
        let (group, dedup) = (group.to_string(), dedup_id.to_string());
        let now = chrono::Utc::now().timestamp_millis();
        self.write(move |tx| insert(tx, &queue, &group, &dedup, &body, now))
            .await?;
        self.wake(msg.action_type.queue_target());
        Ok(())
    }

    fn send_signal(&self, queue: QueueTarget) -> Option<Arc<Notify>> {
        Some(self.inner.sent.get(queue).clone())
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
            let heads: Vec<(i64, Body, i64, String)> = {
                let sql = format!("{RECEIVE}{}", limit(max));
                let mut st = tx.prepare_cached(&sql).map_err(db_err)?;
                let it = st
                    .query_map(params![q, now], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })
                    .map_err(db_err)?;
                it.collect::<rusqlite::Result<_>>().map_err(db_err)?
            };
            // Room left in the batch goes to the messages right behind each head, in
            // order: a group's chain is handled without a receive between its messages.
            let mut room = (max as usize).saturating_sub(heads.len());
            let mut rows = Vec::with_capacity(max as usize);
            for (id, body, count, group) in heads {
                rows.push((id, body, count, group.clone()));
                if room == 0 {
                    continue;
                }
                let sql = format!("{FOLLOWERS}{}", limit(room as u64));
                let mut st = tx.prepare_cached(&sql).map_err(db_err)?;
                let next: Vec<(i64, Body, i64, String, i64)> = st
                    .query_map(params![q, group, id], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })
                    .map_err(db_err)?
                    .collect::<rusqlite::Result<_>>()
                    .map_err(db_err)?;
                for (fid, fbody, fcount, status, visible_at) in next {
                    if status != "ready" || visible_at > now {
                        break;
                    }
                    rows.push((fid, fbody, fcount, group.clone()));
                    room -= 1;
                }
            }
            let mut out = Vec::with_capacity(rows.len());
            for (id, body, count, group) in rows {
                if count as u32 >= MAX_RECEIVES {
                    // Received as often as allowed (its consumer kept dying): dead-letter it.
                    tx.run("UPDATE queue SET status = 'dead' WHERE id = ?", [id])
                        .map_err(db_err)?;
                    continue;
                }
                tx.run(
                    "UPDATE queue SET status = 'in_flight', visible_at = ?, receive_count = receive_count + 1 WHERE id = ?",
                    params![now + visibility_ms as i64, id],
                )
                .map_err(db_err)?;
                out.push(Delivery {
                    // The receive count makes the receipt this delivery's own: a stale
                    // receipt (its visibility ran out and the message was received again)
                    // acks or releases nothing, as with SQS.
                    receipt: format!("{id}:{}", count + 1),
                    body: body.0,
                    receive_count: count as u32 + 1,
                    group: Some(group),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn ack(&self, _queue: QueueTarget, receipt: &str) -> StoreResult<()> {
        let (id, count) = parse_receipt(receipt)?;
        let expired = chrono::Utc::now().timestamp_millis() - DEDUP_WINDOW_MS;
        self.write(move |tx| {
            tx.prepare_cached(
                "UPDATE queue SET status = 'done' \
                 WHERE id = ? AND receive_count = ? AND status = 'in_flight'",
            )
            .and_then(|mut st| st.execute([id, count]))
            .map_err(db_err)?;
            // Done rows whose deduplication window is over (index `queue_done`).
            tx.prepare_cached(&format!(
                "DELETE FROM queue WHERE id IN (SELECT id FROM queue \
                 WHERE status = 'done' AND created_at < ? ORDER BY created_at{})",
                limit(PURGE_PER_ACK)
            ))
            .and_then(|mut st| st.execute(params![expired]))
            .map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn release(&self, _queue: QueueTarget, receipt: &str, delay_ms: u64) -> StoreResult<()> {
        let (id, count) = parse_receipt(receipt)?;
        let now = chrono::Utc::now().timestamp_millis();
        self.write(move |tx| {
            tx.run(
                "UPDATE queue SET status = CASE WHEN receive_count >= ? THEN 'dead' ELSE 'ready' END, \
                 visible_at = ? WHERE id = ? AND receive_count = ? AND status = 'in_flight'",
                params![MAX_RECEIVES, now + delay_ms as i64, id, count],
            )
            .map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn dead_letters(
        &self,
        queue: QueueTarget,
        max: u32,
        hide_ms: u64,
    ) -> StoreResult<Vec<Delivery>> {
        let now = chrono::Utc::now().timestamp_millis();
        let q = queue.as_str().to_string();
        self.write(move |tx| {
            let rows: Vec<(i64, Body, i64, String)> = tx
                .prepare_cached(&format!(
                    "SELECT id, body, receive_count, group_key FROM queue \
                     WHERE queue = ? AND status = 'dead' AND visible_at <= ? ORDER BY id{}",
                    limit(max)
                ))
                .and_then(|mut st| {
                    st.query_map(params![q, now], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(db_err)?;
            let mut out = Vec::with_capacity(rows.len());
            for (id, body, count, group) in rows {
                tx.run(
                    "UPDATE queue SET visible_at = ? WHERE id = ?",
                    params![now + hide_ms as i64, id],
                )
                .map_err(db_err)?;
                out.push(Delivery {
                    receipt: format!("{id}:{count}"),
                    body: body.0,
                    receive_count: count as u32,
                    group: Some(group),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn redrive(&self, queue: QueueTarget, max: u32) -> StoreResult<usize> {
        let now = chrono::Utc::now().timestamp_millis();
        let q = queue.as_str().to_string();
        let moved = self
            .write(move |tx| {
                // Same row, same deduplication id: a dead letter moves, it is not copied.
                tx.prepare_cached(&format!(
                    "UPDATE queue SET status = 'ready', receive_count = 0, visible_at = ? \
                     WHERE id IN (SELECT id FROM queue WHERE queue = ? AND status = 'dead' \
                     ORDER BY id{})",
                    limit(max)
                ))
                .and_then(|mut st| st.execute(params![now, q]))
                .map_err(db_err)
            })
            .await?;
        if moved > 0 {
            self.inner.sent.get(queue).notify_one();
        }
        Ok(moved)
    }

    async fn backlog(&self, queue: QueueTarget) -> StoreResult<u64> {
        let q = queue.as_str();
        self.read(move |c| {
            // Through `queue_live`: the done messages kept for deduplication are not read.
            c.row(
                "SELECT COUNT(*) FROM queue WHERE queue = ? AND status IN ('ready', 'in_flight')",
                [q],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n.max(0) as u64)
            .map_err(db_err)
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
                    oldest_sent_at: s.and_then(|s| s.oldest_ready),
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
                    // The live messages through `queue_live`, the dead letters through
                    // `queue_dead`: the done ones (kept for deduplication) are not read.
                    "SELECT queue, SUM(ready), SUM(in_flight), SUM(dead), MIN(oldest) FROM ( \
                       SELECT queue, status = 'ready' AS ready, status = 'in_flight' AS in_flight, \
                         0 AS dead, CASE WHEN status = 'ready' THEN created_at END AS oldest \
                       FROM queue WHERE status IN ('ready', 'in_flight') \
                       UNION ALL \
                       SELECT queue, 0, 0, 1, NULL FROM queue WHERE status = 'dead') \
                     GROUP BY queue ORDER BY queue",
                )
                .map_err(db_err)?;
            let rows = st
                .query_map([], |r| {
                    Ok(QueueStats {
                        queue: r.get(0)?,
                        ready: r.get(1)?,
                        in_flight: r.get(2)?,
                        dead: r.get(3)?,
                        oldest_ready: r.get(4)?,
                    })
                })
                .map_err(db_err)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)
        })
        .await
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Duration;

    /// A fresh database in its own temporary directory (removed on drop).
    pub struct TempDb {
        pub db: Sqlite,
        dir: std::path::PathBuf,
    }

    impl Drop for TempDb {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    pub fn temp_db(name: &str) -> TempDb {
        let dir = std::env::temp_dir().join(format!(
            "airlock-{name}-{}-{}",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
        ));
        TempDb {
            db: Sqlite::open(&dir).unwrap(),
            dir,
        }
    }

    fn msg(action_id: &str) -> QueueMessage {
        serde_json::from_value(serde_json::json!({
            "schema": "airlock.action.v1", "action_id": action_id, "plan_id": "p",
            "action_type": "order.submit.cl",
            "normalized_payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "buy",
                                   "quantity": 1, "order_type": "market", "time_in_force": "day"},
            "resource_refs": {},
            "requested_by": "op", "service_principal": "svc", "enqueued_at": "t",
            "trace": {"request_id": "r", "chat_session_id": null, "tool_call_id": null}
        }))
        .unwrap()
    }

    async fn send(db: &Sqlite, action_id: &str, group: &str) {
        db.send(&msg(action_id), group, action_id).await.unwrap();
    }

    async fn receive(db: &Sqlite) -> Vec<(String, Delivery)> {
        let batch = db.receive(QueueTarget::Orders, 10, 60_000).await.unwrap();
        batch
            .into_iter()
            .map(|d| {
                let m: QueueMessage = serde_json::from_str(&d.body).unwrap();
                (m.action_id, d)
            })
            .collect()
    }

    fn ids(batch: &[(String, Delivery)]) -> Vec<&str> {
        batch.iter().map(|(id, _)| id.as_str()).collect()
    }

    async fn rows(db: &Sqlite, status: &str) -> i64 {
        let status = status.to_string();
        db.read(move |c| {
            c.query_row(
                "SELECT COUNT(*) FROM queue WHERE status = ?",
                [status],
                |r| r.get(0),
            )
            .map_err(db_err)
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn each_group_delivers_in_order_and_nothing_while_it_has_one_in_flight() {
        let t = temp_db("queue-fifo");
        send(&t.db, "a1", "ACC-1").await;
        send(&t.db, "a2", "ACC-1").await;
        send(&t.db, "b1", "ACC-2").await;
        send(&t.db, "c1", "ACC-3").await;
        // Heads first, then the messages behind them in their group's order.
        let first = receive(&t.db).await;
        assert_eq!(ids(&first), ["a1", "a2", "b1", "c1"]);
        assert!(
            receive(&t.db).await.is_empty(),
            "every group has its messages in flight"
        );
        send(&t.db, "a3", "ACC-1").await;
        assert!(
            receive(&t.db).await.is_empty(),
            "a3 waits: its group still has messages in flight"
        );
        for d in &first[..2] {
            t.db.ack(QueueTarget::Orders, &d.1.receipt).await.unwrap();
        }
        assert_eq!(ids(&receive(&t.db).await), ["a3"]);
        t.db.release(QueueTarget::Orders, &first[2].1.receipt, 0)
            .await
            .unwrap();
        let again = receive(&t.db).await;
        assert_eq!(ids(&again), ["b1"]);
        assert_eq!(again[0].1.receive_count, 2);
        let stats = t.db.depth().await.unwrap();
        assert_eq!(
            (stats[0].waiting, stats[0].in_flight, stats[0].dead_letters),
            (0, 3, 0)
        );
    }

    #[tokio::test]
    async fn a_message_behind_a_delayed_retry_waits_for_it() {
        let t = temp_db("queue-fifo-delay");
        send(&t.db, "a1", "ACC-1").await;
        send(&t.db, "a2", "ACC-1").await;
        let first = receive(&t.db).await;
        assert_eq!(ids(&first), ["a1", "a2"]);
        // a1 failed and is retried later; a2 was released untouched behind it.
        t.db.release(QueueTarget::Orders, &first[0].1.receipt, 60_000)
            .await
            .unwrap();
        t.db.release(QueueTarget::Orders, &first[1].1.receipt, 0)
            .await
            .unwrap();
        assert!(
            receive(&t.db).await.is_empty(),
            "a2 never overtakes a1 while a1 waits for its retry"
        );
    }

    #[tokio::test]
    async fn a_stale_receipt_acks_and_releases_nothing() {
        let t = temp_db("queue-stale-receipt");
        send(&t.db, "a1", "ACC-1").await;
        let first = t.db.receive(QueueTarget::Orders, 10, 1).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        // Visibility ran out: received again; the first receipt is now stale.
        let second = receive(&t.db).await;
        assert_eq!(second[0].1.receive_count, 2);
        t.db.release(QueueTarget::Orders, &first[0].receipt, 0)
            .await
            .unwrap();
        t.db.ack(QueueTarget::Orders, &first[0].receipt)
            .await
            .unwrap();
        assert_eq!(
            rows(&t.db, "in_flight").await,
            1,
            "the stale receipt did nothing"
        );
        t.db.ack(QueueTarget::Orders, &second[0].1.receipt)
            .await
            .unwrap();
        assert_eq!(rows(&t.db, "done").await, 1);
    }

    #[tokio::test]
    async fn an_acked_message_keeps_out_resends_for_the_dedup_window_then_goes() {
        let t = temp_db("queue-purge");
        send(&t.db, "a1", "ACC-1").await;
        let d = receive(&t.db).await;
        t.db.ack(QueueTarget::Orders, &d[0].1.receipt)
            .await
            .unwrap();
        send(&t.db, "a1", "ACC-1").await;
        assert!(
            receive(&t.db).await.is_empty(),
            "deduplicated after the ack"
        );
        assert_eq!(rows(&t.db, "done").await, 1);
        // Its window is over: the next ack purges it, and the same id is new again.
        t.db.write(|tx| {
            tx.execute(
                "UPDATE queue SET created_at = created_at - ? WHERE status = 'done'",
                [DEDUP_WINDOW_MS + 1],
            )
            .map_err(db_err)
        })
        .await
        .unwrap();
        send(&t.db, "b1", "ACC-2").await;
        let d = receive(&t.db).await;
        t.db.ack(QueueTarget::Orders, &d[0].1.receipt)
            .await
            .unwrap();
        assert_eq!(rows(&t.db, "done").await, 1, "only b1's row is left");
        send(&t.db, "a1", "ACC-1").await;
        assert_eq!(ids(&receive(&t.db).await), ["a1"]);
    }

    #[tokio::test]
    async fn receive_seeks_the_live_index_instead_of_scanning_the_backlog() {
        let t = temp_db("queue-plan");
        let plan: Vec<String> =
            t.db.read(|c| {
                let mut st = c
                    .prepare(&format!("EXPLAIN QUERY PLAN {RECEIVE}{}", limit(10u32)))
                    .map_err(db_err)?;
                let rows = st
                    .query_map(params!["worker:orders", 0], |r| r.get::<_, String>(3))
                    .map_err(db_err)?;
                rows.collect::<rusqlite::Result<_>>().map_err(db_err)
            })
            .await
            .unwrap();
        // Only the CTE's own rows are scanned; every access to the table is a seek.
        for l in &plan {
            let scan = l.starts_with("SCAN") && l != "SCAN groups" && l != "SCAN CONSTANT ROW";
            let seek =
                l.starts_with("SEARCH") && !l.contains("queue_live") && !l.contains("PRIMARY KEY");
            assert!(!scan && !seek, "{l} in {plan:?}");
        }
        assert!(plan.iter().any(|l| l.contains("queue_live")), "{plan:?}");
    }

    #[tokio::test]
    async fn a_send_wakes_a_waiting_consumer_even_if_it_starts_waiting_later() {
        let t = temp_db("queue-signal");
        let sent = t.db.send_signal(QueueTarget::Orders).unwrap();
        let jobs = t.db.send_signal(QueueTarget::Jobs).unwrap();
        send(&t.db, "a1", "ACC-1").await;
        let woke = tokio::time::timeout(Duration::from_millis(500), sent.notified()).await;
        assert!(woke.is_ok(), "the send left a permit");
        let other = tokio::time::timeout(Duration::from_millis(50), jobs.notified()).await;
        assert!(other.is_err(), "the jobs queue was not signalled");
    }
}
