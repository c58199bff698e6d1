//! CL rules through HTTP with `AIRLOCK_NOW` pinned: market hours, expiry, the close-only
//! window, symbol rules, and the execute-time re-check.

use airlock_tests::{both, Backend, Resp, Server};
use serde_json::json;

async fn plan_at(b: Backend, now: &str, symbol: &str, side: &str, qty: u32) -> Resp {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", now)]);
    let t = s.trader();
    t.post(
        "/actions/plan",
        &json!({"action_type": "order.submit.cl", "payload": {"account_id": "ACC-1", "symbol": symbol, "side": side, "quantity": qty, "order_type": "market"}, "requested_by": "op-energy-trader"}),
    )
    .await
}

both!(market_open_follows_the_globex_week_halts_and_holidays);
async fn market_open_follows_the_globex_week_halts_and_holidays(b: Backend) {
    // Monday 09:00 CT: open, executable.
    let p = plan_at(b, "2026-11-23T15:00:00Z", "CLF27", "buy", 1).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    assert_eq!(p.check("market_open")["status"], "pass");

    // The daily halt, Monday 16:30 CT.
    let p = plan_at(b, "2026-11-23T22:30:00Z", "CLF27", "buy", 1).await;
    let c = p.check("market_open");
    assert_eq!(
        (c["status"].as_str(), p["executable"].as_bool()),
        (Some("fail"), Some(false))
    );
    assert!(c["reason"].as_str().unwrap().contains("halt"), "{c}");
    assert!(p["confirmation_token"].is_null());

    // Saturday.
    let p = plan_at(b, "2026-11-21T18:00:00Z", "CLF27", "buy", 1).await;
    let c = p.check("market_open");
    assert_eq!(c["status"], "fail");
    assert!(c["reason"].as_str().unwrap().contains("weekend"), "{c}");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("17:00 CT on 2026-11-22"),
        "{c}"
    );

    // Christmas Day, a full exchange holiday (a Friday in 2026).
    let p = plan_at(b, "2026-12-25T16:00:00Z", "CLG27", "buy", 1).await;
    let c = p.check("market_open");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("christmas"),
        "{c}"
    );

    // Sunday 17:05 CT (23:05Z in November, CST): open again.
    let p = plan_at(b, "2026-11-22T23:05:00Z", "CLF27", "buy", 1).await;
    assert_eq!(p.check("market_open")["status"], "pass", "{:?}", p.body);
}

both!(expired_contracts_and_the_close_only_window);
async fn expired_contracts_and_the_close_only_window(b: Backend) {
    // CLZ26 stopped trading at 13:30 CT on Friday 2026-11-20.
    let p = plan_at(b, "2026-11-23T15:00:00Z", "CLZ26", "buy", 1).await;
    let c = p.check("contract_not_expired");
    assert_eq!(c["status"], "fail");
    assert_eq!(
        c["reason"],
        "CLZ26 stopped trading at 13:30 CT on 2026-11-20"
    );
    assert_eq!(p["normalized_payload"]["last_trade_date"], "2026-11-20");
    // Ten minutes before the cut-off it still trades.
    let p = plan_at(b, "2026-11-20T19:20:00Z", "CLZ26", "sell", 1).await;
    p.assert_check("contract_not_expired", "pass");

    // CLF27's last trading day is Mon 2026-12-21; on Thu 2026-12-17 it is two business
    // days away: close-only. ACC-1 holds +3 CLF27 in the demo data seeded a month before.
    let seeded = Server::start_on(b, &[("AIRLOCK_NOW", "2026-11-23T15:00:00Z")]);
    let dir = seeded.crash();
    let s = dir.start(&[("AIRLOCK_NOW", "2026-12-17T15:00:00Z")]);
    let t = s.trader();
    let order = |side: &str, qty: u32| json!({"action_type": "order.submit.cl", "payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": side, "quantity": qty, "order_type": "market"}, "requested_by": "op-energy-trader"});
    let buy = t.post("/actions/plan", &order("buy", 1)).await;
    let c = buy.check("expiry_window");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(c["reason"].as_str().unwrap().contains("holds +3"), "{c}");
    assert_eq!(buy["executable"], false);
    let sell = t.post("/actions/plan", &order("sell", 2)).await;
    sell.assert_check("expiry_window", "pass");
    assert_eq!(sell["executable"], true, "{:?}", sell.body);
    // Selling more than the position would flip it: not reducing.
    let flip = t.post("/actions/plan", &order("sell", 5)).await;
    assert_eq!(flip.check("expiry_window")["status"], "fail");
}

both!(symbols_sizes_prices_and_order_types);
async fn symbols_sizes_prices_and_order_types(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", "2026-11-23T15:00:00Z")]);
    let t = s.trader();
    let plan = |payload: serde_json::Value| {
        let t = t.clone();
        async move {
            t.post("/actions/plan", &json!({"action_type": "order.submit.cl", "payload": payload, "requested_by": "op-energy-trader"}))
                .await
        }
    };
    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF7", "side": "buy", "quantity": 1, "order_type": "market"})).await;
    assert_eq!(p.status, 200);
    let c = p.check("symbol_valid");
    assert_eq!(c["status"], "fail");
    assert!(
        c["reason"].as_str().unwrap().contains("CLF27 or CLF2027"),
        "{c}"
    );
    let p = plan(json!({"account_id": "ACC-1", "symbol": "clf2027", "side": "buy", "quantity": 1, "order_type": "market"})).await;
    assert_eq!(p["normalized_payload"]["symbol"], "CLF27");
    assert_eq!(p["executable"], true);
    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF40", "side": "buy", "quantity": 1, "order_type": "market"})).await;
    assert_eq!(
        p.check("symbol_valid")["status"],
        "fail",
        "beyond the listed horizon"
    );
    let p = plan(json!({"account_id": "ACC-1", "symbol": "NGF27", "side": "buy", "quantity": 1, "order_type": "market"})).await;
    assert_eq!(p.check("symbol_valid")["status"], "fail");

    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 11, "order_type": "market"})).await;
    assert_eq!(p.check("max_order_size")["status"], "fail");
    let p = plan(json!({"account_id": "ACC-2", "symbol": "CLF27", "side": "buy", "quantity": 10, "order_type": "market"})).await;
    assert_eq!(
        p.check("position_limit")["status"],
        "pass",
        "10 + 10 = 20 <= 50"
    );
    let p = plan(json!({"account_id": "ACC-4", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market"})).await;
    assert_eq!(
        p.check("account_allowed")["status"],
        "fail",
        "suspended account"
    );

    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "limit", "limit_price": 68.455})).await;
    assert_eq!(p.check("price_on_tick")["status"], "fail");
    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "limit", "limit_price": "-37.63"})).await;
    assert_eq!(
        p.check("price_on_tick")["status"],
        "pass",
        "negative prices trade by default"
    );
    assert_eq!(p["normalized_payload"]["limit_price"], "-37.63");
    assert_eq!(
        p["preview"],
        "Buy 1 CLF27 limit -37.63 on ACC-1, day order."
    );
    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "limit"})).await;
    assert_eq!(
        p.check("order_type_valid")["status"],
        "fail",
        "limit needs a price"
    );
    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market", "stop_price": 60})).await;
    assert_eq!(
        p.check("order_type_valid")["status"],
        "fail",
        "market takes no price"
    );
    let p = plan(json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "sell", "quantity": 1, "order_type": "stop_limit", "stop_price": 60, "limit_price": "59.90", "time_in_force": "gtc"})).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    assert_eq!(
        p["preview"],
        "Sell 1 CLF27 stop 60.00 limit 59.90 on ACC-1, good till cancelled."
    );

    // Cancels: the order must exist on that account and still be cancellable.
    let cancel = |order: &str| {
        let t = t.clone();
        let order = order.to_string();
        async move {
            t.post("/actions/plan", &json!({"action_type": "order.cancel", "payload": {"account_id": "ACC-1", "order_id": order}, "requested_by": "op-energy-trader"}))
                .await
        }
    };
    assert_eq!(cancel("ORD-1003").await["executable"], true);
    assert_eq!(
        (cancel("ORD-1001").await).check("order_cancellable")["status"],
        "fail",
        "filled"
    );
    assert_eq!(
        (cancel("ORD-1004").await).check("order_exists")["status"],
        "fail",
        "on ACC-2"
    );
    assert_eq!(
        (cancel("ORD-9999").await).check("order_exists")["status"],
        "fail"
    );
    // Syncs: the account is active.
    let sync = t.plan_sync("ACC-4").await;
    assert_eq!(sync.check("account_allowed")["status"], "fail");
    let sync = t.plan_sync("ACC-2").await;
    assert_eq!(sync["executable"], true);
    assert_eq!(sync["queue_target"], "worker:jobs");
    let e = t.execute(&sync, "sync-1").await;
    assert_eq!(e.status, 202);
    assert!(e["resource_refs"]["job_id"]
        .as_str()
        .unwrap()
        .starts_with("job_"));
}

both!(execute_re_runs_the_time_sensitive_checks);
async fn execute_re_runs_the_time_sensitive_checks(b: Backend) {
    // Planned at 15:58 CT, executed after the 16:00 CT halt began.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", "2026-11-23T21:58:00Z")]);
    let p = s.trader().plan_buy("CLF27", 1).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    let dir = s.crash();
    let later = dir.start(&[("AIRLOCK_NOW", "2026-11-23T22:01:00Z")]);
    let t = later.trader();
    let r = t.execute(&p, "halt-1").await;
    r.assert_error(422, "policy_violation");
    assert_eq!(r.field(), "risk_checks/market_open");
    assert!(r.message().contains("reopens"));
    assert_eq!(later.queued_messages(), 0);
    // The plan is closed: it cannot run later either.
    let r = t.execute(&p, "halt-2").await;
    assert_eq!(r.code(), "plan_not_executable");
}

#[tokio::test]
async fn execute_checks_the_position_limit_against_the_current_position() {
    let s = Server::start(&[("AIRLOCK_NOW", "2026-11-23T15:00:00Z")]);
    let t = s.trader();
    let p = t.plan_buy("CLF27", 5).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    // Fills elsewhere moved ACC-1 to +48 CLF27 since the plan: +5 would breach 50.
    s.db()
        .execute(
            "UPDATE positions SET quantity = 48 WHERE account_id = 'ACC-1' AND symbol = 'CLF27'",
            [],
        )
        .unwrap();
    let r = t.execute(&p, "pos-1").await;
    r.assert_error(422, "policy_violation");
    assert_eq!(r.field(), "risk_checks/position_limit");
    assert!(
        // +48, the demo's working buy of 1, and this 5: the worst case counts open orders.
        r.body["error"]["message"].as_str().unwrap().contains("+54"),
        "{:?}",
        r.body
    );
    assert_eq!(s.queued_messages(), 0);
    // Within the limit again, a new plan goes through.
    s.db()
        .execute(
            // 44 + the working buy of 1 + 5 = 50: within the limit.
            "UPDATE positions SET quantity = 44 WHERE account_id = 'ACC-1' AND symbol = 'CLF27'",
            [],
        )
        .unwrap();
    let p = t.plan_buy("CLF27", 5).await;
    assert_eq!(t.execute(&p, "pos-2").await.status, 202);
}

both!(the_policy_in_the_control_record_takes_effect_at_once);
async fn the_policy_in_the_control_record_takes_effect_at_once(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", "2026-11-23T15:00:00Z")]);
    let t = s.trader();
    let p = t.plan_buy("CLF27", 3).await;
    assert_eq!(p["executable"], true);
    let file = s.state_dir.join("tight.json");
    std::fs::write(&file, r#"{"version": "tight-2", "max_order_size": 2, "confirmation": {"order.submit.cl": "token"}}"#).unwrap();
    let out = s.cli(&["policy", "set", file.to_str().unwrap()]);
    assert!(out.contains("\"max_order_size\": 2"), "{out}");
    // Planned before: the execute re-check uses the policy in force now.
    let r = t.execute(&p, "tight-1").await;
    r.assert_error(422, "policy_violation");
    assert_eq!(r.field(), "risk_checks/max_order_size");
    let q = t.plan_buy("CLF27", 3).await;
    assert_eq!(q.check("max_order_size")["status"], "fail");
    assert!(q["policy_version"]
        .as_str()
        .unwrap()
        .starts_with("tight-2+cme-"));
    // Unknown fields are refused: a typo never loosens a limit.
    std::fs::write(&file, r#"{"max_ordr_size": 100}"#).unwrap();
    let out = std::process::Command::new(airlock_tests::binary())
        .args([
            "--state-dir",
            s.state_dir.to_str().unwrap(),
            "policy",
            "set",
            file.to_str().unwrap(),
        ])
        .envs(s.cli_env())
        .output()
        .unwrap();
    assert!(!out.status.success());
    s.cli(&["policy", "reset"]);
    assert_eq!(t.plan_buy("CLF27", 3).await["executable"], true);
}
