//! The embedded backend: one SQLite file under the state dir (WAL), schema migrations
//! applied at start, one writer connection and a few readers. Every port is implemented on
//! [`Sqlite`]; each call runs on the blocking pool.

mod accounts;
mod actions;
mod approvals;
mod audit;
mod control;
mod jobs;
mod ledger;
mod orders;
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

use crate::error::{StoreError, StoreResult};

pub use queue::QueueStats;

const READERS: usize = 4;

#[derive(Clone)]
pub struct Sqlite {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    next: AtomicUsize,
    /// Raised on each send, per queue, for this process's consumers.
    sent: queue::SendSignals,
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open(path)?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.pragma_update(None, "foreign_keys", "ON")?;
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

impl Sqlite {
    /// Opens (creating if needed) `airlock.db` in `state_dir` and migrates it.
    pub fn open(state_dir: &Path) -> Result<Sqlite, String> {
        std::fs::create_dir_all(state_dir)
            .map_err(|e| format!("creating {}: {e}", state_dir.display()))?;
        let path = state_dir.join("airlock.db");
        let mut writer = open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        schema::migrate(&mut writer).map_err(|e| format!("migrating {}: {e}", path.display()))?;
        let readers = (0..READERS)
            .map(|_| open(&path).map(Mutex::new))
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Sqlite {
            inner: Arc::new(Inner {
                path,
                writer: Mutex::new(writer),
                readers,
                next: AtomicUsize::new(0),
                sent: queue::SendSignals::default(),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on a reader connection on the blocking pool.
    pub(crate) async fn read<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let i = inner.next.fetch_add(1, Ordering::Relaxed) % inner.readers.len();
            let conn = inner.readers[i]
                .lock()
                .map_err(|_| StoreError::Unavailable("sqlite reader poisoned".into()))?;
            f(&conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("blocking task: {e}")))?
    }

    /// Runs `f` in one IMMEDIATE transaction on the writer; commits if it returns Ok.
    pub(crate) async fn write<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&rusqlite::Transaction) -> StoreResult<R> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = inner
                .writer
                .lock()
                .map_err(|_| StoreError::Unavailable("sqlite writer poisoned".into()))?;
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(db_err)?;
            let r = f(&tx)?;
            tx.commit().map_err(db_err)?;
            Ok(r)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("blocking task: {e}")))?
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
