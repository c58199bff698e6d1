//! The portfolio endpoints on both backends, with golden figures computed by hand from the
//! demo book at the market open of 2026-11-23 (reference prices: CLF27 68.40, CLG27 68.28,
//! CLH27 68.16; ACC-1 +3 CLF27 at 68.40 and -2 CLG27 at 67.95; ACC-2 +10 CLF27 at 70.12;
//! ACC-3, metals desk, +5 CLH27 at 66.10), and at 2026-12-14, five business days before
//! CLF27's last trading day (2026-12-21).

use airlock_tests::{both, column, contract, Api, Backend, Server, MARKET_OPEN};
use serde_json::{json, Value};

async fn get(t: &Api, path: &str, op: &str) -> Value {
    let r = t.get(path).await;
    assert_eq!(r.status, 200, "{path}: {:?}", r.body);
    contract::check(op, r.status, &r.body);
    r.body
}

both!(an_account_is_valued_exactly);
async fn an_account_is_valued_exactly(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let p = get(&t, "/portfolio?account_id=ACC-1", "getPortfolio").await;
    assert_eq!(p["account_id"], "ACC-1");
    assert_eq!(p["price_source"], "paper broker reference prices");
    assert!(p["as_of"].as_str().unwrap().starts_with("2026-11-23T15:00"));
    let rows: Vec<Value> = p["positions"].as_array().unwrap().clone();
    assert_eq!(
        rows,
        vec![
            json!({"account_id": "ACC-1", "symbol": "CLF27", "contract_month": "2027-01",
                   "quantity": 3, "avg_price": "68.40", "reference_price": "68.40",
                   "notional": "205200.00", "unrealized_pnl": "0.00"}),
            json!({"account_id": "ACC-1", "symbol": "CLG27", "contract_month": "2027-02",
                   "quantity": -2, "avg_price": "67.95", "reference_price": "68.28",
                   "notional": "-136560.00", "unrealized_pnl": "-660.00"}),
        ]
    );
    assert_eq!(
        p["totals"],
        json!({"gross_notional": "341760.00", "net_notional": "68640.00", "net_contracts": 1,
               "unrealized_pnl": "-660.00", "unpriced_positions": 0})
    );

    // Allocation of one account, then of every account the trader sees (energy desk).
    let a = get(
        &t,
        "/portfolio/allocation?account_id=ACC-1",
        "getAllocation",
    )
    .await;
    let pct = |v: &Value, k: &str| -> Vec<(String, String)> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["key"].as_str().unwrap().to_string(),
                    s["percent"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(
        pct(&a, "by_contract_month"),
        [pair("2027-01", "60.04"), pair("2027-02", "39.96")]
    );
    assert_eq!(
        pct(&a, "by_side"),
        [pair("long", "60.04"), pair("short", "39.96")]
    );
    assert_eq!(pct(&a, "by_desk"), [pair("energy", "100.00")]);
    let all = get(&t, "/portfolio/allocation", "getAllocation").await;
    assert_eq!(all["account_id"], Value::Null);
    assert_eq!(all["gross_notional"], "1025760.00");
    assert_eq!(
        pct(&all, "by_contract_month"),
        [pair("2027-01", "86.69"), pair("2027-02", "13.31")]
    );
    // The head trader sees every desk.
    let head = t.with_tokens(
        &t.service,
        &s.operator_token("op-head-trader", "head_trader", None),
    );
    let all = get(&head, "/portfolio/allocation", "getAllocation").await;
    assert_eq!(all["gross_notional"], "1366560.00");
    assert_eq!(
        pct(&all, "by_contract_month"),
        [
            pair("2027-01", "65.07"),
            pair("2027-02", "9.99"),
            pair("2027-03", "24.94")
        ]
    );
    assert_eq!(
        pct(&all, "by_desk"),
        [pair("energy", "75.06"), pair("metals", "24.94")]
    );

    // Flags: both months above 25 % (a two-month book), nothing near the limit of 50, no
    // delivery problem 19 business days out.
    let f = get(&t, "/portfolio/risk-flags?account_id=ACC-1", "getRiskFlags").await;
    let kinds: Vec<(&str, &str, &str)> = f["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["type"].as_str().unwrap(),
                f["severity"].as_str().unwrap(),
                f["figures"]["percent"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("concentration", "warn", "60.04"),
            ("concentration", "warn", "39.96")
        ]
    );
    assert_eq!(
        f["calendar_exposure"],
        json!({"long_contracts": 3, "short_contracts": 2,
               "net_by_contract_month": {"2027-01": 3, "2027-02": -2}})
    );
    assert_eq!(f["trade_date"], "2026-11-23");

    // The desk filter: another desk's account is not found, whatever the endpoint.
    for path in [
        "/portfolio?account_id=ACC-3",
        "/portfolio/allocation?account_id=ACC-3",
        "/portfolio/risk-flags?account_id=ACC-3",
    ] {
        let r = t.get(path).await;
        assert_eq!((r.status, r.code()), (404, "account_not_found"), "{path}");
    }
    // `account_id` is required where the document says so.
    let r = t.get("/portfolio").await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"));
    contract::check("getPortfolio", r.status, &r.body);
}

both!(thresholds_come_from_the_policy_and_delivery_fails);
async fn thresholds_come_from_the_policy_and_delivery_fails(b: Backend) {
    // Five business days before CLF27's last trading day: its positions are a delivery
    // problem (fail); ACC-2's 10 contracts are 20 % of the limit.
    let s = Server::start_on(b, &[("AIRLOCK_NOW", "2026-12-14T15:00:00Z")]);
    let t = s.trader();
    let f = get(&t, "/portfolio/risk-flags?account_id=ACC-2", "getRiskFlags").await;
    let flags = f["flags"].as_array().unwrap();
    assert_eq!(flags.len(), 1, "{f}");
    assert_eq!(flags[0]["type"], "delivery");
    assert_eq!(flags[0]["severity"], "fail");
    assert_eq!(flags[0]["figures"]["business_days_left"], "5");
    assert_eq!(flags[0]["figures"]["last_trade_date"], "2026-12-21");
    // A stricter policy: above 15 % of the limit is near it, and a single-month book is
    // flagged as concentrated.
    let dir = s.state_dir.join("strict.json");
    std::fs::write(
        &dir,
        json!({"confirmation": {"order.submit.cl": "token"}, "version": "strict-1",
               "near_limit_warn_pct": "15", "flag_single_month_book": true})
        .to_string(),
    )
    .unwrap();
    s.cli(&["policy", "set", dir.to_str().unwrap()]);
    let f = get(&t, "/portfolio/risk-flags?account_id=ACC-2", "getRiskFlags").await;
    let kinds = column(&f["flags"], "type");
    assert_eq!(kinds, ["concentration", "near_limit", "delivery"], "{f}");
    assert_eq!(f["policy_version"], "strict-1");
    assert_eq!(f["flags"][1]["figures"]["percent"], "20");
}

both!(an_order_plan_reports_what_it_does_to_the_book);
async fn an_order_plan_reports_what_it_does_to_the_book(b: Backend) {
    // ACC-1's book at the open: CLF27 205,200 (60.04 %), CLG27 -136,560 (39.96 %), both
    // flagged as concentrated. Each plan's `concentration` check says, by hand:
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let check = |p: &airlock_tests::Resp| -> (String, String, bool) {
        assert_eq!(p.status, 200, "{:?}", p.body);
        contract::check("planAction", p.status, &p.body);
        let c = p.check("concentration");
        (
            c["status"].as_str().unwrap().to_string(),
            c["reason"].as_str().unwrap().to_string(),
            p.body["executable"].as_bool().unwrap(),
        )
    };
    // Buy 2 CLF27: 342,000 of 478,560 = 71.46 %: the 2027-01 flag deepens (warn); a warning
    // does not stop the plan.
    let (status, reason, executable) = check(&t.plan_buy("CLF27", 2).await);
    assert_eq!(status, "warn", "{reason}");
    assert!(executable);
    assert!(
        reason.starts_with("after the order 2027-01 would hold 71.46% of the account's gross notional; deepens concentration (2027-01 holds 71.46%"),
        "{reason}"
    );
    // Buy 4 CLH27 at 68.16: 272,640 of 614,400 = 44.37 %: a new flag on 2027-03, and
    // 2027-02 falls to 22.23 %, under 25 %: its flag clears.
    let (status, reason, _) = check(&t.plan_buy("CLH27", 4).await);
    assert_eq!(status, "warn", "{reason}");
    assert!(reason.contains("would hold 44.37%"), "{reason}");
    assert!(
        reason.contains("creates concentration (2027-03 holds 44.37%"),
        "{reason}"
    );
    assert!(
        reason.contains("clears concentration (2027-02 holds 39.96%"),
        "{reason}"
    );
    assert!(!reason.contains("deepens"), "{reason}");
    // Buy 2 CLG27 closes the short: a one-month book, not flagged by default; both flags
    // clear and the check passes.
    let (status, reason, _) = check(&t.plan_buy("CLG27", 2).await);
    assert_eq!(status, "pass", "{reason}");
    assert!(
        reason.starts_with("after the order the account would hold no 2027-02 notional; clears concentration (2027-01"),
        "{reason}"
    );
    assert!(
        reason.ends_with("no risk flag created or made worse"),
        "{reason}"
    );
    // Planning changed nothing: the flags are the book's, not the plans'.
    let f = get(&t, "/portfolio/risk-flags?account_id=ACC-1", "getRiskFlags").await;
    assert_eq!(f["flags"].as_array().unwrap().len(), 2, "{f}");
}
