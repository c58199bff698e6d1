//! The message throttle: per account, the orders, changes and cancels that execute accepts
//! are counted over a sliding window of the policy's `message_window_seconds`. An order or a
//! change that would take the account over `max_messages_per_window` is refused (429
//! `message_throttled`) and starts a lockout of `message_lockout_seconds`, during which
//! only cancels pass. Cancels are never refused by the throttle (they are how an account
//! gets out of trouble) but they count, so a burst of cancels holds back the next order.
//!
//! The window is the sliding estimate of the execute rate limit ([`crate::core::records::RateState`]),
//! with buckets one window long: the previous bucket's count weighted by the share of it
//! still inside the window, plus the current bucket's. The account's window is one record
//! in the limits store ([`window_id`]); execute's atomic commit counts on it with a
//! condition ([`MessageUpdate`]), so concurrent executes on one account cannot pass the
//! threshold together. Everything here is arithmetic: the adapters only check and apply
//! the update's condition.

use serde::{Deserialize, Serialize};

use crate::core::domain::{human_time, Millis};
use crate::core::error::{ApiError, Code};
use crate::core::policy::Policy;

/// The limits-store id of an account's message window. The unit separator (U+001F) keeps it
/// apart from operator ids and the other limits' ids (account ids hold no control
/// characters).
pub fn window_id(account_id: &str) -> String {
    format!("msgs\u{1f}{account_id}")
}

/// One account's message window as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageWindow {
    pub id: String,
    /// Start of the bucket `count` belongs to; 0 when nothing was counted yet.
    pub bucket: Millis,
    pub count: u32,
    /// The count of the bucket before `bucket`.
    pub previous: u32,
    /// The end of the account's lockout; 0 (or any instant past) when none.
    #[serde(default)]
    pub locked_until: Millis,
}

/// One more message on an account's window, applied atomically with execute's commit:
/// an increment of the current bucket (below `cap`, when there is one) while the stored
/// bucket is `bucket`, or a roll-over to `bucket` with a count of 1 while the stored bucket
/// is still `expected_bucket`; and, when `unlocked_at` is set, only if the account is not
/// locked out at that instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageUpdate {
    pub id: String,
    pub bucket: Millis,
    pub expected_bucket: Millis,
    pub previous: u32,
    /// The current bucket's count must be below this; `None` (a cancel): counted whatever
    /// the count.
    pub cap: Option<u32>,
    /// The account must not be locked out at this instant (orders and changes).
    pub unlocked_at: Option<Millis>,
    /// The record is needed until then at least (the store may forget it after).
    pub keep_until: Millis,
}

impl MessageUpdate {
    pub fn is_increment(&self) -> bool {
        self.expected_bucket == self.bucket
    }

    /// Whether the stored window `w` allows this update (the condition the commit checks).
    pub fn allowed_by(&self, w: &MessageWindow) -> bool {
        if self.unlocked_at.is_some_and(|now| w.locked_until > now) {
            return false;
        }
        if self.is_increment() {
            w.bucket == self.bucket && self.cap.is_none_or(|cap| w.count < cap)
        } else {
            w.bucket == self.expected_bucket
        }
    }

    /// `w` with this update applied (the lockout kept).
    pub fn applied_to(&self, w: &MessageWindow) -> MessageWindow {
        if self.is_increment() {
            MessageWindow {
                count: w.count.saturating_add(1),
                ..w.clone()
            }
        } else {
            MessageWindow {
                id: self.id.clone(),
                bucket: self.bucket,
                count: 1,
                previous: self.previous,
                locked_until: w.locked_until,
            }
        }
    }
}

/// The throttle of the policy in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    pub limit: u32,
    pub window_ms: Millis,
    pub lockout_ms: Millis,
}

/// What the throttle says of one execute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Counted by the commit with this update.
    Pass(MessageUpdate),
    /// Refused; nothing is counted.
    Refuse(Refusal),
}

/// Why an order or a change was refused, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// When an order would pass again: the lockout's end and the window's room, whichever
    /// is later.
    pub retry_at: Millis,
    /// The end of the lockout this refusal starts, to store (`None`: the account was locked
    /// out already, or the policy has no lockout).
    pub starts_lockout: Option<Millis>,
    /// The end of the lockout the account was already in.
    pub locked_until: Option<Millis>,
}

impl Throttle {
    pub fn of(p: &Policy) -> Throttle {
        Throttle {
            limit: p.max_messages_per_window.max(1),
            window_ms: Millis::from(p.message_window_seconds.max(1)) * 1000,
            lockout_ms: Millis::from(p.message_lockout_seconds) * 1000,
        }
    }

    /// The start of the bucket `now` falls in.
    pub fn bucket_of(&self, now: Millis) -> Millis {
        now - now.rem_euclid(self.window_ms)
    }

    /// (this bucket's count, the previous bucket's count) as seen at `now`.
    fn counts_at(&self, w: &MessageWindow, now: Millis) -> (u32, u32) {
        let current = self.bucket_of(now);
        if w.bucket == current {
            (w.count, w.previous)
        } else if w.bucket == current - self.window_ms {
            (0, w.count)
        } else {
            (0, 0)
        }
    }

    /// Messages in the window ending at `now`, estimated.
    pub fn estimate(&self, w: &MessageWindow, now: Millis) -> f64 {
        let (cur, prev) = self.counts_at(w, now);
        let into = (now - self.bucket_of(now)) as f64 / self.window_ms as f64;
        prev as f64 * (1.0 - into) + cur as f64
    }

    /// The highest count the current bucket may have before one more message, so that the
    /// estimate stays within the limit: `count < cap` exactly when
    /// `prev * (W - into) / W + count < limit`, in integers. The estimate only falls as the
    /// bucket goes on, so a cap computed at the decision still holds at the commit.
    fn cap(&self, prev: u32, into: Millis) -> u32 {
        let w = self.window_ms as i128;
        let room = self.limit as i128 * w - prev as i128 * (w - (into as i128).clamp(0, w));
        if room <= 0 {
            0
        } else {
            ((room + w - 1) / w).min(self.limit as i128) as u32
        }
    }

    /// Whether one more order fits the window at `now`.
    pub fn has_room(&self, w: &MessageWindow, now: Millis) -> bool {
        let (cur, prev) = self.counts_at(w, now);
        cur < self.cap(prev, now - self.bucket_of(now))
    }

    /// The first instant at or after `now` at which one more order fits the window, if no
    /// other message is counted meanwhile.
    pub fn room_at(&self, w: &MessageWindow, now: Millis) -> Millis {
        if self.has_room(w, now) {
            return now;
        }
        let (cur, prev) = self.counts_at(w, now);
        let (wms, limit) = (self.window_ms as i128, self.limit as i128);
        let (cur_i, prev_i) = (cur as i128, prev as i128);
        let start = self.bucket_of(now);
        // In this bucket: `prev * (W - into) < (limit - cur) * W`.
        if cur_i < limit && prev_i > 0 {
            let into = wms * (prev_i - limit + cur_i) / prev_i + 1;
            if into < wms {
                return start + into as Millis;
            }
        }
        // In the next one, this bucket's count is the previous: `cur * (W - into) < limit * W`.
        let into = if cur_i < limit {
            0
        } else {
            wms * (cur_i - limit) / cur_i + 1
        };
        start + self.window_ms + into as Millis
    }

    /// The throttle's answer for one message at `now` on the stored window `w`: a cancel
    /// always passes (and is counted); an order or a change passes while the account is not
    /// locked out and the window has room, and is otherwise refused, starting a lockout.
    pub fn gate(&self, w: &MessageWindow, now: Millis, cancel: bool) -> Gate {
        let current = self.bucket_of(now);
        let (_, prev) = self.counts_at(w, now);
        let keep_until = now + 2 * self.window_ms + self.lockout_ms + 60_000;
        if cancel {
            return Gate::Pass(MessageUpdate {
                id: w.id.clone(),
                bucket: current,
                expected_bucket: w.bucket,
                previous: prev,
                cap: None,
                unlocked_at: None,
                keep_until,
            });
        }
        let room = self.room_at(w, now);
        if w.locked_until > now {
            return Gate::Refuse(Refusal {
                retry_at: w.locked_until.max(room),
                starts_lockout: None,
                locked_until: Some(w.locked_until),
            });
        }
        if room > now {
            let starts = (self.lockout_ms > 0).then_some(now + self.lockout_ms);
            return Gate::Refuse(Refusal {
                retry_at: starts.unwrap_or(room).max(room),
                starts_lockout: starts,
                locked_until: None,
            });
        }
        Gate::Pass(MessageUpdate {
            id: w.id.clone(),
            bucket: current,
            expected_bucket: w.bucket,
            previous: prev,
            cap: Some(self.cap(prev, now - current)),
            unlocked_at: Some(now),
            keep_until,
        })
    }

    /// 429 `message_throttled` for a refusal of [`Throttle::gate`] on `account_id`.
    pub fn refusal(&self, account_id: &str, now: Millis, r: &Refusal) -> ApiError {
        let wait = ((r.retry_at - now).max(1) as u64).div_ceil(1000);
        let over = format!(
            "{} orders, changes and cancels within {} s",
            self.limit,
            self.window_ms / 1000
        );
        let message = if let Some(end) = r.locked_until {
            format!(
                "Account {account_id} is locked out by the message throttle ({over} reached) until {}; only cancels pass until then. Retry in {wait} s with the same idempotency key.",
                human_time(end)
            )
        } else if let Some(end) = r.starts_lockout {
            format!(
                "Account {account_id} reached {over} (the message throttle): it is locked out for {} s, until {}, and only cancels pass until then. Retry in {wait} s with the same idempotency key.",
                self.lockout_ms / 1000,
                human_time(end)
            )
        } else {
            format!(
                "Account {account_id} reached {over} (the message throttle); retry in {wait} s with the same idempotency key."
            )
        };
        ApiError::new(Code::MessageThrottled, message).retry_after(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(limit: u32, window_s: i64, lockout_s: i64) -> Throttle {
        Throttle {
            limit,
            window_ms: window_s * 1000,
            lockout_ms: lockout_s * 1000,
        }
    }

    /// A window after counting one message at `now` through the gate.
    fn count(t: &Throttle, w: &MessageWindow, now: Millis, cancel: bool) -> Option<MessageWindow> {
        match t.gate(w, now, cancel) {
            Gate::Pass(u) => {
                assert!(
                    u.allowed_by(w),
                    "the update's condition holds on what it read"
                );
                Some(u.applied_to(w))
            }
            Gate::Refuse(_) => None,
        }
    }

    fn empty() -> MessageWindow {
        MessageWindow {
            id: window_id("ACC-1"),
            ..MessageWindow::default()
        }
    }

    /// The start of a bucket of 2 s and of 3 s.
    const T0: Millis = 1_800_000_000_000;

    /// A window in the bucket of [`T0`]: `cur` orders in it, `prev` in the bucket before.
    fn window(prev: u32, cur: u32) -> MessageWindow {
        MessageWindow {
            bucket: T0,
            count: cur,
            previous: prev,
            ..empty()
        }
    }

    /// The commit's condition (`count < cap`) admits exactly what the estimate admits, at
    /// every point of the bucket: exact integer arithmetic, no float edge.
    #[test]
    fn the_cap_is_the_sliding_estimate() {
        for limit in [1u32, 2, 5, 20] {
            let t = throttle(limit, 3, 30);
            for prev in 0..=limit + 2 {
                for into in (0..3_000).step_by(37) {
                    for cur in 0..=limit + 2 {
                        let (w, now) = (window(prev, cur), T0 + into);
                        let exact = prev as f64 * (3_000 - into) as f64 / 3_000.0 + cur as f64;
                        assert_eq!(
                            t.has_room(&w, now),
                            exact < limit as f64,
                            "limit {limit} prev {prev} cur {cur} into {into}"
                        );
                    }
                }
            }
        }
    }

    /// `room_at` is the first millisecond at which an order fits again.
    #[test]
    fn room_at_is_the_first_instant_with_room() {
        for limit in [1u32, 3, 5] {
            let t = throttle(limit, 2, 0);
            for prev in 0..=limit + 3 {
                for cur in 0..=limit + 3 {
                    for into in [0, 1, 500, 1_999] {
                        let (w, now) = (window(prev, cur), T0 + into);
                        let at = t.room_at(&w, now);
                        assert!(at >= now);
                        assert!(t.has_room(&w, at), "room at {at}");
                        // Scanned in steps of 1 ms near the answer, coarser before it.
                        let mut s = now;
                        while s < at {
                            assert!(!t.has_room(&w, s), "room at {s}, before {at}");
                            s += if at - s > 50 { 7 } else { 1 };
                        }
                    }
                }
            }
        }
    }

    /// A burst passes exactly the limit; the refusal starts the lockout, during which
    /// orders are refused and cancels pass (and count); after it, orders pass again.
    #[test]
    fn a_burst_is_cut_at_the_limit_and_locks_out() {
        let t = throttle(5, 3, 30);
        let mut w = empty();
        let now = T0 + 100;
        for i in 0..5 {
            w = count(&t, &w, now, false).unwrap_or_else(|| panic!("order {i} passes"));
        }
        let Gate::Refuse(r) = t.gate(&w, now, false) else {
            panic!("the sixth is refused")
        };
        let end = now + 30_000;
        assert_eq!(
            r,
            Refusal {
                retry_at: end,
                starts_lockout: Some(end),
                locked_until: None
            }
        );
        let e = t.refusal("ACC-1", now, &r);
        assert_eq!((e.code, e.retry_after), (Code::MessageThrottled, Some(30)));
        assert!(e.message.contains("locked out for 30 s"), "{}", e.message);
        w.locked_until = end;
        // During the lockout: orders refused (the lockout's end), cancels counted.
        let later = now + 10_000;
        let Gate::Refuse(r) = t.gate(&w, later, false) else {
            panic!("locked out")
        };
        assert_eq!(
            r,
            Refusal {
                retry_at: end,
                starts_lockout: None,
                locked_until: Some(end)
            }
        );
        assert_eq!(t.refusal("ACC-1", later, &r).retry_after, Some(20));
        let w2 = count(&t, &w, later, true).expect("a cancel passes");
        assert_eq!(w2.locked_until, w.locked_until, "the lockout is kept");
        assert_eq!(t.estimate(&w2, later), 1.0);
        // After it: an order passes.
        assert!(count(&t, &w2, now + 30_000, false).is_some());
    }

    /// Cancels always pass and count: a window full of cancels refuses the next order.
    #[test]
    fn cancels_pass_and_count() {
        let t = throttle(3, 3, 0);
        let mut w = empty();
        for _ in 0..10 {
            w = count(&t, &w, T0, true).expect("a cancel passes");
        }
        assert_eq!(w.count, 10);
        let Gate::Refuse(r) = t.gate(&w, T0, false) else {
            panic!("refused")
        };
        // No lockout in this policy: the window's own room. Ten in the previous bucket fall
        // below three once 70% of it has slid out: 2.1 s into the next bucket.
        assert_eq!((r.starts_lockout, r.locked_until), (None, None));
        assert_eq!(r.retry_at, T0 + 3_000 + 2_101);
        // A lockout shorter than the window's room: Retry-After is the room.
        let Gate::Refuse(r) = throttle(3, 3, 1).gate(&w, T0, false) else {
            panic!("refused")
        };
        assert_eq!(
            (r.starts_lockout, r.retry_at),
            (Some(T0 + 1_000), T0 + 5_101)
        );
    }

    /// Concurrent orders that read the same window: the first commit's update makes the
    /// others' conditions fail once the cap is reached (they read and decide again).
    #[test]
    fn racing_updates_pass_only_up_to_the_cap() {
        let t = throttle(5, 3, 30);
        let read = MessageWindow {
            bucket: T0,
            count: 3,
            ..empty()
        };
        let updates: Vec<MessageUpdate> = (0..8)
            .map(|_| match t.gate(&read, T0 + 5, false) {
                Gate::Pass(u) => u,
                Gate::Refuse(_) => panic!("room at the read"),
            })
            .collect();
        let mut stored = read.clone();
        let mut passed = 0;
        for u in &updates {
            if u.allowed_by(&stored) {
                stored = u.applied_to(&stored);
                passed += 1;
            }
        }
        assert_eq!(passed, 2, "5 - 3");
        // A roll-over read from an older bucket passes once; the others find it moved.
        let old = MessageWindow {
            bucket: T0 - 3_000,
            count: 5,
            ..empty()
        };
        let u = match t.gate(&old, T0 + 2_999, false) {
            Gate::Pass(u) => u,
            Gate::Refuse(_) => panic!("the old bucket has slid out"),
        };
        assert!(!u.is_increment());
        let rolled = u.applied_to(&old);
        assert_eq!((rolled.bucket, rolled.count, rolled.previous), (T0, 1, 5));
        assert!(!u.allowed_by(&rolled));
        // A lockout stored after the read fails an order's condition, never a cancel's.
        let locked = MessageWindow {
            locked_until: T0 + 30_000,
            ..read.clone()
        };
        assert!(!updates[0].allowed_by(&locked));
        let Gate::Pass(cancel) = t.gate(&read, T0 + 5, true) else {
            panic!("a cancel passes")
        };
        assert!(cancel.allowed_by(&locked));
    }

    #[test]
    fn window_ids_are_never_an_operators() {
        assert!(crate::core::usecases::parse_requested_by(&window_id("ACC-1")).is_err());
    }
}
