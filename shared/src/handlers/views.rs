//! JSON shapes of the read endpoints: flat objects, RFC 3339 times, prices as strings.

use serde_json::{json, Value};

use crate::domain::{rfc3339, Account, Job, Order, Position};
use crate::protocol::reads::Listing;
use crate::records::ActionRecord;

pub fn account(a: &Account) -> Value {
    json!({
        "account_id": a.account_id,
        "name": a.name,
        "desk": a.desk,
        "currency": a.currency,
        "status": a.status,
    })
}

pub fn position(p: &Position) -> Value {
    json!({
        "account_id": p.account_id,
        "symbol": p.symbol,
        "quantity": p.quantity,
        "avg_price": p.avg_price,
        "updated_at": rfc3339(p.updated_at),
    })
}

pub fn order(o: &Order) -> Value {
    json!({
        "order_id": o.order_id,
        "account_id": o.account_id,
        "symbol": o.symbol,
        "side": o.side,
        "quantity": o.quantity,
        "order_type": o.order_type,
        "limit_price": o.limit_price,
        "stop_price": o.stop_price,
        "time_in_force": o.time_in_force,
        "status": o.status,
        "filled_quantity": o.filled_quantity,
        "avg_fill_price": o.avg_fill_price,
        "action_id": o.action_id,
        "created_at": rfc3339(o.created_at),
        "updated_at": rfc3339(o.updated_at),
    })
}

pub fn job(j: &Job) -> Value {
    json!({
        "job_id": j.job_id,
        "kind": j.kind,
        "status": j.status,
        "account_id": j.account_id,
        "action_id": j.action_id,
        "created_at": rfc3339(j.created_at),
        "updated_at": rfc3339(j.updated_at),
        "error": j.error,
        "result": j.result,
    })
}

pub fn action(a: &ActionRecord) -> Value {
    json!({
        "action_id": a.action_id,
        "plan_id": a.plan_id,
        "action_type": a.action_type,
        "status": a.status,
        "queue_target": a.queue_target,
        "resource_refs": a.resource_refs,
        "created_at": rfc3339(a.created_at),
        "updated_at": rfc3339(a.updated_at),
        "error": a.error,
    })
}

/// `{ "<name>": [...], "next_cursor": ... }`
pub fn listing<T>(name: &str, l: &Listing<T>, view: fn(&T) -> Value) -> Value {
    let mut out = serde_json::Map::new();
    out.insert(name.into(), Value::Array(l.rows.iter().map(view).collect()));
    out.insert("next_cursor".into(), json!(l.next_cursor));
    Value::Object(out)
}
