//! The permission proof: IAM against the code, both ways.
//!
//! moto enforces no IAM, so every other AWS test passes whatever the roles say. This one
//! runs the real Lambda function binaries (`target/debug/<name>`, as `tests/lambda.rs`
//! does) on the AWS backend against moto, each with the environment `infra/template.yaml`
//! gives it and with `AIRLOCK_AWS_CALL_LOG` set, so every SDK call appends the IAM
//! permissions it needs (`airlock::adapters::aws::calls`). A tour drives each function
//! through its code paths: every read endpoint with and without each filter, plans that
//! pass and fail, executes that are accepted, replayed, rejected (audited, committed, by
//! the position limit, by a suspended account, by the rate limit) or resumed, the workers
//! on SQS events built from the queues' real messages (submit, fill, cancel, a sync that
//! records a fill and replaces positions), the sweeper (a send, and an order refused
//! under the kill switch), and the approval page (an admin's enrolment link, a passkey
//! registered and signed in with, the pending list of every desk, an approval, on HTTP API
//! events as its public API sends them), and the MCP endpoint (every tool, called as a
//! 2026-07-28 client calls it: the reads, the three plans, executes with tokens). Orders
//! are confirmed by token (a policy in the control record) but for the approved one,
//! planned under the default policy. The `airlock` CLI runs its operator tour too (with
//! `operators enroll|list|revoke`).
//!
//! Then it reads the roles from the template (inline policies, managed policies, key
//! policies that name a role) and fails, listing every offending triple at once, when
//! (a) a function needs a permission its role does not allow, or (b) a role allows an
//! action on a resource that no run of its function needed (least privilege), except for
//! the short list [`UNREACHED`]. The CLI is checked the same way against the operator
//! policy `docs/cli-iam-policy.json`. Besides what the code calls, each function needs what
//! the Lambda service does with its role: writing its log group, and polling its SQS
//! trigger queue (`ReceiveMessage`, `DeleteMessage`, `GetQueueAttributes`).
//!
//! The tour's deployment is the parameters' defaults but for a few (`Lambdas::new`); a
//! role's conditional policies count when their condition holds in it. A second test runs
//! execute in the other deployment of its one condition (`ConfirmationPublicKey` set): no
//! AWS call at cold start, and no KMS grant.
//!
//! The Lambda binaries read only the system clock (they ignore `AIRLOCK_NOW`), and orders
//! need an open market; so they run under libfaketime (`scripts/emulator.sh` installs it),
//! at Monday 09:00 Chicago plus the time elapsed. A missing emulator, library or binary
//! fails the test; it never skips.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::adapters::aws::calls::CALL_LOG_ENV;
use airlock::adapters::aws::template::{
    self, EventDef, FunctionDef, PrincipalDef, ResourceDef, StatementDef, Template,
};
use airlock::adapters::aws::{clients, shapes, Aws, KmsSigner, Names};
use airlock::app::Ports;
use airlock::config::AwsConfig;
use airlock::core::domain::{Order, OrderStatus, Position};
use airlock_tests::idp::{Idp, Key};
use airlock_tests::lambda::{
    apigw_rest_event, function_binary, response_parts, FakeClock, FunctionProcess, LambdaEmulator,
};
use airlock_tests::moto::Moto;
use airlock_tests::passkey::Passkey;
use airlock_tests::{temp_state_dir, BASE, MARKET_OPEN};
use serde_json::{json, Value};

/// Before every table, queue and alias name, as the template's `ResourcePrefix`.
const PREFIX: &str = "perm-";
/// `ExecuteRatePerMinute` of this deployment: low, so the rate limit is reached.
const RATE_PER_MINUTE: &str = "4";
const ISSUER: &str = "https://idp.test/";
const TIMEOUT: Duration = Duration::from_secs(60);
/// The mcp function's invocations: a held `execute_plan` keeps four operation timeouts of
/// its invocation for after the hold (the emulator's, 60 s each), so its deadline is
/// further off than a quick call's.
const MCP_TIMEOUT: Duration = Duration::from_secs(300);
/// The worker functions' invocations: room for a batch of records at the emulator's
/// operation timeouts (see `worker::lambda::Deadline`).
const WORKER_TIMEOUT: Duration = Duration::from_secs(600);
/// The scopes of Mastra's client credentials; an admin's client also has `trade.admin`
/// (the enrolment API needs it).
const SERVICE_SCOPE: &str = "trade.read trade.plan trade.execute";
const ADMIN_SCOPE: &str = "trade.read trade.plan trade.execute trade.admin";
/// The operator who approves a plan on the approval page (enrolled through the admin API).
const APPROVER: &str = "op-approver";
/// `ApprovalOrigin` of this deployment (the template allows https only): where the approval
/// page is, its WebAuthn origin, and (with `ApprovalRpId` empty) its relying-party id's host.
const APPROVAL_ORIGIN: &str = "https://approvals.airlock.test";

/// Grants no run of the tour needs, each with the code path that does and why the tour
/// cannot reach it: `(function, action, resource without the prefix, why)`. An entry
/// without a real code path means the grant should go.
const UNREACHED: &[(&str, &str, &str, &str)] = &[
    (
        "worker-orders",
        "sqs:ChangeMessageVisibility",
        "airlock-orders.fifo",
        "a failed record's visibility shortened to the retry delay: the same code \
         (worker::lambda::handle_batch) as worker-jobs', which the tour drives through a \
         failed sync; no orders message fails on the tour's happy paths",
    ),
    (
        "sweeper",
        "dynamodb:PutItem",
        "airlock-paper-broker",
        "the dead-letter sweep asks the broker about an order (worker::give_up_order, \
         Broker::order); the paper broker then moves a resting order the price crossed \
         (PaperBroker::order saves it): the tour's dead letter was filled at once",
    ),
];

// ---------------------------------------------------------------------------------------
// The clock of the Lambda processes.

// ---------------------------------------------------------------------------------------
// The deployment: moto, bootstrapped from the template, and what the template resolves to.

struct World {
    rt: tokio::runtime::Runtime,
    moto: Moto,
    tpl: Template,
    /// The CLI's state dir, the functions' `AIRLOCK_STATE_DIR`, and the call log.
    dir: PathBuf,
    log: PathBuf,
    /// Logical id of each queue (dead-letter queues too) -> URL.
    queue_urls: BTreeMap<String, String>,
    key_arn: String,
    /// The test's own handle on the emulator, for setting situations up (never logged).
    aws: Aws,
    ports: Ports,
    clock: FakeClock,
}

fn prefixed(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// A template name pattern (`${ResourcePrefix}airlock-orders`) in this deployment.
fn named(pattern: &str) -> String {
    pattern.replace("${ResourcePrefix}", PREFIX)
}

/// Runs `airlock --backend aws ARGS` on the emulator with the prefix; `log`: with the call
/// log (the CLI tour), else unrecorded (setting a situation up).
fn run_cli(
    moto: &Moto,
    dir: &Path,
    log: Option<&Path>,
    extra: &[(&str, &str)],
    args: &[&str],
) -> String {
    let (ok, out, err) = run_cli_any(moto, dir, log, extra, args);
    assert!(ok, "airlock {args:?} failed: {err}\n{out}");
    out
}

/// [`run_cli`] whether it succeeds or not: (success, stdout, stderr).
fn run_cli_any(
    moto: &Moto,
    dir: &Path,
    log: Option<&Path>,
    extra: &[(&str, &str)],
    args: &[&str],
) -> (bool, String, String) {
    let mut cmd = Command::new(function_binary("airlock"));
    cmd.arg("--state-dir")
        .arg(dir)
        .args(["--backend", "aws"])
        .args(args)
        .env_remove("AIRLOCK_NOW")
        .env_remove(CALL_LOG_ENV)
        .env("RUST_LOG", "warn")
        .env("AIRLOCK_RESOURCE_PREFIX", PREFIX);
    for (k, v) in moto.env() {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    if let Some(log) = log {
        cmd.env(CALL_LOG_ENV, log);
    }
    let out = cmd.output().expect("run airlock");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

impl World {
    fn start() -> World {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let moto = Moto::start();
        let tpl = template::embedded().expect("infra/template.yaml parses");
        let dir = temp_state_dir();
        let log = dir.join("aws-calls.jsonl");
        // The stack: created once, as a deploy would (not logged: an operator's bootstrap
        // against a deployed stack only finds what exists, which the CLI tour checks).
        run_cli(&moto, &dir, None, &[], &["bootstrap"]);
        let demo = [("AIRLOCK_NOW", MARKET_OPEN)];
        run_cli(&moto, &dir, None, &demo, &["bootstrap", "--demo-data"]);
        let (aws, queue_urls, key_arn) = rt.block_on(connect(&moto, &tpl));
        let signer = Arc::new(KmsSigner::new(aws.kms.clone(), &key_arn));
        let ports = Ports::aws(&aws, signer);
        World {
            rt,
            moto,
            tpl,
            dir,
            log,
            queue_urls,
            key_arn,
            aws,
            ports,
            clock: FakeClock::new(),
        }
    }

    /// `airlock --backend aws ARGS`; `logged`: with the call log (the CLI tour).
    fn cli(&self, logged: bool, extra: &[(&str, &str)], args: &[&str]) -> String {
        let log = logged.then_some(self.log.as_path());
        run_cli(&self.moto, &self.dir, log, extra, args)
    }
}

/// The test's own clients on the emulator (never logged), the queue URLs by template
/// logical id (dead-letter queues too), and the signing key's ARN.
async fn connect(moto: &Moto, tpl: &Template) -> (Aws, BTreeMap<String, String>, String) {
    let conf = airlock_tests::emulator_config(&moto.endpoint).await;
    let (ddb, sqs, kms) = clients(&conf);
    let mut urls = BTreeMap::new();
    for q in &tpl.queues {
        let name = named(q.name_pattern.as_deref().expect("QueueName"));
        let url = sqs
            .get_queue_url()
            .queue_name(&name)
            .send()
            .await
            .unwrap_or_else(|e| panic!("queue {name}: {e:?}"))
            .queue_url
            .expect("queue url");
        urls.insert(q.logical_id.clone(), url);
    }
    let alias = format!("alias/{}", prefixed(shapes::SIGNING_ALIAS_NAME));
    let key_arn = kms
        .describe_key()
        .key_id(&alias)
        .send()
        .await
        .expect("the signing key")
        .key_metadata
        .expect("key metadata")
        .arn
        .expect("key ARN");
    let given = AwsConfig {
        resource_prefix: PREFIX.to_string(),
        ..AwsConfig::default()
    };
    let mut names = Names::resolve(
        &given,
        urls[shapes::ORDERS_QUEUE.logical_id].clone(),
        urls[shapes::JOBS_QUEUE.logical_id].clone(),
    );
    names.signing_key_id = key_arn.clone();
    let aws = Aws {
        ddb,
        sqs,
        kms,
        names: Arc::new(names),
    };
    (aws, urls, key_arn)
}

impl World {
    /// The resolved value of a template environment entry or parameter reference.
    fn resolve(&self, v: &serde_yaml::Value, params: &BTreeMap<String, String>) -> String {
        // Tags first: `as_str` sees through them.
        let Some((name, arg)) = template::intrinsic(v) else {
            return match v {
                serde_yaml::Value::String(s) => s.clone(),
                serde_yaml::Value::Bool(b) => b.to_string(),
                serde_yaml::Value::Number(n) => n.to_string(),
                other => panic!("value {other:?}"),
            };
        };
        match name.as_str() {
            "Ref" => {
                let id = arg.as_str().expect("!Ref name");
                if let Some(p) = params.get(id) {
                    p.clone()
                } else if let Some(t) = self.tpl.table(id) {
                    named(t.name_pattern.as_deref().expect("TableName"))
                } else if let Some(u) = self.queue_urls.get(id) {
                    u.clone()
                } else {
                    panic!("!Ref {id}: not a parameter, table or queue of this deployment")
                }
            }
            "GetAtt" => {
                let id = template::referenced_id(v).expect("!GetAtt");
                assert!(
                    self.tpl.keys.iter().any(|k| k.logical_id == id),
                    "!GetAtt {id}: only the signing key's ARN is resolved"
                );
                self.key_arn.clone()
            }
            // The branch this deployment's parameters choose (both signing-key slots are
            // the one key here).
            "If" => {
                let args = arg.as_sequence().expect("!If list");
                let cond = args[0].as_str().expect("!If condition");
                let holds = self
                    .tpl
                    .condition_holds(cond, params)
                    .unwrap_or_else(|e| panic!("!If {cond}: {e}"));
                self.resolve(&args[if holds { 1 } else { 2 }], params)
            }
            "Sub" => {
                let pattern = template::string_or_sub(v).expect("!Sub pattern");
                assert!(
                    pattern.starts_with("{{resolve:secretsmanager:"),
                    "!Sub {pattern}: only the cursor key secret is resolved"
                );
                // 64 alphanumerics, like the generated secret: base64 of 48 bytes.
                "Pq7nW2xK9vLr4tZb8hJm3sYc6fDg1aQe5uNo0iTpVw7kXy2zRb4Cd6Ef8Gh1Jk3L".into()
            }
            other => panic!("!{other} in a function's environment is not resolved"),
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("call log and state kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The functions: one Runtime API emulator and process each, started on first use.

struct Running {
    // Declared first: the process stops before its emulator.
    process: FunctionProcess,
    _emulator: LambdaEmulator,
}

/// An operator, with tokens minted by the stand-in identity provider on each request.
#[derive(Clone)]
struct Op {
    sub: &'static str,
    roles: &'static [&'static str],
    /// `None`: no desks claim (a role with every desk).
    desks: Option<&'static [&'static str]>,
    /// The scopes of the service token the operator's requests come with.
    scope: &'static str,
}

const fn trader(sub: &'static str) -> Op {
    Op {
        sub,
        roles: &["trader"],
        desks: Some(&["energy"]),
        scope: SERVICE_SCOPE,
    }
}

struct Lambdas<'w> {
    w: &'w World,
    params: BTreeMap<String, String>,
    service_key: Key,
    operator_key: Key,
    /// The stand-in identity provider (its JWKS fetches are counted).
    idp: Idp,
    running: BTreeMap<String, Running>,
}

impl<'w> Lambdas<'w> {
    fn new(w: &'w World) -> Lambdas<'w> {
        let service_key = Key::rs256("svc-1");
        let operator_key = Key::es256("ops-1");
        let idp = Idp::start(&[&service_key, &operator_key]);
        let mut params: BTreeMap<String, String> = w
            .tpl
            .parameters
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
            .collect();
        for (k, v) in [
            ("ResourcePrefix", PREFIX),
            ("ServiceIssuer", ISSUER),
            ("OperatorIssuer", ISSUER),
            ("ServiceJwksUrl", idp.url.as_str()),
            ("OperatorJwksUrl", idp.url.as_str()),
            ("ExecuteRatePerMinute", RATE_PER_MINUTE),
            ("VpcEndpointId", "vpce-0123456789abcdef0"),
            ("ApprovalOrigin", APPROVAL_ORIGIN),
        ] {
            params.insert(k.into(), v.into());
        }
        Lambdas {
            w,
            params,
            service_key,
            operator_key,
            idp,
            running: BTreeMap::new(),
        }
    }

    fn function(&self, binary: &str) -> &'w FunctionDef {
        self.w
            .tpl
            .functions
            .iter()
            .find(|f| f.binary.as_deref() == Some(binary))
            .unwrap_or_else(|| panic!("the template has no function {binary}"))
    }

    /// (Re)starts `binary` with its template environment, `ahead_s` seconds ahead of the
    /// tour's clock, and the call log.
    fn start(&mut self, binary: &str, ahead_s: i64) {
        self.try_start(binary, ahead_s)
            .unwrap_or_else(|e| panic!("{binary} did not start: {e}"));
    }

    /// [`Self::start`], answering how long its init took (spawn to its first `/next`), or
    /// why it did not start (its exit and log).
    fn try_start(&mut self, binary: &str, ahead_s: i64) -> Result<Duration, String> {
        self.running.remove(binary);
        let f = self.function(binary);
        let mut env: Vec<(String, String)> = f
            .env
            .iter()
            .map(|(k, v)| (k.clone(), self.w.resolve(v, &self.params)))
            .collect();
        for (k, v) in env.iter_mut() {
            // Lambda's /tmp; here one test dir (the AWS backend keeps nothing there).
            if k == "AIRLOCK_STATE_DIR" {
                *v = self.w.dir.join("lambda-tmp").display().to_string();
            }
        }
        env.extend(self.w.moto.env());
        env.extend(self.w.clock.env(ahead_s));
        env.push((CALL_LOG_ENV.into(), self.w.log.display().to_string()));
        let refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let emulator = LambdaEmulator::start();
        let mut process = emulator.spawn_function(&function_binary(binary), &refs);
        let init = process.wait_ready(TIMEOUT)?;
        self.running.insert(
            binary.to_string(),
            Running {
                process,
                _emulator: emulator,
            },
        );
        Ok(init)
    }

    fn invoke(&mut self, binary: &str, event: Value) -> Value {
        // A worker starts a batch's later records only while five operation timeouts are
        // left (the emulator's are 60 s): its deadline is further off than a quick call's.
        let timeout = match binary.starts_with("worker-") {
            true => WORKER_TIMEOUT,
            false => TIMEOUT,
        };
        self.invoke_for(binary, event, timeout)
    }

    /// [`Self::invoke`] with its deadline `timeout` away.
    fn invoke_for(&mut self, binary: &str, event: Value, timeout: Duration) -> Value {
        if !self.running.contains_key(binary) {
            self.start(binary, 0);
        }
        let r = self.running.get_mut(binary).expect("running");
        r.process
            .invoke(event, timeout)
            .unwrap_or_else(|e| panic!("invoke {binary}: {e}"))
    }

    /// The service token (Mastra's client, with the operator's `scope`) and the operator
    /// token of a request.
    fn headers(&self, op: &Op) -> Vec<(&'static str, String)> {
        let now = self.w.clock.now_s();
        let service = self.service_key.sign(&json!({
            "iss": ISSUER, "aud": "airlock-api", "sub": "mastra",
            "scope": op.scope, "gty": "client-credentials",
            "iat": now, "exp": now + 600,
        }));
        let mut claims = json!({
            "iss": ISSUER, "aud": "airlock-operators", "sub": op.sub, "roles": op.roles,
            "iat": now, "exp": now + 600,
        });
        if let Some(d) = op.desks {
            claims["desks"] = json!(d);
        }
        vec![
            ("Authorization", format!("Bearer {service}")),
            ("X-Operator-Token", self.operator_key.sign(&claims)),
        ]
    }

    /// An API Gateway request to an HTTP function: status and JSON body.
    fn http(
        &mut self,
        binary: &str,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        op: &Op,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut h = self.headers(op);
        if body.is_some() {
            h.push(("Content-Type", "application/json".into()));
        }
        let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let text = body.map(Value::to_string);
        let ev = apigw_rest_event(
            method,
            &format!("{BASE}{path}"),
            query,
            &hs,
            text.as_deref(),
        );
        let resp = self.invoke(binary, ev);
        let (status, body) = response_parts(&resp);
        (status, body)
    }

    fn get(&mut self, binary: &str, path: &str, query: &[(&str, &str)], op: &Op) -> Value {
        let (status, body) = self.http(binary, "GET", path, query, op, None);
        assert_eq!(status, 200, "GET {path} {query:?}: {body}");
        body
    }

    fn plan(&mut self, op: &Op, action_type: &str, payload: Value) -> Value {
        let req = json!({
            "action_type": action_type, "payload": payload, "requested_by": op.sub,
            "chat_context": { "chat_session_id": "perm", "tool_call_id": "tour" }
        });
        let (status, body) = self.http("plan", "POST", "/actions/plan", &[], op, Some(&req));
        assert_eq!(status, 200, "plan {req}: {body}");
        body
    }

    fn order_plan(&mut self, op: &Op, order: Value) -> Value {
        let p = self.plan(op, "order.submit.cl", order);
        assert_eq!(p["executable"], true, "{p}");
        p
    }

    fn execute_as(&mut self, op: &Op, plan: &Value, key: &str, requested_by: &str) -> (u16, Value) {
        let req = json!({
            "plan_id": plan["plan_id"], "confirmation_token": plan["confirmation_token"],
            "idempotency_key": key, "requested_by": requested_by,
        });
        self.http("execute", "POST", "/actions/execute", &[], op, Some(&req))
    }

    fn execute(&mut self, op: &Op, plan: &Value, key: &str) -> (u16, Value) {
        self.execute_as(op, plan, key, op.sub)
    }

    /// Executes and expects the action queued (202); returns the answer.
    fn accepted(&mut self, op: &Op, plan: &Value, key: &str) -> Value {
        let (status, body) = self.execute(op, plan, key);
        assert_eq!(status, 202, "execute {key}: {body}");
        body
    }

    /// An MCP request to the mcp function on the private API, as a 2026-07-28 client sends
    /// it (JSON-RPC over HTTP POST, the method and tool name in headers too, the protocol
    /// version and capabilities in `_meta`): the JSON-RPC `result`.
    fn mcp(&mut self, op: &Op, method: &str, mut params: Value) -> Value {
        static ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": MCP_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let mut h = self.headers(op);
        h.push(("Content-Type", "application/json".into()));
        h.push(("Accept", "application/json, text/event-stream".into()));
        h.push(("MCP-Protocol-Version", MCP_VERSION.into()));
        h.push(("Mcp-Method", method.into()));
        if method == "tools/call" {
            let name = params["name"].as_str().expect("a tool name").to_string();
            h.push(("Mcp-Name", name));
        }
        let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let req = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let text = req.to_string();
        let ev = apigw_rest_event("POST", &format!("{BASE}/mcp"), &[], &hs, Some(&text));
        let resp = self.invoke_for("mcp", ev, MCP_TIMEOUT);
        let (status, body) = response_parts(&resp);
        assert_eq!(status, 200, "MCP {req}: {body}");
        assert_eq!(body["id"], id, "MCP {req}: {body}");
        body.get("result")
            .cloned()
            .unwrap_or_else(|| panic!("MCP {req}: no result: {body}"))
    }

    /// `tools/call`: the tool's result (`structuredContent`, `isError`, ...).
    fn tool(&mut self, op: &Op, name: &str, arguments: Value) -> Value {
        self.mcp(
            op,
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )
    }

    /// A tool call that succeeds: its structured content.
    fn tool_ok(&mut self, op: &Op, name: &str, arguments: Value) -> Value {
        let r = self.tool(op, name, arguments.clone());
        assert_eq!(r["isError"], false, "{name} {arguments}: {r}");
        r["structuredContent"].clone()
    }

    /// A request to the approval page as its HTTP API (payload format 2.0, `$default`
    /// stage) delivers it to the approvals function, on the template's route for it: a
    /// browser's request with the session's cookie; a POST as the page's script sends it
    /// (same `Origin`, JSON, the page's anti-forgery token once read). Status, body (JSON,
    /// or the page as a string), and the session cookie if the answer sets one.
    fn page(
        &mut self,
        method: &str,
        path: &str,
        session: &PageSession,
        body: Option<&Value>,
    ) -> (u16, Value, Option<String>) {
        let route = http_api_route(self.function("approvals"), method, path);
        let mut headers = vec![("user-agent", "Mozilla/5.0 (permission tour)".to_string())];
        if let Some(b) = body {
            headers.push(("origin", APPROVAL_ORIGIN.to_string()));
            headers.push(("content-type", "application/json".to_string()));
            headers.push(("content-length", b.to_string().len().to_string()));
            if let Some(t) = &session.csrf {
                headers.push(("x-csrf-token", t.clone()));
            }
        }
        let cookies: Vec<String> = session
            .cookie
            .iter()
            .map(|c| format!("airlock_approvals={c}"))
            .collect();
        let text = body.map(Value::to_string);
        let ev = http_api_event(&route, method, path, &headers, &cookies, text.as_deref());
        let resp = self.invoke("approvals", ev);
        let (status, body) = response_parts(&resp);
        // HTTP APIs return Set-Cookie in `cookies`, not in the headers.
        let set = resp["cookies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(|c| c.split(';').next()?.strip_prefix("airlock_approvals="))
            .map(String::from)
            .next();
        (status, body, set)
    }

    /// A page of the approval site (signed in): its HTML.
    fn page_get(&mut self, path: &str, session: &PageSession) -> String {
        let (status, body, _) = self.page("GET", path, session, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        body.as_str()
            .unwrap_or_else(|| panic!("GET {path}: not a page: {body}"))
            .to_string()
    }

    /// A JSON POST of the page's script, expected to pass; keeps a session cookie it sets.
    fn page_post(&mut self, path: &str, session: &mut PageSession, body: Value) -> Value {
        let (status, answer, cookie) = self.page("POST", path, session, Some(&body));
        assert_eq!(status, 200, "POST {path}: {answer}");
        if cookie.is_some() {
            session.cookie = cookie;
        }
        answer
    }

    /// What the Lambda service does with a queue: receive what is visible, hand it to the
    /// worker as one SQS event, delete what the worker did not report failed. Until empty.
    fn drain(&mut self, queue: &str, worker: &str) -> usize {
        let mut handled = 0;
        loop {
            let (messages, records) = self.receive(queue);
            if messages.is_empty() {
                return handled;
            }
            let out = self.invoke(worker, json!({ "Records": records }));
            assert_eq!(
                out,
                json!({ "batchItemFailures": [] }),
                "{worker} failed records: {records:?}"
            );
            handled += messages.len();
            let url = self.w.queue_urls[queue].clone();
            let sqs = self.w.aws.sqs.clone();
            self.w.rt.block_on(async move {
                for m in messages {
                    sqs.delete_message()
                        .queue_url(&url)
                        .receipt_handle(m.receipt_handle().unwrap_or_default())
                        .send()
                        .await
                        .expect("DeleteMessage");
                }
            });
        }
    }

    /// One batch of `queue` handed to `worker` as the Lambda service would, nothing
    /// deleted; the worker's answer (its failed records).
    fn handle_once(&mut self, queue: &str, worker: &str) -> Value {
        let (messages, records) = self.receive(queue);
        assert!(!messages.is_empty(), "nothing to receive on {queue}");
        self.invoke(worker, json!({ "Records": records }))
    }

    /// What is visible on `queue` (up to 10), and those messages as SQS event records.
    fn receive(&mut self, queue: &str) -> (Vec<aws_sdk_sqs::types::Message>, Vec<Value>) {
        let url = self.w.queue_urls[queue].clone();
        let name = url.rsplit('/').next().unwrap_or_default().to_string();
        {
            let sqs = self.w.aws.sqs.clone();
            let u = url.clone();
            let messages = self.w.rt.block_on(async move {
                sqs.receive_message()
                    .queue_url(&u)
                    .max_number_of_messages(10)
                    .wait_time_seconds(0)
                    .message_system_attribute_names(
                        aws_sdk_sqs::types::MessageSystemAttributeName::All,
                    )
                    .send()
                    .await
                    .expect("ReceiveMessage")
                    .messages
                    .unwrap_or_default()
            });
            let records: Vec<Value> = messages
                .iter()
                .map(|m| {
                    let attrs: BTreeMap<String, String> = m
                        .attributes()
                        .map(|a| {
                            a.iter()
                                .map(|(k, v)| (k.as_str().to_string(), v.clone()))
                                .collect()
                        })
                        .unwrap_or_default();
                    json!({
                        "messageId": m.message_id(), "receiptHandle": m.receipt_handle(),
                        "body": m.body(), "attributes": attrs, "messageAttributes": {},
                        "md5OfBody": m.md5_of_body(), "eventSource": "aws:sqs",
                        "eventSourceARN": format!("arn:aws:sqs:{}:{}:{name}", Moto::REGION, Moto::ACCOUNT_ID),
                        "awsRegion": Moto::REGION,
                    })
                })
                .collect();
            (messages, records)
        }
    }
}

/// A browser on the approval page: the session cookie's secret and the page's
/// anti-forgery token, once it has them.
#[derive(Default)]
struct PageSession {
    cookie: Option<String>,
    csrf: Option<String>,
}

/// The route key of the function's HTTP API route (`AWS::Serverless::HttpApi` event) that
/// serves `method path`; panics when the template routes it to no such event.
fn http_api_route(f: &FunctionDef, method: &str, path: &str) -> String {
    f.events
        .iter()
        .find_map(|e| {
            let EventDef::HttpApi { method: m, path: p } = e else {
                return None;
            };
            let path_ok = match p.strip_suffix("{proxy+}") {
                Some(prefix) => path.len() > prefix.len() && path.starts_with(prefix),
                None => p == path,
            };
            let method_ok = m.eq_ignore_ascii_case("ANY") || m.eq_ignore_ascii_case(method);
            (path_ok && method_ok).then(|| format!("{} {p}", m.to_ascii_uppercase()))
        })
        .unwrap_or_else(|| {
            panic!(
                "the template routes no HTTP API event of {} to {method} {path}",
                f.logical_id
            )
        })
}

/// An HTTP API (payload format 2.0) event on the `$default` stage, as API Gateway builds
/// it: lower-case headers, cookies in `cookies` (not in a header), the raw path.
fn http_api_event(
    route: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    cookies: &[String],
    body: Option<&str>,
) -> Value {
    let api_id = "ap9r0v4l5x";
    let domain = format!("{api_id}.execute-api.{}.amazonaws.com", Moto::REGION);
    let mut h = serde_json::Map::new();
    h.insert("host".into(), json!(domain));
    h.insert("x-forwarded-for".into(), json!("203.0.113.10"));
    h.insert("x-forwarded-port".into(), json!("443"));
    h.insert("x-forwarded-proto".into(), json!("https"));
    for (k, v) in headers {
        h.insert(k.to_ascii_lowercase(), json!(v));
    }
    let now = chrono::Utc::now();
    let mut ev = json!({
        "version": "2.0",
        "routeKey": route,
        "rawPath": path,
        "rawQueryString": "",
        "headers": h,
        "requestContext": {
            "accountId": Moto::ACCOUNT_ID,
            "apiId": api_id,
            "domainName": domain,
            "domainPrefix": api_id,
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.10",
                "userAgent": h.get("user-agent").cloned().unwrap_or(json!("")),
            },
            "requestId": format!("perm{}", now.timestamp_nanos_opt().unwrap_or_default()),
            "routeKey": route,
            "stage": "$default",
            "time": now.format("%d/%b/%Y:%H:%M:%S %z").to_string(),
            "timeEpoch": now.timestamp_millis(),
        },
        "isBase64Encoded": false,
    });
    if let Some(proxy) = route
        .ends_with("{proxy+}")
        .then(|| path.splitn(3, '/').nth(2))
        .flatten()
    {
        ev["pathParameters"] = json!({ "proxy": proxy });
    }
    if !cookies.is_empty() {
        ev["cookies"] = json!(cookies);
    }
    if let Some(b) = body {
        ev["body"] = json!(b);
    }
    ev
}

/// The anti-forgery token a page of the approval site carries.
fn csrf_token(html: &str) -> String {
    html.split("name=\"csrf-token\" content=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no csrf-token in the page: {html}"))
        .to_string()
}

// ---------------------------------------------------------------------------------------
// The tours.

fn order(account: &str, symbol: &str, qty: u32, limit: Option<&str>) -> Value {
    let mut o = json!({
        "account_id": account, "symbol": symbol, "side": "buy", "quantity": qty,
        "order_type": if limit.is_some() { "limit" } else { "market" },
    });
    if let Some(l) = limit {
        o["limit_price"] = json!(l);
    }
    o
}

fn order_id(executed: &Value) -> String {
    executed["resource_refs"]["order_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no order id: {executed}"))
        .to_string()
}

impl World {
    fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn order_status(&self, id: &str) -> OrderStatus {
        self.block(self.ports.orders.get_order(id))
            .expect("get order")
            .unwrap_or_else(|| panic!("no order {id}"))
            .status
    }

    /// The unsent action executed with `key`.
    fn unsent(&self, key: &str) -> airlock::core::records::ActionRecord {
        self.block(self.ports.actions.list_unsent(i64::MAX, 1000))
            .expect("list unsent")
            .into_iter()
            .find(|a| a.idempotency_key == key)
            .unwrap_or_else(|| panic!("no unsent action for key {key}"))
    }

    /// Moves the message of `action_id` from the orders queue to its dead-letter queue, as
    /// the redrive policy does after a last receive that never finished.
    fn dead_letter(&self, action_id: &str) {
        self.dead_letter_from(
            shapes::ORDERS_QUEUE.logical_id,
            "OrdersDeadLetterQueue",
            action_id,
        );
    }

    /// The same from the queue `from` to the dead-letter queue `to` (logical ids).
    fn dead_letter_from(&self, from: &str, to: &str, action_id: &str) {
        let sqs = self.aws.sqs.clone();
        let from = self.queue_urls[from].clone();
        let to = self.queue_urls[to].clone();
        let id = action_id.to_string();
        self.block(async move {
            let got = sqs
                .receive_message()
                .queue_url(&from)
                .max_number_of_messages(10)
                .visibility_timeout(0)
                .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
                .send()
                .await
                .expect("ReceiveMessage")
                .messages
                .unwrap_or_default();
            let m = got
                .iter()
                .find(|m| m.body().unwrap_or_default().contains(&id))
                .expect("the action's message");
            let group = m
                .attributes()
                .and_then(|a| {
                    a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
                })
                .cloned();
            // A FIFO queue's dead letter keeps its group; the jobs queue is standard.
            let send = sqs
                .send_message()
                .queue_url(&to)
                .message_body(m.body().unwrap_or_default());
            let send = match group {
                Some(g) => send
                    .message_group_id(g)
                    .message_deduplication_id(format!("dead-{id}")),
                None => send,
            };
            send.send()
                .await
                .expect("SendMessage to the dead-letter queue");
            sqs.delete_message()
                .queue_url(&from)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await
                .expect("DeleteMessage");
        });
    }

    /// Deletes the two work queues (`false`), or recreates them (`true`): while they are
    /// gone, an execute commits its action and then fails to send it.
    fn set_queues(&self, present: bool) {
        let sqs = self.aws.sqs.clone();
        let urls: Vec<String> = shapes::QUEUES
            .iter()
            .map(|q| self.queue_urls[q.logical_id].clone())
            .collect();
        if present {
            // Recreated from the template, under the URLs the functions were given.
            self.cli(false, &[], &["bootstrap"]);
            for u in &urls {
                let name = u.rsplit('/').next().unwrap_or_default().to_string();
                let found = self
                    .block(sqs.get_queue_url().queue_name(&name).send())
                    .expect("recreated queue")
                    .queue_url
                    .unwrap_or_default();
                assert_eq!(&found, u, "the recreated queue has another URL");
            }
        } else {
            for u in urls {
                self.block(sqs.delete_queue().queue_url(u).send())
                    .expect("DeleteQueue");
            }
        }
    }
}

/// An action of the tour, for the CLI's audit trails.
struct Audited {
    action_id: String,
    plan_id: String,
}

/// The MCP revision the tour speaks (stateless: no session, no `initialize`).
const MCP_VERSION: &str = "2026-07-28";

/// The default policy but for orders, which are confirmed by the caller's token.
const TOKEN_POLICY: &str =
    r#"{"version": "perm-token", "confirmation": {"order.submit.cl": "token"}}"#;

fn tour_functions(w: &World, l: &mut Lambdas) -> Audited {
    let now_ms = chrono::DateTime::parse_from_rfc3339(MARKET_OPEN)
        .expect("MARKET_OPEN")
        .timestamp_millis();
    let [c1, c2, c3] = airlock::app::seed::demo_contracts(now_ms).map(|c| c.symbol());
    let me = trader("op-energy-trader");
    let head = Op {
        sub: "op-head-trader",
        roles: &["head_trader"],
        desks: None,
        scope: SERVICE_SCOPE,
    };

    // Orders are confirmed by the caller's token in most of this tour (the default policy
    // has the operator approve them on the approval page: driven below, after `policy
    // reset`). Set through the control record, as an operator would.
    let token_mode = w.dir.join("token-policy.json");
    std::fs::write(&token_mode, TOKEN_POLICY).expect("policy");
    let token_mode = token_mode.to_str().expect("utf-8").to_string();
    w.cli(false, &[], &["policy", "set", &token_mode]);

    // Reads, with and without each filter; a head trader's listings span every desk
    // (scanning the accounts for them).
    let accounts = l.get("accounts", "/accounts", &[("limit", "1")], &me);
    let cursor = accounts["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    l.get(
        "accounts",
        "/accounts",
        &[("limit", "1"), ("cursor", &cursor)],
        &me,
    );
    l.get("positions", "/positions", &[], &me);
    l.get("positions", "/positions", &[("account_id", "ACC-1")], &me);
    l.get("portfolio", "/portfolio", &[("account_id", "ACC-1")], &me);
    l.get("portfolio", "/portfolio/allocation", &[], &me);
    l.get("portfolio", "/portfolio/allocation", &[], &head);
    l.get(
        "portfolio",
        "/portfolio/risk-flags",
        &[("account_id", "ACC-1")],
        &me,
    );
    l.get("orders", "/orders", &[], &me);
    l.get("orders", "/orders", &[], &head);
    l.get("orders", "/orders", &[("account_id", "ACC-1")], &me);
    l.get("orders", "/orders", &[("status", "working")], &me);
    l.get("jobs", "/jobs", &[], &me);
    l.get("jobs", "/jobs", &[], &head);
    l.get(
        "jobs",
        "/jobs",
        &[("kind", "positions.sync"), ("status", "succeeded")],
        &me,
    );

    // A market buy: planned, signed, accepted, replayed. The plan proves the shifted clock.
    let p1 = l.order_plan(&me, order("ACC-1", &c1, 1, None));
    let expires = chrono::DateTime::parse_from_rfc3339(p1["expires_at"].as_str().unwrap_or(""))
        .expect("expires_at")
        .timestamp();
    assert!(
        (expires - (w.clock.now_s() + 300)).abs() < 120,
        "the plan function does not run on the shifted clock (libfaketime did not load?): {p1}"
    );
    let x1 = l.accepted(&me, &p1, "perm-x1");
    let (status, replay) = l.execute(&me, &p1, "perm-x1");
    assert_eq!(
        (status, replay["status"].as_str()),
        (200, Some("duplicate")),
        "{replay}"
    );
    // A resting limit buy (the paper broker's price table is read for the band).
    let p2 = l.order_plan(&me, order("ACC-1", &c1, 1, Some("66.00")));
    // Execute at its floor: a warm first execute makes one read, the reads of the account's
    // positions, then of the reference prices (the daily loss and the band, one call), and
    // of its message window, one transaction, one send; its replay two, the read and its
    // audit record.
    let before = calls_so_far(&w.log);
    let x2 = l.accepted(&me, &p2, "perm-x2");
    // The reads between the first and the commit run side by side: compared sorted.
    let mut first = calls_since(&w.log, before, "execute");
    if first.len() > 3 {
        let end = first.len() - 2;
        first[1..end].sort();
    }
    assert_eq!(
        first,
        [
            "DynamoDB.BatchGetItem",
            "DynamoDB.GetItem",
            "DynamoDB.GetItem",
            "DynamoDB.Query",
            "DynamoDB.TransactWriteItems",
            "SQS.SendMessage"
        ],
        "the calls of a first execute"
    );
    let before = calls_so_far(&w.log);
    let (status, _) = l.execute(&me, &p2, "perm-x2");
    assert_eq!(status, 200);
    let replay = calls_since(&w.log, before, "execute");
    assert_eq!(
        replay,
        ["DynamoDB.BatchGetItem", "DynamoDB.PutItem"],
        "the calls of a replay"
    );
    // A plan that fails its checks (too large): recorded, not signed.
    let big = l.plan(&me, "order.submit.cl", order("ACC-1", &c1, 20, None));
    assert_eq!(big["executable"], false, "{big}");
    // The executed plan again under a new key: the rejection is committed with the key,
    // then replayed.
    for _ in 0..2 {
        let (status, body) = l.execute(&me, &p1, "perm-x3");
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (409, Some("plan_already_executed")),
            "{body}"
        );
    }
    // Acting for another operator: rejected before anything is read, and audited.
    let (status, body) = l.execute_as(&me, &p2, "perm-x4", "op-someone-else");
    assert_eq!(status, 403, "{body}");

    // The order worker: a fill at the broker and a resting order.
    assert_eq!(l.drain(shapes::ORDERS_QUEUE.logical_id, "worker-orders"), 2);
    assert_eq!(w.order_status(&order_id(&x1)), OrderStatus::Filled);
    assert_eq!(w.order_status(&order_id(&x2)), OrderStatus::Working);
    // Its cancel, through plan, execute and the worker.
    let p5 = l.plan(
        &me,
        "order.cancel",
        json!({"account_id": "ACC-1", "order_id": order_id(&x2)}),
    );
    assert_eq!(p5["executable"], true, "{p5}");
    l.accepted(&me, &p5, "perm-x5");
    assert_eq!(l.drain(shapes::ORDERS_QUEUE.logical_id, "worker-orders"), 1);
    assert_eq!(w.order_status(&order_id(&x2)), OrderStatus::Cancelled);
    // The action's status, and an unknown one.
    let action = x1["action_id"].as_str().expect("action id");
    l.get("action-status", &format!("/actions/{action}"), &[], &me);
    let (status, _) = l.http("action-status", "GET", "/actions/act-none", &[], &me, None);
    assert_eq!(status, 404);

    // The position limit moved between plan and execute: the commit's condition fails and
    // execute reads the exposure to say why (the CLI sets a tight policy for this).
    let policy = w.dir.join("tight-policy.json");
    std::fs::write(&policy, r#"{"version": "perm-tight", "max_position": 12, "confirmation": {"order.submit.cl": "token"}}"#).expect("policy");
    w.cli(
        true,
        &[],
        &["policy", "set", policy.to_str().expect("utf-8")],
    );
    w.cli(true, &[], &["policy", "show"]);
    let limited = trader("op-position");
    let p6a = l.order_plan(&limited, order("ACC-1", &c3, 8, None));
    let p6b = l.order_plan(&limited, order("ACC-1", &c3, 8, None));
    l.accepted(&limited, &p6a, "perm-x6a");
    let (status, body) = l.execute(&limited, &p6b, "perm-x6b");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("policy_violation")),
        "{body}"
    );
    w.cli(true, &[], &["policy", "reset"]);

    // Under the default policy an order waits for its operator's approval.
    tour_approvals(l, &c1);
    w.cli(false, &[], &["policy", "set", &token_mode]);

    // The account was suspended after the plan: execute reads it to say so.
    let suspended = trader("op-suspend");
    let p7 = l.order_plan(&suspended, order("ACC-2", &c1, 1, None));
    w.cli(false, &[], &["account-status", "ACC-2", "suspended"]);
    let (status, body) = l.execute(&suspended, &p7, "perm-x7");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("policy_violation")),
        "{body}"
    );
    w.cli(false, &[], &["account-status", "ACC-2", "active"]);

    // A positions.sync that records a fill the broker made and replaces positions: a
    // resting order, then a price that crosses it; an extra position of ours the broker
    // does not have; and the job already created by an earlier delivery that died.
    let desk2 = trader("op-desk2");
    let p9 = l.order_plan(&desk2, order("ACC-2", &c1, 1, Some("68.00")));
    let x9 = l.accepted(&desk2, &p9, "perm-x9");
    // With p6a's and the approved order's.
    assert_eq!(l.drain(shapes::ORDERS_QUEUE.logical_id, "worker-orders"), 3);
    assert_eq!(w.order_status(&order_id(&x9)), OrderStatus::Working);
    let price = airlock::core::domain::Price::parse("67.50").expect("price");
    w.block(
        w.ports
            .paper
            .set_prices(&BTreeMap::from([(c1.clone(), price)])),
    )
    .expect("set price");
    w.block(w.ports.read_models.put_positions(&[Position {
        account_id: "ACC-2".into(),
        symbol: c2.clone(),
        quantity: 1,
        avg_price: None,
        updated_at: now_ms,
        day_realized: None,
    }]))
    .expect("extra position");
    let p10 = l.plan(&desk2, "positions.sync", json!({"account_id": "ACC-2"}));
    let x10 = l.accepted(&desk2, &p10, "perm-x10");
    let job_id = x10["resource_refs"]["job_id"].as_str().expect("job id");
    w.block(w.ports.read_models.put_jobs(&[airlock::core::domain::Job {
        job_id: job_id.into(),
        kind: airlock::core::domain::JobKind::PositionsSync,
        status: airlock::core::domain::JobStatus::Running,
        account_id: Some("ACC-2".into()),
        action_id: x10["action_id"].as_str().map(String::from),
        created_at: now_ms,
        updated_at: now_ms,
        error: None,
        result: None,
    }]))
    .expect("running job");
    // First an order of ACC-2 claimed for the broker and not yet recorded: the sync must
    // not replace that contract's position; its record fails, and its visibility is
    // shortened to the retry delay instead of the queue's whole timeout.
    let claimed = Order {
        order_id: "ord-perm-claimed".into(),
        status: OrderStatus::Queued,
        ..w.block(w.ports.orders.get_order(&order_id(&x9)))
            .expect("get order")
            .expect("x9's order")
    };
    let claimed = Order {
        filled_quantity: 0,
        avg_fill_price: None,
        terms: airlock::core::domain::OrderTerms {
            symbol: c2.clone(),
            ..claimed.terms
        },
        ..claimed
    };
    let submitted = Order {
        status: OrderStatus::Submitted,
        ..claimed.clone()
    };
    w.block(w.ports.workers.create_order(&claimed))
        .expect("create order");
    assert!(w
        .block(
            w.ports
                .workers
                .advance_order(&claimed, &submitted, None, None)
        )
        .expect("claim"));
    let out = l.handle_once(shapes::JOBS_QUEUE.logical_id, "worker-jobs");
    assert_eq!(
        out["batchItemFailures"].as_array().map(Vec::len),
        Some(1),
        "the sync waits for the claimed order: {out}"
    );
    let rejected = Order {
        status: OrderStatus::Rejected,
        ..submitted.clone()
    };
    assert!(w
        .block(
            w.ports
                .workers
                .advance_order(&submitted, &rejected, None, None)
        )
        .expect("record"));
    // Visible again after the retry delay (`AIRLOCK_WORKER_RETRY_MS`, 2 s by default).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(l.drain(shapes::JOBS_QUEUE.logical_id, "worker-jobs"), 1);
    assert_eq!(w.order_status(&order_id(&x9)), OrderStatus::Filled);
    let held = w
        .block(w.ports.positions.get_position("ACC-2", &c2))
        .expect("position");
    assert!(
        held.is_none(),
        "the sync removed the position the broker does not have"
    );

    // The agent's tools over MCP (still under the token policy).
    tour_mcp(w, l, &c1, action);

    // The rate limit: one operator's executes until it answers 429.
    let burst = trader("op-burst");
    let mut limited_at = None;
    for i in 0..8 {
        let p = l.plan(&burst, "positions.sync", json!({"account_id": "ACC-1"}));
        let (status, body) = l.execute(&burst, &p, &format!("perm-burst-{i}"));
        if status == 429 {
            assert_eq!(body["error"]["code"], "rate_limited", "{body}");
            limited_at = Some(i);
            break;
        }
        assert_eq!(status, 202, "{body}");
    }
    assert!(limited_at.is_some(), "the rate limit was never reached");
    l.drain(shapes::JOBS_QUEUE.logical_id, "worker-jobs");

    // Accepted but never sent (the queues are gone for a moment): one resumed by a retry
    // with the same key once its lease ran out, the others left to the sweeper.
    let queued = trader("op-queue");
    let cancels = trader("op-queue-2");
    let pe1 = l.plan(&queued, "positions.sync", json!({"account_id": "ACC-1"}));
    let pe2 = l.order_plan(&queued, order("ACC-1", &c1, 1, None));
    let pe3 = l.plan(&queued, "positions.sync", json!({"account_id": "ACC-1"}));
    let pe4 = l.plan(
        &cancels,
        "order.cancel",
        json!({"account_id": "ACC-1", "order_id": "ORD-1003"}),
    );
    w.set_queues(false);
    for (op, p, key) in [
        (&queued, &pe1, "perm-e1"),
        (&queued, &pe2, "perm-e2"),
        (&queued, &pe3, "perm-e3"),
        (&cancels, &pe4, "perm-e4"),
    ] {
        let (status, body) = l.execute(op, p, key);
        assert_eq!(status, 503, "{key}: {body}");
    }
    w.set_queues(true);
    l.start("execute", 15);
    let resumed = l.accepted(&queued, &pe1, "perm-e1");
    assert_eq!(resumed["status"], "queued", "{resumed}");
    // As if e2's message had been sent after all (by an execute that died before marking
    // it sent) and its worker had created the order and died: the sweeper's conditional
    // create of the order then reads the existing one back.
    let e2 = w.unsent("perm-e2");
    let n = e2.message.normalized_payload.order().expect("an order");
    w.block(w.ports.read_models.put_orders(&[Order {
        order_id: e2.resource_refs.order_id.clone().expect("order id"),
        terms: n.terms.clone(),
        status: OrderStatus::Queued,
        filled_quantity: 0,
        avg_fill_price: None,
        action_id: Some(e2.action_id.clone()),
        created_at: e2.created_at,
        updated_at: e2.created_at,
        version: 1,
        versions: Vec::new(),
    }]))
    .expect("the order of e2");
    // A dead letter whose last receive never finished: an accepted order whose message
    // reached the dead-letter queue with its action still queued. The sweeper's
    // dead-letter sweep fails it (asking the broker first) and leaves the dead letter.
    let dead_op = trader("op-dead");
    let pd = l.order_plan(&dead_op, order("ACC-1", &c1, 1, None));
    let xd = l.accepted(&dead_op, &pd, "perm-dead");
    let xd_id = xd["action_id"].as_str().expect("action id").to_string();
    w.dead_letter(&xd_id);
    // A dead letter whose worker claimed its order for the broker, sent it (the broker
    // filled it) and timed out before recording it: the sweep asks the broker and records
    // the fill (the position and the exposure with the order), which releases the claim.
    let pf = l.order_plan(&dead_op, order("ACC-1", &c1, 1, None));
    let xf = l.accepted(&dead_op, &pf, "perm-dead-filled");
    let xf_id = xf["action_id"].as_str().expect("action id").to_string();
    let xf_order = w
        .block(w.ports.orders.get_order(&order_id(&xf)))
        .expect("get order");
    assert!(xf_order.is_none(), "no worker ran it yet");
    let xf_action = w
        .block(w.ports.actions.get_action(&xf_id))
        .expect("action")
        .expect("xf");
    let xf_terms = xf_action
        .message
        .normalized_payload
        .order()
        .expect("an order")
        .terms
        .clone();
    let claimed_order = Order {
        order_id: order_id(&xf),
        terms: xf_terms,
        status: OrderStatus::Submitted,
        filled_quantity: 0,
        avg_fill_price: None,
        action_id: Some(xf_id.clone()),
        created_at: xf_action.created_at,
        updated_at: xf_action.created_at,
        version: 1,
        versions: Vec::new(),
    };
    w.block(w.ports.workers.create_order(&claimed_order))
        .expect("the claimed order");
    let at_broker = w
        .block(
            w.ports
                .broker
                .submit(&airlock::core::ports::broker::BrokerOrder::new(
                    &claimed_order.order_id,
                    &claimed_order.terms,
                    1,
                )),
        )
        .expect("the broker's order");
    assert_eq!(
        at_broker.status,
        airlock::core::ports::broker::BrokerStatus::Filled,
        "{at_broker:?}"
    );
    w.dead_letter(&xf_id);
    // A dead-lettered positions.sync whose job a delivery created: the sweep fails it.
    let ps = l.plan(&dead_op, "positions.sync", json!({"account_id": "ACC-1"}));
    let xs = l.accepted(&dead_op, &ps, "perm-dead-sync");
    let xs_id = xs["action_id"].as_str().expect("action id").to_string();
    let xs_job = xs["resource_refs"]["job_id"]
        .as_str()
        .expect("job id")
        .to_string();
    let running = airlock::core::domain::Job {
        job_id: xs_job.clone(),
        kind: airlock::core::domain::JobKind::PositionsSync,
        status: airlock::core::domain::JobStatus::Running,
        account_id: Some("ACC-1".into()),
        action_id: Some(xs_id.clone()),
        created_at: now_ms,
        updated_at: now_ms,
        error: None,
        result: None,
    };
    w.block(w.ports.workers.create_job(&running))
        .expect("the running job");
    w.dead_letter_from(shapes::JOBS_QUEUE.logical_id, "JobsDeadLetterQueue", &xs_id);
    w.cli(
        true,
        &[],
        &[
            "kill-switch",
            "engage",
            "--reason",
            "permission proof",
            "--keep-working",
        ],
    );
    l.start("sweeper", 75);
    let swept = l.invoke(
        "sweeper",
        json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}),
    );
    assert_eq!(swept, json!({"sent": 2}), "e3 and e4 sent, e2 refused");
    let e2 = w
        .block(w.ports.actions.get_action(&e2.action_id))
        .expect("action")
        .expect("e2");
    assert_eq!(
        e2.status,
        airlock::core::domain::ActionStatus::Failed,
        "{e2:?}"
    );
    let dead = w
        .block(w.ports.actions.get_action(&xd_id))
        .expect("action")
        .expect("the dead-lettered action");
    assert_eq!(
        dead.status,
        airlock::core::domain::ActionStatus::Failed,
        "{dead:?}"
    );
    assert!(
        dead.error
            .as_deref()
            .unwrap_or_default()
            .contains("dead-lettered"),
        "{dead:?}"
    );
    let filled = w
        .block(w.ports.actions.get_action(&xf_id))
        .expect("action")
        .expect("xf");
    assert_eq!(
        filled.status,
        airlock::core::domain::ActionStatus::Succeeded,
        "{filled:?}"
    );
    assert_eq!(w.order_status(&order_id(&xf)), OrderStatus::Filled);
    let synced = w
        .block(w.ports.actions.get_action(&xs_id))
        .expect("action")
        .expect("xs");
    assert_eq!(
        synced.status,
        airlock::core::domain::ActionStatus::Failed,
        "{synced:?}"
    );
    // Creating it again reads the stored one back.
    let job = w
        .block(w.ports.workers.create_job(&running))
        .expect("the stored job");
    assert_eq!(
        job.status,
        airlock::core::domain::JobStatus::Failed,
        "{job:?}"
    );
    w.cli(true, &[], &["kill-switch", "release"]);
    Audited {
        action_id: action.to_string(),
        plan_id: p1["plan_id"].as_str().unwrap_or_default().to_string(),
    }
}

/// The approvals function: an admin's enrolment link (the admin-only API of the private
/// API), a passkey registered through it, a sign-in, the pending list of an operator with
/// every desk (the accounts scanned for the desks, the plans' `awaiting` index queried for
/// each), and the approval of an operator-mode plan (its page, then a passkey assertion
/// bound to it: the plan's update and its audit record in one transaction), which then
/// executes without a token. Runs under the default policy.
fn tour_approvals(l: &mut Lambdas, symbol: &str) {
    let admin = Op {
        sub: "op-admin",
        roles: &["admin"],
        desks: None,
        scope: ADMIN_SCOPE,
    };
    let approver = Op {
        sub: APPROVER,
        roles: &["head_trader"],
        desks: None,
        scope: SERVICE_SCOPE,
    };

    // Enrolment needs trade.admin on the service token as well as the admin role.
    let req = json!({ "sub": APPROVER, "roles": approver.roles, "desks": [] });
    let path = "/operators/enrolments";
    let mastra = Op {
        scope: SERVICE_SCOPE,
        ..admin.clone()
    };
    let (status, body) = l.http("approvals", "POST", path, &[], &mastra, Some(&req));
    assert_eq!(status, 403, "an enrolment without trade.admin: {body}");
    let (status, link) = l.http("approvals", "POST", path, &[], &admin, Some(&req));
    assert_eq!(status, 201, "enrolment: {link}");
    let url = link["url"].as_str().expect("enrolment url");
    let enrol = url
        .strip_prefix(APPROVAL_ORIGIN)
        .filter(|p| p.starts_with("/approvals/enroll/"))
        .unwrap_or_else(|| panic!("enrolment link {url}"))
        .to_string();

    // An order planned under the default policy: no token; execute waits for the approval.
    let p = l.order_plan(&approver, order("ACC-1", symbol, 1, None));
    let plan_id = p["plan_id"].as_str().expect("plan id").to_string();
    assert_eq!(p["confirmation_token"], Value::Null, "{p}");
    assert_eq!(
        p["approval"]["url"],
        format!("{APPROVAL_ORIGIN}/approvals/plans/{plan_id}"),
        "{p}"
    );
    let (status, body) = l.execute(&approver, &p, "perm-approved");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("approval_required")),
        "{body}"
    );

    // The approver registers a passkey through the link (which signs them in), and signs
    // in with it again later.
    let mut key = Passkey::new();
    let mut enrolled = PageSession::default();
    let start = l.page_post(&format!("{enrol}/start"), &mut enrolled, json!({}));
    let credential = key.register(&start["options"], APPROVAL_ORIGIN);
    let done = l.page_post(
        &format!("{enrol}/finish"),
        &mut enrolled,
        json!({ "challenge_id": start["challenge_id"], "credential": credential }),
    );
    assert_eq!(done["operator_id"], APPROVER, "{done}");
    assert!(enrolled.cookie.is_some(), "enrolment signs in");
    let mut s = PageSession::default();
    let start = l.page_post(
        "/approvals/login/start",
        &mut s,
        json!({ "operator_id": APPROVER }),
    );
    let credential = key.assert(&start["options"], APPROVAL_ORIGIN);
    let done = l.page_post(
        "/approvals/login/finish",
        &mut s,
        json!({ "challenge_id": start["challenge_id"], "credential": credential }),
    );
    assert_eq!(done["operator_id"], APPROVER, "{done}");
    assert!(s.cookie.is_some(), "sign-in sets the session cookie");

    // Every desk's pending list shows the plan.
    let pending = l.page_get("/approvals", &s);
    assert!(
        pending.contains(&plan_id),
        "{plan_id} not pending: {pending}"
    );

    // The approval: the plan's page (its anti-forgery token), a ceremony bound to the plan.
    let page = l.page_get(&format!("/approvals/plans/{plan_id}"), &s);
    s.csrf = Some(csrf_token(&page));
    let start = l.page_post(
        &format!("/approvals/plans/{plan_id}/start"),
        &mut s,
        json!({ "decision": "approved" }),
    );
    let credential = key.assert(&start["options"], APPROVAL_ORIGIN);
    let done = l.page_post(
        &format!("/approvals/plans/{plan_id}/finish"),
        &mut s,
        json!({ "challenge_id": start["challenge_id"], "credential": credential }),
    );
    assert_eq!(
        (done["decision"].as_str(), done["approver"].as_str()),
        (Some("approved"), Some(APPROVER)),
        "{done}"
    );

    // Approved: the same execute now goes through, without a token.
    l.accepted(&approver, &p, "perm-approved");
}

/// The mcp function: every tool of the MCP endpoint, as a 2026-07-28 client calls them
/// (`server/discover`, `tools/list`, then `tools/call`), by a head trader with every desk:
/// the listings scan the accounts for the desks; a filter by account reads it; an action's
/// status (with a wait, answered at once for a finished action, and an unknown one); the
/// three plans (a sync and an order confirmed by token, so signed with the key; a limit
/// order reads the reference price; a cancel reads the order); the order and a sync
/// planned by the plan function executed with their tokens (the snapshot, the atomic step,
/// the send to each queue; the public key read to verify the sync's token, which another
/// process signed): the sync's send fails and its retried call
/// resumes it (the lease taken, the action read, sent, the key and action marked sent), the
/// order's retried call is a duplicate; an order planned under the default policy, whose
/// retried execute_plan is held (reading the plan) until the operator approves it. Its
/// orders and job then go through the workers. Runs under the token policy but for that
/// plan.
fn tour_mcp(w: &World, l: &mut Lambdas, symbol: &str, action_id: &str) {
    let agent = Op {
        sub: "op-mcp",
        roles: &["head_trader"],
        desks: None,
        scope: SERVICE_SCOPE,
    };
    let found = l.mcp(&agent, "server/discover", json!({}));
    assert!(found["capabilities"]["tools"].is_object(), "{found}");
    let listed = l.mcp(&agent, "tools/list", json!({}));
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("tools/list: {listed}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    let every: Vec<&str> = airlock::doors::mcp::tools::catalog()
        .iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, every, "a head trader sees every tool");

    // Reads.
    let accounts = l.tool_ok(&agent, "list_accounts", json!({}));
    assert!(
        accounts["accounts"].as_array().is_some_and(|a| a.len() > 1),
        "{accounts}"
    );
    l.tool_ok(&agent, "list_positions", json!({ "account_id": "ACC-1" }));
    l.tool_ok(&agent, "list_orders", json!({}));
    l.tool_ok(&agent, "list_jobs", json!({}));
    l.tool_ok(
        &agent,
        "portfolio_analysis",
        json!({ "account_id": "ACC-1" }),
    );
    l.tool_ok(&agent, "allocation_breakdown", json!({}));
    l.tool_ok(&agent, "risk_flags", json!({ "account_id": "ACC-1" }));
    let status = l.tool_ok(
        &agent,
        "get_action",
        json!({ "action_id": action_id, "wait": 2 }),
    );
    assert_eq!(status["action_id"], action_id, "{status}");
    let missing = l.tool(&agent, "get_action", json!({ "action_id": "act-none" }));
    assert_eq!(
        (
            missing["isError"].as_bool(),
            missing["structuredContent"]["error"]["code"].as_str()
        ),
        (Some(true), Some("action_not_found")),
        "{missing}"
    );

    // Plans: the sync and the order confirmed by token (signed), a cancel. The sync is
    // planned by the plan function: its token, signed in another process (as one made by
    // another container of this function, when Lambda scales out), is verified here with
    // the public key. A token this process signed itself needs no key (its bytes are
    // remembered), so without that plan no run would show the key read.
    l.tool_ok(
        &agent,
        "plan_positions_sync",
        json!({ "account_id": "ACC-1" }),
    );
    let sync = l.plan(&agent, "positions.sync", json!({ "account_id": "ACC-1" }));
    // A limit order (its band reads the paper broker's price table) that crosses the
    // price set above: it fills.
    let order_plan = l.tool_ok(
        &agent,
        "plan_cl_order",
        order("ACC-1", symbol, 1, Some("68.00")),
    );
    for p in [&sync, &order_plan] {
        assert_eq!(p["executable"], true, "{p}");
        assert!(p["confirmation_token"].is_string(), "{p}");
    }
    l.tool_ok(
        &agent,
        "plan_cancel_order",
        json!({ "account_id": "ACC-1", "order_id": "ORD-1003" }),
    );

    // Executes with the tokens. The sync is accepted while the queues are gone, so its
    // send fails; the retried call (the same derived key) resumes it: the key's lease
    // taken, the action read, sent, the key and the action marked sent. The order's
    // retried call is a duplicate.
    let execute = |p: &Value| {
        let (id, token) = (&p["plan_id"], &p["confirmation_token"]);
        json!({ "plan_id": id, "confirmation_token": token })
    };
    w.set_queues(false);
    let unsent = l.tool(&agent, "execute_plan", execute(&sync));
    assert_eq!(
        (
            unsent["isError"].as_bool(),
            unsent["structuredContent"]["error"]["code"].as_str()
        ),
        (Some(true), Some("upstream_unavailable")),
        "{unsent}"
    );
    w.set_queues(true);
    let synced = l.tool_ok(&agent, "execute_plan", execute(&sync));
    assert_eq!(synced["status"], "queued", "{synced}");
    let queued = l.tool_ok(&agent, "execute_plan", execute(&order_plan));
    assert_eq!(queued["status"], "queued", "{queued}");
    let again = l.tool_ok(&agent, "execute_plan", execute(&order_plan));
    assert_eq!(
        (again["status"].as_str(), &again["action_id"]),
        (Some("duplicate"), &queued["action_id"]),
        "{again}"
    );

    // An order under the default policy waits for its operator's approval: execute_plan
    // asks for it; the client's retry after the user opened the page is held, looking at
    // the plan, while the operator approves it (written here, on the test's own handle, as
    // the approval page would: its permissions are the approvals function's, toured above),
    // then executed once.
    w.cli(false, &[], &["policy", "reset"]);
    let approved = l.tool_ok(&agent, "plan_cl_order", order("ACC-1", symbol, 1, None));
    let token_mode = w.dir.join("token-policy.json");
    w.cli(
        false,
        &[],
        &["policy", "set", token_mode.to_str().expect("utf-8")],
    );
    let plan_id = approved["plan_id"].as_str().expect("plan id").to_string();
    assert_eq!(approved["confirmation_token"], Value::Null, "{approved}");
    let asked = l.tool(&agent, "execute_plan", json!({ "plan_id": plan_id }));
    assert_eq!(
        (
            asked["isError"].as_bool(),
            asked["structuredContent"]["error"]["code"].as_str()
        ),
        (Some(true), Some("approval_required")),
        "{asked}"
    );
    let retry = json!({
        "name": "execute_plan",
        "arguments": { "plan_id": plan_id },
        "inputResponses": { "approve": { "action": "accept" } },
    });
    let before = calls_so_far(&w.log);
    let held = std::thread::scope(|scope| {
        let approver = scope.spawn(|| approve_once_looked_at(w, &plan_id, before));
        let held = l.mcp(&agent, "tools/call", retry);
        assert!(
            approver.join().expect("the approver"),
            "the held call never looked at the plan: {held}"
        );
        held
    });
    assert_eq!(held["isError"], false, "{held}");
    assert_eq!(held["structuredContent"]["status"], "queued", "{held}");

    // The orders fill, then the sync runs.
    assert_eq!(l.drain(shapes::ORDERS_QUEUE.logical_id, "worker-orders"), 2);
    assert_eq!(w.order_status(&order_id(&queued)), OrderStatus::Filled);
    assert_eq!(
        w.order_status(&order_id(&held["structuredContent"])),
        OrderStatus::Filled
    );
    assert_eq!(l.drain(shapes::JOBS_QUEUE.logical_id, "worker-jobs"), 1);
}

/// Approves `plan_id` as its page would, once the mcp function has read the plan (a line
/// of the call log after the first `skip`), so the held call sees it waiting first. `false`
/// when the call never looked within 15 s.
fn approve_once_looked_at(w: &World, plan_id: &str, skip: usize) -> bool {
    let plans = prefixed("airlock-plans");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(&w.log).unwrap_or_default();
        let looked = text.lines().skip(skip).any(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_default();
            v["function"] == "mcp" && v["action"] == "dynamodb:GetItem" && v["resource"] == plans
        });
        if looked {
            break;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let plan = w
        .block(w.ports.plans.get_plan(plan_id))
        .expect("get plan")
        .expect("the plan");
    let now = w.clock.now_s() * 1000;
    let approval = airlock::core::records::Approval {
        decision: airlock::core::records::ApprovalDecision::Approved,
        approver: APPROVER.into(),
        credential_id: "perm-mcp-passkey".into(),
        user_verified: true,
        payload_hash: plan.payload_hash.clone(),
        at: now,
    };
    let audit = airlock::core::records::AuditRecord {
        audit_id: format!("aud-perm-mcp-{now}"),
        at: now,
        event: "approval".into(),
        decision: "approved".into(),
        action_type: Some(plan.action_type),
        idempotency_key: None,
        operator_id: plan.requested_by.clone(),
        service_principal: plan.service_principal.clone(),
        payload_hash: Some(plan.payload_hash.clone()),
        request_id: "perm-mcp".into(),
        approver: Some(APPROVER.into()),
        credential_id: Some(approval.credential_id.clone()),
        user_verified: Some(true),
        ..crate::ports::audit("perm-mcp", Some(&plan.plan_id))
    };
    let recorded = w
        .block(w.ports.plans.record_approval(
            plan_id,
            &airlock::core::records::ApprovalChange {
                seen: 0,
                approvals: vec![approval.clone()],
                decision: Some(approval.clone()),
                close: None,
            },
            &audit,
            now,
        ))
        .expect("record the approval");
    assert!(recorded, "the plan could not be approved");
    true
}

/// What an operator does with `airlock --backend aws` (docs/cli-iam-policy.json): find the
/// stack, the kill switch (engaged, pulling and flattening, and released), rollout modes, the
/// policy (set, shown and reset above), queue depths, audit trails of a plan and an action.
fn tour_cli(w: &World, action: &Audited) {
    w.cli(true, &[], &["bootstrap"]);
    w.cli(true, &[], &["kill-switch", "status"]);
    // The kill switch pulling working orders: of one account (its index queried), then of
    // every account (the index scanned), each a cancel stored and sent as execute does.
    let out = w.cli(
        true,
        &[],
        &[
            "kill-switch",
            "engage",
            "--reason",
            "pull",
            "--accounts",
            "ACC-2",
        ],
    );
    assert!(out.contains("cancel queued"), "{out}");
    w.cli(
        true,
        &[],
        &["kill-switch", "engage", "--reason", "pull all"],
    );
    // Flattening every account's open positions (the accounts scanned, each one's
    // positions queried, the reference prices read, a closing order stored with its
    // contracts reserved on the exposure), at a time the market is open. ACC-2's position
    // is above the tour's max_order_size: reported, and the command fails.
    let (ok, out, err) = run_cli_any(
        &w.moto,
        &w.dir,
        Some(w.log.as_path()),
        &[("AIRLOCK_NOW", MARKET_OPEN)],
        &[
            "kill-switch",
            "engage",
            "--reason",
            "flatten",
            "--keep-working",
            "--flatten",
        ],
    );
    assert!(
        !ok && err.contains("1 open position(s) were not flattened"),
        "{out}\n{err}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("flatten ACC-3 ") && l.contains(" queued (act_")),
        "{out}"
    );
    assert!(
        out.contains("flatten ACC-2 CLF27 +13: NOT FLATTENED: max_order_size: "),
        "{out}"
    );
    w.cli(true, &[], &["kill-switch", "status"]);
    w.cli(true, &[], &["kill-switch", "release"]);
    w.cli(true, &[], &["rollout"]);
    w.cli(true, &[], &["rollout", "positions.sync", "execute"]);
    w.cli(true, &[], &["queues"]);
    // A dead letter on each queue, moved back by the operator after a fix. Any the tour left
    // (a kill-switch cancel that ran out of receives while the machine was busy) are purged
    // first, not redriven (a redriven leftover can run out of receives again before the
    // count), so the count below is of these two alone.
    let sqs = w.aws.sqs.clone();
    let jobs_dlq = w.queue_urls["JobsDeadLetterQueue"].clone();
    let orders_dlq = w.queue_urls["OrdersDeadLetterQueue"].clone();
    w.block(async move {
        for q in [&jobs_dlq, &orders_dlq] {
            sqs.purge_queue()
                .queue_url(q.as_str())
                .send()
                .await
                .expect("purge a dead-letter queue");
        }
        sqs.send_message()
            .queue_url(jobs_dlq)
            .message_body("{}")
            .send()
            .await
            .expect("a jobs dead letter");
        sqs.send_message()
            .queue_url(orders_dlq)
            .message_body("{}")
            .message_group_id("ACC-9")
            .message_deduplication_id("perm-redrive")
            .send()
            .await
            .expect("an orders dead letter");
    });
    let out = w.cli(true, &[], &["queues", "redrive"]);
    assert!(
        out.contains("worker:jobs redriven=1") && out.contains("worker:orders redriven=1"),
        "{out}"
    );
    w.cli(true, &[], &["audit", &action.plan_id]);
    w.cli(true, &[], &["audit", &action.action_id]);
    // Operators who approve with passkeys: one enrolled (a link to this deployment's
    // approval page), the list (with the approver enrolled through the admin API), revoked.
    let origin = [("AIRLOCK_APPROVAL_ORIGIN", APPROVAL_ORIGIN)];
    let link = w.cli(
        true,
        &origin,
        &[
            "operators",
            "enroll",
            "--sub",
            "op-cli-enrolled",
            "--roles",
            "trader",
            "--desks",
            "energy",
        ],
    );
    assert!(
        link.starts_with(&format!("{APPROVAL_ORIGIN}/approvals/enroll/")),
        "{link}"
    );
    let listed = w.cli(true, &[], &["operators", "list"]);
    assert!(
        listed.contains(&format!(
            "{APPROVER}\troles=head_trader\tdesks=\tpasskeys=1"
        )) && listed.contains("op-cli-enrolled\troles=trader\tdesks=energy\tpasskeys=0"),
        "{listed}"
    );
    let out = w.cli(
        true,
        &[],
        &["operators", "revoke", "--sub", "op-cli-enrolled"],
    );
    assert!(out.starts_with("revoked op-cli-enrolled"), "{out}");
}

// ---------------------------------------------------------------------------------------
// Roles and policies, resolved to this deployment's names.

/// One permission an IAM principal is given: action and resource patterns (`*`, `?`).
#[derive(Debug, Clone)]
struct Grant {
    action: String,
    resource: String,
    /// Where it is written, for messages.
    from: String,
    /// Granted by a key policy itself (else by an IAM policy).
    in_key_policy: bool,
}

#[derive(Debug, Clone)]
struct Denial {
    action: String,
    resource: String,
    /// The statement does not apply to these roles (`StringNotEquals aws:PrincipalArn`).
    unless_roles: Vec<String>,
}

#[derive(Debug, Default)]
struct Principal {
    /// The role's logical id, or the policy file.
    name: String,
    grants: Vec<Grant>,
    denials: Vec<Denial>,
    /// KMS actions the key policy lets the account's IAM policies grant: an IAM grant of
    /// another KMS action on the key is void.
    delegated: Vec<String>,
}

/// IAM's wildcard match (`*` any run, `?` one character), case-sensitive.
fn glob(pattern: &str, s: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], s) || (!s.is_empty() && go(p, &s[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &s[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), s.as_bytes())
}

/// Actions are case-insensitive in IAM.
fn action_matches(pattern: &str, action: &str) -> bool {
    glob(&pattern.to_ascii_lowercase(), &action.to_ascii_lowercase())
}

struct Resolver<'a> {
    w: &'a World,
    log_groups: BTreeSet<String>,
    /// The deployment's parameters (the rest: their defaults), for the conditions of
    /// conditional policies.
    params: &'a BTreeMap<String, String>,
}

impl Resolver<'_> {
    /// The names a template resource stands for here (patterns for wildcards).
    fn resource(&self, r: &ResourceDef, key: Option<&str>) -> Result<Vec<String>, String> {
        let tpl = &self.w.tpl;
        Ok(match r {
            ResourceDef::Arn { logical_id, suffix } => {
                let base = if let Some(t) = tpl.table(logical_id) {
                    named(t.name_pattern.as_deref().unwrap_or_default())
                } else if let Some(q) = tpl.queue(logical_id) {
                    named(q.name_pattern.as_deref().unwrap_or_default())
                } else if tpl.keys.iter().any(|k| &k.logical_id == logical_id) {
                    self.w.key_arn.clone()
                } else if self.log_groups.contains(logical_id) {
                    format!("log-group:{logical_id}")
                } else {
                    return Err(format!("!GetAtt {logical_id}.Arn: unknown resource"));
                };
                vec![format!("{base}{suffix}")]
            }
            ResourceDef::Either(v) => {
                let mut out = Vec::new();
                for x in v {
                    out.extend(self.resource(x, key)?);
                }
                out.sort();
                out.dedup();
                out
            }
            // In a key policy, `*` is the key itself.
            ResourceDef::Literal(s) if s == "*" => vec![key.unwrap_or("*").to_string()],
            ResourceDef::Literal(arn) => vec![self.arn(arn)?],
        })
    }

    /// A literal ARN of the operator policy, where `airlock-...` names get the prefix.
    fn arn(&self, arn: &str) -> Result<String, String> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let [_, _, service, _, _, rest] = parts.as_slice() else {
            return Err(format!("{arn}: not an ARN"));
        };
        Ok(match *service {
            "dynamodb" => prefixed(
                rest.strip_prefix("table/")
                    .ok_or(format!("{arn}: not a table"))?,
            ),
            "sqs" => prefixed(rest),
            "kms" => match rest.strip_prefix("alias/") {
                Some(a) => format!("alias/{}", prefixed(a)),
                None if *rest == "key/*" => self.w.key_arn.clone(),
                None => return Err(format!("{arn}: only key/* or an alias")),
            },
            _ => return Err(format!("{arn}: service {service} is not used")),
        })
    }

    /// A statement's grants (or denials), with the conditions this proof understands:
    /// `StringEquals kms:RequestAlias` on an Allow (the grant holds when the code names the
    /// key by that alias), `StringNotEquals aws:PrincipalArn` on a Deny (every principal but
    /// that role, or those roles). Any other condition is reported, not guessed at.
    fn statement(
        &self,
        st: &StatementDef,
        key: Option<&str>,
        from: &str,
        p: &mut Principal,
        problems: &mut Vec<String>,
    ) {
        let from = match &st.sid {
            Some(sid) => format!("{from} ({sid})"),
            None => from.to_string(),
        };
        let mut resources = Vec::new();
        for r in &st.resources {
            match self.resource(r, key) {
                Ok(v) => resources.extend(v),
                Err(e) => problems.push(format!("{from}: {e}")),
            }
        }
        let cond = st.condition.as_ref().and_then(|c| c.as_mapping());
        let only = |op: &str, var: &str| -> Option<&serde_yaml::Value> {
            let c = cond?;
            if c.len() != 1 {
                return None;
            }
            let inner = c.get(op)?.as_mapping()?;
            (inner.len() == 1).then(|| inner.get(var)).flatten()
        };
        let allow = st.effect == "Allow";
        let mut unless_roles = Vec::new();
        if st.condition.is_some() {
            if let (true, Some(alias)) = (allow, only("StringEquals", "kms:RequestAlias")) {
                let aliases: Vec<String> = match alias {
                    serde_yaml::Value::Sequence(s) => s
                        .iter()
                        .filter_map(|a| a.as_str().map(String::from))
                        .collect(),
                    a => a.as_str().map(String::from).into_iter().collect(),
                };
                resources = aliases
                    .iter()
                    .map(|a| match a.strip_prefix("alias/") {
                        Some(n) => format!("alias/{}", prefixed(n)),
                        None => a.clone(),
                    })
                    .collect();
            } else if let (false, Some(role)) = (allow, only("StringNotEquals", "aws:PrincipalArn"))
            {
                // One role, or a list of them (the principal matches none of the values).
                let listed: Vec<&serde_yaml::Value> = match role {
                    serde_yaml::Value::Sequence(s) => s.iter().collect(),
                    one => vec![one],
                };
                let ids: Option<Vec<String>> =
                    listed.into_iter().map(template::referenced_id).collect();
                match ids {
                    Some(ids) if !ids.is_empty() => unless_roles = ids,
                    _ => problems.push(format!(
                        "{from}: aws:PrincipalArn must be !GetAtt Role.Arn, or a list of them"
                    )),
                }
            } else {
                problems.push(format!(
                    "{from}: condition {:?} is not understood by this proof",
                    st.condition
                ));
                return;
            }
        }
        for a in &st.actions {
            for r in &resources {
                if allow {
                    p.grants.push(Grant {
                        action: a.clone(),
                        resource: r.clone(),
                        from: from.clone(),
                        in_key_policy: key.is_some(),
                    });
                } else {
                    p.denials.push(Denial {
                        action: a.clone(),
                        resource: r.clone(),
                        unless_roles: unless_roles.clone(),
                    });
                }
            }
        }
    }

    /// The KMS actions the key policies delegate to the account's IAM policies.
    fn delegated(&self) -> Vec<String> {
        let mut out = Vec::new();
        for k in &self.w.tpl.keys {
            for st in &k.policy {
                if st.effect == "Allow" && st.principal == Some(PrincipalDef::Account) {
                    out.extend(st.actions.iter().cloned());
                }
            }
        }
        out
    }

    /// A function role: its inline and managed policies, and what key policies say of it.
    fn role(&self, role_id: &str, problems: &mut Vec<String>) -> Principal {
        let tpl = &self.w.tpl;
        let mut p = Principal {
            name: role_id.to_string(),
            delegated: self.delegated(),
            ..Principal::default()
        };
        let Some(role) = tpl.role(role_id) else {
            problems.push(format!("no role {role_id} in the template"));
            return p;
        };
        for st in &role.statements {
            self.statement(st, None, role_id, &mut p, problems);
        }
        // `!If [Condition, policy, !Ref AWS::NoValue]`: in force when the condition holds
        // in this deployment.
        for (cond, st) in &role.conditional_statements {
            match tpl.condition_holds(cond, self.params) {
                Ok(true) => {
                    let from = format!("{role_id} (if {cond})");
                    self.statement(st, None, &from, &mut p, problems);
                }
                Ok(false) => {}
                Err(e) => problems.push(format!("{role_id}: {e}")),
            }
        }
        for m in &role.managed_policies {
            match tpl.managed_policy(m) {
                Some(mp) => {
                    for st in &mp.statements {
                        self.statement(st, None, m, &mut p, problems);
                    }
                }
                None => problems.push(format!(
                    "{role_id}: managed policy {m} is not in the template"
                )),
            }
        }
        for e in &role.external_policies {
            problems.push(format!(
                "{role_id}: external managed policy {e} cannot be checked"
            ));
        }
        for k in &tpl.keys {
            for st in &k.policy {
                let about_us = match &st.principal {
                    Some(PrincipalDef::Role(r)) => r == role_id,
                    // A Deny for everyone applies to this role too; an Allow for the account
                    // only delegates to IAM policies (read above).
                    Some(PrincipalDef::Anyone) => st.effect != "Allow",
                    _ => false,
                };
                if about_us {
                    let from = format!("{} key policy", k.logical_id);
                    self.statement(st, Some(&self.w.key_arn), &from, &mut p, problems);
                }
            }
        }
        p
    }
}

impl Principal {
    fn allows(&self, action: &str, resource: &str) -> bool {
        let denied = self.denials.iter().any(|d| {
            action_matches(&d.action, action)
                && glob(&d.resource, resource)
                && !d.unless_roles.iter().any(|r| r == &self.name)
        });
        // A KMS action needs the key policy's say: its own grant, or its delegation to IAM.
        let kms_ok = |g: &Grant| {
            g.in_key_policy
                || !action.starts_with("kms:")
                || self.delegated.iter().any(|d| action_matches(d, action))
        };
        !denied
            && self.grants.iter().any(|g| {
                action_matches(&g.action, action) && glob(&g.resource, resource) && kms_ok(g)
            })
    }
}

/// A permission a process needs, and who needs it for what.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Need {
    function: String,
    action: String,
    resource: String,
    by: &'static str,
}

/// Lines in the call log so far.
fn calls_so_far(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .count()
}

/// The operations `function` called after the first `skip` lines of the log, in order,
/// one per call (a call logs one line per permission it needs).
fn calls_since(log: &Path, skip: usize, function: &str) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for l in text.lines().skip(skip) {
        let v: Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("call log line {l:?}: {e}"));
        if v["function"] != function {
            continue;
        }
        if seen.insert((v["pid"].as_u64(), v["call"].as_u64())) {
            out.push(v["operation"].as_str().unwrap_or_default().to_string());
        }
    }
    out
}

fn recorded(log: &Path) -> BTreeSet<Need> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("call log line {l:?}: {e}"));
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            Need {
                function: s("function"),
                action: s("action"),
                resource: s("resource"),
                by: "its code",
            }
        })
        .collect()
}

/// What the Lambda service does with a function's role: write its log group, and poll
/// its SQS trigger.
fn platform_needs(w: &World, f: &FunctionDef) -> Vec<Need> {
    let bin = f.binary.clone().unwrap_or_default();
    let need = |action: &str, resource: String, by| Need {
        function: bin.clone(),
        action: action.into(),
        resource,
        by,
    };
    let mut out = Vec::new();
    if let Some(g) = &f.log_group {
        for a in ["logs:CreateLogStream", "logs:PutLogEvents"] {
            out.push(need(a, format!("log-group:{g}"), "Lambda (its log group)"));
        }
    }
    for e in &f.events {
        if let EventDef::Sqs { queue } = e {
            let q = w.tpl.queue(queue).expect("trigger queue");
            let name = named(q.name_pattern.as_deref().unwrap_or_default());
            for a in [
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:GetQueueAttributes",
            ] {
                out.push(need(a, name.clone(), "Lambda (its SQS trigger)"));
            }
        }
    }
    out
}

/// The log groups of the template's functions, by logical id.
fn log_groups(w: &World) -> BTreeSet<String> {
    w.tpl
        .functions
        .iter()
        .filter_map(|f| f.log_group.clone())
        .collect()
}

/// Both directions, for every function and the CLI, in the deployment with `params`: every
/// problem, one per line.
fn proof(w: &World, params: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let resolver = Resolver {
        w,
        log_groups: log_groups(w),
        params,
    };
    let code = recorded(&w.log);
    let mut principals: BTreeMap<String, Principal> = BTreeMap::new();
    let mut needs: BTreeSet<Need> = code.clone();
    for f in &w.tpl.functions {
        let bin = f.binary.clone().unwrap_or_default();
        let Some(role) = &f.role else {
            problems.push(format!("{bin}: no Role"));
            continue;
        };
        principals.insert(bin.clone(), resolver.role(role, &mut problems));
        needs.extend(platform_needs(w, f));
        if !code.iter().any(|n| n.function == bin) {
            problems.push(format!("{bin}: the tour never ran it (nothing recorded)"));
        }
    }
    let cli_policy = Moto::repo_root().join("docs/cli-iam-policy.json");
    let text = std::fs::read_to_string(&cli_policy).expect("docs/cli-iam-policy.json");
    let mut cli = Principal {
        name: "docs/cli-iam-policy.json".into(),
        delegated: resolver.delegated(),
        ..Principal::default()
    };
    match template::policy_document(&text) {
        Ok(sts) => {
            for st in &sts {
                resolver.statement(
                    st,
                    None,
                    "docs/cli-iam-policy.json",
                    &mut cli,
                    &mut problems,
                );
            }
        }
        Err(e) => problems.push(format!("docs/cli-iam-policy.json: {e}")),
    }
    principals.insert("airlock".into(), cli);

    // (a) Everything needed is allowed.
    for n in &needs {
        match principals.get(&n.function) {
            None => problems.push(format!(
                "{}: recorded calls, but no template function or CLI has this name",
                n.function
            )),
            Some(p) if !p.allows(&n.action, &n.resource) => problems.push(format!(
                "MISSING  {}: {} on {} (needed by {}) is not allowed by {}",
                n.function, n.action, n.resource, n.by, p.name
            )),
            Some(_) => {}
        }
    }
    // (b) Everything allowed is needed, but for the listed exceptions.
    let mut excepted = BTreeSet::new();
    for (function, p) in &principals {
        for g in &p.grants {
            let used = needs.iter().any(|n| {
                &n.function == function
                    && action_matches(&g.action, &n.action)
                    && glob(&g.resource, &n.resource)
            });
            let exception = UNREACHED.iter().position(|(f, a, r, _)| {
                f == function && *a == g.action && prefixed(r) == g.resource
            });
            match (used, exception) {
                (true, Some(i)) => problems.push(format!(
                    "STALE    {function}: UNREACHED[{i}] ({} on {}) is recorded now: remove the entry",
                    g.action, g.resource
                )),
                (false, Some(i)) => {
                    excepted.insert(i);
                }
                (true, None) => {}
                (false, None) => problems.push(format!(
                    "EXCESS   {function}: {} allows {} on {}, which no run of it needed",
                    g.from, g.action, g.resource
                )),
            }
        }
    }
    for (i, (f, a, r, _)) in UNREACHED.iter().enumerate() {
        if !excepted.contains(&i) {
            problems.push(format!(
                "STALE    UNREACHED[{i}] ({f}: {a} on {r}) is no grant of its role: remove it"
            ));
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

#[test]
fn every_role_allows_exactly_what_its_code_does() {
    let started = Instant::now();
    let w = World::start();
    let (audited, params) = {
        let mut l = Lambdas::new(&w);
        (tour_functions(&w, &mut l), l.params.clone())
    };
    tour_cli(&w, &audited);
    let problems = proof(&w, &params);
    let summary: BTreeMap<String, BTreeSet<String>> =
        recorded(&w.log)
            .into_iter()
            .fold(BTreeMap::new(), |mut m, n| {
                m.entry(n.function)
                    .or_default()
                    .insert(format!("{} {}", n.action, n.resource));
                m
            });
    assert!(
        problems.is_empty(),
        "{} permission problem(s) between infra/template.yaml (or docs/cli-iam-policy.json) \
         and what the code does:\n{}\n\nrecorded per function:\n{}",
        problems.len(),
        problems.join("\n"),
        summary
            .iter()
            .map(|(f, s)| format!(
                "{f}:\n  {}",
                s.iter().cloned().collect::<Vec<_>>().join("\n  ")
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("permission proof: {:?}", started.elapsed());
}

/// The operations `function` made after the first `skip` lines of the call log, and the
/// permissions they needed (action, resource).
fn needs_since(log: &Path, skip: usize, function: &str) -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .skip(skip)
        .filter_map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("call log line {l:?}: {e}"));
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (v["function"] == function).then(|| (s("action"), s("resource")))
        })
        .collect()
}

/// The execute function's cold start makes no network call when the stack gives
/// it the confirmation public key (`ConfirmationPublicKey`, from `airlock confirmation-key`),
/// and its role then needs, and has, no KMS permission. The real binary, its template
/// environment, the call log, moto. Without the key it makes exactly one call at init
/// (`KMS.GetPublicKey`, as the proof's deployment, the default, does); with another key it
/// starts, and refuses every token (422 `token_invalid`, fail closed) saying why in its log
/// (never the token); with a malformed one it does not start.
#[test]
fn execute_with_its_public_key_configured_makes_no_call_at_cold_start() {
    use p256::pkcs8::{EncodePublicKey, LineEnding};
    const PARAM: &str = "ConfirmationPublicKey";
    let w = World::start();
    let mut l = Lambdas::new(&w);
    let me = trader("op-energy-trader");
    let cold_start = |l: &mut Lambdas| {
        let before = calls_so_far(&w.log);
        let init = l.try_start("execute", 0).expect("execute starts");
        (init, calls_since(&w.log, before, "execute"))
    };

    // The default deployment: one call before the first invocation.
    let (init_fetching, calls) = cold_start(&mut l);
    assert_eq!(calls, ["KMS.GetPublicKey"]);

    // The key as an operator takes it from the deployed stack, passed on one line (the
    // PEM's base64 body) as the README's deploy step does: no call at all.
    let pem = w.cli(false, &[], &["confirmation-key"]);
    let one_line: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    l.params.insert(PARAM.into(), one_line);
    let jwks_fetches = l.idp.fetches();
    let (init_configured, calls) = cold_start(&mut l);
    assert_eq!(calls, Vec::<String>::new(), "calls at cold start");
    // Nor any other network call: the identity providers' keys are fetched on first use.
    assert_eq!(l.idp.fetches(), jwks_fetches, "JWKS fetches at cold start");
    eprintln!(
        "execute init (debug build, moto): {init_fetching:?} fetching the key, \
         {init_configured:?} with it configured"
    );

    // A plan's token (signed by KMS through the plan function) verifies with it.
    let before = calls_so_far(&w.log);
    let plan = l.plan(&me, "positions.sync", json!({"account_id": "ACC-1"}));
    l.accepted(&me, &plan, "cold-start-configured");
    let calls = calls_since(&w.log, before, "execute");
    assert!(!calls.iter().any(|c| c.starts_with("KMS.")), "{calls:?}");

    // In this deployment the execute role grants no KMS action, and every call the
    // function made since its cold start is allowed.
    let resolver = Resolver {
        w: &w,
        log_groups: log_groups(&w),
        params: &l.params,
    };
    let mut problems = Vec::new();
    let role = l.function("execute").role.clone().expect("Role");
    let p = resolver.role(&role, &mut problems);
    assert_eq!(problems, Vec::<String>::new());
    let kms: Vec<_> = p
        .grants
        .iter()
        .filter(|g| g.action.starts_with("kms:"))
        .collect();
    assert!(kms.is_empty(), "{role} with {PARAM} set: {kms:?}");
    for (action, resource) in needs_since(&w.log, before, "execute") {
        assert!(p.allows(&action, &resource), "{action} on {resource}");
    }

    // Another key (the stack's key rotated, the parameter not): it starts, and refuses the
    // KMS-signed token; the log says why, and never holds the token.
    let other = p256::SecretKey::random(&mut rand::rngs::OsRng)
        .public_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("PEM");
    l.params.insert(PARAM.into(), other);
    let (_, calls) = cold_start(&mut l);
    assert_eq!(calls, Vec::<String>::new());
    let plan = l.plan(&me, "positions.sync", json!({"account_id": "ACC-1"}));
    let (status, body) = l.execute(&me, &plan, "cold-start-wrong-key");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("token_invalid")),
        "{body}"
    );
    let log = l.running["execute"].process.log();
    assert!(log.contains("key mismatch"), "{log}");
    let token = plan["confirmation_token"].as_str().expect("a token");
    assert!(!log.contains(token), "the token is logged:\n{log}");

    // A malformed key: the function does not start, and says which variable is wrong
    // (without quoting it).
    let malformed = "-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n";
    l.params.insert(PARAM.into(), malformed.into());
    let before = calls_so_far(&w.log);
    let e = l
        .try_start("execute", 0)
        .expect_err("a malformed key fails the start");
    assert!(e.contains("AIRLOCK_CONFIRMATION_PUBLIC_KEY"), "{e}");
    assert!(!e.contains("bm90IGEga2V5"), "{e}");
    assert_eq!(calls_since(&w.log, before, "execute"), Vec::<String>::new());
}
