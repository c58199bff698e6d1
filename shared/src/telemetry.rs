//! Structured JSON logs through tracing-subscriber, filtered by `RUST_LOG` (default info).

pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        // Every line carries the fields of its spans: the request's ids (Airlock's, API
        // Gateway's, Lambda's) on each line of a request, the message's on a worker's.
        .with_span_list(true)
        .with_target(false)
        .with_writer(std::io::stderr)
        .try_init();
}

tokio::task_local! {
    static CALLS: std::cell::RefCell<Vec<&'static str>>;
}

/// Records one call to a backend service (e.g. `DynamoDB.BatchGetItem`) against the
/// request being served; the request's log line lists them (`backend_calls`).
pub fn record_call(service: &str, operation: &str) {
    let name = call_name(service, operation);
    let _ = CALLS.try_with(|c| c.borrow_mut().push(name));
}

/// Interned `service.operation` names, so recording costs no allocation after the first.
fn call_name(service: &str, operation: &str) -> &'static str {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let full = format!("{service}.{operation}");
    let mut guard = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let set = guard.get_or_insert_with(HashSet::new);
    if let Some(n) = set.get(full.as_str()) {
        return n;
    }
    let leaked: &'static str = Box::leak(full.into_boxed_str());
    set.insert(leaked);
    leaked
}

/// Runs `f` and returns its output with the backend calls it made.
pub async fn with_call_log<F: std::future::Future>(f: F) -> (F::Output, Vec<&'static str>) {
    CALLS
        .scope(std::cell::RefCell::new(Vec::new()), async move {
            let out = f.await;
            let calls = CALLS.with(|c| c.take());
            (out, calls)
        })
        .await
}

tokio::task_local! {
    static GATEWAY_IDS: (Option<String>, Option<String>);
}

/// API Gateway's request id and the Lambda request id of the request being served (both
/// `None` outside Lambda or outside a request).
pub fn gateway_ids() -> (Option<String>, Option<String>) {
    GATEWAY_IDS.try_with(Clone::clone).unwrap_or_default()
}

/// Runs `f` with the request's gateway ids available to [`gateway_ids`].
pub async fn with_gateway_ids<F: std::future::Future>(
    ids: (Option<String>, Option<String>),
    f: F,
) -> F::Output {
    GATEWAY_IDS.scope(ids, f).await
}
