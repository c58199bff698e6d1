//! The plan scenarios: a plan of each action type, an execute with a tampered token, a
//! replayed rejection, and the error shape of bad inputs.

use std::time::Instant;

use serde_json::{json, Value};

use super::client::Ctx;
use super::contract::{error_shape, failed_checks};
use super::market::contracts;
use super::tokens::{plan_id_of, tamper, BOGUS_TOKEN};
use super::{Found, Outcome, Report};

pub(super) async fn plans(ctx: &Ctx, report: &mut Report, found: &mut Found) {
    let today = found
        .today
        .unwrap_or_else(|| chrono::Utc::now().date_naive());
    let (symbol, expired) = contracts(today);
    let account = found.account.clone();

    scenario!(report, format!("plan order.submit.cl ({symbol})"), async {
        let account = account.clone().ok_or("no account to plan on")?;
        let p = ctx
            .plan(
                "order.submit.cl",
                one_lot_market_buy(&account, &symbol),
                "plan-order",
            )
            .await?;
        let (failed, only_market) = failed_checks(&p.body);
        if p.body["executable"] == true {
            let confirm = if p.body["confirmation_token"].is_string() {
                "confirmed with its token"
            } else {
                "approved on the approval page"
            };
            Ok(format!(
                "executable, {confirm}: {}",
                p.body["preview"].as_str().unwrap_or("")
            ))
        } else if only_market {
            Ok(format!(
                "executable but for the market hours: {}",
                failed.join("; ")
            ))
        } else {
            Err(format!("not executable: {}", failed.join("; ")))
        }
    });

    scenario!(report, "market protection and the price's age", async {
        let account = account.clone().ok_or("no account to plan on")?;
        let p = ctx
            .plan(
                "order.submit.cl",
                one_lot_market_buy(&account, &symbol),
                "plan-protected",
            )
            .await?;
        protection(&p.body)
    });

    scenario!(report, "plan order.cancel", async {
        let account = account.clone().ok_or("no account to plan on")?;
        let order = found
            .order_id
            .clone()
            .unwrap_or_else(|| "ord_airlock_check_none".into());
        let p = ctx
            .plan(
                "order.cancel",
                json!({"account_id": account, "order_id": order}),
                "plan-cancel",
            )
            .await?;
        let (failed, _) = failed_checks(&p.body);
        Ok(if p.body["executable"] == true {
            format!("order {order}: executable")
        } else {
            format!("order {order}: not executable: {}", failed.join("; "))
        })
    });

    scenario!(report, "plan positions.sync", async {
        let account = account.clone().ok_or("no account to plan on")?;
        let p = ctx.plan_sync(&account, "plan-sync").await?;
        found.sync_token = p.body["confirmation_token"].as_str().map(String::from);
        let (failed, _) = failed_checks(&p.body);
        Ok(if p.body["executable"] == true {
            format!("executable: {}", p.body["preview"].as_str().unwrap_or(""))
        } else {
            format!("not executable: {}", failed.join("; "))
        })
    });
    // The sync plan's id, for the tampered execute (any plan id works: the token is
    // verified before the plan is read).
    let sync_plan_id = found
        .sync_token
        .as_deref()
        .and_then(plan_id_of)
        .unwrap_or_else(|| "pln_airlock_check_none".into());

    scenario!(report, "execute with a tampered token", async {
        let token = found
            .sync_token
            .as_deref()
            .map(tamper)
            .unwrap_or_else(|| BOGUS_TOKEN.to_string());
        let body = ctx.execute_body(&sync_plan_id, Some(&token), "tampered");
        let a = ctx.post("/actions/execute", body.to_string()).await?;
        let d = error_shape(&a, 422, "token_invalid", None)?;
        if a.body["status"] != "rejected" {
            return Err(format!("no `status: rejected` in {}", a.text.trim()));
        }
        Ok(format!("{d}, status rejected"))
    });

    scenario!(
        report,
        format!("replay a rejected execute ({expired})"),
        async {
            let account = account.clone().ok_or("no account to plan on")?;
            let p = ctx
                .plan(
                    "order.submit.cl",
                    one_lot_market_buy(&account, &expired),
                    "plan-replay",
                )
                .await?;
            if p.body["executable"] != false {
                return Err(format!("a plan on expired {expired} is executable"));
            }
            let plan_id = p.body["plan_id"].as_str().unwrap_or_default();
            // No token: nothing can be queued, whatever the plan's confirmation mode.
            let body = ctx.execute_body(plan_id, None, "replay").to_string();
            let first = ctx.post("/actions/execute", body.clone()).await?;
            let again = ctx.post("/actions/execute", body).await?;
            for a in [&first, &again] {
                if a.status < 400 || a.status >= 500 || a.body["status"] != "rejected" {
                    return Err(format!("expected a rejection, got {}", a.brief()));
                }
            }
            if (again.status, &again.body["error"]) != (first.status, &first.body["error"]) {
                return Err(format!(
                    "the replay answered {}, the first {}",
                    again.brief(),
                    first.brief()
                ));
            }
            error_shape(&again, again.status, first.code(), None)?;
            Ok(format!(
                "{} {} twice, the same error",
                first.status,
                first.code()
            ))
        }
    );
}

pub(super) async fn bad_inputs(ctx: &Ctx, report: &mut Report, found: &Found) {
    let account = found.account.clone().unwrap_or_else(|| "ACC-1".into());
    let sync = ctx.plan_body(
        "positions.sync",
        json!({"account_id": account}),
        "bad-input",
    );
    let mut unknown = sync.clone();
    unknown["airlock_check_unknown"] = json!(true);
    let mut missing = sync.clone();
    if let Some(o) = missing.as_object_mut() {
        o.remove("requested_by");
    }
    let mut bad_enum = sync.clone();
    bad_enum["action_type"] = json!("order.teleport");
    let cases: [(&str, String, &str); 4] = [
        ("malformed JSON", "{\"action_type\": ".into(), "/"),
        (
            "an unknown field",
            unknown.to_string(),
            "/airlock_check_unknown",
        ),
        (
            "a missing required field",
            missing.to_string(),
            "/requested_by",
        ),
        ("a bad enum value", bad_enum.to_string(), "/action_type"),
    ];
    for (what, body, field) in cases {
        scenario!(report, format!("bad input: {what}"), async {
            let a = ctx.post("/actions/plan", body).await?;
            error_shape(&a, 400, "invalid_request", Some(field))
        });
    }
    scenario!(report, "bad input: a forged cursor", async {
        let a = ctx
            .get("/orders?cursor=airlock-check-forged-cursor")
            .await?;
        error_shape(&a, 400, "invalid_cursor", Some("cursor"))
    });
}

/// The payload of a 1-lot market buy of `symbol` on `account`.
fn one_lot_market_buy(account: &str, symbol: &str) -> Value {
    json!({"account_id": account, "symbol": symbol, "side": "buy",
           "quantity": 1, "order_type": "market"})
}

/// A market buy's plan: sent as a limit the policy's points above the reference price
/// (`normalized_payload.market_protection`), and a `price_band` that passes on a fresh
/// price (its reason names the age) or fails naming why (stale, none).
fn protection(plan: &Value) -> Outcome {
    let n = &plan["normalized_payload"];
    let band = plan["risk_checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "price_band"))
        .ok_or("no price_band check in the plan")?;
    let reason = band["reason"].as_str().unwrap_or("");
    if band["status"] != "pass" {
        return Err(format!("price_band {}: {reason}", band["status"]));
    }
    let m = &n["market_protection"];
    if m["requested_type"] != "market" || n["order_type"] != "limit" {
        return Err(format!(
            "a market order is not sent as a protected limit: order_type {}, market_protection {m}",
            n["order_type"]
        ));
    }
    let dec = |v: &Value, what: &str| {
        v.as_str()
            .and_then(|s| airlock::core::domain::Price::parse(s).ok())
            .map(|p| p.value())
            .ok_or_else(|| format!("{what} is not a decimal: {v}"))
    };
    let (limit, from, points) = (
        dec(&n["limit_price"], "limit_price")?,
        dec(&m["from_price"], "market_protection.from_price")?,
        dec(&m["points"], "market_protection.points")?,
    );
    if limit > from + points || limit < from {
        return Err(format!(
            "the protected limit {limit} is not within {points} above the reference {from}"
        ));
    }
    Ok(format!("limit {limit} = {from} + up to {points}; {reason}"))
}
