//! The in-process consumer `airlock serve` runs for each queue: receive a batch, handle its
//! messages (one group's in order, different groups at the same time, receiving again for
//! other groups while a group is still being handled), delete each when
//! handled, beside the next one's handling (a refused message too: it is not the stored
//! action's), release it for a later
//! retry when not (after the queue's maximum receives it goes to the dead-letter queue, and
//! the last attempt settles its action). Lambdas get their batches from SQS instead (`functions/worker-*`).
//!
//! An empty queue is not polled in a tight loop: the embedded queue signals each send made
//! in this process, so the consumer wakes at once, and polls every `poll_ms` only for what
//! no send announces; SQS long-polls inside `receive`.
//!
//! No message can stop the consumer: a panic while handling one fails that message only
//! (`worker::handle` catches it), and the loop itself runs supervised ([`run`]): should it
//! ever end or panic, it is logged and started again.

use std::time::Duration;

use std::sync::Arc;

use super::Worker;
use crate::core::domain::QueueTarget;
use crate::core::ports::{Delivery, Queue};

/// Receives before dead-lettering: the queues' redrive policy.
pub use crate::core::records::MAX_RECEIVES;

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

/// A consumer loop's parts: the worker, and the queue it receives from and settles with.
#[derive(Clone)]
pub struct Consumer {
    pub worker: Arc<Worker>,
    pub queue: Arc<dyn Queue>,
}

/// Handles one delivery; a failed one is released for a later retry. `true` if it was
/// handled: the caller deletes it ([`run_chain`], beside the next message's handling).
pub async fn handle(
    st: &Consumer,
    queue: QueueTarget,
    d: &Delivery,
    opts: ConsumerOptions,
) -> bool {
    let last = d.receive_count >= MAX_RECEIVES;
    match st.worker.handle(&d.body, last).await {
        Ok(_) => {
            if crate::failpoint::hit("worker.before_ack") {
                // Test-only: the process dies after handling a message, before deleting it.
                tracing::error!("failpoint worker.before_ack: aborting");
                std::process::abort();
            }
            true
        }
        Err(_) => {
            let delay = opts.retry_ms.saturating_mul(d.receive_count as u64);
            if let Err(e) = st.queue.release(queue, &d.receipt, delay).await {
                tracing::error!(error = %e, "could not release a failed message");
            }
            false
        }
    }
}

/// Deletes a handled message.
async fn ack(st: &Consumer, queue: QueueTarget, receipt: &str) {
    if let Err(e) = st.queue.ack(queue, receipt).await {
        tracing::error!(error = %e, "could not delete a handled message; it will be redelivered");
    }
}

/// Splits a batch into chains, one per message group, each in the batch's order. Messages
/// without a group are chains of their own.
pub fn in_group_order(batch: Vec<Delivery>) -> Vec<Vec<Delivery>> {
    let mut chains: Vec<Vec<Delivery>> = Vec::new();
    let mut by_group: std::collections::HashMap<String, usize> = Default::default();
    for d in batch {
        match d.group.clone() {
            Some(g) => match by_group.get(&g) {
                Some(&i) => chains[i].push(d),
                None => {
                    by_group.insert(g, chains.len());
                    chains.push(vec![d]);
                }
            },
            None => chains.push(vec![d]),
        }
    }
    chains
}

/// Runs forever: the worker loop of one queue, supervised. The loop runs in its own task;
/// if that task ever ends (it should not) or panics, the error is logged and the loop is
/// started again after a second, so one bad moment never leaves a queue unconsumed.
pub async fn run(st: Consumer, queue: QueueTarget, opts: ConsumerOptions) {
    let mut restarts: u64 = 0;
    loop {
        let ended = tokio::spawn(consume(st.clone(), queue, opts)).await;
        restarts += 1;
        match ended {
            Err(e) if e.is_panic() => {
                tracing::error!(queue = %queue, restarts, error = %e, "the consumer panicked; restarting it")
            }
            Err(e) => {
                tracing::error!(queue = %queue, restarts, error = %e, "the consumer was stopped; restarting it")
            }
            Ok(()) => {
                tracing::error!(queue = %queue, restarts, "the consumer ended; restarting it")
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The most message groups one consumer handles at once.
pub const MAX_CHAINS: usize = 16;

/// The worker loop of one queue, forever: receive, and handle each message group's chain in
/// a task of its own, receiving again as soon as there is room, without waiting for the
/// batch's slowest group. The queue hands out nothing of a group that has a message in
/// flight (SQS FIFO does the same), so a group's next messages come only after its chain
/// has settled the ones before them, and two chains of one group never run at once.
async fn consume(st: Consumer, queue: QueueTarget, opts: ConsumerOptions) {
    let sent = st.queue.send_signal(queue);
    let mut running = tokio::task::JoinSet::new();
    loop {
        while let Some(ended) = running.try_join_next() {
            log_chain_end(queue, ended);
        }
        let mut received = false;
        if running.len() < MAX_CHAINS {
            match st.queue.receive(queue, 10, opts.visibility_ms).await {
                Ok(batch) => {
                    received = !batch.is_empty();
                    // One chain per message group, in the batch's order.
                    for chain in in_group_order(batch) {
                        running.spawn(run_chain(st.clone(), queue, chain, opts));
                    }
                }
                Err(e) => {
                    tracing::error!(queue = %queue, error = %e, "receive failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        if received && running.len() < MAX_CHAINS {
            // More may be waiting in other groups.
            continue;
        }
        // Nothing to receive now, or no room: wait for a chain to end (its group may have
        // more), for a send, or for the poll interval.
        let pause = match &sent {
            Some(_) => Duration::from_millis(opts.poll_ms),
            None => Duration::from_millis(opts.idle_ms),
        };
        let news = async {
            match &sent {
                Some(sent) => sent.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(ended) = running.join_next() => log_chain_end(queue, ended),
            _ = news, if running.len() < MAX_CHAINS => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Handles one group's messages in order; after a failure the rest wait for it. A
/// handled message is deleted while the next one is handled (its action is settled
/// already, so the next one's handling does not depend on the delete; a delete that is
/// lost only brings the message back, and its worker acknowledges it as done). The chain
/// ends once its deletes have.
async fn run_chain(st: Consumer, queue: QueueTarget, chain: Vec<Delivery>, opts: ConsumerOptions) {
    let mut acks = tokio::task::JoinSet::new();
    let mut rest = chain.iter();
    for d in rest.by_ref() {
        if !handle(&st, queue, d, opts).await {
            break;
        }
        let (st, receipt) = (st.clone(), d.receipt.clone());
        acks.spawn(async move { ack(&st, queue, &receipt).await });
    }
    // A message of the group failed: its later ones wait for it (unhandled, visible again
    // at once; the failed one comes first when it is due).
    for d in rest {
        st.worker.skipped(&d.body, d.receive_count).await;
        if let Err(e) = st.queue.release(queue, &d.receipt, 0).await {
            tracing::error!(error = %e, "could not release a message");
        }
    }
    while let Some(ended) = acks.join_next().await {
        log_chain_end(queue, ended);
    }
}

/// A chain's task cannot fail (handling catches panics); should it, its messages are
/// retried when their visibility runs out.
fn log_chain_end(queue: QueueTarget, ended: Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended {
        tracing::error!(queue = %queue, error = %e, "a message group's chain ended abnormally");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(receipt: &str, group: Option<&str>) -> Delivery {
        Delivery {
            receipt: receipt.into(),
            body: String::new(),
            receive_count: 1,
            group: group.map(String::from),
        }
    }

    #[test]
    fn chains_keep_each_groups_order() {
        let chains = in_group_order(vec![
            d("1", Some("ACC-1")),
            d("2", Some("ACC-2")),
            d("3", Some("ACC-1")),
            d("4", None),
            d("5", Some("ACC-2")),
            d("6", None),
        ]);
        let ids: Vec<Vec<&str>> = chains
            .iter()
            .map(|c| c.iter().map(|d| d.receipt.as_str()).collect())
            .collect();
        assert_eq!(ids, [vec!["1", "3"], vec!["2", "5"], vec!["4"], vec!["6"]]);
    }
}
