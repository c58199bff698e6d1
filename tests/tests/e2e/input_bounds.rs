//! Client input that escapes the contract, on both backends: every id and path segment is
//! bounded at the edge before any store is asked (an over-long action id would otherwise
//! reach DynamoDB as a validation error, a 503), every refusal is the contract's
//! JSON error with a stable code and the field at fault, a key given twice in a body is
//! refused instead of the last one winning, and a refused request writes nothing.

use airlock_tests::{both, Api, Backend, Resp, Server, MARKET_OPEN};
use serde_json::{json, Value};

fn field(r: &Resp) -> &str {
    r.body["error"]["details"][0]["field"]
        .as_str()
        .unwrap_or("")
}

/// The contract's error body: the status and code, a sentence, and the request id of the
/// header.
fn refused(r: &Resp, status: u16, code: &str, what: &str) {
    assert_eq!((r.status, r.code()), (status, code), "{what}: {:?}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.len() > 10),
        "{what}: a sentence to relay: {:?}",
        r.body
    );
    assert_eq!(
        r.body["request_id"].as_str(),
        r.request_id.as_deref(),
        "{what}: the body names the request"
    );
}

fn invalid(r: &Resp, pointer: &str, what: &str) {
    refused(r, 400, "invalid_request", what);
    assert_eq!(field(r), pointer, "{what}: {:?}", r.body);
}

/// Nothing was planned, queued or audited (the embedded backend shows every table).
fn nothing_written(s: &Server) {
    assert_eq!(s.queued_messages(), 0, "nothing queued");
    if s.backend == Backend::Embedded {
        let db = s.db();
        for table in ["plans", "audit", "idempotency_keys", "actions"] {
            let n: i64 = db
                .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 0, "{table} is empty");
        }
    }
}

fn plan_body(payload: Value) -> Value {
    json!({ "action_type": "order.submit.cl", "payload": payload,
            "requested_by": "op-energy-trader" })
}

fn order() -> Value {
    json!({ "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1,
            "order_type": "market" })
}

both!(ids_in_paths_and_queries_are_bounded_before_any_store_call);
async fn ids_in_paths_and_queries_are_bounded_before_any_store_call(b: Backend) {
    let s = Server::start_on(b, &[]);
    let t = s.trader();

    // An action id far over DynamoDB's 2048-byte key limit: 400, not 503 (AWS) or 404.
    let long = "a".repeat(3000);
    for (path, what) in [
        (format!("/actions/{long}"), "3000 characters"),
        (format!("/actions/act_{}", "a".repeat(61)), "65 characters"),
        ("/actions/%FF".to_string(), "not UTF-8"),
        ("/actions/%F".to_string(), "broken escape"),
        ("/actions/act%0A1".to_string(), "a line break"),
        ("/actions/act%201".to_string(), "a space"),
        ("/actions/a%2Fb".to_string(), "an encoded slash"),
        ("/actions/%E2%82%AC".to_string(), "non-ASCII"),
    ] {
        let r = t.get(&path).await;
        invalid(&r, "action_id", what);
    }
    // Well formed (64 characters) but unknown: the endpoint's 404.
    let r = t.get(&format!("/actions/act_{}", "a".repeat(60))).await;
    refused(&r, 404, "action_not_found", "well-formed unknown id");

    // account_id filters are identifiers too.
    for (path, what) in [
        (format!("/positions?account_id={long}"), "3000 characters"),
        (
            format!("/orders?account_id={}", "A".repeat(65)),
            "65 characters",
        ),
        ("/orders?account_id=ACC%0A1".to_string(), "a line break"),
        ("/positions?account_id=ACC%201".to_string(), "a space"),
        ("/positions?account_id=%FF".to_string(), "not UTF-8"),
        ("/orders?account_id=".to_string(), "empty"),
    ] {
        let r = t.get(&path).await;
        invalid(&r, "account_id", what);
    }
    let r = t.get("/positions?account_id=ACC-999").await;
    refused(&r, 404, "account_not_found", "well-formed unknown account");

    // Cursors: bounded, base64url text; anything else is a cursor Airlock never issued.
    for (path, what) in [
        (format!("/orders?cursor={long}"), "3000 characters"),
        ("/orders?cursor=e30%0A.AAAA".to_string(), "a line break"),
        ("/jobs?cursor=%FF".to_string(), "not UTF-8"),
    ] {
        let r = t.get(&path).await;
        refused(&r, 400, "invalid_cursor", what);
        assert_eq!(field(&r), "cursor", "{what}");
    }
    if b == Backend::Aws {
        // Refused before any store call: no DynamoDB call was made for any 400 (the log line
        // of each request names its AWS calls), while the well-formed 404s did ask.
        let log = s.request_log();
        let calls = |status: u64| -> Vec<String> {
            log.iter()
                .filter(|l| l["status"] == status)
                .map(|l| l["backend_calls"].as_str().unwrap_or("?").to_string())
                .collect()
        };
        let refused = calls(400);
        assert_eq!(refused.len(), 17, "{log:?}");
        assert!(refused.iter().all(|c| c.is_empty()), "{refused:?}");
        assert!(calls(404).iter().all(|c| c.contains("DynamoDB")), "{log:?}");
    }
    nothing_written(&s);
}

both!(a_key_given_twice_anywhere_in_a_body_is_refused);
async fn a_key_given_twice_anywhere_in_a_body_is_refused(b: Backend) {
    let s = Server::start_on(b, &[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let raw = |body: &str| t.post_raw("/actions/plan", "application/json", body.into());

    // A parse that keeps the last value would plan 9 contracts here, not 1.
    let r = raw(r#"{"action_type":"order.submit.cl","payload":{"account_id":"ACC-1","symbol":"CLF27","side":"buy","quantity":1,"quantity":9,"order_type":"market"},"requested_by":"op-energy-trader"}"#).await;
    invalid(&r, "/payload/quantity", "nested duplicate");
    assert!(r.message().contains("more than once"), "{:?}", r.body);
    let r = raw(r#"{"action_type":"order.submit.cl","payload":{"account_id":"ACC-1","symbol":"CLF27","side":"buy","quantity":1,"order_type":"market"},"requested_by":"op-head-trader","requested_by":"op-energy-trader"}"#).await;
    invalid(&r, "/requested_by", "top-level duplicate");
    // An escape that decodes to the same name is the same key.
    let r = raw(r#"{"action_type":"order.submit.cl","payload":{"account_id":"ACC-1","account_\u0069d":"ACC-2","symbol":"CLF27","side":"buy","quantity":1,"order_type":"market"},"requested_by":"op-energy-trader"}"#).await;
    invalid(&r, "/payload/account_id", "escaped duplicate");
    // Deep in free-form trace fields.
    let r = raw(r#"{"action_type":"order.submit.cl","payload":{"account_id":"ACC-1","symbol":"CLF27","side":"buy","quantity":1,"order_type":"market"},"requested_by":"op-energy-trader","chat_context":{"chat_session_id":"c","trace":[{"k":1},{"k":1,"k":2}]}}"#).await;
    invalid(&r, "/chat_context/trace/1/k", "deep duplicate");
    let r = t
        .post_raw(
            "/actions/execute",
            "application/json",
            br#"{"plan_id":"pln_x","confirmation_token":"t","idempotency_key":"k-1","idempotency_key":"k-2","requested_by":"op-energy-trader"}"#.to_vec(),
        )
        .await;
    invalid(&r, "/idempotency_key", "execute duplicate");
    nothing_written(&s);

    // The same keys in sibling objects are not duplicates.
    let r = raw(r#"{"action_type":"order.submit.cl","payload":{"account_id":"ACC-1","symbol":"CLF27","side":"buy","quantity":1,"order_type":"market"},"requested_by":"op-energy-trader","chat_context":{"chat_session_id":"c","symbol":"CLF27","quantity":1}}"#).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r["normalized_payload"]["quantity"], 1);
}

both!(every_string_in_a_body_is_bounded);
async fn every_string_in_a_body_is_bounded(b: Backend) {
    let s = Server::start_on(b, &[]);
    let t = s.trader();
    let long = "x".repeat(3000);
    let with = |k: &str, v: Value| {
        let mut o = order();
        o[k] = v;
        plan_body(o)
    };
    let chat = |c: Value| {
        let mut p = plan_body(order());
        p["chat_context"] = c;
        p
    };
    let many: serde_json::Map<String, Value> =
        (0..40).map(|i| (format!("f{i}"), json!(i))).collect();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "long symbol",
            with("symbol", json!(long)),
            "/payload/symbol",
        ),
        (
            "symbol with a line break",
            with("symbol", json!("CLF27\nSELL 500")),
            "/payload/symbol",
        ),
        (
            "long account id",
            with("account_id", json!(long)),
            "/payload/account_id",
        ),
        (
            "long order id to cancel",
            json!({"action_type": "order.cancel", "payload": {"account_id": "ACC-1", "order_id": long},
                   "requested_by": "op-energy-trader"}),
            "/payload/order_id",
        ),
        (
            "long requested_by",
            json!({"action_type": "order.submit.cl", "payload": order(), "requested_by": long}),
            "/requested_by",
        ),
        (
            "chat id with a line break",
            chat(json!({"chat_session_id": "chat\n42"})),
            "/chat_context/chat_session_id",
        ),
        (
            "long tool call id",
            chat(json!({"tool_call_id": long})),
            "/chat_context/tool_call_id",
        ),
        (
            "trace field of 5000 bytes",
            chat(json!({"note": "y".repeat(5000)})),
            "/chat_context/note",
        ),
        (
            "40 trace fields",
            chat(Value::Object(many)),
            "/chat_context",
        ),
        (
            "trace field named with a control character",
            chat(json!({"a\u{7}": 1})),
            "/chat_context",
        ),
        (
            "nested trace field",
            chat(json!({"trace": [{"k": 1}]})),
            "/chat_context/trace",
        ),
        (
            "trace text of 129 characters",
            chat(json!({"note": "é".repeat(129)})),
            "/chat_context/note",
        ),
        (
            "chat id null (absent is how to send none)",
            chat(json!({"chat_session_id": null})),
            "/chat_context/chat_session_id",
        ),
    ];
    for (what, body, pointer) in cases {
        let r = t.post("/actions/plan", &body).await;
        invalid(&r, pointer, what);
    }

    let exec = |k: &str, v: Value| {
        let mut e = json!({"plan_id": "pln_x", "confirmation_token": "t", "idempotency_key": "k-1",
                           "requested_by": "op-energy-trader"});
        e[k] = v;
        e
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "plan id of 100 characters",
            exec("plan_id", json!("p".repeat(100))),
            "/plan_id",
        ),
        (
            "plan id of 3000 characters",
            exec("plan_id", json!(long)),
            "/plan_id",
        ),
        (
            "plan id with a control character",
            exec("plan_id", json!("pln_x\u{1}")),
            "/plan_id",
        ),
        (
            "plan id with a space",
            exec("plan_id", json!("pln x")),
            "/plan_id",
        ),
        (
            "token with a space",
            exec("confirmation_token", json!("a b")),
            "/confirmation_token",
        ),
        (
            "long idempotency key",
            exec("idempotency_key", json!(long)),
            "/idempotency_key",
        ),
        (
            "chat id with a line break",
            exec("chat_context", json!({"tool_call_id": "t\n"})),
            "/chat_context/tool_call_id",
        ),
    ];
    for (what, body, pointer) in cases {
        let r = t.post("/actions/execute", &body).await;
        invalid(&r, pointer, what);
    }
    let r = t
        .post_raw(
            "/actions/execute",
            "application/json",
            json!({"plan_id": "pln_x", "confirmation_token": "t", "idempotency_key": "k-2",
                   "requested_by": "op-energy-trader"})
            .to_string()
            .into_bytes(),
        )
        .await;
    // Well formed: it reaches the protocol, which checks the token before the plan.
    refused(&r, 422, "token_invalid", "well-formed execute of no plan");
    if b == Backend::Embedded {
        // The one request that got through was audited; nothing was planned.
        let n: i64 = s
            .db()
            .query_row("SELECT COUNT(*) FROM plans", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0);
    }
    assert_eq!(s.queued_messages(), 0);
}

both!(every_refusal_is_the_json_error_shape);
async fn every_refusal_is_the_json_error_shape(b: Backend) {
    let s = Server::start_on(b, &[]);
    let t = s.trader();
    let http = reqwest::Client::new();
    let send = |rb: reqwest::RequestBuilder| async {
        let rb = rb
            .header("authorization", format!("Bearer {}", t.service))
            .header("x-operator-token", &t.operator);
        let r = rb.send().await.expect("HTTP");
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let request_id = r
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let text = r.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        assert!(ct.starts_with("application/json"), "{status}: {ct} {body}");
        Resp {
            status,
            body,
            request_id,
            retry_after: None,
        }
    };
    let url = |p: &str| format!("{}{p}", t.base);

    let r = send(http.get(url("/actions/%FF"))).await;
    refused(&r, 400, "invalid_request", "a path that is not UTF-8");
    let r = send(http.get(url("/no-such-thing"))).await;
    refused(&r, 404, "not_found", "unknown path");
    let r = send(http.get(url("/actions/"))).await;
    refused(&r, 404, "not_found", "empty id");
    let r = send(http.get(format!("{}/elsewhere", s.base))).await;
    refused(&r, 404, "not_found", "outside the base path");
    let r = send(http.delete(url("/actions/plan"))).await;
    refused(&r, 405, "method_not_allowed", "DELETE");
    let r = send(http.put(url("/accounts"))).await;
    refused(&r, 405, "method_not_allowed", "PUT");
    let r = send(
        http.post(url("/actions/plan"))
            .header("content-type", "text/plain")
            .body("{}"),
    )
    .await;
    refused(&r, 415, "unsupported_media_type", "text/plain");
    let r = send(http.post(url("/actions/plan")).body("{}")).await;
    refused(&r, 415, "unsupported_media_type", "no content type");
    let r = send(
        http.post(url("/actions/plan"))
            .header("content-type", "application/json")
            .body(vec![b'['; 70 * 1024]),
    )
    .await;
    refused(&r, 413, "payload_too_large", "70 KiB");
    let r = send(
        http.post(url("/actions/plan"))
            .header("content-type", "application/json")
            .body(b"{\"action_type\":\"\xff\"}".to_vec()),
    )
    .await;
    refused(&r, 400, "invalid_request", "a body that is not UTF-8");
    let r = send(
        http.post(url("/actions/plan"))
            .header("content-type", "application/json")
            .body(format!("{}1{}", "[".repeat(200), "]".repeat(200))),
    )
    .await;
    refused(&r, 400, "invalid_request", "nested 200 deep");
    let anon = Api::new(&s, String::new(), String::new());
    let r = anon.get("/actions/%FF").await;
    refused(&r, 401, "unauthenticated", "authentication comes first");
    nothing_written(&s);
}
