//! The real Lambda function binaries (`target/debug/<name>`) under a Lambda Runtime API
//! emulator, fed API Gateway REST proxy events, on the embedded backend.
//!
//! These tests build nothing: `cargo test --workspace` does not build the function binaries
//! (only their unit-test harnesses), so `cargo build --workspace --bins` must run first
//! (scripts/test.sh). A missing binary fails the test with that instruction.

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_tests::lambda::{
    apigw_rest_event, function_binary, response_header, response_parts, FunctionProcess,
    LambdaEmulator, IGNORE_STAGE_ENV,
};
use airlock_tests::{cli, temp_state_dir, BASE};
use serde_json::{json, Value};

const INVOKE_TIMEOUT: Duration = Duration::from_secs(30);
const INIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A state dir with the dev issuer key and demo data, and tokens for the energy trader.
struct Fixture {
    dir: PathBuf,
    service: String,
    operator: String,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = temp_state_dir();
        let env = vec![("AIRLOCK_BACKEND".to_string(), "embedded".to_string())];
        // Tokens first: this creates the dev issuer key the function will load.
        let service = cli(&dir, &env, &["token", "service"]);
        let operator = cli(
            &dir,
            &env,
            &airlock_tests::trader_args(&["token", "operator"]),
        );
        // Seeds the demo accounts, positions and orders into the empty database.
        cli(&dir, &env, &["seed-orders", "0"]);
        Fixture {
            dir,
            service,
            operator,
        }
    }

    fn auth(&self) -> Vec<(&str, String)> {
        vec![
            ("Authorization", format!("Bearer {}", self.service)),
            ("X-Operator-Token", self.operator.clone()),
        ]
    }

    /// Starts function `name` on this state dir and waits for its first `/next`.
    fn start(&self, emu: &LambdaEmulator, name: &str, extra: &[(&str, &str)]) -> FunctionProcess {
        let dir = self.dir.to_str().expect("utf-8 temp dir");
        let mut env = vec![
            ("AIRLOCK_BACKEND", "embedded"),
            ("AIRLOCK_STATE_DIR", dir),
            ("RUST_LOG", "info"),
        ];
        env.extend_from_slice(extra);
        let mut f = emu.spawn_function(&function_binary(name), &env);
        f.wait_ready(INIT_TIMEOUT)
            .unwrap_or_else(|e| panic!("{name} did not start: {e}"));
        f
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn event(method: &str, path: &str, headers: &[(&str, String)], body: Option<&str>) -> Value {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    apigw_rest_event(method, &format!("{BASE}{path}"), &[], &h, body)
}

fn call(f: &mut FunctionProcess, ev: Value) -> (u16, Value, Value) {
    let resp = f
        .invoke(ev, INVOKE_TIMEOUT)
        .unwrap_or_else(|e| panic!("invoke {}: {e}", f.name));
    let (status, body) = response_parts(&resp);
    (status, body, resp)
}

fn assert_pid_gone(pid: u32) {
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/status"))
                .map(|s| s.contains("State:\tZ"))
                .unwrap_or(true),
        "function process {pid} still running after drop"
    );
}

#[test]
fn accounts_function_serves_api_gateway_rest_events() {
    let fx = Fixture::new();
    let emu = LambdaEmulator::start();
    let mut f = fx.start(&emu, "accounts", &[IGNORE_STAGE_ENV]);
    let pid = f.pid();

    // (a) Authenticated list, with a query parameter that goes through the event's
    // queryStringParameters.
    let h: Vec<(&str, String)> = fx.auth();
    let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ev = apigw_rest_event(
        "GET",
        &format!("{BASE}/accounts"),
        &[("limit", "50")],
        &hs,
        None,
    );
    let (status, body, resp) = call(&mut f, ev);
    assert_eq!(status, 200, "{resp}");
    let ids: Vec<&str> = body["accounts"]
        .as_array()
        .unwrap_or_else(|| panic!("accounts missing: {resp}"))
        .iter()
        .map(|a| a["account_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["ACC-1", "ACC-2", "ACC-4"], "{resp}");
    let rid = response_header(&resp, "x-request-id").expect("x-request-id header");
    assert!(rid.starts_with("req_"), "{rid}");
    assert_eq!(
        response_header(&resp, "content-type").as_deref(),
        Some("application/json"),
        "{resp}"
    );

    // Without tokens: the contract's 401 body, with the request id in body and header.
    let (status, body, resp) = call(&mut f, event("GET", "/accounts", &[], None));
    assert_eq!(status, 401, "{resp}");
    assert_eq!(body["error"]["code"], "unauthenticated", "{resp}");
    let rid = response_header(&resp, "x-request-id").expect("x-request-id header");
    assert_eq!(body["request_id"], json!(rid), "{resp}");

    // GET /health: no auth, outside the base path (the template routes it here).
    let ev = apigw_rest_event("GET", "/health", &[], &[], None);
    let (status, body, resp) = call(&mut f, ev);
    assert_eq!(status, 200, "{resp}");
    assert_eq!(body["status"], "ok", "{resp}");

    // (c) An unknown path on this function: the contract's 404 JSON.
    let (status, body, resp) = call(&mut f, event("GET", "/no-such-thing", &fx.auth(), None));
    assert_eq!(status, 404, "{resp}");
    assert_eq!(body["error"]["code"], "not_found", "{resp}");
    // A path another function serves is unknown here too (one route set per function).
    let (status, body, resp) = call(&mut f, event("GET", "/positions", &fx.auth(), None));
    assert_eq!(status, 404, "{resp}");
    assert_eq!(body["error"]["code"], "not_found", "{resp}");

    // One process served all five events (one init, one `/next` per event; the poll after
    // the last answer may still be on its way).
    assert!(emu.polls() >= 5, "polls: {}", emu.polls());
    assert_eq!(f.pid(), pid);
    drop(f);
    assert_pid_gone(pid);
}

#[test]
fn plan_function_plans_an_order_from_a_post_event() {
    let fx = Fixture::new();
    let emu = LambdaEmulator::start();
    let mut f = fx.start(&emu, "plan", &[IGNORE_STAGE_ENV]);
    let mut h = fx.auth();
    h.push(("Content-Type", "application/json".into()));
    let body = json!({
        "action_type": "order.submit.cl",
        "payload": {
            "account_id": "ACC-1", "symbol": "CLF27", "side": "buy",
            "quantity": 1, "order_type": "market"
        },
        "requested_by": "op-energy-trader",
        "chat_context": { "chat_session_id": "chat-1", "tool_call_id": "call-1" }
    })
    .to_string();
    let (status, body, resp) = call(
        &mut f,
        event("POST", "/actions/plan", &h, Some(body.as_str())),
    );
    // The market may be closed now: the plan is then not executable, but it is a plan.
    assert_eq!(status, 200, "{resp}");
    assert!(
        body["plan_id"].as_str().is_some_and(|p| !p.is_empty()),
        "{resp}"
    );
    assert!(body["risk_checks"].is_array(), "{resp}");
    assert!(response_header(&resp, "x-request-id").is_some(), "{resp}");

    // A malformed body is the contract's 4xx error body, not a function error.
    let (status, body, resp) = call(&mut f, event("POST", "/actions/plan", &h, Some("{")));
    assert!((400..500).contains(&status), "{resp}");
    assert!(body["error"]["code"].is_string(), "{resp}");
}

/// The deployment finding documented in `airlock_tests::lambda`: `lambda_http` prepends the
/// REST API stage to the path unless `AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH` is set, so
/// without it every route 404s; a `$default` stage is never prepended.
#[test]
fn without_ignore_stage_the_rest_stage_is_part_of_the_path() {
    let fx = Fixture::new();
    let emu = LambdaEmulator::start();
    let mut f = fx.start(&emu, "accounts", &[]);
    let (status, body, resp) = call(&mut f, event("GET", "/accounts", &fx.auth(), None));
    assert_eq!(status, 404, "{resp}");
    assert_eq!(body["error"]["code"], "not_found", "{resp}");

    let mut ev = event("GET", "/accounts", &fx.auth(), None);
    ev["requestContext"]["stage"] = json!("$default");
    let (status, _, resp) = call(&mut f, ev);
    assert_eq!(status, 200, "{resp}");

    // A path that already starts with `/{stage}/` is taken as it is: `/prod/api/...` is no
    // route either.
    let mut ev = event("GET", "/accounts", &fx.auth(), None);
    ev["path"] = json!(format!("/prod{BASE}/accounts"));
    let (status, _, resp) = call(&mut f, ev);
    assert_eq!(status, 404, "{resp}");
}

/// The emulator's own contract: an event that is not an API Gateway event makes
/// `lambda_http` report an invocation error (`/error`), and the process keeps serving.
#[test]
fn a_non_http_event_is_an_invocation_error_and_the_function_survives() {
    let fx = Fixture::new();
    let emu = LambdaEmulator::start();
    let mut f = fx.start(&emu, "accounts", &[IGNORE_STAGE_ENV]);
    let err = f
        .invoke(json!({ "hello": "world" }), INVOKE_TIMEOUT)
        .expect_err("a non-HTTP event must fail");
    assert!(err.contains("function error"), "{err}");
    let (status, _, resp) = call(&mut f, event("GET", "/accounts", &fx.auth(), None));
    assert_eq!(status, 200, "{resp}");
}

/// A deployed function verifies tokens of the configured identity provider (JWKS over
/// HTTP), and does not trust the dev issuer.
#[test]
fn http_function_verifies_provider_tokens_from_its_jwks_url() {
    use airlock_tests::idp::{now_s, Idp, Key};
    let fx = Fixture::new();
    let (svc_key, op_key) = (Key::rs256("svc-1"), Key::es256("ops-1"));
    let idp = Idp::start(&[&svc_key, &op_key]);
    let emu = LambdaEmulator::start();
    let mut f = fx.start(
        &emu,
        "accounts",
        &[
            IGNORE_STAGE_ENV,
            ("AIRLOCK_SERVICE_JWKS_URL", idp.url.as_str()),
            ("AIRLOCK_OPERATOR_JWKS_URL", idp.url.as_str()),
            ("AIRLOCK_SERVICE_ISSUER", "https://idp.test/"),
            ("AIRLOCK_OPERATOR_ISSUER", "https://idp.test/"),
        ],
    );
    let now = now_s();
    let service = svc_key.sign(&json!({"iss": "https://idp.test/", "aud": "airlock-api",
        "sub": "mastra", "scope": "trade.read", "gty": "client-credentials",
        "iat": now, "exp": now + 300}));
    let operator = op_key.sign(
        &json!({"iss": "https://idp.test/", "aud": "airlock-operators",
        "sub": "op-1", "roles": ["viewer"], "desks": ["metals"], "iat": now, "exp": now + 300}),
    );
    let h = vec![
        ("Authorization", format!("Bearer {service}")),
        ("X-Operator-Token", operator),
    ];
    let (status, body, resp) = call(&mut f, event("GET", "/accounts", &h, None));
    assert_eq!(status, 200, "{resp}");
    assert_eq!(body["accounts"][0]["account_id"], "ACC-3", "{resp}");
    assert_eq!(idp.fetches(), 1);

    let (status, body, resp) = call(&mut f, event("GET", "/accounts", &fx.auth(), None));
    assert_eq!(status, 401, "dev issuer tokens are refused: {resp}");
    assert_eq!(body["error"]["code"], "unauthenticated", "{resp}");
}
