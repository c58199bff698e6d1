//! Reconciliation: working orders re-read from the broker after a price change.

use super::*;

/// Orders the broker may have filled since we last recorded them.
pub(super) const AT_THE_BROKER: &[OrderStatus] = &[
    OrderStatus::Submitted,
    OrderStatus::Working,
    OrderStatus::PartiallyFilled,
];

/// Asks the broker about one order and records what moved. `true` if it recorded a change.
pub(super) async fn reconcile_order(st: &Worker, order: &Order) -> Result<bool, ApiError> {
    let Some(ack) = st
        .broker
        .order(&order.terms.account_id, &order.order_id)
        .await?
    else {
        return Ok(false);
    };
    let moved =
        order_status(ack.status) != order.status || ack.filled_quantity != order.filled_quantity;
    Ok(moved && record(st, order, &ack, st.clock.now_ms(), None).await?)
}

/// Asks the broker about the orders in `statuses` (of one account, or all) and records
/// what moved. Returns how many changed.
pub(super) async fn reconcile_orders(
    st: &Worker,
    account: Option<&str>,
    statuses: &[OrderStatus],
) -> Result<usize, ApiError> {
    let mut updated = 0;
    for listed in st.orders.list_at_the_broker(account).await? {
        if !statuses.contains(&listed.status) {
            continue;
        }
        // The listing may lag (an index on DynamoDB): act on the order as it is now.
        let Some(order) = st.orders.get_order(&listed.order_id).await? else {
            continue;
        };
        if statuses.contains(&order.status) && reconcile_order(st, &order).await? {
            updated += 1;
        }
    }
    Ok(updated)
}
