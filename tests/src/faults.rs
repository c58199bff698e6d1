//! A fault-injecting HTTP proxy between the AWS SDK and the emulator: it forwards every
//! request to moto and, by rules the test sets while it runs, answers some of them the way
//! real AWS sometimes does and moto never does.
//!
//! A rule names an operation (the end of the `X-Amz-Target` header: `TransactWriteItems`,
//! `SendMessage`, `Sign`, ...), optionally a text its request body must contain (a table
//! name), a [`Fault`], and how many matching requests it applies to. Faults:
//!
//! - [`Fault::DropReply`]: forward, let moto apply the request, then close the connection
//!   without answering (the write happened; the reply is lost; the SDK retries);
//! - [`Fault::Status500`]: answer 500 `InternalServerError` without forwarding;
//! - [`Fault::Throttle`]: answer the service's throttling error without forwarding
//!   (DynamoDB `ProvisionedThroughputExceededException`, others `ThrottlingException`);
//! - [`Fault::TransactionConflict`]: answer `TransactionCanceledException` without
//!   forwarding, with one reason per item of the request as DynamoDB gives them: the first
//!   `TransactionConflict` (another transaction held it), the others `None`;
//! - [`Fault::WriteConflict`]: answer a single-item write with
//!   `TransactionConflictException` without forwarding (a transaction held its item);
//! - [`Fault::UnprocessedKeys`]: answer a `BatchGetItem` with every key unprocessed;
//! - [`Fault::Delay`]: forward after a pause (a stalled call);
//! - [`Fault::Stale`]: answer a query or scan of an index with the last reply of that
//!   operation and index that listed anything, as recorded before (an index answering from
//!   a stale copy); forwarded if none was recorded.
//!
//! The proxy counts requests per operation. One thread per connection; the listener stops
//! when the proxy is dropped. It keeps its clients' connections alive (moto's server closes
//! every connection after one answer, AWS does not), so with no rule it is also how
//! `lambda-bench` lets a function reuse its connections as it does on AWS.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// What the proxy does to a matching request.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    DropReply,
    Status500,
    Throttle,
    TransactionConflict,
    WriteConflict,
    UnprocessedKeys,
    Delay(Duration),
    Stale,
}

#[derive(Debug, Clone)]
struct Rule {
    operation: String,
    body_contains: Option<String>,
    fault: Fault,
    /// Matching requests left; `None`: every one.
    left: Option<usize>,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    counts: BTreeMap<String, usize>,
    faulted: BTreeMap<String, usize>,
    replies: HashMap<String, Vec<u8>>,
    /// Request bodies kept, by operation, for the operations asked for ([`FaultProxy::record`]).
    recorded: HashMap<String, Vec<Vec<u8>>>,
}

/// A running proxy. `endpoint` goes where the emulator's would (`AWS_ENDPOINT_URL`).
pub struct FaultProxy {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl FaultProxy {
    /// A proxy in front of `upstream` (`http://127.0.0.1:PORT`).
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let (st, sp, n) = (state.clone(), stop.clone(), connections.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                n.fetch_add(1, Ordering::SeqCst);
                let (st, up) = (st.clone(), upstream.clone());
                std::thread::spawn(move || serve(conn, &up, &st));
            }
        });
        FaultProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            state,
            stop,
            port,
            connections,
        }
    }

    /// Client connections accepted so far: with clients that keep their connections
    /// alive, about one per client, however many requests they send.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `fault` to the next `times` requests of `operation` (`None`: all of them).
    pub fn on(&self, operation: &str, fault: Fault, times: Option<usize>) {
        self.on_matching(operation, None, fault, times);
    }

    /// As [`FaultProxy::on`], only for requests whose body contains `text`.
    pub fn on_matching(
        &self,
        operation: &str,
        text: Option<&str>,
        fault: Fault,
        times: Option<usize>,
    ) {
        self.lock().rules.push(Rule {
            operation: operation.to_string(),
            body_contains: text.map(String::from),
            fault,
            left: times,
        });
    }

    /// Keeps the body of every later request of `operation` (read with
    /// [`FaultProxy::recorded`]).
    pub fn record(&self, operation: &str) {
        self.lock()
            .recorded
            .entry(operation.to_string())
            .or_default();
    }

    /// The bodies of the requests of `operation` kept since [`FaultProxy::record`].
    pub fn recorded(&self, operation: &str) -> Vec<Vec<u8>> {
        self.lock()
            .recorded
            .get(operation)
            .cloned()
            .unwrap_or_default()
    }

    /// Removes every rule: requests pass through again.
    pub fn heal(&self) {
        self.lock().rules.clear();
    }

    /// Requests of `operation` seen so far (faulted or not).
    pub fn count(&self, operation: &str) -> usize {
        self.lock().counts.get(operation).copied().unwrap_or(0)
    }

    /// Requests of every operation seen so far.
    pub fn total(&self) -> usize {
        self.lock().counts.values().sum()
    }

    /// Requests of `operation` a rule has answered or delayed so far.
    pub fn faulted(&self, operation: &str) -> usize {
        self.lock().faulted.get(operation).copied().unwrap_or(0)
    }

    /// The environment that sends a process's AWS calls through this proxy.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("AWS_ENDPOINT_URL".to_string(), self.endpoint.clone())]
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One request as read from the client.
struct Request {
    head: Vec<u8>,
    body: Vec<u8>,
    operation: String,
}

fn read_request(r: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut head = Vec::new();
    let mut length = 0usize;
    let mut operation = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if lower.starts_with("x-amz-target:") {
            let v = line.split_once(':').map(|(_, v)| v.trim()).unwrap_or("");
            operation = v.rsplit('.').next().unwrap_or(v).to_string();
        }
        // The upstream connection is used once: ask moto to close it after answering.
        if lower.starts_with("connection:") {
            continue;
        }
        let end = line == "\r\n";
        if end {
            head.extend_from_slice(b"Connection: close\r\n");
        }
        head.extend_from_slice(line.as_bytes());
        if end {
            break;
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    Some(Request {
        head,
        body,
        operation,
    })
}

/// Sends the request to moto on a new connection and reads the whole answer: to its
/// `Content-Length` (moto's server closes the connection about 10 ms after the last byte,
/// which reading to the end would wait out on every call), or to the end without one.
fn forward(upstream: &str, req: &Request) -> Option<Vec<u8>> {
    let mut up = TcpStream::connect(upstream).ok()?;
    up.set_nodelay(true).ok()?;
    up.write_all(&req.head).ok()?;
    up.write_all(&req.body).ok()?;
    let mut r = BufReader::new(up);
    let mut reply = Vec::new();
    let mut length = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return Some(reply);
        }
        reply.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        }
    }
    match length {
        Some(n) => {
            let start = reply.len();
            reply.resize(start + n, 0);
            r.read_exact(&mut reply[start..]).ok()?;
        }
        None => {
            r.read_to_end(&mut reply).ok()?;
        }
    }
    Some(reply)
}

/// The answer moto gave, made safe to reuse on a kept-alive client connection: an HTTP/1.1
/// status line (werkzeug answers `HTTP/1.0`, after which a client closes the connection
/// whatever the headers say), its length, no `Connection` header.
fn keep_alive(reply: Vec<u8>) -> Vec<u8> {
    let text_end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .unwrap_or(reply.len());
    let (head, body) = reply.split_at(text_end);
    let head = String::from_utf8_lossy(head);
    let mut out = String::new();
    for (i, line) in head.split("\r\n").enumerate() {
        if i == 0 {
            // `HTTP/1.0 200 OK` -> `HTTP/1.1 200 OK`.
            let status = line.split_once(' ').map_or("200 OK", |(_, s)| s);
            out.push_str("HTTP/1.1 ");
            out.push_str(status);
            out.push_str("\r\n");
            continue;
        }
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("connection:")
            || lower.starts_with("content-length:")
            || line.is_empty()
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn json_reply(status: u16, reason: &str, body: &serde_json::Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         x-amzn-RequestId: fault-proxy\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// DynamoDB's cancellation of a transaction another one overlapped: one reason per item of
/// the request, in order, the first `TransactionConflict` and the others `None`.
fn conflict_reply(req: &Request) -> Vec<u8> {
    let asked: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let items = asked["TransactItems"].as_array().map_or(1, Vec::len).max(1);
    let reasons: Vec<serde_json::Value> = (0..items)
        .map(|i| match i {
            0 => serde_json::json!({
                "Code": "TransactionConflict",
                "Message": "Transaction is ongoing for the item"
            }),
            _ => serde_json::json!({ "Code": "None" }),
        })
        .collect();
    let codes: Vec<&str> = (0..items)
        .map(|i| {
            if i == 0 {
                "TransactionConflict"
            } else {
                "None"
            }
        })
        .collect();
    error_reply(
        400,
        "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        &format!(
            "Transaction cancelled, please refer cancellation reasons for specific reasons [{}]",
            codes.join(", ")
        ),
        serde_json::json!({ "CancellationReasons": reasons }),
    )
}

fn error_reply(status: u16, kind: &str, message: &str, extra: serde_json::Value) -> Vec<u8> {
    let mut body = serde_json::json!({ "__type": kind, "message": message, "Message": message });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let reason = if status == 500 {
        "Internal Server Error"
    } else {
        "Bad Request"
    };
    let mut reply = json_reply(status, reason, &body);
    // The SQS JSON protocol names its error code in a header too.
    let code = kind.rsplit('#').next().unwrap_or(kind);
    let header = format!("x-amzn-query-error: {code};Sender\r\n");
    let at = reply
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| i + 2)
        .unwrap_or(0);
    reply.splice(at..at, header.into_bytes());
    reply
}

/// The fault for this request, if a rule matches (using one of its applications).
fn take_fault(state: &Mutex<State>, req: &Request) -> Option<Fault> {
    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
    *st.counts.entry(req.operation.clone()).or_default() += 1;
    if let Some(kept) = st.recorded.get_mut(&req.operation) {
        kept.push(req.body.clone());
    }
    let body = String::from_utf8_lossy(&req.body);
    let rule = st.rules.iter_mut().find(|r| {
        r.operation == req.operation
            && r.left != Some(0)
            && r.body_contains.as_deref().is_none_or(|t| body.contains(t))
    })?;
    if let Some(n) = rule.left.as_mut() {
        *n -= 1;
    }
    let fault = rule.fault.clone();
    *st.faulted.entry(req.operation.clone()).or_default() += 1;
    Some(fault)
}

/// Whether an index read's reply (head and JSON body) listed at least one item.
fn listed_anything(reply: &[u8]) -> bool {
    let body = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| &reply[i + 4..])
        .unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["Count"].as_u64())
        .is_some_and(|n| n > 0)
}

/// The key of an index read's recorded reply: the operation and the index it names.
fn index_read(req: &Request) -> Option<String> {
    if req.operation != "Query" && req.operation != "Scan" {
        return None;
    }
    let asked: serde_json::Value = serde_json::from_slice(&req.body).ok()?;
    Some(format!(
        "{}:{}",
        req.operation,
        asked["IndexName"].as_str()?
    ))
}

fn serve(conn: TcpStream, upstream: &str, state: &Mutex<State>) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    while let Some(req) = read_request(&mut reader) {
        let reply = match take_fault(state, &req) {
            None => {
                let reply = forward(upstream, &req).map(keep_alive);
                // Index reads that listed something are kept, for `Fault::Stale`.
                if let (Some(copy), Some(r)) = (index_read(&req), &reply) {
                    if listed_anything(r) {
                        state
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .replies
                            .insert(copy, r.clone());
                    }
                }
                reply
            }
            Some(Fault::DropReply) => {
                let _ = forward(upstream, &req);
                let _ = out.shutdown(Shutdown::Both);
                return;
            }
            Some(Fault::Delay(d)) => {
                std::thread::sleep(d);
                forward(upstream, &req).map(keep_alive)
            }
            Some(Fault::Status500) => Some(error_reply(
                500,
                "InternalServerError",
                "fault proxy: internal server error",
                serde_json::json!({}),
            )),
            Some(Fault::Throttle) => {
                let kind = if req.head.windows(8).any(|w| w == b"DynamoDB") {
                    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException"
                } else {
                    "ThrottlingException"
                };
                Some(error_reply(
                    400,
                    kind,
                    "fault proxy: throttled",
                    serde_json::json!({}),
                ))
            }
            Some(Fault::TransactionConflict) => Some(conflict_reply(&req)),
            Some(Fault::WriteConflict) => Some(error_reply(
                400,
                "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                "Transaction is ongoing for the item",
                serde_json::json!({}),
            )),
            Some(Fault::UnprocessedKeys) => {
                let asked: serde_json::Value =
                    serde_json::from_slice(&req.body).unwrap_or_default();
                Some(json_reply(
                    200,
                    "OK",
                    &serde_json::json!({ "Responses": {}, "UnprocessedKeys": asked["RequestItems"] }),
                ))
            }
            Some(Fault::Stale) => {
                let known = index_read(&req).and_then(|copy| {
                    state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .replies
                        .get(&copy)
                        .cloned()
                });
                match known {
                    Some(r) => Some(r),
                    None => forward(upstream, &req).map(keep_alive),
                }
            }
        };
        match reply {
            Some(r) if out.write_all(&r).is_ok() => {}
            _ => {
                let _ = out.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}
