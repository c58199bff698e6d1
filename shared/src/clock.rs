//! Time. Every decision that depends on "now" reads it from a [`Clock`], so tests and
//! demos can pin the start instant with `AIRLOCK_NOW` and let it run on in real time.

use std::sync::Arc;

use crate::domain::Millis;

pub trait Clock: Send + Sync {
    fn now_ms(&self) -> Millis;
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(self.now_ms()).unwrap_or_default()
    }
}

pub type SharedClock = Arc<dyn Clock>;

/// Wall-clock time shifted by a fixed offset: starts at a chosen instant and runs on.
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock {
    offset_ms: i64,
}

impl OffsetClock {
    pub fn system() -> Self {
        OffsetClock { offset_ms: 0 }
    }

    /// A clock that reads `start` now and runs on in real time.
    pub fn starting_at(start: chrono::DateTime<chrono::Utc>) -> Self {
        OffsetClock {
            offset_ms: start.timestamp_millis() - chrono::Utc::now().timestamp_millis(),
        }
    }

    /// `AIRLOCK_NOW` (RFC 3339) when set, the system clock otherwise.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var("AIRLOCK_NOW") {
            Ok(v) if !v.trim().is_empty() => chrono::DateTime::parse_from_rfc3339(v.trim())
                .map(|t| Self::starting_at(t.with_timezone(&chrono::Utc)))
                .map_err(|e| format!("AIRLOCK_NOW must be an RFC 3339 instant ({e})")),
            _ => Ok(Self::system()),
        }
    }
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> Millis {
        chrono::Utc::now().timestamp_millis() + self.offset_ms
    }
}
