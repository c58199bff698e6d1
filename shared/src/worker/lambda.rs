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

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use tracing::Instrument;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};

use super::consumer::{Consumer, MAX_RECEIVES};
use crate::domain::QueueTarget;

/// Handles one SQS event of `queue`'s trigger; `retry_ms` is the consumer's retry delay
/// (`AIRLOCK_WORKER_RETRY_MS`), multiplied by each failed record's receive count.
pub async fn handle_batch(
    c: &Consumer,
    queue: QueueTarget,
    retry_ms: u64,
    event: SqsEvent,
) -> SqsBatchResponse {
    let st = c.worker.as_ref();
    let mut response = SqsBatchResponse::default();
    let mut failed_groups: HashSet<String> = HashSet::new();
    for record in event.records {
        let id = record.message_id.clone().unwrap_or_default();
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
                let _ = AssertUnwindSafe(super::skipped(st, body, receives).instrument(span))
                    .catch_unwind()
                    .await;
                true
            }
            _ => {
                let body = record.body.as_deref().unwrap_or("");
                let handled = super::handle(st, body, receives >= MAX_RECEIVES);
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
