//! The dead-letter sweep: a message whose last receive never finished (its worker crashed
//! or timed out, so the last attempt's own settlement never ran) reaches its dead-letter
//! queue with its action still `queued` or `processing`. The sweep settles such an action
//! exactly as a last attempt would (`give_up`: the action `failed` with the reason, its job
//! failed, an order submission's order recorded from the broker or rejected), and leaves
//! the dead letter where it is for operators; it looks at each again only after
//! [`LOOK_AGAIN_MS`] (each pass reads at most a hundred per queue). A dead letter whose
//! action is finished is left alone; one whose settlement failed (a read, a write, the
//! broker) keeps its action unsettled, so the next look settles it.
//!
//! `airlock queues redrive` moves dead letters back to their queue after a fix: the worker
//! finds a settled action finished and acknowledges it, so a failed trade is never
//! resurrected; an action the sweep had not settled yet runs once (its status and the
//! broker's client order id make it idempotent).

use tracing::Instrument;

use super::Worker;
use crate::core::domain::QueueTarget;
use crate::core::error::ApiError;
use crate::core::ports::Queue;

/// Dead letters looked at per queue and pass.
const PER_PASS: u32 = 100;
/// How long a dead letter the sweep looked at stays out of its sight. Short: on SQS a
/// dead letter being looked at is hidden from `airlock queues redrive` too.
pub const LOOK_AGAIN_MS: u64 = 5_000;

/// One pass over both dead-letter queues; returns how many dead letters it looked at. A
/// dead letter whose settlement fails is logged and left where it is (the next pass after
/// [`LOOK_AGAIN_MS`] tries again); the others are still settled, and the first error is
/// returned at the end, so the pass fails (on Lambda, the sweeper's error alarm).
pub async fn sweep(worker: &Worker, queue: &dyn Queue) -> Result<usize, ApiError> {
    let mut seen = 0;
    let mut first_error = None;
    for target in [QueueTarget::Orders, QueueTarget::Jobs] {
        for d in queue.dead_letters(target, PER_PASS, LOOK_AGAIN_MS).await? {
            seen += 1;
            let why = ApiError::unavailable(format!(
                "dead-lettered after {} receives: the last one never finished (the worker \
                 crashed or ran out of time)",
                d.receive_count
            ));
            let span = tracing::info_span!("dead_letter", queue = %target, receipt = %d.receipt);
            if let Err(e) = super::give_up(worker, &d.body, &why).instrument(span).await {
                tracing::error!(
                    queue = %target,
                    code = e.code.as_str(),
                    cause = e.cause.as_deref().unwrap_or(&e.message),
                    "settling a dead letter failed; the next pass tries again"
                );
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(seen),
    }
}
