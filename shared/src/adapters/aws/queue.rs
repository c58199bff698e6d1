//! The queues on SQS: FIFO orders (grouped by account, deduplicated by action id) and
//! standard jobs; the orders and jobs queue URLs come from the configuration.

use super::{unavailable, Aws};
use crate::core::domain::QueueTarget;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::{Delivery, Queue, QueueDepth};
use crate::core::records::QueueMessage;
use async_trait::async_trait;

impl Aws {
    /// A queue's approximate messages: (waiting, received and not yet deleted).
    async fn counts(&self, url: &str) -> StoreResult<(i64, i64)> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let o = self
            .sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| unavailable("GetQueueAttributes", &e))?;
        let get = |a: A| -> i64 {
            o.attributes()
                .and_then(|m| m.get(&a))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok((
            get(A::ApproximateNumberOfMessages),
            get(A::ApproximateNumberOfMessagesNotVisible),
        ))
    }

    pub(super) fn url(&self, queue: QueueTarget) -> &str {
        match queue {
            QueueTarget::Orders => &self.names.orders_queue_url,
            QueueTarget::Jobs => &self.names.jobs_queue_url,
        }
    }

    fn shape(queue: QueueTarget) -> super::shapes::QueueShape {
        match queue {
            QueueTarget::Orders => super::shapes::ORDERS_QUEUE,
            QueueTarget::Jobs => super::shapes::JOBS_QUEUE,
        }
    }

    /// The URL of `queue`'s dead-letter queue (the target of its redrive policy): as the
    /// configuration gives it, else by name.
    async fn dead_letter_url(&self, queue: QueueTarget) -> StoreResult<String> {
        let given = match queue {
            QueueTarget::Orders => &self.names.orders_dead_letter_url,
            QueueTarget::Jobs => &self.names.jobs_dead_letter_url,
        };
        if let Some(url) = given {
            return Ok(url.clone());
        }
        let name = format!(
            "{}{}",
            self.names.dead_letter_prefix,
            Self::shape(queue).dead_letter_name
        );
        let o = self
            .sqs
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .map_err(|e| unavailable("GetQueueUrl dead-letter queue", &e))?;
        Ok(o.queue_url().unwrap_or_default().to_string())
    }

    /// Up to 10 messages of `url`, hidden for `hide_ms`, with their group and receive count.
    async fn receive_from(
        &self,
        url: &str,
        max: u32,
        hide_ms: u64,
    ) -> StoreResult<Vec<aws_sdk_sqs::types::Message>> {
        use aws_sdk_sqs::types::MessageSystemAttributeName as A;
        let o = self
            .sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .visibility_timeout(hide_ms.div_ceil(1000).clamp(1, 43_200) as i32)
            .wait_time_seconds(0)
            .message_system_attribute_names(A::ApproximateReceiveCount)
            .message_system_attribute_names(A::MessageGroupId)
            .send()
            .await
            .map_err(|e| unavailable("ReceiveMessage dead-letter queue", &e))?;
        Ok(o.messages.unwrap_or_default())
    }
}

/// A received message as a delivery (`None` without a receipt or body).
fn delivery(m: &aws_sdk_sqs::types::Message) -> Option<Delivery> {
    use aws_sdk_sqs::types::MessageSystemAttributeName as A;
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
        Ok(o.messages().iter().filter_map(delivery).collect())
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

    async fn dead_letters(
        &self,
        queue: QueueTarget,
        max: u32,
        hide_ms: u64,
    ) -> StoreResult<Vec<Delivery>> {
        let url = self.dead_letter_url(queue).await?;
        let mut out = Vec::new();
        while out.len() < max as usize {
            let got = self
                .receive_from(&url, max - out.len() as u32, hide_ms)
                .await?;
            if got.is_empty() {
                break;
            }
            // Received here, a dead letter's count includes these looks: the receives of
            // its source queue are the redrive policy's.
            out.extend(got.iter().filter_map(delivery).map(|d| Delivery {
                receive_count: d.receive_count.min(crate::core::records::MAX_RECEIVES),
                ..d
            }));
        }
        Ok(out)
    }

    async fn redrive(&self, queue: QueueTarget, max: u32) -> StoreResult<usize> {
        let url = self.dead_letter_url(queue).await?;
        let mut moved = 0;
        while moved < max as usize {
            let got = self.receive_from(&url, max - moved as u32, 30_000).await?;
            if got.is_empty() {
                break;
            }
            for m in &got {
                let Some(d) = delivery(m) else { continue };
                let send = self
                    .sqs
                    .send_message()
                    .queue_url(self.url(queue))
                    .message_body(d.body.clone());
                // A FIFO queue would drop a resend within 5 minutes of the original under
                // the same deduplication id: a new one per dead letter, the same group.
                let send = match (queue, &d.group) {
                    (QueueTarget::Orders, Some(g)) => {
                        send.message_group_id(g).message_deduplication_id(format!(
                            "redrive-{}",
                            m.message_id().unwrap_or_default()
                        ))
                    }
                    _ => send,
                };
                send.send()
                    .await
                    .map_err(|e| unavailable("SendMessage redrive", &e))?;
                self.sqs
                    .delete_message()
                    .queue_url(&url)
                    .receipt_handle(&d.receipt)
                    .send()
                    .await
                    .map_err(|e| unavailable("DeleteMessage dead letter", &e))?;
                moved += 1;
            }
        }
        Ok(moved)
    }

    async fn backlog(&self, queue: QueueTarget) -> StoreResult<u64> {
        let (waiting, in_flight) = self.counts(self.url(queue)).await?;
        Ok((waiting + in_flight).max(0) as u64)
    }

    fn backlog_poll(&self) -> std::time::Duration {
        // A GetQueueAttributes call each time: a few a second per held execute at most.
        std::time::Duration::from_millis(250)
    }

    async fn depth(&self) -> StoreResult<Vec<QueueDepth>> {
        let mut out = Vec::new();
        for queue in [QueueTarget::Orders, QueueTarget::Jobs] {
            let (waiting, in_flight) = self.counts(self.url(queue)).await?;
            let shape = Self::shape(queue);
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
                // Those the dead-letter sweep is looking at are dead letters too.
                Ok(u) => {
                    let (w, f) = self.counts(u.queue_url().unwrap_or_default()).await?;
                    w + f
                }
                Err(_) => 0,
            };
            out.push(QueueDepth {
                queue,
                waiting,
                in_flight,
                dead_letters: dead,
                oldest_sent_at: None,
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
