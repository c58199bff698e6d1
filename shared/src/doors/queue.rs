//! SQS-triggered worker Lambdas: one span per record, and partial batch failures
//! (`ReportBatchItemFailures`), so only the failed messages come back. On the FIFO orders
//! queue, once a message of a group fails, the group's later messages in the batch are
//! reported failed unhandled, to keep each account's order.
//!
//! A panic while handling a record fails that record only (`worker::handle` catches it,
//! and this loop catches anything else per record), never the whole batch: the records
//! already handled are not handed back.
//!
//! A failed record (and each later record of its group, reported failed unhandled) is made
//! visible again after the consumer's retry delay times its receive count
//! (`ChangeMessageVisibility`), as the in-process consumer releases it: otherwise it would
//! wait out the queue's whole visibility timeout with its account's group blocked behind
//! it. A skipped record on its last receive is settled like a last attempt (`skipped`).
//!
//! The invocation's deadline: after the first record, a record is started only while at
//! least `margin_ms` (one record's worst case: [`MESSAGE_CALL_LIMITS`] operation timeouts)
//! is left before it; the rest are reported failed untouched, with no call made for them,
//! and come back after the queue's visibility timeout. A batch never runs into the
//! function's timeout, which would hand back every record, handled ones too, and raise the
//! receive count of all.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use tracing::Instrument;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};

use crate::core::domain::QueueTarget;
use crate::core::usecases::worker::consumer::{Consumer, MAX_RECEIVES};

/// The `worker-orders` and `worker-jobs` Lambdas' main: the app from the environment, then
/// every SQS batch of `queue` through [`handle_batch`] under the invocation's deadline.
pub async fn run_lambda(queue: QueueTarget, bin: &'static str) -> Result<(), lambda_http::Error> {
    use lambda_http::lambda_runtime::{run, service_fn, LambdaEvent};
    crate::telemetry::init();
    crate::metrics::init_lambda(bin);
    let app = crate::app::from_env().await?;
    let (consumer, retry_ms) = (app.consumer(), app.config.worker_retry_ms);
    let operation_timeout_ms = app.config.aws.operation_timeout_ms;
    let consumer = &consumer;
    run(service_fn(move |e: LambdaEvent<SqsEvent>| async move {
        let deadline = Deadline::of_invocation(e.context.deadline, operation_timeout_ms);
        Ok::<_, lambda_http::Error>(
            handle_batch(consumer, queue, retry_ms, e.payload, deadline).await,
        )
    }))
    .await
}

/// The AWS operation timeouts one record's worst case is taken to wait out (each call of
/// its handling bounded by `AIRLOCK_AWS_OPERATION_TIMEOUT_MS`, the slow ones stalling).
pub const MESSAGE_CALL_LIMITS: u64 = 5;

/// When an invocation must end, and how much time a record needs: both in milliseconds of
/// the wall clock (Lambda's `Context::deadline` is milliseconds since the epoch).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub at_ms: u64,
    pub margin_ms: u64,
}

impl Deadline {
    /// The invocation's deadline, with the margin of [`MESSAGE_CALL_LIMITS`] operation
    /// timeouts.
    pub fn of_invocation(deadline_ms: u64, operation_timeout_ms: u64) -> Deadline {
        Deadline {
            at_ms: deadline_ms,
            margin_ms: operation_timeout_ms.saturating_mul(MESSAGE_CALL_LIMITS),
        }
    }

    /// Whether a record may still be started at `now_ms`.
    fn leaves_room(&self, now_ms: u64) -> bool {
        self.at_ms.saturating_sub(now_ms) >= self.margin_ms
    }
}

fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Handles one SQS event of `queue`'s trigger; `retry_ms` is the consumer's retry delay
/// (`AIRLOCK_WORKER_RETRY_MS`), multiplied by each failed record's receive count. Records
/// after the first are started only while `deadline` leaves room for one.
pub async fn handle_batch(
    c: &Consumer,
    queue: QueueTarget,
    retry_ms: u64,
    event: SqsEvent,
    deadline: Deadline,
) -> SqsBatchResponse {
    let st = c.worker.as_ref();
    let mut response = SqsBatchResponse::default();
    let mut failed_groups: HashSet<String> = HashSet::new();
    let total = event.records.len();
    for (i, record) in event.records.into_iter().enumerate() {
        let id = record.message_id.clone().unwrap_or_default();
        if i > 0 && !deadline.leaves_room(wall_clock_ms()) {
            // Untouched: handed back as they came, no call made for them.
            tracing::warn!(
                left = total - i,
                margin_ms = deadline.margin_ms,
                "the invocation's deadline is near: the batch's remaining records are handed back"
            );
            let mut f = BatchItemFailure::default();
            f.item_identifier = id;
            response.batch_item_failures.push(f);
            continue;
        }
        let group = record.attributes.get("MessageGroupId").cloned();
        let receives: u32 = record
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let span = tracing::info_span!("record", message_id = %id, receive_count = receives);
        let failed = match &group {
            Some(g) if failed_groups.contains(g) => {
                let body = record.body.as_deref().unwrap_or("");
                let _ = AssertUnwindSafe(st.skipped(body, receives).instrument(span))
                    .catch_unwind()
                    .await;
                true
            }
            _ => {
                let body = record.body.as_deref().unwrap_or("");
                let handled = st.handle(body, receives >= MAX_RECEIVES);
                !matches!(
                    AssertUnwindSafe(handled.instrument(span.clone()))
                        .catch_unwind()
                        .await,
                    Ok(Ok(_))
                )
            }
        };
        if failed {
            if let Some(g) = group {
                failed_groups.insert(g);
            }
            if let Some(receipt) = record.receipt_handle.as_deref() {
                let delay = retry_ms.saturating_mul(u64::from(receives));
                if let Err(e) = c.queue.release(queue, receipt, delay).await {
                    // It comes back after the queue's visibility timeout instead.
                    tracing::warn!(message_id = %id, error = %e, "could not shorten a failed record's visibility");
                }
            }
            let mut f = BatchItemFailure::default();
            f.item_identifier = id;
            response.batch_item_failures.push(f);
        }
    }
    crate::metrics::flush_emf();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_starts_only_while_the_margin_is_left() {
        let d = Deadline::of_invocation(100_000, 2_000);
        assert_eq!(d.margin_ms, 10_000);
        assert!(d.leaves_room(85_000), "15 s left");
        assert!(d.leaves_room(90_000), "exactly the margin");
        assert!(!d.leaves_room(90_001));
        assert!(!d.leaves_room(200_000), "past the deadline");
    }
}
