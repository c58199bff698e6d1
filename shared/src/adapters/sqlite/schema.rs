//! Schema migrations, applied in order at start; `PRAGMA user_version` records the last.

use rusqlite::Connection;

const MIGRATIONS: &[&str] = &[
    // 1: read models, protocol records, queue.
    r#"
    CREATE TABLE accounts (
        account_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        desk TEXT NOT NULL,
        currency TEXT NOT NULL,
        status TEXT NOT NULL
    );
    CREATE INDEX accounts_desk ON accounts(desk, account_id);

    CREATE TABLE positions (
        account_id TEXT NOT NULL REFERENCES accounts(account_id),
        symbol TEXT NOT NULL,
        quantity INTEGER NOT NULL,
        avg_price TEXT,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (account_id, symbol)
    );

    CREATE TABLE orders (
        order_id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(account_id),
        symbol TEXT NOT NULL,
        side TEXT NOT NULL,
        quantity INTEGER NOT NULL,
        order_type TEXT NOT NULL,
        limit_price TEXT,
        stop_price TEXT,
        time_in_force TEXT NOT NULL,
        status TEXT NOT NULL,
        filled_quantity INTEGER NOT NULL DEFAULT 0,
        avg_fill_price TEXT,
        action_id TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX orders_time ON orders(created_at DESC, order_id DESC);
    CREATE INDEX orders_account_time ON orders(account_id, created_at DESC, order_id DESC);
    CREATE INDEX orders_status_time ON orders(status, created_at DESC, order_id DESC);

    CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        account_id TEXT REFERENCES accounts(account_id),
        action_id TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        error TEXT,
        result TEXT
    );
    CREATE INDEX jobs_time ON jobs(created_at DESC, job_id DESC);

    CREATE TABLE plans (
        plan_id TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        body TEXT NOT NULL
    );

    CREATE TABLE idempotency_keys (
        principal TEXT NOT NULL,
        key TEXT NOT NULL,
        lease_owner TEXT,
        expires_at INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (principal, key)
    );

    CREATE TABLE actions (
        action_id TEXT PRIMARY KEY,
        plan_id TEXT NOT NULL,
        enqueued_at INTEGER,
        created_at INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX actions_unsent ON actions(created_at) WHERE enqueued_at IS NULL;

    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        plan_id TEXT,
        action_id TEXT,
        body TEXT NOT NULL
    );
    CREATE INDEX audit_plan ON audit(plan_id);
    CREATE INDEX audit_action ON audit(action_id);
    CREATE TRIGGER audit_append_only_update BEFORE UPDATE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;
    CREATE TRIGGER audit_append_only_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;

    CREATE TABLE control (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        body TEXT NOT NULL
    );

    CREATE TABLE rate_limits (
        operator_id TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        body TEXT NOT NULL
    );

    CREATE TABLE queue (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        queue TEXT NOT NULL,
        group_key TEXT NOT NULL,
        dedup_id TEXT NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'ready',
        visible_at INTEGER NOT NULL,
        receive_count INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        UNIQUE (queue, dedup_id)
    );
    CREATE INDEX queue_ready ON queue(queue, status, visible_at, id);
    "#,
    // 2: the paper broker's book.
    r#"
    CREATE TABLE paper_book (
        key TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        doc TEXT NOT NULL
    );
    CREATE INDEX queue_group ON queue(queue, group_key, status, id);
    "#,
    // 3: the queue's receive seeks the head of each group in an index of live messages
    // only (it replaces queue_group, whose status column split each group in two), and
    // acked messages are purged after the deduplication window through queue_done.
    r#"
    DROP INDEX queue_group;
    CREATE INDEX queue_live ON queue(queue, group_key, id)
        WHERE status IN ('ready', 'in_flight');
    CREATE INDEX queue_done ON queue(created_at) WHERE status = 'done';
    "#,
    // 4: open orders per account and contract, reserved at execute and released as
    // orders fill or end, so position limits hold against the worst case. Existing open
    // orders are counted once here.
    r#"
    CREATE TABLE exposures (
        account_id TEXT NOT NULL,
        symbol TEXT NOT NULL,
        open_buy INTEGER NOT NULL DEFAULT 0,
        open_sell INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (account_id, symbol)
    );
    INSERT INTO exposures (account_id, symbol, open_buy, open_sell)
        SELECT account_id, symbol,
            SUM(CASE WHEN side = 'buy' THEN MAX(quantity - filled_quantity, 0) ELSE 0 END),
            SUM(CASE WHEN side = 'sell' THEN MAX(quantity - filled_quantity, 0) ELSE 0 END)
        FROM orders
        WHERE status IN ('queued', 'submitted', 'working', 'partially_filled')
        GROUP BY account_id, symbol;
    "#,
    // 5: operator approvals. Plans awaiting one carry their desk in `awaiting_desk` (the
    // pending-approvals listing); the approval channel's documents (passkey operators,
    // enrolment links, WebAuthn challenges, sign-in sessions) live in `approval_docs`.
    r#"
    ALTER TABLE plans ADD COLUMN awaiting_desk TEXT;
    CREATE INDEX plans_awaiting ON plans(awaiting_desk, expires_at)
        WHERE awaiting_desk IS NOT NULL;
    CREATE TABLE approval_docs (
        kind TEXT NOT NULL,
        id TEXT NOT NULL,
        version INTEGER NOT NULL,
        expires_at INTEGER,
        body TEXT NOT NULL,
        PRIMARY KEY (kind, id)
    );
    "#,
    // 6: risk checks stored once per distinct list and referenced from the plan and
    // audit bodies that hold them (a plan and its audit records repeat the same list).
    r#"
    CREATE TABLE check_sets (
        hash TEXT PRIMARY KEY,
        body TEXT NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 7: `queue_ready` indexed every message by its status and visibility, so each step of
    // a message (sent, received, done) moved its entry. Only dead letters are looked up
    // that way (the live ones through `queue_live`, the done ones through `queue_done`):
    // a partial index of the dead letters replaces it.
    r#"
    DROP INDEX queue_ready;
    CREATE INDEX queue_dead ON queue(queue, visible_at, id) WHERE status = 'dead';
    "#,
    // 8: an order carries its account's desk (as its DynamoDB item does), so a desk's
    // orders, newest first, are one ordered seek of `orders_desk_time` that stops at the
    // page's end. Through the join with `accounts`, a page read and sorted every order of
    // the desk's accounts: its cost grew with the order history. An order inserted
    // without its desk (by an older binary) gets it from the trigger.
    r#"
    ALTER TABLE orders ADD COLUMN desk TEXT;
    UPDATE orders SET desk = (SELECT a.desk FROM accounts a WHERE a.account_id = orders.account_id);
    CREATE INDEX orders_desk_time ON orders(desk, created_at DESC, order_id DESC);
    CREATE TRIGGER orders_desk AFTER INSERT ON orders WHEN NEW.desk IS NULL BEGIN
        UPDATE orders SET desk = (SELECT a.desk FROM accounts a WHERE a.account_id = NEW.account_id)
        WHERE order_id = NEW.order_id;
    END;
    "#,
    // 9: the pending-approvals listing is two queries: an operator's own plans awaiting
    // approval (`awaiting_requester`), and the four-eyes plans of their desks
    // (`awaiting_desk`, set for four-eyes plans only), each newest first.
    r#"
    ALTER TABLE plans ADD COLUMN awaiting_requester TEXT;
    CREATE INDEX plans_awaiting_requester ON plans(awaiting_requester, expires_at)
        WHERE awaiting_requester IS NOT NULL;
    CREATE INDEX approval_docs_expiry ON approval_docs(expires_at)
        WHERE expires_at IS NOT NULL;
    "#,
    // 10: an order's version (1 as submitted, one more with each replace) and its earlier
    // versions' terms (JSON, NULL while it has none).
    r#"
    ALTER TABLE orders ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE orders ADD COLUMN versions TEXT;
    "#,
    // 11: what a position's fills realized on their trading day (JSON: the day and the USD
    // figure; NULL before its first closing fill), for the `daily_loss` check.
    r#"
    ALTER TABLE positions ADD COLUMN day_realized TEXT;
    "#,
];

pub fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        if version <= current {
            continue;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive)?;
        // Another process may have migrated while we waited for the lock.
        let now: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if now < version {
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", version)?;
        }
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_2_database_migrates_and_keeps_its_queue() {
        let path = std::env::temp_dir().join(format!(
            "airlock-migrate-{}-{}.db",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
        ));
        let mut c = Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..2] {
            c.execute_batch(sql).unwrap();
        }
        c.pragma_update(None, "user_version", 2).unwrap();
        c.execute_batch(
            "INSERT INTO queue (queue, group_key, dedup_id, body, status, visible_at, created_at) \
             VALUES ('worker:orders', 'ACC-1', 'a', '{}', 'done', 0, 0), \
                    ('worker:orders', 'ACC-1', 'b', '{}', 'ready', 0, 0);",
        )
        .unwrap();
        migrate(&mut c).unwrap();
        let version: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        let indexes: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'queue'")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(indexes.contains(&"queue_live".to_string()), "{indexes:?}");
        assert!(indexes.contains(&"queue_done".to_string()), "{indexes:?}");
        assert!(!indexes.contains(&"queue_group".to_string()), "{indexes:?}");
        assert!(indexes.contains(&"queue_dead".to_string()), "{indexes:?}");
        assert!(!indexes.contains(&"queue_ready".to_string()), "{indexes:?}");
        let n: i64 = c
            .query_row("SELECT COUNT(*) FROM queue", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        // Migrating again is a no-op.
        migrate(&mut c).unwrap();
        drop(c);
        let _ = std::fs::remove_file(&path);
    }
}
