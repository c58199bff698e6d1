//! The daily loss limit, on both backends: an account whose loss on the CME trading day
//! (realized by its fills plus unrealized at reference prices) reaches `max_daily_loss` is
//! close-only: plans that add exposure fail `daily_loss`, reductions pass, a plan made
//! before the loss is refused at execute, and an order queued before a fill crossed the
//! limit is rejected by the worker before the broker; at 17:00 CT the next trading day
//! starts afresh; `GET /portfolio` shows the figures.
//!
//! The demo book at [`MARKET_OPEN`] (09:00 CT, Monday 2026-11-23): ACC-1 +3 CLF27 at 68.40
//! (reference 68.40) and -2 CLG27 at 67.95 (reference 68.28: -660.00 unrealized). The
//! paper broker fills a market order at the reference price.

use airlock_tests::{both, column, Api, Backend, Resp, Stack, MARKET_OPEN};
use serde_json::{json, Value};

/// A stack whose policy confirms with the plan's token and sets `max_daily_loss`; prices
/// of any age pass (these tests move the clock by hours).
fn stack(b: Backend, limit: &str) -> Stack {
    let stack = Stack::new(b);
    let policy = json!({
        "confirmation": { "order.submit.cl": "token", "order.replace.cl": "token" },
        "max_daily_loss": limit,
        "max_quote_age_seconds": null,
    });
    std::fs::write(stack.state_dir.join("policy.json"), policy.to_string()).expect("policy");
    stack
}

fn env(now: &str, workers: bool) -> Vec<(&str, &str)> {
    let mut e = vec![("AIRLOCK_NOW", now)];
    if workers {
        e.extend([
            ("AIRLOCK_WORKERS", "on"),
            ("AIRLOCK_WORKER_RETRY_MS", "100"),
            ("AIRLOCK_WORKER_VISIBILITY_MS", "1000"),
        ]);
    }
    e
}

fn order(symbol: &str, side: &str, qty: u32) -> Value {
    json!({"account_id": "ACC-1", "symbol": symbol, "side": side, "quantity": qty,
           "order_type": "market"})
}

async fn plan(t: &Api, payload: Value) -> Resp {
    let p = t
        .post(
            "/actions/plan",
            &json!({"action_type": "order.submit.cl", "payload": payload,
                    "requested_by": "op-energy-trader"}),
        )
        .await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    p
}

/// Plans, executes and waits for the order to settle `succeeded`.
async fn trade(t: &Api, payload: Value, key: &str) -> Resp {
    let p = plan(t, payload).await;
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
    let e = t.execute(&p, key).await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let a = t.settled(e["action_id"].as_str().unwrap()).await;
    assert_eq!(a["status"], "succeeded", "{:?}", a.body);
    e
}

async fn day_pnl(t: &Api) -> Value {
    let r = t.get("/portfolio?account_id=ACC-1").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    airlock_tests::contract::check("getPortfolio", r.status, &r.body);
    r.body["day_pnl"].clone()
}

fn figures(d: &Value) -> [&str; 5] {
    [
        d["realized"].as_str().unwrap(),
        d["unrealized"].as_str().unwrap(),
        d["total"].as_str().unwrap(),
        d["remaining"].as_str().unwrap(),
        if d["close_only"] == true {
            "close_only"
        } else {
            "open"
        },
    ]
}

both!(a_loss_past_the_limit_blocks_what_adds_exposure_and_passes_reductions);
async fn a_loss_past_the_limit_blocks_what_adds_exposure_and_passes_reductions(b: Backend) {
    let s = stack(b, "10000").start(&env(MARKET_OPEN, true));
    let t = s.trader();
    let d = day_pnl(&t).await;
    assert_eq!(d["trading_day"], "2026-11-23");
    assert_eq!(d["max_daily_loss"], "10000.00");
    assert_eq!(d["unpriced"], json!([]));
    assert_eq!(
        figures(&d),
        ["0.00", "-660.00", "-660.00", "9340.00", "open"]
    );

    // CLF27 falls 3.00: 3 x 1,000 x -3.00 = -9,000 unrealized.
    s.cli(&["prices", "CLF27", "65.40"]);
    // Selling 1 realizes its share (-3,000); the total stays.
    trade(&t, order("CLF27", "sell", 1), "dl-sell-1").await;
    assert_eq!(
        figures(&day_pnl(&t).await),
        ["-3000.00", "-6660.00", "-9660.00", "340.00", "open"]
    );
    // A plan made while the budget lasts...
    let early = plan(&t, order("CLF27", "buy", 1)).await;
    assert_eq!(early["executable"], true, "{:?}", early.body);
    assert_eq!(early.check("daily_loss")["status"], "pass");

    // ...then CLF27 falls to 65.00: 2 x 1,000 x -3.40 = -6,800; the day is -10,460.
    s.cli(&["prices", "CLF27", "65.00"]);
    assert_eq!(
        figures(&day_pnl(&t).await),
        ["-3000.00", "-7460.00", "-10460.00", "0.00", "close_only"]
    );
    // Adding fails with the P&L and the limit: a buy on the long, a sell that would flip
    // it, a sell that adds to the short in another month.
    for (symbol, side, qty) in [
        ("CLF27", "buy", 1),
        ("CLF27", "sell", 3),
        ("CLG27", "sell", 1),
    ] {
        let p = plan(&t, order(symbol, side, qty)).await;
        assert_eq!(p["executable"], false, "{side} {qty} {symbol}");
        let c = p.check("daily_loss");
        assert_eq!(c["status"], "fail", "{side} {qty} {symbol}: {c}");
        let why = c["reason"].as_str().unwrap();
        assert!(
            why.contains("P&L -10,460.00 USD on trading day 2026-11-23")
                && why.contains("realized -3,000.00, unrealized -7,460.00")
                && why.contains("daily loss limit of 10,000.00 USD"),
            "{why}"
        );
    }
    // The plan made before is refused at execute, naming the check.
    let e = t.execute(&early, "dl-early").await;
    assert_eq!(e.status, 422, "{:?}", e.body);
    assert_eq!(e.body["error"]["code"], "policy_violation", "{:?}", e.body);
    let fields = column(&e.body["error"]["details"], "field");
    assert!(fields.contains(&"risk_checks/daily_loss"), "{fields:?}");
    // Reductions pass: buying back one of the short, selling the long down to flat.
    let p = plan(&t, order("CLG27", "buy", 1)).await;
    assert_eq!(p.check("daily_loss")["status"], "pass", "{:?}", p.body);
    trade(&t, order("CLF27", "sell", 2), "dl-sell-2").await;
    assert_eq!(t.position("ACC-1", "CLF27").await, 0);
    // 2 x 1,000 x (65.00 - 68.40) more realized: -9,800; still close-only.
    assert_eq!(
        figures(&day_pnl(&t).await),
        ["-9800.00", "-660.00", "-10460.00", "0.00", "close_only"]
    );
}

both!(a_fill_while_an_order_is_queued_crosses_the_limit_and_the_worker_stops_it);
async fn a_fill_while_an_order_is_queued_crosses_the_limit_and_the_worker_stops_it(b: Backend) {
    // A stop buy of 7 CLF27 rests at the broker.
    let s = stack(b, "8000").start(&env(MARKET_OPEN, true));
    let t = s.trader();
    let stop = json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 7,
                      "order_type": "stop", "stop_price": "70.00", "time_in_force": "gtc"});
    let resting = trade(&t, stop, "dl-stop").await;
    let resting_id = resting["resource_refs"]["order_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Workers off: a buy (adds) and a sell (reduces) pass plan and execute and wait.
    let s = s.crash().start(&env(MARKET_OPEN, false));
    let t = s.trader();
    let mut queued = Vec::new();
    for (side, key) in [("buy", "dl-q-buy"), ("sell", "dl-q-sell")] {
        let p = plan(&t, order("CLF27", side, 1)).await;
        assert_eq!(p["executable"], true, "{:?}", p.body);
        let e = t.execute(&p, key).await;
        assert_eq!(e.status, 202, "{:?}", e.body);
        queued.push(e);
    }
    // The resting order fills at 69.50: +7, so +10 at 69.17 against 68.40 is -7,700, and
    // the day is -8,360, past the limit of 8,000.
    s.broker_fill("ACC-1", &resting_id, 7, Some("69.50"));
    let d = day_pnl(&t).await;
    assert_eq!(
        figures(&d),
        ["0.00", "-8360.00", "-8360.00", "0.00", "close_only"]
    );
    // Workers on: the buy is rejected before the broker, the sell goes.
    let s = s.crash().start(&env(MARKET_OPEN, true));
    let t = s.trader();
    let buy = t.settled(queued[0]["action_id"].as_str().unwrap()).await;
    assert_eq!(buy["status"], "failed", "{:?}", buy.body);
    let why = buy["error"].as_str().unwrap();
    assert!(
        why.starts_with("policy_violation: daily_loss: ")
            && why.contains("P&L -8,360.00 USD")
            && why.contains("limit of 8,000.00 USD")
            && why.contains("was not sent to the broker"),
        "{why}"
    );
    let buy_id = queued[0]["resource_refs"]["order_id"].as_str().unwrap();
    assert_eq!(t.order(buy_id).await["status"], "rejected");
    let book = s.broker_book("ACC-1");
    assert!(
        book["orders"].get(buy_id).is_none(),
        "the rejected buy never reached the broker: {book}"
    );
    let sell = t.settled(queued[1]["action_id"].as_str().unwrap()).await;
    assert_eq!(sell["status"], "succeeded", "{:?}", sell.body);
    assert_eq!(t.position("ACC-1", "CLF27").await, 9);
    // The sell realized 1 x 1,000 x (68.40 - 69.17); the total is unchanged.
    assert_eq!(
        figures(&day_pnl(&t).await),
        ["-770.00", "-7590.00", "-8360.00", "0.00", "close_only"]
    );
}

both!(a_loss_before_the_close_does_not_count_the_next_trading_day);
async fn a_loss_before_the_close_does_not_count_the_next_trading_day(b: Backend) {
    // 15:00 CT on Monday 2026-11-23: an hour before the close.
    let s = stack(b, "5000").start(&env("2026-11-23T21:00:00Z", true));
    let t = s.trader();
    // CLG27 at its average (no unrealized); CLF27 sold 3.00 below it: -9,000 realized.
    s.cli(&["prices", "CLG27", "67.95"]);
    s.cli(&["prices", "CLF27", "65.40"]);
    trade(&t, order("CLF27", "sell", 3), "dl-day-sell").await;
    let d = day_pnl(&t).await;
    assert_eq!(d["trading_day"], "2026-11-23");
    assert_eq!(
        figures(&d),
        ["-9000.00", "0.00", "-9000.00", "0.00", "close_only"]
    );
    let p = plan(&t, order("CLF27", "buy", 1)).await;
    assert_eq!(p.check("daily_loss")["status"], "fail", "{:?}", p.body);
    // 17:30 CT the same evening: Tuesday's trading day, which starts afresh.
    let s = s.crash().start(&env("2026-11-23T23:30:00Z", true));
    let t = s.trader();
    let d = day_pnl(&t).await;
    assert_eq!(d["trading_day"], "2026-11-24");
    assert_eq!(figures(&d), ["0.00", "0.00", "0.00", "5000.00", "open"]);
    let p = plan(&t, order("CLF27", "buy", 1)).await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    let c = p.check("daily_loss");
    assert_eq!(c["status"], "pass");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("on trading day 2026-11-24"),
        "{c}"
    );
}
