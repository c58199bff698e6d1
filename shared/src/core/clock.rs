//! Time. Every decision that depends on "now" reads it from a [`Clock`], so tests and
//! demos can pin the start instant with `AIRLOCK_NOW` and let it run on in real time.

use std::sync::Arc;

use crate::core::domain::Millis;

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

    /// A clock starting at `now` (the configuration's `AIRLOCK_NOW`) when given, the
    /// system clock otherwise.
    pub fn starting_at_or_system(now: Option<chrono::DateTime<chrono::Utc>>) -> Self {
        now.map(Self::starting_at).unwrap_or_else(Self::system)
    }
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> Millis {
        chrono::Utc::now().timestamp_millis() + self.offset_ms
    }
}
