//! A message's last attempt failed: its order is settled from what the broker knows, its
//! job failed, its action failed; reservations and flags released.

use super::*;

/// The last attempt failed (or its message is a dead letter): settle the stored action
/// (never one a mismatching message names) and its order or job, saying what is known. A
/// finished action is left alone. The action is settled last, after its order and job:
/// `Err` (a read or write failed, the broker could not be asked) leaves it unsettled, so the
/// dead-letter sweep, which looks at its dead letter again, does it all again.
pub(super) async fn give_up(st: &Worker, body: &str, e: &ApiError) -> Result<(), ApiError> {
    let Ok(received) = serde_json::from_str::<QueueMessage>(body) else {
        return Ok(()); // Malformed: it names nothing we can trust.
    };
    let action = match stored_action(st, &received).await? {
        Ok(a) => a,
        Err(why) => {
            refuse(&received.action_id, why);
            return Ok(());
        }
    };
    if matches!(
        action.status,
        ActionStatus::Succeeded | ActionStatus::Failed
    ) {
        return Ok(());
    }
    let cause = e.cause.as_deref().unwrap_or(&e.message);
    let now = st.clock.now_ms();
    let (status, error) = crate::core::usecases::actions::of(action.action_type)
        .give_up(st, &action, cause)
        .await?;
    if let Some(job_id) = &action.resource_refs.job_id {
        let why = error
            .clone()
            .unwrap_or_else(|| format!("processing failed: {cause}"));
        fail_job(st, &action, job_id, &why, now).await?;
    }
    let from = [ActionStatus::Queued, ActionStatus::Processing];
    st.store
        .set_action_status(&action.action_id, &from, status, error.as_deref(), now)
        .await?;
    // `airlock_dead_letters_total{queue}`: messages that went (or, on a last attempt, are
    // going) to their dead-letter queue, whose action was settled as failed here.
    metrics::counter!(
        crate::metrics::DEAD_LETTERED,
        "queue" => action.queue_target.short_name()
    )
    .increment(1);
    Ok(())
}

/// The last attempt at an order submission failed: find out where the order is, so that
/// nothing is left open and nobody is told to resubmit a live order. An order the broker
/// never saw (no row, or still `queued`, or `submitted` but unknown to the broker) becomes
/// `rejected`; one the broker has is recorded as the broker says.
pub(crate) async fn give_up_order(
    st: &Worker,
    action: &ActionRecord,
    cause: &str,
) -> Result<(ActionStatus, Option<String>), ApiError> {
    let failed = |why: String| Ok((ActionStatus::Failed, Some(why)));
    let Some(order_id) = action.resource_refs.order_id.as_deref() else {
        return failed(format!(
            "processing failed after repeated attempts: {cause}"
        ));
    };
    let never_sent = format!(
        "processing failed after repeated attempts: {cause}; order {order_id} never reached \
         the broker and is rejected"
    );
    for _ in 0..ROUNDS {
        let now = st.clock.now_ms();
        let order = match st.orders.get_order(order_id).await? {
            Some(o) => o,
            None => st
                .store
                .create_order(&new_order(&action.message, now)?)
                .await?
                .into_inner(),
        };
        match order.status {
            OrderStatus::Queued => {
                if reject_unsent(st, &order, now).await? {
                    return failed(never_sent);
                }
            }
            OrderStatus::Submitted => {
                match st.broker.order(&order.terms.account_id, order_id).await? {
                    Some(ack) => {
                        record(st, &order, &ack, now, None).await?;
                    }
                    // Claimed moments ago: an earlier attempt may still be sending it. Keep
                    // its reservation and never say "resubmit".
                    None if !claim_abandoned(st, &order, now) => {
                        return failed(format!(
                            "processing failed after repeated attempts: {cause}; order \
                             {order_id} was claimed for the broker moments ago and may still \
                             reach it: do not resubmit; check its status or run positions.sync"
                        ));
                    }
                    None => {
                        if reject_unsent(st, &order, now).await? {
                            return failed(never_sent);
                        }
                    }
                }
            }
            OrderStatus::Rejected => {
                return failed(format!(
                "processing failed after repeated attempts: {cause}; order {order_id} is rejected"
            ))
            }
            OrderStatus::Cancelled => {
                return failed(format!("order {order_id} was cancelled without a fill"))
            }
            // At the broker (working or filled): the submission did what it was for.
            _ => return Ok((ActionStatus::Succeeded, None)),
        }
    }
    Err(ApiError::unavailable(format!(
        "order {order_id}: too many concurrent changes"
    )))
}

/// Marks a job failed (creating it if no delivery did); a job already finished is left.
pub(super) async fn fail_job(
    st: &Worker,
    action: &ActionRecord,
    job_id: &str,
    error: &str,
    now: Millis,
) -> Result<(), ApiError> {
    let job = Job {
        job_id: job_id.into(),
        kind: JobKind::PositionsSync,
        status: JobStatus::Failed,
        account_id: Some(action.account_id.clone()),
        action_id: Some(action.action_id.clone()),
        created_at: now,
        updated_at: now,
        error: Some(error.to_string()),
        result: None,
    };
    let stored = st
        .store
        .create_job(&Job {
            status: JobStatus::Running,
            ..job.clone()
        })
        .await?;
    let failed = Job {
        created_at: stored.created_at,
        ..job
    };
    st.store
        .finish_job(
            &failed,
            &serde_json::Value::Object(Default::default()),
            None,
        )
        .await?;
    Ok(())
}
