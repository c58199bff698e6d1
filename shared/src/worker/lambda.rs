//! SQS-triggered worker Lambdas: one span per record, and partial batch failures
//! (`ReportBatchItemFailures`), so only the failed messages come back. On the FIFO orders
//! queue, once a message of a group fails, the group's later messages in the batch are
//! reported failed unhandled, to keep each account's order.
//!
//! A panic while handling a record fails that record only (`worker::handle` catches it,
//! and this loop catches anything else per record), never the whole batch: the records
//! already handled are not handed back.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use tracing::Instrument;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};

use super::consumer::MAX_RECEIVES;
use super::Worker;

pub async fn handle_batch(st: &Worker, event: SqsEvent) -> SqsBatchResponse {
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
            let mut f = BatchItemFailure::default();
            f.item_identifier = id;
            response.batch_item_failures.push(f);
        }
    }
    response
}
