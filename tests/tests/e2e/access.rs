//! The access-control matrix: every endpoint crossed with every kind of caller. Each cell
//! asserts the exact status and code, and that a denial wrote nothing.

use airlock_tests::{cli, column, forge, Api, Server, MARKET_OPEN};
use serde_json::{json, Value};

/// Rows that a denial must not add to (audit is checked separately: rejected executes are
/// audited by design).
fn writes(s: &Server) -> Vec<i64> {
    let db = s.db();
    ["plans", "actions", "idempotency_keys", "queue"]
        .iter()
        .map(|t| {
            db.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get(0))
                .unwrap()
        })
        .collect()
}

fn audit_rows(s: &Server) -> i64 {
    s.db()
        .query_row("SELECT COUNT(*) FROM audit", [], |r| r.get(0))
        .unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ep {
    Accounts,
    Positions,
    Orders,
    Jobs,
    Action,
    Plan,
    Execute,
}

const ENDPOINTS: [Ep; 7] = [
    Ep::Accounts,
    Ep::Positions,
    Ep::Orders,
    Ep::Jobs,
    Ep::Action,
    Ep::Plan,
    Ep::Execute,
];

#[tokio::test]
async fn every_endpoint_against_every_caller() {
    let s = Server::start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let dir = s.state_dir.clone();
    let now = vec![("AIRLOCK_NOW".to_string(), MARKET_OPEN.to_string())];
    let env = |extra: &[(&str, &str)]| {
        let mut e = now.clone();
        e.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        e
    };
    let service = s.service_token();
    let op = |sub: &str, roles: &str, desks: Option<&str>| s.operator_token(sub, roles, desks);
    let trader_op = op("op-energy-trader", "trader", Some("energy"));
    let trader = s.trader();

    // An action on ACC-1 and a fresh executable plan of the energy trader.
    let first = trader.plan_buy("CLF27", 1).await;
    let action = trader.execute(&first, "matrix-setup").await;
    assert_eq!(action.status, 202);
    let action_id = action["action_id"].as_str().unwrap().to_string();
    let plan = trader.plan_buy("CLF27", 1).await;
    assert_eq!(plan["executable"], true);

    let claims = forge::claims(&service);
    let kid = forge::header(&service)["kid"].as_str().unwrap().to_string();
    let pem = forge::public_pem_of(&dir.join("dev-issuer-key.pem"));
    let past = env(&[("AIRLOCK_NOW", "2026-11-23T12:00:00Z")]);
    let callers: Vec<(&str, String, String)> = vec![
        ("no token", String::new(), String::new()),
        (
            "expired",
            cli(&dir, &past, &["token", "service", "--ttl", "60"]),
            trader_op.clone(),
        ),
        (
            "wrong audience",
            cli(
                &dir,
                &env(&[("AIRLOCK_SERVICE_AUDIENCE", "someone-else")]),
                &["token", "service"],
            ),
            trader_op.clone(),
        ),
        (
            "wrong issuer",
            cli(
                &dir,
                &env(&[("AIRLOCK_SERVICE_ISSUER", "evil-idp")]),
                &["token", "service"],
            ),
            trader_op.clone(),
        ),
        ("alg none", forge::alg_none(&claims), trader_op.clone()),
        (
            "HS256 with the public key",
            forge::hs256(&claims, Some(&kid), pem.as_bytes()),
            trader_op.clone(),
        ),
        (
            "missing scope",
            cli(&dir, &now, &["token", "service", "--scopes", "trade.read"]),
            trader_op.clone(),
        ),
        (
            "viewer",
            service.clone(),
            op("op-viewer", "viewer", Some("energy")),
        ),
        (
            "trader of another desk",
            service.clone(),
            op("op-metals-trader", "trader", Some("metals")),
        ),
        (
            "trader of the right desk",
            service.clone(),
            trader_op.clone(),
        ),
        (
            "head trader",
            service.clone(),
            op("op-head-trader", "head_trader", None),
        ),
    ];

    for (who, svc, oper) in &callers {
        let api = Api {
            service: svc.clone(),
            operator: oper.clone(),
            ..trader.clone()
        };
        let sub = if oper.is_empty() {
            "nobody".to_string()
        } else {
            forge::claims(oper)["sub"].as_str().unwrap().to_string()
        };
        for ep in ENDPOINTS {
            let before = (writes(&s), audit_rows(&s));
            let key = format!("matrix-{}-{:?}", who.replace(' ', "-"), ep);
            let r = match ep {
                Ep::Accounts => api.get("/accounts").await,
                Ep::Positions => api.get("/positions?account_id=ACC-1").await,
                Ep::Orders => api.get("/orders?account_id=ACC-1").await,
                Ep::Jobs => api.get("/jobs").await,
                Ep::Action => api.get(&format!("/actions/{action_id}")).await,
                Ep::Plan => {
                    api.post("/actions/plan", &json!({"action_type": "positions.sync", "payload": {"account_id": "ACC-1"}, "requested_by": sub}))
                        .await
                }
                Ep::Execute => {
                    api.post(
                        "/actions/execute",
                        &json!({"plan_id": plan["plan_id"], "confirmation_token": plan["confirmation_token"], "idempotency_key": key, "requested_by": sub}),
                    )
                    .await
                }
            };
            let expected: (u16, &str) = match (*who, ep) {
                (
                    "no token"
                    | "expired"
                    | "wrong audience"
                    | "wrong issuer"
                    | "alg none"
                    | "HS256 with the public key",
                    _,
                ) => (401, "unauthenticated"),
                ("missing scope", Ep::Plan | Ep::Execute) => (403, "insufficient_scope"),
                ("missing scope", _) => (200, ""),
                ("viewer", Ep::Plan | Ep::Execute) => (403, "insufficient_scope"),
                ("viewer", _) => (200, ""),
                ("trader of another desk", Ep::Positions | Ep::Orders | Ep::Plan) => {
                    (404, "account_not_found")
                }
                ("trader of another desk", Ep::Action) => (404, "action_not_found"),
                // The token names the energy trader: another operator cannot use it.
                ("trader of another desk" | "head trader", Ep::Execute) => (422, "token_invalid"),
                ("trader of the right desk", Ep::Execute) => (202, ""),
                _ => (200, ""),
            };
            assert_eq!(
                (r.status, r.code()),
                expected,
                "{who} on {ep:?}: {:?}",
                r.body
            );
            let after = (writes(&s), audit_rows(&s));
            if r.status >= 400 {
                assert_eq!(after.0, before.0, "{who} on {ep:?} wrote something");
                let audited = if ep == Ep::Execute && r.status == 422 {
                    1
                } else {
                    0
                };
                assert_eq!(after.1, before.1 + audited, "{who} on {ep:?}: audit rows");
            }
            // Listings never show the metals account to the energy desk, nor energy rows
            // to the metals trader.
            if ep == Ep::Accounts && r.status == 200 {
                let ids = column(&r.body["accounts"], "account_id");
                let expect: &[&str] = match *who {
                    "trader of another desk" => &["ACC-3"],
                    "head trader" => &["ACC-1", "ACC-2", "ACC-3", "ACC-4"],
                    _ => &["ACC-1", "ACC-2", "ACC-4"],
                };
                assert_eq!(ids, expect, "{who}");
            }
            if ep == Ep::Jobs && *who == "trader of another desk" {
                let accounts: Vec<&Value> = r.body["jobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|j| &j["account_id"])
                    .collect();
                assert!(
                    accounts.iter().all(|a| a.is_null() || *a == "ACC-3"),
                    "{accounts:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_configured_role_table_replaces_the_default() {
    let roles = "viewer: read\nanalyst: inherits viewer, plan\ntrader: inherits analyst, execute\nhead_trader: inherits trader, approve, all_desks\nadmin: inherits head_trader, admin";
    let s = Server::start(&[("AIRLOCK_NOW", MARKET_OPEN), ("AIRLOCK_ROLES", roles)]);
    let analyst = Api {
        operator: s.operator_token("op-analyst", "analyst", Some("energy")),
        ..s.trader()
    };
    let p = analyst
        .post("/actions/plan", &json!({"action_type": "positions.sync", "payload": {"account_id": "ACC-1"}, "requested_by": "op-analyst"}))
        .await;
    assert_eq!(p.status, 200, "an analyst plans: {:?}", p.body);
    let e = analyst
        .post("/actions/execute", &json!({"plan_id": p["plan_id"], "confirmation_token": p["confirmation_token"], "idempotency_key": "an-1", "requested_by": "op-analyst"}))
        .await;
    assert_eq!(
        (e.status, e.code()),
        (403, "insufficient_scope"),
        "but does not execute"
    );
}
