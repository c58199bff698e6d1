//! Structured JSON logs through tracing-subscriber, filtered by `RUST_LOG` (default info).
//!
//! One JSON object per line: `timestamp`, `level`, the event's `fields` and, inside a span,
//! `spans` (each span's fields and its `name`, root first), the shape of
//! tracing-subscriber's own JSON format. The line is written by [`LineFormat`] and a
//! span's fields by [`LineFields`], straight into the line: the stock JSON format builds a
//! `serde_json::Value` map per span and per event and parses every span's stored JSON back
//! at every line, about 7 % of the server's CPU on a page read (BENCHMARKS.md).

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .fmt_fields(LineFields)
        .event_format(LineFormat)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Writes an event as one JSON line. Every line carries the fields of its spans: the
/// request's ids (Airlock's, API Gateway's, Lambda's) on each line of a request, the
/// message's on a worker's.
pub struct LineFormat;

/// Keeps a span's fields as the text of a JSON object, for [`LineFormat`] to copy.
pub struct LineFields;

impl<S> FormatEvent<S, LineFields> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, LineFields>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        w.write_str("{\"timestamp\":\"")?;
        SystemTime.format_time(&mut w)?;
        w.write_str("\",\"level\":\"")?;
        w.write_str(event.metadata().level().as_str())?;
        w.write_str("\",\"fields\":")?;
        write_fields(&mut w, |v| event.record(v))?;
        if let Some(scope) = ctx.event_scope() {
            w.write_str(",\"spans\":[")?;
            for (i, span) in scope.from_root().enumerate() {
                if i > 0 {
                    w.write_char(',')?;
                }
                let ext = span.extensions();
                let stored = ext
                    .get::<FormattedFields<LineFields>>()
                    .map_or("{}", |f| f.fields.as_str());
                // `{"a":1}` becomes `{"a":1,"name":"request"}`.
                match stored.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some("") => w.write_char('{')?,
                    Some(inner) => {
                        w.write_char('{')?;
                        w.write_str(inner)?;
                        w.write_char(',')?;
                    }
                    // Not written by `LineFields`: kept readable, never spliced.
                    None => {
                        w.write_str("{\"field_error\":")?;
                        json_str(&mut w, stored)?;
                        w.write_char(',')?;
                    }
                }
                w.write_str("\"name\":")?;
                json_str(&mut w, span.name())?;
                w.write_char('}')?;
            }
            w.write_char(']')?;
        }
        w.write_str("}\n")
    }
}

impl<'w> FormatFields<'w> for LineFields {
    fn format_fields<R: RecordFields>(&self, mut w: Writer<'w>, fields: R) -> fmt::Result {
        write_fields(&mut w, |v| fields.record(v))
    }

    /// Fields recorded on a span after it was made replace those of the same name.
    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if current.fields.is_empty() {
            return self.format_fields(current.as_writer(), fields);
        }
        let mut added = String::new();
        self.format_fields(Writer::new(&mut added), fields)?;
        type Object = serde_json::Map<String, serde_json::Value>;
        let mut all: Object = serde_json::from_str(&current.fields).map_err(|_| fmt::Error)?;
        all.extend(serde_json::from_str::<Object>(&added).map_err(|_| fmt::Error)?);
        current.fields = serde_json::to_string(&all).map_err(|_| fmt::Error)?;
        Ok(())
    }
}

/// Writes the fields `record` visits as a JSON object.
fn write_fields<W: fmt::Write>(
    w: &mut W,
    record: impl FnOnce(&mut JsonVisitor<'_, W>),
) -> fmt::Result {
    w.write_char('{')?;
    let mut v = JsonVisitor {
        w: &mut *w,
        first: true,
        result: Ok(()),
    };
    record(&mut v);
    v.result?;
    w.write_char('}')
}

/// Writes each field it visits as `"name":value`, as tracing-subscriber's JSON format
/// does: numbers and booleans as they are (a float that is not finite as `null`), anything
/// else (bytes too, as hex) as the string of its `Debug`.
struct JsonVisitor<'a, W: fmt::Write> {
    w: &'a mut W,
    first: bool,
    result: fmt::Result,
}

impl<W: fmt::Write> JsonVisitor<'_, W> {
    fn put(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = (|| {
            if !std::mem::take(&mut self.first) {
                self.w.write_char(',')?;
            }
            json_str(self.w, name)?;
            self.w.write_char(':')?;
            value(self.w)
        })();
    }
}

impl<W: fmt::Write> Visit for JsonVisitor<'_, W> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        // serde_json's own digits (`5.0`, not `5`).
        self.put(field, |w| match serde_json::Number::from_f64(value) {
            Some(n) => write!(w, "{n}"),
            None => w.write_str("null"),
        });
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, |w| write!(w, "{value}"));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, |w| write!(w, "{value}"));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, |w| w.write_str(if value { "true" } else { "false" }));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, |w| json_str(w, value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, |w| {
            w.write_char('"')?;
            write!(Escaped(w), "{value:?}")?;
            w.write_char('"')
        });
    }
}

/// `s` as a JSON string, quoted.
fn json_str<W: fmt::Write + ?Sized>(w: &mut W, s: &str) -> fmt::Result {
    w.write_char('"')?;
    Escaped(w).write_str(s)?;
    w.write_char('"')
}

/// Escapes what is written through it as the inside of a JSON string, byte for byte as
/// serde_json does: `"` and `\\`, and the control characters (`\n`, `\r`, `\t`, `\b`, `\f`,
/// else `\u00xx`). An ANSI escape in a logged value is written as `\u001b`.
struct Escaped<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, b) in s.bytes().enumerate() {
            let short = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..=0x1f => "",
                _ => continue,
            };
            // Every byte escaped is ASCII, so `i` is a character boundary.
            self.0.write_str(&s[start..i])?;
            if short.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(short)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;
    use std::sync::{Arc, Mutex};

    proptest! {
        /// A string is escaped byte for byte as serde_json escapes it.
        #[test]
        fn strings_are_escaped_as_serde_json_does(s in "(\\PC|[\\x00-\\x1f\\x7f\"\\\\])*") {
            let mut out = String::new();
            json_str(&mut out, &s).unwrap();
            prop_assert_eq!(out, serde_json::to_string(&s).unwrap());
        }
    }

    /// What `events` logs, through a subscriber built by `build`, one JSON value per line.
    fn lines(
        build: impl FnOnce(
            tracing_subscriber::fmt::SubscriberBuilder,
            Buf,
        ) -> Box<dyn Subscriber + Send + Sync>,
        events: impl FnOnce(),
    ) -> Vec<Value> {
        let buf = Buf::default();
        let subscriber = build(tracing_subscriber::fmt(), buf.clone());
        tracing::subscriber::with_default(subscriber, events);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn events() {
        let span = tracing::info_span!(
            "request",
            request_id = %"req_1",
            path = "/a\"b\n\u{1b}[31m",
            n = 5u64,
            neg = -3i64,
            ok = true,
            f = 0.25f64,
            r#type = "x",
            later = tracing::field::Empty
        );
        let entered = span.enter();
        span.record("later", "set");
        span.record("n", 6u64);
        tracing::info!(
            status = 200u16,
            latency_ms = 1.5f64,
            whole = 5.0f64,
            nan = f64::NAN,
            text = "\u{1b}[31mred\u{7f} é 😀 \\ \"q\"",
            listed = ?vec!["a\"b", "c"],
            bytes = &b"ab"[..],
            "request {}",
            7
        );
        let inner = tracing::info_span!("message", message_id = "m-1");
        inner.in_scope(|| tracing::warn!(error = %"boom\tnow", "message handled"));
        tracing::debug!("filtered out at info");
        drop(entered);
        tracing::info_span!("empty").in_scope(|| tracing::error!("in an empty span"));
        tracing::info!("outside any span");
    }

    /// The lines say what tracing-subscriber's JSON format says, to the value: the same
    /// keys, the same fields (strings escaped, numbers, `null` for a NaN, bytes in hex),
    /// the same spans root first with their names, fields recorded later replacing
    /// earlier ones; the time as tracing-subscriber writes it.
    #[test]
    fn lines_say_what_the_stock_json_format_says() {
        let ours = lines(
            |b, w| {
                Box::new(
                    b.fmt_fields(LineFields)
                        .event_format(LineFormat)
                        .with_writer(move || w.clone())
                        .finish(),
                )
            },
            events,
        );
        let stock = lines(
            |b, w| {
                Box::new(
                    b.json()
                        .with_current_span(false)
                        .with_span_list(true)
                        .with_target(false)
                        .with_writer(move || w.clone())
                        .finish(),
                )
            },
            events,
        );
        assert_eq!(ours.len(), 4, "{ours:#?}");
        let untimed = |mut lines: Vec<Value>| {
            for l in &mut lines {
                let t = l.as_object_mut().unwrap().remove("timestamp").unwrap();
                let t = t.as_str().unwrap();
                assert_eq!(t.len(), 27, "{t}");
                assert!(chrono::DateTime::parse_from_rfc3339(t).is_ok(), "{t}");
            }
            lines
        };
        let (ours, stock) = (untimed(ours), untimed(stock));
        assert_eq!(ours, stock);
        // And what that is, so the comparison cannot pass on two empty lists.
        assert_eq!(ours[0]["level"], "INFO");
        assert_eq!(ours[0]["fields"]["message"], "request 7");
        assert_eq!(ours[0]["fields"]["whole"], serde_json::json!(5.0));
        assert_eq!(ours[0]["fields"]["nan"], Value::Null);
        assert_eq!(ours[0]["fields"]["bytes"], "[61 62]");
        assert_eq!(ours[0]["spans"][0]["later"], "set");
        assert_eq!(ours[0]["spans"][0]["n"], 6);
        assert_eq!(ours[0]["spans"][0]["type"], "x");
        assert_eq!(ours[1]["spans"][1]["name"], "message");
        assert_eq!(ours[2]["spans"], serde_json::json!([{ "name": "empty" }]));
        assert!(ours[3].get("spans").is_none());
    }
}
