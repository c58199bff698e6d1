//! A request's time on Lambda: the invocation's deadline as `lambda_http` hands it over,
//! and how long a wait (`?wait=`, MCP's approval hold and `get_action`) may last inside it.

use std::time::Duration;

/// The wall clock, in milliseconds since the epoch: the clock of a Lambda's deadline.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// On Lambda, when the invocation must have answered (`lambda_http` leaves the runtime's
/// context in the request's extensions): milliseconds since the epoch.
pub fn lambda_deadline_ms(extensions: &axum::http::Extensions) -> Option<u64> {
    extensions
        .get::<lambda_http::Context>()
        .map(|c| c.deadline)
        .filter(|d| *d > 0)
}

/// How long a wait may last: `wait`, cut on Lambda so that it ends `reserve` before the
/// invocation's deadline (what comes after it then fits before the function times out).
/// Zero: no time to wait.
pub fn within_deadline(
    wait: Duration,
    deadline_ms: Option<u64>,
    now_ms: u64,
    reserve: Duration,
) -> Duration {
    match deadline_ms {
        None => wait,
        Some(d) => {
            wait.min(Duration::from_millis(d.saturating_sub(now_ms)).saturating_sub(reserve))
        }
    }
}

/// What a `wait` keeps of its invocation: its first read (before the wait starts) and its
/// last, each bounded by the operation timeout.
pub fn wait_reserve(operation_timeout_ms: u64) -> Duration {
    Duration::from_millis(2 * operation_timeout_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_in_time_for_the_lambda_to_answer() {
        let s = Duration::from_secs;
        let reserve = wait_reserve(2_000);
        assert_eq!(reserve, s(4));
        // Outside Lambda: the wait asked for.
        assert_eq!(within_deadline(s(20), None, 1_000, reserve), s(20));
        // 10 s left: the wait ends 4 s before the deadline.
        assert_eq!(within_deadline(s(20), Some(11_000), 1_000, reserve), s(6));
        assert_eq!(within_deadline(s(5), Some(28_000), 1_000, reserve), s(5));
        // Less left than the reserve, or a deadline already past: no wait.
        assert_eq!(within_deadline(s(20), Some(4_000), 1_000, reserve), s(0));
        assert_eq!(within_deadline(s(20), Some(500), 1_000, reserve), s(0));
    }
}
