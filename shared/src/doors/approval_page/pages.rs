//! The approval page's HTML: server-rendered, one small script (`approvals.js`, served
//! from the same origin; no inline script, no framework), strict security headers. What a
//! page shows comes from `protocol::approvals`; this module only renders it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::core::domain::{human_time, rfc3339, Millis};
use crate::core::error::ApiError;
use crate::core::records::{ApprovalDecision, PlanRecord, PlanStatus};
use crate::core::usecases::approvals::{still_needed, PendingPage, PlanPage, SignedIn};

pub const SCRIPT: &str = include_str!("approvals.js");

/// HTML-escapes text for element content and quoted attributes.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = "body{font:16px/1.45 system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;color:#111}\
h1{font-size:1.4rem}table{border-collapse:collapse;width:100%;margin:.5rem 0 1rem}\
td,th{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top}\
.pass{color:#060}.warn{color:#a60}.fail{color:#b00}.preview{font-size:1.25rem;font-weight:600;padding:.7rem;border:2px solid #333}\
button{font-size:1rem;padding:.5rem 1.2rem;margin-right:.6rem}#approve{background:#063;color:#fff}#decline{background:#fff;border:2px solid #b00;color:#b00}\
.notice{padding:.6rem;background:#fff4d6;border:1px solid #e0b84c}#status{min-height:1.5rem;font-weight:600}";

fn html(status: StatusCode, title: &str, csrf: Option<&str>, body: &str) -> Response {
    let meta = csrf
        .map(|t| format!("<meta name=\"csrf-token\" content=\"{}\">", esc(t)))
        .unwrap_or_default();
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">{meta}\
         <title>{} - Airlock</title><style>{STYLE}</style>\
         <script src=\"/approvals/assets/approvals.js\" defer></script></head>\
         <body>{body}</body></html>",
        esc(title)
    );
    let mut resp = (status, page).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; \
             img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Enrolment links carry their secret in the path: never send it on.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// A plain error page for a browser: the status of the error, its sentence, no detail.
pub fn error_page(e: &ApiError) -> Response {
    let status = crate::doors::http::error::status_of(e.code);
    if status.is_server_error() {
        tracing::error!(
            code = e.code.as_str(),
            cause = e.cause.as_deref().unwrap_or(""),
            "approval page failed"
        );
    }
    html(
        status,
        "Error",
        None,
        &format!(
            "<main id=\"error\" data-code=\"{}\"><h1>{}</h1><p id=\"message\">{}</p>\
             <p><a href=\"/approvals\">Pending approvals</a></p></main>",
            esc(e.code.as_str()),
            esc(status.canonical_reason().unwrap_or("Error")),
            esc(&e.message)
        ),
    )
}

fn header_bar(who: &SignedIn) -> String {
    format!(
        "<p>Signed in as <strong id=\"who\">{}</strong> until {} \
         <button id=\"sign-out\" type=\"button\">Sign out</button> · <a href=\"/approvals\">Pending approvals</a></p>",
        esc(&who.operator.sub),
        esc(&human_time(who.expires_at))
    )
}

pub fn login(next: &str) -> Response {
    html(
        StatusCode::OK,
        "Sign in",
        None,
        &format!(
            "<main id=\"login\" data-next=\"{}\"><h1>Airlock approvals: sign in</h1>\
             <p>Sign in with the passkey an Airlock admin enrolled for you.</p>\
             <p><label>Operator id <input id=\"operator\" autocomplete=\"username webauthn\" maxlength=\"256\"></label></p>\
             <p><button id=\"sign-in\" type=\"button\">Sign in with passkey</button></p>\
             <p id=\"status\" role=\"status\"></p></main>",
            esc(next)
        ),
    )
}

pub fn enrol(sub: &str, expires_at: Millis) -> Response {
    html(
        StatusCode::OK,
        "Register a passkey",
        None,
        &format!(
            "<main id=\"enrol\"><h1>Register a passkey</h1>\
             <p>This one-time link registers a passkey for operator <strong id=\"enrol-sub\">{}</strong>. \
             It works once, until {}. Your device will ask you to verify (PIN, fingerprint or face).</p>\
             <p><button id=\"enroll\" type=\"button\">Register a passkey</button></p>\
             <p id=\"status\" role=\"status\"></p></main>",
            esc(sub),
            esc(&human_time(expires_at))
        ),
    )
}

pub fn pending(who: &SignedIn, page: &PendingPage, now: Millis) -> Response {
    let mut items = String::new();
    for p in &page.plans {
        let whose = if p.requested_by == who.operator.sub {
            "yours".to_string()
        } else {
            format!("asked by {}", esc(&p.requested_by))
        };
        let four_eyes = if p.four_eyes {
            format!(
                "; four eyes: approved by {}, waiting for {}",
                if p.approvals.is_empty() {
                    "nobody yet".to_string()
                } else {
                    esc(&p
                        .approvals
                        .iter()
                        .map(|a| a.approver.as_str())
                        .collect::<Vec<_>>()
                        .join(", "))
                },
                esc(&still_needed(p))
            )
        } else {
            String::new()
        };
        items.push_str(&format!(
            "<li><a class=\"plan\" href=\"/approvals/plans/{}\">{}</a> <small>({}, desk {}, {} s left{})</small></li>",
            esc(&p.plan_id),
            esc(&p.preview),
            whose,
            esc(&p.desk),
            ((p.expires_at - now) / 1000).max(0),
            four_eyes
        ));
    }
    if items.is_empty() {
        items.push_str("<li class=\"none\">Nothing is waiting for you.</li>");
    }
    let older = match &page.next {
        Some((at, id)) => format!(
            "<p><a id=\"older\" href=\"/approvals?before={}\">Older plans</a></p>",
            esc(&pending_position(*at, id))
        ),
        None => String::new(),
    };
    html(
        StatusCode::OK,
        "Pending approvals",
        Some(&who.csrf),
        &format!(
            "<main id=\"pending-page\">{}<h1>Pending approvals</h1><ul id=\"pending\">{items}</ul>{older}\
             <p id=\"status\" role=\"status\"></p></main>",
            header_bar(who)
        ),
    )
}

/// The pending list's page position in a link: `<expiry millis>_<plan id>`.
pub fn pending_position(at: Millis, plan_id: &str) -> String {
    format!("{at}_{plan_id}")
}

/// A `before` position from a link, if it is one this page wrote.
pub fn parse_pending_position(text: &str) -> Option<crate::core::records::PlanPosition> {
    let (at, id) = text.split_once('_')?;
    let at: Millis = at.parse().ok()?;
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then(|| (at, id.to_string()))
}

/// Where a plan stands, for the page (`data-state`).
fn state(p: &PlanRecord, now: Millis) -> &'static str {
    match (&p.approval, p.status) {
        (Some(a), _) if a.decision == ApprovalDecision::Declined => "declined",
        (_, PlanStatus::Executed) => "executed",
        (Some(_), PlanStatus::Closed) => "closed",
        (Some(_), _) => "approved",
        (None, PlanStatus::Closed) => "closed",
        (None, _) if !p.executable => "not_executable",
        (None, _) if now >= p.expires_at => "expired",
        (None, _) => "pending",
    }
}

pub fn plan(who: &SignedIn, page: &PlanPage, now: Millis) -> Response {
    let p = &page.plan;
    let st = state(p, now);
    let chat = |k: &str| {
        p.chat_context
            .get(k)
            .and_then(|v| v.as_str())
            .map(esc)
            .unwrap_or_else(|| "-".into())
    };
    let mut payload = String::new();
    let fields = crate::core::usecases::actions::of(p.action_type).fields(&p.normalized_payload);
    for f in fields {
        let value = match &f.before {
            Some(before) if *before != f.value => format!(
                "<span class=\"before\">{}</span> &rarr; <strong class=\"after\">{}</strong>",
                esc(before),
                esc(&f.value)
            ),
            _ => esc(&f.value),
        };
        payload.push_str(&format!(
            "<tr><th>{}</th><td>{value}</td></tr>",
            esc(&f.name)
        ));
    }
    let mut checks = String::new();
    for c in &p.risk_checks {
        let s = match c.status {
            crate::core::records::CheckStatus::Pass => "pass",
            crate::core::records::CheckStatus::Warn => "warn",
            crate::core::records::CheckStatus::Fail => "fail",
        };
        checks.push_str(&format!(
            "<tr class=\"check\"><td>{}</td><td class=\"{s}\">{s}</td><td>{}</td></tr>",
            esc(&c.name),
            esc(&c.reason)
        ));
    }
    let four_eyes = if p.four_eyes {
        let approved: Vec<String> = p
            .approvals
            .iter()
            .map(|a| format!("{} at {}", a.approver, human_time(a.at)))
            .collect();
        format!(
            "<p class=\"notice\" id=\"four-eyes\">Four eyes: this order is above the desk's notional limit. \
             It needs two approvals: its requester's own and another operator's with approve on the desk.</p>\
             <p id=\"four-eyes-state\">Approved by: <strong id=\"approved-by\">{}</strong>. Still needed: <strong id=\"still-needed\">{}</strong>.</p>",
            esc(&if approved.is_empty() { "nobody yet".to_string() } else { approved.join(", ") }),
            esc(&still_needed(p))
        )
    } else {
        String::new()
    };
    let decision = match &p.approval {
        Some(a) => format!(
            "<p id=\"decided\">{} by <strong>{}</strong> at {}.</p>",
            match a.decision {
                ApprovalDecision::Approved => "Approved",
                ApprovalDecision::Declined => "Declined",
            },
            esc(&a.approver),
            esc(&human_time(a.at))
        ),
        None => String::new(),
    };
    let mut buttons = String::new();
    if page.approve.is_ok() {
        buttons.push_str("<button id=\"approve\" type=\"button\">Approve</button>");
    }
    if page.decline.is_ok() {
        buttons.push_str("<button id=\"decline\" type=\"button\">Decline</button>");
    }
    let why_not = match (&page.approve, st) {
        (Err(why), "pending") => format!("<p id=\"why-not\">{}</p>", esc(why)),
        _ => String::new(),
    };
    html(
        StatusCode::OK,
        "Approve a plan",
        Some(&who.csrf),
        &format!(
            "<main id=\"plan\" data-plan-id=\"{id}\" data-state=\"{st}\">{bar}\
             <h1>Approve a plan</h1>\
             <p class=\"preview\" id=\"preview\">{preview}</p>{four_eyes}\
             <p>State: <strong id=\"state\">{st}</strong>. Expires at {exp} \
             (<span id=\"time-left\" data-left-ms=\"{left_ms}\">{left} s</span> left).</p>{decision}\
             <h2>Asked by</h2><table><tr><th>operator</th><td id=\"requested-by\">{by}</td></tr>\
             <tr><th>through</th><td>{svc}</td></tr><tr><th>chat session</th><td id=\"chat-session\">{chat_s}</td></tr>\
             <tr><th>tool call</th><td>{chat_t}</td></tr><tr><th>plan</th><td>{id} ({action})</td></tr>\
             <tr><th>policy</th><td>{policy}</td></tr></table>\
             <h2>Order, as it will be sent</h2><table id=\"payload\">{payload}</table>\
             <h2>Risk checks</h2><table id=\"checks\"><tr><th>check</th><th>result</th><th>why</th></tr>{checks}</table>\
             {why_not}<p id=\"actions\">{buttons}</p><p id=\"status\" role=\"status\"></p></main>",
            id = esc(&p.plan_id),
            bar = header_bar(who),
            preview = esc(&p.preview),
            exp = esc(&rfc3339(p.expires_at)),
            left_ms = (p.expires_at - now).max(0),
            left = ((p.expires_at - now) / 1000).max(0),
            by = esc(&p.requested_by),
            svc = esc(&p.service_principal),
            chat_s = chat("chat_session_id"),
            chat_t = chat("tool_call_id"),
            action = esc(p.action_type.as_str()),
            policy = esc(&p.policy_version),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }
}
