//! The orders backlog: how many orders wait in the queue, read at most every `cache_ms`;
//! an order is held for room, then refused (`orders_backlogged`).

use super::*;

/// Execute's admission check for order submissions: while the orders queue holds `limit`
/// messages or more, waiting or being handled, a submission is held for up to `wait_ms`
/// for room (the workers pace a burst), then refused (503 `orders_backlogged`,
/// `Retry-After: 1`), so an accepted order reaches the broker moments after its
/// confirmation and a stalled or outrun pipeline does not pile up orders to send late.
/// Cancels and syncs are never held or refused (they reduce risk). The count is reused for
/// `cache_ms` (each ask is an SQS call on AWS).
#[derive(Clone)]
pub struct Backlog {
    limit: u32,
    cache_ms: Millis,
    pub(super) wait: std::time::Duration,
    /// The last count and when it was read.
    seen: Arc<Mutex<Option<(Millis, u64)>>>,
}

impl Backlog {
    pub fn new(limit: u32, cache_ms: u64, wait_ms: u64) -> Self {
        Backlog {
            limit,
            cache_ms: cache_ms.min(i64::MAX as u64) as Millis,
            wait: std::time::Duration::from_millis(wait_ms),
            seen: Arc::default(),
        }
    }

    /// The orders queue's count: the last one read, if younger than `max_age`.
    pub(super) async fn count(&self, queue: &dyn Queue, now: Millis, max_age: Millis) -> u64 {
        let cached = *self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match cached {
            Some((at, n)) if (at..at + max_age).contains(&now) => n,
            _ => {
                // The count is a brake on delay, not a risk control (those hold in the
                // atomic step and at the worker): a count that fails or is throttled
                // admits, for the cache's time, and the send meets the queue as before.
                let n = match queue.backlog(QueueTarget::Orders).await {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!(cause = %e, "orders backlog unknown; admitting");
                        0
                    }
                };
                *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some((now, n));
                n
            }
        }
    }

    pub(super) fn full(&self, n: u64) -> bool {
        self.limit != 0 && n >= u64::from(self.limit)
    }

    /// `None`: admit. `Some`: the refusal, unless the caller waits for room.
    pub(super) async fn refusal(&self, queue: &dyn Queue, now: Millis) -> Option<ApiError> {
        if self.limit == 0 {
            return None;
        }
        let n = self.count(queue, now, self.cache_ms).await;
        self.full(n).then(|| {
            ApiError::new(
                Code::OrdersBacklogged,
                format!(
                    "The orders queue holds {n} orders not yet handled (the limit is {}): an order accepted now would reach the broker late. Retry in 1 s with the same idempotency key.",
                    self.limit
                ),
            )
            .retry_after(1)
        })
    }

    /// Waits until the backlog is below its limit (`true`) or `until` passes (`false`),
    /// looking as often as the queue allows ([`Queue::backlog_poll`], whatever the cache
    /// time: a cache as long as the wait would otherwise never see room). The executes
    /// held at the same moment share one count per interval, and each one let go takes a
    /// place in that count, so a count with room for `k` lets go about `k` of them, not
    /// the whole crowd; `clock` dates the counts.
    pub(super) async fn room_by(
        &self,
        queue: &dyn Queue,
        clock: &SharedClock,
        until: tokio::time::Instant,
    ) -> bool {
        let every = queue.backlog_poll();
        let max_age = every.as_millis().clamp(1, i64::MAX as u128) as Millis;
        while tokio::time::Instant::now() < until {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(every.min(left)).await;
            let now = clock.now_ms();
            let n = self.count(queue, now, max_age).await;
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            let n = match seen.as_mut() {
                Some((_, counted)) => counted,
                None => &mut { n },
            };
            if !self.full(*n) {
                // This execute's place: the next held one sees one fewer free.
                *n += 1;
                return true;
            }
        }
        false
    }
}
