//! `--execute` (sandboxes only): one resting 1-lot limit order followed to a terminal
//! state, changed in plan and cancelled; a replay of its execute; and a `positions.sync`.

use std::time::Instant;

use serde_json::{json, Value};

use super::client::{Accepted, Ctx};
use super::contract::{error_shape, failed_checks};
use super::market::resting_buy_limit;
use super::{Found, Outcome, Report, OPEN};

pub(super) async fn execute(ctx: &Ctx, report: &mut Report, found: &Found) {
    let account = found.account.clone().unwrap_or_default();
    let today = found
        .today
        .unwrap_or_else(|| chrono::Utc::now().date_naive());
    // The farthest priced contract at least two months out: it rests inside the band.
    let floor = {
        use chrono::Datelike;
        let m = today.year() * 12 + today.month0() as i32 + 2;
        format!("{:04}-{:02}", m / 12, m % 12 + 1)
    };
    let contract = found
        .priced
        .iter()
        .filter(|(_, month, _)| *month >= floor)
        .max_by(|a, b| a.1.cmp(&b.1))
        .cloned();
    let mut order: Option<Accepted> = None;
    let mut sync: Option<Accepted> = None;

    scenario!(
        report,
        "execute order.submit.cl (1, resting limit)",
        async {
            let (symbol, _, reference) = contract.clone().ok_or_else(|| {
            format!("{account} holds no priced contract from {floor} on, to price a resting limit order from")
        })?;
            let limit = resting_buy_limit(&reference)
                .ok_or_else(|| format!("{symbol}'s reference price {reference} is too low"))?;
            let p = ctx
                .plan(
                    "order.submit.cl",
                    json!({"account_id": account, "symbol": symbol, "side": "buy", "quantity": 1,
                       "order_type": "limit", "limit_price": limit, "time_in_force": "day"}),
                    "execute-order",
                )
                .await?;
            let (failed, only_market) = failed_checks(&p.body);
            if p.body["executable"] != true {
                return if only_market {
                    Ok(format!(
                        "skipped, the market is closed: {}",
                        failed.join("; ")
                    ))
                } else {
                    Err(format!("the plan is not executable: {}", failed.join("; ")))
                };
            }
            let plan_id = p.body["plan_id"].as_str().unwrap_or_default();
            match p.body["confirmation_token"].as_str() {
                Some(_) => {
                    let acc = ctx.execute_accepted(&p.body, "order", "the order").await?;
                    let d = format!(
                        "queued {} (order {}): buy 1 {symbol} limit {limit}, reference {reference}",
                        acc.action_id,
                        acc.resource.as_deref().unwrap_or("?")
                    );
                    order = Some(acc);
                    Ok(d)
                }
                None => {
                    // Operator confirmation: a person approves on the approval page; the check
                    // never does. The execute answers 409 and decides nothing.
                    let body = ctx.execute_body(plan_id, None, "order");
                    let a = ctx.post("/actions/execute", body.to_string()).await?;
                    error_shape(&a, 409, "approval_required", None)?;
                    Ok(format!(
                    "not sent: 409 approval_required, the order waits for an operator's approval at {}",
                    a.body["approval"]["url"].as_str().unwrap_or("?")
                ))
                }
            }
        }
    );

    scenario!(report, "execute positions.sync", async {
        if account.is_empty() {
            return Err("no account".into());
        }
        let p = ctx.plan_sync(&account, "execute-sync").await?;
        if p.body["confirmation_token"].is_null() {
            let (failed, _) = failed_checks(&p.body);
            return Err(format!(
                "the plan has no confirmation token: {}",
                failed.join("; ")
            ));
        }
        let acc = ctx.execute_accepted(&p.body, "sync", "the sync").await?;
        let d = format!(
            "queued {} (job {})",
            acc.action_id,
            acc.resource.as_deref().unwrap_or("?")
        );
        sync = Some(acc);
        Ok(d)
    });

    scenario!(report, "replay an accepted execute", async {
        let acc = order
            .as_ref()
            .or(sync.as_ref())
            .ok_or("nothing was queued to replay")?;
        let a = ctx.post("/actions/execute", acc.body.clone()).await?;
        a.expect(200)?;
        if a.body["status"] != "duplicate" || a.body["action_id"] != acc.action_id.as_str() {
            return Err(format!(
                "expected duplicate of {}, got {}",
                acc.action_id,
                a.text.trim()
            ));
        }
        Ok(format!("200 duplicate, the same action {}", acc.action_id))
    });

    if let Some(acc) = &order {
        let order_id = acc.resource.clone().unwrap_or_default();
        let settled = scenario!(report, "the order reaches a terminal state", async {
            let (action, took) = ctx.settle(&acc.action_id).await?;
            let o = ctx.order(&account, &order_id).await?;
            let d = format!(
                "action {} after {} ms; order {order_id} {}",
                action["status"].as_str().unwrap_or("?"),
                took.as_millis(),
                o["status"].as_str().unwrap_or("?")
            );
            succeeded(&action, d)
        });
        if settled {
            scenario!(
                report,
                "plan order.replace.cl of the check's order",
                async {
                    // Plans a change of the resting order's time in force (nothing executes):
                    // the preview and the payload say before and after.
                    let p = ctx
                    .plan(
                        "order.replace.cl",
                        json!({"account_id": account, "order_id": order_id, "time_in_force": "gtc"}),
                        "replace-order",
                    )
                    .await?;
                    p.expect(200)?;
                    let n = &p.body["normalized_payload"];
                    let preview = p.body["preview"].as_str().unwrap_or_default();
                    if n["replaces"]["order_id"] != order_id.as_str()
                        || n["time_in_force"] != "gtc"
                        || !preview.starts_with("Change order")
                    {
                        return Err(format!("unexpected plan: {}", p.body));
                    }
                    let (failed, _) = failed_checks(&p.body);
                    Ok(format!(
                        "{preview} executable: {} {}",
                        p.body["executable"],
                        failed.join("; ")
                    ))
                }
            );
            scenario!(report, "cancel the check's order", async {
                let p = ctx
                    .plan(
                        "order.cancel",
                        json!({"account_id": account, "order_id": order_id}),
                        "cancel-order",
                    )
                    .await?;
                if p.body["executable"] != true {
                    let o = ctx.order(&account, &order_id).await?;
                    let status = o["status"].as_str().unwrap_or("?");
                    let (failed, _) = failed_checks(&p.body);
                    return if OPEN.contains(&status) {
                        Err(format!(
                            "order {order_id} is {status} but cannot be cancelled: {}",
                            failed.join("; ")
                        ))
                    } else {
                        Ok(format!(
                            "order {order_id} already {status}: nothing to cancel"
                        ))
                    };
                }
                let cancel = ctx
                    .execute_accepted(&p.body, "cancel", "the cancel")
                    .await?;
                let (action, took) = ctx.settle(&cancel.action_id).await?;
                let o = ctx.order(&account, &order_id).await?;
                let d = format!(
                    "cancel {} after {} ms; order {order_id} {}",
                    action["status"].as_str().unwrap_or("?"),
                    took.as_millis(),
                    o["status"].as_str().unwrap_or("?")
                );
                if action["status"] == "succeeded" && o["status"] == "cancelled" {
                    Ok(d)
                } else {
                    Err(format!(
                        "{d} {}",
                        action["error"].as_str().unwrap_or_default()
                    ))
                }
            });
        }
    }

    if let Some(acc) = &sync {
        scenario!(report, "the sync reaches a terminal state", async {
            let (action, took) = ctx.settle(&acc.action_id).await?;
            let d = format!(
                "action {} after {} ms",
                action["status"].as_str().unwrap_or("?"),
                took.as_millis()
            );
            succeeded(&action, d)
        });
    }
}

/// `detail` when the settled `action` succeeded, else an error with its reason.
fn succeeded(action: &Value, detail: String) -> Outcome {
    if action["status"] == "succeeded" {
        Ok(detail)
    } else {
        Err(format!(
            "{detail}: {}",
            action["error"].as_str().unwrap_or("no error given")
        ))
    }
}
