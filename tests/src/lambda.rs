//! A Lambda Runtime API emulator: runs the real function binaries (`functions/<name>`) the way
//! AWS Lambda does, and hands them API Gateway proxy events.
//!
//! It implements the part of the [Runtime API] that `lambda_runtime` 1.5 /
//! `lambda_runtime_api_client` 1.1 use:
//!
//! - `GET  /2018-06-01/runtime/invocation/next`: a long poll that blocks until an event is
//!   queued; the body is the event JSON, with the headers `Lambda-Runtime-Aws-Request-Id`,
//!   `Lambda-Runtime-Deadline-Ms` (the client `expect`s this one and panics without it),
//!   `Lambda-Runtime-Invoked-Function-Arn` and `Lambda-Runtime-Trace-Id`.
//! - `POST /2018-06-01/runtime/invocation/{id}/response` (buffered responses carry a
//!   `Content-Length`; streaming ones are chunked with error trailers: both are read).
//! - `POST /2018-06-01/runtime/invocation/{id}/error` (body: `{errorType, errorMessage}`).
//! - `POST /2018-06-01/runtime/init/error`.
//!
//! The client is a hyper 1 HTTP/1.1 client with a keep-alive pool (one connection per worker;
//! one worker unless `AWS_LAMBDA_MAX_CONCURRENCY` is set), so connections here are persistent
//! and carry many requests. `AWS_LAMBDA_RUNTIME_API` is `host:port` without a scheme, as on
//! AWS (the client parses it as a URI authority and defaults to `http`). The client treats any
//! 2xx as success; this emulator answers 202 to posts, as AWS does.
//!
//! # API Gateway REST events and the stage in the path
//!
//! `lambda_http` 1.3 (`request.rs`, `apigw_path_with_stage`) builds the request path of a REST
//! (v1) proxy event from the event's top-level `path` **with the stage prepended**: for
//! `requestContext.stage = "prod"` and `path = "/api/internal/v1/mastra/accounts"`, axum sees
//! `/prod/api/internal/v1/mastra/accounts`, which matches no route (the contract 404). The stage
//! is not prepended when:
//!
//! - the environment variable `AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH` is set, to **any** value
//!   (the code tests `env::var(..).is_ok()`, so even `false` switches it on); or
//! - the stage is absent or `$default` (HTTP APIs' default stage); or
//! - `path` already starts with `/{stage}/`.
//!
//! Real API Gateway REST events carry the path *without* the stage (`path`), and the path with
//! it in `requestContext.path`, so a REST API deployment of these functions needs
//! `AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH=true` in each function's environment
//! ([`IGNORE_STAGE_ENV`]). [`apigw_rest_event`] builds events the way API Gateway does (stage
//! [`STAGE`]); `tests/tests/e2e/lambda.rs` checks both behaviours. The query string comes from
//! `multiValueQueryStringParameters` when non-empty, else `queryStringParameters`; request
//! headers are `multiValueHeaders` overlaid with `headers`. A `Host` header makes the URI
//! absolute (`https://host/...`), which axum routes by path alike. The v1 response puts every
//! header in `multiValueHeaders` and leaves `headers` empty ([`response_header`] reads both).
//!
//! [Runtime API]: https://docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

/// The API Gateway stage [`apigw_rest_event`] puts in `requestContext.stage`.
pub const STAGE: &str = "prod";

/// Makes `lambda_http` route REST API events by `path` alone (see the module docs).
pub const IGNORE_STAGE_ENV: (&str, &str) = ("AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH", "true");

/// The environment of a function on the embedded backend's state in `dir`, then `extra`,
/// on a clock shifted to [`crate::MARKET_OPEN`] ([`FakeClock`]: a Lambda reads the system
/// clock only, and the workers and the plan check market hours).
pub fn embedded_function_env(dir: &Path, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("AIRLOCK_BACKEND".to_string(), "embedded".to_string()),
        ("AIRLOCK_STATE_DIR".to_string(), dir.display().to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env.extend(FakeClock::new().env(0));
    env
}

const RUNTIME_PREFIX: &str = "/2018-06-01/runtime/";
const ACCOUNT_ID: &str = "123456789012";

/// How an invocation ended.
#[derive(Debug, Clone)]
enum Outcome {
    Response(Vec<u8>),
    Error {
        error_type: Option<String>,
        body: Vec<u8>,
    },
}

impl Outcome {
    fn into_result(self) -> Result<Value, String> {
        match self {
            Outcome::Response(body) => serde_json::from_slice(&body).map_err(|e| {
                format!(
                    "response is not JSON ({e}): {}",
                    String::from_utf8_lossy(&body)
                )
            }),
            Outcome::Error { error_type, body } => Err(format!(
                "function error ({}): {}",
                error_type.unwrap_or_default(),
                String::from_utf8_lossy(&body)
            )),
        }
    }
}

struct Queued {
    id: String,
    event: Arc<Vec<u8>>,
    deadline_ms: u64,
}

#[derive(Default)]
struct State {
    shutdown: bool,
    queue: VecDeque<Queued>,
    done: HashMap<String, Outcome>,
    /// Handed to the function, not yet answered.
    in_flight: HashMap<String, ()>,
    /// When the current function first called `/next` (reset by `spawn_function`).
    first_poll: Option<Instant>,
    polls: u64,
    init_error: Option<String>,
    function_name: String,
    /// How far the current function's wall clock is shifted (libfaketime's `FAKETIME`),
    /// milliseconds: deadlines are given on its clock, as AWS's clock and a function's
    /// agree.
    clock_offset_ms: i64,
    /// Open connections: a clone (to shut it down) and the thread serving it.
    conns: Vec<(TcpStream, JoinHandle<()>)>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The Runtime API on an ephemeral loopback port. One function process at a time (Lambda runs
/// one invocation per execution environment); stops its threads on drop.
pub struct LambdaEmulator {
    /// `127.0.0.1:PORT`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

static IDS: AtomicU64 = AtomicU64::new(1);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A UUID-shaped request id, unique within this test process.
fn new_request_id() -> String {
    let n = IDS.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        pid,
        (t >> 16) & 0xffff,
        t & 0xfff,
        (n >> 48) & 0xfff,
        n & 0xffff_ffff_ffff
    )
}

fn trace_id(request_id: &str) -> String {
    let secs = now_ms() / 1000;
    let hex: String = request_id.chars().filter(|c| *c != '-').take(24).collect();
    format!("Root=1-{secs:08x}-{hex};Parent={};Sampled=0", &hex[..16])
}

impl LambdaEmulator {
    /// Listens on `127.0.0.1:0` and serves the Runtime API until dropped.
    pub fn start() -> LambdaEmulator {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the runtime API emulator");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let sh = shared.clone();
        let accept = std::thread::Builder::new()
            .name("lambda-emulator-accept".into())
            .spawn(move || accept_loop(listener, sh))
            .expect("spawn accept thread");
        LambdaEmulator {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// The function binary `name` ([`function_binary`]) started with `env` and ready for
    /// invocations (within 30 s).
    pub fn spawn_ready(&self, name: &str, env: &[(String, String)]) -> FunctionProcess {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut f = self.spawn_function(&function_binary(name), &env);
        f.wait_ready(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        f
    }

    /// Starts a function binary against this Runtime API, with the environment Lambda sets
    /// (`AWS_LAMBDA_RUNTIME_API`, `AWS_LAMBDA_FUNCTION_NAME` = the binary's file name,
    /// `AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128`, `AWS_LAMBDA_FUNCTION_VERSION=$LATEST`, log group
    /// and stream, `AWS_REGION=us-east-1`), then `env` (which may override any of them).
    /// Stdout and stderr go to a log file (see [`FunctionProcess::log`]). Resets the
    /// first-`/next` instant, so run one function per emulator at a time.
    pub fn spawn_function(&self, binary: &Path, env: &[(&str, &str)]) -> FunctionProcess {
        assert!(
            binary.exists(),
            "function binary {} is missing: build it first (cargo build --workspace --bins, \
             or cargo build --release -p <name> for benchmarks)",
            binary.display()
        );
        let name = binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "function".into());
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let log_path = std::env::temp_dir().join(format!(
            "airlock-lambda-{}-{name}-{n}.log",
            std::process::id()
        ));
        let log = File::create(&log_path).expect("function log file");
        let log2 = log.try_clone().expect("clone log file");
        {
            let mut st = self.shared.lock();
            st.first_poll = None;
            st.polls = 0;
            st.init_error = None;
            st.function_name = name.clone();
            st.clock_offset_ms = env
                .iter()
                .rev()
                .find(|(k, _)| *k == "FAKETIME")
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
                .map_or(0, |s| (s * 1000.0).round() as i64);
        }
        let mut cmd = Command::new(binary);
        cmd.env("AWS_LAMBDA_RUNTIME_API", self.addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", &name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}"))
            .env(
                "AWS_LAMBDA_LOG_STREAM_NAME",
                format!("2026/01/01/[$LATEST]{n:032x}"),
            )
            .env("AWS_REGION", "us-east-1")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env_remove("AWS_LAMBDA_MAX_CONCURRENCY")
            .env_remove("AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH")
            .env_remove("AIRLOCK_NOW")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let spawned_at = Instant::now();
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        FunctionProcess {
            child: Some(child),
            name,
            spawned_at,
            log_path,
            shared: self.shared.clone(),
        }
    }

    /// Queues one event and waits for the function's answer: `Ok(response JSON)`, or
    /// `Err(..)` with the error body (`/error`, `/init/error`) or a timeout. The timeout is
    /// also the invocation's deadline (`Lambda-Runtime-Deadline-Ms`).
    pub fn invoke(&self, event: Value, timeout: Duration) -> Result<Value, String> {
        invoke_inner(&self.shared, event, timeout, &mut || None)
    }

    /// When the current function first called `GET /next` (its init is done), if it has.
    pub fn first_poll(&self) -> Option<Instant> {
        self.shared.lock().first_poll
    }

    /// `GET /next` calls since the current function was spawned.
    pub fn polls(&self) -> u64 {
        self.shared.lock().polls
    }

    /// The body the function posted to `/init/error`, if it did.
    pub fn init_error(&self) -> Option<String> {
        self.shared.lock().init_error.clone()
    }
}

impl Drop for LambdaEmulator {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.cv.notify_all();
        // Wake the blocking accept(); the loop sees `shutdown` and ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        // No new connections now: close every open one (unblocks reads) and join its thread.
        let conns = std::mem::take(&mut self.shared.lock().conns);
        for (c, _) in &conns {
            let _ = c.shutdown(Shutdown::Both);
        }
        for (_, t) in conns {
            let _ = t.join();
        }
    }
}

fn invoke_inner(
    shared: &Shared,
    event: Value,
    timeout: Duration,
    dead: &mut dyn FnMut() -> Option<String>,
) -> Result<Value, String> {
    let id = new_request_id();
    let start = Instant::now();
    {
        let mut st = shared.lock();
        if let Some(e) = &st.init_error {
            return Err(format!("init error: {e}"));
        }
        let now = (now_ms() as i64 + st.clock_offset_ms).max(0) as u64;
        st.queue.push_back(Queued {
            id: id.clone(),
            event: Arc::new(event.to_string().into_bytes()),
            deadline_ms: now + timeout.as_millis() as u64,
        });
    }
    shared.cv.notify_all();
    loop {
        let mut st = shared.lock();
        if let Some(outcome) = st.done.remove(&id) {
            return outcome.into_result();
        }
        let mut why = if let Some(e) = &st.init_error {
            Some(format!("init error: {e}"))
        } else if st.shutdown {
            Some("the emulator stopped".to_string())
        } else if start.elapsed() >= timeout {
            Some(format!("no answer within {timeout:?}"))
        } else {
            None
        };
        if why.is_none() {
            let left = timeout.saturating_sub(start.elapsed());
            let (g, _) = shared
                .cv
                .wait_timeout(st, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner());
            if g.done.contains_key(&id) {
                continue;
            }
            drop(g);
            // Without the lock: `dead` takes it itself.
            why = dead();
            if why.is_none() {
                continue;
            }
            st = shared.lock();
        }
        st.queue.retain(|q| q.id != id);
        st.in_flight.remove(&id);
        if let Some(outcome) = st.done.remove(&id) {
            // Answered while we were deciding: the answer wins.
            return outcome.into_result();
        }
        return Err(format!("invocation {id}: {}", why.unwrap_or_default()));
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.lock().shutdown {
            return;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        let Ok(clone) = conn.try_clone() else {
            continue;
        };
        let sh = shared.clone();
        let Ok(handle) = std::thread::Builder::new()
            .name("lambda-emulator-conn".into())
            .spawn(move || serve_conn(conn, sh))
        else {
            continue;
        };
        let mut st = shared.lock();
        st.conns.push((clone, handle));
        // Forget finished connections (closing their clones).
        let (done, live): (Vec<_>, Vec<_>) = std::mem::take(&mut st.conns)
            .into_iter()
            .partition(|(_, h)| h.is_finished());
        st.conns = live;
        drop(st);
        for (_, h) in done {
            let _ = h.join();
        }
    }
}

/// One HTTP/1.1 request: method, path, lower-cased headers, body (de-chunked), trailers.
struct Req {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn read_line(r: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    Ok(Some(line.trim_end_matches(['\r', '\n']).to_string()))
}

fn read_headers(r: &mut impl BufRead, into: &mut HashMap<String, String>) -> std::io::Result<()> {
    loop {
        let Some(line) = read_line(r)? else {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        };
        if line.is_empty() {
            return Ok(());
        }
        if let Some((k, v)) = line.split_once(':') {
            into.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
}

fn read_request(r: &mut impl BufRead) -> std::io::Result<Option<Req>> {
    let Some(line) = read_line(r)? else {
        return Ok(None);
    };
    if line.is_empty() {
        return read_request(r);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut headers = HashMap::new();
    read_headers(r, &mut headers)?;
    let mut body = Vec::new();
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let size_line = read_line(r)?.ok_or(std::io::ErrorKind::UnexpectedEof)?;
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {size_line:?}")))?;
            if size == 0 {
                // Trailers (streaming responses report errors here), then the blank line.
                read_headers(r, &mut headers)?;
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            let _ = read_line(r)?;
        }
    } else if let Some(n) = headers.get("content-length") {
        let n: usize = n
            .parse()
            .map_err(|_| std::io::Error::other("bad content-length"))?;
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    }
    Ok(Some(Req {
        method,
        path,
        headers,
        body,
    }))
}

fn write_response(
    w: &mut impl Write,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(k);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// Whether the peer closed the connection (checked while a `/next` long poll waits, so a
/// killed function's poll does not swallow the next function's event).
fn peer_closed(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let closed = match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    let _ = s.set_nonblocking(false);
    closed
}

fn serve_conn(stream: TcpStream, shared: Arc<Shared>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    loop {
        let req = match read_request(&mut reader) {
            Ok(Some(r)) => r,
            _ => return,
        };
        let close = req
            .headers
            .get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let ok = handle(&req, &mut writer, &reader, &shared);
        if !ok || close {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
    }
}

/// Serves one request; false when the connection must close.
fn handle(req: &Req, w: &mut TcpStream, reader: &BufReader<TcpStream>, shared: &Shared) -> bool {
    let accepted =
        |w: &mut TcpStream| write_response(w, "202 Accepted", &[], br#"{"status":"OK"}"#).is_ok();
    let Some(rest) = req.path.strip_prefix(RUNTIME_PREFIX) else {
        return write_response(w, "404 Not Found", &[], br#"{"errorType":"NotFound"}"#).is_ok();
    };
    let segs: Vec<&str> = rest.split('/').collect();
    match (req.method.as_str(), segs.as_slice()) {
        ("GET", ["invocation", "next"]) => {
            let arrived = Instant::now();
            let mut st = shared.lock();
            st.polls += 1;
            if st.first_poll.is_none() {
                st.first_poll = Some(arrived);
            }
            shared.cv.notify_all();
            let item = loop {
                if st.shutdown {
                    return false;
                }
                if let Some(q) = st.queue.pop_front() {
                    break q;
                }
                let (g, _) = shared
                    .cv
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner());
                st = g;
                if st.queue.is_empty()
                    && reader.buffer().is_empty()
                    && peer_closed(reader.get_ref())
                {
                    return false;
                }
            };
            st.in_flight.insert(item.id.clone(), ());
            let function = st.function_name.clone();
            drop(st);
            let headers = [
                ("lambda-runtime-aws-request-id", item.id.clone()),
                ("lambda-runtime-deadline-ms", item.deadline_ms.to_string()),
                (
                    "lambda-runtime-invoked-function-arn",
                    format!("arn:aws:lambda:us-east-1:{ACCOUNT_ID}:function:{function}"),
                ),
                ("lambda-runtime-trace-id", trace_id(&item.id)),
            ];
            if write_response(w, "200 OK", &headers, &item.event).is_err() {
                // The function is gone: give the event to the next one.
                let mut st = shared.lock();
                st.in_flight.remove(&item.id);
                st.queue.push_front(item);
                drop(st);
                shared.cv.notify_all();
                return false;
            }
            true
        }
        ("POST", ["invocation", id, kind @ ("response" | "error")]) => {
            let mut st = shared.lock();
            if st.in_flight.remove(*id).is_none() {
                drop(st);
                return write_response(
                    w,
                    "400 Bad Request",
                    &[],
                    br#"{"errorMessage":"unknown or already answered request id","errorType":"InvalidRequestID"}"#,
                )
                .is_ok();
            }
            // A streaming response reports a mid-stream failure in its trailers.
            let trailer_error = req
                .headers
                .get("lambda-runtime-function-error-type")
                .filter(|_| *kind == "response")
                .cloned();
            let outcome = if *kind == "error" || trailer_error.is_some() {
                Outcome::Error {
                    error_type: req
                        .headers
                        .get("lambda-runtime-function-error-type")
                        .cloned(),
                    body: req.body.clone(),
                }
            } else {
                Outcome::Response(req.body.clone())
            };
            st.done.insert(id.to_string(), outcome);
            drop(st);
            shared.cv.notify_all();
            accepted(w)
        }
        ("POST", ["init", "error"]) => {
            shared.lock().init_error = Some(String::from_utf8_lossy(&req.body).into_owned());
            shared.cv.notify_all();
            accepted(w)
        }
        _ => write_response(
            w,
            "404 Not Found",
            &[],
            br#"{"errorType":"NotFound","errorMessage":"unknown runtime API path"}"#,
        )
        .is_ok(),
    }
}

/// A function process started by [`LambdaEmulator::spawn_function`]; killed and reaped on drop.
pub struct FunctionProcess {
    child: Option<Child>,
    pub name: String,
    /// Just before `spawn()`.
    pub spawned_at: Instant,
    log_path: PathBuf,
    shared: Arc<Shared>,
}

impl FunctionProcess {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Why the process is not usable: it exited, or it reported an init error.
    fn dead(&mut self) -> Option<String> {
        if let Some(e) = self.shared.lock().init_error.clone() {
            return Some(format!("init error: {e}"));
        }
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => Some(format!(
                "{} exited ({status}); log:\n{}",
                self.name,
                self.log()
            )),
            _ => None,
        }
    }

    /// Waits until the process has called `GET /next` for the first time (its init is done)
    /// and returns the time from spawn to that call: the cold-start init.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            if let Some(t) = self.shared.lock().first_poll {
                return Ok(t.saturating_duration_since(self.spawned_at));
            }
            if let Some(why) = self.dead() {
                return Err(why);
            }
            if start.elapsed() >= timeout {
                return Err(format!(
                    "{} did not poll /next within {timeout:?}; log:\n{}",
                    self.name,
                    self.log()
                ));
            }
            let st = self.shared.lock();
            if st.first_poll.is_none() {
                let _ = self.shared.cv.wait_timeout(st, Duration::from_millis(5));
            }
        }
    }

    /// [`LambdaEmulator::invoke`], failing fast if this process dies.
    pub fn invoke(&mut self, event: Value, timeout: Duration) -> Result<Value, String> {
        let shared = self.shared.clone();
        invoke_inner(&shared, event, timeout, &mut || self.dead())
    }

    /// Reads a `Vm*` field of `/proc/<pid>/status` in KiB (`VmHWM`: peak RSS; `VmRSS`).
    pub fn proc_status_kb(&self, field: &str) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The process's stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for FunctionProcess {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("{} log kept at {}", self.name, self.log_path.display());
        } else {
            let _ = std::fs::remove_file(&self.log_path);
        }
    }
}

/// [`apigw_rest_event`] of a JSON `POST` of `body` to `path` under the API's base path.
pub fn apigw_post_event(path: &str, headers: &[(&str, String)], body: &Value) -> Value {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    apigw_rest_event(
        "POST",
        &format!("{}{path}", crate::BASE),
        &[],
        &h,
        Some(&body.to_string()),
    )
}

/// An API Gateway REST API (v1) proxy event, as a `{proxy+}` resource on stage [`STAGE`]
/// delivers it: `path` without the stage, `requestContext.path` with it, headers and query
/// parameters both single- and multi-valued (`null` when there are none, as API Gateway
/// sends). Adds the `Host` and `X-Forwarded-*` headers API Gateway adds unless given.
pub fn apigw_rest_event(
    method: &str,
    path: &str,
    query: &[(&str, &str)],
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Value {
    let api_id = "a1b2c3d4e5";
    let domain = format!("{api_id}.execute-api.us-east-1.amazonaws.com");
    let mut all: Vec<(String, String)> = Vec::new();
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    for (k, v) in [
        ("Host", domain.as_str()),
        ("X-Forwarded-For", "203.0.113.10"),
        ("X-Forwarded-Port", "443"),
        ("X-Forwarded-Proto", "https"),
    ] {
        if !has(k) {
            all.push((k.into(), v.into()));
        }
    }
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));

    fn single_and_multi(pairs: &[(String, String)]) -> (Value, Value) {
        if pairs.is_empty() {
            return (Value::Null, Value::Null);
        }
        let mut single = Map::new();
        let mut multi: Map<String, Value> = Map::new();
        for (k, v) in pairs {
            single.insert(k.clone(), json!(v));
            match multi.get_mut(k) {
                Some(Value::Array(a)) => a.push(json!(v)),
                _ => {
                    multi.insert(k.clone(), json!([v]));
                }
            }
        }
        (Value::Object(single), Value::Object(multi))
    }
    let (h, mh) = single_and_multi(&all);
    let q: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (qs, mqs) = single_and_multi(&q);
    let request_id = new_request_id();
    let now = now_ms();
    json!({
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": h,
        "multiValueHeaders": mh,
        "queryStringParameters": qs,
        "multiValueQueryStringParameters": mqs,
        "pathParameters": { "proxy": path.trim_start_matches('/') },
        "stageVariables": null,
        "requestContext": {
            "accountId": ACCOUNT_ID,
            "apiId": api_id,
            "resourceId": "abc123",
            "resourcePath": "/{proxy+}",
            "stage": STAGE,
            "path": format!("/{STAGE}{path}"),
            "httpMethod": method,
            "requestId": request_id,
            "extendedRequestId": format!("{}=", &request_id[..12]),
            "protocol": "HTTP/1.1",
            "requestTimeEpoch": now,
            "domainName": domain,
            "domainPrefix": api_id,
            "identity": {
                "sourceIp": "203.0.113.10",
                "userAgent": headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("user-agent"))
                    .map(|(_, v)| *v)
                    .unwrap_or("")
            }
        },
        "body": body,
        "isBase64Encoded": false
    })
}

/// A response header of an API Gateway proxy response (`multiValueHeaders` or `headers`,
/// case-insensitive).
pub fn response_header(resp: &Value, name: &str) -> Option<String> {
    for field in ["multiValueHeaders", "headers"] {
        if let Some(map) = resp[field].as_object() {
            for (k, v) in map {
                if k.eq_ignore_ascii_case(name) {
                    let v = match v {
                        Value::Array(a) => a.first().cloned().unwrap_or(Value::Null),
                        v => v.clone(),
                    };
                    if let Some(s) = v.as_str() {
                        return Some(s.to_string());
                    }
                }
            }
        }
    }
    None
}

/// The status and JSON body of an API Gateway proxy response (body decoded from base64 if
/// flagged; a non-JSON body comes back as a JSON string).
pub fn response_parts(resp: &Value) -> (u16, Value) {
    use base64::Engine;
    let status = resp["statusCode"].as_u64().unwrap_or(0) as u16;
    let raw = resp["body"].as_str().unwrap_or("");
    let text = if resp["isBase64Encoded"].as_bool() == Some(true) {
        base64::engine::general_purpose::STANDARD
            .decode(raw)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|_| raw.to_string())
    } else {
        raw.to_string()
    };
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

/// A function binary next to the running executable's profile dir (`target/<profile>/<name>`
/// for a test in `target/<profile>/deps/` or a bin in `target/<profile>/`). Panics with a
/// clear message when it is missing.
pub fn function_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: the Lambda tests run the real function binaries, which \
         `cargo test --workspace` does not build; run `cargo build --workspace --bins` first \
         (scripts/test.sh)",
        bin.display()
    );
    bin
}

// ---------------------------------------------------------------------------------------
// The wall clock of function processes. Lambdas read the system clock only (they ignore
// `AIRLOCK_NOW`, so no deployment can be given a fake time), and orders need an open
// market: a test that runs them shifts their clock with libfaketime instead.

/// libfaketime, installed by `scripts/emulator.sh` (or `$AIRLOCK_FAKETIME_LIB`).
pub fn faketime_lib() -> PathBuf {
    let lib = std::env::var_os("AIRLOCK_FAKETIME_LIB")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::moto::Moto::repo_root().join(".venv/lib/libfaketime.so.1"));
    assert!(
        lib.exists(),
        "{} is missing: run scripts/emulator.sh (the README's test command does)",
        lib.display()
    );
    lib
}

pub fn real_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Shifts the processes' wall clock so that the tour starts at [`MARKET_OPEN`].
pub struct FakeClock {
    lib: PathBuf,
    offset_ms: i64,
}

impl FakeClock {
    pub fn new() -> FakeClock {
        let start = chrono::DateTime::parse_from_rfc3339(crate::MARKET_OPEN)
            .expect("MARKET_OPEN")
            .timestamp_millis();
        FakeClock {
            lib: faketime_lib(),
            offset_ms: start - real_now_ms(),
        }
    }

    /// Now on the shifted clock, seconds.
    pub fn now_s(&self) -> i64 {
        (real_now_ms() + self.offset_ms).div_euclid(1000)
    }

    /// The environment that runs a process `ahead_s` seconds ahead of the shifted clock.
    pub fn env(&self, ahead_s: i64) -> Vec<(String, String)> {
        let offset_s = self.offset_ms as f64 / 1000.0 + ahead_s as f64;
        vec![
            ("LD_PRELOAD".into(), self.lib.display().to_string()),
            ("FAKETIME".into(), format!("{offset_s:+.3}")),
            // Timers and timeouts keep the real monotonic clock.
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        FakeClock::new()
    }
}

/// An embedded state dir for function binaries, at the market open: the dev issuer's
/// tokens for the energy trader, the demo data, and the token-mode policy. The CLI runs on
/// it with `env`; the functions get `AIRLOCK_STATE_DIR` = `dir` (and a [`FakeClock`]).
pub struct TradingState {
    pub dir: PathBuf,
    pub env: Vec<(String, String)>,
    pub service: String,
    pub operator: String,
}

impl TradingState {
    pub fn new() -> TradingState {
        let dir = crate::temp_state_dir();
        let env = vec![
            ("AIRLOCK_BACKEND".to_string(), "embedded".to_string()),
            ("AIRLOCK_NOW".to_string(), crate::MARKET_OPEN.to_string()),
        ];
        // Tokens first: this creates the dev issuer key the functions load.
        let service = crate::cli(&dir, &env, &["token", "service"]);
        let operator = crate::cli(&dir, &env, &crate::trader_args(&["token", "operator"]));
        crate::cli(&dir, &env, &["seed-orders", "0"]);
        std::fs::write(dir.join("policy.json"), crate::TOKEN_MODE_POLICY).expect("policy.json");
        TradingState {
            dir,
            env,
            service,
            operator,
        }
    }
}

impl TradingState {
    /// The headers of a JSON request by the energy trader (service and operator tokens).
    pub fn json_headers(&self) -> Vec<(&'static str, String)> {
        vec![
            ("Authorization", format!("Bearer {}", self.service)),
            ("X-Operator-Token", self.operator.clone()),
            ("Content-Type", "application/json".to_string()),
        ]
    }
}

impl Default for TradingState {
    fn default() -> Self {
        TradingState::new()
    }
}

impl Drop for TradingState {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
