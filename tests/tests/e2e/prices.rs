//! Market protection and fresh prices, on both backends: a market order is planned, shown
//! and sent as a limit within the policy's protection points of the reference price (a
//! stop order as a stop-limit); an order needs a reference price no older than the
//! policy's `max_quote_age_seconds`, checked at plan, inside execute and at the worker
//! just before the broker, so a price that went stale or moved since the plan stops it.

use airlock_tests::{both, Api, Backend, Resp, Server, MARKET_OPEN};
use serde_json::{json, Value};

async fn plan(t: &Api, order: Value) -> Resp {
    t.post(
        "/actions/plan",
        &json!({ "action_type": "order.submit.cl", "payload": order,
                 "requested_by": "op-energy-trader" }),
    )
    .await
}

fn order(side: &str, order_type: &str, extra: Value) -> Value {
    let mut o = json!({ "account_id": "ACC-1", "symbol": "CLH27", "side": side,
                        "quantity": 2, "order_type": order_type });
    if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
        o.extend(extra.clone());
    }
    o
}

/// Sets the policy `p` (`airlock policy set` of a file in the server's state dir), with
/// token confirmation as the stack's own.
fn set_policy(s: &Server, mut p: Value) {
    p["confirmation"] = json!({ "order.submit.cl": "token", "order.replace.cl": "token" });
    let file = s.state_dir.join("policy-prices.json");
    std::fs::write(&file, p.to_string()).unwrap();
    s.cli(&["policy", "set", &file.to_string_lossy()]);
}

/// Sets `symbol`'s price as observed at `at` (the CLI's clock), not at the server's now.
fn set_price_at(s: &Server, symbol: &str, price: &str, at: &str) {
    let mut env = s.cli_env();
    env.retain(|(k, _)| k != "AIRLOCK_NOW");
    env.push(("AIRLOCK_NOW".into(), at.into()));
    airlock_tests::cli(&s.state_dir, &env, &["prices", symbol, price]);
}

/// The server's clock now (the CLI's own starts at `AIRLOCK_NOW` when it starts, behind a
/// server that started earlier): a plan expires 300 s after it is made.
async fn server_now(t: &Api) -> String {
    let p = plan(t, order("buy", "limit", json!({ "limit_price": "70.00" }))).await;
    let expires: chrono::DateTime<chrono::Utc> =
        p.body["expires_at"].as_str().unwrap().parse().unwrap();
    (expires - chrono::Duration::seconds(300)).to_rfc3339()
}

fn refused_by_price_band(e: &Resp) -> String {
    assert_eq!(e.status, 422, "{:?}", e.body);
    assert_eq!(e.body["error"]["code"], "policy_violation", "{:?}", e.body);
    let detail = e.body["error"]["details"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .find(|d| d["field"] == "risk_checks/price_band")
                .cloned()
        })
        .unwrap_or_else(|| panic!("no price_band detail: {:?}", e.body));
    detail["message"].as_str().unwrap().to_string()
}

both!(a_market_order_is_planned_and_sent_as_a_protected_limit);
async fn a_market_order_is_planned_and_sent_as_a_protected_limit(b: Backend) {
    let s = Server::with_workers(b, &[]);
    s.cli(&["prices", "CLH27", "70.00"]);
    let t = s.trader();
    let buy = plan(&t, order("buy", "market", json!({}))).await;
    assert_eq!(buy["executable"], true, "{:?}", buy.body);
    let n = &buy.body["normalized_payload"];
    assert_eq!(n["order_type"], "limit", "{n}");
    assert_eq!(n["limit_price"], "70.50", "{n}");
    assert_eq!(
        n["market_protection"],
        json!({ "requested_type": "market", "from_price": "70.00", "points": "0.50" })
    );
    let preview = buy.body["preview"].as_str().unwrap();
    assert!(
        preview.contains("at market, protected: limit 70.50 (70.00 + 0.50)"),
        "{preview}"
    );
    assert_eq!(buy.check("price_band")["status"], "pass");
    // Sent as planned: the order Airlock and the broker hold is the protected limit.
    let e = t.execute(&buy, "protected-buy").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    assert_eq!(
        t.settled(e.body["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    let o = t
        .order(e.body["resource_refs"]["order_id"].as_str().unwrap())
        .await;
    assert_eq!(o["order_type"], "limit", "{o}");
    assert_eq!(o["limit_price"], "70.50", "{o}");
    let book = s.broker_book("ACC-1");
    let at_broker = &book["orders"][e.body["resource_refs"]["order_id"].as_str().unwrap()];
    assert_eq!(at_broker["order_type"], "limit", "{at_broker}");
    assert_eq!(at_broker["limit_price"], "70.50", "{at_broker}");

    // A sell is protected below the reference; a stop order from its stop price.
    let sell = plan(&t, order("sell", "market", json!({}))).await;
    assert_eq!(sell.body["normalized_payload"]["limit_price"], "69.50");
    let stop = plan(&t, order("buy", "stop", json!({ "stop_price": "72.00" }))).await;
    assert_eq!(stop["executable"], true, "{:?}", stop.body);
    let n = &stop.body["normalized_payload"];
    assert_eq!(n["order_type"], "stop_limit", "{n}");
    assert_eq!(
        (&n["stop_price"], &n["limit_price"]),
        (&json!("72.00"), &json!("72.50"))
    );
    assert_eq!(n["market_protection"]["requested_type"], "stop");

    // The policy's points, on the tick.
    set_policy(
        &s,
        json!({ "version": "wide-protection", "market_protection_points": "1.25" }),
    );
    let wide = plan(&t, order("sell", "market", json!({}))).await;
    assert_eq!(wide.body["normalized_payload"]["limit_price"], "68.75");
    assert_eq!(
        wide.body["normalized_payload"]["market_protection"]["points"],
        "1.25"
    );
}

both!(a_stale_reference_price_fails_the_band_at_plan_until_it_is_refreshed);
async fn a_stale_reference_price_fails_the_band_at_plan_until_it_is_refreshed(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    // The default age limit (the stack's own policy turns it off).
    set_policy(&s, json!({ "version": "defaults" }));
    let t = s.trader();
    // Observed ten minutes before the server's clock: older than the default 300 s.
    set_price_at(&s, "CLH27", "70.00", "2026-11-23T14:50:00Z");
    let limit = order("buy", "limit", json!({ "limit_price": "70.00" }));
    let p = plan(&t, limit.clone()).await;
    assert_eq!(p["executable"], false, "{:?}", p.body);
    let band = p.check("price_band");
    assert_eq!(band["status"], "fail");
    let reason = band["reason"].as_str().unwrap();
    let age: u64 = reason
        .split(" s old")
        .next()
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no age in {reason}"));
    assert!((600..=660).contains(&age), "{reason}");
    assert!(reason.contains("max_quote_age_seconds 300"), "{reason}");
    // A market order too: it would be protected from a stale price.
    assert_eq!(
        plan(&t, order("buy", "market", json!({})))
            .await
            .check("price_band")["status"],
        "fail"
    );
    // Refreshed, it passes.
    s.cli(&["prices", "CLH27", "70.00"]);
    let p = plan(&t, limit.clone()).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    // With the age limit off, an old price passes again.
    set_price_at(&s, "CLH27", "70.00", "2026-11-23T14:00:00Z");
    set_policy(
        &s,
        json!({ "version": "any-age", "max_quote_age_seconds": null }),
    );
    assert_eq!(plan(&t, limit).await["executable"], true);
}

both!(a_price_that_goes_stale_or_moves_after_the_plan_closes_it_at_execute);
async fn a_price_that_goes_stale_or_moves_after_the_plan_closes_it_at_execute(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    set_policy(
        &s,
        json!({ "version": "quick-quotes", "max_quote_age_seconds": 4 }),
    );
    let t = s.trader();
    set_price_at(&s, "CLH27", "70.00", &server_now(&t).await);
    let stale = plan(&t, order("buy", "limit", json!({ "limit_price": "70.00" }))).await;
    assert_eq!(stale["executable"], true, "{:?}", stale.body);
    // Moved: 20% of 55.00 is 11.00, and 70.00 is 15.00 away.
    let moved = plan(&t, order("buy", "limit", json!({ "limit_price": "70.00" }))).await;
    assert_eq!(moved["executable"], true, "{:?}", moved.body);
    set_price_at(&s, "CLH27", "55.00", &server_now(&t).await);
    let why = refused_by_price_band(&t.execute(&moved, "moved-1").await);
    assert!(why.contains("away from the reference price 55"), "{why}");
    // Back at 70.00, then not refreshed for five seconds: older than 4 s.
    set_price_at(&s, "CLH27", "70.00", &server_now(&t).await);
    std::thread::sleep(std::time::Duration::from_millis(5100));
    let why = refused_by_price_band(&t.execute(&stale, "stale-1").await);
    assert!(
        why.contains("s old, older than max_quote_age_seconds 4"),
        "{why}"
    );
    // Both plans are closed: a fresh price does not reopen them.
    s.cli(&["prices", "CLH27", "70.00"]);
    for (p, key) in [(&stale, "stale-2"), (&moved, "moved-2")] {
        t.execute(p, key)
            .await
            .assert_error(422, "plan_not_executable");
    }
    assert_eq!(t.position("ACC-1", "CLH27").await, 0);
}

both!(a_queued_order_whose_price_moved_or_went_stale_is_rejected_at_the_worker);
async fn a_queued_order_whose_price_moved_or_went_stale_is_rejected_at_the_worker(b: Backend) {
    // Workers off: two orders are queued at 15:00 with fresh prices, under the default age
    // limit (the stack's own policy turns it off; the control record's policy outlives a
    // restart).
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    set_policy(&s, json!({ "version": "defaults" }));
    let t = s.trader();
    s.cli(&["prices", "CLH27", "70.00"]);
    s.cli(&["prices", "CLJ27", "70.00"]);
    let queue = |symbol: &'static str, key: &'static str| {
        let t = &t;
        async move {
            let mut o = order("buy", "limit", json!({ "limit_price": "70.00" }));
            o["symbol"] = json!(symbol);
            let p = plan(t, o).await;
            assert_eq!(p["executable"], true, "{:?}", p.body);
            let e = t.execute(&p, key).await;
            assert_eq!(e.status, 202, "{:?}", e.body);
            e
        }
    };
    let moved = queue("CLH27", "worker-moved").await;
    let stale = queue("CLJ27", "worker-stale").await;
    // While they wait: CLH27 moves far (set fresh, as of 15:05), CLJ27 is left as it was.
    set_price_at(&s, "CLH27", "50.00", "2026-11-23T15:05:00Z");
    // The workers start at 15:06: CLJ27's price is six minutes old.
    let s = s.crash().start(&[
        ("AIRLOCK_NOW", "2026-11-23T15:06:00Z"),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    let t = s.trader();
    for (e, what) in [
        (&moved, "away from the reference price 50"),
        (&stale, "older than max_quote_age_seconds 300"),
    ] {
        let a = t.settled(e.body["action_id"].as_str().unwrap()).await;
        assert_eq!(a["status"], "failed", "{:?}", a.body);
        let error = a["error"].as_str().unwrap();
        assert!(
            error.starts_with("policy_violation: price_band: "),
            "{error}"
        );
        assert!(error.contains(what), "{error}");
        let o = t
            .order(e.body["resource_refs"]["order_id"].as_str().unwrap())
            .await;
        assert_eq!(o["status"], "rejected", "{o}");
    }
    // Nothing reached the broker.
    let book = s.broker_book("ACC-1");
    assert!(
        book["orders"].as_object().is_none_or(|o| o.is_empty()),
        "{book}"
    );
}
