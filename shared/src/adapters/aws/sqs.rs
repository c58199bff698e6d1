//! The queues on SQS: `worker:orders` is FIFO (message group = account, deduplication id =
//! action id), `worker:jobs` is a standard queue (workers are idempotent on action id).

use async_trait::async_trait;

use super::{unavailable, Aws};
use crate::domain::QueueTarget;
use crate::error::{StoreError, StoreResult};
use crate::ports::{Queue, QueueDepth};
use crate::records::QueueMessage;

#[async_trait]
impl Queue for Aws {
    async fn send(&self, msg: &QueueMessage, group: &str, dedup_id: &str) -> StoreResult<()> {
        let body = serde_json::to_string(msg).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let req = match msg.action_type.queue_target() {
            QueueTarget::Orders => self
                .sqs
                .send_message()
                .queue_url(&self.names.orders_queue_url)
                .message_group_id(group)
                .message_deduplication_id(dedup_id),
            QueueTarget::Jobs => self
                .sqs
                .send_message()
                .queue_url(&self.names.jobs_queue_url),
        };
        req.message_body(body)
            .send()
            .await
            .map_err(|e| unavailable("SendMessage", &e))?;
        Ok(())
    }

    async fn depth(&self) -> StoreResult<Vec<QueueDepth>> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let mut out = Vec::new();
        for (queue, url) in [
            (QueueTarget::Orders, &self.names.orders_queue_url),
            (QueueTarget::Jobs, &self.names.jobs_queue_url),
        ] {
            let o = self
                .sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(A::ApproximateNumberOfMessages)
                .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
                .send()
                .await
                .map_err(|e| unavailable("GetQueueAttributes", &e))?;
            let get = |a: A| {
                o.attributes()
                    .and_then(|m| m.get(&a))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            out.push(QueueDepth {
                queue,
                waiting: get(A::ApproximateNumberOfMessages),
                in_flight: get(A::ApproximateNumberOfMessagesNotVisible),
            });
        }
        Ok(out)
    }
}
