//! `order.replace.cl` on both backends: a working order changed up, down and in price,
//! a partly filled order changed in its rest, the position limit counting only what a
//! change adds, the kill switch refusing an increase and passing a reduction, changes
//! racing a fill and a cancel, idempotent retries, and bad requests.

use airlock_tests::{both, Api, Backend, Resp, Server};
use serde_json::{json, Value};

async fn plan(t: &Api, action_type: &str, payload: Value) -> Resp {
    t.post(
        "/actions/plan",
        &json!({"action_type": action_type, "payload": payload, "requested_by": "op-energy-trader"}),
    )
    .await
}

/// Plans and executes; the action's final state.
async fn run(t: &Api, action_type: &str, payload: Value, key: &str) -> Resp {
    let p = plan(t, action_type, payload).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    let e = t.execute(&p, key).await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    t.settled(e["action_id"].as_str().unwrap()).await
}

/// A resting buy limit of `qty` CLF27 at 66.00 (below the reference): its order id.
async fn working_buy(t: &Api, qty: u32, key: &str) -> String {
    let p = plan(
        t,
        "order.submit.cl",
        json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": qty,
               "order_type": "limit", "limit_price": "66.00", "time_in_force": "gtc"}),
    )
    .await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    let e = t.execute(&p, key).await;
    assert_eq!(
        t.settled(e["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    let id = e["resource_refs"]["order_id"].as_str().unwrap().to_string();
    assert_eq!(t.order(&id).await["status"], "working");
    id
}

fn change(order_id: &str, fields: Value) -> Value {
    let mut p = json!({"account_id": "ACC-1", "order_id": order_id});
    for (k, v) in fields.as_object().unwrap() {
        p[k] = v.clone();
    }
    p
}

/// Open buys of ACC-1 in CLF27, as the plan's position check reads them.
async fn open_buys(t: &Api) -> i64 {
    let p = plan(
        t,
        "order.submit.cl",
        json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market"}),
    )
    .await;
    let reason = p.check("position_limit")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    let after = reason.split("open orders to buy ").nth(1).expect(&reason);
    after.split_whitespace().next().unwrap().parse().unwrap()
}

both!(a_working_order_changes_up_down_and_in_price);
async fn a_working_order_changes_up_down_and_in_price(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let base = open_buys(&t).await;
    let id = working_buy(&t, 2, "rp-new").await;
    assert_eq!(open_buys(&t).await, base + 2);

    // Up: 2 -> 3, the preview and the payload say what changes.
    let p = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 3}))).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    assert_eq!(
        p["preview"],
        format!("Change order {id} on ACC-1: buy 2 -> 3 CLF27, limit 66.00, good till cancelled.")
    );
    assert_eq!(p["normalized_payload"]["quantity"], 3);
    assert_eq!(p["normalized_payload"]["replaces"]["quantity"], 2);
    assert_eq!(p["normalized_payload"]["replaces"]["version"], 1);
    assert_eq!(p["queue_target"], "worker:orders");
    let e = t.execute(&p, "rp-up").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    assert_eq!(
        e["resource_refs"]["order_id"],
        id.as_str(),
        "it acts on the order"
    );
    assert_eq!(
        t.settled(e["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    let o = t.order(&id).await;
    assert_eq!(
        (o["quantity"].as_u64(), o["version"].as_u64()),
        (Some(3), Some(2)),
        "{o}"
    );
    assert_eq!(o["versions"][0]["quantity"], 2);
    assert_eq!(
        open_buys(&t).await,
        base + 3,
        "the reserved increase became the order's rest"
    );

    // The same key again: the same action, nothing applied twice.
    let again = t.execute(&p, "rp-up").await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(again["action_id"], e["action_id"]);
    assert_eq!(t.order(&id).await["version"], 2);

    // A price move, then down to 1.
    let r = run(
        &t,
        "order.replace.cl",
        change(&id, json!({"limit_price": "65.90"})),
        "rp-px",
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{:?}", r.body);
    let r = run(
        &t,
        "order.replace.cl",
        change(&id, json!({"quantity": 1})),
        "rp-down",
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{:?}", r.body);
    let o = t.order(&id).await;
    assert_eq!(
        (
            o["quantity"].as_u64(),
            o["limit_price"].as_str(),
            o["version"].as_u64(),
            o["status"].as_str()
        ),
        (Some(1), Some("65.90"), Some(4), Some("working")),
        "{o}"
    );
    assert_eq!(o["versions"].as_array().unwrap().len(), 3);
    assert_eq!(
        open_buys(&t).await,
        base + 1,
        "the reduction released its contracts"
    );
    // The broker has the same version.
    let book = s.broker_book("ACC-1");
    assert_eq!(book["orders"][&id]["version"], 4, "{book}");
    assert_eq!(book["orders"][&id]["quantity"], 1, "{book}");
}

both!(bad_changes_are_refused_and_change_nothing);
async fn bad_changes_are_refused_and_change_nothing(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let id = working_buy(&t, 2, "rp-bad").await;
    let p = plan(&t, "order.replace.cl", change(&id, json!({}))).await;
    assert_eq!(p.status, 400, "{:?}", p.body);
    assert_eq!(p["error"]["code"], "invalid_request");
    let p = plan(
        &t,
        "order.replace.cl",
        change("ord-none", json!({"quantity": 3})),
    )
    .await;
    assert_eq!(p.status, 404, "{:?}", p.body);
    assert_eq!(p["error"]["code"], "order_not_found");
    assert_eq!(p["error"]["details"][0]["field"], "/payload/order_id");
    let p = plan(&t, "order.replace.cl", change(&id, json!({"side": "sell"}))).await;
    assert_eq!(p.status, 400, "the side cannot change: {:?}", p.body);
    let p = plan(
        &t,
        "order.replace.cl",
        change(&id, json!({"stop_price": "60.00"})),
    )
    .await;
    assert_eq!(p["executable"], false);
    p.assert_check("order_replaceable", "fail");
    let o = t.order(&id).await;
    assert_eq!(
        (o["quantity"].as_u64(), o["version"].as_u64()),
        (Some(2), Some(1))
    );
}

both!(a_partly_filled_order_changes_only_its_rest);
async fn a_partly_filled_order_changes_only_its_rest(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let base = open_buys(&t).await;
    let id = working_buy(&t, 5, "rp-part").await;
    s.broker_fill("ACC-1", &id, 2, None);
    assert_eq!(t.order(&id).await["filled_quantity"], 2);
    assert_eq!(open_buys(&t).await, base + 3);

    // Below what has filled: refused at plan.
    let p = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 1}))).await;
    assert_eq!(p["executable"], false);
    assert!(
        p.check("order_replaceable")["reason"]
            .as_str()
            .unwrap()
            .contains("2 filled"),
        "{:?}",
        p.body
    );
    // To 4: the rest is 2.
    let r = run(
        &t,
        "order.replace.cl",
        change(&id, json!({"quantity": 4})),
        "rp-part-4",
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{:?}", r.body);
    let o = t.order(&id).await;
    assert_eq!(
        (
            o["quantity"].as_u64(),
            o["filled_quantity"].as_u64(),
            o["status"].as_str()
        ),
        (Some(4), Some(2), Some("partially_filled"))
    );
    assert_eq!(open_buys(&t).await, base + 2);

    // Planned at 3 (above the 2 filled), then a fill takes it to 4 filled: the worker
    // refuses the change, and nothing is left reserved.
    let p = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 3}))).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    s.broker_fill("ACC-1", &id, 1, None);
    s.broker_fill("ACC-1", &id, 1, None);
    assert_eq!(t.order(&id).await["status"], "filled");
    let e = t.execute(&p, "rp-part-3").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let r = t.settled(e["action_id"].as_str().unwrap()).await;
    assert_eq!(r["status"], "failed", "{:?}", r.body);
    assert!(
        r["error"].as_str().unwrap().contains("filled"),
        "{:?}",
        r.body
    );
    assert_eq!(open_buys(&t).await, base);
    assert_eq!(t.order(&id).await["filled_quantity"], 4);
}

both!(the_position_limit_counts_only_what_the_change_adds);
async fn the_position_limit_counts_only_what_the_change_adds(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let position = t.position("ACC-1", "CLF27").await;
    let base = open_buys(&t).await;
    let id = working_buy(&t, 2, "rp-lim").await;
    // Room for exactly two more contracts on the buy side.
    let max = position + base + 4;
    let file = s.state_dir.join("replace-limit.json");
    std::fs::write(
        &file,
        json!({"version": "replace-limit", "max_position": max,
               "confirmation": {"order.submit.cl": "token", "order.replace.cl": "token"}})
        .to_string(),
    )
    .unwrap();
    s.cli(&["policy", "set", file.to_str().unwrap()]);
    // 2 -> 4 adds two: passes (counting the order twice, 2 + 4, would not).
    let p = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 4}))).await;
    assert_eq!(p.check("position_limit")["status"], "pass", "{:?}", p.body);
    // 2 -> 5 adds three: fails.
    let p = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 5}))).await;
    assert_eq!(p.check("position_limit")["status"], "fail", "{:?}", p.body);
    assert_eq!(p["executable"], false);
    // Two changes of +2 planned together: the first reserves its increase, the second
    // finds no room at execute.
    let a = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 4}))).await;
    let c = plan(
        &t,
        "order.submit.cl",
        json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy",
        "quantity": 2, "order_type": "limit", "limit_price": "66.00", "time_in_force": "gtc"}),
    )
    .await;
    assert_eq!(
        (a["executable"].as_bool(), c["executable"].as_bool()),
        (Some(true), Some(true))
    );
    let ea = t.execute(&a, "rp-lim-a").await;
    assert_eq!(ea.status, 202, "{:?}", ea.body);
    let ec = t.execute(&c, "rp-lim-c").await;
    assert_eq!(ec.status, 422, "{:?}", ec.body);
    assert_eq!(ec["error"]["code"], "policy_violation");
    assert_eq!(
        t.settled(ea["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    assert_eq!(open_buys(&t).await, base + 4);
}

both!(the_kill_switch_refuses_an_increase_and_passes_a_reduction);
async fn the_kill_switch_refuses_an_increase_and_passes_a_reduction(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let id = working_buy(&t, 3, "rp-kill").await;
    let up = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 4}))).await;
    assert_eq!(up["executable"], true, "{:?}", up.body);
    // Engaged without pulling the working order: its changes are what is tested.
    s.cli(&[
        "kill-switch",
        "engage",
        "--reason",
        "replace drill",
        "--keep-working",
    ]);
    // Planned before: refused at execute.
    let e = t.execute(&up, "rp-kill-up").await;
    assert_eq!(e.status, 403, "{:?}", e.body);
    assert_eq!(e["error"]["code"], "kill_switch_engaged");
    // Planned now: the increase and a price move fail the check; a reduction passes.
    let p = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 4}))).await;
    assert_eq!(p.check("kill_switch")["status"], "fail");
    let p = plan(
        &t,
        "order.replace.cl",
        change(&id, json!({"limit_price": "65.50"})),
    )
    .await;
    assert_eq!(p.check("kill_switch")["status"], "fail");
    let down = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 1}))).await;
    down.assert_check("kill_switch", "pass");
    assert_eq!(down["executable"], true, "{:?}", down.body);
    assert!(
        down["confirmation_token"].is_string(),
        "confirmed as a cancel is: {:?}",
        down.body
    );
    let e = t.execute(&down, "rp-kill-down").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    assert_eq!(
        t.settled(e["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    assert_eq!(t.order(&id).await["quantity"], 1);
}

both!(a_change_racing_a_cancel_fails_and_releases_its_reservation);
async fn a_change_racing_a_cancel_fails_and_releases_its_reservation(b: Backend) {
    let s = Server::with_workers(b, &[]);
    let t = s.trader();
    let base = open_buys(&t).await;
    let id = working_buy(&t, 2, "rp-race").await;
    let up = plan(&t, "order.replace.cl", change(&id, json!({"quantity": 3}))).await;
    assert_eq!(up["executable"], true, "{:?}", up.body);
    let r = run(
        &t,
        "order.cancel",
        json!({"account_id": "ACC-1", "order_id": id}),
        "rp-race-cancel",
    )
    .await;
    assert_eq!(r["status"], "succeeded");
    assert_eq!(open_buys(&t).await, base);
    let e = t.execute(&up, "rp-race-up").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let r = t.settled(e["action_id"].as_str().unwrap()).await;
    assert_eq!(r["status"], "failed", "{:?}", r.body);
    assert!(
        r["error"].as_str().unwrap().contains("cancelled"),
        "{:?}",
        r.body
    );
    assert_eq!(
        open_buys(&t).await,
        base,
        "the reserved increase was released"
    );
    let o = t.order(&id).await;
    assert_eq!(
        (o["status"].as_str(), o["version"].as_u64()),
        (Some("cancelled"), Some(1))
    );
    // A second change planned against version 1 after a first one applied: refused.
    let id2 = working_buy(&t, 2, "rp-race-2").await;
    let first = plan(&t, "order.replace.cl", change(&id2, json!({"quantity": 3}))).await;
    let second = plan(&t, "order.replace.cl", change(&id2, json!({"quantity": 1}))).await;
    let e1 = t.execute(&first, "rp-race-first").await;
    assert_eq!(
        t.settled(e1["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    let e2 = t.execute(&second, "rp-race-second").await;
    let r = t.settled(e2["action_id"].as_str().unwrap()).await;
    assert_eq!(r["status"], "failed", "{:?}", r.body);
    assert!(
        r["error"].as_str().unwrap().contains("version 2"),
        "{:?}",
        r.body
    );
    assert_eq!(t.order(&id2).await["quantity"], 3);
}
