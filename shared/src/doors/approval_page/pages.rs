//! The approval page's HTML: server-rendered, one small script (`approvals.js`, served
//! from the same origin; no inline script, no framework), strict security headers. What a
//! page shows comes from `protocol::approvals`; this module only renders it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::core::domain::{human_time, rfc3339, Millis};
use crate::core::error::ApiError;
use crate::core::records::{ApprovalDecision, PlanRecord, PlanStatus};
use crate::core::usecases::approvals::summary::{self, pending_item, PendingItem};
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

const STYLE: &str = "*{box-sizing:border-box}\
body{font:16px/1.45 system-ui,sans-serif;max-width:46rem;margin:0 auto;padding:0 .75rem 2rem;color:#111;background:#fff}\
h1{font-size:1.25rem;margin:.6rem 0}h2{font-size:1.1rem;margin:1.2rem 0 .4rem}h3{font-size:1rem;margin:1rem 0 .3rem}\
a{color:#0b4f9c}:focus-visible{outline:3px solid #0b4f9c;outline-offset:2px}\
.bar{display:flex;flex-wrap:wrap;align-items:center;justify-content:space-between;gap:.25rem .75rem;font-size:.875rem;border-bottom:1px solid #ccc;padding:.25rem 0}\
.bar p{margin:0}.bar nav{display:flex;align-items:center;gap:.75rem}\
.bar nav a{display:inline-flex;align-items:center;min-height:44px}\
table{border-collapse:collapse;width:100%;margin:.3rem 0 .8rem;table-layout:fixed}\
td,th{border:1px solid #ccc;padding:.3rem .45rem;text-align:left;vertical-align:top;overflow-wrap:anywhere}\
th{width:34%;font-weight:600}#checks th,#checks td{width:auto}#checks td:first-child{width:30%}#checks td:nth-child(2){width:4.2rem}\
.pass{color:#065f16}.warn{color:#7a4500}.fail{color:#a30000}\
.preview{font-size:1.15rem;font-weight:600;padding:.55rem .7rem;border:2px solid #333;margin:.5rem 0;overflow-wrap:anywhere}\
.facts{display:grid;grid-template-columns:max-content 1fr;gap:.15rem .8rem;margin:.4rem 0}.facts dt{font-weight:600}.facts dd{margin:0;overflow-wrap:anywhere}\
.basis{color:#444;font-size:.875rem}\
#warnings{list-style:none;padding:0;margin:.4rem 0}#warnings li{padding:.45rem .6rem;margin:.3rem 0;border-left:6px solid #b36b00;background:#fff4e0;overflow-wrap:anywhere}\
#warnings li.check-fail{border-left-color:#a30000;background:#fde8e8}\
.ok{color:#065f16;margin:.4rem 0}\
.actions{display:flex;flex-wrap:wrap;gap:.5rem;margin:.6rem 0}\
button{font:inherit;min-height:44px;padding:.5rem 1rem;border-radius:4px;cursor:pointer}\
.actions button{flex:1 1 14rem;font-weight:600}\
#approve{background:#05582c;border:2px solid #05582c;color:#fff}#decline{background:#fff;border:2px solid #a30000;color:#a30000}\
button:disabled{background:#eee!important;color:#555!important;border-color:#999!important;cursor:not-allowed}\
#sign-out{min-height:44px;padding:.25rem .75rem;background:#fff;border:1px solid #666;color:#111}\
.notice{padding:.5rem .6rem;background:#fff4d6;border:1px solid #e0b84c;margin:.4rem 0}\
#why-not{font-weight:600;color:#a30000}#why-not:empty{margin:0}\
#status{min-height:1.5rem;font-weight:600;margin:.3rem 0}\
details summary{min-height:44px;display:flex;align-items:center;cursor:pointer;font-weight:600}\
#pending{list-style:none;padding:0;margin:0}#pending li{border:1px solid #ccc;border-radius:4px;padding:.4rem .6rem;margin:.5rem 0}\
#pending a.plan{display:flex;align-items:center;min-height:44px;font-weight:600;overflow-wrap:anywhere}\
.meta{display:flex;flex-wrap:wrap;gap:.1rem 1rem;margin:.2rem 0 0;font-size:.9rem}.meta div{display:flex;gap:.3rem}.meta dt{color:#444}.meta dd{margin:0;overflow-wrap:anywhere}\
#pending li.none{border-style:dashed;color:#333}\
input{font:inherit;min-height:44px;width:100%;max-width:24rem;padding:.3rem .5rem}";

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

/// `15:04:05 UTC`.
fn clock_time(ms: Millis) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%H:%M:%S UTC")
        .to_string()
}

fn header_bar(who: &SignedIn) -> String {
    format!(
        "<header class=\"bar\"><p>Signed in as <strong id=\"who\">{}</strong> until {}</p>\
         <nav aria-label=\"Approvals\"><a href=\"/approvals\">Pending approvals</a>\
         <button id=\"sign-out\" type=\"button\">Sign out</button></nav></header>",
        esc(&who.operator.sub),
        esc(&clock_time(who.expires_at))
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

/// The pending list's items (also what its JSON carries for the page to swap in).
pub fn pending_items(who: &SignedIn, items: &[PendingItem]) -> String {
    let mut out = String::new();
    for p in items {
        let whose = if p.requested_by == who.operator.sub {
            format!("{} (you)", esc(&p.requested_by))
        } else {
            esc(&p.requested_by)
        };
        let four_eyes = match &p.four_eyes {
            Some(f) => format!(
                "<div><dt>Four eyes</dt><dd class=\"four-eyes\">approved by {}; waiting for {}</dd></div>",
                esc(&if f.approved_by.is_empty() {
                    "nobody yet".to_string()
                } else {
                    f.approved_by.join(", ")
                }),
                esc(&f.still_needed)
            ),
            None => String::new(),
        };
        let warnings = match p.warnings {
            0 => "<dd class=\"warnings\">none</dd>".to_string(),
            n => format!("<dd class=\"warnings warn\"><strong>{n}</strong></dd>"),
        };
        out.push_str(&format!(
            "<li data-plan-id=\"{id}\"><a class=\"plan\" href=\"/approvals/plans/{id}\">{preview}</a>\
             <dl class=\"meta\"><div><dt>Notional</dt><dd class=\"notional\">{notional}</dd></div>\
             <div><dt>Asked by</dt><dd class=\"requester\">{whose}</dd></div>\
             <div><dt>Chat</dt><dd class=\"chat\">{chat}</dd></div>\
             <div><dt>Asked at</dt><dd class=\"asked\">{asked}</dd></div>\
             <div><dt>Time left</dt><dd><span class=\"left\" data-left-ms=\"{left_ms}\">{left} s</span></dd></div>\
             <div><dt>Warnings</dt>{warnings}</div>{four_eyes}</dl></li>",
            id = esc(&p.plan_id),
            preview = esc(&p.preview),
            notional = esc(p.notional.as_deref().unwrap_or("not known")),
            chat = esc(p.chat_session_id.as_deref().unwrap_or("-")),
            asked = esc(&clock_time(p.asked_at)),
            left_ms = p.left_ms,
            left = p.left_ms / 1000,
        ));
    }
    if out.is_empty() {
        out.push_str(
            "<li class=\"none\" id=\"empty\">Nothing is waiting for you. Plans the agent makes for you \
             (and, if you approve for a desk, its four-eyes plans) appear here by themselves within \
             seconds: this list updates itself.</li>",
        );
    }
    out
}

pub fn pending(who: &SignedIn, page: &PendingPage, now: Millis, live: bool) -> Response {
    let items: Vec<PendingItem> = page.plans.iter().map(|p| pending_item(p, now)).collect();
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
            "{}<main id=\"pending-page\" data-live=\"{live}\"><h1>Pending approvals</h1>\
             <p id=\"pending-count\" aria-live=\"polite\">{}</p>\
             <ul id=\"pending\" data-key=\"{}\">{}</ul>{older}\
             <p id=\"status\" role=\"status\"></p></main>",
            header_bar(who),
            esc(&pending_count(items.len(), live)),
            esc(&pending_key(&items)),
            pending_items(who, &items),
        ),
    )
}

/// What the pending list shows, in a word: its plans and their approvals so far (the
/// list's script redraws the list when this changes).
pub fn pending_key(items: &[PendingItem]) -> String {
    items
        .iter()
        .map(|p| match &p.four_eyes {
            Some(f) => format!("{}:{}", p.plan_id, f.approved_by.join(",")),
            None => p.plan_id.clone(),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The sentence above the pending list.
pub fn pending_count(n: usize, live: bool) -> String {
    let waiting = match n {
        0 => "No plan is waiting for you".to_string(),
        1 => "1 plan is waiting for you".to_string(),
        n => format!("{n} plans are waiting for you"),
    };
    if live {
        format!("{waiting}, newest first; this list updates itself.")
    } else {
        format!("{waiting}, newest first.")
    }
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
pub fn state(p: &PlanRecord, now: Millis) -> &'static str {
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

    // The summary: the money, the price it is measured at and its age, what needs attention.
    let notional = match summary::order_value(p) {
        Some(v) => {
            let qty = p
                .normalized_payload
                .payload()
                .order_terms()
                .map(|t| t.quantity)
                .unwrap_or(0);
            let basis = match v.basis {
                summary::PriceBasis::Limit => "its limit",
                summary::PriceBasis::Stop => "its stop",
                summary::PriceBasis::Reference => "the reference price",
            };
            format!(
                "<strong>{}</strong> <span class=\"basis\">{qty} x 1,000 bbl at {} ({basis})</span>",
                esc(&summary::usd(v.usd)),
                esc(&v.price.to_string())
            )
        }
        None if p.normalized_payload.payload().order_terms().is_some() => {
            "not known: no price was recorded with this plan".to_string()
        }
        None => "none: this plan sends no order".to_string(),
    };
    let reference = match p.reference_price {
        Some(r) => match summary::reference_observed_at(p) {
            Some(at) => format!(
                "{}, <span id=\"reference-age\">{} old</span> <span class=\"basis\">(observed {})</span>",
                esc(&r.to_string()),
                esc(&summary::age(now - at)),
                esc(&clock_time(at))
            ),
            None => esc(&r.to_string()),
        },
        None => "none recorded with this plan".to_string(),
    };
    let attention = summary::attention(p);
    let passed = summary::passed(p);
    let warnings = if attention.is_empty() {
        format!(
            "<p class=\"ok\" id=\"no-warnings\">No warnings: {}.</p>",
            match passed.len() {
                1 => "the one check passed".to_string(),
                n => format!("all {n} checks passed"),
            }
        )
    } else {
        let mut items = String::new();
        for c in &attention {
            let s = status_word(c.status);
            items.push_str(&format!(
                "<li class=\"check-{s}\" data-check=\"{name}\"><strong class=\"{s}\">{s}: {name}</strong> {reason}</li>",
                name = esc(&c.name),
                reason = esc(&c.reason)
            ));
        }
        format!(
            "<h2 id=\"warnings-title\">{}</h2><ul id=\"warnings\" aria-labelledby=\"warnings-title\">{items}</ul>",
            match attention.len() {
                1 => "1 check needs your attention".to_string(),
                n => format!("{n} checks need your attention"),
            }
        )
    };
    let mut checks = String::new();
    for c in &passed {
        checks.push_str(&format!(
            "<tr class=\"check\"><td>{}</td><td class=\"pass\">pass</td><td>{}</td></tr>",
            esc(&c.name),
            esc(&c.reason)
        ));
    }
    let passed_title = match passed.len() {
        1 => "1 check passed".to_string(),
        n => format!("{n} checks passed"),
    };

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
        buttons.push_str(&format!(
            "<button id=\"approve\" type=\"button\" aria-describedby=\"why-not\">{}</button>",
            esc(&summary::decision_label(p, ApprovalDecision::Approved))
        ));
    }
    if page.decline.is_ok() {
        buttons.push_str(&format!(
            "<button id=\"decline\" type=\"button\" aria-describedby=\"why-not\">{}</button>",
            esc(&summary::decision_label(p, ApprovalDecision::Declined))
        ));
    }
    let why_not = match (&page.approve, st) {
        (Err(why), "pending") => esc(why),
        _ => String::new(),
    };
    let actions = if buttons.is_empty() {
        String::new()
    } else {
        format!("<div class=\"actions\" id=\"actions\">{buttons}</div>")
    };
    html(
        StatusCode::OK,
        "Approve a plan",
        Some(&who.csrf),
        &format!(
            "{bar}<main id=\"plan\" data-plan-id=\"{id}\" data-state=\"{st}\">\
             <h1>Approve a plan</h1>\
             <section id=\"summary\" aria-label=\"Summary\">\
             <p class=\"preview\" id=\"preview\">{preview}</p>\
             <dl class=\"facts\"><dt>Notional</dt><dd id=\"notional\">{notional}</dd>\
             <dt>Reference</dt><dd id=\"reference\">{reference}</dd>\
             <dt>Time left</dt><dd><span id=\"time-left\" data-left-ms=\"{left_ms}\">{left} s</span> \
             <span class=\"basis\">(expires {exp_short})</span></dd>\
             <dt>State</dt><dd><strong id=\"state\">{st}</strong></dd></dl>\
             {warnings}{four_eyes}{decision}\
             <p id=\"why-not\" role=\"status\">{why_not}</p>{actions}<p id=\"status\" role=\"status\"></p>\
             </section>\
             <section id=\"details\" aria-labelledby=\"details-title\"><h2 id=\"details-title\">Details</h2>\
             <h3>Order, as it will be sent</h3><table id=\"payload\">{payload}</table>\
             <h3>Asked by</h3><table id=\"asked\"><tr><th>operator</th><td id=\"requested-by\">{by}</td></tr>\
             <tr><th>through</th><td>{svc}</td></tr><tr><th>chat session</th><td id=\"chat-session\">{chat_s}</td></tr>\
             <tr><th>tool call</th><td>{chat_t}</td></tr><tr><th>asked at</th><td id=\"asked-at\">{asked}</td></tr>\
             <tr><th>expires at</th><td>{exp}</td></tr>\
             <tr><th>plan</th><td>{id} ({action})</td></tr><tr><th>policy</th><td>{policy}</td></tr></table>\
             <details id=\"passed\"><summary>{passed_title}</summary>\
             <table id=\"checks\"><tr><th scope=\"col\">check</th><th scope=\"col\">result</th><th scope=\"col\">why</th></tr>{checks}</table></details>\
             </section></main>",
            id = esc(&p.plan_id),
            bar = header_bar(who),
            preview = esc(&p.preview),
            exp = esc(&rfc3339(p.expires_at)),
            exp_short = esc(&clock_time(p.expires_at)),
            asked = esc(&human_time(p.created_at)),
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

fn status_word(s: crate::core::records::CheckStatus) -> &'static str {
    match s {
        crate::core::records::CheckStatus::Pass => "pass",
        crate::core::records::CheckStatus::Warn => "warn",
        crate::core::records::CheckStatus::Fail => "fail",
    }
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
