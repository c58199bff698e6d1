//! What bounds one operator's load, besides what execute decides in its atomic step: the
//! rate windows (execute's is counted by its commit, the plan rate here, with the same
//! window and refusal), the `execute_plan` calls held while a plan waits for its approval,
//! the once-only audit of a refusal asked again and again, and the firm-wide pace of
//! MCP's `execute_plan` calls ([`Pace`]). Kept in the limits store
//! ([`LimitStore`]), so every bound holds across processes and Lambda instances.
//!
//! The store's ids: an operator's executes are kept under the operator id itself (execute's
//! commit); everything else under a kind, a unit separator (U+001F) and the rest, which no
//! operator id can be (they hold no control characters: `requested_by`).

use std::sync::Arc;

use crate::core::clock::SharedClock;
use crate::core::domain::{new_id, Millis};
use crate::core::error::{ApiError, Code};
use crate::core::ports::limits::{Hold, Holds, LimitStore, PaceStep};
use crate::core::records::{RateState, RATE_WINDOW_MS};

/// `airlock_audit_repeats_total{code}`: refusals left out of the audit log because the
/// same refusal (plan, service, operator, idempotency key) was audited already.
pub const AUDIT_REPEATS: &str = "airlock_audit_repeats_total";

/// Rounds of read-and-write before a limit gives up under contention.
const ROUNDS: usize = 8;

/// The plan rate window of an operator.
pub fn plan_rate_id(operator: &str) -> String {
    format!("plan\u{1f}{operator}")
}

/// The firm-wide pace of `execute_plan` calls through MCP.
pub const MCP_EXECUTE_PACE_ID: &str = "pace\u{1f}mcp_execute_plan";

/// An operator's held `execute_plan` calls.
pub fn holds_id(operator: &str) -> String {
    format!("hold\u{1f}{operator}")
}

/// The mark of a refusal audited once per plan and idempotency key (`scope`: the key's
/// scope, service and operator), hashed to a short key whatever the key's length.
pub fn refusal_mark_id(code: Code, scope: &str, key: &str, plan_id: &str) -> String {
    let h = super::sha256_hex(format!("{scope}\u{0}{key}\u{0}{plan_id}").as_bytes());
    format!("{}\u{1f}{h}", code.as_str())
}

/// 429 `rate_limited` when the window already holds `limit` in the last minute (the
/// sliding estimate of [`RateState::estimate`]); `Retry-After` is when the estimate falls
/// below the limit, at most the rest of the minute. `what`: `executes`, `plans`; `how`: the
/// end of the sentence that says how to retry.
pub fn rate_refusal(
    rate: &RateState,
    now: Millis,
    limit: u32,
    operator: &str,
    what: &str,
    how: &str,
) -> Option<ApiError> {
    if rate.estimate(now) < limit as f64 {
        return None;
    }
    let into = now - RateState::bucket_of(now);
    let wait = ((RATE_WINDOW_MS - into).max(1000) as u64).div_ceil(1000);
    Some(
        ApiError::new(
            Code::RateLimited,
            format!(
                "Operator {operator} reached {limit} {what} per minute; retry in {wait} s{how}."
            ),
        )
        .retry_after(wait),
    )
}

/// The plan rate of one process: per operator, `limit` stored plans in a sliding minute.
#[derive(Clone)]
pub struct PlanRate {
    pub store: Arc<dyn LimitStore>,
    pub limit: u32,
    pub clock: SharedClock,
}

impl PlanRate {
    /// The operator's window, read before a plan is evaluated: a full window refuses the
    /// plan at once ([`PlanRate::refusal`]).
    pub async fn window(&self, operator: &str) -> Result<RateState, ApiError> {
        Ok(self.store.rate(&plan_rate_id(operator)).await?)
    }

    pub fn refusal(&self, rate: &RateState, operator: &str) -> Option<ApiError> {
        rate_refusal(rate, self.clock.now_ms(), self.limit, operator, "plans", "")
            .map(ApiError::not_an_execute)
    }

    /// Counts one plan in the window read before (`rate`), re-read when another plan counted
    /// first: as execute's commit does, only below the limit, so concurrent plans cannot
    /// pass it. Refused (429) when the window is full by then.
    pub async fn count(&self, operator: &str, mut rate: RateState) -> Result<(), ApiError> {
        for _ in 0..ROUNDS {
            if let Some(e) = self.refusal(&rate, operator) {
                return Err(e);
            }
            if self
                .store
                .count_rate(&rate.next(self.clock.now_ms(), self.limit))
                .await?
            {
                return Ok(());
            }
            rate = self.window(operator).await?;
        }
        Err(ApiError::unavailable(
            "plan rate: too many conflicting concurrent writes",
        ))
    }
}

/// A firm-wide pace: at most `burst` calls at once and `per_second` a second after that,
/// the token bucket API Gateway throttles a route with, kept in the store ([`PaceStep`])
/// so it holds across processes and Lambda instances. MCP's `execute_plan` is paced so:
/// API Gateway cannot throttle one tool of the MCP route.
#[derive(Clone)]
pub struct Pace {
    pub store: Arc<dyn LimitStore>,
    pub id: &'static str,
    /// Steady calls a second (more than 0).
    pub per_second: f64,
    /// Calls at once (at least 1).
    pub burst: u32,
    pub clock: SharedClock,
    /// What is paced, for the refusal's message.
    pub what: &'static str,
}

/// The step of a call at `now` under `per_second` and `burst`: the rate's spacing in whole
/// milliseconds (rounded up, never faster than the rate) and the burst's tolerance.
pub fn pace_step(per_second: f64, burst: u32, now: Millis) -> PaceStep {
    let interval = (1000.0 / per_second).ceil().clamp(1.0, 86_400_000.0) as Millis;
    PaceStep {
        now,
        interval,
        tolerance: interval * (burst.max(1) as Millis - 1),
    }
}

impl Pace {
    /// Admits one call, or refuses it with 429 `rate_limited` and `Retry-After` (whole
    /// seconds until the pace admits one again, at least 1). Nothing else is written.
    pub async fn admit(&self) -> Result<(), ApiError> {
        let step = pace_step(self.per_second, self.burst, self.clock.now_ms());
        let Some(due) = self.store.pace(self.id, &step).await? else {
            return Ok(());
        };
        let wait = ((due - step.tolerance - step.now).max(1) as u64).div_ceil(1000);
        Err(ApiError::new(
            Code::RateLimited,
            format!(
                "{} reached its firm-wide {} a second (burst {}); retry in {wait} s.",
                self.what, self.per_second, self.burst
            ),
        )
        .retry_after(wait)
        .not_an_execute())
    }
}

/// The `execute_plan` calls held while their plan waits for its operator's approval: at
/// most one per plan and `per_operator` per operator at a time, counted in the store.
#[derive(Clone)]
pub struct ApprovalHolds {
    pub store: Arc<dyn LimitStore>,
    pub per_operator: u32,
    pub clock: SharedClock,
}

/// A hold taken: release it when the call ends before `until`.
#[derive(Debug, Clone)]
pub struct Held {
    id: String,
    owner: String,
}

impl ApprovalHolds {
    /// Takes a hold of `plan_id` for `operator` until `until` (the clock's milliseconds).
    /// `None`: another call holds this plan, the operator's holds are all taken, or the
    /// operator's record kept changing under us; the caller answers at once.
    pub async fn take(
        &self,
        operator: &str,
        plan_id: &str,
        until: Millis,
    ) -> Result<Option<Held>, ApiError> {
        if self.per_operator == 0 {
            return Ok(None);
        }
        let id = holds_id(operator);
        for _ in 0..ROUNDS {
            let now = self.clock.now_ms();
            let stored = self.store.holds(&id).await?;
            let live: Vec<Hold> = stored.live(now).cloned().collect();
            if live.iter().any(|h| h.plan_id == plan_id) || live.len() >= self.per_operator as usize
            {
                return Ok(None);
            }
            let owner = new_id("hld", now);
            let mut next = Holds {
                version: stored.version + 1,
                held: live,
            };
            next.held.push(Hold {
                plan_id: plan_id.to_string(),
                owner: owner.clone(),
                until,
            });
            if self.store.put_holds(&id, &next, stored.version).await? {
                return Ok(Some(Held { id, owner }));
            }
        }
        Ok(None)
    }

    /// Ends a hold before its time (the plan was decided). A hold not released ends at its
    /// `until` anyway.
    pub async fn release(&self, held: &Held) -> Result<(), ApiError> {
        for _ in 0..ROUNDS {
            let now = self.clock.now_ms();
            let stored = self.store.holds(&held.id).await?;
            if !stored.live(now).any(|h| h.owner == held.owner) {
                return Ok(());
            }
            let next = Holds {
                version: stored.version + 1,
                held: stored
                    .live(now)
                    .filter(|h| h.owner != held.owner)
                    .cloned()
                    .collect(),
            };
            if self
                .store
                .put_holds(&held.id, &next, stored.version)
                .await?
            {
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_other_limits_are_never_an_operators() {
        for id in [
            MCP_EXECUTE_PACE_ID.to_string(),
            plan_rate_id("op-1"),
            holds_id("op-1"),
            refusal_mark_id(Code::ApprovalRequired, "6:svc/op-1", "k", "pln_1"),
        ] {
            assert!(
                crate::core::usecases::parse_requested_by(&id).is_err(),
                "{id:?}"
            );
        }
        assert_ne!(
            refusal_mark_id(Code::ApprovalRequired, "s", "k1", "p"),
            refusal_mark_id(Code::ApprovalRequired, "s", "k", "1p")
        );
    }

    /// The pace is API Gateway's token bucket: `burst` at once, then one per interval; a
    /// quiet spell fills the burst again, never beyond it.
    #[test]
    fn a_pace_admits_the_burst_then_the_rate() {
        struct P(f64, u32);
        impl P {
            fn step(&self, now: Millis) -> PaceStep {
                pace_step(self.0, self.1, now)
            }
        }
        let pace = |per_second: f64, burst: u32| P(per_second, burst);
        let t0 = 1_800_000_000_000;
        let run = |p: &P, at: &[Millis]| -> Vec<bool> {
            let mut due = 0;
            at.iter()
                .map(|&now| {
                    let step = p.step(now);
                    let ok = step.admits(due);
                    if ok {
                        due = step.next(due);
                    }
                    ok
                })
                .collect()
        };
        let p = pace(5.0, 10);
        assert_eq!(p.step(t0).interval, 200);
        // Eleven at once: ten pass.
        let burst = run(&p, &[t0; 11]);
        assert_eq!(burst.iter().filter(|b| **b).count(), 10);
        assert!(!burst[10]);
        // A call every 100 ms for two seconds, after the burst: five a second pass.
        let mut at = vec![t0; 10];
        at.extend((1..=20).map(|i| t0 + i * 100));
        let admitted = run(&p, &at).iter().filter(|b| **b).count();
        assert_eq!(admitted, 10 + 10, "{admitted}");
        // After a quiet minute, the burst again and no more.
        let mut at = vec![t0; 3];
        at.extend([t0 + 60_000; 11]);
        assert_eq!(run(&p, &at).iter().filter(|b| **b).count(), 3 + 10);
        // A burst of one is the rate alone; a rate below one a second spaces calls out.
        let p = pace(2.0, 1);
        assert_eq!(run(&p, &[t0, t0 + 100, t0 + 500]), [true, false, true]);
        assert_eq!(pace(0.5, 1).step(t0).interval, 2_000);
        assert_eq!(pace(3.0, 2).step(t0).tolerance, 334);
    }

    #[test]
    fn a_full_window_refuses_until_the_estimate_falls() {
        let t0 = 1_800_000_000_000 - 1_800_000_000_000 % RATE_WINDOW_MS;
        let rate = RateState {
            operator_id: plan_rate_id("op"),
            bucket: t0,
            count: 3,
            previous: 0,
        };
        assert!(rate_refusal(&rate, t0 + 1_000, 4, "op", "plans", "").is_none());
        let e = rate_refusal(&rate, t0 + 1_000, 3, "op", "plans", ".").expect("refused");
        assert_eq!(e.code, Code::RateLimited);
        assert_eq!(e.retry_after, Some(59));
        assert!(e.message.contains("3 plans per minute"), "{}", e.message);
    }
}
