//! The read API over real HTTP: endpoints, pagination, cursors, limits, unknown
//! parameters, desk visibility, authentication failures and bad input.

use std::collections::HashSet;

use airlock_tests::{both, cli, column, forge, Api, Backend, Server};
use serde_json::{json, Value};

fn ids(v: &Value, list: &str, id: &str) -> Vec<String> {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list} missing in {v}"))
        .iter()
        .map(|r| r[id].as_str().unwrap().to_string())
        .collect()
}

both!(health_needs_no_auth_and_every_response_has_a_request_id);
async fn health_needs_no_auth_and_every_response_has_a_request_id(b: Backend) {
    let s = Server::start_on(b, &[]);
    let r = reqwest::get(format!("{}/health", s.base)).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-request-id"));
    let anon = Api::new(&s, String::new(), String::new());
    for path in ["/accounts", "/nope", "/actions/act_x"] {
        let r = anon.get(path).await;
        assert!(r.status >= 400, "{path}: {r:?}");
        let rid = r.request_id.clone().expect("x-request-id header");
        assert_eq!(
            r.body["request_id"],
            json!(rid),
            "body request_id matches the header"
        );
    }
    let t = s.trader();
    let r = t.get("/accounts").await;
    assert_eq!(r.status, 200);
    assert!(r.request_id.unwrap().starts_with("req_"));
    // Unknown paths and methods get the contract's error body too.
    let r = t.get("/no-such-thing").await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    let r = t.post("/accounts", &json!({})).await;
    assert_eq!((r.status, r.code()), (405, "method_not_allowed"));
}

both!(reads_are_filtered_by_desk_and_hidden_accounts_look_missing);
async fn reads_are_filtered_by_desk_and_hidden_accounts_look_missing(b: Backend) {
    let s = Server::start_on(b, &[]);
    let t = s.trader();
    let r = t.get("/accounts").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        ids(&r.body, "accounts", "account_id"),
        ["ACC-1", "ACC-2", "ACC-4"]
    );
    assert_eq!(r.body["next_cursor"], Value::Null);
    let a = &r.body["accounts"][0];
    for f in ["account_id", "name", "desk", "currency", "status"] {
        assert!(a.get(f).is_some(), "account field {f}");
    }

    let head = t.with_tokens(
        &s.service_token(),
        &s.operator_token("op-head-trader", "head_trader", None),
    );
    let r = head.get("/accounts").await;
    assert_eq!(
        ids(&r.body, "accounts", "account_id"),
        ["ACC-1", "ACC-2", "ACC-3", "ACC-4"]
    );

    // The metals account: same 404 as a missing one.
    let hidden = t.get("/positions?account_id=ACC-3").await;
    let missing = t.get("/positions?account_id=ACC-999").await;
    assert_eq!((hidden.status, hidden.code()), (404, "account_not_found"));
    assert_eq!((missing.status, missing.code()), (404, "account_not_found"));
    let r = t.get("/orders?account_id=ACC-3").await;
    assert_eq!(r.code(), "account_not_found");

    // No metals rows leak through unfiltered listings.
    let r = t.get("/positions").await;
    assert!(r.body["positions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["account_id"] != "ACC-3"));
    assert!(!r.body["positions"].as_array().unwrap().is_empty());
    let p = &r.body["positions"][0];
    assert!(
        p["avg_price"].is_string(),
        "prices are decimal strings: {p}"
    );
    let r = t.get("/orders?limit=200").await;
    assert!(!column(&r.body["orders"], "account_id").contains(&"ACC-3"));
    let statuses: HashSet<&str> = column(&r.body["orders"], "status").into_iter().collect();
    for st in [
        "filled",
        "working",
        "partially_filled",
        "cancelled",
        "rejected",
    ] {
        assert!(statuses.contains(st), "seeded order states include {st}");
    }
    let r = head.get("/orders?account_id=ACC-3").await;
    assert_eq!(ids(&r.body, "orders", "order_id"), ["ORD-1007"]);

    let r = t.get("/orders?status=working").await;
    assert_eq!(ids(&r.body, "orders", "order_id"), ["ORD-1003"]);
    let r = t.get("/jobs").await;
    assert_eq!(r.status, 200);
    let jobs = r.body["jobs"].as_array().unwrap();
    let st: HashSet<&str> = jobs.iter().map(|j| j["status"].as_str().unwrap()).collect();
    assert!(
        st.contains("succeeded") && st.contains("failed"),
        "{jobs:?}"
    );
    let failed = jobs.iter().find(|j| j["status"] == "failed").unwrap();
    assert!(failed["error"].as_str().unwrap().contains("timed out"));
    let r = t.get("/jobs?kind=positions.sync&status=failed").await;
    assert_eq!(ids(&r.body, "jobs", "job_id"), ["JOB-2002"]);

    let r = t.get("/actions/act_doesnotexist").await;
    assert_eq!((r.status, r.code()), (404, "action_not_found"));
}

both!(pagination_walks_every_row_once_and_cursors_cannot_be_forged);
async fn pagination_walks_every_row_once_and_cursors_cannot_be_forged(b: Backend) {
    let s = Server::start_on(b, &[]);
    s.cli(&["seed-orders", "600"]);
    let t = s.trader();
    // Bulk order i goes to ACC-1, ACC-2, ACC-3 in turn; ACC-3 is on the metals desk. The
    // demo data adds 6 energy orders.
    let visible: i64 = 600 - 200 + 6;

    // Forward to the end with a small page.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/orders?limit=7".to_string(),
            Some(c) => format!("/orders?limit=7&cursor={c}"),
        };
        let r = t.get(&path).await;
        assert_eq!(r.status, 200, "{r:?}");
        let page = ids(&r.body, "orders", "order_id");
        assert!(page.len() <= 7);
        seen.extend(page);
        pages += 1;
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen.len() as i64, visible, "no row lost");
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no row repeated");
    assert_eq!(pages as i64, (visible + 6) / 7);
    // And back, with the largest page: the same rows in the same order.
    let mut again = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/orders?limit=200".to_string(),
            Some(c) => format!("/orders?limit=200&cursor={c}"),
        };
        let r = t.get(&path).await;
        again.extend(ids(&r.body, "orders", "order_id"));
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(again, seen);

    // Forged and foreign cursors.
    let first = t.get("/orders?limit=3").await;
    let c = first.body["next_cursor"].as_str().unwrap().to_string();
    let (payload, mac) = c.split_once('.').unwrap();
    let mut claims: Value = serde_json::from_slice(&base64_decode(payload)).unwrap();
    claims[0] = json!(claims[0].as_i64().unwrap() + 1);
    let edited = format!("{}.{mac}", forge::b64(claims.to_string().as_bytes()));
    for bad in [
        edited.as_str(),
        &c[..c.len() - 2],
        "garbage",
        "e30.AAAAAAAAAAAAAAAAAAAAAA",
    ] {
        let r = t.get(&format!("/orders?limit=3&cursor={bad}")).await;
        assert_eq!((r.status, r.code()), (400, "invalid_cursor"), "{bad}");
    }
    // Another query's cursor: other endpoint, other filter, other operator.
    let r = t.get(&format!("/accounts?cursor={c}")).await;
    assert_eq!(r.code(), "invalid_cursor");
    let r = t
        .get(&format!("/orders?status=filled&limit=3&cursor={c}"))
        .await;
    assert_eq!(r.code(), "invalid_cursor");
    let head = t.with_tokens(
        &s.service_token(),
        &s.operator_token("op-head-trader", "head_trader", None),
    );
    let r = head.get(&format!("/orders?limit=3&cursor={c}")).await;
    assert_eq!(r.code(), "invalid_cursor");
    // The genuine cursor still works.
    let r = t.get(&format!("/orders?limit=3&cursor={c}")).await;
    assert_eq!(r.status, 200);
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

both!(limits_and_unknown_parameters_are_400_with_the_field);
async fn limits_and_unknown_parameters_are_400_with_the_field(b: Backend) {
    let s = Server::start_on(b, &[]);
    let t = s.trader();
    for bad in ["0", "201", "-1", "abc", "1.5", ""] {
        let r = t.get(&format!("/orders?limit={bad}")).await;
        assert_eq!(
            (r.status, r.code()),
            (400, "invalid_request"),
            "limit={bad}"
        );
        assert_eq!(r.field(), "limit");
    }
    assert_eq!(t.get("/orders?limit=200").await.status, 200);
    assert_eq!(t.get("/orders?limit=1").await.status, 200);
    let r = t.get("/positions?acount_id=ACC-1").await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"));
    assert_eq!(r.field(), "acount_id");
    let r = t.get("/orders?status=open").await;
    assert_eq!((r.status, r.field().as_str()), (400, Some("status")));
    let r = t.get("/orders?account_id=ACC-1&account_id=ACC-3").await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"));
    let r = t.get("/jobs?kind=rebalance").await;
    assert_eq!(r.status, 400);
    let r = t.get("/actions/act_x?verbose=1").await;
    assert_eq!(r.status, 400);
}

both!(every_authentication_failure_has_its_code);
async fn every_authentication_failure_has_its_code(b: Backend) {
    let s = Server::start_on(b, &[]);
    let good = s.trader();
    assert_eq!(good.get("/accounts").await.status, 200);
    let check = |r: airlock_tests::Resp, status: u16, code: &str, what: &str| {
        assert_eq!((r.status, r.code()), (status, code), "{what}: {:?}", r.body);
    };

    check(
        good.with_tokens("", &good.operator).get("/accounts").await,
        401,
        "unauthenticated",
        "no bearer",
    );
    check(
        good.with_tokens(&good.service, "").get("/accounts").await,
        401,
        "operator_unauthenticated",
        "no operator",
    );
    check(
        good.with_tokens("not.a.jwt", &good.operator)
            .get("/accounts")
            .await,
        401,
        "unauthenticated",
        "garbage",
    );
    // Tokens swapped: each is for the other audience.
    check(
        good.with_tokens(&good.operator, &good.operator)
            .get("/accounts")
            .await,
        401,
        "unauthenticated",
        "operator token as bearer",
    );
    check(
        good.with_tokens(&good.service, &good.service)
            .get("/accounts")
            .await,
        401,
        "operator_unauthenticated",
        "service token as operator",
    );

    // Expired: minted two hours ago with a 60 s lifetime.
    let past = vec![(
        "AIRLOCK_NOW".to_string(),
        "2026-01-01T00:00:00Z".to_string(),
    )];
    let old_service = cli(&s.state_dir, &past, &["token", "service", "--ttl", "60"]);
    let old_operator = cli(
        &s.state_dir,
        &past,
        &airlock_tests::trader_args(&["token", "operator"]),
    );
    check(
        good.with_tokens(&old_service, &good.operator)
            .get("/accounts")
            .await,
        401,
        "unauthenticated",
        "expired service",
    );
    check(
        good.with_tokens(&good.service, &old_operator)
            .get("/accounts")
            .await,
        401,
        "operator_unauthenticated",
        "expired operator",
    );

    // Another issuer's key: a valid-looking token with a forged signature.
    let claims = forge::claims(&good.service);
    check(
        good.with_tokens(
            &forge::es256_foreign(&good.service, &claims),
            &good.operator,
        )
        .get("/accounts")
        .await,
        401,
        "unauthenticated",
        "forged signature",
    );
    // Widened scope in the payload breaks the signature.
    let mut wide = claims.clone();
    wide["scope"] = json!("trade.read trade.plan trade.execute trade.admin");
    let head = good.service.split('.').next().unwrap();
    let sig = good.service.split('.').nth(2).unwrap();
    let tampered = format!("{head}.{}.{sig}", forge::b64(wide.to_string().as_bytes()));
    check(
        good.with_tokens(&tampered, &good.operator)
            .get("/accounts")
            .await,
        401,
        "unauthenticated",
        "tampered claims",
    );
    // alg none.
    check(
        good.with_tokens(&forge::alg_none(&claims), &good.operator)
            .get("/accounts")
            .await,
        401,
        "unauthenticated",
        "alg none",
    );
    let op_claims = forge::claims(&good.operator);
    check(
        good.with_tokens(&good.service, &forge::alg_none(&op_claims))
            .get("/accounts")
            .await,
        401,
        "operator_unauthenticated",
        "operator alg none",
    );
    // HS256 signed with the issuer's public key.
    let pem = forge::public_pem_of(&s.state_dir.join("dev-issuer-key.pem"));
    let kid = forge::header(&good.service)["kid"]
        .as_str()
        .unwrap()
        .to_string();
    let hs = forge::hs256(&claims, Some(&kid), pem.as_bytes());
    check(
        good.with_tokens(&hs, &good.operator).get("/accounts").await,
        401,
        "unauthenticated",
        "HS256 with public key",
    );

    // Scope: a service token without trade.read.
    let plan_only = s.cli(&["token", "service", "--scopes", "trade.plan"]);
    check(
        good.with_tokens(&plan_only, &good.operator)
            .get("/accounts")
            .await,
        403,
        "insufficient_scope",
        "missing scope",
    );
    // A viewer reads but cannot plan.
    let viewer = good.with_tokens(
        &good.service,
        &s.operator_token("op-viewer", "viewer", Some("energy")),
    );
    assert_eq!(viewer.get("/accounts").await.status, 200);
    let r = viewer
        .post("/actions/plan", &json!({"action_type": "positions.sync", "payload": {"account_id": "ACC-1"}, "requested_by": "op-viewer"}))
        .await;
    check(r, 403, "insufficient_scope", "viewer plans");
    // An operator with no known role reads nothing.
    let nobody = good.with_tokens(
        &good.service,
        &s.operator_token("op-x", "intern", Some("energy")),
    );
    check(
        nobody.get("/accounts").await,
        403,
        "insufficient_scope",
        "unknown role",
    );
}

both!(bad_input_is_a_4xx_with_the_field_and_writes_nothing);
async fn bad_input_is_a_4xx_with_the_field_and_writes_nothing(b: Backend) {
    let s = Server::start_on(b, &[]);
    let t = s.trader();
    let plan = |payload: Value| json!({"action_type": "order.submit.cl", "payload": payload, "requested_by": "op-energy-trader"});
    let good = json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 2, "order_type": "market"});
    let with = |k: &str, v: Value| {
        let mut p = good.clone();
        p[k] = v;
        plan(p)
    };
    let without = |k: &str| {
        let mut p = good.clone();
        p.as_object_mut().unwrap().remove(k);
        plan(p)
    };
    let cases: Vec<(Value, &str)> = vec![
        (with("quantity", json!("2")), "/payload/quantity"),
        (with("quantity", json!(0)), "/payload/quantity"),
        (with("quantity", json!(1.5)), "/payload/quantity"),
        (with("side", json!("hold")), "/payload/side"),
        (with("order_type", json!(7)), "/payload/order_type"),
        (with("limit_price", json!("sixty")), "/payload/limit_price"),
        (
            with("account_id", json!("ACC 1; DROP")),
            "/payload/account_id",
        ),
        (with("surprise", json!(true)), "/payload/surprise"),
        (without("side"), "/payload/side"),
        (
            json!({"action_type": "order.teleport", "payload": good, "requested_by": "op-energy-trader"}),
            "/action_type",
        ),
        (
            json!({"action_type": "order.submit.cl", "payload": good, "requested_by": "op-energy-trader", "extra": 1}),
            "/extra",
        ),
        (
            json!({"action_type": "order.submit.cl", "payload": good}),
            "/requested_by",
        ),
    ];
    for (body, field) in cases {
        let r = t.post("/actions/plan", &body).await;
        assert_eq!(
            (r.status, r.code()),
            (400, "invalid_request"),
            "{body}: {:?}",
            r.body
        );
        assert_eq!(r.field(), json!(field), "{body}");
        assert!(r.body["error"]["message"].as_str().unwrap().len() > 10);
    }
    let r = t.post("/actions/plan", &json!([1, 2])).await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"));
    let r = t
        .post_raw(
            "/actions/plan",
            "application/json",
            b"{\"action_type\": ".to_vec(),
        )
        .await;
    assert_eq!((r.status, r.code()), (400, "invalid_request"));
    let r = t
        .post_raw(
            "/actions/plan",
            "text/plain",
            plan(good.clone()).to_string().into_bytes(),
        )
        .await;
    assert_eq!((r.status, r.code()), (415, "unsupported_media_type"));
    let mut big = plan(good.clone());
    big["chat_context"] = json!({ "note": "x".repeat(70 * 1024) });
    let r = t.post("/actions/plan", &big).await;
    assert_eq!((r.status, r.code()), (413, "payload_too_large"));
    let r = t.post("/actions/execute", &json!({"plan_id": "pln_x", "confirmation_token": "t", "idempotency_key": "", "requested_by": "op-energy-trader"})).await;
    assert_eq!(r.field(), "/idempotency_key");
    let r = t.post("/actions/execute", &json!({"plan_id": "pln_x", "confirmation_token": "t", "idempotency_key": "k\u{1}", "requested_by": "op-energy-trader"})).await;
    assert_eq!(r.status, 400);
    // requested_by must be the operator.
    let mut other = plan(good.clone());
    other["requested_by"] = json!("op-head-trader");
    let r = t.post("/actions/plan", &other).await;
    assert_eq!((r.status, r.code()), (403, "operator_mismatch"));

    assert_eq!(s.queued_messages(), 0);
    if b == Backend::Embedded {
        let db = s.db();
        for table in ["plans", "audit", "idempotency_keys", "actions", "queue"] {
            let n: i64 = db
                .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 0, "{table} must be untouched by rejected input");
        }
    }
}
