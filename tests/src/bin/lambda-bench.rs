//! `lambda-bench`: cold start and peak memory of the release Lambda function binaries, run
//! the way Lambda runs them: under the Runtime API emulator (`airlock_tests::lambda`), fed API
//! Gateway REST proxy events, on the embedded backend (SQLite in a temp state dir).
//!
//! Run (from the workspace root):
//!
//! ```text
//! cargo build --release -p accounts -p positions -p orders -p jobs -p action-status -p plan -p execute \
//!     -p worker-orders -p worker-jobs -p sweeper \
//!     -p airlock-local   # airlock-local: the CLI and `serve`, for tokens and queued work (setup only)
//! cargo run --release -p airlock-tests --bin lambda-bench
//! ```
//!
//! The seven API functions get one API Gateway REST event each (below). The two workers get
//! SQS events with one record each, every invocation a message of its own that the setup
//! queued: the setup runs the release `airlock serve` (workers off, `AIRLOCK_NOW` at a CME
//! session) on the same state dir, plans and executes `runs + burst + 2` market orders (both
//! energy accounts, three CL months, sides alternating) and as many `positions.sync` actions,
//! stops it, and takes the message bodies from its queue table, so each `worker-orders`
//! invocation creates, submits and fills a new order and each `worker-jobs` one runs a new
//! sync job. The `sweeper` gets a scheduled event (nothing is left to sweep). The state dir's
//! `policy.json` confirms orders by the plan's token (the shipped default has an operator
//! approve them on the approval page, and the setup's executes would wait for that).
//!
//! For each function:
//!
//! - **cold start**: `--runs` (default 20) fresh processes; init = the time from `spawn()` to
//!   the process's first `GET /runtime/invocation/next` (state built, runtime polling). Also
//!   the first invocation's latency, after init.
//! - **memory**: one fresh process, then a burst of `--burst` (default 1000) invocations
//!   queued by `--callers` (default 8) threads; peak RSS = `VmHWM` of `/proc/<pid>/status` at
//!   the end (and after init, for comparison).
//!
//! Targets: init under 50 ms (checked on the max of the runs), peak RSS under 40 MB
//! (40,000,000 bytes). The embedded backend is not the AWS one: on AWS, init also builds the
//! SDK clients and fetches the KMS signing key's public key (`GetPublicKey`) before the first
//! `/next`, unless `AIRLOCK_CONFIRMATION_PUBLIC_KEY` gives it; that network round trip is not
//! in these figures.
//!
//! Options: `--runs N`, `--burst N`, `--callers N`, `--functions a,b,...` (default: all
//! ten), `--bin-dir DIR` (where the function binaries are; default: next to this
//! executable, i.e. `target/release` under `cargo run --release`), `--cli PATH` (the airlock
//! CLI; default `$AIRLOCK_TEST_BIN`, else `airlock` in the bin dir, else
//! `target/debug/airlock-failpoints` or `target/debug/airlock`).
//!
//! # `--execute-aws`: the execute function's CPU per invocation on the AWS backend
//!
//! ```text
//! cargo build --release -p execute -p airlock-local
//! cargo run --release -p airlock-tests --bin lambda-bench -- --execute-aws
//! ```
//!
//! What it measures: the CPU one warm `execute` invocation costs on the AWS backend. The
//! setup starts moto (`airlock_tests::moto`, the emulator the AWS suites use), runs
//! `airlock bootstrap --demo-data` against it, sets a policy confirming orders by token
//! (`airlock policy set`, the control record) and starts a stand-in identity provider
//! (`airlock_tests::idp`; a deployed function accepts no dev-issuer token). The release
//! `airlock serve --backend aws` (workers off, real clock) then makes `--invocations` (default
//! 300) + 7 plans of `--action` (default `order.submit.cl`: market orders over both energy
//! accounts and three CL months, sides alternating; or `positions.sync`). One release
//! `execute` process starts under the Runtime API emulator with the template's environment
//! (AWS backend, EMF metrics, `RUST_LOG=info`, the queue URLs, and
//! `AIRLOCK_CONFIRMATION_PUBLIC_KEY` from `airlock confirmation-key`, so its cold start makes
//! no call; `--no-public-key` leaves it unset: one KMS `GetPublicKey` at init), gets 5
//! warm-up executes, then the measured ones one after another, each with its own plan, token
//! and idempotency key. Reported: utime + stime of the process (`/proc/<pid>/stat`) over the
//! measured invocations divided by their number (target 1.5 ms), latency p50/p99 as the
//! emulator sees it (moto's time included), the function's context switches and moto's CPU
//! per invocation, CPU and latency by fifth of the run (moto slows down as its tables grow,
//! and the function's CPU per invocation rises with it while its context switches do not:
//! presumably moto's work between the function's steps evicts its caches), the statuses, and
//! the AWS calls of one warm invocation (from a separate probe process with
//! `AIRLOCK_AWS_CALL_LOG`, which costs CPU, so not the measured one), and the slow
//! invocations (round trip over twice the median: how many, how far apart, and the
//! handler's own time in each) next to moto's full garbage collections in the same window
//! (`scripts/moto_serial.py` logs each with its duration).
//!
//! moto's server closes every connection after one answer, where AWS keeps them alive and
//! the SDK reuses them; so the measured function reaches moto through
//! `airlock_tests::faults::FaultProxy` with no rule, which keeps the function's connections
//! alive, as AWS would. `--direct` measures it on moto's own connections instead (a TCP connection
//! per AWS call, about 0.3 to 0.5 ms more CPU per invocation). `--function-env K=V`
//! (repeatable) adds to or overrides the measured function's environment, e.g.
//! `--function-env RUST_LOG=warn --function-env AIRLOCK_METRICS=off` to see what logging and
//! metrics cost.
//!
//! The functions read the real clock, and CME crude is closed 22:00-23:00 UTC on weekdays
//! and at weekends: orders planned then are not executable and carry no token, so execute
//! refuses them (422 `token_invalid`, after its one read and an audit write); the table says
//! which path was measured. `--action positions.sync` measures an accepting path at any
//! hour.
//!
//! Not a test: nothing here runs under `cargo test`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_tests::faults::FaultProxy;
use airlock_tests::idp::{Idp, Key};
use airlock_tests::lambda::{
    apigw_rest_event, response_parts, FunctionProcess, LambdaEmulator, IGNORE_STAGE_ENV,
};
use airlock_tests::moto::Moto;
use airlock_tests::{cli, temp_state_dir, BASE, COMBOS, MARKET_OPEN};
use serde_json::{json, Value};

const ALL: [&str; 10] = [
    "accounts",
    "positions",
    "orders",
    "jobs",
    "action-status",
    "plan",
    "execute",
    "worker-orders",
    "worker-jobs",
    "sweeper",
];
const INIT_TARGET: Duration = Duration::from_millis(50);
const RSS_TARGET_BYTES: u64 = 40_000_000;
const TIMEOUT: Duration = Duration::from_secs(30);

struct Opts {
    runs: usize,
    burst: usize,
    callers: usize,
    functions: Vec<String>,
    bin_dir: PathBuf,
    cli: Option<PathBuf>,
    execute_aws: bool,
    invocations: usize,
    action: String,
    no_public_key: bool,
    /// `--direct`: the measured function talks to moto directly, a new connection per
    /// call, instead of through the keep-alive proxy.
    direct: bool,
    /// `--function-env K=V`: more environment for the measured function (last wins).
    function_env: Vec<(String, String)>,
}

fn usage() -> ! {
    eprintln!(
        "usage: lambda-bench [--runs N] [--burst N] [--callers N] [--functions a,b] \
         [--bin-dir DIR] [--cli PATH]\n       lambda-bench --execute-aws [--invocations N] \
         [--action order.submit.cl|positions.sync] [--no-public-key] [--direct] [--function-env K=V]... \
         [--bin-dir DIR] [--cli PATH]"
    );
    std::process::exit(2)
}

fn parse_opts() -> Opts {
    let exe = std::env::current_exe().expect("current exe");
    let mut o = Opts {
        runs: 20,
        burst: 1000,
        callers: 8,
        functions: ALL.iter().map(|s| s.to_string()).collect(),
        bin_dir: exe.parent().expect("exe dir").to_path_buf(),
        cli: None,
        execute_aws: false,
        invocations: 300,
        action: "order.submit.cl".into(),
        no_public_key: false,
        direct: false,
        function_env: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--runs" => o.runs = val().parse().unwrap_or_else(|_| usage()),
            "--burst" => o.burst = val().parse().unwrap_or_else(|_| usage()),
            "--callers" => o.callers = val().parse().unwrap_or_else(|_| usage()),
            "--functions" => o.functions = val().split(',').map(String::from).collect(),
            "--bin-dir" => o.bin_dir = PathBuf::from(val()),
            "--cli" => o.cli = Some(PathBuf::from(val())),
            "--execute-aws" => o.execute_aws = true,
            "--invocations" => o.invocations = val().parse().unwrap_or_else(|_| usage()),
            "--action" => o.action = val(),
            "--no-public-key" => o.no_public_key = true,
            "--direct" => o.direct = true,
            "--function-env" => {
                let kv = val();
                let (k, v) = kv.split_once('=').unwrap_or_else(|| usage());
                o.function_env.push((k.into(), v.into()));
            }
            _ => usage(),
        }
    }
    let actions = ["order.submit.cl", "positions.sync"];
    if o.runs == 0
        || o.burst == 0
        || o.callers == 0
        || o.invocations == 0
        || !actions.contains(&o.action.as_str())
    {
        usage()
    }
    o
}

/// The airlock CLI (setup only: tokens, demo data).
fn cli_binary(o: &Opts) -> PathBuf {
    if let Some(p) = &o.cli {
        return p.clone();
    }
    if let Ok(p) = std::env::var("AIRLOCK_TEST_BIN") {
        return PathBuf::from(p);
    }
    let target = o.bin_dir.parent().unwrap_or(Path::new("."));
    let candidates = [
        o.bin_dir.join("airlock"),
        target.join("debug").join("airlock-failpoints"),
        target.join("debug").join("airlock"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no airlock CLI found (tried {candidates:?}): cargo build -p airlock-local, \
                 or pass --cli"
            )
        })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[Duration], q: f64) -> Duration {
    let n = sorted.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[rank - 1]
}

fn mb(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

struct Setup {
    dir: PathBuf,
    service: String,
    operator: String,
    plan: Value,
    action_id: Option<String>,
    /// Queued message bodies with their group (account), per queue, for the workers.
    orders_queue: Vec<(String, String)>,
    jobs_queue: Vec<(String, String)>,
    next_message: std::sync::atomic::AtomicUsize,
}

fn cli_env() -> Vec<(String, String)> {
    vec![("AIRLOCK_BACKEND".to_string(), "embedded".to_string())]
}

impl Setup {
    /// Fresh tokens (service tokens live at most 900 s): before each function's run.
    fn mint_tokens(&mut self) {
        let env = cli_env();
        self.service = cli(&self.dir, &env, &["token", "service"]);
        self.operator = cli(
            &self.dir,
            &env,
            &airlock_tests::trader_args(&["token", "operator"]),
        );
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![
            ("Authorization", format!("Bearer {}", self.service)),
            ("X-Operator-Token", self.operator.clone()),
            ("Content-Type", "application/json".into()),
            ("User-Agent", "lambda-bench".into()),
        ]
    }

    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("AIRLOCK_BACKEND", "embedded"),
            ("AIRLOCK_STATE_DIR", self.dir.to_str().expect("utf-8 dir")),
            ("RUST_LOG", "info"),
            IGNORE_STAGE_ENV,
        ]
    }

    /// The event a function gets in the benchmark: one representative request (for the
    /// workers, the next queued message).
    fn event(&self, function: &str) -> Value {
        match function {
            "worker-orders" | "worker-jobs" => {
                let q = if function == "worker-orders" {
                    &self.orders_queue
                } else {
                    &self.jobs_queue
                };
                let i = self
                    .next_message
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (body, group) = q.get(i % q.len().max(1)).cloned().unwrap_or_default();
                return sqs_event(&format!("m-{i}"), &body, &group, function);
            }
            "sweeper" => {
                return json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}})
            }
            _ => {}
        }
        let h = self.headers();
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let ev = |method: &str, path: &str, query: &[(&str, &str)], body: Option<&str>| {
            apigw_rest_event(method, &format!("{BASE}{path}"), query, &h, body)
        };
        match function {
            "accounts" => ev("GET", "/accounts", &[], None),
            "positions" => ev("GET", "/positions", &[("account_id", "ACC-1")], None),
            "orders" => ev("GET", "/orders", &[("limit", "50")], None),
            "jobs" => ev("GET", "/jobs", &[], None),
            "action-status" => {
                let id = self
                    .action_id
                    .as_deref()
                    .unwrap_or("act_lambda_bench_missing");
                ev("GET", &format!("/actions/{id}"), &[], None)
            }
            "plan" => ev("POST", "/actions/plan", &[], Some(&plan_body().to_string())),
            "execute" => {
                // A plan made while CME is closed is not executable and has no confirmation
                // token (Lambdas ignore AIRLOCK_NOW): then send a well-formed JWT that is not
                // a confirmation token, so execute runs auth, the plan lookup and the token
                // check before it refuses.
                let token = self.plan["confirmation_token"]
                    .as_str()
                    .unwrap_or(&self.operator)
                    .to_string();
                let body = json!({
                    "plan_id": self.plan["plan_id"],
                    "confirmation_token": token,
                    "idempotency_key": "lambda-bench-execute",
                    "requested_by": "op-energy-trader"
                });
                ev("POST", "/actions/execute", &[], Some(&body.to_string()))
            }
            other => panic!("unknown function {other}"),
        }
    }
}

/// An SQS event with one record, as Lambda's event source mapping delivers it.
fn sqs_event(id: &str, body: &str, group: &str, function: &str) -> Value {
    let fifo = function == "worker-orders";
    let mut attributes = json!({ "ApproximateReceiveCount": "1" });
    if fifo {
        attributes["MessageGroupId"] = json!(group);
    }
    json!({
        "Records": [{
            "messageId": id,
            "receiptHandle": format!("receipt-{id}"),
            "body": body,
            "attributes": attributes,
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": if fifo {
                "arn:aws:sqs:us-east-1:123456789012:airlock-worker-orders.fifo"
            } else {
                "arn:aws:sqs:us-east-1:123456789012:airlock-worker-jobs"
            },
            "awsRegion": "us-east-1"
        }]
    })
}

/// Queues `n` market orders and `n` `positions.sync` actions with the release `airlock
/// serve` (workers off, clock at a CME session) on the state dir, and returns the queue's
/// message bodies and groups: (orders, jobs).
#[allow(clippy::type_complexity)]
fn queue_work(
    cli_bin: &Path,
    dir: &Path,
    n: usize,
) -> (Vec<(String, String)>, Vec<(String, String)>) {
    let env = vec![
        ("AIRLOCK_BACKEND".to_string(), "embedded".to_string()),
        ("AIRLOCK_NOW".to_string(), MARKET_OPEN.to_string()),
    ];
    let service = cli(dir, &env, &["token", "service"]);
    let (child, base) = spawn_serve(cli_bin, dir, &env);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let clients = 4;
    rt.block_on(async {
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for w in 0..clients {
            let sub = format!("op-lambda-bench-{w}");
            let op = cli(
                dir,
                &env,
                &[
                    "token", "operator", "--sub", &sub, "--roles", "trader", "--desks", "energy",
                ],
            );
            let (next, base, service) = (next.clone(), base.clone(), service.clone());
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::new();
                let post = |path: &str, body: Value| {
                    http.post(format!("{base}{BASE}{path}"))
                        .header("authorization", format!("Bearer {service}"))
                        .header("x-operator-token", &op)
                        .header("content-type", "application/json")
                        .body(body.to_string())
                        .send()
                };
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if k >= 2 * n {
                        break;
                    }
                    let payload = if k % 2 == 0 {
                        let j = k / 2;
                        let (account, symbol) = COMBOS[j % COMBOS.len()];
                        let side = if (j / COMBOS.len()).is_multiple_of(2) {
                            "buy"
                        } else {
                            "sell"
                        };
                        json!({"action_type": "order.submit.cl", "payload": {
                            "account_id": account, "symbol": symbol, "side": side,
                            "quantity": 1, "order_type": "market"}})
                    } else {
                        let account = if (k / 2) % 2 == 0 { "ACC-1" } else { "ACC-2" };
                        json!({"action_type": "positions.sync", "payload": {"account_id": account}})
                    };
                    let mut body = payload;
                    body["requested_by"] = json!(sub);
                    let plan: Value = post("/actions/plan", body)
                        .await
                        .expect("plan")
                        .json()
                        .await
                        .expect("plan JSON");
                    assert_eq!(plan["executable"], true, "setup plan: {plan}");
                    let r = post(
                        "/actions/execute",
                        json!({
                            "plan_id": plan["plan_id"],
                            "confirmation_token": plan["confirmation_token"],
                            "idempotency_key": format!("lambda-bench-{k}"),
                            "requested_by": sub,
                        }),
                    )
                    .await
                    .expect("execute");
                    assert_eq!(
                        r.status().as_u16(),
                        202,
                        "setup execute: {:?}",
                        r.text().await
                    );
                }
            }));
        }
        for t in tasks {
            t.await.expect("setup task");
        }
    });
    stop_serve(child);
    let db = rusqlite::Connection::open(dir.join("airlock.db")).expect("open db");
    let mut st = db
        .prepare("SELECT queue, body, group_key FROM queue WHERE status = 'ready' ORDER BY id")
        .expect("prepare");
    let rows: Vec<(String, String, String)> = st
        .query_map([], |r| {
            Ok((r.get(0)?, airlock_tests::stored_body(r, 1)?, r.get(2)?))
        })
        .expect("query")
        .filter_map(Result::ok)
        .collect();
    let pick = |q: &str| -> Vec<(String, String)> {
        rows.iter()
            .filter(|(name, _, _)| name == q)
            .map(|(_, b, g)| (b.clone(), g.clone()))
            .collect()
    };
    (pick("worker:orders"), pick("worker:jobs"))
}

fn plan_body() -> Value {
    json!({
        "action_type": "order.submit.cl",
        "payload": {
            "account_id": "ACC-1", "symbol": "CLF27", "side": "buy",
            "quantity": 1, "order_type": "market"
        },
        "requested_by": "op-energy-trader",
        "chat_context": { "chat_session_id": "bench", "tool_call_id": "bench" }
    })
}

fn start(emu: &LambdaEmulator, bin: &Path, s: &Setup) -> (FunctionProcess, Duration) {
    let mut f = emu.spawn_function(bin, &s.env());
    let init = f
        .wait_ready(TIMEOUT)
        .unwrap_or_else(|e| panic!("{} did not start: {e}", bin.display()));
    (f, init)
}

/// The HTTP status of an API function's answer; for a worker, `ok` when no record failed
/// (else `failed`); for the sweeper, `sent=N`.
fn status_of(r: &Result<Value, String>) -> String {
    match r {
        Ok(v) if v.get("batchItemFailures").is_some() => {
            if v["batchItemFailures"]
                .as_array()
                .is_some_and(|a| a.is_empty())
            {
                "ok".into()
            } else {
                "failed".into()
            }
        }
        Ok(v) if v.get("sent").is_some() => format!("sent={}", v["sent"]),
        Ok(v) => response_parts(v).0.to_string(),
        Err(_) => "invoke error".into(),
    }
}

/// The state dir, tokens, demo data, one plan (via the release `plan` function) and, if the
/// market is open now, one executed action (via `execute`) for `action-status`.
fn setup(o: &Opts) -> Setup {
    let dir = temp_state_dir();
    let cli_bin = cli_binary(o);
    std::env::set_var("AIRLOCK_TEST_BIN", &cli_bin);
    let mut s = Setup {
        dir,
        service: String::new(),
        operator: String::new(),
        plan: Value::Null,
        action_id: None,
        orders_queue: Vec::new(),
        jobs_queue: Vec::new(),
        next_message: Default::default(),
    };
    // Orders confirmed by the plan's token (the shipped default has an operator approve
    // them on the approval page): every process on the state dir reads this file.
    std::fs::write(s.dir.join("policy.json"), TOKEN_POLICY).expect("policy.json");
    s.mint_tokens();
    cli(&s.dir, &cli_env(), &["seed-orders", "0"]);
    if o.functions.iter().any(|f| f.starts_with("worker-")) {
        let n = o.runs + o.burst + 2;
        let t = Instant::now();
        let (orders, jobs) = queue_work(&cli_bin, &s.dir, n);
        println!(
            "setup: queued {} order and {} job messages with `airlock serve` in {:.1} s",
            orders.len(),
            jobs.len(),
            t.elapsed().as_secs_f64()
        );
        assert!(
            orders.len() >= n && jobs.len() >= n,
            "setup: not enough queued messages"
        );
        s.orders_queue = orders;
        s.jobs_queue = jobs;
    }
    let emu = LambdaEmulator::start();
    let (mut f, _) = start(&emu, &o.bin_dir.join("plan"), &s);
    let r = f.invoke(s.event("plan"), TIMEOUT).expect("setup plan");
    let (st, plan) = response_parts(&r);
    assert_eq!(st, 200, "setup plan: {r}");
    s.plan = plan;
    drop(f);
    let (mut f, _) = start(&emu, &o.bin_dir.join("execute"), &s);
    let r = f
        .invoke(s.event("execute"), TIMEOUT)
        .expect("setup execute");
    let (st, body) = response_parts(&r);
    if (200..300).contains(&st) {
        s.action_id = body["action_id"].as_str().map(String::from);
    }
    println!(
        "setup: CLI {}, state dir {}, plan executable: {}, execute → {st} {} {}",
        cli_bin.display(),
        s.dir.display(),
        s.plan["executable"],
        body["error"]["code"].as_str().unwrap_or(""),
        body["error"]["message"].as_str().unwrap_or("")
    );
    s
}

struct Figures {
    function: String,
    init: Vec<Duration>,
    first: Vec<Duration>,
    first_status: BTreeMap<String, usize>,
    hwm_init_kb: u64,
    hwm_kb: u64,
    rss_kb: u64,
    burst_elapsed: Duration,
    burst_lat: Vec<Duration>,
    burst_status: BTreeMap<String, usize>,
}

fn bench(o: &Opts, s: &Setup, function: &str) -> Figures {
    let bin = o.bin_dir.join(function);
    let emu = LambdaEmulator::start();
    let mut init = Vec::new();
    let mut first = Vec::new();
    let mut first_status = BTreeMap::new();
    for _ in 0..o.runs {
        let (mut f, d) = start(&emu, &bin, s);
        init.push(d);
        let t = Instant::now();
        let r = f.invoke(s.event(function), TIMEOUT);
        first.push(t.elapsed());
        *first_status.entry(status_of(&r)).or_insert(0) += 1;
    }
    init.sort();
    first.sort();

    let (mut f, _) = start(&emu, &bin, s);
    let hwm_init_kb = f.proc_status_kb("VmHWM").unwrap_or(0);
    let lat = Mutex::new(Vec::with_capacity(o.burst));
    let statuses = Mutex::new(BTreeMap::new());
    let t = Instant::now();
    std::thread::scope(|sc| {
        for c in 0..o.callers {
            let n = o.burst / o.callers + usize::from(c < o.burst % o.callers);
            let (emu, lat, statuses) = (&emu, &lat, &statuses);
            sc.spawn(move || {
                for _ in 0..n {
                    let t = Instant::now();
                    let r = emu.invoke(s.event(function), TIMEOUT);
                    let d = t.elapsed();
                    lat.lock().unwrap().push(d);
                    *statuses.lock().unwrap().entry(status_of(&r)).or_insert(0) += 1;
                }
            });
        }
    });
    let burst_elapsed = t.elapsed();
    let hwm_kb = f.proc_status_kb("VmHWM").unwrap_or(0);
    let rss_kb = f.proc_status_kb("VmRSS").unwrap_or(0);
    // Still the same process, alive: one more invocation answers.
    f.invoke(s.event(function), TIMEOUT)
        .unwrap_or_else(|e| panic!("{function} after the burst: {e}"));
    drop(f);
    let mut burst_lat = lat.into_inner().unwrap();
    burst_lat.sort();
    Figures {
        function: function.into(),
        init,
        first,
        first_status,
        hwm_init_kb,
        hwm_kb,
        rss_kb,
        burst_elapsed,
        burst_lat,
        burst_status: statuses.into_inner().unwrap(),
    }
}

fn statuses(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}×{v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let o = parse_opts();
    if o.execute_aws {
        let bin = o.bin_dir.join("execute");
        assert!(
            bin.exists(),
            "{} is missing: cargo build --release -p execute (or pass --bin-dir)",
            bin.display()
        );
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "lambda-bench --execute-aws: {} invocations of {}; {} CPUs; loadavg {}; now {}",
            o.invocations,
            bin.display(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            load.trim(),
            chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
        );
        execute_aws(&o);
        return;
    }
    for f in &o.functions {
        let bin = o.bin_dir.join(f);
        assert!(
            bin.exists(),
            "{} is missing: cargo build --release -p accounts -p positions -p orders -p jobs \
             -p action-status -p plan -p execute -p worker-orders -p worker-jobs -p sweeper \
             (or pass --bin-dir)",
            bin.display()
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "lambda-bench: {} runs/function, burst {} invocations from {} callers; bin dir {}; \
         {} CPUs; loadavg {}",
        o.runs,
        o.burst,
        o.callers,
        o.bin_dir.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.trim()
    );
    let mut s = setup(&o);
    let mut results = Vec::new();
    for f in &o.functions {
        s.mint_tokens();
        s.next_message.store(0, std::sync::atomic::Ordering::SeqCst);
        let r = bench(&o, &s, f);
        eprintln!(
            "{f}: init p50 {:.1} ms, VmHWM {} (loadavg {})",
            ms(pct(&r.init, 0.5)),
            mb(r.hwm_kb),
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        results.push(r);
    }
    let _ = std::fs::remove_dir_all(&s.dir);

    println!();
    println!(
        "| function | init min / p50 / max (ms) | init < 50 ms | 1st invoke p50 (ms) | \
         VmHWM after init | VmHWM after burst | VmRSS after burst | peak < 40 MB | \
         burst inv/s | burst p50 / p99 (ms) | statuses (1st / burst) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all_ok = true;
    for r in &results {
        let init_ok = *r.init.last().unwrap() < INIT_TARGET;
        let rss_ok = r.hwm_kb * 1024 < RSS_TARGET_BYTES;
        all_ok &= init_ok && rss_ok;
        println!(
            "| {} | {:.1} / {:.1} / {:.1} | {} | {:.2} | {} | {} | {} | {} | {:.0} | {:.2} / {:.2} | {} / {} |",
            r.function,
            ms(r.init[0]),
            ms(pct(&r.init, 0.5)),
            ms(*r.init.last().unwrap()),
            if init_ok { "yes" } else { "NO" },
            ms(pct(&r.first, 0.5)),
            mb(r.hwm_init_kb),
            mb(r.hwm_kb),
            mb(r.rss_kb),
            if rss_ok { "yes" } else { "NO" },
            r.burst_lat.len() as f64 / r.burst_elapsed.as_secs_f64(),
            ms(pct(&r.burst_lat, 0.5)),
            ms(pct(&r.burst_lat, 0.99)),
            statuses(&r.first_status),
            statuses(&r.burst_status),
        );
    }
    println!();
    println!(
        "Embedded backend (SQLite in a temp dir, local keys). On the AWS backend, init also \
         builds the AWS SDK clients, and the execute function makes one KMS GetPublicKey \
         call (the key that verifies confirmation tokens) before the first /next unless \
         AIRLOCK_CONFIRMATION_PUBLIC_KEY gives the key: add that round trip to the init \
         figures. Burst latency is emulator round trip with {} callers \
         queued against one sequential function process (Lambda's model: one invocation at a \
         time per environment).",
        o.callers
    );
    println!(
        "targets: {}",
        if all_ok {
            "all met"
        } else {
            "NOT all met (see NO above)"
        }
    );
}

// ---------------------------------------------------------------------------------------
// `--execute-aws`: the execute function's CPU per invocation on the AWS backend (moto).

/// The stand-in identity provider's issuer (both token kinds), as the permission proof's.
const ISSUER: &str = "https://idp.test/";
/// Orders confirmed by the plan's token (the shipped default has an operator approve them).
const TOKEN_POLICY: &str = r#"{"version": "lambda-bench-token", "max_messages_per_window": 4000000000, "confirmation": {"order.submit.cl": "token"}}"#;
/// The target for the execute function's CPU per invocation (BENCHMARKS.md).
const CPU_TARGET: Duration = Duration::from_micros(1500);
/// Invocations before the measured ones (the first pays for the JWKS fetch and lazy init).
const WARMUP: usize = 5;

/// User + system CPU time of a process so far (`utime` + `stime` of `/proc/<pid>/stat`,
/// its exited threads included), in clock ticks of `getconf CLK_TCK` (else 100).
fn cpu_time(pid: u32) -> Duration {
    static TICK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let hz = *TICK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (in parentheses, may hold spaces) come fields 3 (state) on:
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    Duration::from_secs_f64(ticks as f64 / hz)
}

/// Context switches (voluntary and not) of a process's live threads so far
/// (`/proc/<pid>/task/*/status`): how often it went to sleep and woke up.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.split_once(':'))
                .filter(|(k, _)| k.ends_with("voluntary_ctxt_switches"))
                .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Starts the release `airlock serve` (workers off, no execute rate limit) on `dir` with
/// `env`; returns the process and its base URL. Stop it with [`stop_serve`].
fn spawn_serve(
    cli_bin: &Path,
    dir: &Path,
    env: &[(String, String)],
) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(cli_bin);
    cmd.arg("--state-dir")
        .arg(dir)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .env_remove("AIRLOCK_NOW")
        .env("AIRLOCK_WORKERS", "off")
        .env("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "1000000")
        .env("AIRLOCK_PLAN_RATE_PER_MINUTE", "1000000")
        // Orders are queued with the workers off: no admission check.
        .env("AIRLOCK_ORDERS_BACKLOG_LIMIT", "0")
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn airlock serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let Some(base) = line.split_whitespace().find(|w| w.starts_with("http://")) else {
        stop_serve(child);
        panic!("airlock serve did not start: {line:?}");
    };
    let base = base.to_string();
    (child, base)
}

fn stop_serve(mut child: std::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// The handler's own latency (`latency_ms` of the request log line, time inside the
/// function, its AWS calls included) of the last `n` requests in a function's log.
fn handler_latencies(log: &str, n: usize) -> Vec<f64> {
    let all: Vec<f64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "request")
        .filter_map(|v| v["fields"]["latency_ms"].as_f64())
        .collect();
    all[all.len().saturating_sub(n)..].to_vec()
}

/// The slow invocations (over twice the median round trip): how many, how far apart, and
/// how much of each the handler spent (the rest is the emulator's and the runtime's).
fn print_slow(lat: &[Duration], handler: &[f64]) {
    let mut sorted = lat.to_vec();
    sorted.sort();
    let p50 = pct(&sorted, 0.5);
    let slow: Vec<usize> = (0..lat.len()).filter(|&i| lat[i] > p50 * 2).collect();
    let gaps: Vec<usize> = slow.windows(2).map(|w| w[1] - w[0]).collect();
    let shown: Vec<String> = slow
        .iter()
        .take(12)
        .map(|&i| {
            let h = handler.get(i).map_or("?".into(), |h| format!("{h:.0}"));
            format!("#{i}: {:.0} ms (handler {h} ms)", ms(lat[i]))
        })
        .collect();
    let median_handler = {
        let mut h = handler.to_vec();
        h.sort_by(f64::total_cmp);
        h.get(h.len() / 2).copied().unwrap_or(0.0)
    };
    println!(
        "slow invocations (round trip > 2 x p50 = {:.0} ms): {} of {}; gaps between them: {:?}; \
         handler's median {median_handler:.1} ms; first ones: {}",
        ms(p50 * 2),
        slow.len(),
        lat.len(),
        gaps,
        shown.join(", ")
    );
}

/// moto's full garbage collections in a part of its log (`scripts/moto_serial.py` logs
/// each with its duration): a request that arrives during one waits for it.
fn print_moto_pauses(log: &str) {
    let pauses: Vec<f64> = log
        .lines()
        .filter_map(|l| l.strip_prefix("moto-gc: generation 2 collection took "))
        .filter_map(|r| r.trim_end_matches(" ms").parse().ok())
        .collect();
    println!(
        "moto's full garbage collections during the run: {}, {:.0} ms in all: {:?} ms",
        pauses.len(),
        pauses.iter().sum::<f64>(),
        pauses.iter().map(|p| p.round() as u64).collect::<Vec<_>>()
    );
}

/// The AWS stack of `--execute-aws`: moto bootstrapped with demo data and the token
/// policy, and an identity provider whose tokens both `serve` and the function accept.
struct AwsStack {
    moto: Moto,
    _idp: Idp,
    service_key: Key,
    operator_key: Key,
    /// The CLI's and `serve`'s state dir.
    dir: PathBuf,
    /// What every process of the stack gets: backend, emulator, issuers.
    env: Vec<(String, String)>,
    /// `airlock confirmation-key`: the PEM of the key that signs confirmation tokens.
    public_key: String,
    /// `AIRLOCK_ORDERS_QUEUE_URL` and `AIRLOCK_JOBS_QUEUE_URL`, as the template gives them.
    queue_urls: Vec<(String, String)>,
}

impl AwsStack {
    fn start() -> AwsStack {
        let moto = Moto::start();
        let dir = temp_state_dir();
        let service_key = Key::rs256("svc-1");
        let operator_key = Key::es256("ops-1");
        let idp = Idp::start(&[&service_key, &operator_key]);
        let mut env: Vec<(String, String)> = vec![("AIRLOCK_BACKEND".into(), "aws".into())];
        env.extend(moto.env());
        for (k, v) in [
            ("AIRLOCK_SERVICE_ISSUER", ISSUER),
            ("AIRLOCK_OPERATOR_ISSUER", ISSUER),
            ("AIRLOCK_SERVICE_JWKS_URL", idp.url.as_str()),
            ("AIRLOCK_OPERATOR_JWKS_URL", idp.url.as_str()),
            ("AIRLOCK_EXECUTE_RATE_PER_MINUTE", "1000000"),
            ("AIRLOCK_PLAN_RATE_PER_MINUTE", "1000000"),
            // The longest the plans may wait for their execute.
            ("AIRLOCK_CONFIRMATION_TTL_SECONDS", "900"),
        ] {
            env.push((k.into(), v.into()));
        }
        let t = Instant::now();
        cli(&dir, &env, &["bootstrap", "--demo-data"]);
        let policy = dir.join("token-policy.json");
        std::fs::write(&policy, TOKEN_POLICY).expect("policy file");
        cli(
            &dir,
            &env,
            &["policy", "set", policy.to_str().expect("utf-8 dir")],
        );
        let public_key = cli(&dir, &env, &["confirmation-key"]);
        // moto's queue URLs: endpoint, account, name.
        let queue_urls = [
            ("AIRLOCK_ORDERS_QUEUE_URL", "airlock-orders.fifo"),
            ("AIRLOCK_JOBS_QUEUE_URL", "airlock-jobs"),
        ]
        .map(|(var, name)| {
            let url = format!("{}/{}/{name}", moto.endpoint, Moto::ACCOUNT_ID);
            (var.to_string(), url)
        })
        .to_vec();
        println!(
            "setup: moto {} bootstrapped with demo data and the token policy in {:.1} s",
            moto.endpoint,
            t.elapsed().as_secs_f64()
        );
        AwsStack {
            moto,
            _idp: idp,
            service_key,
            operator_key,
            dir,
            env,
            public_key,
            queue_urls,
        }
    }

    /// The energy trader's request headers: Mastra's service token and the operator's
    /// token, fresh (valid 10 minutes).
    fn headers(&self) -> Vec<(&'static str, String)> {
        let now = airlock_tests::idp::now_s();
        let service = self.service_key.sign(&json!({
            "iss": ISSUER, "aud": "airlock-api", "sub": "mastra",
            "scope": "trade.read trade.plan trade.execute", "gty": "client-credentials",
            "iat": now, "exp": now + 600,
        }));
        let operator = self.operator_key.sign(&json!({
            "iss": ISSUER, "aud": "airlock-operators", "sub": "op-energy-trader",
            "roles": ["trader"], "desks": ["energy"], "iat": now, "exp": now + 600,
        }));
        vec![
            ("Authorization", format!("Bearer {service}")),
            ("X-Operator-Token", operator),
            ("Content-Type", "application/json".into()),
            ("User-Agent", "lambda-bench".into()),
        ]
    }

    /// The execute function's environment: the template's (AWS backend, EMF metrics, info
    /// logs, queue URLs, the confirmation public key unless `public_key` is false), on
    /// this emulator and identity provider.
    fn function_env(&self, public_key: bool) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        let tmp = self.dir.join("lambda-tmp");
        env.push(("AIRLOCK_STATE_DIR".into(), tmp.display().to_string()));
        env.push(("AIRLOCK_METRICS".into(), "emf".into()));
        env.push(("RUST_LOG".into(), "info".into()));
        env.push((IGNORE_STAGE_ENV.0.into(), IGNORE_STAGE_ENV.1.into()));
        // As the template: the orders queue's count reused for a second. The bench queues
        // without workers, so the limit is set out of reach: counted, never refused.
        env.push(("AIRLOCK_ORDERS_BACKLOG_CACHE_MS".into(), "1000".into()));
        env.push(("AIRLOCK_ORDERS_BACKLOG_LIMIT".into(), "1000000".into()));
        env.extend(self.queue_urls.iter().cloned());
        if public_key {
            env.push((
                "AIRLOCK_CONFIRMATION_PUBLIC_KEY".into(),
                self.public_key.clone(),
            ));
        }
        env
    }

    /// `n` plans of `action` for the energy trader, made by `airlock serve` on this stack
    /// (real clock). Orders go over [`COMBOS`]; syncs alternate between the two accounts.
    fn plans(&self, cli_bin: &Path, action: &str, n: usize) -> Vec<Value> {
        let (child, base) = spawn_serve(cli_bin, &self.dir, &self.env);
        let headers = self.headers();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let plans = rt.block_on(async {
            let http = reqwest::Client::new();
            let mut plans = Vec::with_capacity(n);
            for j in 0..n {
                let payload = if action == "positions.sync" {
                    let account = if j % 2 == 0 { "ACC-1" } else { "ACC-2" };
                    json!({"account_id": account})
                } else {
                    let (account, symbol) = COMBOS[j % COMBOS.len()];
                    let side = if (j / COMBOS.len()).is_multiple_of(2) {
                        "buy"
                    } else {
                        "sell"
                    };
                    json!({"account_id": account, "symbol": symbol, "side": side,
                           "quantity": 1, "order_type": "market"})
                };
                let body = json!({
                    "action_type": action, "payload": payload,
                    "requested_by": "op-energy-trader",
                    "chat_context": { "chat_session_id": "bench", "tool_call_id": format!("plan-{j}") }
                });
                let mut req = http.post(format!("{base}{BASE}/actions/plan"));
                for (k, v) in &headers {
                    req = req.header(*k, v);
                }
                let r = req.body(body.to_string()).send().await.expect("plan");
                let status = r.status().as_u16();
                let plan: Value = r.json().await.expect("plan JSON");
                assert_eq!(status, 200, "setup plan: {plan}");
                plans.push(plan);
            }
            plans
        });
        stop_serve(child);
        plans
    }

    /// The API Gateway event that executes `plan` (with its token, if it has one).
    fn execute_event(&self, headers: &[(&str, &str)], plan: &Value, key: &str) -> Value {
        let mut body = json!({
            "plan_id": plan["plan_id"],
            "idempotency_key": key,
            "requested_by": "op-energy-trader"
        });
        if let Some(t) = plan["confirmation_token"].as_str() {
            body["confirmation_token"] = json!(t);
        }
        apigw_rest_event(
            "POST",
            &format!("{BASE}/actions/execute"),
            &[],
            headers,
            Some(&body.to_string()),
        )
    }
}

impl Drop for AwsStack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An execute answer: its status, and the error code of a refusal.
fn execute_status(r: &Result<Value, String>) -> String {
    match r {
        Ok(v) => {
            let (status, body) = response_parts(v);
            match body["error"]["code"].as_str() {
                Some(code) => format!("{status} {code}"),
                None => status.to_string(),
            }
        }
        Err(_) => "invoke error".into(),
    }
}

/// The AWS operations the execute function made, one per call, after the first `skip`
/// lines of a call log (`AIRLOCK_AWS_CALL_LOG`).
fn calls_since(log: &Path, skip: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for l in text.lines().skip(skip) {
        let v: Value = serde_json::from_str(l).unwrap_or_default();
        if v["function"] == "execute" && seen.insert((v["pid"].as_u64(), v["call"].as_u64())) {
            out.push(v["operation"].as_str().unwrap_or_default().to_string());
        }
    }
    out
}

fn execute_aws(o: &Opts) {
    let cli_bin = cli_binary(o);
    std::env::set_var("AIRLOCK_TEST_BIN", &cli_bin);
    let bin = o.bin_dir.join("execute");
    let stack = AwsStack::start();
    let n = o.invocations;

    // Plans: two for the call probe, then the warm-up and the measured invocations.
    let t = Instant::now();
    let plans = stack.plans(&cli_bin, &o.action, 2 + WARMUP + n);
    println!(
        "setup: {} {} plans with `airlock serve --backend aws` in {:.1} s; executable: {}",
        plans.len(),
        o.action,
        t.elapsed().as_secs_f64(),
        statuses(&plans.iter().fold(BTreeMap::new(), |mut m, p| {
            *m.entry(p["executable"].to_string()).or_insert(0) += 1;
            m
        }))
    );
    let headers = stack.headers();
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let events: Vec<Value> = plans
        .iter()
        .enumerate()
        .map(|(i, p)| stack.execute_event(&h, p, &format!("lambda-bench-aws-{i}")))
        .collect();
    let (probe, events) = events.split_at(2);
    let mut env = stack.function_env(!o.no_public_key);
    // Through the keep-alive proxy, the function reuses its connections as on AWS.
    // (The fault proxy with no rule: it keeps its clients' connections alive.)
    let proxy = FaultProxy::start(&stack.moto.endpoint);
    if !o.direct {
        env.retain(|(k, _)| k != "AWS_ENDPOINT_URL");
        env.push(("AWS_ENDPOINT_URL".into(), proxy.endpoint.clone()));
    }
    env.extend(o.function_env.iter().cloned());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let emu = LambdaEmulator::start();

    // The calls of one invocation: a separate process with the call log (which costs CPU).
    let log = stack.dir.join("aws-calls.jsonl");
    let mut with_log = env.clone();
    let log_s = log.display().to_string();
    with_log.push(("AIRLOCK_AWS_CALL_LOG", &log_s));
    let mut f = emu.spawn_function(&bin, &with_log);
    f.wait_ready(TIMEOUT)
        .unwrap_or_else(|e| panic!("execute did not start: {e}"));
    let init_calls = calls_since(&log, 0);
    let r = f.invoke(probe[0].clone(), TIMEOUT);
    let skip = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    let r2 = f.invoke(probe[1].clone(), TIMEOUT);
    let calls = calls_since(&log, skip);
    drop(f);
    println!(
        "probe (call log on): calls at cold start: {:?}; a warm invocation ({}, after {}): {}",
        init_calls,
        execute_status(&r2),
        execute_status(&r),
        calls.join(" + ")
    );

    // The measured process: cold start, warm-up, then the invocations one after another.
    let mut f = emu.spawn_function(&bin, &env);
    let pid = f.pid();
    let init = f
        .wait_ready(TIMEOUT)
        .unwrap_or_else(|e| panic!("execute did not start: {e}"));
    let cpu_init = cpu_time(pid);
    let mut first = (Duration::ZERO, Duration::ZERO, String::new());
    for (i, ev) in events[..WARMUP].iter().enumerate() {
        let c = cpu_time(pid);
        let t = Instant::now();
        let r = f.invoke(ev.clone(), TIMEOUT);
        if i == 0 {
            first = (t.elapsed(), cpu_time(pid) - c, execute_status(&r));
        }
    }
    let moto_pid = stack.moto.pid().expect("moto runs");
    let (cpu_before, moto_before) = (cpu_time(pid), cpu_time(moto_pid));
    let switches_before = context_switches(pid);
    let connections_before = proxy.connections();
    let moto_log_before = stack.moto.log_text().len();
    let mut lat = Vec::with_capacity(n);
    let mut seen = BTreeMap::new();
    // CPU and latency by fifth of the run too: moto slows down as its tables grow.
    let mut fifths = Vec::new();
    let k = (n / 5).max(1);
    let (mut c, mut l) = (cpu_before, Duration::ZERO);
    let t = Instant::now();
    for (i, ev) in events[WARMUP..].iter().enumerate() {
        let t = Instant::now();
        let r = f.invoke(ev.clone(), TIMEOUT);
        let d = t.elapsed();
        lat.push(d);
        l += d;
        *seen.entry(execute_status(&r)).or_insert(0) += 1;
        if (i + 1) % k == 0 && fifths.len() < 5 {
            let now = cpu_time(pid);
            let (cpu, lat) = ((now - c) / k as u32, l / k as u32);
            fifths.push(format!("{:.2} ms ({:.0} ms)", ms(cpu), ms(lat)));
            (c, l) = (now, Duration::ZERO);
        }
    }
    let elapsed = t.elapsed();
    let cpu = cpu_time(pid) - cpu_before;
    let moto_cpu = cpu_time(moto_pid) - moto_before;
    let switches = context_switches(pid) - switches_before;
    let connections = proxy.connections() - connections_before;
    let hwm_kb = f.proc_status_kb("VmHWM").unwrap_or(0);
    // What the process burns waiting for events (none should): 2 s idle.
    let c = cpu_time(pid);
    std::thread::sleep(Duration::from_secs(2));
    let idle = cpu_time(pid) - c;
    let handler = handler_latencies(&f.log(), n);
    drop(f);
    print_slow(&lat, &handler);
    print_moto_pauses(&stack.moto.log_text()[moto_log_before..]);
    lat.sort();

    let per = cpu / n as u32;
    println!(
        "CPU per invocation (mean latency) by fifth of the run: {}",
        fifths.join(", ")
    );
    if !o.function_env.is_empty() {
        println!("function environment added: {:?}", o.function_env);
    }
    // Counted, not assumed: a proxy whose answers made the SDK close its connections
    // (werkzeug's `HTTP/1.0` status line, passed on) went unnoticed for two days.
    println!(
        "the function's connections to moto: {}",
        if o.direct {
            "direct (--direct: a new TCP connection per AWS call, as moto closes each)".into()
        } else {
            format!(
                "through the keep-alive proxy, as on AWS: {connections} new in the {n} measured \
                 invocations{}",
                if connections > 3 {
                    " (NOT kept alive: the figures include a connection per call)"
                } else {
                    ""
                }
            )
        }
    );
    let path = if seen.keys().all(|s| s == "202") {
        format!("accepting: {}", calls.join(" + "))
    } else {
        format!("not accepting (see statuses): {}", calls.join(" + "))
    };
    println!();
    println!(
        "| function | action | path measured | public key set | init (ms) | CPU at init (ms) | \
         1st invoke (ms) / its CPU (ms) | invocations | CPU total (s) | CPU per invocation (ms) | \
         <= 1.5 ms | context switches per invocation | p50 / p99 (ms) | inv/s | \
         moto CPU per invocation (ms) | VmHWM | statuses |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| execute (AWS backend, moto) | {} | {path} | {} | {:.1} | {:.0} | {:.1} / {:.0} ({}) | {n} | \
         {:.2} | {:.3} | {} | {:.1} | {:.2} / {:.2} | {:.0} | {:.2} | {} | {} |",
        o.action,
        if o.no_public_key { "no" } else { "yes" },
        ms(init),
        ms(cpu_init),
        ms(first.0),
        ms(first.1),
        first.2,
        cpu.as_secs_f64(),
        ms(per),
        if per <= CPU_TARGET { "yes" } else { "NO" },
        switches as f64 / n as f64,
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        n as f64 / elapsed.as_secs_f64(),
        ms(moto_cpu / n as u32),
        mb(hwm_kb),
        statuses(&seen),
    );
    println!();
    println!(
        "CPU = utime + stime of the function process (/proc/<pid>/stat, clock ticks) over \
         the {n} invocations, sent one at a time after {WARMUP} warm-up ones; latency is the \
         emulator's round trip, moto's time included (moto serves one request at a time, \
         in Python). The CPU at init and of the first invocation are single readings \
         (tick resolution). Context switches: of the process's live threads. Idle: {:.0} ms \
         of CPU in 2 s without invocations.",
        ms(idle)
    );
}
