//! The queues on SQS: FIFO orders (grouped by account, deduplicated by action id) and
//! standard jobs; the orders and jobs queue URLs come from the configuration.

use super::{unavailable, Aws};
use crate::domain::QueueTarget;
use crate::error::{StoreError, StoreResult};
use crate::ports::{Delivery, Queue, QueueDepth};
use crate::records::QueueMessage;
use async_trait::async_trait;

impl Aws {
    pub(super) fn url(&self, queue: QueueTarget) -> &str {
        match queue {
            QueueTarget::Orders => &self.names.orders_queue_url,
            QueueTarget::Jobs => &self.names.jobs_queue_url,
        }
    }
}

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

    async fn receive(
        &self,
        queue: QueueTarget,
        max: u32,
        visibility_ms: u64,
    ) -> StoreResult<Vec<Delivery>> {
        use aws_sdk_sqs::types::MessageSystemAttributeName as A;
        let o = self
            .sqs
            .receive_message()
            .queue_url(self.url(queue))
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .visibility_timeout(visibility_ms.div_ceil(1000).max(1) as i32)
            .wait_time_seconds(self.names.receive_wait_s as i32)
            .message_system_attribute_names(A::ApproximateReceiveCount)
            .message_system_attribute_names(A::MessageGroupId)
            .customize()
            .config_override(
                aws_sdk_sqs::config::Builder::default()
                    .timeout_config(receive_timeouts(self.names.receive_wait_s)),
            )
            .send()
            .await
            .map_err(|e| unavailable("ReceiveMessage", &e))?;
        Ok(o.messages()
            .iter()
            .filter_map(|m| {
                Some(Delivery {
                    receipt: m.receipt_handle()?.to_string(),
                    body: m.body()?.to_string(),
                    receive_count: m
                        .attributes()
                        .and_then(|a| a.get(&A::ApproximateReceiveCount))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1),
                    group: m
                        .attributes()
                        .and_then(|a| a.get(&A::MessageGroupId))
                        .cloned(),
                })
            })
            .collect())
    }

    async fn ack(&self, queue: QueueTarget, receipt: &str) -> StoreResult<()> {
        self.sqs
            .delete_message()
            .queue_url(self.url(queue))
            .receipt_handle(receipt)
            .send()
            .await
            .map_err(|e| unavailable("DeleteMessage", &e))?;
        Ok(())
    }

    async fn release(&self, queue: QueueTarget, receipt: &str, delay_ms: u64) -> StoreResult<()> {
        // SQS itself moves the message to the dead-letter queue after maxReceiveCount.
        self.sqs
            .change_message_visibility()
            .queue_url(self.url(queue))
            .receipt_handle(receipt)
            .visibility_timeout(delay_ms.div_ceil(1000).min(43_200) as i32)
            .send()
            .await
            .map_err(|e| unavailable("ChangeMessageVisibility", &e))?;
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
            let shape = match queue {
                QueueTarget::Orders => crate::adapters::aws::shapes::ORDERS_QUEUE,
                QueueTarget::Jobs => crate::adapters::aws::shapes::JOBS_QUEUE,
            };
            let dead = match self
                .sqs
                .get_queue_url()
                .queue_name(format!(
                    "{}{}",
                    self.names.dead_letter_prefix, shape.dead_letter_name
                ))
                .send()
                .await
            {
                Ok(u) => {
                    let d = self
                        .sqs
                        .get_queue_attributes()
                        .queue_url(u.queue_url().unwrap_or_default())
                        .attribute_names(A::ApproximateNumberOfMessages)
                        .send()
                        .await
                        .map_err(|e| unavailable("GetQueueAttributes", &e))?;
                    d.attributes()
                        .and_then(|m| m.get(&A::ApproximateNumberOfMessages))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                }
                Err(_) => 0,
            };
            out.push(QueueDepth {
                queue,
                waiting: get(A::ApproximateNumberOfMessages),
                in_flight: get(A::ApproximateNumberOfMessagesNotVisible),
                dead_letters: dead,
            });
        }
        Ok(out)
    }
}

/// A long poll of `wait_s` outlasts the other calls' limits by its wait.
fn receive_timeouts(wait_s: u64) -> aws_sdk_sqs::config::timeout::TimeoutConfig {
    let wait = std::time::Duration::from_secs(wait_s);
    aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
        .operation_attempt_timeout(wait + std::time::Duration::from_secs(5))
        .operation_timeout(wait * 2 + std::time::Duration::from_secs(10))
        .build()
}
