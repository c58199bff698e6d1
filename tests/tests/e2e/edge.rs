//! The HTTP edge of `airlock serve` (and of the approvals Lambda where it applies): no secret
//! a request carries reaches the log, clients cannot add metric series, a 405 says which
//! methods the route takes, and a client that stops half-way through a request holds no
//! connection past the read timeouts.

use std::collections::BTreeSet;
use std::time::Duration;

use airlock_tests::lambda::{
    apigw_rest_event, function_binary, response_header, response_parts, FunctionProcess,
    LambdaEmulator, IGNORE_STAGE_ENV,
};
use airlock_tests::passkey::{enroll, ApprovalClient, Passkey};
use airlock_tests::{both, raw, Api, Backend, Resp, Server, BASE};
use serde_json::{json, Value};

/// The pieces of a secret worth looking for: the whole value and, for a JWT, its payload
/// and signature (a log line could hold either alone).
fn pieces(secret: &str) -> Vec<String> {
    let mut v = vec![secret.to_string()];
    let parts: Vec<&str> = secret.split('.').collect();
    if parts.len() == 3 {
        v.extend(
            parts[1..]
                .iter()
                .filter(|p| p.len() >= 16)
                .map(|p| p.to_string()),
        );
    }
    v
}

/// Fails if any of `secrets` (name, value) occurs in `log`.
fn assert_not_logged(log: &str, secrets: &[(&str, String)], whose: &str) {
    assert!(!log.trim().is_empty(), "{whose}: the log is empty");
    for (name, secret) in secrets {
        assert!(
            secret.len() >= 16,
            "{name} is too short to look for: {secret:?}"
        );
        for p in pieces(secret) {
            if let Some(line) = log.lines().find(|l| l.contains(&p)) {
                panic!("{whose} logged the {name}: {line}");
            }
        }
    }
}

fn secret_of(link: &str) -> String {
    link.rsplit('/').next().expect("secret").to_string()
}

both!(no_secret_reaches_the_request_log);
/// A whole flow: an enrolment link opened and used, a passkey sign-in, a plan approved on
/// the page and executed, a token-confirmed plan executed, a sign-out; then not one of the
/// secrets the test created or saw is anywhere in the server's log.
async fn no_secret_reaches_the_request_log(b: Backend) {
    let s = Server::operator_mode_at_open(b);
    let t = s.trader();
    let mut secrets: Vec<(&str, String)> = vec![
        ("service token", t.service.clone()),
        ("operator token", t.operator.clone()),
    ];

    // Enrolment: the page, then the ceremony (which signs the operator in).
    let link = enroll(&s, "op-energy-trader", "trader", "energy");
    let enrol_secret = secret_of(&link);
    let mut c = ApprovalClient::new(&s.base);
    let page = c.get(&format!("/approvals/enroll/{enrol_secret}")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let mut key = Passkey::new();
    let r = c.enroll(&link, &mut key).await;
    assert_eq!(r.status, 200, "enrol: {}", r.body);
    // The link works once: a second use is refused, and logged without the secret too.
    let again = c.get(&format!("/approvals/enroll/{enrol_secret}")).await;
    assert_eq!(again.status, 404);
    secrets.push(("enrolment secret", enrol_secret));
    secrets.push(("enrolment session", c.cookie.clone().expect("session")));

    // A second session, by passkey sign-in.
    let mut c2 = ApprovalClient::new(&s.base);
    let r = c2.sign_in("op-energy-trader", &mut key).await;
    assert_eq!(r.status, 200, "sign-in: {}", r.body);
    secrets.push(("sign-in session", c2.cookie.clone().expect("session")));

    // A new order: approved on the page, then executed.
    let p = t.plan_buy("CLF27", 1).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    let pid = p["plan_id"].as_str().expect("plan id").to_string();
    let a = c.decide(&pid, "approved", &mut key).await;
    assert_eq!(a.status, 200, "approve: {}", a.body);
    secrets.push(("anti-forgery token", c.csrf.clone().expect("csrf")));
    let e = t
        .post(
            "/actions/execute",
            &json!({"plan_id": pid, "idempotency_key": "edge-1", "requested_by": "op-energy-trader"}),
        )
        .await;
    assert_eq!(e.status, 202, "{:?}", e.body);

    // A sync, confirmed with the plan's token.
    let sync = t.plan_sync("ACC-1").await;
    let token = sync["confirmation_token"]
        .as_str()
        .unwrap_or_else(|| panic!("a token: {:?}", sync.body))
        .to_string();
    let e: Resp = t.execute(&sync, "edge-2").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    secrets.push(("confirmation token", token));

    // Signing out with the second session's anti-forgery token.
    c2.load_csrf("/approvals").await;
    let out = c2.post("/approvals/logout", json!({})).await;
    assert_eq!(out.status, 200, "{}", out.body);
    secrets.push(("second anti-forgery token", c2.csrf.clone().expect("csrf")));

    let log = std::fs::read_to_string(s.state_dir.join("serve.log")).expect("serve.log");
    assert_not_logged(&log, &secrets, "airlock serve");
    // The enrolment requests are in the log, under their route.
    let paths: BTreeSet<String> = s
        .request_log()
        .iter()
        .filter_map(|l| l["path"].as_str().map(String::from))
        .collect();
    for p in [
        "/approvals/enroll/{secret}",
        "/approvals/enroll/{secret}/start",
        "/approvals/enroll/{secret}/finish",
    ] {
        assert!(paths.contains(p), "{p} not in {paths:?}");
    }
}

/// The approvals Lambda (real binary, runtime emulator, embedded state): its enrolment,
/// sign-in and sign-out requests leave no secret in its output either; a 405 there names
/// the route's methods too.
#[test]
fn the_approvals_lambda_logs_no_secret() {
    let dir = airlock_tests::temp_state_dir();
    let origin = "http://localhost:3000";
    let env = vec![
        ("AIRLOCK_BACKEND".to_string(), "embedded".to_string()),
        ("AIRLOCK_APPROVAL_ORIGIN".to_string(), origin.to_string()),
    ];
    let link = airlock_tests::cli(
        &dir,
        &env,
        &airlock_tests::trader_args(&["operators", "enroll"]),
    );
    let secret = secret_of(&link);
    let emu = LambdaEmulator::start();
    let d = dir.to_str().expect("utf-8 dir");
    let mut f = emu.spawn_function(
        &function_binary("approvals"),
        &[
            ("AIRLOCK_BACKEND", "embedded"),
            ("AIRLOCK_STATE_DIR", d),
            ("AIRLOCK_APPROVAL_ORIGIN", origin),
            ("RUST_LOG", "info"),
            IGNORE_STAGE_ENV,
        ],
    );
    f.wait_ready(Duration::from_secs(30))
        .expect("approvals starts");
    fn call(
        f: &mut FunctionProcess,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, Value, Value) {
        let body = body.map(|b| b.to_string());
        let ev = apigw_rest_event(method, path, &[], headers, body.as_deref());
        let resp = f
            .invoke(ev, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let (status, body) = response_parts(&resp);
        (status, body, resp)
    }
    let cookie_of = |resp: &Value| -> String {
        let set = response_header(resp, "set-cookie").expect("set-cookie");
        let kv = set.split(';').next().expect("cookie");
        kv.split_once('=').expect("name=value").1.to_string()
    };
    let json_post = [("Origin", origin), ("Content-Type", "application/json")];
    let mut key = Passkey::new();

    let (status, page, _) = call(
        &mut f,
        "GET",
        &format!("/approvals/enroll/{secret}"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{page}");
    let (status, start, _) = call(
        &mut f,
        "POST",
        &format!("/approvals/enroll/{secret}/start"),
        &json_post,
        Some(json!({})),
    );
    assert_eq!(status, 200, "{start}");
    let cred = key.register(&start["options"], origin);
    let (status, done, resp) = call(
        &mut f,
        "POST",
        &format!("/approvals/enroll/{secret}/finish"),
        &json_post,
        Some(json!({"challenge_id": start["challenge_id"], "credential": cred})),
    );
    assert_eq!(status, 200, "{done}");
    let enrol_session = cookie_of(&resp);

    let (status, start, _) = call(
        &mut f,
        "POST",
        "/approvals/login/start",
        &json_post,
        Some(json!({"operator_id": "op-energy-trader"})),
    );
    assert_eq!(status, 200, "{start}");
    let cred = key.assert(&start["options"], origin);
    let (status, done, resp) = call(
        &mut f,
        "POST",
        "/approvals/login/finish",
        &json_post,
        Some(json!({"challenge_id": start["challenge_id"], "credential": cred})),
    );
    assert_eq!(status, 200, "{done}");
    let session = cookie_of(&resp);
    let cookie = format!("airlock_approvals={session}");
    let (status, page, _) = call(&mut f, "GET", "/approvals", &[("Cookie", &cookie)], None);
    assert_eq!(status, 200, "{page}");
    let html = page.as_str().expect("the page's text").to_string();
    let csrf = html
        .split("name=\"csrf-token\" content=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("csrf meta tag")
        .to_string();
    let (status, out, _) = call(
        &mut f,
        "POST",
        "/approvals/logout",
        &[
            ("Origin", origin),
            ("Content-Type", "application/json"),
            ("Cookie", &cookie),
            ("X-CSRF-Token", &csrf),
        ],
        Some(json!({})),
    );
    assert_eq!(status, 200, "{out}");

    let (status, body, resp) = call(&mut f, "GET", "/approvals/login/start", &[], None);
    assert_eq!(status, 405, "{body}");
    assert_eq!(body["error"]["code"], "method_not_allowed");
    assert_eq!(
        allowed(response_header(&resp, "allow").as_deref()),
        set(&["POST"])
    );

    let log = f.log();
    assert_not_logged(
        &log,
        &[
            ("enrolment secret", secret),
            ("enrolment session", enrol_session),
            ("sign-in session", session),
            ("anti-forgery token", csrf),
        ],
        "the approvals Lambda",
    );
    assert!(
        log.contains("/approvals/enroll/{secret}/finish"),
        "the enrolment is logged under its route:\n{log}"
    );
    drop(f);
    let _ = std::fs::remove_dir_all(&dir);
}

fn set(methods: &[&str]) -> BTreeSet<String> {
    methods.iter().map(|m| m.to_string()).collect()
}

/// The methods an `Allow` header lists.
fn allowed(header: Option<&str>) -> BTreeSet<String> {
    header
        .unwrap_or_else(|| panic!("no Allow header"))
        .split(',')
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every 405 names the methods its route takes, documented API, approval pages, MCP and
/// `/metrics` alike, and keeps the contract's error body.
#[tokio::test]
async fn a_405_names_the_methods_the_route_takes() {
    let s = Server::start(&[]);
    let t = s.trader();
    let http = reqwest::Client::new();
    let get = &["GET", "HEAD"][..];
    let post = &["POST"][..];
    let cases: Vec<(&str, String, &[&str])> = vec![
        ("DELETE", s.url("/accounts"), get),
        ("PUT", s.url("/actions/act_01kaq8m4x1a7c2e9f0g3h5"), get),
        ("GET", s.url("/actions/plan"), post),
        ("PATCH", s.url("/actions/execute"), post),
        ("FROBNICATE", s.url("/orders"), get),
        ("GET", s.url("/operators/enrolments"), post),
        ("GET", s.url("/mcp"), post),
        ("DELETE", s.url("/mcp"), post),
        ("POST", format!("{}/health", s.base), get),
        ("POST", format!("{}/metrics", s.base), get),
        ("GET", format!("{}/approvals/login/start", s.base), post),
        ("POST", format!("{}/approvals/plans/pln_1", s.base), get),
        (
            "PUT",
            format!("{}/approvals/enroll/not-a-secret", s.base),
            get,
        ),
        ("GET", format!("{}/approvals/logout", s.base), post),
    ];
    for (method, url, want) in cases {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = http
            .request(m, &url)
            .bearer_auth(&t.service)
            .header("x-operator-token", &t.operator)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let allow = r
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 405, "{method} {url}: {body}");
        assert_eq!(
            body["error"]["code"], "method_not_allowed",
            "{method} {url}"
        );
        let allow = allow.unwrap_or_else(|| panic!("{method} {url}: no Allow header"));
        assert_eq!(allowed(Some(&allow)), set(want), "{method} {url}");
    }
}

/// One request per (method, path) shape; `round` makes every made-up part new.
async fn junk(s: &Server, t: &Api, round: u32) -> u32 {
    let http = reqwest::Client::new();
    let n = rand::random::<u32>();
    let made_up = [
        format!("M{round}X{n}"),
        format!("PROPFIND{round}{n}"),
        format!("Z{n}{round}"),
    ];
    let methods: Vec<String> = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
        .iter()
        .map(|m| m.to_string())
        .chain(made_up)
        .collect();
    let paths = [
        format!("{BASE}/r{round}x{n}"),
        format!("{BASE}/actions/act_{round}x{n}"),
        format!("{BASE}/accounts"),
        format!("/approvals/plans/pln_{round}x{n}"),
        format!("/approvals/enroll/s{round}x{n}"),
        format!("/approvals/enroll/s{round}x{n}/start"),
        format!("/z{round}x{n}/{n}"),
        format!("/metrics/{n}"),
    ];
    for m in &methods {
        for p in &paths {
            let method = reqwest::Method::from_bytes(m.as_bytes()).unwrap();
            let r = http
                .request(method, format!("{}{p}", s.base))
                .bearer_auth(&t.service)
                .header("x-operator-token", &t.operator)
                .send()
                .await
                .unwrap();
            assert!(r.status().as_u16() < 500, "{m} {p}: {}", r.status());
        }
    }
    n
}

/// The HTTP histogram's series (`{labels}` of its `_count` lines) on `/metrics`.
async fn http_series(s: &Server) -> BTreeSet<String> {
    let text = reqwest::get(format!("{}/metrics", s.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("airlock_http_request_duration_seconds_count"))
        .filter_map(|l| l.rsplit_once(' ').map(|(labels, _)| labels.to_string()))
        .collect()
}

/// Made-up methods and paths, twice over with new values: the second round adds no series,
/// made-up methods are `other` and no label holds a value the client made up.
#[tokio::test]
async fn clients_cannot_add_metric_series() {
    let s = Server::start(&[]);
    let t = s.trader();
    // The scrape's own series exists before the rounds are compared.
    http_series(&s).await;
    let n0 = junk(&s, &t, 0).await;
    let first = http_series(&s).await;
    let n1 = junk(&s, &t, 1).await;
    let second = http_series(&s).await;
    assert_eq!(first, second, "the second round added series");
    let methods: BTreeSet<&str> = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE", "other",
    ]
    .into_iter()
    .collect();
    let mut saw_other = false;
    for series in &second {
        let label = |name: &str| -> String {
            series
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_else(|| panic!("no {name} label: {series}"))
                .to_string()
        };
        let method = label("method");
        assert!(
            methods.contains(method.as_str()),
            "method label {method:?}: {series}"
        );
        saw_other |= method == "other";
        let route = label("route");
        assert!(
            route == "unmatched" || route.starts_with('/'),
            "route label {route:?}: {series}"
        );
        for n in [n0, n1] {
            assert!(
                !series.contains(&n.to_string()),
                "a made-up value in {series}"
            );
        }
    }
    assert!(
        saw_other,
        "made-up methods are counted as `other`: {second:?}"
    );
}

/// A client that stops in its request line or headers is disconnected after the header
/// timeout, without an answer; one that stops in its body gets 408 `request_timeout` and
/// the connection is closed. Well-behaved requests on the same server are unaffected.
#[tokio::test]
async fn a_stalled_request_is_cut_off() {
    let s = Server::start(&[
        ("AIRLOCK_HEADER_READ_TIMEOUT_MS", "500"),
        ("AIRLOCK_BODY_READ_TIMEOUT_MS", "1000"),
    ]);
    let t = s.trader();
    let limit = Duration::from_secs(8);
    for partial in [
        &b""[..],
        b"GET /hea",
        b"GET /health HTTP/1.1\r\n",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a",
    ] {
        let mut c = raw::connect(&s.base);
        raw::send(&mut c, partial);
        let (got, took) = raw::until_closed(&mut c, limit).unwrap_or_else(|| {
            panic!(
                "{:?}: the connection is still open after {limit:?}",
                String::from_utf8_lossy(partial)
            )
        });
        assert!(
            got.is_empty(),
            "no answer: {}",
            String::from_utf8_lossy(&got)
        );
        assert!(
            took >= Duration::from_millis(400),
            "{:?}: closed after {took:?}, before the timeout",
            String::from_utf8_lossy(partial)
        );
    }

    // A kept-alive connection idle between requests is closed as well.
    let mut c = raw::connect(&s.base);
    raw::send(&mut c, &raw::head("GET", "/health", &[]));
    let (got, _) = raw::until_closed(&mut c, limit).expect("an idle connection is closed");
    assert_eq!(raw::parse(&got).status, 200);

    // Headers whole, the body stalled: 408 and the connection closed.
    let bearer = format!("Bearer {}", t.service);
    let json_headers = [
        ("Authorization", bearer.as_str()),
        ("X-Operator-Token", t.operator.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Content-Length", "100"),
    ];
    for path in [
        format!("{BASE}/actions/plan"),
        format!("{BASE}/mcp"),
        "/approvals/login/start".to_string(),
    ] {
        let mut c = raw::connect(&s.base);
        raw::send(&mut c, &raw::head("POST", &path, &json_headers));
        raw::send(&mut c, b"{\"action_type\": ");
        let (got, took) = raw::until_closed(&mut c, limit)
            .unwrap_or_else(|| panic!("{path}: still open after {limit:?}"));
        let a = raw::parse(&got);
        assert_eq!(a.status, 408, "{path}: {a:?}");
        assert_eq!(a.body["error"]["code"], "request_timeout", "{path}: {a:?}");
        assert_eq!(a.header("connection"), Some("close"), "{path}: {a:?}");
        assert!(a.header("x-request-id").is_some(), "{path}: {a:?}");
        assert!(took >= Duration::from_millis(900), "{path}: after {took:?}");
    }

    // Meanwhile a normal request is served as ever.
    let r = t.get("/accounts").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let log = s.request_log();
    assert!(
        log.iter()
            .any(|l| l["status"] == 408 && l["path"] == format!("{BASE}/actions/plan")),
        "the 408 is logged"
    );
}
