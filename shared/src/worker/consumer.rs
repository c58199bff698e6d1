//! The in-process consumer `airlock serve` runs for each queue: receive a batch, handle each
//! message, delete it when handled, release it for a later retry when not (after the
//! queue's maximum receives it goes to the dead-letter queue, and the last attempt marks
//! its action failed). Lambdas get their batches from SQS instead (`functions/worker-*`).
//!
//! An empty queue is not polled in a tight loop: the embedded queue signals each send made
//! in this process, so the consumer wakes at once, and polls every `poll_ms` only for what
//! no send announces; SQS long-polls inside `receive`.

use std::time::Duration;

use crate::app::AppState;
use crate::domain::QueueTarget;
use crate::ports::Delivery;

/// Receives before dead-lettering: the queues' redrive policy.
pub const MAX_RECEIVES: u32 = crate::adapters::aws::shapes::ORDERS_QUEUE.max_receive_count;

#[derive(Debug, Clone, Copy)]
pub struct ConsumerOptions {
    /// How long a received message stays hidden while it is handled.
    pub visibility_ms: u64,
    /// The retry delay after a failed attempt, multiplied by the attempt number.
    pub retry_ms: u64,
    /// The pause when the queue is empty and cannot signal a send (SQS, whose `receive`
    /// already long-polls).
    pub idle_ms: u64,
    /// The longest pause when the queue is empty and signals sends in this process (the
    /// embedded queue): the consumer wakes on a send at once, and otherwise polls this
    /// often for what no signal announces (retries coming due, expired visibility, sends
    /// from another process such as `airlock redeliver`).
    pub poll_ms: u64,
}

impl ConsumerOptions {
    pub fn from_config(c: &crate::config::Config) -> Self {
        ConsumerOptions {
            visibility_ms: c.worker_visibility_ms,
            retry_ms: c.worker_retry_ms,
            idle_ms: 50,
            poll_ms: 250,
        }
    }
}

/// Handles one delivery and settles it with the queue. `true` if it was handled.
pub async fn settle(
    st: &AppState,
    queue: QueueTarget,
    d: &Delivery,
    opts: ConsumerOptions,
) -> bool {
    let last = d.receive_count >= MAX_RECEIVES;
    match super::handle(st, &d.body, last).await {
        Ok(_) => {
            if let Err(e) = st.ports.queue.ack(queue, &d.receipt).await {
                tracing::error!(error = %e, "could not delete a handled message; it will be redelivered");
            }
            true
        }
        Err(_) => {
            let delay = opts.retry_ms.saturating_mul(d.receive_count as u64);
            if let Err(e) = st.ports.queue.release(queue, &d.receipt, delay).await {
                tracing::error!(error = %e, "could not release a failed message");
            }
            false
        }
    }
}

/// Runs forever: the worker loop of one queue.
pub async fn run(st: AppState, queue: QueueTarget, opts: ConsumerOptions) {
    let sent = st.ports.queue.send_signal(queue);
    loop {
        match st.ports.queue.receive(queue, 10, opts.visibility_ms).await {
            Ok(batch) if batch.is_empty() => match &sent {
                Some(sent) => {
                    let poll = Duration::from_millis(opts.poll_ms);
                    let _ = tokio::time::timeout(poll, sent.notified()).await;
                }
                None => tokio::time::sleep(Duration::from_millis(opts.idle_ms)).await,
            },
            Ok(batch) => {
                for d in &batch {
                    settle(&st, queue, d, opts).await;
                }
            }
            Err(e) => {
                tracing::error!(queue = %queue, error = %e, "receive failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
