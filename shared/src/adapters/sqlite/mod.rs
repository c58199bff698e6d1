//! The embedded backend: one SQLite file under the state dir (WAL), schema migrations
//! applied at start, one writer connection and a few readers. Every port is implemented on
//! [`Sqlite`]. Reads run on the calling thread on a free reader (see [`Sqlite::read`]);
//! writes go to the writer's own thread, which commits the writes waiting at the same
//! moment together (group commit, each write in its own savepoint, see [`Sqlite::write`]);
//! a checkpointer thread copies the WAL into the database file and syncs it.

mod accounts;
mod actions;
mod approvals;
mod audit;
mod control;
mod jobs;
mod ledger;
mod limits;
mod lz4;
mod orders;
pub mod packed;
mod paper;
mod plans;
mod positions;
mod queue;
mod read_models;
mod rows;
mod schema;
mod workers;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use crate::core::error::{StoreError, StoreResult};

pub use queue::QueueStats;

const READERS: usize = 4;

/// How often the checkpointer looks for committed WAL frames to copy into the database.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(25);
/// WAL pages after which the writer checkpoints itself (SQLite's auto-checkpoint), should
/// the checkpointer fall behind; its checkpoint also lets the next write restart the WAL
/// from its start, so the file stays near this many pages (about 35 MB measured).
const WRITER_CHECKPOINT_PAGES: i64 = 8192;

#[derive(Clone)]
pub struct Sqlite {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The writer thread's queue of writes ([`writer_thread`]).
    writer: std::sync::mpsc::Sender<Job>,
    readers: Vec<Mutex<Connection>>,
    next: AtomicUsize,
    /// Dropping it stops the checkpointer thread.
    _checkpointer: std::sync::mpsc::Sender<()>,
    /// Raised on each send, per queue, for this process's consumers.
    sent: queue::SendSignals,
    /// Last, so that it closes after the readers (see [`DbFile`]).
    _db_file: DbFile,
}

/// A descriptor of the database file of Airlock's own, for the checkpointer to sync the
/// pages it copied (see [`checkpointer_thread`]). Closing any descriptor of a file drops
/// every POSIX lock the process holds on it, SQLite's included, so each holder drops its
/// clone only after its connection: the descriptor closes after the last connection.
type DbFile = Arc<std::fs::File>;

fn open(path: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open(path)?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.pragma_update(None, "foreign_keys", "ON")?;
    // Statement journals (every write of a group commit runs in a savepoint) and temporary
    // b-trees in memory. On disk each is a temp file opened, written and unlinked per
    // statement on the writer thread: 2.5 % of the server's CPU in open/unlink alone, and
    // 6 to 20 % of the pairs throughput (BENCHMARKS.md). A memory map of the database is
    // slower (page faults on a file that grows; BENCHMARKS.md, "Tried and not kept").
    c.pragma_update(None, "temp_store", "MEMORY")?;
    // Every statement the adapter runs stays parsed (rusqlite keeps 16 by default; the
    // writer alone runs about 40 distinct ones).
    c.set_prepared_statement_cache_capacity(96);
    Ok(c)
}

pub(crate) fn db_err(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ) =>
        {
            StoreError::Unavailable(format!("sqlite busy: {f}"))
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::Corrupt(e.to_string()),
        other => StoreError::Unavailable(format!("sqlite: {other}")),
    }
}

pub(crate) fn json_err(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("stored JSON: {e}"))
}

/// One write for the writer thread: runs on the connection inside its savepoint and says
/// whether it succeeded, with what answers its caller once the batch's fate is known.
/// Given no connection it does not run, and its answer is the error it is then given.
type Job = Box<dyn FnOnce(Option<&Connection>) -> (bool, Deliver) + Send>;
type Deliver = Box<dyn FnOnce(StoreResult<()>) + Send>;

/// Writes committed together at most.
const MAX_BATCH: usize = 64;

/// The writer connection's thread: takes the writes waiting (up to [`MAX_BATCH`]) and runs
/// them in one transaction, then answers each. Ends when every [`Sqlite`] is gone.
fn writer_thread(
    mut conn: Connection,
    jobs: std::sync::mpsc::Receiver<Job>,
    commits: Arc<std::sync::atomic::AtomicU64>,
    db_file: DbFile,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        run_batch(&mut conn, batch);
        commits.fetch_add(1, Ordering::Relaxed);
    }
    drop(conn);
    drop(db_file);
}

/// The checkpointer: copies committed WAL frames into the database file, and syncs both,
/// on a connection of its own, every [`CHECKPOINT_EVERY`] while there were commits. A
/// passive checkpoint runs beside the writer instead of inside one of its commits, so the
/// writer never waits for the copy or its two `fsync`s: with SQLite's auto-checkpoint on
/// the writer (every 1,000 pages) the writer spends about 13 % of its time in `fsync` under
/// the `pairs` benchmark, and every request behind it waits. The writer's auto-checkpoint
/// stays as a backstop at [`WRITER_CHECKPOINT_PAGES`]. Ends when its [`Sqlite`] is gone.
///
/// SQLite syncs the database file only at the end of a checkpoint that copied the whole
/// WAL, which a checkpoint beside a busy writer never does (the writer has committed more
/// by then). So the pages the checkpointer copies stay unsynced until the writer's backstop
/// checkpoint, whose `fsync` then waits for all of them (5.5 to 6.8 ms at the median under
/// `pairs`, about four times a second), with every write behind it. The checkpointer syncs
/// the database file itself after each round ([`DbFile`]), and the backstop's sync finds
/// little left to write. A sync is never less durable.
fn checkpointer_thread(
    conn: Connection,
    stop: std::sync::mpsc::Receiver<()>,
    commits: Arc<std::sync::atomic::AtomicU64>,
    db_file: DbFile,
) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut seen = 0;
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(CHECKPOINT_EVERY) {
        let now = commits.load(Ordering::Relaxed);
        if now == seen {
            continue;
        }
        seen = now;
        // Busy (the writer's own checkpoint is running) or failed: the next round retries,
        // and the writer's backstop bounds the WAL meanwhile.
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(cause = %e, "sqlite checkpoint failed; retrying");
        } else if let Err(e) = db_file.sync_data() {
            // SQLite's own sync, at the backstop, fails the writer's commit if this persists.
            tracing::warn!(cause = %e, "syncing the sqlite database file failed; retrying");
        }
    }
    drop(conn);
    drop(db_file);
}

/// One transaction for `batch`: each write in a savepoint, rolled back alone when it fails;
/// the answers go out after the commit (an Ok answer means committed). Should SQLite
/// abandon the whole transaction (it does on some I/O or memory errors), every write
/// already run in it is answered with the error, and the rest go on in a new one.
fn run_batch(conn: &mut Connection, batch: Vec<Job>) {
    let mut jobs = batch.into_iter().peekable();
    while jobs.peek().is_some() {
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            let e = db_err(e);
            for job in jobs {
                // Not run: answer each with the error without touching the connection.
                let (_, deliver) = job_failed(job);
                deliver(Err(e.clone()));
            }
            return;
        }
        let mut done: Vec<Deliver> = Vec::new();
        let mut lost: Option<StoreError> = None;
        for job in jobs.by_ref() {
            if let Err(e) = conn.execute_batch("SAVEPOINT w") {
                lost = Some(db_err(e));
                let (_, deliver) = job_failed(job);
                done.push(deliver);
                break;
            }
            let (ok, deliver) = job(Some(conn));
            done.push(deliver);
            if conn.is_autocommit() {
                lost = Some(StoreError::Unavailable(
                    "sqlite rolled the transaction back".into(),
                ));
                break;
            }
            let end = if ok {
                conn.execute_batch("RELEASE w")
            } else {
                conn.execute_batch("ROLLBACK TO w; RELEASE w")
            };
            if let Err(e) = end {
                lost = Some(db_err(e));
                break;
            }
        }
        let outcome = match lost {
            None => conn.execute_batch("COMMIT").map_err(db_err),
            Some(e) => Err(e),
        };
        if outcome.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for deliver in done {
            deliver(outcome.clone());
        }
    }
}

/// A job that will not run: its answer, to be given an error.
fn job_failed(job: Job) -> (bool, Deliver) {
    job(None)
}

impl Sqlite {
    /// Opens (creating if needed) `airlock.db` in `state_dir` and migrates it.
    pub fn open(state_dir: &Path) -> Result<Sqlite, String> {
        std::fs::create_dir_all(state_dir)
            .map_err(|e| format!("creating {}: {e}", state_dir.display()))?;
        let path = state_dir.join("airlock.db");
        // Opened (and created, empty, on the first start: SQLite takes an empty file for a
        // new database) before any connection, so that on every way out of this function it
        // closes after them (see [`DbFile`]).
        let db_file: DbFile = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map(Arc::new)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut writer = open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        schema::migrate(&mut writer).map_err(|e| format!("migrating {}: {e}", path.display()))?;
        let readers = (0..READERS)
            .map(|_| open(&path).map(Mutex::new))
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        writer
            .pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let checkpoints = open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (c, f) = (commits.clone(), db_file.clone());
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer_thread(writer, queue, c, f))
            .map_err(|e| format!("starting the SQLite writer thread: {e}"))?;
        let (checkpointer, stop) = std::sync::mpsc::channel::<()>();
        let (c, f) = (commits.clone(), db_file.clone());
        std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || checkpointer_thread(checkpoints, stop, c, f))
            .map_err(|e| format!("starting the SQLite checkpoint thread: {e}"))?;
        Ok(Sqlite {
            inner: Arc::new(Inner {
                path,
                writer: jobs,
                readers,
                next: AtomicUsize::new(0),
                _checkpointer: checkpointer,
                sent: queue::SendSignals::default(),
                _db_file: db_file,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on a reader connection. A read of the WAL snapshot takes microseconds, less
    /// than a hand-off to the blocking pool (two thread switches), so it runs on the
    /// calling thread on the first reader that is free; only when every reader is busy
    /// does it wait for one on the blocking pool.
    pub(crate) async fn read<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let n = self.inner.readers.len();
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            if let Ok(conn) = self.inner.readers[(start + i) % n].try_lock() {
                return f(&conn);
            }
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let i = start % inner.readers.len();
            let conn = inner.readers[i]
                .lock()
                .map_err(|_| StoreError::Unavailable("sqlite reader poisoned".into()))?;
            f(&conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("blocking task: {e}")))?
    }

    /// Runs `f` on the writer connection, atomically: its changes are committed if it
    /// returns Ok and undone if it returns an error (or panics), and the answer comes back
    /// only once they are durable. Writes that arrive while others run are committed
    /// together in one IMMEDIATE transaction, each in its own savepoint (group commit).
    pub(crate) async fn write<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel::<StoreResult<R>>();
        let job: Job = Box::new(move |conn: Option<&Connection>| {
            let r = match conn {
                Some(conn) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn)))
                    .unwrap_or_else(|_| Err(StoreError::Unavailable("a write panicked".into()))),
                None => Err(StoreError::Unavailable("not run".into())),
            };
            let ok = r.is_ok();
            let deliver: Deliver = Box::new(move |committed: StoreResult<()>| {
                let _ = answer.send(committed.and(r));
            });
            (ok, deliver)
        });
        self.inner
            .writer
            .send(job)
            .map_err(|_| StoreError::Unavailable("the sqlite writer has stopped".into()))?;
        answered
            .await
            .map_err(|_| StoreError::Unavailable("the sqlite writer dropped a write".into()))?
    }

    /// Whether the database holds any account yet (the demo seed runs once).
    pub async fn is_empty(&self) -> StoreResult<bool> {
        self.read(|c| {
            c.query_row("SELECT COUNT(*) FROM accounts", [], |r| r.get::<_, i64>(0))
                .map(|n| n == 0)
                .map_err(db_err)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::queue::tests::temp_db;
    use crate::core::error::StoreError;
    use rusqlite::Connection;

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// Risk checks are stored once and referenced; reading gives back exactly what was
    /// written, and a body stored inline (before the check sets) still reads.
    #[tokio::test]
    async fn risk_checks_are_stored_once_and_read_back_whole() {
        use super::rows::{compact_body, full_body};
        use serde_json::{json, Value};
        let t = temp_db("check-sets");
        let checks = json!([{"name": "kill_switch", "status": "pass", "reason": "released"},
                            {"name": "max_order_size", "status": "fail", "reason": "too big"}]);
        let plan = json!({"plan_id": "pln_1", "risk_checks": checks, "preview": "Buy 1"});
        let audit = json!({"audit_id": "aud_1", "risk_checks": checks, "event": "plan"});
        let empty = json!({"audit_id": "aud_2", "risk_checks": [], "event": "x"});
        let (p2, a2, e2) = (plan.clone(), audit.clone(), empty.clone());
        let stored: Vec<String> =
            t.db.write(move |c| {
                Ok(vec![
                    compact_body(c, &p2)?,
                    compact_body(c, &a2)?,
                    compact_body(c, &e2)?,
                ])
            })
            .await
            .unwrap()
            .iter()
            .map(|b| super::packed::text(rusqlite::types::ValueRef::Blob(b)).unwrap())
            .collect();
        assert!(!stored[0].contains("max_order_size"), "{}", stored[0]);
        assert!(stored[0].contains("risk_checks_ref"));
        assert!(stored[2].contains("\"risk_checks\":[]"), "{}", stored[2]);
        let legacy = plan.to_string();
        let (back, sets): (Vec<Value>, i64) =
            t.db.read(move |c| {
                let mut back: Vec<Value> = Vec::new();
                for s in stored.iter().chain([&legacy]) {
                    back.push(full_body(c, s)?);
                }
                let n = c
                    .query_row("SELECT COUNT(*) FROM check_sets", [], |r| r.get(0))
                    .unwrap();
                Ok((back, n))
            })
            .await
            .unwrap();
        assert_eq!(back, vec![plan.clone(), audit, empty, plan]);
        assert_eq!(sets, 1, "one list, stored once");
    }

    /// Only the top-level `risk_checks` list is stored apart: an agent's `chat_context`
    /// that names its own keys `risk_checks` or `risk_checks_ref` is stored and read back
    /// as it was sent, and never takes the place of the record's own checks.
    #[tokio::test]
    async fn only_the_top_level_checks_are_stored_apart() {
        use super::rows::{compact_body, full_body};
        use serde_json::{json, Value};
        let t = temp_db("nested-checks");
        let forged = "0".repeat(64);
        let plan = json!({
            "chat_context": {"risk_checks_ref": forged, "risk_checks": [{"name": "x"}]},
            "plan_id": "pln_1",
            "risk_checks": [{"name": "max_order_size", "status": "fail", "reason": "too big"}],
        });
        let no_checks = json!({"chat_context": {"risk_checks_ref": forged}, "risk_checks": []});
        let (p2, n2) = (plan.clone(), no_checks.clone());
        let back: Vec<Value> =
            t.db.write(move |c| {
                let stored = [compact_body(c, &p2)?, compact_body(c, &n2)?];
                stored
                    .iter()
                    .map(|b| {
                        let text = super::packed::text(rusqlite::types::ValueRef::Blob(b))
                            .map_err(crate::core::error::StoreError::Corrupt)?;
                        full_body(c, &text)
                    })
                    .collect()
            })
            .await
            .unwrap();
        assert_eq!(back, vec![plan, no_checks]);
    }

    /// The database file Airlock opens beside SQLite (for the checkpointer's syncs) is
    /// created empty on the first start and taken by SQLite as a new database; it is never
    /// truncated on a later start; and the writes committed while the checkpointer copies
    /// and syncs, past the writer's own backstop checkpoint, are all there, whole, after
    /// the store is dropped and opened again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_database_survives_the_checkpointers_syncs_and_a_reopen() {
        let dir = std::env::temp_dir().join(format!(
            "airlock-db-file-{}-{}",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
        ));
        let db = super::Sqlite::open(&dir).unwrap();
        db.write(|c| {
            c.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
                .map_err(super::db_err)
        })
        .await
        .unwrap();
        // About 3 pages per write, 12,000 pages in all: more than the backstop's 8,192, so
        // the WAL restarts at least once while the checkpointer works beside the writer.
        let writes = (0..4_000).map(|i| {
            let db = db.clone();
            tokio::spawn(async move {
                db.write(move |c| {
                    c.execute("INSERT INTO t (id, body) VALUES (?1, zeroblob(10000))", [i])
                        .map(|_| ())
                        .map_err(super::db_err)
                })
                .await
            })
        });
        for w in writes.collect::<Vec<_>>() {
            w.await.unwrap().unwrap();
        }
        tokio::time::sleep(super::CHECKPOINT_EVERY * 4).await;
        drop(db);
        // The threads close their connections (and the file) once the store is gone.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;

        let db = super::Sqlite::open(&dir).unwrap();
        let (rows, integrity) = db
            .read(|c| {
                let rows = count(c);
                let integrity: String = c
                    .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                    .map_err(super::db_err)?;
                Ok((rows, integrity))
            })
            .await
            .unwrap();
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(rows, 4_000);
        assert_eq!(integrity, "ok");
    }

    /// The bundled SQLite is built as `.cargo/config.toml` asks: without the process-wide
    /// page cache and its lock (`ENABLE_MEMORY_MANAGEMENT`), without memory accounting.
    /// A build that lost the setting (a cargo run outside the workspace's configuration)
    /// fails here rather than quietly serializing every connection's page reads.
    #[test]
    fn sqlite_is_built_without_its_global_locks() {
        let c = Connection::open_in_memory().unwrap();
        let options: Vec<String> = c
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(options.iter().any(|o| o == "THREADSAFE=1"), "{options:?}");
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }

    /// A bound LIMIT makes SQLite prepare the statement again at each execution (its
    /// planner reads the bound value); the limit written into the text, as [`super::rows::limit`]
    /// writes it, keeps the cached statement prepared.
    #[test]
    fn a_literal_limit_keeps_the_statement_prepared() {
        use rusqlite::StatementStatus::RePrepare;
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)")
            .unwrap();
        let run = |sql: &str, n: i64, bind_limit: bool| {
            let mut st = c.prepare_cached(sql).unwrap();
            let rows: Vec<i64> = if bind_limit {
                st.query_map([n, 10], |r| r.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            } else {
                st.query_map([n], |r| r.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            };
            assert!(rows.is_empty());
            st.get_status(RePrepare)
        };
        let bound = "SELECT n FROM t WHERE n > ? ORDER BY n LIMIT ?";
        let literal = format!(
            "SELECT n FROM t WHERE n > ? ORDER BY n{}",
            super::rows::limit(10u32)
        );
        for n in 0..3 {
            run(bound, n, true);
            run(&literal, n, false);
        }
        assert!(
            run(bound, 9, true) >= 3,
            "SQLite no longer re-prepares a bound LIMIT"
        );
        assert_eq!(run(&literal, 9, false), 0);
    }

    /// No statement of the embedded adapter binds its LIMIT (see the test above).
    #[test]
    fn no_statement_binds_its_limit() {
        let sources = [
            ("accounts.rs", include_str!("accounts.rs")),
            ("actions.rs", include_str!("actions.rs")),
            ("approvals.rs", include_str!("approvals.rs")),
            ("audit.rs", include_str!("audit.rs")),
            ("control.rs", include_str!("control.rs")),
            ("jobs.rs", include_str!("jobs.rs")),
            ("ledger.rs", include_str!("ledger.rs")),
            ("orders.rs", include_str!("orders.rs")),
            ("paper.rs", include_str!("paper.rs")),
            ("plans.rs", include_str!("plans.rs")),
            ("positions.rs", include_str!("positions.rs")),
            ("queue.rs", include_str!("queue.rs")),
            ("read_models.rs", include_str!("read_models.rs")),
            ("rows.rs", include_str!("rows.rs")),
            ("workers.rs", include_str!("workers.rs")),
        ];
        for (file, text) in sources {
            for pattern in ["LIMIT ?", "OFFSET ?"] {
                assert!(!text.contains(pattern), "{file} binds a limit: {pattern}");
            }
        }
    }

    /// Committed pages reach the database file without the writer checkpointing: the
    /// checkpointer copies them from the WAL within a few of its rounds, long before the
    /// writer's own auto-checkpoint (at [`super::WRITER_CHECKPOINT_PAGES`]) would.
    #[tokio::test]
    async fn the_checkpointer_copies_committed_pages_into_the_database() {
        let t = temp_db("checkpointer");
        let file = t.db.path().to_path_buf();
        let size = || std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        t.db.write(|c| {
            c.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY, b BLOB)")
                .map_err(super::db_err)
        })
        .await
        .unwrap();
        let before = size();
        for n in 0..20i64 {
            t.db.write(move |c| {
                c.execute("INSERT INTO t (n, b) VALUES (?, zeroblob(20000))", [n])
                    .map_err(super::db_err)
            })
            .await
            .unwrap();
        }
        // About 100 pages, far below the writer's own threshold.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while size() < before + 380_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the database file stayed at {} bytes (was {before})",
                size()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Many writes at once share transactions: each one that succeeds is committed, each
    /// one that fails (or panics) leaves nothing behind, and every caller hears its own
    /// result, whatever the others did.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_commit_keeps_each_write_atomic_on_its_own() {
        let t = temp_db("group-commit");
        let db = t.db.clone();
        db.write(|c| {
            c.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)")
                .map_err(super::db_err)
        })
        .await
        .unwrap();
        let mut tasks = Vec::new();
        for n in 0..300i64 {
            let db = db.clone();
            tasks.push(tokio::spawn(async move {
                db.write(move |c| {
                    // Two rows per write: a failing write must undo its first insert too.
                    c.execute("INSERT INTO t (n) VALUES (?)", [n * 2])
                        .map_err(super::db_err)?;
                    c.execute("INSERT INTO t (n) VALUES (?)", [n * 2 + 1])
                        .map_err(super::db_err)?;
                    match n % 3 {
                        0 => Ok(n),
                        1 => Err(StoreError::Corrupt(format!("write {n} refused"))),
                        _ if n % 10 == 5 => panic!("write {n} panics"),
                        _ => Ok(n),
                    }
                })
                .await
            }));
        }
        let mut ok = 0;
        for (n, task) in tasks.into_iter().enumerate() {
            let n = n as i64;
            match (n % 3, task.await.unwrap()) {
                (1, Err(StoreError::Corrupt(m))) => assert_eq!(m, format!("write {n} refused")),
                (_, Err(StoreError::Unavailable(m))) if n % 10 == 5 => {
                    assert!(m.contains("panicked"), "{m}")
                }
                (_, Ok(v)) => {
                    assert_eq!(v, n);
                    ok += 1
                }
                (_, other) => panic!("write {n}: {other:?}"),
            }
        }
        let rows = db
            .read(|c| {
                let rows = count(c);
                // No half write: the rows of a write are both there or both absent.
                let odd_without_even: i64 = c
                    .query_row(
                        "SELECT COUNT(*) FROM t a WHERE a.n % 2 = 1 AND NOT EXISTS \
                         (SELECT 1 FROM t b WHERE b.n = a.n - 1)",
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                assert_eq!(odd_without_even, 0);
                Ok(rows)
            })
            .await
            .unwrap();
        assert_eq!(rows, ok * 2, "{ok} writes succeeded");
        // A write after all that still works: the writer thread is alive.
        db.write(|c| {
            c.execute("INSERT INTO t (n) VALUES (100000)", [])
                .map_err(super::db_err)
        })
        .await
        .unwrap();
    }
}
